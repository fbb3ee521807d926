"""Verifier benchmarks, side by side in one run: verification latency p50/p95 per task on bwrap
and docker, and the tasks verified 8 at a time vs one at a time (2 cores).

    python bench/verify.py [--tasks 100] [--out runs/bench/verify.json]
    python bench/verify.py --suite swe-pypi --tasks 40    # mined tasks, graded by the package's own tests

`--suite` takes a registered suite or a suite directory; tasks are spread evenly over it (for a
mined suite: over its packages). The oracle fix is graded, so every verification should pass.
"""

from __future__ import annotations

import argparse
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import write_results  # noqa: E402  (bench/common.py)
from toolgym.sandbox import SandboxConfig
from toolgym.sandbox.docker_pool import remover
from toolgym.tasks import TaskSuite, builtin_suite, suite_specs
from toolgym.verifiers import FinalState, Outcome, verifier_for


def oracle_state(task) -> FinalState:
    call = task.oracle[0]
    return FinalState(changes={call.arguments["path"]: call.arguments["content"]})


def run(backend: str, tasks: list, workers: int) -> dict:
    config = SandboxConfig(backend=backend)
    latencies: list[float] = []
    stages: dict[str, list[float]] = {}

    def one(task):
        t = time.perf_counter()
        verdict = verifier_for(task, config).verify(task, oracle_state(task))
        latencies.append(time.perf_counter() - t)
        for stage, seconds in verdict.details.get("stages_s", {}).items():
            stages.setdefault(stage, []).append(seconds * 1000)
        return verdict.outcome

    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=workers) as pool:
        outcomes = list(pool.map(one, tasks))
    wall = time.perf_counter() - start
    lat = np.array(latencies) * 1000
    return {"workers": workers, "tasks": len(tasks), "wall_s": wall, "tasks_per_s": len(tasks) / wall,
            "p50_ms": float(np.percentile(lat, 50)), "p95_ms": float(np.percentile(lat, 95)),
            "passed": sum(o == Outcome.PASSED for o in outcomes),
            "stages_p50_ms": {k: float(np.percentile(v, 50)) for k, v in stages.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=100)
    parser.add_argument("--suite", default="code-repair", help="registered suite or suite directory")
    parser.add_argument("--out", default=None, help="default: runs/bench/verify[-SUITE].json")
    args = parser.parse_args()
    suite = builtin_suite(args.suite) if args.suite in suite_specs() else TaskSuite.load(args.suite)
    step = max(1, len(suite) // args.tasks)
    tasks = suite.tasks[::step][: args.tasks]
    print(f"{len(tasks)} tasks of {suite.name} ({len(suite)} in all), oracle fixes")
    args.out = args.out or ("runs/bench/verify.json" if args.suite == "code-repair"
                            else f"runs/bench/verify-{suite.name}.json")
    out = {}
    for backend in ("bwrap", "docker"):
        seq = run(backend, tasks, 1)
        par = run(backend, tasks, 8)
        out[backend] = {"sequential": seq, "parallel_8": par, "speedup": seq["wall_s"] / par["wall_s"]}
        print(f"{backend:6} one at a time: p50 {seq['p50_ms']:.0f} ms, p95 {seq['p95_ms']:.0f} ms, "
              f"{seq['wall_s']:.1f} s for {seq['tasks']} tasks ({seq['passed']} passed) | 8 in parallel: "
              f"{par['wall_s']:.1f} s (p50 {par['p50_ms']:.0f} ms, {par['passed']} passed) | "
              f"ratio {out[backend]['speedup']:.2f}x")
        if seq["stages_p50_ms"]:
            print("       where one verification's time goes (p50): " + ", ".join(
                f"{k.replace('_', ' ')} {v:.0f} ms" for k, v in seq["stages_p50_ms"].items()))
    remover().drain()
    write_results(args.out, out)


if __name__ == "__main__":
    main()
