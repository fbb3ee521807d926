"""The token-in/token-out `Policy` protocol and its data types."""

from __future__ import annotations

from contextvars import ContextVar
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
    weight_version: int | None = Field(
        default=None, description="the policy's weight version when the turn was sampled (None: the backend does not say)"
    )


#: The episode a `generate` call belongs to, set by the rollout runner for the episode's task.
#: Backends that route requests (`SGLangPolicy` over several servers) use it as the routing key so
#: every turn of an episode goes to the same server and reuses its prefix cache; others ignore it.
#: A context variable rather than an argument: each episode runs in its own asyncio task, and the
#: `Policy` protocol stays `generate(prompt_ids, sampling)` for every backend.
current_episode: ContextVar[str | None] = ContextVar("current_episode", default=None)


class PolicyError(RuntimeError):
    """A policy backend failed (server down, bad response, model error)."""


@runtime_checkable
class Policy(Protocol):
    """Anything that turns prompt token ids into a `Generation`, asynchronously."""

    name: str

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Generation:
        """Sample one completion of `prompt_ids`."""
        ...

    # Optional: `end_episode(episode: str) -> None`, called by the rollout runner when the episode
    # named by `current_episode` ends, so a backend can free what it kept for it (`HFPolicy`: the
    # episode's cached keys and values) and stop waiting for its next turn when it batches.
