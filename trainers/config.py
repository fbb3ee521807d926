"""The campaign configuration: YAML validated by pydantic, errors that name the field and the fix."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from toolgym.trainers.learner_config import LearnerConfig
from toolgym.trainers.sampler import SamplerConfig


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TinyModel(_Strict):
    """The tiny policy toolgym builds itself (tokenizer trained here, Qwen2 architecture)."""

    hidden: int = Field(default=64, ge=16)
    layers: int = Field(default=2, ge=1)
    vocab: int = Field(default=1024, ge=300)


class ModelSettings(_Strict):
    """Which model to train and where."""

    init: str = Field(
        default="tiny",
        description="tiny (built here, sized by `tiny`) | a built-in pretrained model (smollm2-135m) | a model directory | a hub id",
    )
    tiny: TinyModel = Field(default_factory=TinyModel)
    device: str | None = Field(default=None, description="cpu | cuda | cuda:N (default: cuda if present)")
    dtype: str = Field(default="auto", description="bf16 | fp16 | fp32 | auto (bf16 on CUDA, fp32 on CPU)")
    rollout_dtype: str | None = Field(
        default=None,
        description="sample from a copy of the weights in this dtype "
        "(e.g. bf16 with fp32 training on a CPU), refreshed after every update; "
        "auto = bf16 where the hardware computes it natively, else none; "
        "None = the training model samples itself",
    )
    chat_template: str | None = Field(
        default=None,
        description="a built-in chat template (qwen2.5, "
        "qwen2.5-compact, qwen3, llama3) instead of the tokenizer's own; the "
        "exported models keep it",
    )

    @model_validator(mode="after")
    def _known_template(self) -> ModelSettings:
        from toolgym.inference.chat import TEMPLATES

        if self.chat_template is not None and self.chat_template not in TEMPLATES:
            raise ValueError(f"model.chat_template {self.chat_template!r}: use one of {', '.join(TEMPLATES)}")
        return self


class EnvMix(_Strict):
    """One environment of the campaign, its suite and its share of each batch."""

    env: str = Field(description="registered env id, e.g. records-v0")
    suite: str = Field(description="registered suite name, e.g. records")
    weight: float = Field(
        default=1.0, ge=0, description="its share of each RL batch; 0: never drawn for RL (demonstrated and evaluated only)"
    )
    sandbox: dict[str, Any] | None = Field(default=None, description="SandboxConfig fields for sandboxed envs")
    train_tasks: int = Field(default=0, ge=0, description="use the first N train tasks (0 = all)")
    max_difficulty: int = Field(
        default=0,
        ge=0,
        description="train on tasks of at most this difficulty only (0 = all), e.g. 1 for mcp-inventory's one-change "
        "tasks; evaluations keep every held-out task",
    )
    train_families: list[str] = Field(
        default_factory=list,
        description="train on tasks of these families only (empty = all), e.g. [mcp-inventory/ship]; evaluations keep every held-out task",
    )
    eval_tasks: int = Field(default=0, ge=0, description="evaluate on the first N held-out tasks (0 = all)")
    demos: int | None = Field(
        default=None,
        ge=1,
        description="SFT (and rl.sft_anchor) demonstrations from this suite's first N train tasks (None = "
        "sft.demos_per_suite), e.g. a few multi-turn demonstrations beside many single-turn ones",
    )
    demonstrations: bool = Field(
        default=True,
        description="SFT (and rl.sft_anchor) show this suite's oracle solutions; false: the suite is learned from its "
        "reward alone, and its tasks are never screened by their reference solutions either (sampler.screen): "
        "the sampler's own pass-rate estimates draw them",
    )
    shuffle_tools: bool = Field(
        default=False,
        description="list the tools in an order drawn per episode (demonstrations, rollouts and evaluations alike), so "
        "a tool's place in the list carries no information; false: the environment's own order",
    )
    call_cost: float = Field(
        default=0.0,
        ge=0,
        le=1,
        description="each tool call of an episode costs this much of its earned trained reward (floored at 0, like a "
        "side effect's price), so a pass that walked the whole tool list trains below one that made only the calls it "
        "needed; evaluations and the sampler keep the verdict",
    )
    pinned_tools: int = Field(
        default=0,
        ge=0,
        description="with shuffle_tools: the first N tools of the environment's own order keep their places and only "
        "the rest are drawn (e.g. 1 keeps mcp-inventory's read tool, list_items, first)",
    )

    @model_validator(mode="after")
    def _pinned_needs_shuffle(self) -> EnvMix:
        # pinning without drawing would be silently ignored: say so instead of running the wrong arm
        if self.pinned_tools and not self.shuffle_tools:
            raise ValueError(f"envs entry {self.env}: pinned_tools needs shuffle_tools: true")
        return self


class SFTSettings(_Strict):
    """Warm start on oracle demonstrations (same renderer and masks as RL)."""

    steps: int = Field(default=0, ge=0, description="0 = no SFT stage")
    batch_size: int = Field(default=16, ge=1)
    lr: float = Field(default=3e-3, gt=0)
    schedule: str = Field(
        default="constant",
        pattern="^(constant|linear|cosine)$",
        description="the learning rate over the SFT steps: constant, or decayed to 0 by the last "
        "step (linear: transformers' Trainer default; cosine)",
    )
    warmup_steps: int = Field(default=0, ge=0, description="steps of linear warmup from 0 before the schedule")
    demos_per_suite: int = Field(default=256, ge=1, description="demonstrations from the first N train tasks")
    skip_families: list[str] = Field(
        default_factory=list,
        description="task families never demonstrated (SFT and rl.sft_anchor): what their tasks ask is left to the reward",
    )
    family_limits: dict[str, Annotated[int, Field(ge=0)]] = Field(
        default_factory=dict,
        description="at most N demonstrations of each named family (the rest of "
        "demos_per_suite come from the other families): enough for the policy to sample what they show, "
        "the rest left to the reward",
    )


class RLSettings(_Strict):
    """The GRPO stage."""

    steps: int = Field(default=20, ge=0)
    tasks_per_step: int = Field(default=8, ge=1)
    group_size: int = Field(default=8, ge=2, description="G rollouts per task (same seed); >= 2 for a baseline")
    advantage: str = Field(
        default="grpo",
        pattern="^(grpo|drgrpo|rloo|none)$",
        description="none = every advantage 0: the reward ablation (only rl.sft_anchor trains)",
    )
    drop_zero_variance: bool = Field(default=True, description="leave groups with equal rewards out of the gradient")
    dynamic_sampling: int = Field(
        default=2,
        ge=0,
        description="DAPO's dynamic sampling: when zero-variance groups "
        "leave fewer than tasks_per_step informative groups, draw and play more tasks, at "
        "most this many extra rounds per step (0 = off); at most tasks_per_step groups train",
    )
    partial_credit: float = Field(
        default=0.0,
        ge=0,
        lt=1,
        description="a failed episode trains with this times "
        "its verifier's partial credit (`details.partial_credit`: BFCL's, in [0, 1], "
        "follows ToolRL: right functions, parameter names and values; a state checker's "
        "may go below 0 for changes away from the goal) instead of 0, so "
        "that of two failures the closer one is preferred; below 1, so no failure "
        "matches a pass; an episode cut by its turn limit is graded on what it left and earns "
        "it too. The sampler's running rates then count the same shaped reward, so a task "
        "nobody passes yet but whose failures differ is still drawn. Grading and pass@k never "
        "use it; 0 = off",
    )
    overlong: str = Field(
        default="drop",
        pattern="^(drop|penalize|keep)$",
        description="episodes cut by their turn "
        "or token limit (outcome truncated): drop = out of the gradient (DAPO's overlong "
        "filtering), penalize = DAPO's soft overlong punishment on the reward, keep = as graded",
    )
    overlong_buffer: int = Field(
        default=256,
        ge=1,
        description="penalize: the last this many tokens of the "
        "generation budget cost a linearly growing penalty (up to 1; a truncated episode: 1)",
    )
    sft_anchor: float = Field(
        default=0.0,
        ge=0,
        description="PPO-ptx (InstructGPT): each RL update also "
        "minimises this times the token-mean NLL of `sft_anchor_batch` oracle demonstrations "
        "(the SFT stage's own), so behaviours the step's rollouts never exercise are not "
        "unlearned; 0 = off",
    )
    sft_anchor_batch: int = Field(default=4, ge=1, description="demonstrations per RL update for sft_anchor")
    learner: LearnerConfig = Field(default_factory=LearnerConfig)


class RaySettings(_Strict):
    """Environment workers on a Ray cluster (`rollout.backend: ray`)."""

    address: str | None = Field(default=None, description="a running cluster (`ray://...` or `auto`); None starts a local one")
    workers: int = Field(default=2, ge=1, description="EnvWorker actors")
    envs_per_worker: int = Field(default=8, ge=1, description="episodes in flight per worker")
    deadline_s: float = Field(default=600.0, gt=0, description="per-episode watchdog")
    max_resubmits: int = Field(default=2, ge=0, description="replays of an episode whose worker died")


class RolloutSettings(_Strict):
    """How episodes are played during training and evaluation."""

    max_turns: int = Field(default=6, ge=1)
    max_new_tokens: int = Field(default=64, ge=1)
    max_total_tokens: int = Field(default=2048, ge=64)
    temperature: float = Field(default=1.0, ge=0)
    top_p: float = Field(default=1.0, gt=0, le=1)
    concurrency: int = Field(default=64, ge=1)
    backend: str = Field(
        default="local",
        pattern="^(local|ray)$",
        description="local: this process; ray: EnvWorker actors, the policy served by a PolicyActor",
    )
    ray: RaySettings = Field(default_factory=RaySettings)
    servers: list[str] = Field(
        default_factory=list,
        description="sglang servers (or a router) that serve the policy for rollouts; empty = the in-process model (or a Ray PolicyActor)",
    )
    weight_sync: str = Field(
        default="disk",
        pattern="^(disk|distributed)$",
        description="how servers get new weights: disk (update_weights_from_disk) or distributed (a torch.distributed group)",
    )
    max_staleness: int = Field(
        default=0,
        ge=0,
        description="0 = synchronous; k >= 1: the next batches are "
        "played while the learner updates, and groups more than k versions old are dropped",
    )
    save: bool = Field(default=True, description="write each RL step's trajectories to OUT/rollouts/step-N.jsonl")
    explore_tools: float = Field(
        default=0.0,
        ge=0.0,
        lt=1.0,
        description="RL rollouts only: the chance per turn that the turn opens a call to a tool drawn uniformly from the "
        "episode's tools (the policy writes the arguments); the drawn name is trained as the policy's own token "
        "(epsilon-greedy exploration of the tool choice). Evaluations never explore",
    )

    @model_validator(mode="after")
    def _explore_needs_local_agent(self) -> RolloutSettings:
        if self.explore_tools and self.backend == "ray":
            raise ValueError("rollout.explore_tools works with backend: local (Ray's environment workers build their own agent)")
        return self


#: The evaluations an evaluation-only suite can join (`EvalSuite.stages`); "steps" = `eval.every`'s.
EVAL_STAGES = ("base", "sft", "initial", "steps", "final")


class EvalSuite(_Strict):
    """A suite evaluated beside the trained ones and never trained on: none of its tasks is a
    demonstration or drawn for RL. It keeps its own episode budget (a multi-turn family needs more
    turns and tokens than single-turn ones), the same at every evaluation it joins."""

    env: str = Field(description="registered env id, e.g. bfcl-multi-v0")
    suite: str = Field(description="registered suite name; its held-out split is evaluated")
    tasks: int = Field(default=0, ge=0, description="evaluate on the first N held-out tasks (0 = all)")
    max_turns: int | None = Field(
        default=None, ge=1, description="turns per episode (None = the environment's own limit, e.g. BFCL's 20 steps per user request)"
    )
    max_total_tokens: int | None = Field(
        default=None, ge=64, description="tokens per episode, prompt included (None = rollout.max_total_tokens)"
    )
    stages: list[str] = Field(
        default_factory=lambda: list(EVAL_STAGES),
        description="the evaluations it joins: base, sft, initial, steps, final (a slow suite can be evaluated at the end only)",
    )
    sandbox: dict[str, Any] | None = Field(default=None, description="SandboxConfig fields for sandboxed envs")

    @model_validator(mode="after")
    def _check_stages(self) -> EvalSuite:
        unknown = [s for s in self.stages if s not in EVAL_STAGES]
        if unknown or not self.stages:
            raise ValueError(f"eval.suites[{self.suite}].stages {self.stages}: use some of {', '.join(EVAL_STAGES)}")
        return self


class EvalSettings(_Strict):
    """Held-out evaluation through the harness's `evaluate` (pass@k with bootstrap CIs)."""

    every: int = Field(default=0, ge=0, description="evaluate every N RL steps (0 = before and after only)")
    base_tasks: int = Field(
        default=0,
        ge=0,
        description="also evaluate the starting model, before SFT, on the "
        "first N held-out tasks of each environment (0 = no base evaluation)",
    )
    temperature: float = Field(default=1.0, ge=0, description="the same for the SFT and the final checkpoint")
    max_turns: int | None = Field(
        default=None, ge=1, description="turns per evaluation episode, the same at every evaluation (None = rollout.max_turns)"
    )
    samples: int = Field(default=1, ge=1)
    ks: list[int] = Field(default_factory=lambda: [1])
    suites: list[EvalSuite] = Field(
        default_factory=list,
        description="suites evaluated but never trained on, "
        "each with its own budget (held-out accuracy on a family the run does not train)",
    )


class CheckpointSettings(_Strict):
    """Atomic checkpoints: weights, optimizer, sampler, RNG states, step, metrics so far."""

    every: int = Field(default=5, ge=1)
    keep: int = Field(default=2, ge=1)


class CampaignConfig(_Strict):
    """A training campaign (see `examples/*.yaml`)."""

    name: str = "campaign"
    seed: int = 0
    out_dir: str = "runs/campaign"
    model: ModelSettings = Field(default_factory=ModelSettings)
    envs: list[EnvMix] = Field(min_length=1)
    sft: SFTSettings = Field(default_factory=SFTSettings)
    rl: RLSettings = Field(default_factory=RLSettings)
    sampler: SamplerConfig = Field(default_factory=SamplerConfig)
    rollout: RolloutSettings = Field(default_factory=RolloutSettings)
    eval: EvalSettings = Field(default_factory=EvalSettings)
    checkpoint: CheckpointSettings = Field(default_factory=CheckpointSettings)
    processes: int = Field(
        default=1,
        ge=1,
        description="training processes (torchrun, one per GPU): rank 0 "
        "plays the rollouts, every rank trains on its share (rl.learner.parallel: ddp|fsdp2)",
    )

    @model_validator(mode="after")
    def _check_names(self) -> CampaignConfig:
        from toolgym.trainers import core_algos

        if self.processes > 1 and self.rl.learner.lora is not None:
            raise ValueError("processes > 1 with rl.learner.lora is not supported: train LoRA in one process")

        if self.rl.learner.loss not in core_algos.POLICY_LOSSES:
            raise ValueError(f"rl.learner.loss {self.rl.learner.loss!r}: use one of {', '.join(core_algos.POLICY_LOSSES)}")
        if self.rl.learner.agg is not None and self.rl.learner.agg not in core_algos.AGGREGATIONS:
            raise ValueError(f"rl.learner.agg {self.rl.learner.agg!r}: use one of {', '.join(core_algos.AGGREGATIONS)}")
        if (self.sft.steps > 0 or self.rl.sft_anchor > 0) and not any(mix.demonstrations for mix in self.envs):
            raise ValueError(
                "sft.steps / rl.sft_anchor need demonstrations, and every env has demonstrations: false; "
                "set sft.steps: 0 and rl.sft_anchor: 0, or let one env be demonstrated"
            )
        if not any(mix.weight > 0 for mix in self.envs):
            raise ValueError("envs: every weight is 0, so RL would draw no task; give one env a positive weight")
        trained = {mix.suite for mix in self.envs}
        for extra in self.eval.suites:
            if extra.suite in trained:
                raise ValueError(
                    f"eval.suites: {extra.suite!r} is also in envs (trained on, and evaluated there); list a suite in one place"
                )
        return self


class ConfigError(ValueError):
    """A campaign config that cannot be used; the message names the field and the fix."""


def _override(data: dict[str, Any], key: str, value: Any) -> None:
    """Set `key` (dotted; a number picks a list item: `envs.0.eval_tasks`) to `value` in `data`."""
    node: Any = data
    parts = key.split(".")
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node):
                raise ConfigError(f"--set {key}: {'.'.join(parts[:i])} is a list of {len(node)}; use an index below {len(node)}")
            if last:
                node[int(part)] = value
            else:
                node = node[int(part)]
        elif last:
            node[part] = value
        else:
            node = node.setdefault(part, {})
            if not isinstance(node, (dict, list)):
                raise ConfigError(f"--set {key}: {'.'.join(parts[: i + 1])} is a value, not a section")


def load_config(path: str | Path, overrides: dict[str, Any] | None = None) -> CampaignConfig:
    """Read and validate a campaign YAML file (`overrides` are merged in, e.g. from the CLI)."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"{path}: no such config file")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML ({str(err).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of settings at the top level")
    for key, value in (overrides or {}).items():
        _override(data, key, value)
    try:
        return CampaignConfig.model_validate(data)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(x) for x in first["loc"]) or "(top level)"
        hint = {
            "extra_forbidden": "unknown field: check its spelling against the example configs",
            "missing": "this field is required",
        }.get(first["type"], first["msg"])
        raise ConfigError(
            f"{path}: {where}: {hint}"
            + (f" (got {first['input']!r})" if first["type"] not in ("missing",) and not isinstance(first.get("input"), dict) else "")
        ) from None


__all__ = [
    "CampaignConfig",
    "CheckpointSettings",
    "ConfigError",
    "EnvMix",
    "EvalSettings",
    "EvalSuite",
    "ModelSettings",
    "RLSettings",
    "RaySettings",
    "RolloutSettings",
    "SFTSettings",
    "TinyModel",
    "load_config",
]
