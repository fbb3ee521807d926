"""The SFT stage's learning-rate schedule (`sft.schedule`, `sft.warmup_steps`): the rates by hand,
the learner applies them with its optimizer state kept, a campaign logs the rate of every step,
and a bad schedule is named by the config."""

import json
import math
from pathlib import Path

import pytest
import torch
import yaml
from conftest import run_cli

from toolgym.trainers.config import ConfigError, load_config
from toolgym.trainers.learner import Learner, LearnerConfig
from toolgym.trainers.sft import sft_learning_rate


def test_schedules_by_hand():
    assert [sft_learning_rate(1.0, i, 4) for i in range(4)] == [1.0] * 4  # constant: the default
    # decays: fraction done (step + 1) / (steps + 1), so the first step already decays a little
    # and the last is the smallest but still above 0
    assert [sft_learning_rate(1.0, i, 4, "linear") for i in range(4)] == pytest.approx([0.8, 0.6, 0.4, 0.2])
    want = [0.5 * (1 + math.cos(math.pi * (i + 1) / 5)) for i in range(4)]
    assert [sft_learning_rate(1.0, i, 4, "cosine") for i in range(4)] == pytest.approx(want)
    # warmup: (step + 1) / (warmup + 1) of the rate, then the decay over the remaining steps
    rates = [sft_learning_rate(2.0, i, 5, "linear", warmup_steps=2) for i in range(5)]
    assert rates == pytest.approx([2 / 3, 4 / 3, 1.5, 1.0, 0.5])
    for schedule in ("linear", "cosine"):
        rates = [sft_learning_rate(1e-4, i, 72, schedule) for i in range(72)]
        assert all(a > b > 0 for a, b in zip(rates, rates[1:]))
    with pytest.raises(ValueError, match="unknown SFT schedule 'step'"):
        sft_learning_rate(1.0, 0, 4, "step")


def test_set_lr_governs_the_next_update_and_keeps_the_optimizer_state():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 4)
    learner = Learner(model, LearnerConfig(lr=1e-2))
    x = torch.randn(8, 4)

    def step() -> torch.Tensor:
        before = model.weight.detach().clone()
        learner.optimizer.zero_grad()
        model(x).pow(2).mean().backward()
        learner.optimizer.step()
        return model.weight.detach() - before

    first = step()
    state = {k: v.clone() for k, v in learner.optimizer.state[model.weight].items() if torch.is_tensor(v)}
    learner.set_lr(0.0)
    assert learner.optimizer.state[model.weight]["exp_avg"].equal(state["exp_avg"])  # nothing reset
    assert step().abs().max() == 0  # rate 0: the weights stay
    learner.set_lr(1e-2)
    assert step().abs().max() > 0.1 * first.abs().max()


def _config(tmp_path: Path, sft: dict) -> Path:
    data = {
        "name": "sched",
        "seed": 3,
        "out_dir": str(tmp_path / "run"),
        "model": {"init": "tiny"},
        "envs": [{"env": "records-v0", "suite": "records", "weight": 1, "train_tasks": 40, "eval_tasks": 2}],
        "eval": {"base_tasks": 0, "max_turns": 2},
        "sft": {"steps": 3, "batch_size": 4, "demos_per_suite": 8, "lr": 1e-3, **sft},
        "rl": {"steps": 0, "learner": {"token_budget": 4096}},
        "rollout": {"max_turns": 2, "max_new_tokens": 16, "concurrency": 8},
    }
    path = tmp_path / "campaign.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_the_sft_stage_logs_the_scheduled_rate_of_every_step(tmp_path):
    out = run_cli("sft", str(_config(tmp_path, {"schedule": "linear", "warmup_steps": 1})), timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    logged = [r["lr"] for r in rows if r.get("kind") == "sft"]
    assert logged == pytest.approx([sft_learning_rate(1e-3, i, 3, "linear", 1) for i in range(3)])
    assert logged == pytest.approx([5e-4, 2e-3 / 3, 1e-3 / 3])


def test_a_bad_schedule_is_named(tmp_path):
    with pytest.raises(ConfigError, match="sft.schedule"):
        load_config(_config(tmp_path, {"schedule": "exponential"}))


def test_a_negative_family_limit_is_named(tmp_path):
    """`sft.family_limits` below 0 is a config error naming the field, not a silent empty family."""
    with pytest.raises(ConfigError, match="family_limits"):
        load_config(_config(tmp_path, {"family_limits": {"irrelevance": -1}}))


def test_a_family_no_train_task_has_is_named_before_anything_runs(tmp_path):
    """A misspelt family in `sft.family_limits` would change nothing silently: the CLI says so in one
    line, naming the families there are, and exits non-zero before any demonstration is played."""
    out = run_cli("sft", str(_config(tmp_path, {"family_limits": {"irrelevence": 2}})), timeout=600)
    assert out.returncode != 0
    assert "no train task of family irrelevence" in out.stderr + out.stdout
    assert "Traceback" not in out.stderr
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
