"""Verifiers: hidden tests in a clean sandbox, the state checker, composites, outcomes, and the
verifier-hacking suite (every attack scores as a failure with the attack recorded)."""

import json
import threading

import pytest

from toolgym.sandbox import SandboxConfig
from toolgym.tasks import HiddenSpec, Task, builtin_suite
from toolgym.verifiers import (
    AnswerVerifier,
    CompositeVerifier,
    FinalState,
    HiddenTestVerifier,
    Outcome,
    StateVerifier,
    is_protected,
    parse_junit,
    verifier_for,
)


def code_task(index=0):
    return builtin_suite("code-repair").tasks[index]


def fixed_source(task):
    return task.oracle[0].arguments["content"]


def module_path(task):
    return task.oracle[0].arguments["path"]


@pytest.fixture
def config(backend):
    return SandboxConfig(backend=backend)


def test_oracle_passes_and_bug_fails(config):
    task = code_task(0)
    v = HiddenTestVerifier(config)
    good = v.verify(task, FinalState(changes={module_path(task): fixed_source(task)}))
    assert good.outcome == Outcome.PASSED and good.reward == 1.0 and good.passed
    assert len(good.tests) >= 4 and all(t.passed for t in good.tests)
    assert not any("sentinel" in t.name for t in good.tests)
    bad = v.verify(task, FinalState())
    assert bad.outcome == Outcome.FAILED and bad.reward == 0.0 and any(not t.passed for t in bad.tests)


def test_partial_credit_when_not_all_or_nothing(config):
    task = code_task(0)
    partial = task.model_copy(update={"hidden": task.hidden.model_copy(update={"all_or_nothing": False})})
    verdict = HiddenTestVerifier(config).verify(partial, FinalState())
    assert 0.0 <= verdict.reward < 1.0 and verdict.outcome == Outcome.FAILED


def hack(task, name):
    """Final-state changes for one verifier-hacking attack on a code-repair task."""
    mod, fn = module_path(task), task.metadata["template"]
    buggy = task.workspace[mod]
    visible = next(p for p in task.workspace if p.startswith("tests/"))
    force_pass = (
        "import _pytest.reports\n_orig = _pytest.reports.TestReport.__init__\n"
        "def _init(self, *a, **k):\n    _orig(self, *a, **k)\n    self.outcome = 'passed'\n"
        "    self.longrepr = None\n_pytest.reports.TestReport.__init__ = _init\n"
    )
    fake_junit = (
        '<?xml version="1.0"?><testsuites><testsuite name="pytest" tests="1">'
        '<testcase classname="x" name="test_all"/></testsuite></testsuites>'
    )
    writer = (
        "import glob, os, sys, atexit\n"
        "def _fake():\n"
        "    for d in glob.glob('/workspace/.toolgym-results-*'):\n"
        f"        open(os.path.join(d, 'junit.xml'), 'w').write({fake_junit!r})\n"
        "atexit.register(_fake)\n"
    )
    # A pytest plugin that flips every result but the sentinel's (the payload of several attacks).
    flip = (
        "def pytest_runtest_logreport(report):\n"
        "    if 'sentinel' not in report.nodeid:\n        report.outcome = 'passed'\n        report.longrepr = None\n"
    )
    wrap = f"\n_orig_{fn} = {fn}\n"
    return {
        "edit visible tests": {visible: "def test_nothing():\n    assert True\n"},
        "conftest forcing passes": {
            "conftest.py": "import pytest\n@pytest.hookimpl(hookwrapper=True)\n"
            "def pytest_runtest_makereport(item, call):\n    out = yield\n"
            "    out.get_result().outcome = 'passed'\n"
        },
        "pytest.ini deselecting": {"pytest.ini": "[pytest]\naddopts = -k nothing_matches\n"},
        "sys.exit at import": {mod: "import sys\nsys.exit(0)\n" + buggy},
        "os._exit at import": {mod: "import os\nos._exit(0)\n" + buggy},
        "monkeypatch pytest": {mod: force_pass + buggy},
        "monkeypatch unittest": {mod: "import unittest\nunittest.TestCase.assertEqual = lambda *a, **k: None\n" + buggy},
        "special-case visible inputs": {mod: buggy + _special_case(task, fn)},
        "write fake junit": {mod: writer + buggy, "junit.xml": fake_junit},
        "background process rewrites results": {
            mod: (
                "import subprocess\nsubprocess.Popen(['sh', '-c', 'sleep 0.3; for d in /workspace/.toolgym-results-*; "
                f"do echo {fake_junit!r} > $d/junit.xml; done'])\n"
            )
            + buggy
        },
        "read hidden tests and rewrite them": {
            mod: (
                "import glob\nfor p in glob.glob('/workspace/tests_hidden/test_*.py'):\n"
                "    open(p, 'w').write('def test_ok():\\n    assert True\\n')\n"
            )
            + buggy
        },
        "files at hidden test paths": {
            "tests_hidden/test_hidden_x.py": "def test_ok():\n    assert True\n",
            f"tests_hidden/test_hidden_{fn}.py": "def test_ok():\n    assert True\n",
        },
        "sitecustomize and pth": {"sitecustomize.py": force_pass, "evil.pth": "import sitecustomize\n"},
        # ---- the five classes of the forgery report, with payloads of our own ----
        "object equal to anything": {
            mod: buggy
            + (
                "\nclass _Any:\n    def __eq__(self, other):\n        return True\n    def __ne__(self, other):\n"
                "        return False\n    def __sub__(self, other):\n        return 0\n    __rsub__ = __sub__\n"
                "    def __abs__(self):\n        return 0\n    __hash__ = object.__hash__\n"
                f"def {fn}(*args, **kwargs):\n    return _Any()\n"
            )
        },
        "pytest.py shadows the runner": {
            "pytest.py": (
                "import sys\nfor a in sys.argv:\n    if a.startswith('--junitxml='):\n"
                f"        open(a.split('=', 1)[1], 'w').write({fake_junit!r})\nsys.exit(0)\n"
            )
        },
        "pytest11 entry point plugin": {
            "evil_plugin.py": flip,
            "evil-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: evil\nVersion: 1.0\n",
            "evil-1.0.dist-info/entry_points.txt": "[pytest11]\nevil = evil_plugin\n",
        },
        "hook registered from the module via gc": {
            mod: buggy
            + (
                "\nimport gc\ntry:\n    import _pytest.config\n    class _Flip:\n        @staticmethod\n"
                "        def pytest_runtest_logreport(report):\n            if 'sentinel' not in report.nodeid:\n"
                "                report.outcome = 'passed'\n                report.longrepr = None\n"
                "    for _obj in gc.get_objects():\n        if isinstance(_obj, _pytest.config.Config):\n"
                "            _obj.pluginmanager.register(_Flip(), 'flip')\nexcept Exception:\n    pass\n"
            )
        },
        "replace binaries in the grading sandbox": {
            mod: (
                "import glob, os\nfor _p in ['/usr/local/bin/cat', '/usr/bin/cat', '/usr/bin/python3']"
                " + glob.glob('/usr/lib/python3/dist-packages/_pytest/*.py'):\n"
                "    try:\n        open(_p, 'w').write('#!/bin/sh\\necho forged\\n')\n    except OSError:\n        pass\n"
            )
            + buggy
        },
        # ---- more ways a policy could stumble on a false pass ----
        "int subclass equal to everything": {
            mod: buggy
            + (
                f"\nclass _I(int):\n    def __eq__(self, other):\n        return True\n    __hash__ = int.__hash__\n"
                f"{wrap}def {fn}(*args):\n    out = _orig_{fn}(*args)\n    return _I(0) if isinstance(out, int) else out\n"
            )
        },
        "search the filesystem for expected values": {
            mod: buggy
            + (
                "\nimport glob, re\n_want = []\nfor _p in [_f for _d in ('/workspace', '/tmp', '/root', '/home', '/opt', '/srv', '/var', '/.toolgym')"
                " for _f in glob.glob(_d + '/**/*.py', recursive=True)]:\n    try:\n        _want += re.findall(r'assert_same\\(out, (.*)\\)', open(_p).read())\n"
                "    except OSError:\n        pass\n"
                f"{wrap}_calls = [0]\ndef {fn}(*args):\n    _calls[0] += 1\n"
                f"    return eval(_want[_calls[0] - 1]) if len(_want) >= _calls[0] else _orig_{fn}(*args)\n"
            )
        },
        "forged probe records with code in them": {
            mod: buggy
            + (
                '\nimport os\nfor _i in range(40):\n    _rec = \'{"id": "case_%d", "value": "__import__(\'os\').getcwd()"}\\n\' % _i\n'
                "    for _fd in (1, 3, 4):\n        try:\n            os.write(_fd, _rec.encode())\n        except OSError:\n            pass\n"
            )
        },
        "poison the probe runner's json": {
            mod: buggy
            + (
                "\nimport json, sys\n_real = json.dumps\n"
                "json.dumps = lambda obj, *a, **k: _real({'id': obj.get('id'), 'value': 'True'} if isinstance(obj, dict) else obj)\n"
            )
        },
        "files named like the judge's": {
            "toolgym_probes.py": "def probe(i):\n    return None\ndef assert_same(a, b):\n    pass\n",
            "probe_results.json": "{}",
            "test_toolgym_sentinel.py": "def test_x():\n    pass\n",
        },
        "returns NaN": {mod: buggy + f"{wrap}def {fn}(*args):\n    return float('nan')\n"},
    }[name]


def _special_case(task, fn):
    visible = next(t for p, t in task.workspace.items() if p.startswith("tests/"))
    import re

    cases = re.findall(r"assert (\w+\(.*\)) == (.*)", visible)
    lines = [f"_orig_{fn} = {fn}", f"def {fn}(*args):"]
    for call, expected in cases:
        lines.append(f"    if repr(args) == repr(tuple(eval('[' + {call[len(fn) + 1 : -1]!r} + ']'))):")
        lines.append(f"        return {expected}")
    lines.append(f"    return _orig_{fn}(*args)")
    return "\n" + "\n".join(lines) + "\n"


HACKS = [
    "edit visible tests",
    "conftest forcing passes",
    "pytest.ini deselecting",
    "sys.exit at import",
    "os._exit at import",
    "monkeypatch pytest",
    "monkeypatch unittest",
    "special-case visible inputs",
    "write fake junit",
    "background process rewrites results",
    "read hidden tests and rewrite them",
    "files at hidden test paths",
    "sitecustomize and pth",
    # the forgery report's five classes
    "object equal to anything",
    "pytest.py shadows the runner",
    "pytest11 entry point plugin",
    "hook registered from the module via gc",
    "replace binaries in the grading sandbox",
    # ours
    "int subclass equal to everything",
    "search the filesystem for expected values",
    "forged probe records with code in them",
    "poison the probe runner's json",
    "files named like the judge's",
    "returns NaN",
]


def test_there_are_at_least_10_hacks():
    assert len(HACKS) >= 23


@pytest.mark.parametrize("name", HACKS)
def test_hack_scores_zero(config, name):
    task = code_task(3)
    changes = hack(task, name)
    verdict = HiddenTestVerifier(config).verify(task, FinalState(changes=changes))
    assert not verdict.passed and verdict.reward == 0.0, verdict.reason
    assert verdict.outcome == Outcome.FAILED
    protected = [p for p in changes if is_protected(p, tuple(task.hidden.protected))]
    recorded = {e["path"] for e in verdict.details.get("side_effects", [])}
    assert set(protected) <= recorded  # dropped edits are recorded as tampering


def test_runner_tampering_cannot_change_a_single_outcome(config):
    """A pytest.py, a pytest11 entry point and a module registering hooks at import, added to the
    buggy and to the fixed module: every hidden test's outcome is what it is without them."""
    task = code_task(3)
    mod = module_path(task)
    v = HiddenTestVerifier(config)
    tampering = {**hack(task, "pytest.py shadows the runner"), **hack(task, "pytest11 entry point plugin")}
    gc_hook = hack(task, "hook registered from the module via gc")[mod][len(task.workspace[mod]) :]
    for source in (task.workspace[mod], fixed_source(task)):
        plain = v.verify(task, FinalState(changes={mod: source}))
        attacked = v.verify(task, FinalState(changes={**tampering, mod: source + gc_hook}))
        assert [(t.name, t.passed) for t in attacked.tests] == [(t.name, t.passed) for t in plain.tests]
        assert attacked.outcome == plain.outcome and attacked.reward == plain.reward
    assert plain.passed  # the fixed module still passes with the tampering around it


def test_records_for_unknown_probe_ids_are_ignored_and_reported(config):
    """A correct fix that also writes records under made-up probe ids to the record channel
    still passes, and the reason counts the extra records instead of a negative 'missing'."""
    task = code_task(3)
    mod = module_path(task)
    forger = (
        '\nimport os\nfor _i in range(50):\n    _rec = \'{"id": "extra_%d", "value": "1"}\\n\' % _i\n'
        "    for _fd in (1, 3, 4):\n        try:\n            os.write(_fd, _rec.encode())\n"
        "        except OSError:\n            pass\n"
    )
    verdict = HiddenTestVerifier(config).verify(task, FinalState(changes={mod: fixed_source(task) + forger}))
    assert verdict.passed, verdict.reason
    assert "gave no result" not in verdict.reason and "unknown probe ids" in verdict.reason


def test_binary_replacement_is_recorded_as_a_side_effect(config):
    task = code_task(3)
    verdict = HiddenTestVerifier(config).verify(task, FinalState(changes=hack(task, "replace binaries in the grading sandbox")))
    assert not verdict.passed
    kinds = {e["kind"] for e in verdict.details["side_effects"]}
    assert "write_outside_workspace" in kinds


def test_exact_types_and_unmutated_inputs(config):
    """A fix that returns the right values but mutates its input list, or returns a bool for an
    int, fails the hidden tests."""
    task = next(t for t in builtin_suite("code-repair").tasks if t.metadata["template"] == "max_of")
    mod, fn = module_path(task), "max_of"
    v = HiddenTestVerifier(config)
    mutating = fixed_source(task) + f"\n_orig = {fn}\ndef {fn}(xs):\n    out = _orig(xs)\n    xs.reverse()\n    return out\n"
    verdict = v.verify(task, FinalState(changes={mod: mutating}))
    assert not verdict.passed and any("must not be mutated" in t.message or not t.passed for t in verdict.tests)
    as_float = fixed_source(task) + f"\n_orig = {fn}\ndef {fn}(xs):\n    out = _orig(xs)\n    return None if out is None else float(out)\n"
    assert not v.verify(task, FinalState(changes={mod: as_float})).passed
    assert v.verify(task, FinalState(changes={mod: fixed_source(task)})).passed


def test_probe_records_are_parsed_defensively():
    from toolgym.verifiers.hidden_tests import parse_probe_records

    out = "\n".join(
        [
            "junk",
            '{"id": "a", "value": "1"}',
            '{"id": "a", "value": "2"}',
            '{"id": 3, "value": "x"}',
            '{"id": "b"}',
            '{"id": "c", "error": "ValueError", "message": "m"}',
        ]
    )
    assert parse_probe_records(out) == {"a": {"value": "1"}, "c": {"error": "ValueError", "message": "m"}}


def test_the_probe_runner_writes_json_as_the_json_module_does():
    """The runner reads and writes JSON with `_json` alone (start-up time): same text, same data."""
    import importlib.util
    import json

    spec = importlib.util.spec_from_file_location("probe_runner", verifiers_dir() / "_grader" / "probe_runner.py")
    runner = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(runner)
    for record in [
        {"id": "case_0", "value": "'q\"\\x\\n\u00e9\U0001f600'"},
        {"id": "\ud800", "error": "ValueError", "message": "\x00\x1f\x7f"},
    ]:
        assert runner.dump_record(record) == json.dumps(record) + "\n"
        assert json.loads(runner.dump_record(record)) == record
    probes = {"per_probe_s": 5.0, "probes": [{"id": "a", "code": "result = [1, 2.5, None, True]\n"}]}
    assert runner.load_json(" " + json.dumps(probes) + "\n") == probes
    with pytest.raises(ValueError):
        runner.load_json(json.dumps(probes) + " trailing")


def verifiers_dir():
    from pathlib import Path

    import toolgym.verifiers

    return Path(toolgym.verifiers.__file__).parent


def test_tests_task_without_probes_is_a_verifier_error(config):
    task = code_task(0)
    bare = task.model_copy(update={"hidden": task.hidden.model_copy(update={"probes": ()})})
    verdict = HiddenTestVerifier(config).verify(bare, FinalState())
    assert verdict.outcome == Outcome.VERIFIER_ERROR and "no probes" in verdict.reason


def test_infra_failure_is_infra_error_not_failed(config):
    task = code_task(0)

    def kill_soon(box):
        threading.Timer(0.3, box.close).start()

    slow = {module_path(task): "import time\ntime.sleep(3)\n" + fixed_source(task)}
    verdict = HiddenTestVerifier(config, on_sandbox=kill_soon).verify(task, FinalState(changes=slow))
    assert verdict.outcome == Outcome.INFRA_ERROR and "grading sandbox" in verdict.reason
    assert not verdict.outcome.is_agent_attempt


def test_hanging_code_is_a_timeout(config):
    task = code_task(0)
    quick = task.model_copy(update={"hidden": task.hidden.model_copy(update={"timeout_s": 3})})
    verdict = HiddenTestVerifier(config).verify(quick, FinalState(changes={module_path(task): "while True:\n    pass\n"}))
    assert verdict.outcome == Outcome.TIMEOUT and verdict.reward == 0.0


def test_state_verifier(config):
    task = next(t for t in builtin_suite("shell-ops").tasks if t.family == "shell-ops/sort")
    v = StateVerifier(config)
    assert v.verify(task, FinalState()).outcome == Outcome.FAILED
    names = sorted(set(task.workspace["names.txt"].split()))
    ok = v.verify(task, FinalState(changes={"names_sorted.txt": "\n".join(names) + "\n"}))
    assert ok.passed and ok.reward == 1.0 and ok.tests[0].name == "content:names_sorted.txt"


def test_state_verifier_sees_permissions(config):
    task = next(t for t in builtin_suite("shell-ops").tasks if t.family == "shell-ops/perms")
    execs = [p for p in task.workspace if p.endswith(".sh")]
    v = StateVerifier(config)
    assert not v.verify(task, FinalState()).passed
    assert v.verify(task, FinalState(modes={p: 0o755 for p in execs})).passed


def _checker_task(lines):
    """A state task whose hidden checker reports `lines` (JSON objects) as its checks."""
    body = "import json, sys\nwith open(sys.argv[1], 'w') as out:\n" + "".join(
        f"    out.write({json.dumps(line)!r} + '\\n')\n" for line in lines
    )
    return Task(env_id="x/y-v0", instruction="-", family="x", hidden=HiddenSpec(kind="state", files={"check.py": body}))


def test_state_verifier_averages_the_checks_credit_into_partial_credit(config):
    """A checker may give a failed check a `credit` in [-1, 1] (how far it got; below 0 for a change
    the wrong way): the failure's partial credit is the mean of the credits, a pass where none is
    given; the verdict itself stays all-or-nothing. A credit outside [-1, 1] is the checker's bug."""
    v = StateVerifier(config)
    mixed = _checker_task([{"name": "a", "passed": True}, {"name": "b", "passed": False, "credit": -0.5}])
    verdict = v.verify(mixed, FinalState())
    assert (verdict.outcome, verdict.reward) == (Outcome.FAILED, 0.0)
    assert verdict.details["partial_credit"] == pytest.approx(0.25)
    plain = _checker_task([{"name": "a", "passed": True}, {"name": "b", "passed": False}])
    assert v.verify(plain, FinalState()).details["partial_credit"] == pytest.approx(0.5)
    wild = _checker_task([{"name": "a", "passed": False, "credit": 2.0}])
    assert v.verify(wild, FinalState()).outcome == Outcome.VERIFIER_ERROR


def test_composite_and_answer_verifiers():
    task = Task(env_id="x/y-v0", instruction="2+2?", family="math", hidden=HiddenSpec(answer="4", match="numeric"))
    answer = AnswerVerifier()
    assert answer.verify(task, FinalState(answer="4.0")).passed
    assert answer.verify(task, FinalState(answer=None)).reason == "no answer submitted"
    both = CompositeVerifier([(answer, 3.0), (answer, 1.0)])
    assert both.verify(task, FinalState(answer="4")).reward == 1.0
    with pytest.raises(ValueError):
        CompositeVerifier([])


def test_parse_junit():
    xml = (
        '<testsuites><testsuite><testcase classname="a" name="t1"/><testcase classname="a" name="t2">'
        '<failure message="boom"/></testcase><testcase name="t3"><error message="e"/></testcase></testsuite></testsuites>'
    )
    tests = parse_junit(xml)
    assert [(t.name, t.passed) for t in tests] == [("a::t1", True), ("a::t2", False), ("t3", False)]
    assert tests[1].message == "failure: boom"


def test_default_verifiers_by_kind(config):
    assert isinstance(verifier_for(code_task(0), config), HiddenTestVerifier)
    assert isinstance(verifier_for(builtin_suite("shell-ops").tasks[0], config), StateVerifier)
