"""Shared fixtures. Real components only: no mocks of anything that runs on this machine."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def records_env():
    """A fresh records-v0 environment (unwrapped ToolEnv)."""
    import toolgym

    env = toolgym.make("records-v0").unwrapped
    yield env
    env.close()


#: This test run's processes: pytest itself, every CLI it ran and every descendant seen. What the
#: leftovers check judges is only what these made (their pid is in every toolgym temp dir, cgroup
#: and container label), never other work on the machine.
RUN_PIDS: set[int] = {os.getpid()}


def _watch_descendants() -> None:
    """Add every descendant of this process to RUN_PIDS (polled: a child that lives long enough
    to make a sandbox is seen; `run_cli` registers its CLIs directly)."""
    import time

    while True:
        for entry in os.scandir("/proc"):
            if entry.name.isdigit() and int(entry.name) not in RUN_PIDS:
                try:
                    stat = Path(entry.path, "stat").read_text()
                except OSError:
                    continue
                if int(stat.rsplit(")", 1)[1].split()[1]) in RUN_PIDS:  # its parent is ours
                    RUN_PIDS.add(int(entry.name))
        time.sleep(0.1)


def pytest_sessionstart(session) -> None:
    import threading

    threading.Thread(target=_watch_descendants, daemon=True, name="run-pids").start()


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session, exitstatus) -> None:
    """With several test workers (`pytest -n`, as `scripts/test.sh` runs them): a worker closes
    what lives as long as it does before it reports back, and the controller, once every worker
    has exited, checks that the whole run left nothing behind (`test_zz_leftovers.py` runs in one
    worker and sees only that worker's share). A leftover fails the run with one line per kind."""
    from leftovers import close_process_services, find_leftovers

    if hasattr(session.config, "workerinput"):
        close_process_services()
    elif session.config.pluginmanager.hasplugin("dsession"):
        nodes = getattr(session.config.pluginmanager.getplugin("dsession"), "nodemanager", None)
        if nodes is not None:
            nodes.teardown_nodes()  # every worker gone first (xdist's own hook, after this one, would do it next)
        problems = find_leftovers(RUN_PIDS)
        if problems:
            writer = session.config.get_terminal_writer()
            writer.line()
            writer.line("the test run left behind: " + "; ".join(problems), red=True, bold=True)
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


def run_cli(*args: str, input: str | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    """Run `python -m toolgym.cli ...` in a fresh process, as a user would run `toolgym ...`."""
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    with subprocess.Popen(
        [sys.executable, "-m", "toolgym.cli", *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    ) as proc:
        RUN_PIDS.add(proc.pid)
        try:
            out, err = proc.communicate(input, timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.fixture(scope="session")
def tiny_dir():
    """The tiny policy directory (built once per machine, cached in ~/.cache/toolgym)."""
    from toolgym.inference.tiny import build_tiny_policy

    return str(build_tiny_policy())


@pytest.fixture(scope="session")
def tiny_policy(tiny_dir):
    """The tiny policy loaded through `from_pretrained`, as an HFPolicy."""
    from toolgym.inference.hf_policy import HFPolicy

    return HFPolicy(tiny_dir, name="tiny")


class ScriptedTokenPolicy:
    """A token-level policy that emits the tokens of the task's oracle calls, one per turn.

    It implements the real `Policy` protocol (token ids in, token ids + logprobs out), so the
    rollout path exercised is exactly the one a model takes; only the choice of tokens is scripted.
    """

    name = "scripted"

    def __init__(self, tokenizer, task):
        self.tokenizer = tokenizer
        self.turns = [c.to_text() for c in task.oracle]
        self.calls = []  # (prompt length, returned ids)
        self.eot = tokenizer.convert_tokens_to_ids("<|im_end|>")

    async def generate(self, prompt_ids, sampling):
        from toolgym.inference.policy import Generation

        text = self.turns[len(self.calls)] if len(self.calls) < len(self.turns) else "done"
        ids = self.tokenizer.encode(text, add_special_tokens=False) + [self.eot]
        self.calls.append((len(prompt_ids), ids))
        return Generation(token_ids=ids, logprobs=[-0.5] * len(ids), finish_reason="stop")


# ---- sandboxes -------------------------------------------------------------------------------------

WORKSPACE_FILES = {
    "README.md": "hello\n",
    "src/app.py": "def add(a, b):\n    return a + b\n",
    "tests/test_app.py": "from src.app import add\n\ndef test_add():\n    assert add(1, 2) == 3\n",
    "data/keep.txt": "keep me\n",
}


def require_backend(backend: str) -> None:
    """Real components only: a backend that cannot run is a test failure, never a skip."""
    from toolgym.sandbox import SandboxUnavailable

    try:
        if backend == "docker":
            from toolgym.sandbox.docker_pool import client
            from toolgym.sandbox.image import DEFAULT_TAG, image_exists

            client()
            if not image_exists(DEFAULT_TAG):
                pytest.fail(f"docker image {DEFAULT_TAG} missing: run `toolgym sandbox build-image` (scripts/test.sh does)")
        else:
            from toolgym.sandbox.bwrap_host import find_bwrap, probe_userns

            probe_userns(find_bwrap())
    except SandboxUnavailable as err:
        pytest.fail(f"{backend} backend unavailable: {err}")


@pytest.fixture(params=["bwrap", "docker"])
def backend(request):
    """Each sandbox test runs on both backends."""
    require_backend(request.param)
    return request.param


@pytest.fixture
def sandbox(backend):
    """A sandbox over WORKSPACE_FILES with `tests/` protected; closed after the test."""
    from toolgym.sandbox import Limits, SandboxConfig, make_sandbox

    config = SandboxConfig(
        backend=backend, protected=("tests",), limits=Limits(timeout_s=20, memory_mb=256, pids=64, file_size_mb=16, disk_mb=48)
    )
    box = make_sandbox(dict(WORKSPACE_FILES), config)
    yield box
    box.close()


# ---- mined tasks (toolgym.mining) ------------------------------------------------------------------


@pytest.fixture(scope="session")
def mined(tmp_path_factory):
    """Two small projects mined into one suite: `tinytext` (train) and `tinyheld` (held-out),
    every kept task verified on both backends by the miner itself. Mined once per test run:
    with several workers, the first to ask mines it (under a lock) in the run's shared temp
    directory and the others read it (the tests only read the suite)."""
    import fcntl
    import pickle

    from mining_fixture import build_sdist

    from toolgym.mining.miner import MineOptions
    from toolgym.mining.run import mine_project, write_header

    base = tmp_path_factory.getbasetemp()
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "mined"
    root.mkdir(exist_ok=True)
    out, done = root / "suite", root / "reports.pickle"
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if done.exists():
            return out, pickle.loads(done.read_bytes())
        reports = [
            mine_project(
                str(build_sdist(root / "sdists", name)),
                split,
                out,
                MineOptions(max_tasks=6, max_tries=30, backends=("bwrap", "docker")),
                log=lambda m: None,
            )
            for name, split in (("tinytext", "train"), ("tinyheld", "held-out"))
        ]
        write_header(out, "tiny-mined", "0", reports)
        done.write_bytes(pickle.dumps(reports))
    return out, reports


#: The fast tier (`pytest -m "not slow"`): test files that need no docker and train no model.
#: Every other file's tests are marked `slow` here, so a new file is slow until it is listed.
FAST_FILES = {
    "test_core_algos.py",
    "test_learner_math.py",
    "test_rewards.py",
    "test_tasks.py",
    "test_tools.py",
    "test_env_api.py",
    "test_env_step.py",
    "test_grading_path.py",
    "test_sampler.py",
    "test_template_check.py",
    "test_trajectory_mask.py",
    "test_report.py",
    "test_prefix.py",
    "test_judge.py",
}


def pytest_collection_modifyitems(config, items) -> None:
    """Mark every test outside `FAST_FILES` as `slow` (and docker's as `docker` too)."""
    import pytest

    for item in items:
        name = item.path.name
        if name not in FAST_FILES:
            item.add_marker(pytest.mark.slow)
        if "docker" in name or "docker" in item.keywords.get("backend", ""):
            item.add_marker(pytest.mark.docker)
