"""`toolgym view` on a large run: page load times for a run of 10,000 rollouts.

Builds a synthetic run directory (by default 20 steps x 500 rollouts, each a copy of one real
trajectory shape: ~700 tokens in template, policy and observation segments), starts the viewer
and times, over HTTP as a browser would load them: the overview (which must open in under a
second however many rollouts there are), a step's rollout table cold (first read of its file)
and warm, its filtered view, and one episode page.

    python bench/viewer.py [--steps 20] [--per-step 500] [--out runs/bench/viewer.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import write_results  # noqa: E402  (bench/common.py)

from toolgym.viewer.app import serve


def synthetic_run(root: Path, steps: int, per_step: int) -> Path:
    """A run directory with `steps` x `per_step` rollouts and one evaluation."""
    run = root / "big-run"
    (run / "rollouts").mkdir(parents=True)
    (run / "config.yaml").write_text("name: big-run\nseed: 0\n")
    segments = [
        {"kind": "template", "token_ids": list(range(400)), "text": "x" * 1200},
        {"kind": "policy", "token_ids": list(range(60)), "logprobs": [-0.5] * 60, "text": "y" * 180},
        {"kind": "observation", "token_ids": list(range(200)), "text": "z" * 600},
        {"kind": "policy", "token_ids": list(range(40)), "logprobs": [-0.3] * 40, "text": "w" * 120},
    ]
    metrics = []
    for step in range(1, steps + 1):
        with (run / "rollouts" / f"step-{step:04d}.jsonl").open("w") as f:
            for i in range(per_step):
                row = {
                    "task_id": f"t{i % 97:04d}",
                    "group_id": f"g{i // 4}",
                    "seed": i,
                    "policy": "p",
                    "env_id": "toolgym/records-v0",
                    "family": f"records/{['count', 'lookup', 'manager'][i % 3]}",
                    "segments": segments,
                    "messages": [{"role": "user", "content": "q"}],
                    "outcome": ["passed", "failed", "format_error"][i % 3],
                    "reward": float(i % 3 == 0),
                    "side_effects": [{"kind": "resource_limit", "detail": "x"}] if i % 50 == 0 else [],
                    "turns": [{}, {}],
                }
                f.write(json.dumps(row) + "\n")
        metrics.append({"kind": "train", "step": step, "reward_mean": 0.3})
    (run / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    return run


def timed(client: httpx.Client, url: str, rounds: int = 3) -> float:
    """Median seconds to load `url` (status checked)."""
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        r = client.get(url)
        times.append(time.perf_counter() - start)
        assert r.status_code == 200, (url, r.status_code, r.text[:200])
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--per-step", type=int, default=500)
    parser.add_argument("--out", default="runs/bench/viewer.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run = synthetic_run(Path(tmp), args.steps, args.per_step)
        total = args.steps * args.per_step
        server, url = serve([run])
        try:
            with httpx.Client(timeout=120) as client:
                results = {"rollouts": total, "overview_s": timed(client, url + "/")}
                start = time.perf_counter()
                client.get(url + "/rollouts?source=rollouts/step-0001.jsonl")
                results["step_cold_s"] = time.perf_counter() - start
                results["step_warm_s"] = timed(client, url + "/rollouts?source=rollouts/step-0001.jsonl")
                results["step_filtered_s"] = timed(client, url + "/rollouts?source=rollouts/step-0001.jsonl&outcome=passed&sort=reward")
                results["episode_s"] = timed(client, url + f"/episode?source=rollouts/step-{args.steps:04d}.jsonl&i={args.per_step - 1}")
        finally:
            server.shutdown()
    print(
        f"a run of {total} rollouts: overview {results['overview_s'] * 1000:.0f} ms; a step of {args.per_step}: "
        f"{results['step_cold_s'] * 1000:.0f} ms cold, {results['step_warm_s'] * 1000:.0f} ms warm, filtered "
        f"{results['step_filtered_s'] * 1000:.0f} ms; an episode {results['episode_s'] * 1000:.0f} ms",
        flush=True,
    )
    write_results(args.out, results)


if __name__ == "__main__":
    main()
