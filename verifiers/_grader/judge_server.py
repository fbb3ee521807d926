# toolgym judge server: runs inside the long-lived judge sandbox (see verifiers/judge.py).
#
# It imports pytest once, then serves jobs named by lines on the request FIFO; a job is a
# directory beside this file that the host has written (the hidden tests, the ini, later the
# probe records):
#   "prep JOB"          fork a child that prepares pytest's configuration there, then waits
#   "go JOB TIMEOUT_S"  the records are in place: the child runs the tests (killed at the
#                       deadline) and writes junit.xml; the server answers "JOB CODE" on the
#                       reply FIFO once it has exited
#   "cancel JOB"        the child is not needed (the probe stage failed): it exits
# The preparation overlaps the probe stage, so a judgement waits only for the tests themselves.
# Jobs run side by side, each in its own child, so nothing one imports reaches another. Only
# the task's hidden tests and plain probe data ever run here: never agent code.
import gc
import importlib
import os
import select
import signal
import sys
import time

from _pytest.config import _prepareconfig, default_plugins

for _name in ["pytest"] + ["_pytest." + p for p in default_plugins] + ["xml.etree.ElementTree"]:  # once
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


#: A prepared child that never gets its "go" is killed after this long (the host went away).
PREPARED_MAX_S = 900


def run_job(job, go_r):
    """In the child: prepare the configuration, wait for the go, run; pytest's exit code."""
    directory = os.path.join(ROOT, job)
    os.chdir(directory)
    out = os.open("output.txt", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(out, 1)
    os.dup2(out, 2)
    # --tb=line: a failure's message is all the verdict keeps (the sentinel fails every time)
    args = ["-q", "-p", "no:cacheprovider", "-c", "pytest.ini", "--rootdir", directory, "--import-mode=importlib",
            "--junitxml=junit.xml", "--tb=line", "."]
    config = _prepareconfig(args, None)  # what pytest.main does first; the rest needs the records
    try:
        if not os.read(go_r, 1):
            return 75  # cancelled
        return config.hook.pytest_cmdline_main(config=config)
    finally:
        config._ensure_unconfigure()


def start(job):
    """Fork the job's child; returns (pid, the write end of its go pipe)."""
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid:
        os.close(go_r)
        return pid, go_w
    code = 70
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for fd in (requests, replies, wake_r, wake_w, go_w):
            os.close(fd)
        code = int(run_job(job, go_r))
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
    jobs = {}  # job -> [pid, go pipe's write end or None, deadline]
    pending = b""
    while True:
        now = time.monotonic()
        wait = min((j[2] for j in jobs.values()), default=now + 3600) - now
        ready = {fd for fd, _ in poller.poll(max(0.0, wait) * 1000)}
        if requests in ready:
            chunk = os.read(requests, 65536)
            if not chunk:
                return
            pending += chunk
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                verb, job, *rest = line.decode().split()
                if "/" in job or job.startswith("."):
                    continue
                if verb == "prep" and job not in jobs:
                    pid, go_w = start(job)
                    jobs[job] = [pid, go_w, time.monotonic() + PREPARED_MAX_S]
                elif verb in ("go", "cancel") and job in jobs and jobs[job][1] is not None:
                    if verb == "go":
                        os.write(jobs[job][1], b"g")
                        jobs[job][2] = time.monotonic() + float(rest[0])
                    os.close(jobs[job][1])  # a cancelled child reads end-of-file and exits
                    jobs[job][1] = None
        if wake_r in ready:
            os.read(wake_r, 4096)
        for job, (pid, go_w, deadline) in list(jobs.items()):
            done, status = os.waitpid(pid, os.WNOHANG)
            if not done and time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                done, status = os.waitpid(pid, 0)
            if done:
                del jobs[job]
                if go_w is not None:
                    os.close(go_w)
                os.write(replies, f"{job} {os.waitstatus_to_exitcode(status)}\n".encode())


main()
