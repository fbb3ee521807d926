"""Guarantees under load: sandboxes and graders on a machine whose cores are saturated.

While `--burners` CPU-bound processes (default 2: both cores of this machine) and, with
`--neighbour`, another toolgym process (its own sandboxes in a loop, the same cache and cgroup
roots) run beside it, this script drives `--sandboxes` sandboxes per backend from as many threads:
each round writes files, starts a command that leaves a background process and a file in /tmp,
runs a second command concurrently from another thread, snapshots or restores now and then, and
resets. After every reset it checks the proof: no live process (`live_processes()`), the
workspace equal to the pristine one, /tmp empty. Beside them, oracle fixes of code-repair tasks
are verified in a loop (each must pass). It counts:

- spurious leftovers: a reset that reported success but left a process, a file or /tmp content;
- infra errors: `SandboxInfraError` from any call (the harness failing under load);
- failed commands: a command of the round (which succeeds on an idle machine) that failed;
- verification failures: an oracle fix graded anything but `passed`.

Known limit, shown by `--concurrent` (a second command in the same sandbox while the first runs):
on bwrap the second command takes a fresh bwrap whose overlay mount shares the first one's upper
directory, and overlayfs does not keep two mounts of one upper layer coherent (the first
command's writes fail with "Directory nonexistent"); on docker the first command's end kills
every process in the container, the second command's included. Commands of one sandbox should
run one at a time until this is fixed; sandboxes run concurrently without limit.

Every count must be 0. Prints the totals per backend and writes runs/bench/stress.json.

    python bench/stress.py [--resets 1000] [--backends bwrap,docker] [--burners 2] [--neighbour]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import write_results  # noqa: E402  (bench/common.py)

from toolgym.sandbox import SandboxConfig, make_sandbox
from toolgym.sandbox.base import SandboxInfraError
from toolgym.tasks import builtin_suite
from toolgym.verifiers import FinalState, Outcome, verifier_for

WORKSPACE = {f"src/mod{i}.py": f"def f{i}(x):\n    return x + {i}\n" for i in range(10)} | {"README.md": "stress\n"}
#: leaves a process behind, writes the workspace and /tmp: everything a reset must undo
DIRTY = (
    "sleep 60 & echo changed > src/mod0.py && echo new > new.txt && mkdir -p d && echo x > d/y "
    "&& echo scratch > /tmp/scratch && rm README.md"
)


class Counts:
    """Thread-safe tallies of one backend's run."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.values = {
            "resets": 0,
            "execs": 0,
            "restores": 0,
            "verifications": 0,
            "spurious_leftovers": 0,
            "infra_errors": 0,
            "command_failures": 0,
            "verification_failures": 0,
        }
        self.examples: list[str] = []

    def add(self, key: str, n: int = 1, example: str | None = None) -> None:
        """Count `n` of `key` (and keep a few examples of what went wrong)."""
        with self.lock:
            self.values[key] += n
            if example and len(self.examples) < 10:
                self.examples.append(example)


def burn() -> None:
    """A CPU-bound loop (a process of its own)."""
    while True:
        pass


def sandbox_loop(backend: str, resets: int, counts: Counts, stop: threading.Event, concurrent: bool = False) -> None:
    """One sandbox through `resets` dirty rounds, each proved clean after its reset."""
    try:
        box = make_sandbox(WORKSPACE, SandboxConfig(backend=backend))
    except SandboxInfraError as err:
        counts.add("infra_errors", example=f"create: {err}")
        return
    try:
        pristine = box.pristine_files()
        snap = None
        for i in range(resets):
            if stop.is_set():
                break
            try:
                box.write_file("src/extra.py", f"X = {i}\n")
                commands = [DIRTY, "ls src | wc -l"] if concurrent else [DIRTY]
                with ThreadPoolExecutor(len(commands)) as pool:  # --concurrent: two commands in one sandbox at once
                    results = list(pool.map(lambda c: box.exec(c, timeout_s=20), commands))
                counts.add("execs", len(commands))
                for r in results:
                    if r.exit_code != 0:
                        counts.add("command_failures", example=f"a command failed (exit {r.exit_code}): {r.stderr[-200:]}")
                if i % 10 == 3:
                    snap = box.snapshot()
                elif i % 10 == 7 and snap is not None:
                    box.restore(snap)
                    counts.add("restores")
                box.reset()
                counts.add("resets")
                left = box.live_processes()
                files = box.files()
                scratch = box.exec("ls -A /tmp", timeout_s=20).stdout.strip()
                if left or files != pristine or scratch:
                    counts.add(
                        "spurious_leftovers",
                        example=f"after reset {i}: processes {left[:3]}, files differ: {files != pristine}, /tmp: {scratch[:80]!r}",
                    )
            except SandboxInfraError as err:
                counts.add("infra_errors", example=f"round {i}: {err}")
    finally:
        box.close()


def verify_loop(backend: str, counts: Counts, stop: threading.Event) -> None:
    """Oracle fixes of code-repair tasks verified until `stop`: each must pass."""
    tasks = builtin_suite("code-repair").tasks[:40]
    config = SandboxConfig(backend=backend)
    i = 0
    while not stop.is_set():
        task = tasks[i % len(tasks)]
        call = task.oracle[0]
        verdict = verifier_for(task, config).verify(task, FinalState(changes={call.arguments["path"]: call.arguments["content"]}))
        counts.add("verifications")
        if verdict.outcome != Outcome.PASSED:
            key = "infra_errors" if verdict.outcome in (Outcome.INFRA_ERROR, Outcome.VERIFIER_ERROR) else "verification_failures"
            counts.add(key, example=f"verify {task.id[:10]}: {verdict.outcome.value}: {verdict.reason[:160]}")
        i += 1


def run_backend(backend: str, resets: int, sandboxes: int, concurrent: bool = False) -> dict:
    """Drive `sandboxes` sandboxes to `resets` resets in all, with verifications beside them."""
    counts, stop = Counts(), threading.Event()
    start = time.perf_counter()
    verifier = threading.Thread(target=verify_loop, args=(backend, counts, stop), daemon=True)
    verifier.start()
    per_box = -(-resets // sandboxes)
    with ThreadPoolExecutor(sandboxes) as pool:
        list(pool.map(lambda _: sandbox_loop(backend, per_box, counts, stop, concurrent), range(sandboxes)))
    stop.set()
    verifier.join(timeout=120)
    return {**counts.values, "seconds": time.perf_counter() - start, "examples": counts.examples}


def neighbour() -> None:
    """Another toolgym process on the machine: its own bwrap sandboxes, reset in a loop."""
    counts = Counts()
    sandbox_loop("bwrap", 10**9, counts, threading.Event())


def main() -> None:
    sys.stdout.reconfigure(line_buffering=True)  # progress shows in a log file too, line by line
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--resets", type=int, default=1000, help="resets per backend, over all sandboxes")
    parser.add_argument("--sandboxes", type=int, default=8)
    parser.add_argument("--backends", default="bwrap,docker")
    parser.add_argument("--burners", type=int, default=os.cpu_count() or 2, help="CPU-bound processes beside it")
    parser.add_argument("--neighbour", action="store_true", help="another toolgym process with its own sandboxes")
    parser.add_argument(
        "--concurrent",
        action="store_true",
        help="also run a second command in the same sandbox while the first runs (a known limit: see the module docstring)",
    )
    parser.add_argument("--role", default="main", help=argparse.SUPPRESS)
    parser.add_argument("--out", default="runs/bench/stress.json")
    args = parser.parse_args()
    if args.role == "neighbour":
        neighbour()
        return
    others = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.burners)]
    if args.neighbour:
        others.append(subprocess.Popen([sys.executable, __file__, "--role", "neighbour"]))
    print(
        f"load: {args.burners} CPU-bound process(es){' and a neighbouring toolgym process' if args.neighbour else ''} "
        f"on {os.cpu_count()} cores",
        flush=True,
    )
    results: dict = {"burners": args.burners, "neighbour": args.neighbour, "cores": os.cpu_count()}
    try:
        for backend in args.backends.split(","):
            r = results[backend] = run_backend(backend, args.resets, args.sandboxes, args.concurrent)
            print(
                f"{backend:6} {r['resets']} resets ({r['restores']} restores, {r['execs']} execs) and "
                f"{r['verifications']} verifications in {r['seconds']:.0f} s: spurious leftovers "
                f"{r['spurious_leftovers']}, infra errors {r['infra_errors']}, failed commands "
                f"{r['command_failures']}, verification failures {r['verification_failures']}",
                flush=True,
            )
            for example in r["examples"]:
                print(f"       {example}")
    finally:
        for p in others:
            p.kill()
            p.wait()
    write_results(args.out, results)
    bad = sum(
        results[b][k]
        for b in args.backends.split(",")
        for k in ("spurious_leftovers", "infra_errors", "command_failures", "verification_failures")
    )
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
