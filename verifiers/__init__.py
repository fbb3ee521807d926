"""Verifiers: grade a finished episode into a `Verdict` with a closed `Outcome`.

May import `toolgym.tasks` and `toolgym.sandbox` only.
"""

from toolgym.verifiers.answer import AnswerVerifier, VerifierError, verifier_for
from toolgym.verifiers.verdict import FinalState, Outcome, TestResult, Verdict

__all__ = ["AnswerVerifier", "FinalState", "Outcome", "TestResult", "Verdict", "VerifierError", "verifier_for"]
