"""`HiddenTestVerifier`: run hidden pytest tests against the agent's work in a clean sandbox.

After the episode the agent's sandbox is gone; grading happens in a fresh sandbox built from the
pristine task state plus the agent's changes to non-protected paths. The hidden tests are
copied in only now (they never existed where the agent worked), pytest runs with the network
off, a timeout, no conftest/ini of the agent's, and writes JUnit XML to a fresh, randomly named
directory that the host reads after every process in the sandbox is dead. The result is not
taken from stdout or the exit code.

Forgery checks: a sentinel test that must fail is added to every run (a patched pytest that
passes everything passes it too), every hidden test must appear in the report, and the hidden
test files must be unchanged after the run.
"""

from __future__ import annotations

import hashlib
import secrets
import shlex
import time
import xml.etree.ElementTree as ET
from typing import Callable

from toolgym.sandbox import SandboxConfig, SandboxError
from toolgym.tasks import Task
from toolgym.verifiers.grading import grading_sandbox
from toolgym.verifiers.verdict import FinalState, Outcome, TestResult, Verdict

HIDDEN_DIR = "tests_hidden"
SENTINEL = "test_toolgym_sentinel"
_SPLIT = "=====toolgym-junit====="
SENTINEL_FILE = f"{HIDDEN_DIR}/test_toolgym_sentinel.py"
SENTINEL_CODE = f"def {SENTINEL}():\n    assert 1 == 2, 'this test must fail; if it passes, results were forged'\n"


def parse_junit(xml_text: str) -> list[TestResult]:
    """Test cases from a JUnit XML report (pytest's format)."""
    root = ET.fromstring(xml_text)
    out = []
    for case in root.iter("testcase"):
        name = case.get("name", "")
        classname = case.get("classname", "")
        bad = next((child for child in case if child.tag in ("failure", "error", "skipped")), None)
        message = "" if bad is None else f"{bad.tag}: {(bad.get('message') or '')[:200]}"
        out.append(TestResult(name=f"{classname}::{name}" if classname else name, passed=bad is None, message=message))
    return out


class HiddenTestVerifier:
    """Grades `tests` tasks (see the module docstring); works on both sandbox backends."""

    name = "hidden-tests"

    def __init__(self, config: SandboxConfig | None = None,
                 on_sandbox: Callable | None = None) -> None:
        self.config = config or SandboxConfig()
        self.on_sandbox = on_sandbox  # test hook: sees the grading sandbox once it exists

    def verify(self, task: Task, final_state: FinalState) -> Verdict:
        """Grade the agent's workspace changes against the task's hidden tests."""
        start = time.perf_counter()
        hidden = task.hidden
        try:
            box, dropped = grading_sandbox(task, final_state.changes, self.config, final_state.modes)
        except (SandboxError, OSError) as err:
            return Verdict(reward=0.0, passed=False, outcome=Outcome.INFRA_ERROR,
                           reason=f"could not build the grading sandbox: {err}", duration_s=time.perf_counter() - start)
        tamper = [{"kind": "test_tamper", "path": p, "detail": "change to a protected path dropped before grading"}
                  for p in dropped]
        results_dir = f".toolgym-results-{secrets.token_hex(6)}"
        try:
            if self.on_sandbox:
                self.on_sandbox(box)
            files = {f"{HIDDEN_DIR}/{rel}": text for rel, text in hidden.files.items()}
            files[SENTINEL_FILE] = SENTINEL_CODE
            files[f"{HIDDEN_DIR}/pytest.ini"] = "[pytest]\n"
            box.exec(f"rm -rf {HIDDEN_DIR} .toolgym-results-*")
            box.write_files(files)
            cmd = hidden.command or (
                f"mkdir -p {results_dir} && PYTHONPATH=/workspace PYTHONDONTWRITEBYTECODE=1 python3 -m pytest -q "
                f"-p no:cacheprovider --noconftest -c {HIDDEN_DIR}/pytest.ini --rootdir /workspace "
                f"--junitxml={results_dir}/junit.xml {HIDDEN_DIR}")
            cmd = cmd.replace("{results}", results_dir)
            res = box.exec(cmd, timeout_s=hidden.timeout_s)
            if getattr(box, "closed", False) or getattr(box, "closing", False):
                raise SandboxError("the grading sandbox was closed during grading")
            if res.timed_out:
                return self._verdict(0.0, False, Outcome.TIMEOUT, [], f"hidden tests timed out after {hidden.timeout_s}s",
                                     start, tamper)
            # One read after every process of the run is dead: file hashes, then the report.
            names = " ".join(shlex.quote(p) for p in sorted(files))
            probe = box.exec(f"sha256sum -- {names}; echo {_SPLIT}; cat {results_dir}/junit.xml")
            if getattr(box, "closed", False) or getattr(box, "closing", False):
                raise SandboxError("the grading sandbox was closed during grading")
            hashes_text, _, xml_text = probe.stdout.partition(_SPLIT + "\n")
            after = {line.split()[-1]: line.split()[0] for line in hashes_text.splitlines() if line.strip()}
            if not xml_text.strip():
                return self._verdict(0.0, False, Outcome.FAILED, [], "no JUnit report: the test process died or exited "
                                     f"early (exit code {res.exit_code}); {res.stdout[-300:]}", start, tamper)
        except SandboxError as err:
            return Verdict(reward=0.0, passed=False, outcome=Outcome.INFRA_ERROR,
                           reason=f"grading sandbox failed: {err}", duration_s=time.perf_counter() - start,
                           details={"side_effects": tamper})
        finally:
            box.close()
        expected_hashes = {p: hashlib.sha256(t.encode()).hexdigest() for p, t in files.items()}
        if after != expected_hashes:
            tamper.append({"kind": "test_tamper", "path": HIDDEN_DIR, "detail": "hidden tests changed during the run"})
            return self._verdict(0.0, False, Outcome.FAILED, [], "hidden test files were modified while they ran",
                                 start, tamper)
        try:
            tests = parse_junit(xml_text)
        except ET.ParseError as err:
            tamper.append({"kind": "test_tamper", "path": results_dir, "detail": "unparsable JUnit report"})
            return self._verdict(0.0, False, Outcome.FAILED, [], f"JUnit report is not valid XML ({err})", start, tamper)
        sentinel = [t for t in tests if t.name.endswith(SENTINEL)]
        if len(sentinel) != 1 or sentinel[0].passed:
            tamper.append({"kind": "test_tamper", "path": results_dir, "detail": "sentinel test missing or passed"})
            return self._verdict(0.0, False, Outcome.FAILED, [], "results were forged: the sentinel test that must fail "
                                 "is missing or passed", start, tamper)
        tests = [t for t in tests if not t.name.endswith(SENTINEL)]
        expected = sum(text.count("\ndef test_") + text.startswith("def test_") for text in hidden.files.values())
        if len(tests) < expected:
            return self._verdict(0.0, False, Outcome.FAILED, tests, f"only {len(tests)} of {expected} hidden tests ran",
                                 start, tamper)
        passed = sum(t.passed for t in tests)
        ok = passed == len(tests)
        # Dropped protected edits did not influence the run; they stay recorded as tampering.
        reward = float(ok) if hidden.all_or_nothing else passed / max(1, len(tests))
        return self._verdict(reward, ok, Outcome.PASSED if ok else Outcome.FAILED, tests,
                             f"{passed}/{len(tests)} hidden tests passed" + (f"; dropped edits to {dropped}" if dropped else ""),
                             start, tamper)

    @staticmethod
    def _verdict(reward: float, passed: bool, outcome: Outcome, tests: list[TestResult], reason: str, start: float,
                 tamper: list[dict]) -> Verdict:
        return Verdict(reward=reward, passed=passed, outcome=outcome, tests=tests, reason=reason,
                       duration_s=time.perf_counter() - start, details={"side_effects": tamper})
