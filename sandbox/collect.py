"""Reading a command's output: bounded, with a deadline, woken by its exit (both backends)."""

from __future__ import annotations

import os
import selectors
import subprocess
import time
from collections.abc import Callable

#: How often a running command's `watch` (the disk check) is asked whether to stop it.
WATCH_EVERY_S = 0.25


class Collected:
    """Output of a finished process: kept bytes, total byte counts, and why it was stopped."""

    def __init__(self) -> None:
        self.out, self.err = bytearray(), bytearray()
        self.total_out = self.total_err = 0
        self.timed_out = False
        self.overflow = False
        #: the `watch` asked for the command to be stopped (e.g. its disk limit)
        self.watched_out = False

    @property
    def truncated(self) -> bool:
        """True if some output was not kept."""
        return self.total_out > len(self.out) or self.total_err > len(self.err)


def collect(proc: subprocess.Popen, timeout_s: float, keep: int, kill_at: int, kill, watch: Callable[[], bool] | None = None) -> Collected:
    """Read a process's stdout/stderr (bounded) and wait for its exit (see `collect_fds`)."""
    pidfd = os.pidfd_open(proc.pid)
    try:
        return collect_fds(
            proc.stdout.fileno(),
            proc.stderr.fileno(),
            pidfd,  # type: ignore[union-attr]
            timeout_s,
            keep,
            kill_at,
            kill,
            watch,
        )
    finally:
        os.close(pidfd)


def collect_fds(
    out_fd: int, err_fd: int, exit_fd: int, timeout_s: float, keep: int, kill_at: int, kill, watch: Callable[[], bool] | None = None
) -> Collected:
    """Read stdout/stderr (bounded) and wait for exit in one select loop, with a deadline.

    No helper threads and no polling sleeps: `exit_fd` (a pidfd, or the resident init's socket,
    which it answers on) wakes the loop the moment the command exits. `kill()` is called on
    timeout, when output passes `kill_at` bytes, or when `watch()` (asked every `WATCH_EVERY_S`
    while the command runs) returns True.
    """
    res = Collected()
    sel = selectors.DefaultSelector()
    streams = {out_fd: "out", err_fd: "err"}
    for stream in streams:
        os.set_blocking(stream, False)
        sel.register(stream, selectors.EVENT_READ)
    sel.register(exit_fd, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout_s
    next_watch = time.monotonic() + WATCH_EVERY_S
    exited = False
    try:
        while streams or not exited:
            remaining = deadline - time.monotonic()
            if remaining <= 0 and not res.timed_out and not exited:
                res.timed_out = True
                kill()
                deadline = time.monotonic() + 5  # give the pipes time to close after the kill
                remaining = 5
            if remaining <= 0:
                break
            if watch is not None and not exited and not res.watched_out:
                now = time.monotonic()
                if now >= next_watch:
                    next_watch = now + WATCH_EVERY_S
                    if watch():
                        res.watched_out = True
                        kill()
                remaining = min(remaining, max(0.0, next_watch - now))
            for key, _ in sel.select(remaining):
                if key.fileobj == exit_fd:
                    exited = True
                    sel.unregister(exit_fd)
                    continue
                stream = key.fileobj
                try:
                    chunk = os.read(stream, 65536)  # type: ignore[arg-type]
                except BlockingIOError:
                    continue
                if not chunk:
                    sel.unregister(stream)
                    del streams[stream]
                    continue
                buf = res.out if streams[stream] == "out" else res.err
                if streams[stream] == "out":
                    res.total_out += len(chunk)
                else:
                    res.total_err += len(chunk)
                if len(buf) < keep:
                    buf += chunk[: keep - len(buf)]
                if res.total_out + res.total_err > kill_at and not res.overflow:
                    res.overflow = True
                    kill()
    finally:
        sel.close()
    return res


#: The exec wrapper's first stderr line once the command's sandbox is up (stripped from the
#: output): a run without it failed before the command ran (ours, not the command's).
STARTED_MARK = "toolgym-exec-started"


def strip_started_mark(got: Collected) -> bool:
    """Remove the wrapper's start mark from `got`'s stderr; False if it is not there."""
    mark = STARTED_MARK.encode() + b"\n"
    if not got.err.startswith(mark):
        return False
    del got.err[: len(mark)]
    got.total_err -= len(mark)
    return True
