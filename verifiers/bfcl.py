"""BFCL's own checkers grade BFCL tasks: the `bfcl-ast` and `bfcl-multi-turn` scorers.

The submitted answer is data. Single turn: a JSON list of calls `[{name: {argument: value}}]` as
BFCL's decoders produce them (or `{"undecodable": true}` when the model's text held a malformed
call), judged by `bfcl_eval`'s AST checker. Multi turn: per user turn, per model step, the step's
calls as BFCL's checker reads them, replayed by `bfcl_eval`'s multi-turn checker. How BFCL is
called (and its model registry stood in for) is in `toolgym.tasks.bfcl`.
"""

from __future__ import annotations

import json

from toolgym.tasks import Task
from toolgym.tasks.bfcl import MODEL_NAME, bfcl_verdict, checkers, is_irrelevance, multi_turn_verdict
from toolgym.verifiers.score import register_partial_credit, register_scorer


def _submitted(answer: str):
    """The submitted JSON, or None where it is not JSON (BFCL's checkers then fail it)."""
    try:
        return json.loads(answer)
    except json.JSONDecodeError:
        return None


def _score(task: Task, answer: str) -> float:
    """The `bfcl-ast` scorer: 1.0 when BFCL's checker accepts the submitted calls, else 0.0."""
    args = task.hidden.scorer_args
    submitted = _submitted(answer)
    calls = None if isinstance(submitted, dict) and submitted.get("undecodable") else submitted
    verdict = bfcl_verdict(args["category"], args["functions"], args.get("ground_truth", []), calls)
    return 1.0 if verdict["valid"] else 0.0


register_scorer("bfcl-ast", _score)


def call_credit(function: dict, name: str, arguments: dict, expected: dict) -> float:
    """How much of one expected call (`expected`: {parameter: acceptable values}, BFCL's ground
    truth) a call to the right function got right, in [0, 1]: the name counts as one item and
    each parameter either side names as another. A parameter is right when BFCL's own checker
    accepts its value alone (type and value rules, strings normalised), or when it is left out
    and the ground truth marks it optional; a parameter the ground truth does not expect is wrong."""
    checkers()  # the model-registry stand-in, before BFCL's checker module imports it
    from bfcl_eval.constants.enums import Language
    from bfcl_eval.eval_checker.ast_eval.ast_checker import simple_function_checker

    properties = function.get("parameters", {}).get("properties", {})
    items = set(expected) | set(arguments)
    right = 0
    for parameter in items:
        if parameter not in arguments:
            right += "" in expected[parameter]
        elif parameter in expected and parameter in properties:
            alone = {
                "name": function["name"],
                "parameters": {"type": "dict", "required": [], "properties": {parameter: properties[parameter]}},
            }
            try:
                verdict = simple_function_checker(
                    alone, {name: {parameter: arguments[parameter]}}, {name: {parameter: expected[parameter]}}, Language.PYTHON, MODEL_NAME
                )
            except Exception:  # a value BFCL's checker cannot even compare is not right
                continue
            right += bool(verdict["valid"])
    return (1 + right) / (1 + len(items))


def partial_credit(task: Task, answer: str) -> float:
    """Fine-grained credit in [0, 1] for a single-turn answer BFCL's checker rejected (after
    ToolRL's reward: right functions, parameter names and values): each expected call is matched
    with the unmatched submitted call to the same function that `call_credit` rates highest, and
    the sum is divided by the larger of the expected and submitted counts (a missing or an extra
    call costs its share). Irrelevance entries and undecodable or malformed answers get 0: there,
    only BFCL's verdict says anything. Training may use it (`rl.partial_credit`); pass@k never does."""
    args = task.hidden.scorer_args
    calls = _submitted(answer)
    if is_irrelevance(args["category"]) or not isinstance(calls, list) or not calls:
        return 0.0
    if not all(isinstance(c, dict) and len(c) == 1 and isinstance(next(iter(c.values())), dict) for c in calls):
        return 0.0
    functions = {f["name"]: f for f in args["functions"]}
    used: set[int] = set()
    total = 0.0
    for expected_call in args.get("ground_truth", []):
        ((name, expected),) = expected_call.items()
        options = [
            (call_credit(functions[name], name, calls[j][name], expected), j)
            for j in range(len(calls))
            if j not in used and name in calls[j] and name in functions
        ]
        if options:
            credit, j = max(options, key=lambda o: (o[0], -o[1]))
            used.add(j)
            total += credit
    return total / max(len(args.get("ground_truth", [])), len(calls), 1)


register_partial_credit("bfcl-ast", partial_credit)


def _score_multi_turn(task: Task, answer: str) -> float:
    """The `bfcl-multi-turn` scorer: 1.0 when BFCL's multi-turn checker accepts the episode."""
    args = task.hidden.scorer_args
    return 1.0 if multi_turn_verdict(args["entry"], args["ground_truth"], _submitted(answer))["valid"] else 0.0


register_scorer("bfcl-multi-turn", _score_multi_turn)


__all__ = ["call_credit", "partial_credit"]
