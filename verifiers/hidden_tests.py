"""`HiddenTestVerifier`: hidden tests that agent code cannot reach.

The principle: **the agent's code is data to the grader.** It runs only in a process and a
filesystem that neither decide nor report the results. Grading has two stages:

1. **Probes** (sandbox A: the pristine workspace plus the agent's non-protected changes). An
   isolated interpreter (`python3 -I`: no workspace on the start-up path, no `PYTHON*`
   variables, no user site) runs `probe_runner.py`, which executes each `Probe` of the task
   against the agent's code and writes one JSON record per probe: the `repr` of a builtin value
   of exact type, or the exception's name. The records come back over the exec's stdout pipe,
   read by the host. Sandbox A never holds an expected value, so anything agent code prints or
   forges there is no more than what the code under test could compute anyway.
2. **Judge** (sandbox B: only the hidden pytest files, `toolgym_probes.py` and the records; no
   agent file, no process that ran agent code). Real pytest runs isolated (`-I`, plugin
   autoload off, our ini, no cache) and writes JUnit XML, which the host reads from the host's
   side of the filesystem. Values are parsed with `ast.literal_eval`, so nothing from sandbox
   A executes in the judge. Sandbox B is long-lived (`judge.py`): pytest is imported once and
   each judgement runs in its own forked process and directory.

Both sandboxes have a read-only root filesystem. A sentinel test that must fail and a count of
the hidden tests guard against a judge that did not really run.
"""

from __future__ import annotations

import functools
import json
import secrets
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable

from toolgym.sandbox import SandboxConfig, SandboxError
from toolgym.tasks import Task
from toolgym.verifiers._grader.records import parse_probe_records
from toolgym.verifiers.grading import grading_sandbox
from toolgym.verifiers.judge import JudgeService, grader_source, judge_service
from toolgym.verifiers.verdict import FinalState, Outcome, TestResult, Verdict

SENTINEL = "test_toolgym_sentinel"
SENTINEL_FILE = "test_toolgym_sentinel.py"
SENTINEL_CODE = f"def {SENTINEL}():\n    assert 1 == 2, 'this test must fail; if it passes, results were forged'\n"
JUDGE_INI = "[pytest]\npythonpath = .\n"
RESULTS_FILE = "probe_results.json"


@functools.cache
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


def count_tests(files: dict[str, str]) -> int:
    """Top-level `def test_...` functions in the hidden files."""
    return sum(text.count("\ndef test_") + text.startswith("def test_") for text in files.values())


class HiddenTestVerifier:
    """Grades `tests` tasks (see the module docstring); works on both sandbox backends."""

    name = "hidden-tests"

    def __init__(self, config: SandboxConfig | None = None, on_sandbox: Callable | None = None) -> None:
        self.config = config or SandboxConfig()
        self.on_sandbox = on_sandbox  # test hook: sees the probe sandbox once it exists

    def verify(self, task: Task, final_state: FinalState) -> Verdict:
        """Grade the agent's workspace changes against the task's hidden tests."""
        start = time.perf_counter()
        hidden = task.hidden
        if not hidden.probes:
            return Verdict(
                reward=0.0,
                passed=False,
                outcome=Outcome.VERIFIER_ERROR,
                duration_s=0.0,
                reason=f"task {task.id} has hidden tests but no probes: hidden tests judge probe results "
                "and never import the agent's code (see HiddenSpec)",
            )
        try:
            # fetched (on first use, started) before the probes: a judge that dies while they run
            # fails this grading as the grader's fault, not silently replaced by a new one
            service = judge_service(self.config)
        except Exception as err:  # whatever stops the judge is ours: an infra error, never the agent's
            return self._verdict(
                0.0, False, Outcome.INFRA_ERROR, [], f"could not build the judge sandbox: {type(err).__name__}: {err}", start, []
            )
        stages: dict[str, float] = {}  # where the time went (the verdict's details carry it)
        outcome = self._run_probes(task, final_state, stages)
        tamper = outcome.pop("tamper")
        if "error" in outcome:
            return self._verdict(0.0, False, Outcome.INFRA_ERROR, [], outcome["error"], start, tamper)
        judged = time.perf_counter()
        verdict = self._judge(task, service, outcome, tamper, start)
        verdict.details["stages_s"] = {**stages, "judge": time.perf_counter() - judged}
        return verdict

    # ---- stage 1: probes in the agent's graded workspace ----------------------------------------

    def _run_probes(self, task: Task, final_state: FinalState, stages: dict[str, float]) -> dict:
        hidden = task.hidden
        probe_dir = f".toolgym-probe-{secrets.token_hex(6)}"
        spec = {"per_probe_s": min(10.0, hidden.timeout_s / 2), "probes": [p.model_dump() for p in hidden.probes]}
        extra = {f"{probe_dir}/run.py": grader_source("probe_runner.py"), f"{probe_dir}/probes.json": json.dumps(spec)}
        built = time.perf_counter()
        try:
            box, dropped = grading_sandbox(task, final_state.changes, self.config, final_state.modes, extra)
        except (SandboxError, OSError) as err:
            return {"error": f"could not build the grading sandbox: {err}", "tamper": []}
        tamper = [{"kind": "test_tamper", "path": p, "detail": "change to a protected path dropped before grading"} for p in dropped]
        try:
            if self.on_sandbox:
                self.on_sandbox(box)
            seen = len(box.events())
            ran = time.perf_counter()
            stages["probe_sandbox"] = ran - built
            res = box.exec(f"python3 -I {probe_dir}/run.py {probe_dir}/probes.json", timeout_s=hidden.timeout_s)
            stages["probes"] = time.perf_counter() - ran
            if getattr(box, "closed", False) or getattr(box, "closing", False):
                raise SandboxError("the grading sandbox was closed during grading")
            # What the agent's code did while it was being graded is its side effect too.
            tamper += [{"kind": e.kind.value, "path": e.path, "detail": f"while graded: {e.detail}"} for e in box.events()[seen:]]
        except SandboxError as err:
            return {"error": f"grading sandbox failed: {err}", "tamper": tamper}
        finally:
            box.close()
        # Only the task's own probes count: a record under any other id (extra lines on the
        # channel) is ignored, and reported, never mistaken for a missing or a passing probe.
        ids = {p.id for p in hidden.probes}
        records = parse_probe_records(res.stdout)
        unknown = sorted(set(records) - ids)
        return {
            "records": {k: v for k, v in records.items() if k in ids},
            "unknown": unknown,
            "timed_out": res.timed_out,
            "exit_code": res.exit_code,
            "stderr": res.stderr[-300:],
            "dropped": dropped,
            "tamper": tamper,
        }

    # ---- stage 2: the judge, where no agent code ever ran ---------------------------------------

    def _judge(self, task: Task, service: JudgeService, probes: dict, tamper: list[dict], start: float) -> Verdict:
        """Stage 2: the hidden tests, our sentinel and the probe records, judged by real pytest."""
        hidden = task.hidden
        files = dict(hidden.files)
        files.update(
            {
                SENTINEL_FILE: SENTINEL_CODE,
                "pytest.ini": JUDGE_INI,
                "toolgym_probes.py": grader_source("toolgym_probes.py"),
                RESULTS_FILE: json.dumps(probes["records"]),
            }
        )
        try:
            res = service.judge(files, hidden.timeout_s)
            if res.exit_code < 0:
                raise SandboxError(
                    f"the judge was killed (signal {-res.exit_code}; it times out after {hidden.timeout_s}s): {res.output[-200:]}"
                )
            if res.junit is None:
                raise SandboxError(f"the judge wrote no report (exit code {res.exit_code}): {res.output[-300:]}")
            xml_text = res.junit
        except SandboxError as err:
            return self._verdict(0.0, False, Outcome.VERIFIER_ERROR, [], f"the judge failed: {err}", start, tamper)
        try:
            tests = parse_junit(xml_text)
        except ET.ParseError as err:
            return self._verdict(0.0, False, Outcome.VERIFIER_ERROR, [], f"judge report is not valid XML ({err})", start, tamper)
        sentinel = [t for t in tests if t.name.endswith(SENTINEL)]
        if len(sentinel) != 1 or sentinel[0].passed:
            return self._verdict(
                0.0,
                False,
                Outcome.VERIFIER_ERROR,
                [],
                "the judge's sentinel test is missing or passed: the judge did not run as it should",
                start,
                tamper,
            )
        tests = [t for t in tests if not t.name.endswith(SENTINEL)]
        expected = count_tests(hidden.files)
        if len(tests) < expected:
            return self._verdict(
                0.0,
                False,
                Outcome.VERIFIER_ERROR,
                tests,
                f"only {len(tests)} of {expected} hidden tests ran in the judge: {res.output[-300:]}",
                start,
                tamper,
            )
        passed = sum(t.passed for t in tests)
        ok = passed == len(tests)
        reward = float(ok) if hidden.all_or_nothing else passed / max(1, len(tests))
        records = probes["records"]
        timed_out = probes["timed_out"] or any(r.get("error") == "Timeout" for r in records.values())
        if timed_out and not ok:
            return self._verdict(
                0.0, False, Outcome.TIMEOUT, tests, f"the code under test timed out (limit {hidden.timeout_s}s)", start, tamper
            )
        missing = len({p.id for p in hidden.probes} - set(records))
        reason = f"{passed}/{len(tests)} hidden tests passed"
        if missing:
            reason += (
                f"; {missing} of {len(hidden.probes)} probes gave no result (exit code {probes['exit_code']}: {probes['stderr'][-150:]!r})"
            )
        if probes["unknown"]:
            reason += f"; ignored {len(probes['unknown'])} records for unknown probe ids"
        if probes["dropped"]:
            reason += f"; dropped edits to {probes['dropped']}"
        return self._verdict(reward, ok, Outcome.PASSED if ok else Outcome.FAILED, tests, reason, start, tamper)

    @staticmethod
    def _verdict(
        reward: float, passed: bool, outcome: Outcome, tests: list[TestResult], reason: str, start: float, tamper: list[dict]
    ) -> Verdict:
        return Verdict(
            reward=reward,
            passed=passed,
            outcome=outcome,
            tests=tests,
            reason=reason,
            duration_s=time.perf_counter() - start,
            details={"side_effects": tamper},
        )


__all__ = ["HiddenTestVerifier", "count_tests", "grader_source", "parse_junit", "parse_probe_records"]
