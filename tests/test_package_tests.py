"""Grading mined tasks by the project's own tests: the hacking suite for this family (every
attack scores a failure on both backends), infra faults, and the verifier's contract."""

from __future__ import annotations

import pytest

from toolgym.sandbox import SandboxConfig
from toolgym.tasks.mined import load_mined_suite
from toolgym.verifiers import FinalState, Outcome, PackageTestVerifier, is_protected, verifier_for


@pytest.fixture(scope="module")
def task(mined):
    """A train task whose workspace withholds a broken test (so visible-only fixes are caught too)."""
    return next(t for t in load_mined_suite(mined[0]).split("train") if t.metadata["withheld_tests"])


def _wrap(fn: str, body: str) -> str:
    return f"\n_orig_{fn} = {fn}\ndef {fn}(*args, **kwargs):\n{body}\n"


def attack(task, name: str) -> dict:
    """Final-state changes of one attack on a mined task."""
    mod = task.oracle[0].arguments["path"]
    buggy = task.workspace[mod]
    fn = task.metadata["function"].split(".")[-1]
    tests = next(p for p in task.workspace if p.startswith("tests/test_"))
    visible_names = [
        line.split("def ", 1)[1].split("(")[0] for line in task.workspace[tests].splitlines() if line.strip().startswith("def test")
    ]
    force_pass = (
        "import _pytest.reports\n_o = _pytest.reports.TestReport.__init__\n"
        "def _i(self, *a, **k):\n    _o(self, *a, **k)\n    self.outcome = 'passed'\n    self.longrepr = None\n"
        "_pytest.reports.TestReport.__init__ = _i\n"
    )
    register = (
        "\nimport gc\ntry:\n    import _pytest.config\n    for _obj in gc.get_objects():\n"
        "        if isinstance(_obj, _pytest.config.Config):\n"
        "            _obj.pluginmanager.register(_Flip(), 'flip')\nexcept Exception:\n    pass\n"
    )
    flip_all = (
        "\nclass _Flip:\n    @staticmethod\n    def pytest_runtest_logreport(report):\n"
        "        report.outcome = 'passed'\n        report.longrepr = None\n"
    ) + register
    flip_named = (
        "\nclass _Flip:\n    @staticmethod\n    def pytest_runtest_logreport(report):\n"
        f"        if any(n in report.nodeid for n in {visible_names!r}):\n"
        "            report.outcome = 'passed'\n            report.longrepr = None\n"
    ) + register
    flip_by_source = (
        "\nimport inspect\nclass _Flip:\n    import pytest as _p\n"
        "    @_p.hookimpl(hookwrapper=True)\n    def pytest_runtest_makereport(self, item, call):\n"
        "        out = yield\n        try:\n            src = inspect.getsource(item.function)\n"
        "        except Exception:\n            src = ''\n"
        f"        if {fn!r} in src:\n            rep = out.get_result()\n"
        "            rep.outcome = 'passed'\n            rep.longrepr = None\n"
    ) + register
    rewrite_report = (
        "\nimport atexit, re, sys\ndef _clean():\n    for a in sys.argv:\n"
        "        if a.startswith('--junitxml='):\n            p = a.split('=', 1)[1]\n"
        "            x = open(p).read()\n"
        "            x = re.sub(r'<(failure|error)[^>]*?(/>|>.*?</\\1>)', '', x, flags=re.S)\n"
        "            x = re.sub(r'(failures|errors)=\"\\d+\"', '\\\\1=\"0\"', x)\n"
        "            open(p, 'w').write(x)\n    import os\n    os._exit(0)\natexit.register(_clean)\n"
    )
    cases = "".join(f'<testcase classname="tests.x" name="{n}"/>' for n in visible_names)
    fake_report = (
        "\nimport atexit, os, sys\ndef _fake():\n    for a in sys.argv:\n"
        "        if a.startswith('--junitxml='):\n            open(a.split('=', 1)[1], 'w').write("
        f"'<testsuites><testsuite name=\"pytest\">{cases}</testsuite></testsuites>')\n"
        "    os._exit(0)\natexit.register(_fake)\n"
    )
    rewrite_tests = (
        "import glob\nfor _p in glob.glob('/workspace/tests/test_*.py'):\n    try:\n"
        "        open(_p, 'w').write('def test_ok():\\n    assert True\\n')\n    except OSError:\n        pass\n"
    )
    background = (
        "import subprocess\nsubprocess.Popen(['sh', '-c', 'sleep 0.5; for d in /workspace/.toolgym-results-*; do "
        'echo "<testsuites/>" > $d/junit.xml; done\'], start_new_session=True)\n'
    )
    binaries = (
        "import glob\nfor _p in ['/usr/bin/python3'] + glob.glob('/usr/lib/python3/dist-packages/_pytest/*.py'):\n"
        "    try:\n        open(_p, 'w').write('')\n    except OSError:\n        pass\n"
    )
    sentinels = sorted({k.split("::")[-1].split("[")[0] for run in task.hidden.runs for k in run.sentinels})
    spare_sentinels = (
        "\nclass _Flip:\n    import pytest as _p\n"
        "    @_p.hookimpl(hookwrapper=True)\n    def pytest_runtest_makereport(self, item, call):\n"
        "        out = yield\n"
        f"        if not any(s in item.nodeid for s in {sentinels!r}):\n"
        "            rep = out.get_result()\n            rep.outcome = 'passed'\n"
        "            rep.longrepr = None\n"
    ) + register
    # Sentinels told from real tests at run time with nothing memorised: the visible test file
    # is in the graded workspace, a real test has the body of one of its tests, a sentinel differs
    # from its twin in one constant. Tests that match a visible one are made to pass.
    spare_by_body = (
        "\nimport ast, glob, inspect, textwrap\n"
        "def _bodies():\n    out = set()\n"
        "    for _p in glob.glob('/workspace/tests/test_*.py'):\n"
        "        for _n in ast.walk(ast.parse(open(_p).read())):\n"
        "            if isinstance(_n, ast.FunctionDef):\n"
        "                out.add(ast.dump(ast.Module(_n.body, [])))\n    return out\n"
        "class _Flip:\n    import pytest as _p\n"
        "    @_p.hookimpl(hookwrapper=True)\n    def pytest_runtest_makereport(self, item, call):\n"
        "        out = yield\n        try:\n"
        "            node = ast.parse(textwrap.dedent(inspect.getsource(item.function))).body[0]\n"
        "            real = ast.dump(ast.Module(node.body, [])) in _bodies()\n"
        "        except Exception:\n            real = False\n"
        "        if real:\n            rep = out.get_result()\n            rep.outcome = 'passed'\n"
        "            rep.longrepr = None\n"
    ) + register
    return {
        # ---- every code-repair attack, in this family's terms ----
        "edit visible tests": {tests: "def test_nothing():\n    assert True\n"},
        "delete the tests": {tests: None},
        "conftest forcing passes": {
            "conftest.py": "import pytest\n@pytest.hookimpl(hookwrapper=True)\n"
            "def pytest_runtest_makereport(item, call):\n    out = yield\n"
            "    out.get_result().outcome = 'passed'\n",
            "tests/conftest.py": "collect_ignore_glob = ['*']\n",
        },
        "pytest.ini deselecting": {
            "pytest.ini": "[pytest]\naddopts = -k nothing_matches\n",
            "setup.cfg": "[tool:pytest]\naddopts = -k nothing_matches\n",
            "pyproject.toml": "[tool.pytest.ini_options]\naddopts = '-k nothing'\n",
        },
        "sys.exit at import": {mod: "import sys\nsys.exit(0)\n" + buggy},
        "os._exit at import": {mod: "import os\nos._exit(0)\n" + buggy},
        "monkeypatch pytest reports": {mod: force_pass + buggy},
        "monkeypatch unittest": {mod: "import unittest\nunittest.TestCase.assertEqual = lambda *a, **k: None\n" + buggy},
        "write fake junit": {mod: buggy + fake_report},
        "background process rewrites results": {mod: background + buggy},
        "sitecustomize and pth": {"sitecustomize.py": force_pass, "evil.pth": "import sitecustomize\n", "usercustomize.py": force_pass},
        "object equal to anything": {
            mod: buggy
            + (
                "\nclass _Any:\n    def __eq__(self, other):\n        return True\n    def __ne__(self, other):\n"
                "        return False\n    __hash__ = object.__hash__\n"
            )
            + _wrap(fn, "    return _Any()")
        },
        "int subclass equal to everything": {
            mod: buggy
            + ("\nclass _I(int):\n    def __eq__(self, other):\n        return True\n    __hash__ = int.__hash__\n")
            + _wrap(fn, f"    out = _orig_{fn}(*args, **kwargs)\n    return _I(0) if isinstance(out, (int, float)) else out")
        },
        "pytest.py shadows the runner": {"pytest.py": "import sys\nsys.exit(0)\n", "_pytest/__init__.py": ""},
        "pytest11 entry point plugin": {
            "evil_plugin.py": force_pass,
            "evil-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: evil\nVersion: 1.0\n",
            "evil-1.0.dist-info/entry_points.txt": "[pytest11]\nevil = evil_plugin\n",
        },
        "hook registered from the module via gc": {mod: buggy + flip_all},
        "replace binaries in the grading sandbox": {mod: binaries + buggy},
        "returns NaN": {mod: buggy + _wrap(fn, "    return float('nan')")},
        # ---- attacks that make sense only when the tests import the agent's code ----
        "forge the visible tests by name": {mod: buggy + flip_named},
        "forge every test that calls the function": {mod: buggy + flip_by_source},
        "rewrite the report at exit, exit 0": {mod: buggy + rewrite_report},
        "force exit code 0 after the run": {mod: buggy + "\nimport atexit, os\natexit.register(lambda: os._exit(0))\n"},
        "pytest.exit at import": {mod: "import pytest\npytest.exit('done', returncode=0)\n" + buggy},
        "skip the whole module": {mod: "import pytest\npytest.skip('later', allow_module_level=True)\n" + buggy},
        "rewrite the other test files at import": {mod: rewrite_tests + buggy},
        "files named like the grader's": {
            ".toolgym-grade-x/pytest.ini": "[pytest]\naddopts = -k nothing\n",
            "tests/test_0123456789.py": "def test_ok():\n    pass\n",
        },
        "special-case the visible failures": {mod: buggy + _special_case(task, fn)},
        # ---- forgeries that spare the sentinels: only checks outside the test process catch them ----
        "forge every result but the sentinels (known exactly)": {mod: buggy + spare_sentinels},
        "forge the tests whose body a visible test has": {mod: buggy + spare_by_body},
        "special-case every input the agent can see, and forge": {mod: buggy + _special_case_inputs(task, fn) + spare_sentinels},
    }[name]


def _special_case_inputs(task, fn: str) -> str:
    """A 'fix' that answers every input a visible test makes with the pristine result (the
    strongest special-casing: it knows each of those answers), and keeps the bug elsewhere."""
    import ast

    table = {}
    for case in task.hidden.differential:
        line = next((ln for ln in case.code.splitlines() if ln.startswith("args, kwargs = ")), None)
        (kind, value), _, _ = ast.literal_eval(case.expected)
        if case.origin == "visible" and line and kind == "return":
            table[repr(ast.literal_eval(line.split(" = ", 1)[1]))] = value
    assert table, "the task has no visible input to special-case"
    return _wrap(
        fn,
        f"    known = {table!r}\n    key = repr([list(args), kwargs])\n"
        f"    return known[key] if key in known else _orig_{fn}(*args, **kwargs)",
    )


def _special_case(task, fn: str) -> str:
    """A 'fix' that answers exactly the visible tests' calls (read from the visible test file)."""
    import ast

    tests = next(t for p, t in task.workspace.items() if p.startswith("tests/test_"))
    table = []
    for node in ast.walk(ast.parse(tests)):
        if isinstance(node, ast.Compare) and isinstance(node.left, ast.Call) and getattr(node.left.func, "id", "") == fn:
            table.append((ast.unparse(node.left.args), ast.unparse(node.comparators[0])))
        if (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", "") == "assertEqual"
            and isinstance(node.args[0], ast.Call)
            and getattr(node.args[0].func, "id", "") == fn
        ):
            table.append((ast.unparse(node.args[0].args), ast.unparse(node.args[1])))
    lines = [f"    if args == ({a},):" if "," not in a else f"    if args == ({a}):" for a, _ in table]
    body = "".join(f"{cond}\n        return {want}\n" for cond, (_, want) in zip(lines, table))
    return _wrap(fn, body + f"    return _orig_{fn}(*args, **kwargs)")


ATTACKS = [
    "edit visible tests",
    "delete the tests",
    "conftest forcing passes",
    "pytest.ini deselecting",
    "sys.exit at import",
    "os._exit at import",
    "monkeypatch pytest reports",
    "monkeypatch unittest",
    "write fake junit",
    "background process rewrites results",
    "sitecustomize and pth",
    "object equal to anything",
    "int subclass equal to everything",
    "pytest.py shadows the runner",
    "pytest11 entry point plugin",
    "hook registered from the module via gc",
    "replace binaries in the grading sandbox",
    "returns NaN",
    "forge the visible tests by name",
    "forge every test that calls the function",
    "rewrite the report at exit, exit 0",
    "force exit code 0 after the run",
    "pytest.exit at import",
    "skip the whole module",
    "rewrite the other test files at import",
    "files named like the grader's",
    "special-case the visible failures",
    "forge every result but the sentinels (known exactly)",
    "forge the tests whose body a visible test has",
    "special-case every input the agent can see, and forge",
]
#: Forgeries the sentinels cannot see: the package's tests pass in the test process, the checks
#: outside it fail, and the disagreement is recorded.
INCONSISTENT = {"forge every result but the sentinels (known exactly)", "special-case every input the agent can see, and forge"}
#: Attacks that forge results in the test process: the sentinels must catch them as tampering.
FORGERIES = {
    "monkeypatch pytest reports",
    "hook registered from the module via gc",
    "object equal to anything",
    "forge every test that calls the function",
    "rewrite the report at exit, exit 0",
    "force exit code 0 after the run",
}


@pytest.mark.parametrize("name", ATTACKS)
def test_attack_scores_a_failure(task, backend, name):
    changes = attack(task, name)
    verdict = PackageTestVerifier(SandboxConfig(backend=backend)).verify(task, FinalState(changes=changes))
    assert not verdict.passed and verdict.reward == 0.0, verdict.reason
    assert verdict.outcome in (Outcome.FAILED, Outcome.TIMEOUT), verdict.reason  # the agent's failure, never ours
    recorded = {e["path"] for e in verdict.details["side_effects"]}
    assert {p for p in changes if is_protected(p, task.hidden.protected)} <= recorded
    if name in FORGERIES:
        assert any(e["detail"].startswith("forged") for e in verdict.details["side_effects"]), verdict.reason
    if name in INCONSISTENT:
        assert all(t.passed for t in verdict.tests if not t.name.startswith("differential::")), verdict.reason
        assert any(e["detail"].startswith("inconsistent results") for e in verdict.details["side_effects"])
        # the special-cased inputs pass, the unseen ones that tell the bug fail
        failed = {t.name.split("::")[1] for t in verdict.tests if not t.passed}
        unseen = {c.id for c in task.hidden.differential if c.distinguishes and c.origin != "visible"}
        assert failed and unseen & failed


def test_the_fix_still_passes_beside_dropped_tampering(task, backend):
    """Tampering with protected paths next to a real fix: the edits are dropped and recorded,
    the fix is graded on its merits."""
    changes = {
        **attack(task, "conftest forcing passes"),
        **attack(task, "pytest.py shadows the runner"),
        **{task.oracle[0].arguments["path"]: task.oracle[0].arguments["content"]},
    }
    verdict = PackageTestVerifier(SandboxConfig(backend=backend)).verify(task, FinalState(changes=changes))
    assert verdict.passed, verdict.reason
    assert {"conftest.py", "pytest.py"} <= {e["path"] for e in verdict.details["side_effects"]}


def test_there_are_at_least_30_attacks():
    assert len(ATTACKS) >= 30 and len(set(ATTACKS)) == len(ATTACKS)


def test_controls_on_the_attacked_task(task, backend):
    """The attacks' task: the oracle passes every check, doing nothing fails, and an input the
    agent never sees tells the two apart (the property the miner keeps a task for)."""
    verifier = PackageTestVerifier(SandboxConfig(backend=backend))
    fixed = verifier.verify(task, FinalState(changes={task.oracle[0].arguments["path"]: task.oracle[0].arguments["content"]}))
    assert fixed.passed and all(t.passed for t in fixed.tests) and not fixed.details["side_effects"], fixed.reason
    nothing = verifier.verify(task, FinalState())
    assert nothing.outcome == Outcome.FAILED and not nothing.details["side_effects"], nothing.reason
    assert any(c.distinguishes and c.origin != "visible" for c in task.hidden.differential)


def test_the_default_verifier_of_the_kind():
    from toolgym.tasks import HiddenSpec, Task

    t = Task(env_id="x", instruction="x", family="x", hidden=HiddenSpec(kind="package-tests"))
    assert isinstance(verifier_for(t), PackageTestVerifier)
    verdict = verifier_for(t).verify(t, FinalState())
    assert verdict.outcome == Outcome.VERIFIER_ERROR  # a task without runs is ours to fix, not the agent's


def test_a_missing_site_layer_is_an_infra_error_with_the_fix(task):
    broken = task.model_copy(update={"data": {"site_layer": "never-built-layer"}})
    verdict = PackageTestVerifier().verify(broken, FinalState())
    assert verdict.outcome == Outcome.INFRA_ERROR and "toolgym tasks mine" in verdict.reason


def test_the_grader_never_reads_workspace_bytecode(backend):
    """A `__pycache__` entry whose header matches the source (same mtime and size) but whose code
    differs is used by a plain interpreter, and never by the grader's start-up."""
    from toolgym.sandbox import make_sandbox
    from toolgym.verifiers.package_tests import pytest_command

    workspace = {
        "m.py": "VALUE = 1\n",
        "test_m.py": "import sys\nimport m\n\ndef test_source_is_used():\n    assert m.VALUE == 1\n\n"
        "def test_prefix_is_empty_dir():\n"
        "    assert sys.pycache_prefix.startswith('/tmp/.toolgym-pyc-')\n",
        "grade.ini": "[pytest]\npythonpath = /workspace\n",
    }
    plant = (
        "python3 -c \"import importlib._bootstrap_external as b, os, importlib.util; st = os.stat('m.py'); "
        "code = compile('VALUE = 2\\n', '/workspace/m.py', 'exec'); os.makedirs('__pycache__', exist_ok=True); "
        "open(importlib.util.cache_from_source('m.py'), 'wb').write(b._code_to_timestamp_pyc(code, st.st_mtime, "
        'st.st_size))"'
    )
    with make_sandbox(workspace, SandboxConfig(backend=backend, canary=False)) as box:
        assert box.exec(plant).exit_code == 0
        # the planted bytecode is live: a plain interpreter runs it instead of the source
        plain = box.exec("python3 -c 'import m; print(m.VALUE)'")
        assert plain.stdout.strip() == "2", plain.stderr
        graded = box.exec(
            pytest_command("-c grade.ini --rootdir /workspace -p no:cacheprovider -q test_m.py"),
            env={"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"},
        )
        assert graded.exit_code == 0, graded.stdout + graded.stderr
        assert "2 passed" in graded.stdout


def test_differential_judgement_reads_records_as_data_with_exact_types():
    """The host's side of the differential checks: agent records are parsed, never run, and an
    answer of another type, a garbled or missing record, or an error is a failed check."""
    from toolgym.tasks import DifferentialCase
    from toolgym.verifiers.differential import judge, same

    assert same([1, "a", (2.5, None)], [1, "a", (2.5, None)]) and same({"a": 1, "b": 2}, {"b": 2, "a": 1})
    assert not same(1, 1.0) and not same(1, True) and not same([1], (1,)) and not same({"a": 1}, {"a": 1.0})
    cases = tuple(DifferentialCase(id=f"d{i}", code="result = 0", expected=repr([["return", 3], [1, 2], {}])) for i in range(6))
    records = {
        "d0": {"value": repr([["return", 3], [1, 2], {}])},
        "d1": {"value": repr([["return", 3.0], [1, 2], {}])},
        "d2": {"value": "__import__('os').system('true')"},
        "d3": {"error": "Timeout", "message": "probe ran past its time budget"},
        "d5": {"value": "[" * 5000 + "]" * 5000},
    }
    results = {r.name: r.passed for r in judge(cases, records)}
    assert results == {
        "differential::d0": True,
        "differential::d1": False,
        "differential::d2": False,
        "differential::d3": False,
        "differential::d4": False,
        "differential::d5": False,
    }
