# toolgym judge server: runs inside the long-lived judge sandbox (see verifiers/judge.py).
#
# It imports pytest once, then serves jobs: a line "JOB TIMEOUT_S" on the request FIFO names a
# directory (the hidden tests, the probe records, the ini) that the host has written beside this
# file; a forked child runs pytest there and writes junit.xml, and the server answers "JOB CODE"
# on the reply FIFO. Jobs run side by side, each in its own child, so nothing one imports
# reaches another. Only the task's hidden tests and plain probe data ever run here: never agent
# code.
import gc
import importlib
import os
import select
import signal
import sys
import time

import pytest
from _pytest.config import default_plugins

for _name in ["_pytest." + p for p in default_plugins] + ["xml.etree.ElementTree"]:  # once, not per job
    try:
        importlib.import_module(_name)
    except ImportError:
        pass

gc.freeze()  # what is loaded now stays out of every job's garbage collections
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
requests = os.open(sys.argv[1], os.O_RDONLY)
replies = os.open(sys.argv[2], os.O_WRONLY)
wake_r, wake_w = os.pipe()
os.set_blocking(wake_w, False)
signal.set_wakeup_fd(wake_w)
signal.signal(signal.SIGCHLD, lambda *_: None)


def run_job(job):
    directory = os.path.join(ROOT, job)
    os.chdir(directory)
    out = os.open("output.txt", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(out, 1)
    os.dup2(out, 2)
    # --tb=line: a failure's message is all the verdict keeps (the sentinel fails every time)
    return pytest.main(["-q", "-p", "no:cacheprovider", "-c", "pytest.ini", "--rootdir", directory,
                        "--import-mode=importlib", "--junitxml=junit.xml", "--tb=line", "."])


def start(job):
    pid = os.fork()
    if pid:
        return pid
    code = 70
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for fd in (requests, replies, wake_r, wake_w):
            os.close(fd)
        code = int(run_job(job))
    except BaseException:
        pass
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()  # os._exit skips it: pytest's summary would be lost
            except BaseException:
                pass
        os._exit(code)


def main():
    poller = select.poll()
    poller.register(requests, select.POLLIN)
    poller.register(wake_r, select.POLLIN)
    running = {}  # pid -> (job, deadline)
    pending = b""
    while True:
        now = time.monotonic()
        wait = min((d for _, d in running.values()), default=now + 3600) - now
        ready = {fd for fd, _ in poller.poll(max(0.0, wait) * 1000)}
        if requests in ready:
            chunk = os.read(requests, 65536)
            if not chunk:
                return
            pending += chunk
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                job, timeout_s = line.decode().split()
                if "/" in job or job.startswith("."):
                    continue
                running[start(job)] = (job, time.monotonic() + float(timeout_s))
        if wake_r in ready:
            os.read(wake_r, 4096)
        for pid, (job, deadline) in list(running.items()):
            done, status = os.waitpid(pid, os.WNOHANG)
            if not done and time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                done, status = os.waitpid(pid, 0)
            if done:
                del running[pid]
                os.write(replies, f"{job} {os.waitstatus_to_exitcode(status)}\n".encode())


main()
