"""BFCL's data and checkers, as toolgym tasks (the Berkeley Function Calling Leaderboard).

`bfcl-eval` ships BFCL's data (`bfcl_eval/data`) and its checkers; install it with `--no-deps`: its
declared dependencies are API SDKs the checkers never call. Its AST checker imports the
leaderboard's model registry only to map dots in function names for API models that cannot use
them; toolgym offers function names with their dots, so where the registry cannot import (the SDKs
are absent) a stand-in that answers "names keep their dots" for every model is put in its place.
Nothing of BFCL's code is copied: verdicts are `bfcl_eval`'s own checkers on the model's calls as
data, and irrelevance is BFCL's own rule (`bfcl_eval.utils.is_empty_output`: no call passes).

This module builds the single-turn tasks (`simple_python`, `multiple`, `parallel`,
`parallel_multiple`, `irrelevance`); `bfcl_multi.py` the multi-turn ones. The split: a quarter of
each category's ids, by a hash of the id, is held out. `bfcl-live` is BFCL's "live" data (user-
contributed questions and functions, collected after the categories above) in the same five kinds,
all held out: toolgym never trains on it, so a policy's score there is measured on tasks unlike
anything its training or its usual evaluation saw. The oracle is BFCL's ground truth (each
parameter's first acceptable value), checked against BFCL's checker at load: an entry whose ground
truth the checker itself rejects is left out and counted (`SKIPPED`).
"""

from __future__ import annotations

import hashlib
import json
import sys
import types
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import Any

from toolgym.tasks.suite import HELDOUT, TRAIN, TaskLoadError, TaskSuite
from toolgym.tasks.task import HiddenSpec, Task, ToolCall

SUITE = "bfcl"
VERSION = "5"
ENV_ID = "toolgym/bfcl-v0"
CATEGORIES = ("simple_python", "multiple", "parallel", "parallel_multiple", "irrelevance")
LIVE_SUITE = "bfcl-live"
LIVE_VERSION = "1"
#: BFCL's live single-turn categories (`live_relevance`, 16 entries that BFCL passes on any call at all, is left out).
LIVE_CATEGORIES = ("live_simple", "live_multiple", "live_parallel", "live_parallel_multiple", "live_irrelevance")
#: One id in this many is held out (by a hash of the id, per category).
HELDOUT_EVERY = 4
#: Entries left out at load because BFCL's checker rejects their own ground truth, by category.
SKIPPED: dict[str, int] = {}

#: The model name BFCL's checker is given (its registry lookup is the stand-in's, see above).
MODEL_NAME = "toolgym"


class _KeepDots:
    """A model config that keeps dots in function names (toolgym offers them as they are)."""

    underscore_to_dot = False


class _Registry(dict):
    """BFCL's `MODEL_CONFIG_MAPPING` for any model name: dots kept."""

    def __missing__(self, key: str) -> _KeepDots:
        return _KeepDots()


def checkers() -> tuple[Any, Any, Any]:
    """(ast_checker, is_empty_output, Language) from `bfcl_eval`, importable without its SDKs."""
    name = "bfcl_eval.constants.model_config"
    if name not in sys.modules:
        try:
            __import__(name)
        except ImportError:  # the registry imports API SDKs we do not install: stand in for it
            stand_in = types.ModuleType(name)
            stand_in.MODEL_CONFIG_MAPPING = _Registry()  # type: ignore[attr-defined]
            sys.modules[name] = stand_in
    try:
        from bfcl_eval.constants.enums import Language
        from bfcl_eval.eval_checker.ast_eval.ast_checker import ast_checker
        from bfcl_eval.utils import is_empty_output
    except ImportError as err:
        raise TaskLoadError(f"bfcl-eval is not installed ({err}): pip install --no-deps bfcl-eval==2026.3.23") from err
    return ast_checker, is_empty_output, Language


def bfcl_verdict(category: str, functions: list[dict], ground_truth: list[dict], calls: Any) -> dict[str, Any]:
    """BFCL's verdict for one single-turn entry: {"valid": bool, "error": ..., "error_type": ...}.
    `calls` is the decoded model output (a list of {name: arguments}) or None when undecodable."""
    ast_checker, is_empty_output, Language = checkers()
    if is_irrelevance(category):  # BFCL: passes when the model made no call (or none decodes)
        empty = calls is None or is_empty_output(calls)
        return {
            "valid": empty,
            "error": [] if empty else ["the model called a function"],
            "error_type": "" if empty else "irrelevance:function_called",
        }
    if calls is None:
        return {
            "valid": False,
            "error": ["the model's output did not decode to function calls"],
            "error_type": "ast_decoder:decoder_failed",
        }
    if not isinstance(calls, list) or not all(isinstance(c, dict) for c in calls):
        return {"valid": False, "error": ["not a list of calls"], "error_type": "ast_decoder:decoder_wrong_output_format"}
    return ast_checker(functions, calls, ground_truth, Language.PYTHON, category, MODEL_NAME)


def call_string(name: str, arguments: dict[str, Any]) -> str:
    """A call as BFCL's multi-turn checker reads it, `name(key=value, ...)`, built only from the
    call's name (an identifier the environment offered) and `repr` of its JSON argument values:
    literals, never code."""
    if not name.isidentifier():
        raise ValueError(f"not a function name: {name!r}")
    parts = []
    for key, value in arguments.items():
        if not str(key).isidentifier():
            raise ValueError(f"not an argument name: {key!r}")
        parts.append(f"{key}={value!r}")
    return f"{name}({', '.join(parts)})"


def multi_turn_verdict(entry: dict[str, Any], ground_truth: list[list[str]], decoded: Any) -> dict[str, Any]:
    """BFCL's multi-turn verdict: `multi_turn_checker` replays the model's calls and the ground
    truth turn by turn on fresh instances of the entry's API classes and compares state and
    responses. `decoded`: per user turn, per model step, the step's call strings (BFCL's decoded
    format); a list of another length is BFCL's "force-terminated" failure."""
    checkers()  # the registry stand-in, if needed
    import uuid

    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import multi_turn_checker

    if not isinstance(decoded, list) or len(decoded) != len(ground_truth):
        return {
            "valid": False,
            "error_type": "multi_turn:force_terminated",
            "error_message": f"{len(decoded) if isinstance(decoded, list) else 'no'} turns answered of {len(ground_truth)}",
        }
    # BFCL keeps each (model, entry)'s API instances in its module's globals across calls: a name of
    # our own per grading keeps gradings apart, and its instances are dropped afterwards
    model = f"toolgym_{uuid.uuid4().hex}"
    category = entry["id"].rsplit("_", 1)[0]
    try:
        return multi_turn_checker(decoded, ground_truth, dict(entry), category, model)
    finally:
        for name in [n for n in vars(multi_turn_utils) if n.startswith(model)]:
            del vars(multi_turn_utils)[name]


def data_dir() -> Path:
    """`bfcl_eval/data` of the installed `bfcl-eval` (a `TaskLoadError` saying how to install it)."""
    try:
        import bfcl_eval
    except ImportError:
        raise TaskLoadError("the bfcl suite needs the bfcl-eval package: pip install --no-deps bfcl-eval==2026.3.23") from None
    return Path(bfcl_eval.__file__).parent / "data"


def _read(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


_UNSET = object()


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


def is_irrelevance(category: str) -> bool:
    """BFCL's irrelevance categories (`irrelevance`, `live_irrelevance`): no call is the answer."""
    return category.endswith("irrelevance")


def category_tasks(category: str, split: Callable[[str], str] | None = None) -> list[Task]:
    """Every entry of one BFCL category as a Task (entries whose ground truth BFCL rejects left out),
    each in the split `split(id)` gives (by default `split_of`: a quarter held out)."""
    split = split or split_of
    root = data_dir()
    entries = _read(root / f"BFCL_v4_{category}.json")
    answers = (
        {}
        if is_irrelevance(category)
        else {a["id"]: a["ground_truth"] for a in _read(root / "possible_answer" / f"BFCL_v4_{category}.json")}
    )
    tasks, skipped = [], 0
    for entry in entries:
        truth = answers.get(entry["id"], [])
        calls = oracle_calls(truth)
        if not is_irrelevance(category) and not bfcl_verdict(category, entry["function"], truth, calls)["valid"]:
            skipped += 1
            continue
        oracle = tuple(ToolCall(name=name, arguments=args) for call in calls for name, args in call.items())
        tasks.append(
            Task(
                env_id=ENV_ID,
                instruction=_instruction(entry["question"]),
                family=category,
                split=split(entry["id"]),
                hidden=HiddenSpec(
                    kind="score",
                    scorer="bfcl-ast",
                    scorer_args={"category": category, "functions": entry["function"], "ground_truth": truth, "bfcl_id": entry["id"]},
                ),
                oracle=oracle,
                metadata={"bfcl_id": entry["id"], "oracle_turns": "one"},
            )
        )
    SKIPPED[category] = skipped
    return tasks


def mixed_order(tasks: list[Task]) -> list[Task]:
    """The tasks in an order fixed by a hash of their BFCL ids, so that the first N of a split (a
    campaign's `eval_tasks`, `demos_per_suite`, `toolgym eval --tasks`) is a mix of every
    category in about its share, not the first category alone."""

    def key(task: Task) -> bytes:
        return hashlib.sha256(f"order:{task.metadata['bfcl_id']}".encode()).digest()

    return sorted(tasks, key=key)


@lru_cache(maxsize=1)
def load_bfcl() -> TaskSuite:
    """The five single-turn categories, train and held-out, categories mixed (`mixed_order`)."""
    return TaskSuite(SUITE, mixed_order([t for category in CATEGORIES for t in category_tasks(category)]), VERSION)


@lru_cache(maxsize=1)
def load_bfcl_live() -> TaskSuite:
    """BFCL's five live single-turn categories, every entry held out, categories mixed."""
    tasks = [t for category in LIVE_CATEGORIES for t in category_tasks(category, split=lambda _id: HELDOUT)]
    return TaskSuite(LIVE_SUITE, mixed_order(tasks), LIVE_VERSION)


__all__ = [
    "CATEGORIES",
    "ENV_ID",
    "LIVE_CATEGORIES",
    "LIVE_SUITE",
    "LIVE_VERSION",
    "MODEL_NAME",
    "SKIPPED",
    "SUITE",
    "VERSION",
    "bfcl_verdict",
    "call_string",
    "category_tasks",
    "checkers",
    "data_dir",
    "is_irrelevance",
    "load_bfcl",
    "load_bfcl_live",
    "mixed_order",
    "multi_turn_verdict",
    "oracle_calls",
    "split_of",
]
