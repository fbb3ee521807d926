# toolgym resident init: PID 1 of a bwrap sandbox (bwrap --as-pid-1, started once per sandbox
# state and kept while the workspace layers stay the same) or of a docker container. It receives
# commands over a SOCK_SEQPACKET socket (argv[1]: an inherited fd, or `--connect PATH`: the
# host's listening socket, bound into the container) and runs each one under the exec wrapper,
# so an exec costs a fork and a wait instead of a sandbox start or a `docker exec`.
#
# Request: a JSON object {"cmd", "cwd", "env"} with three file descriptors (stdin, stdout,
# stderr) passed alongside (SCM_RIGHTS); or {"kill": true} while a command runs. Reply: {"exit":
# code} (negative: killed by that signal) once the command has exited AND every other process of
# the sandbox is dead and reaped: as PID 1, kill(-1) reaches every process but this one, so no
# process outlives an exec. A host that closes the socket ends the sandbox.
#
# Runs as the sandbox user, like the commands; it is not dumpable, so they cannot ptrace it or
# read its /proc files, and as PID 1 it ignores their signals.
import ctypes
import json
import os
import select
import signal
import socket
import sys

PR_SET_DUMPABLE = 4
ctypes.CDLL(None).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
if sys.argv[1] == "--connect":
    control = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    control.connect(sys.argv[2])
else:
    control = socket.socket(fileno=int(sys.argv[1]))
os.set_inheritable(control.fileno(), False)
WRAPPER = ["/bin/sh", "/.toolgym-wrapper.sh"]


def kill_the_rest():
    """Kill every process but this one, then reap until none is left."""
    try:
        os.kill(-1, signal.SIGKILL)
    except ProcessLookupError:
        pass
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return


def start(request, fds):
    pid = os.fork()
    if pid == 0:
        try:
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            os.setsid()
            for target, fd in enumerate(fds):
                os.dup2(fd, target)
            os.closerange(3, 65536)
            os.chdir(request["cwd"])
            os.execve(WRAPPER[0], WRAPPER + [request["cmd"]], request["env"])
        except BaseException as err:  # before the wrapper's start mark: the host sees an infra error
            os.write(2, f"toolgym init: {err}\n".encode(errors="replace"))
        finally:
            os._exit(127)
    for fd in fds:
        os.close(fd)
    return pid


def wait_for(pid):
    """Wait for the command, serving kill requests meanwhile; its exit code."""
    pidfd = os.pidfd_open(pid)
    poller = select.poll()  # not select(): the socket's number is the host's, maybe past 1024
    poller.register(control, select.POLLIN)
    poller.register(pidfd, select.POLLIN)
    try:
        while True:
            ready = {fd for fd, _ in poller.poll()}
            if pidfd in ready:
                break
            message = control.recv(4096)
            if not message:  # the host is gone: so is the sandbox
                kill_the_rest()
                sys.exit(0)
            if json.loads(message).get("kill"):
                os.kill(-1, signal.SIGKILL)
    finally:
        os.close(pidfd)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def reap_orphans():
    """Reap whatever exited meanwhile (orphans of processes the host ran another way)."""
    while True:
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
                return
        except ChildProcessError:
            return


def main():
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    idle = select.poll()
    idle.register(control, select.POLLIN)
    idle.register(wake_r, select.POLLIN)
    while True:
        ready = {fd for fd, _ in idle.poll()}
        if wake_r in ready:
            os.read(wake_r, 4096)
            reap_orphans()
        if control.fileno() not in ready:
            continue
        message, fds, _, _ = socket.recv_fds(control, 1 << 20, 3)
        if not message:
            kill_the_rest()
            return
        try:
            request = json.loads(message)
        except ValueError:
            request = {}
        if "kill" in request and "cmd" not in request:
            continue  # a kill that came after its command ended
        if "cmd" not in request or len(fds) != 3:
            for fd in fds:  # not a command: answer at once (the host sees no start mark: its error)
                os.close(fd)
            control.send(json.dumps({"exit": 127}).encode())
            continue
        code = wait_for(start(request, fds))
        kill_the_rest()
        control.send(json.dumps({"exit": code}).encode())


main()
