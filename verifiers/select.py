"""`verifier_for`: the default verifier of a task, by the kind of its hidden spec."""

from __future__ import annotations

from toolgym.tasks import Task
from toolgym.verifiers.answer import AnswerVerifier
from toolgym.verifiers.hidden_tests import HiddenTestVerifier
from toolgym.verifiers.package_tests import PackageTestVerifier
from toolgym.verifiers.score import ScoreVerifier
from toolgym.verifiers.state import StateVerifier
from toolgym.verifiers.verdict import VerifierError


def verifier_for(task: Task, sandbox_config=None):
    """The default verifier of a task, by its hidden spec kind (sandboxed kinds use `sandbox_config`)."""
    if task.hidden.kind == "answer":
        return AnswerVerifier()
    if task.hidden.kind == "tests":
        return HiddenTestVerifier(sandbox_config)
    if task.hidden.kind == "state":
        return StateVerifier(sandbox_config)
    if task.hidden.kind == "package-tests":
        return PackageTestVerifier(sandbox_config)
    if task.hidden.kind == "score":
        return ScoreVerifier()
    if task.hidden.kind == "harbor":
        from toolgym.verifiers.harbor import HarborVerifier

        return HarborVerifier()
    raise VerifierError(f"no verifier for hidden kind {task.hidden.kind!r}")


__all__ = ["verifier_for"]
