"""`Outcome` (a closed set) and `Verdict`: what grading an episode produced."""

from __future__ import annotations

from enum import Enum
from typing import Any

from pydantic import BaseModel, Field


class Outcome(str, Enum):
    """How an episode ended. Trainers skip `infra_error` and `verifier_error`: those are our
    failures, not the agent's, and are never trained on as reward 0. A wall-clock watchdog that
    trips (the machine or the policy server was slow) is an `infra_error`: time the agent did not
    spend is never graded as its failure."""

    PASSED = "passed"
    FAILED = "failed"
    #: the agent's code ran past its own time limit (a command, the hidden tests on its code)
    TIMEOUT = "timeout"
    #: the episode was cut by its turn or token limit before the agent finished
    TRUNCATED = "truncated"
    FORMAT_ERROR = "format_error"
    INFRA_ERROR = "infra_error"
    VERIFIER_ERROR = "verifier_error"

    @property
    def is_agent_attempt(self) -> bool:
        """True when the result says something about the agent (not infra or verifier trouble)."""
        return self not in (Outcome.INFRA_ERROR, Outcome.VERIFIER_ERROR)


class VerifierError(RuntimeError):
    """The verifier itself could not grade (bad spec, crashed checker): `verifier_error`."""


class TestResult(BaseModel):
    """One hidden test (or check) and whether it passed."""

    name: str
    passed: bool
    message: str = ""
    #: how far a failed check got, in [-1, 1] (a checker may report it: 1 is right, 0 is where the
    #: episode started, below 0 is a change away from the goal); training only, never the verdict
    credit: float | None = Field(default=None, ge=-1.0, le=1.0)


class Verdict(BaseModel):
    """The grade of one episode: reward in [0, 1], per-test results, outcome and a short reason."""

    reward: float = Field(ge=0.0, le=1.0)
    passed: bool
    outcome: Outcome
    tests: list[TestResult] = Field(default_factory=list)
    duration_s: float = 0.0
    reason: str = ""
    details: dict[str, Any] = Field(default_factory=dict)


class FinalState(BaseModel):
    """What a verifier may look at after an episode: the submitted answer and workspace changes."""

    answer: str | None = None
    #: Agent changes to the workspace: path -> new text, or None for a deleted file.
    changes: dict[str, str | None] = Field(default_factory=dict)
    #: Permission bits of changed or re-moded workspace files (path -> mode).
    modes: dict[str, int] = Field(default_factory=dict)
    metadata: dict[str, Any] = Field(default_factory=dict)
