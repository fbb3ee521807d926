"""Verifier benchmarks, side by side in one run: verification latency p50/p95 per task on bwrap
and docker, and the tasks verified 8 at a time vs one at a time (2 cores).

These machines are noisy: each backend runs `--rounds` rounds of (one at a time, then 8 at a
time), and the ratio is the median one-at-a-time wall time over the median parallel one. The
same run measures the machine's own ceiling for that ratio: plain CPU work in 2 processes vs 1.

    python bench/verify.py [--tasks 100] [--rounds 3] [--out runs/bench/verify.json]
    python bench/verify.py --suite swe-pypi --tasks 40    # mined tasks, graded by the package's own tests
    python bench/verify.py --suite swe-pypi --tasks 40 --differential-cost   # + the same tasks without
                                                                           # their differential checks

`--suite` takes a registered suite or a suite directory; tasks are spread evenly over it (for a
mined suite: over its packages). The oracle fix is graded, so every verification should pass.
"""

from __future__ import annotations

import argparse
import sys
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import write_results  # noqa: E402  (bench/common.py)

from toolgym.sandbox import SandboxConfig
from toolgym.sandbox.docker_pool import remover, shared_pool
from toolgym.tasks import TaskSuite, builtin_suite, suite_specs
from toolgym.verifiers import FinalState, Outcome, verifier_for
from toolgym.verifiers.grading import grading_config


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
    return {
        "workers": workers,
        "tasks": len(tasks),
        "wall_s": wall,
        "latencies_ms": [x * 1000 for x in latencies],
        "passed": sum(o == Outcome.PASSED for o in outcomes),
        "stages_ms": stages,
    }


def summary(rounds: list[dict]) -> dict:
    """One mode over its rounds: median wall time, latency percentiles over every verification."""
    lat = np.concatenate([r["latencies_ms"] for r in rounds])
    stages: dict[str, list[float]] = {}
    for r in rounds:
        for stage, values in r["stages_ms"].items():
            stages.setdefault(stage, []).extend(values)
    walls = [r["wall_s"] for r in rounds]
    return {
        "workers": rounds[0]["workers"],
        "tasks": rounds[0]["tasks"],
        "rounds": len(rounds),
        "wall_s": float(np.median(walls)),
        "wall_s_each": walls,
        "p50_ms": float(np.percentile(lat, 50)),
        "p95_ms": float(np.percentile(lat, 95)),
        "passed": min(r["passed"] for r in rounds),
        "stages_p50_ms": {k: float(np.percentile(v, 50)) for k, v in stages.items()},
    }


def _spin(n: int) -> int:
    total = 0
    for i in range(n):
        total += len({str(j): j for j in range(50)})
    return total


def machine_ceiling(rounds: int) -> float:
    """Plain CPU work, 8 pieces in 2 processes vs in 1: what this machine gives at best (median)."""
    ratios = []
    with ProcessPoolExecutor(2) as pool:
        list(pool.map(_spin, [10, 10]))
        for _ in range(rounds):
            t = time.perf_counter()
            for _ in range(8):
                _spin(40_000)
            one = time.perf_counter() - t
            t = time.perf_counter()
            list(pool.map(_spin, [40_000] * 8))
            ratios.append(one / (time.perf_counter() - t))
    return float(np.median(ratios))


def warm_up(backend: str, tasks: list) -> None:
    """Start what every verification then reuses (the judge service; on docker, the warm pool of
    started containers) and wait until it is ready: both timed modes measure the steady state,
    not a one-off start that would land in whichever runs first."""
    run(backend, tasks[:8], 8)
    if backend == "docker":
        shared_pool(grading_config(SandboxConfig(backend=backend))).wait_settled()
        remover().drain()  # the containers the pool had too many of are gone too


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=100)
    parser.add_argument("--suite", default="code-repair", help="registered suite or suite directory")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of (one at a time, 8 at a time) per backend")
    parser.add_argument("--out", default=None, help="default: runs/bench/verify[-SUITE].json")
    parser.add_argument(
        "--differential-cost",
        action="store_true",
        help="mined suites: also grade the same tasks one at a time without their differential "
        "checks, interleaved round by round, and print the p50 ratio",
    )
    args = parser.parse_args()
    suite = builtin_suite(args.suite) if args.suite in suite_specs() else TaskSuite.load(args.suite)
    step = max(1, len(suite) // args.tasks)
    tasks = suite.tasks[::step][: args.tasks]
    print(f"{len(tasks)} tasks of {suite.name} ({len(suite)} in all), oracle fixes")
    args.out = args.out or ("runs/bench/verify.json" if args.suite == "code-repair" else f"runs/bench/verify-{suite.name}.json")
    out = {"machine_ceiling": machine_ceiling(args.rounds)}
    print(f"this machine's ceiling: plain CPU work in 2 processes vs 1 gives {out['machine_ceiling']:.2f}x")
    for backend in ("bwrap", "docker"):
        warm_up(backend, tasks)
        rounds: dict[int, list[dict]] = {1: [], 8: []}
        for _ in range(args.rounds):
            for workers in (1, 8):
                rounds[workers].append(run(backend, tasks, workers))
        if args.differential_cost:
            bare = [t.model_copy(update={"hidden": t.hidden.model_copy(update={"differential": ()})}) for t in tasks]
            with_checks, without = [], []
            for _ in range(args.rounds):  # interleaved: the machine's noise falls on both alike
                without.append(run(backend, bare, 1))
                with_checks.append(run(backend, tasks, 1))
            a, b = summary(with_checks), summary(without)
            out[backend + "_differential_cost"] = {"with": a, "without": b, "p50_ratio": a["p50_ms"] / b["p50_ms"]}
            print(
                f"{backend:6} differential checks: p50 {a['p50_ms']:.0f} ms with, {b['p50_ms']:.0f} ms without "
                f"({a['p50_ms'] / b['p50_ms']:.2f}x; {a['passed']} and {b['passed']} of {a['tasks']} passed)"
            )
        seq, par = summary(rounds[1]), summary(rounds[8])
        out[backend] = {
            "sequential": seq,
            "parallel_8": par,
            "speedup": seq["wall_s"] / par["wall_s"],
            "speedup_each": [a / b for a, b in zip(seq["wall_s_each"], par["wall_s_each"])],
        }
        print(
            f"{backend:6} one at a time: p50 {seq['p50_ms']:.0f} ms, p95 {seq['p95_ms']:.0f} ms, "
            f"{seq['wall_s']:.1f} s for {seq['tasks']} tasks ({seq['passed']} passed) | 8 in parallel: "
            f"{par['wall_s']:.1f} s (p50 {par['p50_ms']:.0f} ms, {par['passed']} passed) | "
            f"ratio {out[backend]['speedup']:.2f}x (rounds: " + ", ".join(f"{x:.2f}x" for x in out[backend]["speedup_each"]) + ")"
        )
        if seq["stages_p50_ms"]:
            print(
                "       where one verification's time goes (p50): "
                + ", ".join(f"{k.replace('_', ' ')} {v:.0f} ms" for k, v in seq["stages_p50_ms"].items())
            )
    remover().drain()
    write_results(args.out, out)


if __name__ == "__main__":
    main()
