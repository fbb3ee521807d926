"""`ScoreVerifier`: a registered scoring function grades the submitted answer in [0, 1].

For task sources that ship their own scorers (reasoning-gym's `score_answer`): the task's hidden
spec names the scorer (`kind="score"`, `scorer=...`) and carries what it needs (`answer`,
`scorer_args`); the scorer runs on the host over the submitted text, never agent code.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from toolgym.tasks import Task
from toolgym.verifiers.verdict import FinalState, Outcome, TestResult, Verdict, VerifierError

#: A scorer: (task, submitted answer) -> score in [0, 1].
Scorer = Callable[[Task, str], float]
_SCORERS: dict[str, Scorer] = {}
#: Partial credit for an answer its scorer rejected, by scorer name: (task, answer) -> [0, 1].
_PARTIAL_CREDIT: dict[str, Scorer] = {}


def register_scorer(name: str, fn: Scorer) -> Scorer:
    """Register `fn` under `name` (tasks refer to it by `HiddenSpec.scorer`)."""
    _SCORERS[name] = fn
    return fn


def register_partial_credit(name: str, fn: Scorer) -> Scorer:
    """Register `fn` as the partial credit of scorer `name`: for an answer the scorer does not
    pass, how close it came, in [0, 1]. The verdict records it (`details["partial_credit"]`, or
    `details["partial_credit_error"]` when `fn` fails); it never changes the reward, the pass or
    pass@k (training may use it: `rl.partial_credit`)."""
    _PARTIAL_CREDIT[name] = fn
    return fn


def scorer(name: str) -> Scorer:
    """The registered scorer `name` (a `VerifierError` naming the known ones otherwise)."""
    if name not in _SCORERS:
        raise VerifierError(f"no scorer {name!r}; registered: {', '.join(sorted(_SCORERS)) or '(none)'}")
    return _SCORERS[name]


class ScoreVerifier:
    """Grades with the task's registered scorer; passed only at a full score."""

    name = "score"

    def verify(self, task: Task, final_state: FinalState) -> Verdict:
        """Score the submitted answer."""
        start = time.perf_counter()
        hidden = task.hidden
        if hidden.kind != "score" or not hidden.scorer:
            raise VerifierError(f"task {task.id} names no scorer (kind={hidden.kind!r})")
        fn = scorer(hidden.scorer)
        if final_state.answer is None:
            return Verdict(
                reward=0.0, passed=False, outcome=Outcome.FAILED, reason="no answer submitted", duration_s=time.perf_counter() - start
            )
        try:
            score = float(fn(task, final_state.answer))
        except Exception as err:  # the scorer's failure is ours, never the agent's
            raise VerifierError(f"scorer {hidden.scorer!r} failed: {type(err).__name__}: {err}") from err
        if not 0.0 <= score <= 1.0:
            raise VerifierError(f"scorer {hidden.scorer!r} returned {score}, outside [0, 1]")
        ok = score >= 1.0
        details = {} if ok or hidden.scorer not in _PARTIAL_CREDIT else _partial_credit(hidden.scorer, task, final_state.answer)
        return Verdict(
            reward=score,
            passed=ok,
            outcome=Outcome.PASSED if ok else Outcome.FAILED,
            tests=[TestResult(name=hidden.scorer, passed=ok, message=f"score {score:g}")],
            reason=f"score {score:g}",
            details=details,
            duration_s=time.perf_counter() - start,
        )


def _partial_credit(name: str, task: Task, answer: str) -> dict[str, Any]:
    """The verdict's details for a rejected answer: its partial credit, or why there is none. The
    verdict is the scorer's and stands either way: a partial-credit function that fails (on any
    answer the agent could craft) costs the episode only the credit, never its grade."""
    try:
        credit = float(_PARTIAL_CREDIT[name](task, answer))
    except Exception as err:
        return {"partial_credit_error": f"{type(err).__name__}: {err}"}
    if not 0.0 <= credit <= 1.0:
        return {"partial_credit_error": f"{credit} is outside [0, 1]"}
    return {"partial_credit": credit}


def _reasoning_gym_score(task: Task, answer: str) -> float:
    """reasoning-gym's own `score_answer` for the task's dataset (imported on first use)."""
    try:
        import reasoning_gym
    except ImportError as err:
        raise VerifierError("reasoning-gym is not installed: pip install 'toolgym[reasoning]'") from err
    args = task.hidden.scorer_args
    entry = {"question": task.instruction, "answer": task.hidden.answer, "metadata": args.get("metadata", {})}
    return float(reasoning_gym.get_score_answer_fn(args["dataset"])(answer, entry))


register_scorer("reasoning-gym", _reasoning_gym_score)

__all__ = ["ScoreVerifier", "Scorer", "register_partial_credit", "register_scorer", "scorer"]
