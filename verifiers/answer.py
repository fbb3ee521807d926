"""`AnswerVerifier`: exact / normalised / numeric-tolerance match of a submitted answer."""

from __future__ import annotations

import time

from toolgym.tasks import Task, answers_match
from toolgym.verifiers.verdict import FinalState, Outcome, TestResult, Verdict, VerifierError


class AnswerVerifier:
    """Compares `final_state.answer` with the task's hidden answer under its match mode."""

    name = "answer"

    def verify(self, task: Task, final_state: FinalState) -> Verdict:
        """Grade the submitted answer."""
        start = time.perf_counter()
        hidden = task.hidden
        if hidden.kind != "answer" or hidden.answer is None:
            raise VerifierError(f"task {task.id} has no hidden answer (kind={hidden.kind!r})")
        if final_state.answer is None:
            return Verdict(
                reward=0.0, passed=False, outcome=Outcome.FAILED, reason="no answer submitted", duration_s=time.perf_counter() - start
            )
        ok = answers_match(final_state.answer, hidden.answer, hidden.match, hidden.tolerance)
        return Verdict(
            reward=float(ok),
            passed=ok,
            outcome=Outcome.PASSED if ok else Outcome.FAILED,
            tests=[TestResult(name="answer", passed=ok)],
            reason="answer matches" if ok else f"answer {final_state.answer!r} does not match",
            duration_s=time.perf_counter() - start,
        )


__all__ = ["AnswerVerifier", "VerifierError"]
