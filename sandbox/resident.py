"""Resident execution for the bwrap backend: one long-lived bwrap per sandbox state whose PID 1
is a small init (`_native/init.py`) that receives commands over a socket and forks them.

An exec then costs a fork and a wait (about a millisecond) instead of a sandbox start (6-8 ms).
What a fresh bwrap per command guaranteed still holds: each command runs under the same exec
wrapper (start mark, limits, leftover scan), and the init kills and reaps every other process of
the sandbox before it answers, so no process outlives an exec. The init is PID 1 (immune to the
commands' signals) and not dumpable (no ptrace, no /proc peeking). The workspace's overlay stays
mounted while the init lives, so anything that changes the layers on the host (reset, restore)
stops it first; the next exec starts a new one.

This module is the host's side: start, send a command, read the answer, stop.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
from collections.abc import Callable

INIT_MOUNT = "/.toolgym-init.py"
#: Where the sandbox's Python lives (the toolgym root filesystem has it; a bare host root may not).
PYTHON = "/usr/bin/python3"


class ResidentDied(Exception):
    """The init ended while a command ran (or could not be reached)."""


class InitChannel:
    """The host's end of a connected socket to a running init (`_native/init.py`): hand it a
    command, ask it to kill, read the exit code. Both backends use it: bwrap's init is the
    resident's PID 1 (`Resident`), docker's is the container's PID 1."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.stopped = False  # set when the host stopped the init (not a death)

    def send(self, cmd: str, cwd: str, env: dict[str, str], fds: tuple[int, int, int]) -> None:
        """Hand the init one command with its stdin, stdout and stderr."""
        try:
            socket.send_fds(self.sock, [json.dumps({"cmd": cmd, "cwd": cwd, "env": env}).encode()], list(fds))
        except OSError as err:
            raise ResidentDied(f"cannot reach the sandbox's init: {err}") from None

    def request_kill(self) -> None:
        """Ask the init to kill the running command and everything else but itself."""
        try:
            self.sock.send(b'{"kill": true}')
        except OSError:
            self.stop()

    def answer(self) -> int:
        """The exit code of the command just run (Popen's convention: -N for signal N)."""
        try:
            self.sock.settimeout(5)
            data = self.sock.recv(4096)
            self.sock.settimeout(None)
        except OSError:
            data = b""
        if not data:
            raise ResidentDied("the sandbox's init ended while the command ran")
        return int(json.loads(data)["exit"])

    def stop(self) -> None:
        """Mark the init as stopped by the host (subclasses also kill it)."""
        self.stopped = True

    def release(self) -> None:
        """Close the host's end of the socket."""
        self.sock.close()


def run_command(
    channel: InitChannel, cmd: str, cwd: str, env: dict[str, str], stdin: str | None, timeout_s: float, keep: int, kill_at: int, watch=None
):
    """Run one command through `channel`: pipes for its output (read with `collect_fds`, bounded,
    killed at the deadline, past `kill_at` bytes or when `watch()` says so), its stdin fed, its exit code read.
    Returns (Collected, exit code); raises `ResidentDied` if the init never took the command
    (nothing ran: the caller may run it another way) and `InitLost` if it ended meanwhile."""
    from toolgym.sandbox.collect import collect_fds

    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    in_r, in_w = os.pipe() if stdin is not None else (os.open(os.devnull, os.O_RDONLY), None)
    try:
        try:
            channel.send(cmd, cwd, env, (in_r, out_w, err_w))
        finally:
            for fd in (in_r, out_w, err_w):
                os.close(fd)
        if in_w is not None:
            try:
                with open(in_w, "wb", closefd=False) as feed:
                    feed.write(stdin.encode())  # type: ignore[union-attr]
            except BrokenPipeError:
                pass
            finally:
                os.close(in_w)
                in_w = None
        got = collect_fds(out_r, err_r, channel.sock.fileno(), timeout_s, keep, kill_at, channel.request_kill, watch)
        try:
            return got, channel.answer()
        except ResidentDied as died:
            raise InitLost(str(died), got) from None
    finally:
        for fd in (out_r, err_r) + ((in_w,) if in_w is not None else ()):
            os.close(fd)


class InitLost(Exception):
    """The init ended while the command ran; `got` is what the command printed until then."""

    def __init__(self, message: str, got) -> None:
        super().__init__(message)
        self.got = got


class Resident(InitChannel):
    """A running init: its bwrap process and the host's end of the control socket."""

    def __init__(self, spawn: Callable[[list[str], tuple[int, ...]], subprocess.Popen], args: list[str]) -> None:
        """Start it: `args` are bwrap's arguments up to (not including) `--`; `spawn(argv,
        pass_fds)` starts a process the way the sandbox starts bwrap (its user, its cgroup).
        Raises `ResidentDied` if the sandbox does not come up."""
        sock, inner = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        super().__init__(sock)
        info_r, info_w = os.pipe()
        try:
            self.proc = spawn(
                args + ["--info-fd", str(info_w), "--", PYTHON, "-I", "-S", INIT_MOUNT, str(inner.fileno())], (inner.fileno(), info_w)
            )
        except BaseException:
            self.sock.close()
            raise
        finally:
            inner.close()
            os.close(info_w)
        try:
            # bwrap's --info-fd: the init's pid as the host sees it (stop() kills it there: the
            # sandbox's namespace dies with its PID 1)
            self.init_pid = _read_child_pid(info_r)
            self.init_fd = os.pidfd_open(self.init_pid)  # wakes `wait` the moment the init is gone
        except OSError as err:
            self.close()
            raise ResidentDied(f"the sandbox's init is gone: {err}") from None
        except BaseException:  # ResidentDied, or a bug of ours: never leave the bwrap behind
            self.close()
            raise
        finally:
            os.close(info_r)

    def alive(self) -> bool:
        """True while the bwrap process runs."""
        return self.proc.poll() is None

    def stop(self) -> None:
        """Kill the init (the whole sandbox namespace dies with its PID 1) and its bwrap. The
        socket stays open (a command's thread may be waiting on it: it reads the end); `close`
        releases it."""
        self.stopped = True
        for kill, pid in ((os.kill, getattr(self, "init_pid", None)), (os.killpg, self.proc.pid)):
            if pid is not None and self.proc.poll() is None:
                try:
                    kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def close(self) -> None:
        """Stop it and release the host's end of the socket (once no thread waits on it)."""
        self.stop()
        self.wait()
        self.release()

    def release(self) -> None:
        """Close the host's file descriptors (the socket, the init's pidfd)."""
        super().release()
        fd, self.init_fd = getattr(self, "init_fd", None), None
        if fd is not None:
            os.close(fd)

    def wait(self) -> None:
        """Wait, after `stop`, until the init has exited (its exit comes after every process of
        its namespace is gone) and reap its bwrap."""
        fd = getattr(self, "init_fd", None)
        if fd is not None:
            poller = select.poll()
            poller.register(fd, select.POLLIN)
            poller.poll(2000)
        try:
            self.proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            pass


def _read_child_pid(fd: int, timeout_s: float = 10.0) -> int:
    """The `child-pid` of bwrap's --info-fd JSON (read until it parses, EOF or the deadline)."""
    import time

    data = b""
    deadline = time.monotonic() + timeout_s
    poller = select.poll()  # not select(): a harness with many sandboxes has fds past 1024
    poller.register(fd, select.POLLIN)
    while True:
        try:
            return int(json.loads(data)["child-pid"])
        except (ValueError, KeyError):
            pass
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not poller.poll(remaining * 1000):
            raise ResidentDied("bwrap did not report the sandbox's init in time")
        chunk = os.read(fd, 4096)
        if not chunk:
            raise ResidentDied(f"bwrap could not start the sandbox's init: {data[-200:]!r}")
        data += chunk
