"""Our GRPO step vs TRL `GRPOTrainer`'s step, side by side in one run, same work.

Same tiny model (warmed up with a short SFT on `records` oracle demonstrations, so episodes call
tools over several turns), same prompts (the first `--prompts x --steps` records train tasks), same
G, same loss settings (PPO-clip token-mean with eps 0.2/0.28, no reference model, lr 1e-5, one
update per batch), same limits (4 tool turns, 64 new tokens per turn for ours; 4 tool-calling
iterations and 256 completion tokens for TRL, which counts tool output in the completion).
Both render the same prompt: TRL lists an environment's tools in alphabetical order with
transformers' JSON-schema rendering, so here toolgym's `records` env renders its tools that way
too (warm-up SFT included); otherwise the two trainers would feed the model different prompts
and it would do different work. Each trainer runs in a fresh process so its peak RSS is its own;
the first step is a warm-up. A step is everything: generation with the tool loop, grading, the
update.

    python bench/trl_step.py [--prompts 8 --group 4 --steps 3 --rounds 3] [--out runs/bench/trl_step.json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SFT_DIR = Path("runs/bench/trl-step-model")


def use_trl_schemas() -> None:
    """Make `records-v0` render its tools as TRL does (see the module docstring)."""
    from transformers.utils import get_json_schema

    from toolgym.envs.families.records import RecordsEnv
    from toolgym.integrations.trl_adapter import environment_factory

    adapter = environment_factory("records-v0")
    schemas = [get_json_schema(getattr(adapter, name)) for name in sorted(RecordsEnv._tools)]
    RecordsEnv.tool_schemas = lambda self: schemas


def warm_model(sft_steps: int) -> Path:
    """The tiny policy after `sft_steps` SFT steps on oracle demonstrations (cached)."""
    if (SFT_DIR / "config.json").exists():
        return SFT_DIR
    use_trl_schemas()
    from toolgym.trainers.campaign import Campaign
    from toolgym.trainers.config import CampaignConfig

    config = CampaignConfig.model_validate(
        {
            "name": "trl-step-warmup",
            "out_dir": str(SFT_DIR.with_name("trl-step-warmup")),
            "envs": [{"env": "records-v0", "suite": "records", "eval_tasks": 8}],
            "sft": {"steps": sft_steps, "batch_size": 16, "lr": 0.005, "demos_per_suite": 400},
            "rl": {"steps": 0},
        }
    )
    campaign = Campaign(config, progress=False)
    campaign.run(sft_only=True)
    campaign.policy.model.save_pretrained(SFT_DIR)
    campaign.tokenizer.save_pretrained(SFT_DIR)
    return SFT_DIR


def ours(model_dir: str, prompts: int, group: int, steps: int) -> dict:
    """Our campaign's `rl_step`, timed."""
    use_trl_schemas()
    from toolgym.trainers.campaign import Campaign
    from toolgym.trainers.config import CampaignConfig

    config = CampaignConfig.model_validate(
        {
            "name": "bench-ours",
            "out_dir": tempfile.mkdtemp(),
            "model": {"init": model_dir, "device": "cpu", "dtype": "fp32"},
            "envs": [{"env": "records-v0", "suite": "records", "train_tasks": prompts * (steps + 1)}],
            "rl": {
                "steps": steps + 1,
                "tasks_per_step": prompts,
                "group_size": group,
                "drop_zero_variance": False,
                "learner": {"lr": 1e-5, "loss": "ppo", "agg": "token-mean", "eps_low": 0.2, "eps_high": 0.28, "kl_beta": 0.0},
            },
            "sampler": {"kind": "uniform"},
            "rollout": {"max_turns": 4, "max_new_tokens": 64, "max_total_tokens": 2048, "temperature": 1.0, "concurrency": prompts * group},
        }
    )
    campaign = Campaign(config, progress=False)
    times, rewards, tool_calls = [], [], []
    try:
        for step in range(steps + 1):
            campaign.step = step + 1
            start = time.perf_counter()
            m = campaign.rl_step()
            times.append(time.perf_counter() - start)
            rewards.append(m["reward_mean"])
            tool_calls.append(m["tool_calls_mean"])
    finally:
        campaign.close()
    return {"step_s": sum(times[1:]) / steps, "steps_s": times, "reward_mean": rewards, "tool_calls_mean": tool_calls}


def trl(model_dir: str, prompts: int, group: int, steps: int) -> dict:
    """TRL GRPOTrainer with toolgym's environment_factory, timed by TRL's own `step_time`."""
    os.environ["TRL_EXPERIMENTAL_SILENCE"] = "1"
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from toolgym.integrations.datasets import suite_to_dataset
    from toolgym.integrations.trl_adapter import environment_factory, prepare_tokenizer
    from toolgym.tasks import builtin_suite

    tok = prepare_tokenizer(AutoTokenizer.from_pretrained(model_dir))
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    data = suite_to_dataset(builtin_suite("records"), "train").select(range(prompts * (steps + 1)))
    args = GRPOConfig(
        output_dir=tempfile.mkdtemp(),
        max_steps=steps + 1,
        per_device_train_batch_size=prompts * group,
        num_generations=group,
        max_completion_length=256,
        max_tool_calling_iterations=4,
        learning_rate=1e-5,
        loss_type="dapo",
        epsilon=0.2,
        epsilon_high=0.28,
        beta=0.0,
        temperature=1.0,
        bf16=False,
        activation_checkpointing=False,
        use_cpu=True,
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        shuffle_dataset=False,
        disable_tqdm=True,
    )
    trainer = GRPOTrainer(
        model=model, args=args, train_dataset=data, processing_class=tok, environment_factory=environment_factory("records-v0")
    )
    trainer.train()
    logs = [h for h in trainer.state.log_history if "step_time" in h]
    times = [h["step_time"] for h in logs]
    return {
        "step_s": sum(times[1:]) / steps,
        "steps_s": times,
        "reward_mean": [h["reward"] for h in logs],
        "tool_calls_mean": [h.get("tools/call_frequency") for h in logs],
    }


def child(which: str, model_dir: str, prompts: int, group: int, steps: int) -> None:
    result = (ours if which == "ours" else trl)(model_dir, prompts, group, steps)
    result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print("RESULT " + json.dumps(result))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--sft-steps", type=int, default=150)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--child", choices=["ours", "trl"])
    parser.add_argument("--model")
    parser.add_argument("--out", default="runs/bench/trl_step.json")
    args = parser.parse_args()
    if args.child:
        child(args.child, args.model, args.prompts, args.group, args.steps)
        return
    model_dir = str(warm_model(args.sft_steps))
    runs: dict[str, list[dict]] = {"ours": [], "trl": []}
    for _ in range(args.rounds):  # interleaved rounds: machine noise hits both trainers alike
        for which in ("ours", "trl"):
            proc = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--child",
                    which,
                    "--model",
                    model_dir,
                    "--prompts",
                    str(args.prompts),
                    "--group",
                    str(args.group),
                    "--steps",
                    str(args.steps),
                ],
                capture_output=True,
                text=True,
            )
            line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
            if proc.returncode != 0 or not line:
                sys.exit(f"{which} failed:\n{proc.stderr[-3000:]}")
            runs[which].append(json.loads(line[0][len("RESULT ") :]))
    results: dict = {}
    for which, rs in runs.items():  # the median round by step time
        rs = sorted(rs, key=lambda r: r["step_s"])
        results[which] = {**rs[len(rs) // 2], "rounds_step_s": [r["step_s"] for r in runs[which]]}
    o, t = results["ours"], results["trl"]
    print(
        f"{args.prompts} prompts x G={args.group}, {args.steps} timed steps (after one warm-up) x {args.rounds} "
        f"interleaved rounds (median shown), same tiny model"
    )
    print(f"{'':8s} {'s/step':>8s} {'peak RSS MB':>12s}  reward per step / tool calls per episode")
    for name, r in results.items():
        print(
            f"{name:8s} {r['step_s']:8.2f} {r['peak_rss_mb']:12.0f}  {[round(x, 2) for x in r['reward_mean']]} / "
            f"{[round(x or 0, 2) for x in r['tool_calls_mean']]}"
        )
    results["ratio_step_time"] = o["step_s"] / t["step_s"]
    results["ratio_peak_rss"] = o["peak_rss_mb"] / t["peak_rss_mb"]
    print(f"rounds (s/step): ours {[round(x, 2) for x in o['rounds_step_s']]}, TRL {[round(x, 2) for x in t['rounds_step_s']]}")
    print(f"ours / TRL: step time {results['ratio_step_time']:.2f}x, peak RSS {results['ratio_peak_rss']:.2f}x")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from common import write_results

    write_results(args.out, results)


if __name__ == "__main__":
    main()
