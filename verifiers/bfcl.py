"""BFCL's own checkers grade BFCL tasks (the `bfcl-ast` scorer).

The Berkeley Function Calling Leaderboard ships its data and checkers as `bfcl-eval` (installed
with `--no-deps`: its declared dependencies are API SDKs the checkers never call). Its AST checker
imports the leaderboard's model registry only to map dots in function names for API models that
cannot use them; toolgym offers function names with their dots, so the registry is not needed:
when it cannot be imported (the SDKs are absent), a stand-in registry is installed in its place
that answers "names keep their dots" for every model. Nothing of BFCL's code is copied: the
verdict is `bfcl_eval.eval_checker.ast_eval.ast_checker.ast_checker` on the parsed calls, and
irrelevance is BFCL's own rule (`bfcl_eval.utils.is_empty_output`: no call at all passes).

The submitted answer is data: a JSON list of calls `[{name: {argument: value}}]` as BFCL's
decoders produce them (or `{"undecodable": true}` when the model's text held a malformed call).
"""

from __future__ import annotations

import json
import sys
import types
from typing import Any

from toolgym.tasks import Task
from toolgym.verifiers.score import register_scorer
from toolgym.verifiers.verdict import VerifierError

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
        raise VerifierError(f"bfcl-eval is not installed ({err}): pip install --no-deps bfcl-eval") from err
    return ast_checker, is_empty_output, Language


def bfcl_verdict(category: str, functions: list[dict], ground_truth: list[dict], calls: Any) -> dict[str, Any]:
    """BFCL's verdict for one single-turn entry: {"valid": bool, "error": ..., "error_type": ...}.
    `calls` is the decoded model output (a list of {name: arguments}) or None when undecodable."""
    ast_checker, is_empty_output, Language = checkers()
    if category.endswith("irrelevance"):  # BFCL: passes when the model made no call (or none decodes)
        empty = calls is None or is_empty_output(calls)
        return {"valid": empty, "error": [] if empty else ["the model called a function"],
                "error_type": "" if empty else "irrelevance:function_called"}
    if calls is None:
        return {"valid": False, "error": ["the model's output did not decode to function calls"],
                "error_type": "ast_decoder:decoder_failed"}
    if not isinstance(calls, list) or not all(isinstance(c, dict) for c in calls):
        return {"valid": False, "error": ["not a list of calls"], "error_type": "ast_decoder:decoder_wrong_output_format"}
    return ast_checker(functions, calls, ground_truth, Language.PYTHON, category, MODEL_NAME)


def _score(task: Task, answer: str) -> float:
    """The `bfcl-ast` scorer: 1.0 when BFCL's checker accepts the submitted calls, else 0.0."""
    args = task.hidden.scorer_args
    try:
        submitted = json.loads(answer)
    except json.JSONDecodeError:
        submitted = None
    calls = None if isinstance(submitted, dict) and submitted.get("undecodable") else submitted
    verdict = bfcl_verdict(args["category"], args["functions"], args.get("ground_truth", []), calls)
    return 1.0 if verdict["valid"] else 0.0


register_scorer("bfcl-ast", _score)



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
        return {"valid": False, "error_type": "multi_turn:force_terminated",
                "error_message": f"{len(decoded) if isinstance(decoded, list) else 'no'} turns answered of "
                                 f"{len(ground_truth)}"}
    # BFCL keeps each (model, entry)'s API instances in its module's globals across calls: a name of
    # our own per grading keeps gradings apart, and its instances are dropped afterwards
    model = f"toolgym_{uuid.uuid4().hex}"
    category = entry["id"].rsplit("_", 1)[0]
    try:
        return multi_turn_checker(decoded, ground_truth, dict(entry), category, model)
    finally:
        for name in [n for n in vars(multi_turn_utils) if n.startswith(model)]:
            del vars(multi_turn_utils)[name]


def _score_multi_turn(task: Task, answer: str) -> float:
    """The `bfcl-multi-turn` scorer: 1.0 when BFCL's multi-turn checker accepts the episode."""
    args = task.hidden.scorer_args
    try:
        decoded = json.loads(answer)
    except json.JSONDecodeError:
        decoded = None
    return 1.0 if multi_turn_verdict(args["entry"], args["ground_truth"], decoded)["valid"] else 0.0


register_scorer("bfcl-multi-turn", _score_multi_turn)

__all__ = ["MODEL_NAME", "bfcl_verdict", "call_string", "checkers", "multi_turn_verdict"]
