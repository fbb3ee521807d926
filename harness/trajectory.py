"""`Trajectory`: one episode as tokens with provenance, a loss mask, logprobs, messages and grade.

Segments keep where every token came from: `template` (prompt and chat-template glue), `policy`
(sampled by the policy: the only tokens with loss mask 1), `observation` (environment output
rendered as a template delta). Exports to JSONL and to parquet that `datasets` can load.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from toolgym.verifiers import Outcome, Verdict

SegmentKind = Literal["template", "policy", "observation"]


class Segment(BaseModel):
    """A run of tokens with one provenance; `logprobs` only for policy segments."""

    kind: SegmentKind
    token_ids: list[int]
    logprobs: list[float] | None = None
    text: str = ""
    weight_version: int | None = None  # policy segments: the weights that sampled them
    #: Policy segments: how many leading tokens the rollout's tool exploration chose instead of the
    #: policy (`TokenAgent.explore_tools`); they are trained like the policy's own tokens, and their
    #: `logprobs` (0.0) are placeholders, not the behaviour policy's.
    forced: int = 0


class TurnRecord(BaseModel):
    """Timing and tool accounting of one turn."""

    generate_s: float = 0.0
    env_s: float = 0.0
    new_tokens: int = 0
    tool_calls: int = 0
    errors: list[str] = Field(default_factory=list)


class Trajectory(BaseModel):
    """One episode (see the module docstring)."""

    task_id: str
    group_id: str
    sample_index: int = 0
    seed: int
    policy: str
    env_id: str
    family: str = ""
    difficulty: int = 1
    split: str = "train"
    segments: list[Segment] = Field(default_factory=list)
    messages: list[dict[str, Any]] = Field(default_factory=list)
    turns: list[TurnRecord] = Field(default_factory=list)
    tool_calls: int = 0
    tool_errors: dict[str, int] = Field(default_factory=dict)
    verdict: Verdict | None = None
    outcome: Outcome = Outcome.INFRA_ERROR
    reward: float = 0.0
    side_effects: list[dict[str, Any]] = Field(default_factory=list)
    error: str | None = None
    #: the answer the agent submitted (answer tasks), for majority votes
    answer: str | None = None
    #: which limit cut the episode: "turns" or "tokens" (the agent's), "watchdog" (wall clock: ours)
    limit_hit: str | None = None
    duration_s: float = 0.0

    @property
    def token_ids(self) -> list[int]:
        """All tokens in order."""
        return [t for s in self.segments for t in s.token_ids]

    @property
    def loss_mask(self) -> list[int]:
        """1 exactly on policy-generated tokens, 0 elsewhere."""
        return [int(s.kind == "policy") for s in self.segments for _ in s.token_ids]

    @property
    def logprobs(self) -> list[float]:
        """Behaviour-policy logprob per token (0.0 where the policy did not sample the token; NaN
        for trained tokens the rollout's exploration forced, whose behaviour logprob is unknown:
        the learner counts them as on-policy)."""
        out: list[float] = []
        for s in self.segments:
            if s.kind == "policy" and s.logprobs is not None:
                out.extend([float("nan")] * s.forced + list(s.logprobs[s.forced :]))
            else:
                out.extend([0.0] * len(s.token_ids))
        return out

    @property
    def weight_versions(self) -> list[int]:
        """The weight version of every policy turn that reported one, in order."""
        return [s.weight_version for s in self.segments if s.kind == "policy" and s.weight_version is not None]

    def staleness(self, current_version: int) -> int:
        """How many versions behind `current_version` the oldest turn is (0 when none reported one)."""
        versions = self.weight_versions
        return max(0, current_version - min(versions)) if versions else 0

    @property
    def has_tokens(self) -> bool:
        """False for text-only policies (OpenAI-compatible, oracle)."""
        return any(s.kind == "policy" and s.token_ids for s in self.segments)

    def flat_record(self) -> dict[str, Any]:
        """A flat dict (tokens, mask, logprobs, grade) for parquet / `datasets`."""
        return {
            "task_id": self.task_id,
            "group_id": self.group_id,
            "sample_index": self.sample_index,
            "seed": self.seed,
            "policy": self.policy,
            "env_id": self.env_id,
            "family": self.family,
            "difficulty": self.difficulty,
            "split": self.split,
            "token_ids": self.token_ids,
            "loss_mask": self.loss_mask,
            "logprobs": self.logprobs,
            "reward": self.reward,
            "outcome": self.outcome.value,
            "tool_calls": self.tool_calls,
            "turns": len(self.turns),
            "messages": json.dumps(self.messages),
            "side_effects": json.dumps(self.side_effects),
            "error": self.error,
            "duration_s": self.duration_s,
            "weight_versions": self.weight_versions,
        }


def write_jsonl(trajectories: Iterable[Trajectory], path: str | Path) -> Path:
    """Write one trajectory per line."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for t in trajectories:
            f.write(t.model_dump_json() + "\n")
    return path


def read_jsonl(path: str | Path) -> list[Trajectory]:
    """Read trajectories written by `write_jsonl` or streamed by the rollout runner."""
    out = []
    for lineno, line in enumerate(Path(path).read_text().splitlines(), 1):
        if line.strip():
            try:
                out.append(Trajectory.model_validate_json(line))
            except ValueError as err:
                raise ValueError(f"{path}:{lineno}: not a trajectory ({str(err).splitlines()[0]})") from None
    return out


def write_parquet(trajectories: Iterable[Trajectory], path: str | Path) -> Path:
    """Write flat records to parquet (loadable with `datasets.load_dataset("parquet", ...)`)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [t.flat_record() for t in trajectories]
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path
