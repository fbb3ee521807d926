"""Docker containers reused by a recycling warm pool (graders' sandboxes): a container comes back
only after a reset from the host that leaves nothing of its last user, and a place to keep
state that a reset could not see (System V or POSIX IPC) does not exist in any container."""

from __future__ import annotations

import pytest

from toolgym.sandbox import SandboxConfig, make_sandbox
from toolgym.sandbox.docker_pool import WarmPool, remover

CONFIG = SandboxConfig(backend="docker", canary=False)


@pytest.fixture
def pool():
    from conftest import require_backend

    require_backend("docker")
    warm = WarmPool(CONFIG, size=1, recycle=True)
    yield warm
    warm.close()
    remover().drain()


def test_a_recycled_container_keeps_nothing_of_its_last_user(pool):
    first = make_sandbox({"a.txt": "A\n"}, CONFIG, pool=pool)
    container = first.slot.container.id
    res = first.exec(
        "echo x > /tmp/x; mkdir /tmp/d; echo y > /dev/shm/y; echo z > b.txt; echo w > /.toolgym/extra; (sleep 300 &) ; echo done"
    )
    assert res.stdout.strip() == "done"
    first.close()
    second = make_sandbox({"c.txt": "C\n"}, CONFIG, pool=pool)
    try:
        assert second.slot.container.id == container  # the same container, not a new one
        listing = second.exec("ls -A /tmp /dev/shm /.toolgym; ls -A").stdout.split()
        assert listing == ["/.toolgym:", "events", "/dev/shm:", "/tmp:", "c.txt"], listing
        assert second.live_processes() == [] and second.events() == []
    finally:
        second.close()


def test_no_ipc_can_outlive_a_process(pool):
    with make_sandbox({}, CONFIG, pool=pool) as box:
        code = (
            "import ctypes\nlibc = ctypes.CDLL(None)\n"
            "print(libc.shmget(7, 4096, 0o1666), libc.msgget(7, 0o1666), libc.semget(7, 1, 0o1666))\n"
        )
        assert box.exec(f"python3 -c '{code}'").stdout.split() == ["-1", "-1", "-1"]
        assert box.exec("touch /dev/mqueue/q").exit_code != 0  # no POSIX message queue either


def test_where_the_sandbox_user_can_write_is_what_reset_empties(pool):
    with make_sandbox({}, CONFIG, pool=pool) as box:
        mounts = box.exec("for m in $(awk '{print $2}' /proc/mounts); do [ -w \"$m\" ] && echo $m; done").stdout.split()
        # /proc/keys and /proc/timer_list are docker's masks (/dev/null); /dev/mqueue takes no queue
        assert set(mounts) - {"/proc/keys", "/proc/timer_list", "/dev/mqueue"} == {"/tmp", "/dev/shm", "/workspace", "/.toolgym"}


def test_a_full_pool_starts_no_container_it_would_throw_away(monkeypatch):
    """A start asked for while the pool was empty, still waiting when used containers came
    back and filled it, starts nothing: past its size a recycling pool would only remove it."""
    from conftest import require_backend

    from toolgym.sandbox import docker_pool

    require_backend("docker")
    started = []
    real_new_slot = docker_pool.new_slot

    def counting_new_slot(c, config, episode):
        started.append(config)
        return real_new_slot(c, config, episode)

    monkeypatch.setattr(docker_pool, "new_slot", counting_new_slot)
    warm = WarmPool(CONFIG, size=1, recycle=True)
    try:
        assert warm.wait_settled(timeout_s=60) and warm.ready.qsize() == 1
        assert sum(config is CONFIG for config in started) == 1
        warm._ask()  # what `acquire` does on an empty pool
        assert warm.wait_settled(timeout_s=60)
        assert warm.ready.qsize() == 1 and sum(config is CONFIG for config in started) == 1
    finally:
        warm.close()
        remover().drain()


def test_a_refused_removal_is_retried_until_the_container_is_gone():
    """The daemon can refuse a forced removal while a container is still stopping and then leave it
    "Removal In Progress" for good (seen under load): removal is tried again until it succeeds."""
    import docker

    from toolgym.sandbox.docker_pool import remove_container

    calls = []

    def flaky_remove(*args, force):
        calls.append(force)
        if len(calls) < 3:
            raise docker.errors.APIError("Could not kill running container x, cannot remove - Container x is not running")

    assert remove_container(flaky_remove) and calls == [True, True, True]

    def gone(*args, force):
        raise docker.errors.NotFound("no such container")

    assert remove_container(gone)
