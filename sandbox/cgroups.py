"""Per-sandbox cgroups (v2 or v1) for memory, pids and CPU limits, where the hierarchy is writable.

Where it is not (an unprivileged user without delegation), `CgroupLimiter.create` returns None
and the bwrap backend falls back to rlimits.
"""

from __future__ import annotations

import functools
import os
import signal
import threading
import time
import uuid
from pathlib import Path

V2_ROOT = Path("/sys/fs/cgroup")
V1 = {"memory": Path("/sys/fs/cgroup/memory"), "pids": Path("/sys/fs/cgroup/pids"), "cpu": Path("/sys/fs/cgroup/cpu")}


@functools.cache
def _own_v1_path(controller: str) -> str:
    # Cached on first use: `CgroupLimiter.spawn` moves a thread into a sandbox's cgroup for a
    # moment, and reading /proc/self/cgroup then would nest a new sandbox's cgroup inside it.
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, names, path = line.split(":", 2)
        if controller in names.split(","):
            return path.lstrip("/")
    return ""


@functools.cache
def _own_v2_path() -> str:
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        if line.startswith("0::"):
            return line[3:].lstrip("/")
    return ""


class CgroupLimiter:
    """One cgroup (per controller on v1) holding every process of one sandbox."""

    def __init__(self, dirs: dict[str, Path], version: int) -> None:
        self.dirs = dirs
        self.version = version

    @classmethod
    def create(cls, memory_mb: int, pids: int, cpus: float) -> CgroupLimiter | None:
        """A new limited cgroup, or None if cgroups are not writable here."""
        name = f"toolgym-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        try:
            if (V2_ROOT / "cgroup.controllers").exists():
                parent = V2_ROOT / _own_v2_path()
                d = parent / name
                d.mkdir()
                limiter = cls({"memory": d, "pids": d, "cpu": d}, 2)
                (d / "memory.max").write_text(str(memory_mb << 20))
                (d / "memory.swap.max").write_text("0") if (d / "memory.swap.max").exists() else None
                (d / "pids.max").write_text(str(pids))
                (d / "cpu.max").write_text(f"{int(cpus * 100000)} 100000")
                return limiter
            if all(p.is_dir() for p in V1.values()):
                dirs = {}
                for ctl, root in V1.items():
                    d = root / _own_v1_path(ctl) / name
                    d.mkdir()
                    dirs[ctl] = d
                limiter = cls(dirs, 1)
                (dirs["memory"] / "memory.limit_in_bytes").write_text(str(memory_mb << 20))
                try:
                    (dirs["memory"] / "memory.memsw.limit_in_bytes").write_text(str(memory_mb << 20))
                except OSError:
                    pass
                (dirs["pids"] / "pids.max").write_text(str(pids))
                (dirs["cpu"] / "cpu.cfs_period_us").write_text("100000")
                (dirs["cpu"] / "cpu.cfs_quota_us").write_text(str(int(cpus * 100000)))
                return limiter
        except OSError:
            return None
        return None

    _spawn_lock = threading.Lock()

    def spawn(self, start):
        """Run `start()` (which forks a child) so that the child is born inside this cgroup.

        On cgroup v1 the calling *thread* is moved in, `start()` forks, and the thread moves back:
        no helper process and no window in which a child escapes the limits. On v2 (where a
        thread cannot move alone) returns None and the caller uses a launcher shell instead.
        """
        if self.version != 1:
            return None
        tid = str(threading.get_native_id())
        with self._spawn_lock:
            homes = {ctl: V1[ctl] / _own_v1_path(ctl) for ctl in self.dirs}
            for ctl, d in self.dirs.items():
                (d / "tasks").write_text(tid)
            try:
                return start()
            finally:
                for ctl, home in homes.items():
                    (home / "tasks").write_text(tid)

    def join_paths(self) -> list[str]:
        """The `cgroup.procs` files a new process writes its pid into (before exec)."""
        return sorted({str(d / "cgroup.procs") for d in self.dirs.values()})

    def counters(self) -> dict[str, int]:
        """oom kills and pid-limit hits so far."""
        out = {"oom": 0, "pids_max": 0}
        try:
            if self.version == 2:
                for line in (self.dirs["memory"] / "memory.events").read_text().splitlines():
                    k, v = line.split()
                    if k == "oom_kill":
                        out["oom"] = int(v)
                for line in (self.dirs["pids"] / "pids.events").read_text().splitlines():
                    k, v = line.split()
                    if k == "max":
                        out["pids_max"] = int(v)
            else:
                for line in (self.dirs["memory"] / "memory.oom_control").read_text().splitlines():
                    k, v = line.split()
                    if k == "oom_kill":
                        out["oom"] = int(v)
                events = self.dirs["pids"] / "pids.events"
                if events.exists():
                    for line in events.read_text().splitlines():
                        k, v = line.split()
                        if k == "max":
                            out["pids_max"] = int(v)
        except OSError:
            pass
        return out

    def pids(self) -> list[int]:
        """Processes currently in the cgroup that belong to the sandbox.

        On cgroup v1 `spawn` moves one *thread* of this process into the cgroup for the moment of
        a fork, and `cgroup.procs` lists a process while any of its threads is inside: a reading
        taken then would count the harness itself (and, on a busy machine, that moment is not
        short). So the listing is read under the spawn lock (no thread of this process is in
        transit meanwhile) and this process is never counted: it is the host, not the sandbox."""
        out: set[int] = set()
        with self._spawn_lock:
            for d in self.dirs.values():
                try:
                    out.update(int(x) for x in (d / "cgroup.procs").read_text().split())
                except OSError:
                    pass
        out.discard(os.getpid())
        return sorted(out)

    def kill_all(self) -> int:
        """SIGKILL every process in the cgroup (repeatedly, to catch forks in flight)."""
        killed: set[int] = set()
        if self.version == 2 and (self.dirs["pids"] / "cgroup.kill").exists():
            before = self.pids()
            try:
                (self.dirs["pids"] / "cgroup.kill").write_text("1")
                killed.update(before)
            except OSError:
                pass
        for _ in range(50):
            pids = self.pids()
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                    killed.add(pid)
                except ProcessLookupError:
                    pass
            time.sleep(0.0005)  # killed processes leave within a millisecond or two
        return len(killed)

    def remove(self) -> None:
        """Kill what is left and remove the cgroup directories."""
        self.kill_all()
        for d in set(self.dirs.values()):
            for _ in range(100):
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.01)
