"""Episodes per second through Ray environment workers (1, 2, 4) vs the local path, in one run.

A null policy (the same `bash` call every turn) on sandboxed `shell-ops` (bwrap), graded by its
hidden state checker: the work is all environment and verification, so the numbers show what
spreading environments over workers buys and what going through Ray costs per episode. Worker
start-up is excluded (one warm-up batch per configuration).

    python bench/ray_workers.py [--episodes 64] [--workers 1,2,4] [--out runs/bench/ray_workers.json]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import write_results  # noqa: E402  (bench/common.py)

import toolgym  # noqa: E402
from toolgym.harness import RolloutLimits, RolloutRunner  # noqa: E402
from toolgym.harness.agents import FixedAgent  # noqa: E402
from toolgym.harness.ray_pool import RayRolloutRunner, init_local_ray  # noqa: E402
from toolgym.tasks import builtin_suite  # noqa: E402

AGENT = FixedAgent('<tool_call>\n{"name": "bash", "arguments": {"command": "ls -R > /dev/null"}}\n</tool_call>')
LIMITS = RolloutLimits(max_turns=2)
SANDBOX = {"backend": "bwrap"}


def timed(runner, tasks) -> float:
    runner.run(tasks[:4], seed=0)  # warm-up: sandboxes, imports
    start = time.perf_counter()
    out = runner.run(tasks, seed=1)
    elapsed = time.perf_counter() - start
    assert all(t.outcome.is_agent_attempt for t in out), [t.error for t in out if not t.outcome.is_agent_attempt][:3]
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=64)
    parser.add_argument("--workers", default="1,2,4")
    parser.add_argument("--envs-per-worker", type=int, default=8)
    parser.add_argument("--out", default="runs/bench/ray_workers.json")
    args = parser.parse_args()
    tasks = builtin_suite("shell-ops").split("train").tasks[: args.episodes]
    local = RolloutRunner(
        lambda env_id: toolgym.make(env_id, sandbox=SANDBOX).unwrapped,
        AGENT,
        concurrency=args.envs_per_worker,
        limits=LIMITS,
        progress=False,
    )
    try:
        base = timed(local, tasks)
    finally:
        local.close()
    results = {"episodes": len(tasks), "local": {"seconds": base, "episodes_per_s": len(tasks) / base}}
    print(f"local, {args.envs_per_worker} in flight: {len(tasks) / base:.2f} episodes/s ({base:.1f} s)")
    init_local_ray()
    for n in [int(x) for x in args.workers.split(",")]:
        runner = RayRolloutRunner(
            {"toolgym/shell-ops-v0": {"sandbox": SANDBOX}},
            {"kind": "text", "agent": AGENT},
            workers=n,
            envs_per_worker=args.envs_per_worker,
            limits=LIMITS,
        )
        try:
            elapsed = timed(runner, tasks)
        finally:
            runner.close()
        results[f"ray_{n}"] = {"seconds": elapsed, "episodes_per_s": len(tasks) / elapsed}
        print(
            f"ray, {n} worker(s) x {args.envs_per_worker}: {len(tasks) / elapsed:.2f} episodes/s "
            f"({elapsed:.1f} s, {elapsed / base:.2f}x local)"
        )
    one = results.get("ray_1")
    if one:
        overhead = (one["seconds"] - base) / len(tasks) * args.envs_per_worker
        results["ray_overhead_per_episode_s"] = overhead
        print(f"overhead of going through Ray (1 worker vs local, same episodes in flight): {overhead * 1000:.0f} ms per episode")
    write_results(args.out, results)


if __name__ == "__main__":
    main()
