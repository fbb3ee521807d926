"""Train toolgym environments with TRL: an `environment_factory` for `GRPOTrainer` (TRL 1.16).

    from toolgym.integrations.trl_adapter import environment_factory, prepare_tokenizer
    from toolgym.integrations.datasets import suite_to_dataset

    factory = environment_factory("records-v0")
    trainer = GRPOTrainer(model, args=GRPOConfig(...), train_dataset=suite_to_dataset(suite, "train"),
                          processing_class=prepare_tokenizer(tokenizer), environment_factory=factory)

What the adapter takes care of (the known traps of TRL's experimental environment API):
- TRL turns every public method of the environment object into a tool. The adapter class has
  exactly one public method per toolgym tool, with the signature, type hints and Google-style
  docstring TRL turns into the same JSON schema toolgym renders; `reset` and `get_reward` are
  the only other public names (TRL treats them specially).
- `reset(**kwargs)` receives every column of the dataset row; it reads `task_id` and plays that
  task (a group's G rollouts share the row, so they share the task).
- The reward is the environment's one grading path (`env.verdict()`: its `grade()`, or hidden tests, state checker, answer or a
  registered scorer) on the episode's final state, less the `SafetyPolicy` penalties for the
  episode's side effects (the ledger's and the verifier's). The final answer is submitted through
  the env's own final tool, so `get_reward` sees it.
- Our failures are never the model's: an infrastructure error (a sandbox that died) or a
  verifier error makes `get_reward` return None, which TRL leaves out of the reward (not 0).
- Tool arguments are validated by toolgym (TRL does not check them); a call after the episode
  ended gets an error observation instead of raising.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable
from typing import Any, ClassVar

import toolgym
from toolgym.envs import InfraError, ToolEnv
from toolgym.envs.tools import ToolSpec
from toolgym.sandbox import SafetyPolicy, SideEffect
from toolgym.tasks import Task, ToolCall, builtin_suite
from toolgym.verifiers import Outcome, Verdict

_JSON_TYPES: dict[str, type] = {"string": str, "integer": int, "number": float, "boolean": bool, "array": list, "object": dict}
_RESERVED = {"reset", "get_reward"}


class TRLEnvironment:
    """Base class of the adapters `environment_factory` builds (one subclass per env id)."""

    env_id: ClassVar[str] = ""
    make_kwargs: ClassVar[dict[str, Any]] = {}
    tasks_by_id: ClassVar[dict[str, Task]] = {}

    def __init__(self) -> None:
        self._env: ToolEnv = toolgym.make(self.env_id, **self.make_kwargs).unwrapped
        self._env.grade_on_submit = False  # graded once, in get_reward
        self._side_effects: list[dict[str, Any]] = []
        self._infra_error: str | None = None
        #: The last episode's verdict and outcome (for inspection and tests).
        self.last_verdict: Verdict | None = None
        self.last_outcome: Outcome | None = None

    def reset(self, **kwargs: Any) -> str | None:
        """Start the episode of the row's `task_id` (TRL passes every dataset column here)."""
        task_id = kwargs.get("task_id")
        if task_id is None:
            raise ValueError(
                "the dataset row has no `task_id` column: build the dataset with toolgym.integrations.datasets.suite_to_dataset"
            )
        task = self.tasks_by_id.get(str(task_id))
        if task is None:
            raise ValueError(f"task {task_id!r} is not in the suite of {self.env_id}")
        self._side_effects, self._infra_error = [], None
        self.last_verdict, self.last_outcome = None, None
        try:
            self._env.reset(options={"task": task})
        except InfraError as err:
            self._infra_error = str(err)
        return None  # the row's prompt already holds the instruction

    def _call(self, name: str, arguments: dict[str, Any]) -> str:
        """One tool call through the env's `step` (validation, side effects, safety policy)."""
        if self._infra_error is not None:
            return "Error: the environment is unavailable; this episode will not be graded"
        if self._env.task is None:
            raise RuntimeError("call reset() before a tool")
        if self._env.done:
            return "Error: the episode has ended; no more tool calls are accepted"
        try:
            obs, _, _, _, info = self._env.step([ToolCall(name=name, arguments=arguments)])
        except InfraError as err:
            self._infra_error = str(err)
            return "Error: the environment is unavailable; this episode will not be graded"
        self._side_effects.extend(info.get("side_effects", []))
        return obs

    def get_reward(self) -> float | None:
        """The verifier's reward less safety penalties; None for our own (infra/verifier) failures."""
        task = self._env.task
        if task is None:
            return None
        if self._infra_error is not None:
            self.last_outcome = Outcome.INFRA_ERROR
            return None
        try:
            verdict = self._env.verdict()
        except InfraError:
            self.last_outcome = Outcome.INFRA_ERROR
            return None
        except Exception:  # the verifier's failure, never the model's
            self.last_outcome = Outcome.VERIFIER_ERROR
            return None
        self.last_verdict, self.last_outcome = verdict, verdict.outcome
        if not verdict.outcome.is_agent_attempt:
            return None
        config = getattr(self._env, "sandbox_config", None)
        policy = config.policy if config is not None else SafetyPolicy()
        events = [SideEffect.model_validate(e) for e in self._side_effects + verdict.details.get("side_effects", [])]
        return float(policy.penalize(verdict.reward, events))

    def __del__(self) -> None:  # environments hold sandboxes: close them with the adapter
        env = getattr(self, "_env", None)
        if env is not None:
            try:
                env.close()
            except Exception:
                pass


def _tool_method(spec: ToolSpec) -> Callable[..., str]:
    """A method with `spec`'s signature, type hints and Google-style docstring (what TRL reads)."""
    props: dict[str, Any] = spec.parameters.get("properties", {})
    required = set(spec.parameters.get("required", []))

    def method(self: TRLEnvironment, **arguments: Any) -> str:
        return self._call(spec.name, arguments)  # toolgym validates the arguments

    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    annotations: dict[str, Any] = {}
    arg_docs = []
    for arg, prop in props.items():
        kind = _JSON_TYPES.get(prop.get("type", "string"), str)
        default = inspect.Parameter.empty if arg in required else prop.get("default")
        params.append(inspect.Parameter(arg, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=kind))
        annotations[arg] = kind
        doc = prop.get("description") or arg
        if default is not inspect.Parameter.empty:  # transformers' schema drops defaults: say it in words
            doc += f" (default {json.dumps(default)})"
        arg_docs.append(f"    {arg}: {doc}")
    # No return annotation or "Returns:" section: the schema TRL renders then has exactly the
    # content of the one toolgym renders (name, description, parameters).
    method.__name__ = method.__qualname__ = spec.name
    method.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    method.__annotations__ = annotations
    method.__doc__ = (spec.description or spec.name) + ("\n\nArgs:\n" + "\n".join(arg_docs) if arg_docs else "")
    return method


def environment_factory(env_id: str, suite: str | None = None, tasks: list[Task] | None = None, **make_kwargs: Any) -> type[TRLEnvironment]:
    """A zero-argument callable (a class) for `GRPOTrainer(environment_factory=...)`.

    `tasks` (default: every task of `suite`, or of the env's default suite) are the tasks the
    dataset's `task_id` may name; `make_kwargs` go to `toolgym.make` (e.g. `sandbox={...}`).
    """
    probe = toolgym.make(env_id, **make_kwargs).unwrapped
    try:
        if tasks is None:
            name = suite or getattr(probe, "default_suite", None)
            if name is None:
                raise ValueError(f"{env_id} has no default suite: pass suite= or tasks=")
            tasks = builtin_suite(name).tasks
        specs = list(probe.tools.values())
    finally:
        probe.close()
    clash = sorted({s.name for s in specs} & (_RESERVED | set(vars(TRLEnvironment))))
    if clash or any(s.name.startswith("_") for s in specs):
        raise ValueError(f"{env_id}: tool names {clash} collide with TRL's reserved environment methods")
    methods: dict[str, Any] = {s.name: _tool_method(s) for s in specs}
    name = "TRL_" + "".join(ch if ch.isalnum() else "_" for ch in env_id.split("/")[-1])
    return type(
        name,
        (TRLEnvironment,),
        {
            **methods,
            "__module__": __name__,
            "env_id": env_id,
            "make_kwargs": dict(make_kwargs),
            "tasks_by_id": {t.id: t for t in tasks},
            "__doc__": f"toolgym `{env_id}` for TRL's environment_factory (tools: {', '.join(methods)}).",
        },
    )


def prepare_tokenizer(tokenizer: Any) -> Any:
    """Give a Qwen-style (Hermes `<tool_call>`) tokenizer the response template TRL parses tool calls
    with, when it has none: TRL only recognises the exact chat templates it ships."""
    if getattr(tokenizer, "response_template", None) is None and getattr(tokenizer, "response_schema", None) is None:
        from trl.chat_template_utils import qwen3_template

        tokenizer.response_template = qwen3_template
    if tokenizer.padding_side != "left":
        tokenizer.padding_side = "left"  # TRL generates with left padding
    return tokenizer


__all__ = ["TRLEnvironment", "environment_factory", "prepare_tokenizer"]
