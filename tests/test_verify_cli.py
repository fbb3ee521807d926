"""`toolgym verify` and `toolgym check` on sandboxed environments, and sandboxed rollouts."""

import difflib

import pytest
from conftest import run_cli

import toolgym
from toolgym.harness import OracleAgent, RolloutRunner
from toolgym.tasks import TaskSuite, builtin_suite
from toolgym.verifiers import Outcome
from toolgym.verifiers.patch import PatchError, apply_patch


def _task_dir(tmp_path):
    task = builtin_suite("code-repair").tasks[1]
    TaskSuite("one", [task]).save_dir(tmp_path / "suite")
    return task, tmp_path / "suite" / task.id


def test_verify_cli_with_a_patch(tmp_path):
    task, folder = _task_dir(tmp_path)
    path = task.oracle[0].arguments["path"]
    diff = "".join(
        difflib.unified_diff(
            task.workspace[path].splitlines(True), task.oracle[0].arguments["content"].splitlines(True), f"a/{path}", f"b/{path}"
        )
    )
    (tmp_path / "fix.patch").write_text(diff)
    ok = run_cli("verify", str(folder), "--patch", str(tmp_path / "fix.patch"))
    assert ok.returncode == 0 and "passed: reward 1.00" in ok.stdout
    bad = run_cli("verify", str(folder))
    assert bad.returncode == 1 and "failed: reward 0.00" in bad.stdout
    (tmp_path / "junk.patch").write_text("not a diff\n")
    junk = run_cli("verify", str(folder), "--patch", str(tmp_path / "junk.patch"))
    assert junk.returncode == 2 and "no file changes found" in junk.stderr
    missing = run_cli("verify", str(tmp_path))
    assert missing.returncode == 2 and "no task.yaml" in missing.stderr


def test_apply_patch_strict():
    files = {"a.py": "x = 1\ny = 2\n"}
    patch = "--- a/a.py\n+++ b/a.py\n@@ -1,2 +1,2 @@\n x = 1\n-y = 2\n+y = 3\n--- /dev/null\n+++ b/new.py\n@@ -0,0 +1 @@\n+z\n"
    assert apply_patch(files, patch) == {"a.py": "x = 1\ny = 3\n", "new.py": "z\n"}
    with pytest.raises(PatchError, match="does not apply"):
        apply_patch({"a.py": "other\n"}, patch)


@pytest.mark.parametrize("env_id", ["code-repair-v0", "shell-ops-v0"])
def test_check_passes_on_sandboxed_envs(env_id):
    out = run_cli("check", env_id, "--tasks", "3")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "PASS hacks[train]" in out.stdout and "PASS initial-state[held-out]" in out.stdout


def test_sandboxed_rollouts_attribute_tampering():
    tasks = builtin_suite("code-repair").tasks[:2]
    runner = RolloutRunner(lambda: toolgym.make("code-repair-v0").unwrapped, OracleAgent(), progress=False)
    trajs = runner.run(tasks)
    assert [t.outcome for t in trajs] == [Outcome.PASSED, Outcome.PASSED]

    class Tamperer:
        name = "tamperer"

        async def respond(self, messages, tools, task):
            turn = sum(m["role"] == "assistant" for m in messages)
            visible = next(p for p in task.workspace if p.startswith("tests/"))
            calls = [
                toolgym.ToolCall(name="write_file", arguments={"path": visible, "content": "def test_x():\n    pass\n"}),
                toolgym.ToolCall(name="submit"),
            ]
            return calls[min(turn, 1)].to_text()

    runner = RolloutRunner(lambda: toolgym.make("code-repair-v0").unwrapped, Tamperer(), progress=False)
    traj = runner.run(tasks[:1])[0]
    assert traj.outcome == Outcome.FAILED
    kinds = {e["kind"] for e in traj.side_effects}
    assert "test_tamper" in kinds
