"""The resident init of a bwrap sandbox (see `resident.py`): started in the background after
creation, reset and restore; claimed by one command at a time; stopped (and waited for) before
the layers change under its mount. A mixin of `BwrapSandbox`, whose state it uses: `_lock`,
`_resident`, `_resident_busy`, `_prestart`, `_spawn`, `_resident_args`, `cgroup`, `limits`."""

from __future__ import annotations

import signal
import threading
import time

from toolgym.sandbox.base import ExecResult, SandboxError, SandboxInfraError
from toolgym.sandbox.collect import STARTED_MARK
from toolgym.sandbox.resident import InitLost, Resident, ResidentDied, run_command


class ResidentInit:
    """How a bwrap sandbox keeps, claims and drops its resident init."""

    def _prestart_resident(self) -> None:
        """Start the init in the background (after creation, reset, restore): an agent's first
        command usually comes a model generation later, so it finds the init up."""
        if not self.use_resident:
            return

        def run() -> None:
            if self._resident_busy.acquire(blocking=False):
                try:
                    self._remove_stale_layers()  # the previous episode's, off the reset's clock
                    self._running_resident()
                except (ResidentDied, SandboxError, OSError):
                    pass  # the first exec tries again, or takes a fresh bwrap and says why
                finally:
                    self._resident_busy.release()

        self._prestart = threading.Thread(target=run, daemon=True, name="toolgym-resident-start")
        self._prestart.start()

    def _wait_prestart(self) -> None:
        thread = self._prestart
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=10)

    def _running_resident(self) -> Resident:
        """The init, started if it is not running (the caller holds `_resident_busy`)."""
        with self._lock:
            resident = self._resident
        if resident is None or not resident.alive():
            if resident is not None:  # stopped by the host between commands (kill_all)
                resident.close()
            resident = Resident(lambda argv, fds: self._spawn(argv, False, fds, pipes=False), self._resident_args())
            with self._lock:
                self._resident = resident
        return resident

    def _claim_resident(self) -> Resident | None:
        """The running init, started if needed and reserved for one command; None when this
        exec takes a fresh bwrap (resident off, or another command is running)."""
        if not self.use_resident:
            return None
        self._wait_prestart()  # a starting init is worth waiting for
        if not self._resident_busy.acquire(blocking=False):
            return None
        try:
            return self._running_resident()
        except ResidentDied:
            self._resident_busy.release()
            return None  # the fresh-bwrap path runs the command and reports why it cannot start
        except BaseException:
            self._resident_busy.release()
            raise

    def _exec_resident(
        self, resident: Resident, cmd: str, timeout: float, cwd: str, env: dict[str, str] | None, stdin: str | None
    ) -> ExecResult:
        counters = self.cgroup.counters() if self.cgroup else {}
        variables = self._variables({**(env or {}), "TOOLGYM_STARTED_MARK": STARTED_MARK})
        start = time.perf_counter()
        try:  # ResidentDied (the init never took it) goes to the caller, which runs it another way
            got, code = run_command(
                resident, cmd, cwd, variables, stdin, timeout, self.limits.output_bytes, self.limits.output_kill_bytes, self.over_disk_limit
            )
        except InitLost as lost:
            got, code = lost.got, self._resident_died(resident, counters, lost)
        self._check_started(got)
        return self._result(got, code, start, counters)

    def _resident_died(self, resident: Resident, counters: dict[str, int], died: Exception) -> int:
        """The init ended during a command: killed by the host (kill_all, close) or by the memory
        limit (the command's doing: its result says so), else an infra error (ours)."""
        stopped = resident.stopped
        resident.stop()
        resident.wait()  # its socket is closed by whoever replaces or drops it
        if self.closed or getattr(self, "closing", False):
            raise SandboxInfraError("sandbox is closed")
        oom = self.cgroup is not None and self.cgroup.counters().get("oom", 0) > counters.get("oom", 0)
        if stopped or oom:
            return -signal.SIGKILL  # as a command whose fresh bwrap was killed
        raise SandboxInfraError(str(died))

    def _drop_resident(self, meanwhile=None) -> None:
        """Stop the init and wait until it is gone (the layers are about to change under its
        mount); `meanwhile()` runs between the kill and the wait (its namespace takes a
        millisecond or so to die)."""
        self._wait_prestart()
        with self._lock:
            resident, self._resident = self._resident, None
        if resident is not None:
            resident.stop()
        if meanwhile is not None:
            meanwhile()
        if resident is None:
            return
        resident.wait()
        # a command's thread may still be reading the end from the socket: close it after that
        if self._resident_busy.acquire(timeout=5):
            try:
                resident.release()
            finally:
                self._resident_busy.release()


__all__ = ["ResidentInit"]
