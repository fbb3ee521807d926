"""The token-in/token-out `Policy` protocol and its data types."""

from __future__ import annotations

from typing import Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field


class SamplingParams(BaseModel):
    """How to sample one completion. `temperature=0` means greedy."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_new_tokens: int = Field(default=128, ge=1)
    temperature: float = Field(default=1.0, ge=0.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=0, description="0 = no top-k cut")
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None


class Generation(BaseModel):
    """A completion: sampled token ids, the model's log-probability of each, and why it stopped.

    `logprobs[i]` is log p(token_ids[i]) under the model's unmodified distribution (temperature 1,
    no top-p/top-k), the quantity a trainer recomputes for importance ratios.
    """

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: Literal["stop", "length", "abort"] = "stop"


class PolicyError(RuntimeError):
    """A policy backend failed (server down, bad response, model error)."""


@runtime_checkable
class Policy(Protocol):
    """Anything that turns prompt token ids into a `Generation`, asynchronously."""

    name: str

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Generation:
        """Sample one completion of `prompt_ids`."""
        ...
