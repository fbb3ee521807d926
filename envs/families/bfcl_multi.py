"""`bfcl-multi`: BFCL's multi-turn categories (`multi_turn_base`, `multi_turn_miss_func`,
`multi_turn_miss_param`; 600 entries), graded by BFCL's multi-turn checker.

An episode is BFCL's conversation: the entry's API classes (`GorillaFileSystem`, `TwitterAPI`,
`TradingBot`, ...), set up from its `initial_config`, are the episode's state, and their public
methods, as BFCL documents them, are the tools. A tool call runs the method with the call's
arguments (no text of the model is evaluated); results come back as BFCL formats them. When the
model answers without a call, the user's next request arrives (as a user message); after the last
one the episode ends. Missing functions follow BFCL's rule: at their turn they are added, and the
user message lists their documents (BFCL's prompting-mode wording: a chat template's tool list
cannot change mid-conversation without re-rendering history). At most BFCL's 20 model steps per
user turn. The verdict replays what the model called, turn by turn, against the ground truth in
BFCL's own `multi_turn_checker` (`verifiers/bfcl.py`).
"""

from __future__ import annotations

import ast
import copy
import importlib
import inspect
import json
from functools import lru_cache
from typing import Any

from toolgym.envs.core import ToolEnv
from toolgym.envs.families.bfcl import data_dir, split_of, tool_schema
from toolgym.envs.parsing import ERROR_CLASSES, coerce_action
from toolgym.envs.registry import register_env
from toolgym.tasks import TRAIN, HiddenSpec, SuiteSpec, Task, TaskLoadError, TaskSuite, ToolCall, register_suite

SUITE = "bfcl-multi"
VERSION = "4"
CATEGORIES = ("multi_turn_base", "multi_turn_miss_func", "multi_turn_miss_param")
#: BFCL's limit of model steps within one user turn (`MAXIMUM_STEP_LIMIT`).
STEP_LIMIT = 20
SKIPPED: dict[str, int] = {}


def _entries(category: str) -> list[dict[str, Any]]:
    """BFCL's entries of `category` with their function documents (BFCL's own preparation)."""
    from bfcl_eval.utils import populate_test_cases_with_predefined_functions

    from toolgym.verifiers.bfcl import checkers

    checkers()  # bfcl_eval importable without its SDKs
    rows = [json.loads(x) for x in (data_dir() / f"BFCL_v4_{category}.json").read_text().splitlines() if x.strip()]
    return populate_test_cases_with_predefined_functions(rows)


def instances(entry: dict[str, Any]) -> dict[str, Any]:
    """Fresh instances of the entry's API classes, loaded from its initial configuration."""
    from bfcl_eval.constants.executable_backend_config import CLASS_FILE_PATH_MAPPING, STATELESS_CLASSES

    out = {}
    for name in entry["involved_classes"]:
        instance = getattr(importlib.import_module(CLASS_FILE_PATH_MAPPING[name]), name)()
        if name not in STATELESS_CLASSES:
            instance._load_scenario(copy.deepcopy(entry.get("initial_config", {}).get(name, {})), long_context=False)
        out[name] = instance
    return out


def methods(objects: dict[str, Any]) -> dict[str, Any]:
    """Public method name -> bound method, over the instances (BFCL's own mapping rule)."""
    out = {}
    for instance in objects.values():
        for name, method in inspect.getmembers(instance, predicate=inspect.ismethod):
            if not name.startswith("_"):
                out[name] = method
    return out


def parse_ground_truth(call: str, table: dict[str, Any]) -> ToolCall:
    """One of BFCL's ground-truth call strings as a ToolCall (literal arguments only; positional
    ones bound to their parameter names by the method's signature)."""
    node = ast.parse(call, mode="eval").body
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        raise ValueError(f"not a plain call: {call!r}")
    name = node.func.id
    args = {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords}
    if node.args:
        bound = inspect.signature(table[name]).bind_partial(*[ast.literal_eval(a) for a in node.args])
        args = {**bound.arguments, **args}
    return ToolCall(name=name, arguments=args)


def result_text(value: Any) -> str:
    """A method's result as BFCL's executor writes it (dicts as JSON, the rest as `str`)."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        try:
            return json.dumps(value)
        except (TypeError, ValueError):
            return str(value)
    return str(value)


def _oracle_texts(truth: list[list[str]], calls: list[list[ToolCall]]) -> list[str]:
    """The ground truth as the agent's turns: each user turn's calls in one step, then a plain
    answer that hands the turn back (a turn without calls: just the answer)."""
    texts = []
    for turn in calls:
        if turn:
            texts.append("\n".join(c.to_text() for c in turn))
        texts.append("Done.")
    return texts


def category_tasks(category: str) -> list[Task]:
    """Every entry of a multi-turn category as a Task."""
    from toolgym.verifiers.bfcl import multi_turn_verdict

    root = data_dir()
    truths = {json.loads(x)["id"]: json.loads(x)["ground_truth"]
              for x in (root / "possible_answer" / f"BFCL_v4_{category}.json").read_text().splitlines() if x.strip()}
    tasks, skipped = [], 0
    for entry in _entries(category):
        truth = truths[entry["id"]]
        table = methods(instances(entry))
        try:
            calls = [[parse_ground_truth(c, table) for c in turn] for turn in truth]
        except (ValueError, KeyError, TypeError, SyntaxError):
            skipped += 1
            continue
        missed = {turn: [doc["name"] for doc in docs] for turn, docs in entry.get("missed_function", {}).items()}
        spec = {"id": entry["id"], "involved_classes": entry["involved_classes"],
                "initial_config": entry.get("initial_config", {}), "question": entry["question"],
                "function": entry["function"], "missed_function": entry.get("missed_function", {})}
        decoded = [[[_call(c) for c in turn]] if turn else [] for turn in calls]
        if not multi_turn_verdict(spec, truth, decoded)["valid"]:  # BFCL rejects its own ground truth
            skipped += 1
            continue
        first = entry["question"][0]
        tasks.append(Task(
            env_id="toolgym/bfcl-multi-v0", instruction="\n\n".join(str(m.get("content", "")) for m in first),
            family=category, split=split_of(entry["id"]), difficulty=len(truth),
            hidden=HiddenSpec(kind="score", scorer="bfcl-multi-turn",
                              scorer_args={"category": category, "entry": spec, "ground_truth": truth}),
            oracle=tuple(c for turn in calls for c in turn),
            metadata={"bfcl_id": entry["id"], "oracle_texts": _oracle_texts(truth, calls), "missed": missed}))
    SKIPPED[category] = skipped
    return tasks


def _call(call: ToolCall) -> str:
    from toolgym.verifiers.bfcl import call_string

    return call_string(call.name, dict(call.arguments))


@lru_cache(maxsize=1)
def load_bfcl_multi() -> TaskSuite:
    """The three multi-turn categories, train and held-out."""
    return TaskSuite(SUITE, [t for category in CATEGORIES for t in category_tasks(category)], VERSION)


def _not_generated(seed: int, index: int, split: str = TRAIN):
    raise TaskLoadError(f"{SUITE} is loaded from bfcl-eval's data, not generated: use builtin_suite({SUITE!r})")


register_suite(SuiteSpec(name=SUITE, generator=_not_generated, train_size=0, heldout_size=0, version=VERSION,
                         loader=load_bfcl_multi, description="BFCL multi-turn (base, miss_func, miss_param) on "
                         "BFCL's stateful API classes, graded by BFCL's multi-turn checker"))


@register_env("bfcl-multi-v0", suite=SUITE)
class BFCLMultiTurnEnv(ToolEnv):
    """A BFCL multi-turn conversation over stateful APIs; graded by BFCL's multi-turn checker."""

    default_suite = SUITE
    max_turns = 80

    def load_task(self, task: Task) -> None:
        """Fresh API instances from the entry's initial configuration; the tools it offers now."""
        entry = task.hidden.scorer_args["entry"]
        self.entry = entry
        self.objects = instances(entry)
        self.table = methods(self.objects)
        self.offered = [doc for doc in entry["function"]]
        self.user_turn = 0
        self.steps_this_turn = 0
        self.decoded: list[list[list[str]]] = [[]]

    def tool_schemas(self) -> list[dict[str, Any]]:
        """The functions offered at the start (BFCL's documents as tool schemas)."""
        return [tool_schema(doc) for doc in self.entry["function"]] if hasattr(self, "entry") else []

    def state_hash(self) -> str:
        """A hash of the API instances' public state and the conversation's position."""
        import hashlib

        state = {name: {k: v for k, v in vars(obj).items() if not k.startswith("_")} for name, obj in self.objects.items()}
        blob = json.dumps([state, self.user_turn, self.decoded], default=repr)  # keys mix ints and strings: no sorting
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def _run(self, call: ToolCall) -> tuple[str, bool]:
        """Run one call on the instances: (result text, is an error)."""
        if call.name not in self.table:  # BFCL runs any public method of the instances, offered or not
            return f"Error during execution: name {call.name!r} is not defined", True
        try:
            return result_text(self.table[call.name](**dict(call.arguments))), False
        except Exception as err:  # the API's own errors, as BFCL reports them
            return f"Error during execution: {err}", True

    def _next_user_turn(self) -> list[dict[str, Any]] | None:
        """Advance to the user's next request: its messages, or None after the last one."""
        self.user_turn += 1
        self.steps_this_turn = 0
        questions = self.entry["question"]
        if self.user_turn >= len(questions):
            return None
        self.decoded.append([])
        added = self.entry.get("missed_function", {}).get(str(self.user_turn))
        if added:  # BFCL's held-out functions arrive with this turn
            from bfcl_eval.constants.default_prompts import DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_PROMPTING

            self.offered = self.offered + list(added)
            return [{"role": "user", "content": DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_PROMPTING.format(
                functions=json.dumps([tool_schema(d)["function"] for d in added]))}]
        return [{"role": m.get("role", "user"), "content": str(m.get("content", ""))} for m in questions[self.user_turn]]

    def step(self, action: Any) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """One model step: run its calls (their results are the observation), or, without calls,
        hand the turn back and receive the user's next request (the episode ends after the last)."""
        if self.task is None:
            raise RuntimeError("call reset() before step()")
        self.turn += 1
        self.steps_this_turn += 1
        self.transcript.append(("action", action if isinstance(action, str) else json.dumps(action, default=str)))
        parsed = coerce_action(action)
        for err in parsed.errors:
            self.error_counts[err.kind] += 1
        results: list[dict[str, Any]] = []
        info: dict[str, Any] = {}
        terminated = truncated = False
        if parsed.calls:
            self.decoded[-1].append([self._decoded(c) for c in parsed.calls])
            for call in parsed.calls:
                self.tool_call_count += 1
                text, error = self._run(call)
                results.append({"name": call.name, "content": self._cap(text), "error": error})
            if self.steps_this_turn >= STEP_LIMIT:  # BFCL forces the model to quit: the entry fails
                truncated = True
        else:
            messages = self._next_user_turn()
            if messages is None:
                terminated = True
            else:
                info["observation_messages"] = messages
        if not terminated and self.turn >= self.max_turns:
            truncated = True
        self.done = terminated or truncated
        # an episode cut before the user's last request is BFCL's "force-terminated" failure
        self.submitted = json.dumps(self.decoded if terminated else {"unfinished": True})
        reward = self.grade() if terminated else 0.0
        obs = "\n".join(r["content"] for r in results) or "\n".join(m["content"] for m in info.get("observation_messages", []))
        info.update({"turn": self.turn, "task_id": self.task.id, "tool_results": results,
                     "turn_errors": [{"kind": e.kind, "message": e.message} for e in parsed.errors],
                     "errors": {k: self.error_counts.get(k, 0) for k in ERROR_CLASSES},
                     "tool_calls": self.tool_call_count})
        self.transcript.append(("observation", obs))
        return obs, reward, terminated, truncated, info

    @staticmethod
    def _decoded(call: ToolCall) -> str:
        """The call as BFCL's checker replays it (an unreadable one becomes a call that fails)."""
        try:
            return _call(call)
        except ValueError:
            return "invalid_call()"

    def grade(self) -> float:
        """BFCL's multi-turn verdict on the episode so far (1.0 only when it accepts every turn)."""
        from toolgym.verifiers import FinalState, verifier_for

        assert self.task is not None
        return verifier_for(self.task).verify(self.task, FinalState(answer=self.submitted)).reward

    def final_state(self) -> dict[str, Any]:
        """Per user turn, per model step, the step's calls as BFCL's checker reads them."""
        return {"answer": self.submitted if self.submitted is not None else "[]"}
