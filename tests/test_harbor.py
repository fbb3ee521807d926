"""Harbor export: the task layout Harbor reads, and the exported grader run as Harbor runs it
(docker, no network, tests uploaded after the agent): the oracle scores 1, the untouched task 0."""

from __future__ import annotations

import tomllib

import pytest
from conftest import run_cli

import toolgym
from toolgym.tasks import builtin_suite
from toolgym.tasks.mined import load_mined_suite
from toolgym.verifiers.harbor_export import ExportError, export_task, run_trial


def test_export_writes_harbors_layout(tmp_path):
    task = builtin_suite("shell-ops").split("held-out").tasks[0]
    out = export_task(task, tmp_path / "t")
    for rel in ("instruction.md", "task.toml", "environment/Dockerfile", "tests/test.sh", "solution/solve.sh"):
        assert (out / rel).is_file(), rel
    config = tomllib.loads((out / "task.toml").read_text())
    assert config["metadata"]["toolgym_task_id"] == task.id and config["verifier"]["timeout_sec"] > 0
    assert (out / "instruction.md").read_text().strip() == task.instruction.strip()
    assert {
        p.relative_to(out / "environment" / "workspace").as_posix() for p in (out / "environment" / "workspace").rglob("*") if p.is_file()
    } == set(task.workspace)
    # everything hidden is under tests/, which Harbor uploads only after the agent ends
    assert "check.py" not in {p.name for p in (out / "environment").rglob("*")}


@pytest.mark.parametrize("source", ["shell-ops", "mined"])
def test_exported_grader_scores_the_oracle_1_and_the_untouched_task_0(tmp_path, mined, source):
    tasks = builtin_suite("shell-ops").split("held-out").tasks[:1] if source == "shell-ops" else load_mined_suite(mined[0]).tasks[:1]
    for task in tasks:
        out = export_task(task, tmp_path / task.id)
        assert run_trial(out, oracle=True) == 1.0, task.id
        assert run_trial(out, oracle=False) == 0.0, task.id


def test_tasks_that_cannot_export_say_why(tmp_path):
    task = builtin_suite("code-repair").tasks[0]  # graded by probes and a judge sandbox
    with pytest.raises(ExportError, match="do not export"):
        export_task(task, tmp_path / "x")
    res = run_cli("tasks", "export", "code-repair", "--out", str(tmp_path / "y"), "--limit", "2")
    assert res.returncode == 2 and "no task of this suite could be exported" in res.stderr
    res = run_cli("tasks", "export", "shell-ops", "--out", str(tmp_path / "z"), "--format", "swebench")
    assert res.returncode == 2 and res.stderr.strip() == "error: unknown format 'swebench': the one format is harbor"
    res = run_cli("tasks", "export", "shell-ops", "--out", str(tmp_path / "ok"), "--limit", "3")
    assert res.returncode == 0 and "wrote 3 Harbor tasks" in res.stdout


def _play_oracle(task):
    """The oracle's final state (a `FinalState`) for `task`."""
    from toolgym.verifiers import FinalState

    env = toolgym.make(task.env_id, tasks=[task]).unwrapped
    env.grade_on_submit = False
    try:
        env.reset(options={"task": task})
        for call in task.oracle:
            env.step([call])
        return FinalState(**env.final_state())
    finally:
        env.close()


@pytest.mark.parametrize("source", ["shell-ops", "mined"])
def test_a_round_trip_gives_the_same_verdicts(tmp_path, mined, source):
    """Export, import: the imported task (played in toolgym's sandbox, graded by its own test.sh)
    passes the oracle and fails the untouched workspace, as the original does."""
    from toolgym.tasks import TaskSuite
    from toolgym.verifiers import FinalState, verifier_for

    originals = builtin_suite("shell-ops").split("held-out").tasks[1:2] if source == "shell-ops" else load_mined_suite(mined[0]).tasks[:1]
    for task in originals:
        export_task(task, tmp_path / "out" / task.id)
    imported = {t.metadata["toolgym_task_id"]: t for t in TaskSuite.load(tmp_path / "out").tasks}
    assert set(imported) == {t.id for t in originals}
    for original in originals:
        back = imported[original.id]
        assert back.env_id == "toolgym/harbor-v0" and back.workspace == original.workspace
        fix = _play_oracle(original)
        for state, want in ((_play_oracle(back), True), (FinalState(), False)):
            assert verifier_for(back).verify(back, state).passed is want
        assert verifier_for(original).verify(original, fix).passed and not verifier_for(original).verify(original, FinalState()).passed


def test_import_refuses_environments_toolgyms_image_cannot_provide(tmp_path):
    good = export_task(builtin_suite("shell-ops").tasks[0], tmp_path / "tasks" / "good")
    bad = tmp_path / "tasks" / "needs-registry"
    import shutil

    shutil.copytree(good, bad)
    (bad / "environment" / "Dockerfile").write_text("FROM python:3.11-slim\nRUN pip install numpy\nCOPY workspace/ /workspace/\n")
    res = run_cli("tasks", "import", str(tmp_path / "tasks"))
    assert res.returncode == 0 and "1 Harbor tasks import" in res.stdout and "1 cannot" in res.stdout
    assert "needs-registry" in res.stdout and "python:3.11-slim" in res.stdout and "needs a registry" in res.stdout
    from toolgym.tasks import TaskLoadError, TaskSuite

    with pytest.raises(TaskLoadError, match="cannot be imported"):
        TaskSuite.load(tmp_path / "tasks")
