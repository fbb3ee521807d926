"""The bwrap backend's resident init: commands run through one long-lived PID 1 per sandbox state.

What a fresh bwrap per command guaranteed must still hold: no process outlives an exec, the
commands cannot kill or inspect the init, a dead init is an infra error (unless the host or the
memory limit killed it), reset and restore start over, and a second command while one runs
still works (it takes a fresh bwrap)."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
from conftest import WORKSPACE_FILES

from toolgym.sandbox import Limits, SandboxConfig, SandboxError, SandboxInfraError, make_sandbox
from toolgym.sandbox.ledger import EffectKind


@pytest.fixture
def box():
    from conftest import require_backend

    require_backend("bwrap")
    sandbox = make_sandbox(dict(WORKSPACE_FILES), SandboxConfig(backend="bwrap", limits=Limits(timeout_s=20)))
    yield sandbox
    sandbox.close()


def init_of(box) -> int:
    return box._resident.init_pid


def test_commands_share_one_init_and_leave_no_process(box):
    assert box.exec("echo one").stdout == "one\n"
    first = init_of(box)
    res = box.exec("sleep 300 & echo started")
    assert res.exit_code == 0 and res.stdout == "started\n"
    assert init_of(box) == first  # no new sandbox per command
    assert EffectKind.PROCESS_LEFT_RUNNING in {e.kind for e in box.events()}
    # inside, only the init (pid 1) and the listing shell's own processes remain
    pids = box.exec("for p in /proc/[0-9]*; do echo ${p#/proc/}; done").stdout.split()
    assert "1" in pids and len(pids) <= 3, pids
    assert box.cgroup is None or set(box.cgroup.pids()) <= {box._resident.proc.pid, first}


def test_commands_cannot_kill_or_inspect_the_init(box):
    box.exec("true")
    init = init_of(box)
    assert box.exec("kill -9 1; echo done").stdout == "done\n"
    box.exec("kill -KILL -1")  # every process it may signal but the init: its own wrapper too
    assert box.exec("echo alive").stdout == "alive\n" and init_of(box) == init
    assert box.exec("cat /proc/1/environ").exit_code != 0  # not dumpable: its /proc files are closed


def test_an_init_that_dies_during_a_command_is_an_infra_error(box):
    box.exec("true")
    init = init_of(box)
    threading.Timer(0.5, lambda: os.kill(init, signal.SIGKILL)).start()
    with pytest.raises(SandboxInfraError, match="init"):
        box.exec("sleep 10")
    assert box.exec("echo back").stdout == "back\n" and init_of(box) != init  # the next exec starts a new one


def test_kill_all_and_timeouts_are_the_commands_results(box):
    res = box.exec("sleep 10", timeout_s=1)
    assert res.timed_out and res.exit_code == 137
    out: dict = {}
    thread = threading.Thread(target=lambda: out.setdefault("r", box.exec("sleep 60")))
    thread.start()
    time.sleep(1)
    assert box.kill_all() >= 1
    thread.join(20)
    assert out["r"].exit_code == 137 and out["r"].duration_s < 20


def test_memory_limit_kill_is_the_commands_result():
    sandbox = make_sandbox({}, SandboxConfig(backend="bwrap", limits=Limits(memory_mb=64, timeout_s=30)))
    try:
        res = sandbox.exec("python3 -c 'x = bytearray(400 << 20); print(len(x))'")
        assert res.exit_code != 0 and not res.stdout  # killed (or MemoryError): never an infra error
        assert sandbox.exec("echo fine").stdout == "fine\n"
    finally:
        sandbox.close()


def test_reset_and_restore_start_a_fresh_init(box):
    box.exec("echo changed > README.md")
    init = init_of(box)
    snap = box.snapshot()
    box.exec("echo later > README.md")
    box.restore(snap)
    assert box.read_file("README.md") == "changed\n" and init_of(box) != init
    box.reset()
    assert box.live_processes() == []
    assert box.read_file("README.md") == "hello\n"


def test_a_second_command_while_one_runs_takes_a_fresh_bwrap(box):
    box.exec("true")
    out: dict = {}
    thread = threading.Thread(target=lambda: out.setdefault("slow", box.exec("sleep 2; echo slow")))
    thread.start()
    time.sleep(0.5)
    start = time.monotonic()
    quick = box.exec("echo quick")
    assert quick.stdout == "quick\n" and time.monotonic() - start < 1.5
    thread.join(20)
    assert out["slow"].stdout == "slow\n"


@pytest.mark.parametrize("resident", [True, False])
def test_both_paths_run_commands_the_same_way(resident):
    config = SandboxConfig(backend="bwrap", resident=resident, limits=Limits(timeout_s=10))
    with make_sandbox({"a.txt": "hi\n"}, config) as sandbox:
        res = sandbox.exec("cat a.txt; echo err >&2; exit 3")
        assert (res.exit_code, res.stdout, res.stderr) == (3, "hi\n", "err\n")
        assert sandbox.exec("cat", stdin="piped\n").stdout == "piped\n"
        assert sandbox.exec("pwd", cwd="/tmp").stdout == "/tmp\n"
        assert sandbox.exec("echo $USER $HOME").stdout == "agent /root\n"
        assert sandbox.exec("sleep 5", timeout_s=1).timed_out
        assert (sandbox._resident is not None) == resident


def test_long_commands_run_and_too_long_ones_are_the_callers_error(box):
    """100 KB runs; past 120 KiB (the kernel takes 128 KiB per argument) the caller gets a
    SandboxError that says so, never an infra error."""
    payload = "x" * 100_000
    res = box.exec(f"v={payload}; echo ${{#v}}")
    assert res.exit_code == 0 and res.stdout == "100000\n"
    with pytest.raises(SandboxError, match="limit") as err:
        box.exec(f"v={payload}{payload}; echo ${{#v}}")
    assert not isinstance(err.value, SandboxInfraError)


def test_a_reset_on_saturated_cores_is_proved_clean_every_time(box):
    """Two CPU-bound processes beside it: after every reset the sandbox has no live process (the
    init starting in the background, and the harness's own thread moving through the sandbox's
    cgroup to start it, are machinery, not leftovers)."""
    import subprocess
    import sys

    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        for i in range(60):
            box.exec("sleep 30 & echo x > f.txt")
            box.reset()
            assert box.live_processes() == [], f"reset {i}"
    finally:
        for p in burners:
            p.kill()
            p.wait()


def test_the_host_process_is_never_counted_in_a_sandbox_cgroup(box):
    """A harness thread inside the sandbox's cgroup (as `spawn` puts it for a fork, cgroup v1) makes
    `cgroup.procs` list the harness: the sandbox's process count leaves it out."""
    import os

    cgroup = box.cgroup
    assert cgroup is not None  # the test machines run as root: every sandbox has a cgroup
    if cgroup.version != 1:  # threads never move alone on v2 (a launcher shell spawns): nothing in transit
        assert os.getpid() not in cgroup.pids() and box.live_processes() == []
        return
    inside = threading.Event()
    release = threading.Event()

    def transit():
        tid = str(threading.get_native_id())
        homes = {ctl: (d / "tasks") for ctl, d in cgroup.dirs.items()}
        for path in homes.values():
            path.write_text(tid)  # this thread is now in the sandbox's cgroup, like spawn's
        inside.set()
        release.wait(10)
        from toolgym.sandbox.cgroups import V1, _own_v1_path

        for ctl in cgroup.dirs:
            (V1[ctl] / _own_v1_path(ctl) / "tasks").write_text(tid)

    thread = threading.Thread(target=transit)
    thread.start()
    try:
        inside.wait(10)
        listed = {int(x) for d in cgroup.dirs.values() for x in (d / "cgroup.procs").read_text().split()}
        assert os.getpid() in listed  # the kernel does list the harness...
        assert os.getpid() not in cgroup.pids() and box.live_processes() == []  # ...the sandbox does not count it
    finally:
        release.set()
        thread.join(10)
