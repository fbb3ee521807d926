"""The CLI as a user runs it: exit codes, one-line errors, `play` at a real terminal, the README example."""

import re
import sys

import pexpect
import pytest
from conftest import ROOT, run_cli


def test_envs_lists_records():
    out = run_cli("envs")
    assert out.returncode == 0 and "toolgym/records-v0" in out.stdout and "records" in out.stdout


def test_tasks_shows_counts_and_checks_splits():
    out = run_cli("tasks", "records", "--split", "held-out", "--limit", "2")
    assert out.returncode == 0, out.stderr
    assert "1200 tasks" in out.stdout and "'held-out': 200" in out.stdout
    assert "0 shared ids, 0 near-duplicate instructions" in out.stdout


def test_tasks_save_and_reload(tmp_path):
    out = run_cli("tasks", "records", "--split", "train", "--save", str(tmp_path / "t.jsonl"))
    assert out.returncode == 0, out.stderr
    out = run_cli("tasks", str(tmp_path / "t.jsonl"), "--limit", "1")
    assert out.returncode == 0 and "1000 tasks" in out.stdout


def test_a_folder_named_like_a_registered_suite_does_not_shadow_it(tmp_path, monkeypatch):
    (tmp_path / "records").mkdir()  # e.g. a run or data folder of that name where the user stands
    (tmp_path / "records" / "notes.txt").write_text("not a suite\n")
    monkeypatch.chdir(tmp_path)
    out = run_cli("tasks", "records", "--limit", "1")
    assert out.returncode == 0 and "suite records v1: 1200 tasks" in out.stdout, out.stderr
    out = run_cli("tasks", "./records")  # the path, when asked for by path
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr


@pytest.mark.parametrize(
    "args, needle",
    [
        (("tasks", "nope"), "no suite 'nope'"),
        (("tasks", "records", "--split", "dev"), "has no split 'dev'"),
        (("check", "nope-v0"), "no environment 'toolgym/nope-v0'"),
        (("play", "nope-v0"), "no environment 'toolgym/nope-v0'"),
        (("--import", "/nonexistent/file.py", "envs"), "no such file"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, needle):
    out = run_cli(*args)
    assert out.returncode == 2
    assert needle in out.stderr and len(out.stderr.strip().splitlines()) == 1
    assert "Traceback" not in out.stderr


def test_broken_task_file_is_one_line(tmp_path):
    bad = tmp_path / "suite" / "t1"
    bad.mkdir(parents=True)
    (bad / "task.yaml").write_text("env_id: x\nfamily: f\n")
    out = run_cli("tasks", str(tmp_path / "suite"))
    assert out.returncode == 2
    assert "task.yaml" in out.stderr and "field `instruction`" in out.stderr and "Traceback" not in out.stderr


def test_check_passes_on_records():
    out = run_cli("check", "records-v0", "--tasks", "8")
    assert out.returncode == 0, out.stdout + out.stderr
    for name in ("gymnasium", "determinism", "oracle[train]", "do-nothing[held-out]", "reset[train]"):
        assert f"PASS {name}" in out.stdout


BROKEN_ENV = '''
import toolgym
from toolgym.tasks import HiddenSpec, Task, ToolCall

TASKS = [Task(env_id="toolgym/broken-v0", instruction=f"Say {w}.", family="say",
              hidden=HiddenSpec(answer=w), oracle=(ToolCall(name="say", arguments={"text": "wrong"}),))
         for w in ("yes", "no", "maybe")]

@toolgym.register_env("broken-v0")
class BrokenEnv(toolgym.ToolEnv):
    """An env whose oracle is wrong and whose reset leaks state: check must fail."""
    counter = 0
    def __init__(self, **kw):
        super().__init__(tasks=TASKS, **{k: v for k, v in kw.items() if k != "split"})
    def load_task(self, task):
        type(self).counter += 1
        self.calls = type(self).counter
    @toolgym.tool(final=True)
    def say(self, text: str) -> str:
        """Say something."""
        self.submitted = text
        return "ok"
'''


def test_check_fails_on_a_broken_env(tmp_path):
    path = tmp_path / "broken_env.py"
    path.write_text(BROKEN_ENV)
    out = run_cli("--import", str(path), "check", "broken-v0", "--tasks", "3")
    assert out.returncode == 2
    assert "FAIL oracle[train]: 0/3 tasks solved" in out.stdout
    assert "FAIL reset[train]" in out.stdout
    assert "checks failed for toolgym/broken-v0" in out.stderr


def _readme_example() -> str:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Write your own environment", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_readme_example_registers_and_passes_check(tmp_path):
    code = _readme_example()
    body = [ln for ln in code.splitlines() if ln.strip() and not ln.strip().startswith("#")]
    assert len(body) <= 40, f"the README example has {len(body)} lines of code"
    assert code.strip() == (ROOT / "examples" / "convert_env.py").read_text().strip(), (
        "the README example and examples/convert_env.py differ"
    )
    path = tmp_path / "my_env.py"
    path.write_text(code)
    out = run_cli("--import", str(path), "envs")
    assert out.returncode == 0 and "toolgym/convert-v0" in out.stdout
    out = run_cli("--import", str(path), "check", "convert-v0", "--tasks", "10")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "all 8 checks passed" in out.stdout


def test_play_at_a_real_terminal():
    import toolgym

    env = toolgym.make("records-v0").unwrapped
    env.reset(seed=4)
    task = env.task
    child = pexpect.spawn(
        sys.executable,
        ["-m", "toolgym.cli", "play", "records-v0", "--seed", "4"],
        encoding="utf-8",
        timeout=60,
        dimensions=(50, 200),
        env={"PATH": "/usr/bin:/bin", "TERM": "xterm"},
    )
    child.expect("tool> ")
    assert task.instruction in child.before
    child.sendline("frobnicate x=1")  # an unknown tool: an error observation, the episode goes on
    child.expect("unknown tool `frobnicate`")
    child.expect("tool> ")
    child.sendline("get record_id")  # not key=value: refused before it costs a turn
    child.expect("is not key=value")
    child.expect("tool> ")
    first = task.oracle[0].arguments
    child.sendline(f'search field={first["field"]} value="{first["value"]}"')
    child.expect("tool> ")
    assert "P" in child.before
    child.sendline(":tools")
    child.expect("answer\\(text: string\\)")
    child.expect("tool> ")
    child.sendline(f'answer text="{task.hidden.answer}"')
    child.expect("episode finished: reward 1.0")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
