"""The learner's settings (`rl.learner` of a campaign config) and the loss defaults their papers
set: plain data, kept apart from `learner.py` so that reading a config (the CLI, the viewer)
does not import torch."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class LoraSettings(BaseModel):
    """LoRA through peft (None in the config = full fine-tune)."""

    model_config = ConfigDict(extra="forbid")

    r: int = Field(default=16, ge=1)
    alpha: int = Field(default=32, ge=1)
    dropout: float = Field(default=0.0, ge=0.0, lt=1.0)
    target_modules: list[str] = Field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])


class LearnerConfig(BaseModel):
    """Optimisation settings."""

    model_config = ConfigDict(extra="forbid")

    lr: float = Field(default=1e-3, gt=0)
    weight_decay: float = Field(default=0.0, ge=0)
    betas: tuple[float, float] = (0.9, 0.99)
    grad_clip: float = Field(default=1.0, gt=0)
    token_budget: int | Literal["auto"] = Field(
        default="auto", description="padded tokens per micro-batch; auto = sized from the model and the free memory"
    )
    packing: bool | Literal["auto"] = Field(
        default="auto",
        description="run each micro-batch's rows end to end "
        "without padding (trainers/packing.py; one process); auto = on a CPU "
        "(1.4x an SFT step there), off on CUDA (its per-row attention loop is "
        "not measured there); false = rows padded to the longest",
    )
    loss: str = Field(default="ppo", description="ppo | gspo | cispo")
    agg: str | None = Field(
        default=None,
        description="token-mean | seq-mean-token-mean | seq-mean-token-sum-norm; "
        "None = the loss's own (ppo, cispo: token-mean; gspo: seq-mean-token-mean)",
    )
    agg_norm: float | None = Field(
        default=None, description="Dr.GRPO's constant length for seq-mean-token-sum-norm; None = the campaign's generation budget"
    )
    eps_low: float | None | Literal["default"] = Field(
        default="default", description="lower clip; default = the loss's paper (ppo 0.2, gspo 3e-4, cispo none); None = no lower clip"
    )
    eps_high: float | Literal["default"] = Field(
        default="default", description="upper clip; default = the loss's paper (ppo 0.28, gspo 4e-4, cispo 4.0 on the IS weight)"
    )
    kl_beta: float = Field(default=0.0, ge=0, description="0 keeps no reference model in memory")
    tis_cap: float | None | Literal["auto"] = Field(
        default="auto",
        description="truncated importance sampling "
        "cap on pi_train/pi_rollout per token; auto = 2.0 wherever "
        "the sampler is not the trained model itself (a bf16 copy, a "
        "stale batch, a server), off where it is; None = off",
    )
    updates_per_batch: int = Field(default=1, ge=1, description="optimizer steps (mini-batches) per batch")
    parallel: str = Field(
        default="ddp",
        pattern="^(ddp|fsdp2)$",
        description="data parallelism under torchrun: "
        "ddp (every rank holds the whole model) or fsdp2 (parameters, gradients and optimizer "
        "state sharded over the ranks)",
    )
    lora: LoraSettings | None = None
    autocast: str | None = Field(
        default=None,
        pattern="^(bf16|auto)$",
        description="bf16: forward and backward "
        "in bfloat16 autocast (the weights and the optimizer stay fp32); auto: bf16 where "
        "the hardware computes it natively (CUDA, a CPU with AVX512-BF16/AMX), none "
        "elsewhere; None = the model's dtype",
    )


#: Clip ranges as each loss's paper sets them: PPO with DAPO's clip-higher, GSPO's sequence-ratio
#: clip, CISPO's upper clip on the importance weight only.
LOSS_DEFAULTS: dict[str, dict[str, Any]] = {
    "ppo": {"eps_low": 0.2, "eps_high": 0.28, "agg": "token-mean"},
    "gspo": {"eps_low": 3e-4, "eps_high": 4e-4, "agg": "seq-mean-token-mean"},
    "cispo": {"eps_low": None, "eps_high": 4.0, "agg": "token-mean"},
}
#: The TIS cap `tis_cap: auto` uses where the sampler differs from the trained model.
DEFAULT_TIS_CAP = 2.0


def loss_settings(config: LearnerConfig) -> dict[str, Any]:
    """eps_low, eps_high and agg of `config` with `default`/None resolved from the loss's paper."""
    base = LOSS_DEFAULTS.get(config.loss, LOSS_DEFAULTS["ppo"])
    return {
        "eps_low": base["eps_low"] if config.eps_low == "default" else config.eps_low,
        "eps_high": base["eps_high"] if config.eps_high == "default" else config.eps_high,
        "agg": config.agg or base["agg"],
    }


__all__ = ["DEFAULT_TIS_CAP", "LOSS_DEFAULTS", "LearnerConfig", "LoraSettings", "loss_settings"]
