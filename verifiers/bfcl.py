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
from toolgym.tasks.bfcl import bfcl_verdict, multi_turn_verdict
from toolgym.verifiers.score import register_scorer


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


def _score_multi_turn(task: Task, answer: str) -> float:
    """The `bfcl-multi-turn` scorer: 1.0 when BFCL's multi-turn checker accepts the episode."""
    args = task.hidden.scorer_args
    return 1.0 if multi_turn_verdict(args["entry"], args["ground_truth"], _submitted(answer))["valid"] else 0.0


register_scorer("bfcl-multi-turn", _score_multi_turn)


__all__: list[str] = []
