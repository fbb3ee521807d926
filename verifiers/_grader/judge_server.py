# toolgym judge server: runs inside the long-lived judge sandbox (see verifiers/judge.py).
#
# It imports pytest once, then serves jobs named by lines on the request FIFO; a job is a
# directory beside this file that the host has written (the hidden tests, the ini, the probe
# records):
#   "run JOB TIMEOUT_S"  fork a child that runs pytest there (killed at the deadline) and writes
#                        junit.xml; the server answers "JOB CODE" on the reply FIFO once it exited
# What every judgement shares (pytest's plugins and options, compiled patterns) is done once,
# here, before any job, and inherited through fork: a child parses its own arguments and runs.
# Jobs run side by side, each in its own child, so nothing one imports reaches another. Only
# the task's hidden tests and plain probe data ever run here: never agent code.
import fnmatch
import gc
import importlib
import os
import select
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

from _pytest.config import _prepareconfig, default_plugins, get_config

for _name in ["pytest"] + ["_pytest." + p for p in default_plugins] + ["xml.etree.ElementTree"]:  # once
    try:
        importlib.import_module(_name)
    except ImportError:
        pass

#: Plugins a judgement never needs: its tests are ours and run once, headless (no cache, no
#: doctests, no debugger, no pastebin...). A name this pytest lacks is simply not loaded.
NO_PLUGINS = [arg for name in ("cacheprovider", "debugging", "doctest", "faulthandler", "nose", "pastebin",
                               "stepwise") for arg in ("-p", "no:" + name)]


def job_args():
    """pytest's arguments for a judgement in the current directory."""
    # --tb=line: a failure's message is all the verdict keeps (the sentinel fails every time)
    return ["-q", *NO_PLUGINS, "-c", "pytest.ini", "--rootdir", os.getcwd(), "--import-mode=importlib",
            "--junitxml=junit.xml", "--tb=line", "."]


def warm_up():
    """Fill the caches every judgement would otherwise fill again in its own child: argparse's,
    `re`'s and fnmatch's compiled patterns, the JUnit escaper's. A throwaway configuration is
    parsed (never configured: nothing global changes) in an empty directory of ours."""
    here = os.getcwd()
    scratch = tempfile.mkdtemp(prefix=".warm-", dir=ROOT)  # a job's name never starts with "."
    try:
        os.chdir(scratch)
        with open("pytest.ini", "w") as f:
            f.write("[pytest]\n")
        config = _prepareconfig(job_args(), None)
        try:
            for key in ("python_files", "norecursedirs"):
                for pattern in config.getini(key):
                    fnmatch.fnmatch("x.py", pattern)
        finally:
            config._ensure_unconfigure()
        from _pytest import junitxml

        junitxml.bin_xml_escape("x")
    except Exception:  # a cache left cold costs time, never correctness
        pass
    finally:
        os.chdir(here)
        shutil.rmtree(scratch, ignore_errors=True)


def reuse_argument_parsers():
    """pytest builds its argparse parser from scratch each time it parses (6 times a
    judgement, 400 options each time: half of a child's preparation). Keep the one built last
    while no option has been added since (a conftest or a plugin can add some: the next parse
    then builds a new one). Where this pytest has no such method, nothing changes."""
    try:
        from _pytest.config.argparsing import Parser

        build = Parser._getparser
    except (ImportError, AttributeError):
        return

    def options_key(parser):
        groups = list(parser._groups) + [parser._anonymous]
        return len(groups), sum(len(group.options) for group in groups)

    def getparser(self):
        key = options_key(self)
        kept = self.__dict__.get("_toolgym_kept_parser")
        if kept is None or kept[0] != key:
            kept = self._toolgym_kept_parser = (key, build(self))
        return kept[1]

    Parser._getparser = getparser


def template_config():
    """A configuration with pytest's plugins registered and its options declared (what
    `get_config` does before any argument is parsed, and half a judgement's set-up), built once:
    each child inherits its own copy through fork and parses its job's arguments into it. None
    where this pytest differs (each child then builds its own)."""
    try:
        config = get_config(job_args())
        # the child replaces this with its own: fail here, not there, if it cannot
        config.invocation_params = type(config.invocation_params)(args=(), plugins=None, dir=Path.cwd())
        config._parser._getparser()  # built here, once, for every child
        return config
    except Exception:
        return None


HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
reuse_argument_parsers()
warm_up()
TEMPLATE = template_config()
gc.freeze()  # what is loaded now stays out of every job's garbage collections
requests = os.open(sys.argv[1], os.O_RDONLY)
replies = os.open(sys.argv[2], os.O_WRONLY)
wake_r, wake_w = os.pipe()
os.set_blocking(wake_w, False)
signal.set_wakeup_fd(wake_w)
signal.signal(signal.SIGCHLD, lambda *_: None)


def job_config(args):
    """The child's configuration for `args`, parsed into its copy of the template (as
    `_prepareconfig` would, with the job's directory as the invocation directory)."""
    if TEMPLATE is None:
        return _prepareconfig(args, None)
    config = TEMPLATE
    config.invocation_params = type(config.invocation_params)(args=tuple(args), plugins=None, dir=Path.cwd())
    try:
        return config.pluginmanager.hook.pytest_cmdline_parse(pluginmanager=config.pluginmanager, args=args)
    except BaseException:
        config._ensure_unconfigure()
        raise


def run_job(job):
    """In the child: run pytest in the job's directory; its exit code."""
    directory = os.path.join(ROOT, job)
    os.chdir(directory)
    out = os.open("output.txt", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(out, 1)
    os.dup2(out, 2)
    config = job_config(job_args())
    try:
        return config.hook.pytest_cmdline_main(config=config)
    finally:
        config._ensure_unconfigure()


def start(job):
    """Fork the job's child; returns its pid."""
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
    jobs = {}  # job -> [pid, deadline]
    pending = b""
    while True:
        now = time.monotonic()
        wait = min((j[1] for j in jobs.values()), default=now + 3600) - now
        ready = {fd for fd, _ in poller.poll(max(0.0, wait) * 1000)}
        if requests in ready:
            chunk = os.read(requests, 65536)
            if not chunk:
                return
            pending += chunk
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                verb, job, *rest = line.decode().split()
                if verb == "run" and rest and "/" not in job and not job.startswith(".") and job not in jobs:
                    jobs[job] = [start(job), time.monotonic() + float(rest[0])]
        if wake_r in ready:
            os.read(wake_r, 4096)
        for job, (pid, deadline) in list(jobs.items()):
            done, status = os.waitpid(pid, os.WNOHANG)
            if not done and time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                done, status = os.waitpid(pid, 0)
            if done:
                del jobs[job]
                os.write(replies, f"{job} {os.waitstatus_to_exitcode(status)}\n".encode())


main()
