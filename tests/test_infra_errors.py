"""Infrastructure failures are ours, not the agent's: a sandbox that dies mid-episode, a helper
removed mid-run, a container exhausted by a fork bomb. Each gives `infra_error` (left out of
pass@k) or a working fresh sandbox, never `failed`; and a cold helper cache is safe under threads."""

import os
import subprocess
import sys
import threading

import pytest

import toolgym
from toolgym.harness import RolloutRunner
from toolgym.sandbox import SandboxConfig, SandboxInfraError, make_sandbox
from toolgym.tasks import HiddenSpec, Task, ToolCall
from toolgym.verifiers import Outcome

TASK = Task(
    env_id="toolgym/shell-ops-v0",
    instruction="Create done.txt.",
    family="infra-test",
    workspace={"a.txt": "a\n"},
    hidden=HiddenSpec(
        kind="state",
        files={
            "check.py": (
                "import json, os, sys\nopen(sys.argv[1], 'w').write(json.dumps({'name': 'done', "
                "'passed': os.path.exists('done.txt')}) + '\\n')\n"
            )
        },
    ),
    oracle=(ToolCall(name="bash", arguments={"command": "touch done.txt"}), ToolCall(name="submit")),
)


def bash(cmd):
    return ToolCall(name="bash", arguments={"command": cmd}).to_text()


def run_one(backend, actions, during=None):
    """One episode of `actions` through the real rollout runner; `during(env)` runs in a thread
    when the first action starts."""
    env = toolgym.make("shell-ops-v0", sandbox={"backend": backend}).unwrapped

    class Scripted:
        """A text agent that plays `actions` in order (the real TextAgent protocol)."""

        name = "scripted"

        async def respond(self, messages, tools, task):
            turn = sum(m["role"] == "assistant" for m in messages)
            if during is not None and turn == 0:
                threading.Timer(0.5, during, args=(env,)).start()
            return actions[min(turn, len(actions) - 1)]

    runner = RolloutRunner(lambda: env, Scripted(), progress=False)
    try:
        return runner.run([TASK])[0]
    finally:
        runner.close()
        env.close()


def test_sandbox_killed_mid_episode_is_infra_error(backend):
    traj = run_one(backend, [bash("sleep 3; touch done.txt"), ToolCall(name="submit").to_text()], during=lambda env: env.sandbox.close())
    assert traj.outcome == Outcome.INFRA_ERROR, (traj.outcome, traj.error)
    assert "closed" in traj.error


@pytest.fixture
def private_wrapper(monkeypatch):
    """A copy of the exec wrapper that only this test's sandboxes bind: removing it must not
    break the sandboxes of other tests or other toolgym work, which bind the shared cache's."""
    import shutil
    import tempfile

    from toolgym.sandbox import bwrap, docker_pool
    from toolgym.sandbox.native import wrapper_script

    home = tempfile.mkdtemp(prefix=f"toolgym-test-{os.getpid()}-")  # traversable: a root harness's sandboxes read it
    os.chmod(home, 0o755)
    path = os.path.join(home, os.path.basename(wrapper_script()))
    shutil.copy2(wrapper_script(), path)
    monkeypatch.setattr(bwrap, "wrapper_script", lambda: path)
    monkeypatch.setattr(docker_pool, "wrapper_script", lambda: path)
    yield path
    shutil.rmtree(home, ignore_errors=True)


def test_cached_helper_removed_mid_run_is_infra_error(private_wrapper):
    def remove_helper(env):
        os.rename(private_wrapper, private_wrapper + ".away")

    traj = run_one("bwrap", [bash("sleep 1"), bash("touch done.txt"), ToolCall(name="submit").to_text()], during=remove_helper)
    # the episode's own sandbox holds its binds (its resident init keeps running), so the next
    # sandbox to start, the grader's, is the one that fails: still ours, never the agent's
    assert traj.outcome == Outcome.INFRA_ERROR, (traj.outcome, traj.error)
    why = traj.error or (traj.verdict.reason if traj.verdict else "")
    assert "could not start" in why, why


def test_agent_errors_stay_agent_errors(backend):
    """A failing command, a missing file: observations the agent sees; the episode is graded."""
    env = toolgym.make("shell-ops-v0", sandbox={"backend": backend}).unwrapped
    try:
        env.reset(options={"task": TASK})
        obs, *_, info = env.step(ToolCall(name="read_file", arguments={"path": "missing.txt"}).to_text())
        assert "Error" in obs and info["errors"]["tool_error"] == 1
        obs, *_ = env.step(bash("exit 3"))
        assert "exit code 3" in obs
    finally:
        env.close()


def test_exhausted_container_is_reset_to_a_working_state():
    config = SandboxConfig(backend="docker")
    env = toolgym.make("shell-ops-v0", sandbox=config).unwrapped
    try:
        env.reset(options={"task": TASK})
        env.step(bash(":(){ :|:& };: ; sleep 2; true"))
        env.reset(options={"task": TASK})  # same task: reset() (or a replacement) must give a working sandbox
        obs, *_ = env.step(bash("echo alive; ls /proc | grep -c '^[0-9]'"))
        assert "alive" in obs
        procs = env.sandbox.exec('for p in /proc/[0-9]*; do read -r s < $p/stat; echo "${s##*) }"; done').stdout
        assert not any(line.startswith("Z") for line in procs.splitlines())  # no zombie survived the reset
    finally:
        env.close()


def test_no_defunct_process_after_a_burst_and_reset():
    box = make_sandbox({"a.txt": "a\n"}, SandboxConfig(backend="docker"))
    try:
        box.exec("for i in $(seq 40); do (sleep 0.05 &) ; done; sleep 0.5")
        box.reset()
        states = box.exec('for p in /proc/[0-9]*; do read -r s < $p/stat; echo "${s##*) }"; done').stdout
        assert states and not any(line.startswith("Z") for line in states.splitlines())
    finally:
        box.close()


def test_closed_sandbox_raises_infra_error(backend):
    box = make_sandbox({"a.txt": "a\n"}, SandboxConfig(backend=backend))
    box.close()
    with pytest.raises(SandboxInfraError):
        box.exec("true")


def test_cold_helper_cache_is_safe_under_threads():
    """16 threads create bwrap sandboxes at once on an empty cache (a fresh process, so the
    in-process caches are cold too): all succeed and run a command."""
    code = """
import threading
from toolgym.sandbox import make_sandbox
errors, oks = [], []
def one():
    try:
        box = make_sandbox({"a.txt": "a\\n"})
        oks.append(box.exec("cat a.txt").stdout)
        box.close()
    except Exception as err:
        errors.append(repr(err))
threads = [threading.Thread(target=one) for _ in range(16)]
[t.start() for t in threads]
[t.join() for t in threads]
print(len(oks), oks.count("a\\n"), errors[:3])
"""
    import shutil
    import tempfile

    cache = tempfile.mkdtemp(prefix="tg-cold-cache-")  # traversable: a root harness's sandboxes read it
    os.chmod(cache, 0o755)
    try:
        env = {**os.environ, "TOOLGYM_CACHE": cache}
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
        assert out.stdout.strip() == "16 16 []", out.stdout + out.stderr
        assert not [p for p in os.listdir(os.path.join(cache, "native")) if p.endswith(".tmp")]  # none left behind
    finally:
        shutil.rmtree(cache, ignore_errors=True)


def test_docker_with_a_helper_removed_is_infra_error_and_leaves_no_directory(private_wrapper):
    """docker's legacy binds would make an empty directory where a missing source was (the
    helper's own path in the cache, breaking every later sandbox); toolgym's bind mounts fail."""
    from conftest import require_backend

    require_backend("docker")
    os.rename(private_wrapper, private_wrapper + ".away")
    with pytest.raises(SandboxInfraError, match="container"):
        make_sandbox({"a.txt": "a\n"}, SandboxConfig(backend="docker", canary=False))
    assert not os.path.lexists(private_wrapper)
