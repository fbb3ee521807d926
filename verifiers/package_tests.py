"""`PackageTestVerifier`: a mined task is passed only if the project's own tests pass AND the
agent's function behaves like the pristine one where no agent code decides (mined tasks).

The project's tests must import the agent's code, so their results come from a process the
agent's code controls: from inside it, code can read every test it runs, tell a sentinel from a
real test and forge one but not the other. Those results are therefore a required signal, never
the decision alone. Grading has two parts:

1. **Differential checks, decided outside** (`verifiers/differential.py`). First, in a fresh
   grading sandbox that holds the agent's workspace and none of the hidden tests, a probe process
   calls the agent's function on the inputs recorded at mining time (calls the passing tests
   made, the withheld test's calls, generated inputs) and prints what it observed as plain data.
   The host compares those records with the pristine function's, stored as data in the task and
   never present in any sandbox. Then a reset removes every trace of the probe.
2. **The package's tests**, in the same sandbox after the reset, hardened as before:
   - *Isolated start.* The pristine project plus the agent's changes to non-protected paths; edits
     to tests, `conftest.py`, test data, `pytest.py`, `_pytest`, `.pth`, `sitecustomize`,
     `pyproject.toml`/`setup.cfg`/`tox.ini` are dropped and reported as tampering. `python3 -I`
     with plugin autoload off, the grader's own ini, no cache provider, no bytecode written or
     read from the workspace (`pytest_command`), a read-only root filesystem.
   - *One process per hidden test file*, each from the same restored state.
   - *Grading copies*: every test under an opaque name, only the selected tests kept.
   - *Sentinels*: real tests with one expected value changed, which correct code fails; a run in
     which one passes, or which exits 0 although sentinels must fail, forged its results.
   - *Results on the host side*: the JUnit report, every expected test in it.

A run whose package tests all pass while a differential check fails is `failed` with a
`test_tamper` event ("inconsistent results"): that disagreement is the signature of forging.

What is still not stopped (see the README's threat model): an agent that knows the pristine
code's result on every recorded input without fixing the bug (the inputs are hidden and mostly
generated; knowing all their answers is knowing the fix); a correct but different fix that
behaves otherwise on an input (a different exception type on a generated input is not counted:
generated inputs check results only).
"""

from __future__ import annotations

import posixpath
import secrets
import shlex
import time
import xml.etree.ElementTree as ET

from toolgym.sandbox import SandboxConfig, SandboxError, with_site_layer
from toolgym.tasks import Task
from toolgym.verifiers.differential import PROBE_ENV, judge, probe_files
from toolgym.verifiers.grading import apply_modes, grading_sandbox
from toolgym.verifiers.hidden_tests import parse_probe_records
from toolgym.verifiers.verdict import FinalState, Outcome, TestResult, Verdict

#: Seconds all of a task's differential checks may take together (each has `PER_CASE_S`).
DIFFERENTIAL_TIMEOUT_S = 60.0

TEST_ENV = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0"}


#: The grader's Python start-up: pytest, its built-in plugins and the report's XML module load
#: from the read-only root filesystem with the image's own bytecode (compiling them from source
#: took 0.35 s per process); then `sys.pycache_prefix` points at an empty directory, so every
#: later import (the workspace, the tests) compiles from source: no bytecode planted in the
#: workspace, or left by an earlier run, is ever read. `-I` keeps the workspace off the path
#: until pytest puts it there.
PYTEST_PRELOAD = """import importlib, sys
import pytest
from _pytest.config import default_plugins
for _name in default_plugins:
    try:
        importlib.import_module("_pytest." + _name)
    except ImportError:
        pass
import pdb, xml.etree.ElementTree
"""
PYTEST_BOOT = (
    PYTEST_PRELOAD
    + """sys.pycache_prefix = sys.argv.pop(1)
sys.argv[0] = "pytest"
raise SystemExit(pytest.console_main())
"""
)


def pytest_command(args: str) -> str:
    """Shell command running `pytest ARGS` under the grader's start-up (see `PYTEST_BOOT`)."""
    return f"python3 -I -B -c {shlex.quote(PYTEST_BOOT)} /tmp/.toolgym-pyc-{secrets.token_hex(4)} {args}"


def pytest_ini(pythonpath: tuple[str, ...]) -> str:
    """The grader's pytest configuration (the project's own never applies): the import path only."""
    paths = " ".join("/workspace" if p in (".", "") else f"/workspace/{p.strip('/')}" for p in pythonpath)
    return f"[pytest]\npythonpath = {paths}\n"


def junit_keys(xml_text: str, module: str) -> dict[str, tuple[bool, str]]:
    """{test key: (passed, message)} from a JUnit report of the grading copy `module`
    (keys as in node ids after the file: `Class::test_x[1]`)."""
    out: dict[str, tuple[bool, str]] = {}
    for case in ET.fromstring(xml_text).iter("testcase"):
        classname, name = case.get("classname", ""), case.get("name", "")
        _, found, classes = classname.partition(module)
        if not found:
            continue
        key = "::".join([c for c in classes.split(".") if c] + [name])
        bad = next((child for child in case if child.tag in ("failure", "error", "skipped")), None)
        out[key] = (bad is None, "" if bad is None else f"{bad.tag}: {(bad.get('message') or '')[:200]}")
    return out


class PackageTestVerifier:
    """Grades `package-tests` tasks (see the module docstring); works on both sandbox backends."""

    name = "package-tests"

    def __init__(self, config: SandboxConfig | None = None, pool=None) -> None:
        self.config = config or SandboxConfig()
        self.pool = pool  # docker: a WarmPool started for this config and the tasks' site layer

    def verify(self, task: Task, final_state: FinalState) -> Verdict:
        """Run every grading copy against the agent's workspace; see the module docstring."""
        start = time.perf_counter()
        hidden = task.hidden
        if not hidden.runs or any(run.file not in hidden.files for run in hidden.runs):
            return self._verdict(
                0.0, Outcome.VERIFIER_ERROR, [], f"task {task.id}: package-tests needs runs whose files are in hidden.files", start, []
            )
        names = {run.file: posixpath.join(posixpath.dirname(run.file), f"test_{secrets.token_hex(5)}.py") for run in hidden.runs}
        ini = f".toolgym-grade-{secrets.token_hex(5)}/pytest.ini"
        copies = {names[run.file]: hidden.files[run.file] for run in hidden.runs}
        copies[ini] = pytest_ini(hidden.runs[0].pythonpath)
        # The differential probe runs first, in a sandbox that holds no hidden test (a grading
        # copy's assertions would give its inputs' expected values away); the copies are written
        # only after a reset has removed every trace of the probe.
        probe_command, probe_files_ = probe_files(hidden.differential) if hidden.differential else ("", {})
        try:
            config = with_site_layer(self.config.model_copy(update={"canary": False}), task.data.get("site_layer"))
            box, dropped = grading_sandbox(task, final_state.changes, config, final_state.modes, probe_files_ or copies, self.pool)
        except (SandboxError, OSError) as err:
            return self._verdict(0.0, Outcome.INFRA_ERROR, [], f"could not build the grading sandbox: {err}", start, [])
        tamper = [{"kind": "test_tamper", "path": p, "detail": "change to a protected path dropped before grading"} for p in dropped]
        tests: list[TestResult] = []
        problems: list[str] = []
        timed_out = False
        records: dict[str, dict] = {}
        try:
            if probe_command:
                res = box.exec(probe_command, timeout_s=min(hidden.timeout_s, DIFFERENTIAL_TIMEOUT_S), env=PROBE_ENV)
                tamper += [{"kind": e.kind.value, "path": e.path, "detail": f"while graded: {e.detail}"} for e in box.events()]
                records = parse_probe_records(res.stdout)
                if res.timed_out:
                    timed_out = True
                    problems.append(f"the differential checks ran past {DIFFERENTIAL_TIMEOUT_S:.0f}s")
                box.reset()
                apply_modes(box, task, final_state.changes, final_state.modes, dropped)
                box.write_files(copies)
            snap = box.snapshot()
            for i, run in enumerate(hidden.runs):
                if i:
                    box.restore(snap)
                seen = len(box.events())
                report = f".toolgym-results-{secrets.token_hex(6)}/junit.xml"
                # no bytecode is written, and none planted in the workspace (`__pycache__`) or
                # left by an earlier run is ever read (mtimes have a one-second grain: a same-size
                # edit in the same second would reuse stale code); see PYTEST_BOOT
                cmd = pytest_command(
                    f"-c {ini} --rootdir /workspace -p no:cacheprovider -q --no-header "
                    f"-o junit_family=xunit1 --junitxml={report} {names[run.file]}"
                )
                res = box.exec(cmd, timeout_s=hidden.timeout_s, env=TEST_ENV)
                tamper += [{"kind": e.kind.value, "path": e.path, "detail": f"while graded: {e.detail}"} for e in box.events()[seen:]]
                if res.timed_out:
                    timed_out = True
                    problems.append(f"{run.file}: the tests ran past {hidden.timeout_s}s")
                    continue
                try:
                    xml_text = box.read_host_bytes(report).decode("utf-8", errors="replace")
                    results = junit_keys(xml_text, posixpath.basename(names[run.file])[:-3])
                except (SandboxError, ET.ParseError):
                    # The process imported the agent's code: a run that wrote no report is the code's failure.
                    problems.append(
                        f"{run.file}: the test process wrote no readable report (exit code {res.exit_code}: "
                        f"{(res.stdout + res.stderr)[-200:]!r})"
                    )
                    continue
                forged = [k for k in run.sentinels if results.get(k, (False, ""))[0]]
                if forged or (run.sentinels and res.exit_code == 0):
                    tamper.append(
                        {
                            "kind": "test_tamper",
                            "path": run.file,
                            "detail": f"forged test results: {len(forged)} sentinel test(s) that fail on any "
                            f"code passed (exit code {res.exit_code})",
                        }
                    )
                    problems.append(f"{run.file}: results were forged (a sentinel passed)")
                for key in run.passing:
                    ok, message = results.get(key, (False, "missing from the report: it did not run"))
                    tests.append(TestResult(name=f"{run.file}::{key}", passed=ok, message=message))
        except SandboxError as err:
            return self._verdict(0.0, Outcome.INFRA_ERROR, tests, f"grading sandbox failed: {err}", start, tamper)
        finally:
            box.close()
        package_ok = not problems and len(tests) > 0 and all(t.passed for t in tests)
        checks = judge(hidden.differential, records)
        differing = sum(not c.passed for c in checks)
        if package_ok and differing:
            # The tests passed in the process the agent's code controls, while that code does
            # not behave as the pristine one outside it: the signature of forged results.
            tamper.append(
                {
                    "kind": "test_tamper",
                    "path": task.metadata.get("file", ""),
                    "detail": f"inconsistent results: the package's tests passed, but {differing} of "
                    f"{len(checks)} differential checks, run outside the test process, failed",
                }
            )
        tests += checks
        passed = sum(t.passed for t in tests)
        forged = any(e["kind"] == "test_tamper" and e["detail"].startswith(("forged", "inconsistent")) for e in tamper)
        ok = package_ok and not differing
        reward = float(ok) if hidden.all_or_nothing or forged else passed / max(1, len(tests))
        reason = f"{passed}/{len(tests)} hidden tests passed"
        if checks:
            reason += f" ({len(checks) - differing}/{len(checks)} differential checks)"
        if problems:
            reason += f"; {'; '.join(problems)}"
        if dropped:
            reason += f"; dropped edits to {dropped}"
        outcome = Outcome.PASSED if ok else Outcome.TIMEOUT if timed_out and not forged else Outcome.FAILED
        return self._verdict(reward, outcome, tests, reason, start, tamper)

    @staticmethod
    def _verdict(reward: float, outcome: Outcome, tests: list[TestResult], reason: str, start: float, tamper: list[dict]) -> Verdict:
        return Verdict(
            reward=reward,
            passed=outcome == Outcome.PASSED,
            outcome=outcome,
            tests=tests,
            reason=reason,
            duration_s=time.perf_counter() - start,
            details={"side_effects": tamper},
        )


__all__ = ["PYTEST_PRELOAD", "PackageTestVerifier", "junit_keys", "pytest_command", "pytest_ini"]
