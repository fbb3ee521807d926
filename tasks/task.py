"""The `Task` model: one problem an agent is asked to solve, with everything needed to grade it.

A task is frozen and content-addressed: its `id` is a hash of the fields that define the problem
(instruction, environment, workspace, hidden verifier spec, family, difficulty), so two suites that
contain the same problem under different names or splits are caught by comparing ids.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

#: The fields that define a problem; `split`, `oracle` and `metadata` are about the problem, not of it.
CONTENT_FIELDS = ("env_id", "instruction", "workspace", "hidden", "family", "difficulty")


class ToolCall(BaseModel):
    """One call of a tool by name with JSON arguments (the Hermes/Qwen `<tool_call>` payload)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)

    def to_text(self) -> str:
        """Render as the model would write it: `<tool_call>{...}</tool_call>`."""
        payload = json.dumps({"name": self.name, "arguments": self.arguments}, ensure_ascii=False)
        return f"<tool_call>\n{payload}\n</tool_call>"


class Probe(BaseModel):
    """One call into the agent's code made at grading time (hidden-test tasks).

    `code` runs in a separate interpreter inside the agent's graded workspace and binds `result`
    to builtin data (numbers, strings, lists, tuples, dicts, sets, None), e.g.
    ``from src.core import median\nxs = [3, 1, 2]\nresult = [median(xs), xs]``. It holds inputs
    only: expected values live in the hidden tests, which never run where agent code runs.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    code: str


class TestRun(BaseModel):
    """One process of a `package-tests` grading: a grading copy of one of the project's test files.

    `files[file]` (in the hidden spec) is the copy: every test renamed to an opaque name, only the
    selected tests kept, and sentinels mixed in. `passing` are the junit names that must pass,
    `sentinels` those that must fail on any code (a copy of a real test with its expected value
    changed): a run where a sentinel passes forged its results.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    file: str
    passing: tuple[str, ...]
    sentinels: tuple[str, ...]
    #: Directories (workspace-relative) put on `sys.path` through the grader's own pytest ini.
    pythonpath: tuple[str, ...] = (".",)
    #: Junit names of the fail-to-pass tests among `passing` (the ones the bug broke).
    fail_to_pass: tuple[str, ...] = ()


class DifferentialCase(BaseModel):
    """One differential check of a `package-tests` task: a call of the mutated function on one
    input, and what the pristine function did on it (see `verifiers/differential.py`).

    `code` (inputs only) runs in a probe process in the agent's graded workspace and binds
    `result`; `expected` is the pristine record's text, compared host-side as data. `origin`
    says where the input came from: a test the agent sees (`visible`), the withheld test
    (`withheld`), or generated from a recorded input (`generated`). `distinguishes` is True when
    the unfixed code does something else on it.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    code: str
    expected: str
    origin: Literal["visible", "withheld", "generated"] = "visible"
    distinguishes: bool = False


class HiddenSpec(BaseModel):
    """What the verifier uses and the agent never sees.

    kind:
      - ``answer``: the submitted answer is compared with `answer` under `match`.
      - ``tests``: `probes` run the agent's code and return plain data; `files` are hidden pytest
        files that judge that data (`from toolgym_probes import probe, assert_same`) in a second,
        clean sandbox. Agent code never runs in the process or filesystem that decides results.
      - ``state``: `files` hold a checker script run against the final workspace.
      - ``package-tests``: a real project's own tests, which must import the agent's code; `runs`
        say which grading copies (in `files`) run, one process each, and which results to expect;
        `differential` cases compare the agent's function with the pristine one outside the test
        process (see `verifiers/package_tests.py` for what this grading does and does not stop).
      - ``score``: the registered scoring function `scorer` (e.g. ``reasoning-gym``) scores the
        submitted answer in [0, 1] with `answer` and `scorer_args` (passed only at 1.0).
      - ``harbor``: a task imported from Harbor's format: `files` hold its `tests/` and its
        `environment/Dockerfile`, and its own `tests/test.sh` decides, run as Harbor runs it
        (`verifiers/harbor.py`).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["answer", "tests", "state", "score", "package-tests", "harbor"] = "answer"
    answer: str | None = None
    match: Literal["exact", "normalized", "numeric"] = "normalized"
    tolerance: float = 1e-6
    files: dict[str, str] = Field(default_factory=dict)
    probes: tuple[Probe, ...] = ()
    #: `state` tasks only: the checker command (default `python3 -I {checker}/check.py {results}`).
    command: str | None = None
    all_or_nothing: bool = True
    #: Workspace paths the agent must not change (visible tests, test config); edits are dropped
    #: before grading and recorded as tampering.
    protected: tuple[str, ...] = ()
    timeout_s: float = 60.0
    #: `score` tasks only: the scoring function's registered name and its extra arguments.
    scorer: str | None = None
    scorer_args: dict[str, Any] = Field(default_factory=dict)
    #: `package-tests` tasks only: one grading process per entry.
    runs: tuple[TestRun, ...] = ()
    #: `package-tests` tasks only: differential checks, all of which must pass as well.
    differential: tuple[DifferentialCase, ...] = ()


class Task(BaseModel):
    """A frozen, content-hashed task. Build with keyword arguments; `id` is computed."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str = ""
    #: The environment that plays the task. Left empty by a generator registered with
    #: `register_env(..., tasks=generator)`: the suite fills in that environment's id.
    env_id: str = ""
    instruction: str
    family: str
    difficulty: int = Field(default=1, ge=1, le=10)
    split: str = "train"
    #: Initial workspace: relative path -> file text. Empty for tasks that need no files.
    workspace: dict[str, str] = Field(default_factory=dict)
    hidden: HiddenSpec = Field(default_factory=HiddenSpec)
    #: A sequence of tool calls that solves the task (used by `toolgym check` and the oracle policy).
    oracle: tuple[ToolCall, ...] = ()
    #: Free-form data the environment needs to build its state (e.g. a generated record store).
    data: dict[str, Any] = Field(default_factory=dict)
    metadata: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _check_id(self) -> Task:
        expected = self.content_hash()
        if self.id == "":
            object.__setattr__(self, "id", expected)
        elif self.id != expected:
            raise ValueError(
                f"id {self.id!r} does not match the content hash {expected!r}: the task's content "
                "was edited after its id was computed. Delete the `id` field to recompute it."
            )
        return self

    def content_hash(self) -> str:
        """Hash of the defining fields (not split, oracle or metadata); 16 hex characters."""
        payload = {name: getattr(self, name) for name in CONTENT_FIELDS}
        # Fields added later are hashed only when set, so existing tasks keep their ids.
        unset = {"scorer", "scorer_args"} if self.hidden.scorer is None and not self.hidden.scorer_args else set()
        if not self.hidden.runs:
            unset.add("runs")
        payload["hidden"] = self.hidden.model_dump(mode="json", exclude=unset or None)
        payload["data"] = self.data
        blob = json.dumps(payload, sort_keys=True, ensure_ascii=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def with_split(self, split: str) -> Task:
        """The same task (same id) placed in another split."""
        return self.model_copy(update={"split": split})

    def oracle_turns(self) -> list[str]:
        """The oracle as the agent's turns: one call per turn, or, for tasks whose answer is one
        turn of calls (`metadata["oracle_turns"] == "one"`, e.g. BFCL's parallel calls), every call
        in a single turn (an empty oracle: a turn that calls nothing)."""
        if isinstance(self.metadata.get("oracle_texts"), list):  # the task spells its oracle turns out
            return [str(t) for t in self.metadata["oracle_texts"]]
        if self.metadata.get("oracle_turns") == "one":
            return ["\n".join(c.to_text() for c in self.oracle) or "None of the available functions fits this request."]
        return [c.to_text() for c in self.oracle]

    def public_view(self) -> dict[str, Any]:
        """What an agent may see: everything but the hidden spec and the oracle."""
        return self.model_dump(mode="json", exclude={"hidden", "oracle"})
