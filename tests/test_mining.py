"""The miner: a real sdist, real pytest in the sandbox, AST mutants, verified tasks, splits,
determinism, resume, the suite format and the CLI's errors."""

from __future__ import annotations

import json
import re

import pytest
from conftest import run_cli
from mining_fixture import build_sdist

from toolgym.mining.miner import MineOptions
from toolgym.mining.mutate import OPERATORS, mutants
from toolgym.mining.run import mine_project
from toolgym.mining.testfiles import grading_copy, without_tests
from toolgym.sandbox import SandboxConfig
from toolgym.tasks import TaskLoadError, TaskSuite
from toolgym.tasks.mined import load_mined_suite
from toolgym.verifiers import FinalState, Outcome, PackageTestVerifier


def fix_of(task):
    return {task.oracle[0].arguments["path"]: task.oracle[0].arguments["content"]}


def test_mining_keeps_verified_tasks_in_a_held_out_split_of_other_packages(mined):
    out, reports = mined
    suite = TaskSuite.load(out)  # the mined format loads through the ordinary entry point
    assert all(r.kept >= 3 for r in reports), [(r.key, r.kept, dict(r.dropped)) for r in reports]
    assert len(suite) == sum(r.kept for r in reports)
    train, held = suite.split("train"), suite.split("held-out")
    assert {t.metadata["package"] for t in train} == {"tinytext"}
    assert {t.metadata["package"] for t in held} == {"tinyheld"}
    # (the two fixture projects are clones under two names, so their instructions are near-duplicates
    # by construction; the default suite's real packages pass the full check, see test_swe_pypi.py)
    assert not suite.leaks().shared_ids
    for task in suite:
        assert task.hidden.kind == "package-tests" and task.family.startswith("swe-pypi/")
        assert task.metadata["operator"] in OPERATORS
        assert all(run.sentinels and run.passing for run in task.hidden.runs)
        assert any(run.fail_to_pass for run in task.hidden.runs)
    summary = (out / "summary.md").read_text()
    assert "tinytext-1.0" in summary and "tinyheld-1.0" in summary


def test_oracle_passes_and_the_unfixed_workspace_fails(mined, backend):
    suite = load_mined_suite(mined[0])
    verifier = PackageTestVerifier(SandboxConfig(backend=backend))
    for task in suite.tasks[:2]:
        good = verifier.verify(task, FinalState(changes=fix_of(task)))
        assert good.outcome == Outcome.PASSED and good.reward == 1.0, good.reason
        bad = verifier.verify(task, FinalState())
        assert bad.outcome == Outcome.FAILED and bad.reward == 0.0
        assert not bad.details["side_effects"], bad.details
        failing = {t.name.split(".py::", 1)[1] for t in bad.tests if not t.passed and ".py::" in t.name}
        assert failing and failing <= {k for run in task.hidden.runs for k in run.fail_to_pass}
        # the unfixed code differs from the pristine one exactly on the inputs mined as telling
        differing = {t.name.split("::", 1)[1] for t in bad.tests if not t.passed and t.name.startswith("differential::")}
        assert differing == {c.id for c in task.hidden.differential if c.distinguishes}
        assert {t.name for t in good.tests if t.name.startswith("differential::")} == {
            f"differential::{c.id}" for c in task.hidden.differential
        }


def test_the_instruction_reports_the_failure_not_the_diff(mined):
    for task in load_mined_suite(mined[0]):
        import difflib

        fixed = task.oracle[0].arguments["content"].splitlines()
        buggy = task.workspace[task.oracle[0].arguments["path"]].splitlines()
        diff = [d[1:].strip() for d in difflib.ndiff(fixed, buggy) if d[:1] in "+-"]
        assert diff and not any(line in task.instruction for line in diff if len(line) > 6), diff
        assert "tests/test_tinytext.py::" in task.instruction and "pytest" in task.instruction


def test_withheld_tests_are_graded_but_not_shown(mined):
    tasks = [t for t in load_mined_suite(mined[0]) if t.metadata["withheld_tests"]]
    assert tasks
    for task in tasks:
        for path, names in task.metadata["withheld_tests"].items():
            assert not any(f"def {n}(" in task.workspace[path] for n in names)
            assert not any(re.search(rf"::{n}[\[`]", task.instruction) for n in names), task.instruction


def test_mining_is_deterministic_for_a_seed_and_resumes(tmp_path):
    sdist = build_sdist(tmp_path / "sdists")
    opts = MineOptions(max_tasks=3, max_tries=12, backends=("bwrap",), workers=2)
    first = mine_project(str(sdist), "train", tmp_path / "a", opts, log=lambda m: None)
    serial = mine_project(
        str(sdist), "train", tmp_path / "b", MineOptions(max_tasks=3, max_tries=12, backends=("bwrap",), workers=1), log=lambda m: None
    )
    ids = lambda d: [json.loads(line)["id"] for line in (d / "tasks" / "tinytext-1.0.jsonl").read_text().splitlines()]
    assert ids(tmp_path / "a") == ids(tmp_path / "b") and len(ids(tmp_path / "a")) == first.kept == serial.kept
    messages: list[str] = []
    again = mine_project(str(sdist), "train", tmp_path / "a", opts, log=messages.append)
    assert again.kept == first.kept and any("already mined" in m for m in messages)


def test_mutants_change_the_program_and_keep_the_rest_of_the_file():
    source = build_sdist.__globals__["SOURCE"]
    found = list(mutants("tinytext.py", source))
    assert {m.operator for m in found} >= {
        "flip_comparison",
        "off_by_one",
        "negate_condition",
        "drop_statement",
        "drop_branch",
        "change_constant",
        "wrong_default",
        "swap_operator",
        "swap_arguments",
    }
    for m in found:
        changed = [a for a, b in zip(source.splitlines(), m.text.splitlines()) if a != b]
        assert m.text != source and '"""Small text and number helpers."""' in m.text
        assert len(source.splitlines()) - len(m.text.splitlines()) <= 3 and len(changed) <= 3


def test_grading_copies_rename_select_and_add_sentinels():
    tests = build_sdist.__globals__["TESTS"].replace("{name}", "tinytext")
    copy = grading_copy(tests, {"test_clamp_low", "test_title"}, {"test_clamp_low"}, seed=3)
    assert set(copy.renamed) == {"test_clamp_low", "test_title"} and len(copy.sentinels) == 1
    assert "clamp_low" not in copy.text and "test_mean" not in copy.text and "test_title(" not in copy.text
    names = list(copy.renamed.values()) + list(copy.sentinels)
    assert all(n.startswith("test_") and len(n) == 13 for n in names)  # one shape for every test
    assert (
        grading_copy(tests, {"test_clamp_low"}, {"test_clamp_low"}, seed=3).text
        == grading_copy(tests, {"test_clamp_low"}, {"test_clamp_low"}, seed=3).text
    )
    trimmed = without_tests(tests, {"test_mean"})
    assert "def test_mean():" not in trimmed and "def test_mean_empty():" in trimmed


def test_a_broken_task_row_is_a_clear_load_error(mined, tmp_path):
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(mined[0], broken)
    rows = broken / "tasks" / "tinytext-1.0.jsonl"
    rows.write_text("{not json\n" + rows.read_text())
    with pytest.raises(TaskLoadError, match=r"tinytext-1.0.jsonl:1"):
        load_mined_suite(broken)


def test_mining_a_real_package_from_the_index(tmp_path):
    """A pinned sdist from PyPI (the one step that needs the network), mined into two tasks."""
    report = mine_project(
        "inflection==0.5.1", "held-out", tmp_path / "suite", MineOptions(max_tasks=2, max_tries=10, backends=("bwrap",)), log=lambda m: None
    )
    assert report.kept == 2 and report.tests_passing > 400 and report.license == "MIT"


def test_cli_mine_errors_are_one_line(tmp_path):
    res = run_cli("tasks", "mine")
    assert res.returncode == 2 and res.stderr.strip().count("\n") == 0 and "--default" in res.stderr
    res = run_cli("tasks", "mine", "no-such-package-toolgym-xyz==0.0.1", "--out", str(tmp_path / "o"), "--backends", "bwrap")
    assert res.returncode == 2 and "no package could be mined" in res.stderr
    assert "pip could not download" in res.stdout


def test_the_default_suite_says_how_to_mine_it(tmp_path, monkeypatch):
    from toolgym.envs.families.swe_pypi import load_swe_pypi

    monkeypatch.setenv("TOOLGYM_SWE_PYPI", str(tmp_path / "none"))
    with pytest.raises(TaskLoadError, match="toolgym tasks mine --default"):
        load_swe_pypi()


def test_one_traced_run_records_every_functions_calls_and_a_slow_test_is_stopped():
    """The miner records the calls of all candidate functions in one pytest run, and its per-test
    limit stops a test that runs on (a looping mutant) without waiting for the run's timeout."""
    from toolgym.mining.pytest_run import capture_calls, run_tests, runner_files
    from toolgym.sandbox import make_sandbox

    source = (
        "def double(x):\n    return 2 * x\n\n\ndef name(s, upper=False):\n    return s.upper() if upper else s\n\n\n"
        "def spin():\n    while True:\n        pass\n"
    )
    tests = (
        "from pkg.m import double, name, spin\n\n\ndef test_double():\n    assert double(2) == 4 and double(3) == 6\n"
        "\n\ndef test_name():\n    assert name('a', upper=True) == 'A'\n\n\ndef test_spin():\n    spin()\n"
    )
    workspace = {"pkg/__init__.py": "", "pkg/m.py": source, "tests/test_m.py": tests, **runner_files(".", ["tests"])}
    box = make_sandbox(workspace, SandboxConfig(canary=False))
    try:
        calls = capture_calls(
            box,
            ["tests/test_m.py::test_double", "tests/test_m.py::test_name"],
            ["pkg/m.py::double", "pkg/m.py::name", "pkg/m.py::spin"],
            60,
        )
        assert sorted(c["args"][1] for c in calls["pkg/m.py::double"]) == ["[[2], {}]", "[[3], {}]"]
        assert calls["pkg/m.py::name"] == [{"test": "tests/test_m.py::test_name", "args": ["repr", "[['a', True], {}]"], "view": None}]
        assert "pkg/m.py::spin" not in calls  # never called by the tests that ran
        res = run_tests(box, ".", ["tests/test_m.py"], 120, test_limit_s=1.0)
        assert res.outcomes() == {
            "tests/test_m.py::test_double": "passed",
            "tests/test_m.py::test_name": "passed",
            "tests/test_m.py::test_spin": "timeout",
        }
        assert not res.timed_out and res.duration_s < 60
    finally:
        box.close()
