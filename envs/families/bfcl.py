"""`bfcl`: the Berkeley Function Calling Leaderboard's single-turn categories as an environment.

Each entry of `simple_python`, `multiple`, `parallel`, `parallel_multiple` and `irrelevance` (the
tasks: `toolgym.tasks.bfcl`) is an episode: its functions are the tools offered (BFCL's schema
converted to JSON schema by BFCL's own type table, names with dots kept), the episode is one model
turn, and the verdict is BFCL's own AST checker on the calls parsed from that turn
(`verifiers/bfcl.py`); for `irrelevance`, making no call passes. The calls are data: nothing the
model wrote is executed.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from toolgym.envs.core import ToolEnv
from toolgym.envs.parsing import ERROR_CLASSES, coerce_action
from toolgym.envs.registry import register_env
from toolgym.tasks import TRAIN, SuiteSpec, Task, TaskLoadError, register_suite
from toolgym.tasks.bfcl import LIVE_SUITE, LIVE_VERSION, SUITE, VERSION, is_irrelevance, load_bfcl, load_bfcl_live

#: What the user message asks besides the question (BFCL's own prompt says the same in its words).
CALL_RULE = "Answer with the function calls that do this, several at once if needed; call none if none fits."


def openapi_schema(bfcl_type: dict[str, Any]) -> dict[str, Any]:
    """One BFCL parameter schema as JSON schema: BFCL's type names (`dict`, `float`, `tuple`,
    `any`, ...) mapped by BFCL's own table, nested `properties` and `items` converted too."""
    from bfcl_eval.constants.type_mappings import GORILLA_TO_OPENAPI

    out = dict(bfcl_type)
    if "type" in out:
        out["type"] = GORILLA_TO_OPENAPI.get(out["type"], out["type"])
    if isinstance(out.get("properties"), dict):
        out["properties"] = {k: openapi_schema(v) for k, v in out["properties"].items()}
    if isinstance(out.get("items"), dict):
        out["items"] = openapi_schema(out["items"])
    return out


def tool_schema(function: dict[str, Any]) -> dict[str, Any]:
    """A BFCL function document as an OpenAI/Hermes tool schema (its name as BFCL spells it)."""
    params = openapi_schema(function.get("parameters") or {"type": "dict", "properties": {}})
    return {
        "type": "function",
        "function": {"name": function["name"], "description": function.get("description", ""), "parameters": params},
    }


def register_loaded_suite(name: str, version: str, loader: Callable[[], Any], description: str) -> None:
    """Register a suite loaded from BFCL's data (it has no generator: asking for one says so)."""

    def not_generated(seed: int, index: int, split: str = TRAIN):
        raise TaskLoadError(f"{name} is loaded from bfcl-eval's data, not generated: use builtin_suite({name!r})")

    register_suite(
        SuiteSpec(name=name, generator=not_generated, train_size=0, heldout_size=0, version=version, loader=loader, description=description)
    )


register_loaded_suite(
    SUITE,
    VERSION,
    load_bfcl,
    "BFCL single-turn function calling (simple, multiple, parallel, parallel_multiple, irrelevance), graded by BFCL's own AST checker",
)
register_loaded_suite(
    LIVE_SUITE,
    LIVE_VERSION,
    load_bfcl_live,
    "BFCL's live single-turn categories (user-contributed; all held out, never trained on), graded by BFCL's own AST checker",
)


class BFCLGraded(ToolEnv):
    """What BFCL's environments share: the submitted calls are the final state, which BFCL's own
    checkers grade (the tasks' hidden spec names the `bfcl-ast` / `bfcl-multi-turn` scorer)."""

    def final_state(self) -> dict[str, Any]:
        """The submitted calls (JSON), which BFCL's checker grades."""
        return {"answer": self.submitted if self.submitted is not None else "[]"}


@register_env("bfcl-v0", suite=SUITE)
class BFCLEnv(BFCLGraded):
    """One BFCL entry: the task's functions are the tools; one turn of calls, graded by BFCL."""

    default_suite = SUITE
    max_turns = 1

    def load_task(self, task: Task) -> None:
        """The entry's function documents become this episode's tools."""
        self.functions: list[dict[str, Any]] = list(task.hidden.scorer_args["functions"])
        self.calls: list[dict[str, Any]] | None = None

    def tool_schemas(self) -> list[dict[str, Any]]:
        """The entry's functions as tool schemas (names with dots as BFCL spells them)."""
        return [tool_schema(f) for f in getattr(self, "functions", [])]

    def initial_observation(self) -> str:
        """The question and what is asked (the functions themselves are the episode's tools, which
        the chat template shows once; listing them here again would double the prompt)."""
        assert self.task is not None
        return f"{self.task.instruction}\n\n{CALL_RULE}"

    def nothing_solves(self, task: Task) -> bool:
        """Irrelevance entries: making no call is the right answer."""
        return is_irrelevance(task.family)

    def step(self, action: Any) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Record the turn's calls (nothing runs: calls are data), end the episode, grade it."""
        if self.task is None:
            raise RuntimeError("call reset() before step()")
        self.turn += 1
        parsed = coerce_action(action)
        self.calls = [{c.name: dict(c.arguments)} for c in parsed.calls]
        # a malformed call is undecodable output for BFCL (a failure, except for irrelevance)
        self.submitted = json.dumps({"undecodable": True} if parsed.errors else self.calls)
        self.tool_call_count += len(parsed.calls)
        for err in parsed.errors:
            self.error_counts[err.kind] += 1
        self.done = True
        reward = self.grade()
        results = [{"name": name, "content": "recorded", "error": False} for call in self.calls for name in call]
        info = {
            "turn": self.turn,
            "task_id": self.task.id,
            "tool_results": results,
            "turn_errors": [{"kind": e.kind, "message": e.message} for e in parsed.errors],
            "errors": {k: self.error_counts.get(k, 0) for k in ERROR_CLASSES},
            "tool_calls": self.tool_call_count,
            "submitted": self.submitted,
        }
        self.transcript.append(("action", action if isinstance(action, str) else json.dumps(action, default=str)))
        return "", reward, True, False, info
