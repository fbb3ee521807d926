"""`ToolEnv`: a gymnasium environment whose actions are tool calls and whose observations are text.

Subclass it, mark methods with `@tool`, and implement `load_task(task)` to build the episode's
state from a `Task`. A tool marked `@tool(final=True)` ends the episode; `@tool(submits="x")` also
declares that its argument `x` is what the episode submits.

**One way to grade.** `verdict()` is the only place an episode is graded: `step`'s reward at the
end of an episode, `toolgym check`, evaluation, training, the datasets export and the TRL adapter
all take their reward from it. An author says what counts in one of two ways:

- override `grade(self) -> float` (the reward, read from `self`; 1.0 counts as passed), or
- leave it, and the task's hidden spec picks a verifier (`verifier()`: the hidden answer, hidden
  tests or a state checker run in a clean sandbox, a registered scorer), which grades
  `final_state()`.

A class that overrides both `grade()` and `verifier()`, or whose `grade` takes arguments or is a
coroutine, is refused when it is defined, with what to write instead.

`step` never raises on bad model output: a malformed call, an unknown tool, bad arguments or a
tool that fails becomes an observation saying what went wrong, counted in `info["errors"]`.
"""

from __future__ import annotations

import hashlib
import inspect
import json
from collections import Counter
from collections.abc import Iterable
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np

from toolgym.envs.parsing import ERROR_CLASSES, CallError, coerce_action
from toolgym.envs.spaces import TextSpace
from toolgym.envs.tools import InfraError, ToolArgumentError, ToolDefinitionError, ToolError, ToolSpec, collect_tools
from toolgym.tasks import Task, TaskSuite, ToolCall
from toolgym.verifiers import FinalState, Outcome, Verdict, verifier_for


class StateNotJSON(TypeError):
    """`state_hash()` met an attribute whose value is not JSON data (its `repr` could hold a
    memory address, which would make a same-seed determinism check fail for no visible reason)."""


#: Attributes every ToolEnv sets on itself: a tool method of one of these names would be hidden by them.
RESERVED_ATTRIBUTES = frozenset(
    {
        "task",
        "tasks",
        "turn",
        "done",
        "submitted",
        "grade_on_submit",
        "error_counts",
        "tool_call_count",
        "transcript",
        "max_turns",
        "render_mode",
        "observation_space",
        "action_space",
        "np_random",
        "spec",
        "tools",
    }
)


def _check_tool_names(cls: type, tools: dict[str, ToolSpec]) -> None:
    """Refuse a tool method that an attribute of every environment would hide."""
    for spec in tools.values():
        if spec.method in RESERVED_ATTRIBUTES:
            raise ToolDefinitionError(
                f"{cls.__qualname__}.{spec.method}: ToolEnv keeps self.{spec.method} for itself, which "
                f"would hide the tool method; name the method otherwise and keep the tool's name with "
                f'@tool(name="{spec.method}")'
            )


def _check_grading(cls: type) -> None:
    """Refuse, at class definition, a way of grading `verdict()` cannot honour."""
    grade = cls.__dict__.get("grade")
    if grade is not None:
        if inspect.iscoroutinefunction(grade):
            raise TypeError(
                f"{cls.__qualname__}.grade is a coroutine; write `def grade(self) -> float` (it runs in a worker thread, so it may block)"
            )
        params = [p for p in inspect.signature(grade).parameters.values()][1:]
        if any(p.default is inspect.Parameter.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params):
            raise TypeError(
                f"{cls.__qualname__}.grade takes arguments ({', '.join(p.name for p in params)}); "
                "write `def grade(self) -> float` and read what you need from self "
                "(self.task, self.submitted, your own state)"
            )
    overrides_grade = cls.grade is not ToolEnv.grade
    overrides_verifier = cls.verifier is not ToolEnv.verifier
    if overrides_grade and overrides_verifier:
        raise TypeError(
            f"{cls.__qualname__} overrides both grade() and verifier(): say what counts once. "
            "Keep grade() to compute the reward from the environment's own state, or "
            "verifier() to grade final_state() with a verifier, not both"
        )


class ToolEnv(gym.Env[str, Any]):
    """Base class of every toolgym environment (see the module docstring)."""

    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["ansi", "human"]}
    #: Default turn limit; one turn = one `step`.
    max_turns: int = 16
    #: Name of the registered suite this environment draws tasks from by default.
    default_suite: ClassVar[str | None] = None
    #: Cap on one observation's length (longer tool output is cut, with a note).
    max_observation_chars: ClassVar[int] = 8000

    _tools: ClassVar[dict[str, ToolSpec]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._tools = collect_tools(cls)  # fails here, at class definition, if a tool is malformed
        _check_tool_names(cls, cls._tools)
        _check_grading(cls)

    def __init__(
        self,
        tasks: TaskSuite | Iterable[Task] | None = None,
        suite: str | None = None,
        split: str = "train",
        max_turns: int | None = None,
        render_mode: str | None = None,
        shuffle_tools: bool = False,
        pinned_tools: int = 0,
    ) -> None:
        if tasks is None:
            name = suite or self.default_suite
            if name is None:
                raise ValueError(f"{type(self).__name__} needs `tasks=` or `suite=`: it has no default suite")
            from toolgym.tasks import builtin_suite

            tasks = builtin_suite(name).split(split)
        self.tasks: list[Task] = list(tasks)
        if not self.tasks:
            raise ValueError(f"{type(self).__name__}: no tasks (suite {suite or self.default_suite!r}, split {split!r})")
        if max_turns is not None:
            self.max_turns = max_turns
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode {render_mode!r} is not one of {self.metadata['render_modes']}")
        self.render_mode = render_mode
        self.observation_space = TextSpace()
        self.action_space = TextSpace()
        self.task: Task | None = None
        self.turn = 0
        self.done = False
        #: What the episode submitted (set by a `@tool(submits=...)` tool, or by the final tool itself).
        self.submitted: str | None = None
        #: False when the caller grades the finished episode itself with `verdict()` (the rollout
        #: runner, the TRL adapter): `step` then returns reward 0.0 at the end instead of grading twice.
        self.grade_on_submit = True
        self.error_counts: Counter[str] = Counter()
        self.tool_call_count = 0
        self.transcript: list[tuple[str, str]] = []
        #: List the tools in an order drawn per episode (from the task and the reset seed), so that
        #: a tool's place in the list tells a policy nothing (see `episode_tool_order`).
        self.shuffle_tools = shuffle_tools
        #: With `shuffle_tools`: the first N tools of the definition order keep their places and
        #: only the rest are drawn (a family's read tool stays first, the write tools move).
        if pinned_tools < 0:
            raise ValueError(f"pinned_tools must be 0 or more, got {pinned_tools}")
        self.pinned_tools = pinned_tools
        self._tool_order: list[str] | None = None

    # ---- to implement in subclasses ------------------------------------------------------------

    def load_task(self, task: Task) -> None:
        """Build the episode's state from `task` (called by `reset`). Default: nothing to build."""

    def grade(self) -> float:
        """The episode's reward. Override it to grade from the environment's own state (1.0 counts
        as passed); by default it is the verdict of `verifier()` on `final_state()`."""
        return self.verdict().reward

    def verifier(self) -> Any:
        """What grades `final_state()` when `grade()` is not overridden: by default the verifier the
        task's hidden spec calls for (`toolgym.verifiers.verifier_for`)."""
        assert self.task is not None
        return verifier_for(self.task, self.grading_sandbox_config())

    def grading_sandbox_config(self) -> Any:
        """The sandbox config a sandboxed verifier uses for this episode's task (None: no sandbox)."""
        return None

    def verdict(self, state: FinalState | None = None) -> Verdict:
        """The episode's `Verdict`: the one grading path (see the module docstring). `state` is
        `final_state()` when the caller already read it."""
        if self.task is None:
            raise gym.error.ResetNeeded("call reset() before grading an episode")
        if type(self).grade is not ToolEnv.grade:
            reward = float(self.grade())
            passed = reward >= 1.0
            return Verdict(
                reward=reward,
                passed=passed,
                outcome=Outcome.PASSED if passed else Outcome.FAILED,
                reason=f"{type(self).__name__}.grade() = {reward:g}",
            )
        return self.verifier().verify(self.task, state or FinalState(**self.final_state()))

    def nothing_solves(self, task: Task) -> bool:
        """True for tasks whose right answer is to do nothing (the checker then expects an agent
        that only talks to pass them). Default: none."""
        return False

    def state_hash(self) -> str:
        """A content hash of the episode's mutable state (sandboxed envs hash their workspace).

        The default hashes the JSON of every public attribute that is not a tool spec or a task
        list. Only JSON data is accepted (dicts, lists, strings, numbers, booleans, None; a
        `Counter` is a dict): any other value raises `StateNotJSON` naming the attribute. Keep such
        an object private (`self._name`) or override this method when the state lives elsewhere.
        """
        skip = {"tasks", "task", "observation_space", "action_space", "transcript", "np_random", "render_mode", "spec"}
        state = {k: v for k, v in sorted(vars(self).items()) if not k.startswith("_") and k not in skip}
        for name, value in state.items():
            try:
                json.dumps(value, sort_keys=True)
            except (TypeError, ValueError) as err:
                raise StateNotJSON(
                    f"{type(self).__name__}.{name} is not JSON data ({err}); state_hash() hashes "
                    f"every public attribute: store it as JSON data, name it _{name} to keep it out "
                    "of the state, or override state_hash()"
                ) from None
        blob = json.dumps(state, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def final_state(self) -> dict[str, Any]:
        """What a verifier may grade after the episode (here: the submitted answer)."""
        return {"answer": self.submitted}

    def episode_info(self) -> dict[str, Any]:
        """Extra `info` keys added at every step (subclasses add e.g. side effects)."""
        return {}

    # ---- tools -----------------------------------------------------------------------------------

    @property
    def tools(self) -> dict[str, ToolSpec]:
        """This environment's tools by name."""
        return self._tools

    def tool_schemas(self) -> list[dict[str, Any]]:
        """OpenAI/Hermes function schemas of every tool (what a chat template's `tools=` takes), in
        the episode's order."""
        return [spec.schema for spec in self._listed_tools()]

    def episode_tool_order(self, task: Task, seed: int | None) -> list[str] | None:
        """The order the episode lists its tools in: None (the definition order) unless
        `shuffle_tools`; then a permutation drawn from the task id and the reset seed, so every
        task and every sample of it may see another order, and the same episode the same one (the
        first `pinned_tools` keep their places)."""
        if not self.shuffle_tools:
            return None
        digest = hashlib.sha256(f"{task.id}\0{seed}".encode()).digest()
        names = list(self._tools)
        pinned, drawn = names[: self.pinned_tools], names[self.pinned_tools :]
        order = np.random.default_rng(int.from_bytes(digest[:8], "little")).permutation(len(drawn))
        return pinned + [drawn[i] for i in order]

    def _listed_tools(self) -> list[ToolSpec]:
        """The tools as the agent sees them listed this episode."""
        if self._tool_order is None or set(self._tool_order) != set(self._tools):
            return list(self._tools.values())
        return [self._tools[name] for name in self._tool_order]

    def call_tool(self, call: ToolCall) -> tuple[str, CallError | None]:
        """Validate and run one call; returns (observation text, error or None).

        The agent's mistakes (unknown tool, bad arguments, a `ToolError`) become observations.
        Failures of ours (`InfraError`, or any other exception: a bug in the tool) raise
        `InfraError`: they must not be shown to the agent or graded as its failure."""
        spec = self._tools.get(call.name)
        if spec is None:
            known = ", ".join(listed.name for listed in self._listed_tools())
            return "", CallError("unknown_tool", f"unknown tool `{call.name}`; available tools: {known}", call)
        try:
            args = spec.validate(call.arguments)
        except ToolArgumentError as err:
            return "", CallError("invalid_arguments", str(err), call)
        if spec.submits is not None:
            value = args[spec.submits]
            self.submitted = value if isinstance(value, str) else json.dumps(value)
        try:
            result = getattr(self, spec.method)(**args)
        except ToolError as err:
            return "", CallError("tool_error", f"`{call.name}` failed: {err}", call)
        except InfraError:
            raise
        except Exception as err:  # a bug of ours in the tool: infrastructure, not the agent
            raise InfraError(f"tool `{call.name}` raised {type(err).__name__}: {err}") from err
        if spec.final:
            self.done = True
        if result is None:
            result = "submitted" if spec.submits is not None else ""
        return str(result), None

    # ---- gymnasium API ---------------------------------------------------------------------------

    def initial_observation(self) -> str:
        """Instruction followed by the tool list and how to call a tool."""
        assert self.task is not None
        lines = [self.task.instruction, "", 'Tools (call one as <tool_call>{"name": ..., "arguments": {...}}</tool_call>):']
        for spec in self._listed_tools():
            lines.append(f"- {spec.signature()}: {spec.description}")
        return "\n".join(lines)

    def _pick_task(self, options: dict[str, Any] | None) -> Task:
        choice = (options or {}).get("task")
        if choice is None:
            return self.tasks[int(self.np_random.integers(len(self.tasks)))]
        if isinstance(choice, Task):
            return choice
        if isinstance(choice, int):
            return self.tasks[choice % len(self.tasks)]
        for task in self.tasks:
            if task.id == choice:
                return task
        raise ValueError(f"options['task'] = {choice!r}: no such task id in this environment's tasks")

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """Start an episode on `options["task"]` (a Task, id or index) or a task drawn with `seed`."""
        super().reset(seed=seed)
        self.task = self._pick_task(options)
        self.turn = 0
        self.done = False
        self.submitted = None
        self.error_counts = Counter()
        self.tool_call_count = 0
        self.load_task(self.task)
        self._tool_order = self.episode_tool_order(self.task, seed)
        obs = self.initial_observation()
        self.transcript = [("observation", obs)]
        info = {
            "task_id": self.task.id,
            "instruction": self.task.instruction,
            "tools": self.tool_schemas(),
            "family": self.task.family,
            "difficulty": self.task.difficulty,
            **self.episode_info(),
        }
        return obs, info

    def step(self, action: Any) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Run the tool calls in `action` (raw text or parsed calls); see the module docstring."""
        if self.task is None:
            raise gym.error.ResetNeeded("call reset() before step()")
        if self.done:
            raise gym.error.ResetNeeded("the episode has ended; call reset()")
        self.turn += 1
        self.transcript.append(("action", action if isinstance(action, str) else json.dumps(action, default=str)))
        parsed = coerce_action(action)
        results: list[dict[str, Any]] = []
        errors: list[CallError] = list(parsed.errors)
        if not parsed.calls and not parsed.errors:
            errors.append(
                CallError("no_tool_call", 'no tool call found; call a tool as <tool_call>{"name": ..., "arguments": {...}}</tool_call>')
            )
        for call in parsed.calls:
            if self.done:  # calls after a final tool in the same turn are ignored, and said so
                results.append({"name": call.name, "content": "ignored: the episode already ended", "error": True})
                continue
            self.tool_call_count += 1
            text, err = self.call_tool(call)
            if err is not None:
                errors.append(err)
                results.append({"name": call.name, "content": f"Error: {err.message}", "error": True})
            else:
                results.append({"name": call.name, "content": self._cap(text), "error": False})
        for err in errors:
            self.error_counts[err.kind] += 1
        for err in parsed.errors + [e for e in errors if e.kind == "no_tool_call"]:
            results.append({"name": None, "content": f"Error: {err.message}", "error": True})
        obs = "\n".join(r["content"] for r in results)
        terminated = self.done
        truncated = not terminated and self.turn >= self.max_turns
        reward = self.verdict().reward if terminated and self.grade_on_submit else 0.0
        self.transcript.append(("observation", obs))
        info = {
            "turn": self.turn,
            "task_id": self.task.id,
            "tool_results": results,
            "turn_errors": [{"kind": e.kind, "message": e.message} for e in errors],
            "errors": {k: self.error_counts.get(k, 0) for k in ERROR_CLASSES},
            "tool_calls": self.tool_call_count,
            **self.episode_info(),
        }
        if terminated or truncated:
            self.done = True
            info["submitted"] = self.submitted
        if self.render_mode == "human":
            print(self.render())
        return obs, reward, terminated, truncated, info

    def _cap(self, text: str) -> str:
        limit = self.max_observation_chars
        if len(text) <= limit:
            return text
        return text[:limit] + f"\n[... {len(text) - limit} more characters cut]"

    def render(self) -> str | None:
        """The transcript so far as text (`ansi`/`human` modes)."""
        if self.render_mode is None:
            return None
        return "\n\n".join(f"[{kind}]\n{text}" for kind, text in self.transcript)
