"""BFCL's multi-turn categories as toolgym tasks (`multi_turn_base`, `multi_turn_miss_func`,
`multi_turn_miss_param`; 600 entries), and the API classes their episodes run on.

An entry's state is BFCL's API classes (`GorillaFileSystem`, `TwitterAPI`, `TradingBot`, ...)
loaded from its `initial_config`; their public methods are the tools. The oracle is BFCL's ground
truth (call strings parsed as literals, positional arguments bound by the method's signature),
checked against BFCL's multi-turn checker at load. See `bfcl.py` for the data and the checkers.
"""

from __future__ import annotations

import ast
import copy
import importlib
import inspect
import json
from functools import lru_cache
from typing import Any

import numpy as np

from toolgym.tasks.bfcl import call_string, checkers, data_dir, mixed_order, multi_turn_verdict, split_of
from toolgym.tasks.suite import TaskSuite
from toolgym.tasks.task import HiddenSpec, Task, ToolCall

SUITE = "bfcl-multi"
VERSION = "5"
#: The same entries with each one's documents cut to what its ground truth calls and a few others
#: (`lean_task`), so that a demonstration fits a CPU training budget (see `load_bfcl_multi_lean`).
LEAN_SUITE = "bfcl-multi-lean"
LEAN_VERSION = "1"
#: Documents of the entry's own classes that its ground truth never calls, kept beside those it
#: does: the request, not the list, has to pick the function.
LEAN_DISTRACTORS = 3
ENV_ID = "toolgym/bfcl-multi-v0"
CATEGORIES = ("multi_turn_base", "multi_turn_miss_func", "multi_turn_miss_param")
SKIPPED: dict[str, int] = {}


def _entries(category: str) -> list[dict[str, Any]]:
    """BFCL's entries of `category` with their function documents (BFCL's own preparation)."""
    checkers()
    from bfcl_eval.utils import populate_test_cases_with_predefined_functions

    # bfcl_eval importable without its SDKs
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
    root = data_dir()
    truths = {
        json.loads(x)["id"]: json.loads(x)["ground_truth"]
        for x in (root / "possible_answer" / f"BFCL_v4_{category}.json").read_text().splitlines()
        if x.strip()
    }
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
        spec = {
            "id": entry["id"],
            "involved_classes": entry["involved_classes"],
            "initial_config": entry.get("initial_config", {}),
            "question": entry["question"],
            "function": entry["function"],
            "missed_function": entry.get("missed_function", {}),
        }
        decoded = [[[_call(c) for c in turn]] if turn else [] for turn in calls]
        if not multi_turn_verdict(spec, truth, decoded)["valid"]:  # BFCL rejects its own ground truth
            skipped += 1
            continue
        first = entry["question"][0]
        tasks.append(
            Task(
                env_id=ENV_ID,
                instruction="\n\n".join(str(m.get("content", "")) for m in first),
                family=category,
                split=split_of(entry["id"]),
                difficulty=len(truth),
                hidden=HiddenSpec(
                    kind="score", scorer="bfcl-multi-turn", scorer_args={"category": category, "entry": spec, "ground_truth": truth}
                ),
                oracle=tuple(c for turn in calls for c in turn),
                metadata={"bfcl_id": entry["id"], "oracle_texts": _oracle_texts(truth, calls), "missed": missed},
            )
        )
    SKIPPED[category] = skipped
    return tasks


def _call(call: ToolCall) -> str:
    return call_string(call.name, dict(call.arguments))


@lru_cache(maxsize=1)
def load_bfcl_multi() -> TaskSuite:
    """The three multi-turn categories, train and held-out."""
    return TaskSuite(SUITE, mixed_order([t for category in CATEGORIES for t in category_tasks(category)]), VERSION)


def lean_task(task: Task) -> Task:
    """`task` with the documents it offers cut to the functions its ground truth calls and
    `LEAN_DISTRACTORS` others of the same classes (drawn per entry, in the entry's own order).

    A full entry offers every method of its classes, so its demonstration does not fit a CPU job's
    token budget and a truncated one would train on the documents' tail
    (docs/results/2026-12-07-mcp-bfcl-multi-demos.md measures both). The checker replays calls on
    the API classes and never reads the documents; functions an entry withholds
    (`multi_turn_miss_func`) still arrive at their turn."""
    entry = copy.deepcopy(task.hidden.scorer_args["entry"])
    called = {c.name for c in task.oracle}
    others = [d["name"] for d in entry["function"] if d["name"] not in called]
    rng = np.random.default_rng(list(entry["id"].encode()))
    kept = set(rng.permutation(others)[:LEAN_DISTRACTORS].tolist()) if others else set()
    entry["function"] = [d for d in entry["function"] if d["name"] in called or d["name"] in kept]
    hidden = task.hidden.model_copy(update={"scorer_args": {**task.hidden.scorer_args, "entry": entry}})
    return task.model_copy(update={"hidden": hidden})


@lru_cache(maxsize=1)
def load_bfcl_multi_lean() -> TaskSuite:
    """`load_bfcl_multi` with every entry's documents cut by `lean_task`: multi-turn demonstrations
    (call, observation, next call, answer) within a CPU budget. The same entries, splits and
    ground truth; not BFCL's benchmark (its scores are not comparable with BFCL's)."""
    return TaskSuite(LEAN_SUITE, [lean_task(t) for t in load_bfcl_multi().tasks], LEAN_VERSION)


__all__ = [
    "CATEGORIES",
    "ENV_ID",
    "LEAN_DISTRACTORS",
    "LEAN_SUITE",
    "LEAN_VERSION",
    "SKIPPED",
    "SUITE",
    "VERSION",
    "category_tasks",
    "instances",
    "lean_task",
    "load_bfcl_multi",
    "load_bfcl_multi_lean",
    "methods",
    "parse_ground_truth",
]
