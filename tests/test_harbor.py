"""Harbor export: the task layout Harbor reads, and the exported grader run as Harbor runs it
(docker, no network, tests uploaded after the agent): the oracle scores 1, the untouched task 0."""

from __future__ import annotations

import tomllib

import pytest

from conftest import run_cli
from toolgym.tasks import builtin_suite
from toolgym.tasks.harbor import ExportError, export_task, run_trial
from toolgym.tasks.mined import load_mined_suite


def test_export_writes_harbors_layout(tmp_path):
    task = builtin_suite("shell-ops").split("held-out").tasks[0]
    out = export_task(task, tmp_path / "t")
    for rel in ("instruction.md", "task.toml", "environment/Dockerfile", "tests/test.sh", "solution/solve.sh"):
        assert (out / rel).is_file(), rel
    config = tomllib.loads((out / "task.toml").read_text())
    assert config["metadata"]["toolgym_task_id"] == task.id and config["verifier"]["timeout_sec"] > 0
    assert (out / "instruction.md").read_text().strip() == task.instruction.strip()
    assert {p.relative_to(out / "environment" / "workspace").as_posix()
            for p in (out / "environment" / "workspace").rglob("*") if p.is_file()} == set(task.workspace)
    # everything hidden is under tests/, which Harbor uploads only after the agent ends
    assert "check.py" not in {p.name for p in (out / "environment").rglob("*")}


@pytest.mark.parametrize("source", ["shell-ops", "mined"])
def test_exported_grader_scores_the_oracle_1_and_the_untouched_task_0(tmp_path, mined, source):
    tasks = (builtin_suite("shell-ops").split("held-out").tasks[:2] if source == "shell-ops"
             else load_mined_suite(mined[0]).tasks[:2])
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
