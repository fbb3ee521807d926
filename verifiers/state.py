"""`StateVerifier`: a hidden checker script judges the final workspace state.

The checker (the task's hidden files, entry `check.py` unless `command` says otherwise) runs in
a fresh grading sandbox with the agent's changes applied as data: no process of the agent's ever
ran there, the interpreter is isolated (`python3 -I`) and the root filesystem is read-only. It prints one JSON object per line,
`{"name": ..., "passed": true|false, "message": ..., "credit": ...}` (`credit` optional), to a results file whose path it gets as
its first argument; the host reads that file from its own side of the filesystem after the run. Reward: all-or-nothing, or the
fraction of checks passed. An all-or-nothing failure still records how close it came as
`details["partial_credit"]`: the mean over checks of each check's `credit` where the checker gives
one (in [-1, 1]: a change away from the goal scores below leaving it alone), else of its pass (0 or
1). It never changes the reward, the pass or pass@k; training may use it: `rl.partial_credit`.
"""

from __future__ import annotations

import json
import secrets
import time

from toolgym.sandbox import SandboxConfig, SandboxError
from toolgym.tasks import Task
from toolgym.verifiers.grading import grading_sandbox
from toolgym.verifiers.verdict import FinalState, Outcome, TestResult, Verdict

CHECK_DIR = ".toolgym-check"


class StateVerifier:
    """Runs the task's hidden checker against the final workspace."""

    name = "state"

    def __init__(self, config: SandboxConfig | None = None) -> None:
        self.config = config or SandboxConfig()

    def verify(self, task: Task, final_state: FinalState) -> Verdict:
        """Grade the final state with the hidden checker."""
        start = time.perf_counter()
        hidden = task.hidden
        if "check.py" not in hidden.files and not hidden.command:
            from toolgym.verifiers.verdict import VerifierError

            raise VerifierError(f"task {task.id}: a state task needs hidden/check.py or a command")
        checker_dir = f"{CHECK_DIR}-{secrets.token_hex(4)}"
        out = f"{CHECK_DIR}-{secrets.token_hex(6)}.jsonl"
        checker = {f"{checker_dir}/{rel}": text for rel, text in hidden.files.items()}
        try:
            # The final state arrives as data (files written by the host); no process of the
            # agent's ever ran in this sandbox, and its root filesystem is read-only.
            box, dropped = grading_sandbox(task, final_state.changes, self.config, final_state.modes, checker)
        except (SandboxError, OSError) as err:
            return Verdict(
                reward=0.0,
                passed=False,
                outcome=Outcome.INFRA_ERROR,
                reason=f"could not build the grading sandbox: {err}",
                duration_s=time.perf_counter() - start,
            )
        tamper = [{"kind": "test_tamper", "path": p, "detail": "change to a protected path dropped"} for p in dropped]
        try:
            cmd = hidden.command or f"python3 -I {checker_dir}/check.py {out}"
            res = box.exec(cmd.replace("{results}", out).replace("{checker}", checker_dir), timeout_s=hidden.timeout_s)
            if res.timed_out:
                return Verdict(
                    reward=0.0,
                    passed=False,
                    outcome=Outcome.VERIFIER_ERROR,
                    reason="checker timed out",
                    duration_s=time.perf_counter() - start,
                    details={"side_effects": tamper},
                )
            try:  # read on the host's side of the filesystem, never through a command inside
                lines = box.read_host_bytes(out).decode("utf-8", errors="replace").splitlines()
            except SandboxError:
                return Verdict(
                    reward=0.0,
                    passed=False,
                    outcome=Outcome.VERIFIER_ERROR,
                    reason=f"checker wrote no results (exit {res.exit_code}): {res.stderr[-300:]}",
                    duration_s=time.perf_counter() - start,
                    details={"side_effects": tamper},
                )
        except SandboxError as err:
            return Verdict(
                reward=0.0,
                passed=False,
                outcome=Outcome.INFRA_ERROR,
                reason=f"grading sandbox failed: {err}",
                duration_s=time.perf_counter() - start,
                details={"side_effects": tamper},
            )
        finally:
            box.close()
        try:
            tests = [TestResult(**json.loads(line)) for line in lines if line.strip()]
        except (ValueError, TypeError) as err:
            return Verdict(
                reward=0.0,
                passed=False,
                outcome=Outcome.VERIFIER_ERROR,
                reason=f"checker output is not JSON lines ({err})",
                duration_s=time.perf_counter() - start,
            )
        if not tests:
            return Verdict(
                reward=0.0,
                passed=False,
                outcome=Outcome.VERIFIER_ERROR,
                reason="checker reported no checks",
                duration_s=time.perf_counter() - start,
            )
        passed = sum(t.passed for t in tests)
        ok = passed == len(tests)
        reward = float(ok) if hidden.all_or_nothing else passed / len(tests)
        details: dict = {"side_effects": tamper}
        if not ok and hidden.all_or_nothing:  # how close the failure came, for training only
            details["partial_credit"] = sum(t.passed if t.credit is None else t.credit for t in tests) / len(tests)
        return Verdict(
            reward=reward,
            passed=ok,
            outcome=Outcome.PASSED if ok else Outcome.FAILED,
            tests=tests,
            reason=f"{passed}/{len(tests)} checks passed",
            duration_s=time.perf_counter() - start,
            details=details,
        )


class CompositeVerifier:
    """A weighted combination of verifiers; passes only if every part passes."""

    name = "composite"

    def __init__(self, parts: list[tuple[object, float]]) -> None:
        if not parts or any(w < 0 for _, w in parts) or sum(w for _, w in parts) <= 0:
            raise ValueError("CompositeVerifier needs (verifier, weight >= 0) pairs with a positive total weight")
        self.parts = parts

    def verify(self, task: Task, final_state: FinalState) -> Verdict:
        """Weighted reward; the worst non-passing outcome wins."""
        start = time.perf_counter()
        verdicts = [(v.verify(task, final_state), w) for v, w in self.parts]  # type: ignore[attr-defined]
        total = sum(w for _, w in verdicts)
        reward = sum(v.reward * w for v, w in verdicts) / total
        for bad in (Outcome.INFRA_ERROR, Outcome.VERIFIER_ERROR, Outcome.TIMEOUT, Outcome.FAILED):
            if any(v.outcome == bad for v, _ in verdicts):
                outcome = bad
                break
        else:
            outcome = Outcome.PASSED
        return Verdict(
            reward=min(1.0, reward),
            passed=outcome == Outcome.PASSED,
            outcome=outcome,
            tests=[t for v, _ in verdicts for t in v.tests],
            reason="; ".join(v.reason for v, _ in verdicts),
            duration_s=time.perf_counter() - start,
            details={"side_effects": [e for v, _ in verdicts for e in v.details.get("side_effects", [])]},
        )
