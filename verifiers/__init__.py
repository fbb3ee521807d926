"""Verifiers: grade a finished episode into a `Verdict` with a closed `Outcome`.

May import `toolgym.tasks` and `toolgym.sandbox` only (`toolgym.envs` sits above it and calls it to grade).
"""

from toolgym.verifiers import bfcl as _bfcl  # noqa: F401 (registers the bfcl-ast and bfcl-multi-turn scorers)
from toolgym.verifiers.answer import AnswerVerifier
from toolgym.verifiers.hidden_tests import HiddenTestVerifier, parse_junit
from toolgym.verifiers.package_tests import PackageTestVerifier
from toolgym.verifiers.protect import is_protected
from toolgym.verifiers.score import ScoreVerifier, register_scorer
from toolgym.verifiers.select import verifier_for
from toolgym.verifiers.state import CompositeVerifier, StateVerifier
from toolgym.verifiers.verdict import FinalState, Outcome, TestResult, Verdict, VerifierError


def grade_final_state(task, state: dict, sandbox_config=None) -> float:
    """Reward of a final state under the task's default verifier (used by sandboxed envs)."""
    return verifier_for(task, sandbox_config).verify(task, FinalState(**state)).reward


__all__ = [
    "grade_final_state",
    "PackageTestVerifier",
    "CompositeVerifier",
    "HiddenTestVerifier",
    "StateVerifier",
    "is_protected",
    "parse_junit",
    "ScoreVerifier",
    "register_scorer",
    "AnswerVerifier",
    "FinalState",
    "Outcome",
    "TestResult",
    "Verdict",
    "VerifierError",
    "verifier_for",
]
