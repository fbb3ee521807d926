"""What the host does to a docker sandbox's container directly, without `docker exec` (a runc
start is most of a reset's time): find its cgroups, kill every process but its init through them,
empty its scratch directories through the init's root, and so reset a used container.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING

from toolgym.sandbox import fs
from toolgym.sandbox.base import SandboxInfraError

if TYPE_CHECKING:
    from toolgym.sandbox.docker_pool import _Slot

#: Where the sandbox user can write in a container besides the workspace and the event log
#: (the root filesystem is read-only): emptied from the host by every reset.
SCRATCH_DIRS = ("/tmp", "/dev/shm")


def cgroup_dirs(slot: _Slot) -> dict[str, Path]:
    """The container's cgroup directories (memory, pids) on this host's layout."""
    cid = slot.container.id
    found: dict[str, Path] = {}
    for ctl in ("memory", "pids"):
        for base in (
            Path(f"/sys/fs/cgroup/{ctl}/docker/{cid}"),
            Path(f"/sys/fs/cgroup/docker/{cid}"),
            Path(f"/sys/fs/cgroup/system.slice/docker-{cid}.scope"),
        ):
            if base.is_dir():
                found[ctl] = base
                break
    return found


def kill_from_host(slot: _Slot) -> int | None:
    """Kill every process of the container but its init from the host, through its cgroup, and
    wait until the cgroup holds the init alone: no `docker exec` (a runc start, most of a
    reset's time). The count killed, or None where the host cannot (not root, no cgroup
    directory found): the in-container path runs then."""
    procs = cgroup_dirs(slot).get("pids", Path("/nonexistent")) / "cgroup.procs"
    if os.geteuid() != 0 or not procs.exists():
        return None
    killed: set[int] = set()
    deadline = time.monotonic() + 2
    while True:
        pids = [int(p) for p in procs.read_text().split()]
        init = slot.init_pid or _container_init(pids)
        if init is None:
            return None
        slot.init_pid = init
        others = [p for p in pids if p != init]
        if not others:
            return len(killed)
        if time.monotonic() > deadline:
            raise SandboxInfraError(f"reset left processes behind in the container: {others[:5]}")
        for pid in others:
            # pids are read from the container's cgroup a moment before: reuse needs the host's
            # pid counter to wrap around in between
            try:
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
            except ProcessLookupError:
                pass
        time.sleep(0.001)


def clear_scratch_from_host(slot: _Slot) -> None:
    """Empty the container's scratch directories (`SCRATCH_DIRS`) through its init's root (no
    symlink is followed)."""
    for scratch in SCRATCH_DIRS:
        for entry in os.scandir(f"/proc/{slot.init_pid}/root{scratch}"):
            if entry.is_dir(follow_symlinks=False):
                fs.remove_tree(entry.path)
            else:
                os.unlink(entry.path)


def host_reset(slot: _Slot) -> bool:
    """Make a used container as a started one was, from the host: every process but its init
    killed, scratch directories, workspace and event log emptied. False if the host cannot."""
    if kill_from_host(slot) is None:
        return False
    clear_scratch_from_host(slot)
    for directory in (slot.state / "ws", slot.state / "log"):
        for child in list(directory.iterdir()):
            fs.remove_tree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
    home = slot.state / "home"
    for child in list(home.iterdir()):  # the canary, if the last user had one
        fs.remove_tree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
    return True


def _container_init(pids: list[int]) -> int | None:
    """Which of a container's host pids is its PID 1 (the last NSpid field is 1)."""
    for pid in pids:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith("NSpid:") and line.split()[-1] == "1":
                return pid
    return None


__all__ = ["SCRATCH_DIRS", "cgroup_dirs", "clear_scratch_from_host", "host_reset", "kill_from_host"]
