"""Does a process that evaluates again and again stay the same size? Side by side in one run: the
same evaluations with `malloc_trim` (what toolgym does every 16 generated tokens, after every
generation batch and every evaluation: `inference/host_memory.py`) and with it switched off.

    python bench/host_memory.py [--model smollm2-135m] [--tasks 64] [--rounds 3]

Each arm runs in its own fresh process: `--rounds` greedy evaluations of the first `--tasks`
held-out BFCL entries one after another, each with a new policy (as `bench/later_heldout.py`
does with its SFT and final models). It prints the resident memory after each evaluation, the
peak so far, and what malloc's arenas hold (in use by live objects, and freed but kept).
Precision as the main job chooses it (`auto`). Writes `runs/bench/host_memory.json`.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import write_results  # noqa: E402


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")
    ]


def arenas_gb() -> dict[str, float]:
    """glibc's view of its heap arenas: bytes in use and bytes freed but kept, in GB."""
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = _MallInfo2
    info = libc.mallinfo2()
    return {"in_use_gb": info.uordblks / 1e9, "freed_kept_gb": info.fordblks / 1e9}


def child(args: argparse.Namespace) -> None:
    """One arm's evaluations in this process, trimming or not (`--trim`): a JSON row per evaluation."""
    import toolgym  # noqa: F401 (registers the suites)
    from toolgym.cli.app import load_suite
    from toolgym.harness.eval_run import run_eval
    from toolgym.harness.rollout import RolloutLimits
    from toolgym.inference import host_memory
    from toolgym.inference.hardware import choose_bf16
    from toolgym.inference.policy import SamplingParams

    if not args.trim:  # the arm without trimming: every release_memory() call trims nothing
        host_memory._libc_trim.cache_clear()
        host_memory._libc_trim = lambda: None
    suite = load_suite("bfcl")
    dtype = choose_bf16("auto", "cpu").dtype
    limits = RolloutLimits(max_turns=1, max_new_tokens_per_turn=args.tokens, max_total_tokens=1024)
    sampling = SamplingParams(max_new_tokens=args.tokens, temperature=0.0)
    with tempfile.TemporaryDirectory() as out:
        for number in range(args.rounds):
            started = time.perf_counter()
            report, _ = run_eval(
                f"hf:{args.model}",
                suite,
                "held-out",
                1,
                [1],
                args.tasks,
                128,
                0,
                f"{out}/{number}",
                limits,
                sampling,
                progress=False,
                dtype=dtype,
            )
            row = {
                "evaluation": number + 1,
                "seconds": round(time.perf_counter() - started, 1),
                "pass@1": report.overall.pass_at["1"].value,
                **host_memory.memory_fields(),
                **arenas_gb(),
            }
            print("ROW " + json.dumps(row), flush=True)


def run_arm(trim: bool, args: argparse.Namespace) -> list[dict]:
    """Run one arm in a fresh process; its rows, printed as they come."""
    command = [
        sys.executable,
        __file__,
        "--child",
        "--model",
        args.model,
        "--tasks",
        str(args.tasks),
        "--rounds",
        str(args.rounds),
        "--tokens",
        str(args.tokens),
    ] + (["--trim"] if trim else [])
    rows = []
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            if not line.startswith("ROW "):
                continue
            row = json.loads(line[4:])
            rows.append(row)
            print(
                f"{'trim' if trim else 'no trim':8s} evaluation {row['evaluation']}: {row['seconds']:5.0f} s, "
                f"pass@1 {row['pass@1']:.3f}, resident {row['rss_gb']:.2f} GB (peak {row['peak_rss_gb']:.2f}), "
                f"arenas: {row['in_use_gb']:.2f} GB in use, {row['freed_kept_gb']:.2f} GB freed but kept",
                flush=True,
            )
    if proc.returncode:
        raise SystemExit(f"the {'trim' if trim else 'no-trim'} arm failed (exit {proc.returncode})")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m", help="the evaluated model, as `hf:` takes it")
    parser.add_argument("--tasks", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=256, help="new tokens per answer")
    parser.add_argument("--out", default="runs/bench/host_memory.json")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--trim", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args)
    from toolgym.inference.hardware import choose_bf16, cpu_description

    results = {
        "cpu": cpu_description(),
        "precision": choose_bf16("auto", "cpu").dtype,
        "model": args.model,
        "tasks": args.tasks,
        "rounds": args.rounds,
    }
    off, on = run_arm(False, args), run_arm(True, args)
    peak_off, peak_on = max(r["peak_rss_gb"] for r in off), max(r["peak_rss_gb"] for r in on)
    seconds = sum(r["seconds"] for r in on) / max(sum(r["seconds"] for r in off), 1e-9)
    results.update(
        no_trim=off, trim=on, peak_rss_gb={"no_trim": peak_off, "trim": peak_on}, peak_ratio=peak_off / peak_on, seconds_ratio=seconds
    )
    print(
        f"after {args.rounds} evaluations: peak resident {peak_off:.2f} GB without trimming, {peak_on:.2f} GB "
        f"with ({peak_off / peak_on:.2f}x); time with / without {seconds:.2f}x",
        flush=True,
    )
    print(f"({results['cpu']}, {results['precision']})")
    write_results(args.out, results)


if __name__ == "__main__":
    main()
