"""`bfcl`: the Berkeley Function Calling Leaderboard's single-turn categories, graded by BFCL.

Data and checkers come from the `bfcl-eval` package (install it with `--no-deps`). Each entry of
`simple_python`, `multiple`, `parallel`, `parallel_multiple` and `irrelevance` (1,240 in all) is a
task: its functions are the tools offered (BFCL's schema converted to JSON schema type by type,
names with dots kept), the episode is one model turn, and the verdict is BFCL's own AST checker
on the calls parsed from that turn (`verifiers/bfcl.py`); for `irrelevance`, making no call passes.
The calls are data: nothing the model wrote is executed.

Train and held-out: a deterministic split of ids within each category (a quarter held out, by a
hash of the id), recorded on every task. The oracle is BFCL's ground truth (the first acceptable
value of every parameter), checked against BFCL's checker when the suite loads: an entry whose
ground truth the checker itself rejects is left out and counted (`bfcl.SKIPPED`).
"""

from __future__ import annotations

import hashlib
import json
from functools import lru_cache
from pathlib import Path
from typing import Any

from toolgym.envs.core import ToolEnv
from toolgym.envs.parsing import ERROR_CLASSES, coerce_action
from toolgym.envs.registry import register_env
from toolgym.tasks import HELDOUT, TRAIN, HiddenSpec, SuiteSpec, Task, TaskLoadError, TaskSuite, ToolCall, register_suite

SUITE = "bfcl"
VERSION = "4"
CATEGORIES = ("simple_python", "multiple", "parallel", "parallel_multiple", "irrelevance")
#: One id in this many is held out (by a hash of the id, per category).
HELDOUT_EVERY = 4
#: Entries left out at load because BFCL's checker rejects their own ground truth, by category.
SKIPPED: dict[str, int] = {}
_UNSET = object()


def data_dir() -> Path:
    """`bfcl_eval/data` of the installed `bfcl-eval` (a `TaskLoadError` saying how to install it)."""
    try:
        import bfcl_eval
    except ImportError:
        raise TaskLoadError("the bfcl suite needs the bfcl-eval package: pip install --no-deps bfcl-eval") from None
    return Path(bfcl_eval.__file__).parent / "data"


def _read(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


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
    return {"type": "function", "function": {"name": function["name"], "description": function.get("description", ""),
                                             "parameters": params}}


def _concrete(value: Any) -> Any:
    """A value built from BFCL possible answers: in a dict, each key's list of options gives its
    first acceptable one (keys whose options start with "" are optional and left out)."""
    if isinstance(value, dict):
        out = {}
        for key, options in value.items():
            choice = _first(options)
            if choice is not _UNSET:
                out[key] = choice
        return out
    if isinstance(value, list):
        return [_concrete(v) for v in value]
    return value


def _first(options: Any) -> Any:
    """The first acceptable value of a parameter's options ("" means optional: may be left out)."""
    if not isinstance(options, list):
        return _concrete(options)
    for option in options:
        if option != "":
            return _concrete(option)
    return _UNSET


def oracle_calls(ground_truth: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """BFCL's ground truth as one concrete call per entry: [{name: {argument: value}}]."""
    return [{name: _concrete(args)} for entry in ground_truth for name, args in entry.items()]


def split_of(bfcl_id: str) -> str:
    """Held-out for one id in HELDOUT_EVERY, by a hash of the id (the same on every machine)."""
    digest = int.from_bytes(hashlib.sha256(bfcl_id.encode()).digest()[:8], "little")
    return HELDOUT if digest % HELDOUT_EVERY == 0 else TRAIN


def _instruction(question: list[list[dict[str, Any]]]) -> str:
    """The single turn's messages as the task's instruction (a system message first, if any)."""
    return "\n\n".join(str(m.get("content", "")) for m in question[0])


def category_tasks(category: str) -> list[Task]:
    """Every entry of one BFCL category as a Task (entries whose ground truth BFCL rejects left out)."""
    from toolgym.verifiers.bfcl import bfcl_verdict

    root = data_dir()
    entries = _read(root / f"BFCL_v4_{category}.json")
    answers = {} if category == "irrelevance" else {
        a["id"]: a["ground_truth"] for a in _read(root / "possible_answer" / f"BFCL_v4_{category}.json")}
    tasks, skipped = [], 0
    for entry in entries:
        truth = answers.get(entry["id"], [])
        calls = oracle_calls(truth)
        if category != "irrelevance" and not bfcl_verdict(category, entry["function"], truth, calls)["valid"]:
            skipped += 1
            continue
        oracle = tuple(ToolCall(name=name, arguments=args) for call in calls for name, args in call.items())
        tasks.append(Task(
            env_id="toolgym/bfcl-v0", instruction=_instruction(entry["question"]), family=category,
            split=split_of(entry["id"]),
            hidden=HiddenSpec(kind="score", scorer="bfcl-ast", scorer_args={
                "category": category, "functions": entry["function"], "ground_truth": truth, "bfcl_id": entry["id"]}),
            oracle=oracle, metadata={"bfcl_id": entry["id"], "oracle_turns": "one"}))
    SKIPPED[category] = skipped
    return tasks


@lru_cache(maxsize=1)
def load_bfcl() -> TaskSuite:
    """The five single-turn categories, train and held-out."""
    return TaskSuite(SUITE, [t for category in CATEGORIES for t in category_tasks(category)], VERSION)


def _not_generated(seed: int, index: int, split: str = TRAIN):
    raise TaskLoadError(f"{SUITE} is loaded from bfcl-eval's data, not generated: use builtin_suite({SUITE!r})")


register_suite(SuiteSpec(name=SUITE, generator=_not_generated, train_size=0, heldout_size=0, version=VERSION,
                         loader=load_bfcl, description="BFCL single-turn function calling (simple, multiple, "
                         "parallel, parallel_multiple, irrelevance), graded by BFCL's own AST checker"))


@register_env("bfcl-v0", suite=SUITE)
class BFCLEnv(ToolEnv):
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
        """The question, then each function's name and description."""
        assert self.task is not None
        lines = [self.task.instruction, "", "Functions (call them as <tool_call>{\"name\": ..., \"arguments\": "
                 "{...}}</tool_call>, several in one turn if needed; call none if none fits):"]
        lines += [f"- {f['name']}: {f.get('description', '')}" for f in self.functions]
        return "\n".join(lines)

    def nothing_solves(self, task: Task) -> bool:
        """Irrelevance entries: making no call is the right answer."""
        return task.family == "irrelevance"

    def grade(self) -> float:
        """BFCL's verdict on the submitted calls."""
        from toolgym.verifiers import FinalState, verifier_for

        assert self.task is not None
        return verifier_for(self.task).verify(self.task, FinalState(answer=self.submitted)).reward

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
        info = {"turn": self.turn, "task_id": self.task.id, "tool_results": results,
                "turn_errors": [{"kind": e.kind, "message": e.message} for e in parsed.errors],
                "errors": {k: self.error_counts.get(k, 0) for k in ERROR_CLASSES}, "tool_calls": self.tool_call_count, "submitted": self.submitted}
        self.transcript.append(("action", action if isinstance(action, str) else json.dumps(action, default=str)))
        return "", reward, True, False, info

    def final_state(self) -> dict[str, Any]:
        """The submitted calls (JSON), which BFCL's checker grades."""
        return {"answer": self.submitted if self.submitted is not None else "[]"}
