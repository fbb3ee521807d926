"""Data-parallel training (DDP and FSDP2): 2 processes under torchrun (gloo) match 1 process on the
same global batch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).with_name("_ddp_step.py")
LR = 1e-2


@pytest.mark.parametrize("parallel", ["ddp", "fsdp2"])
def test_two_process_step_matches_one_process(tmp_path, parallel):
    import importlib.util

    single, ddp = tmp_path / "single.pt", tmp_path / "ddp.pt"
    spec = importlib.util.spec_from_file_location("_ddp_step", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main(str(single))  # the one-process reference, here
    from toolgym.inference.weight_sync import free_port

    # a free port of its own: torchrun's default (29500) may be taken by other work on the machine
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            "2",
            "--master_addr",
            "127.0.0.1",
            "--master_port",
            str(free_port()),
            str(SCRIPT),
            str(ddp),
            parallel,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    a, b = torch.load(single), torch.load(ddp)
    assert (a["world"], b["world"]) == (1, 2)
    assert abs(a["rl_loss"] - b["rl_loss"]) < 1e-6 and abs(a["sft_loss"] - b["sft_loss"]) < 1e-5
    assert abs(a["grad_norm"] - b["grad_norm"]) < 1e-5
    assert abs(a["anchor_nll"] - b["anchor_nll"]) < 1e-5
    for stage in ("after_rl", "state", "after_anchor"):
        moved = max((a[stage][k] - b[stage][k]).abs().max().item() for k in a[stage])
        # Adam's first steps are ~lr * sign(grad): float noise in near-zero gradients moves a weight
        # by a small fraction of lr at most; a wrong normaliser or a missing shard moves it by ~lr
        assert moved < 0.01 * LR, (stage, moved)
    changed = max((a["after_rl"][k] - a["state"][k]).abs().max().item() for k in a["state"])
    assert changed > 0.5 * LR  # the steps really moved the weights
    if parallel == "ddp":  # gradients are reduced once per optimizer step, not once per micro-batch
        rl, sft, anchored = b["reductions"]
        assert b["micro_batches"][0] > 1 and rl > 0 and rl == sft == anchored, (b["reductions"], b["micro_batches"])


def test_campaign_in_two_fsdp2_processes_matches_one_process_and_resumes(tmp_path):
    """`processes: 2` relaunches `toolgym train` under torchrun: rank 0 plays and grades, both ranks
    train on their shares (FSDP2). The SFT and RL updates land on the weights one process gets,
    and a sharded run resumes from its checkpoint."""
    import json

    import yaml
    from conftest import run_cli
    from transformers import AutoModelForCausalLM

    def config(name: str, processes: int) -> Path:
        data = {
            "name": name,
            "seed": 1,
            "out_dir": str(tmp_path / name),
            "processes": processes,
            "model": {"device": "cpu", "dtype": "fp32"},
            "envs": [{"env": "records-v0", "suite": "records", "train_tasks": 20, "eval_tasks": 1}],
            "eval": {"base_tasks": 1, "max_turns": 2},
            "sft": {"steps": 2, "batch_size": 4, "demos_per_suite": 4, "lr": 1e-3},
            "rl": {
                "steps": 2,
                "tasks_per_step": 2,
                "group_size": 2,
                "drop_zero_variance": False,
                "learner": {"lr": 1e-3, "weight_decay": 0.1, "token_budget": 512, "parallel": "fsdp2"},
            },
            "sampler": {"kind": "uniform"},
            "checkpoint": {"every": 1},
            "rollout": {"max_turns": 2, "max_new_tokens": 16, "concurrency": 8},
        }
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(data))
        return path

    runs = {}
    for name, processes in (("one", 1), ("two", 2)):
        out = run_cli("train", str(config(name, processes)), timeout=600)
        assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
        rows = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        weights = AutoModelForCausalLM.from_pretrained(str(tmp_path / name / "final-model")).state_dict()
        runs[name] = ([r for r in rows if r.get("kind") == "sft"], [r for r in rows if r.get("kind") == "train"], weights)
    (sft1, rl1, w1), (sft2, rl2, w2) = runs["one"], runs["two"]
    assert "starting 2 training processes" in out.stdout
    assert [r["sft_loss"] for r in sft2] == pytest.approx([r["sft_loss"] for r in sft1], abs=1e-4)
    assert [r["tasks"] for r in rl2] == [r["tasks"] for r in rl1]
    assert [r["reward_mean"] for r in rl2] == [r["reward_mean"] for r in rl1]
    moved = max((w1[k] - w2[k]).abs().max().item() for k in w1)
    assert moved < 0.05 * 1e-3, moved  # float noise on near-zero gradients, never a missing shard

    out = run_cli("train", str(config("two", 2)), "--resume", "--set", "rl.steps=3", timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "resumed from step-000002" in out.stdout
    rows = [json.loads(line) for line in (tmp_path / "two" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r.get("kind") == "train"] == [1, 2, 3]
