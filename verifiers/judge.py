"""The judge as a long-lived service: one sandbox per sandbox config and process, in which a
server (`_grader/judge_server.py`) has imported pytest once and forks one child per judgement.

The judge stage of `HiddenTestVerifier` runs only the task's hidden tests on plain probe data
(never agent code), so it need not pay a sandbox start and a pytest import per task: a
judgement is a fork and the tests themselves. What stays true: the judge runs in a sandbox with
a read-only root and no network; no agent file and no process that ran agent code ever enter
it; each judgement runs in its own process and directory, so nothing one imports reaches the
next; the JUnit report is read on the host's side. A judge that fails (the server died, a job
timed out) is the grader's fault and is reported as such, never as the agent's.

The channel: the host writes a job directory into a directory both sides see
(`Sandbox.host_channel`) and names it on a request FIFO; the server forks a child that parses
its arguments into a pytest configuration the server built once, and runs; it answers "JOB
CODE" on a reply FIFO once the child has exited.
"""

from __future__ import annotations

import atexit
import os
import secrets
import select
import sys
import threading
from importlib import resources
from pathlib import Path

from toolgym.sandbox import Limits, Sandbox, SandboxConfig, SandboxError, make_sandbox
from toolgym.sandbox.fs import read_regular, remove_tree

SERVER_DIR = ".judge"
JUDGE_ENV = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}  # -I ignores PYTHON* variables: the server gets -B


class JudgeError(SandboxError):
    """The judge service could not judge (ours, never the agent's)."""


class Judgement:
    """What one judge run left: pytest's exit code, its JUnit XML and its output."""

    def __init__(self, exit_code: int, junit: str | None, output: str) -> None:
        self.exit_code = exit_code
        self.junit = junit
        self.output = output


def grader_source(name: str) -> str:
    """Text of one of the grader's own scripts (`verifiers/_grader/`)."""
    return resources.files("toolgym.verifiers").joinpath("_grader", name).read_text()


class JudgeService:
    """One judge sandbox with its server; `judge()` is safe to call from many threads."""

    def __init__(self, config: SandboxConfig) -> None:
        cpus = float(os.cpu_count() or 1)
        limits = Limits(
            memory_mb=max(config.limits.memory_mb, 2048),
            pids=max(config.limits.pids, 512),
            cpu_time_s=7 * 86400,
            cpus=cpus,
            timeout_s=config.limits.timeout_s,
        )
        self.box: Sandbox = make_sandbox(
            {}, config.model_copy(update={"canary": False, "protected": (), "limits": limits, "resident": False})
        )  # one long command
        self.host_dir, self.inner_dir, self.uid = self.box.host_channel()
        server = self.host_dir / SERVER_DIR
        server.mkdir()
        (server / "server.py").write_text(grader_source("judge_server.py"))
        for name in ("requests", "replies"):
            os.mkfifo(server / name, 0o600)
        self._own(server, server / "requests", server / "replies")
        os.chmod(server / "server.py", 0o644)
        # O_RDWR: neither side's open blocks, and the host never reads EOF while it holds them
        self._requests = os.open(server / "requests", os.O_RDWR)
        self._replies = os.open(server / "replies", os.O_RDWR)
        self._lock = threading.Lock()
        self._waiting: dict[str, list] = {}  # job -> [event, exit code]
        self.dead: str | None = None
        inner = f"{self.inner_dir}/{SERVER_DIR}"
        cmd = f"python3 -I -B {inner}/server.py {inner}/requests {inner}/replies"  # -I ignores PYTHON* variables
        self._server = threading.Thread(target=self._serve, args=(cmd,), daemon=True, name="toolgym-judge")
        self._server.start()
        self._reader = threading.Thread(target=self._read_replies, daemon=True, name="toolgym-judge-replies")
        self._reader.start()

    def _own(self, *paths: Path) -> None:
        if self.uid is not None:
            for path in paths:
                os.chown(path, self.uid, self.uid)

    def _serve(self, cmd: str) -> None:
        """The server's exec (it returns only when the server ends)."""
        try:
            res = self.box.exec(cmd, timeout_s=7 * 86400, env=JUDGE_ENV)
            why = f"the judge server exited ({res.exit_code}): {(res.stderr or res.stdout)[-300:]}"
        except Exception as err:  # the sandbox closed or failed: every waiting judgement fails
            why = f"the judge server stopped: {err}"
        self._fail_all(why)

    def _fail_all(self, why: str) -> None:
        with self._lock:
            self.dead = self.dead or why
            for slot in self._waiting.values():
                slot[0].set()

    def _read_replies(self) -> None:
        pending = b""
        poller = select.poll()  # not select(): a harness with many sandboxes has fds past 1024
        poller.register(self._replies, select.POLLIN)
        while self.dead is None:
            if not poller.poll(500):
                continue
            try:
                pending += os.read(self._replies, 65536)
            except OSError:
                return
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                job, _, code = line.decode(errors="replace").partition(" ")
                with self._lock:
                    slot = self._waiting.get(job)
                    if slot is not None:
                        slot[1] = int(code)
                        slot[0].set()

    def judge(self, files: dict[str, str], timeout_s: float) -> Judgement:
        """Run pytest on `files` (written into a fresh job directory) and return what it left.
        Raises `JudgeError` if the service cannot judge."""
        if self.dead:
            raise JudgeError(self.dead)
        name = f"job-{secrets.token_hex(8)}"
        directory = self.host_dir / name
        done = threading.Event()
        slot: list = [done, None]  # set with the exit code by the reply reader
        try:
            directory.mkdir()
            for rel, text in files.items():
                path = directory / rel
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text)
                os.chmod(path, 0o644)
            self._own(directory)  # the child writes its report and output there
            with self._lock:  # a server that died before this line has failed every waiter already
                if self.dead:
                    raise JudgeError(self.dead)
                self._waiting[name] = slot
            self._request(f"run {name} {timeout_s}")
            # the server kills the job at its deadline; past that plus a margin, the server is stuck
            if not done.wait(timeout_s + 30) or slot[1] is None:
                raise JudgeError(self.dead or f"the judge server did not answer within {timeout_s + 30:.0f}s")
            junit = directory / "junit.xml"
            report = read_regular(junit).decode("utf-8", errors="replace") if junit.exists() else None
            output = directory / "output.txt"
            text = read_regular(output).decode("utf-8", errors="replace")[-2000:] if output.exists() else ""
            return Judgement(slot[1], report, text)
        finally:
            with self._lock:
                self._waiting.pop(name, None)
            remove_tree(directory)

    def _request(self, line: str) -> None:
        os.write(self._requests, (line + "\n").encode())

    def close(self) -> None:
        """Stop the server and remove its sandbox."""
        self._fail_all("the judge service was closed")
        self.box.close()
        for fd in (self._requests, self._replies):
            try:
                os.close(fd)
            except OSError:
                pass


_SERVICES: dict[str, JudgeService] = {}
_SERVICES_LOCK = threading.Lock()


def judge_service(config: SandboxConfig) -> JudgeService:
    """The process's judge service for `config` (started on first use, restarted if it died)."""
    config = config.model_copy(update={"canary": False, "protected": ()})
    key = config.model_dump_json()
    with _SERVICES_LOCK:
        service = _SERVICES.get(key)
        if service is not None and service.dead:
            service.close()
            service = None
        if service is None:
            service = _SERVICES[key] = JudgeService(config)
        return service


@atexit.register
def close_services() -> None:
    """Close every judge service of this process."""
    with _SERVICES_LOCK:
        services = list(_SERVICES.values())
        _SERVICES.clear()
    for service in services:
        try:
            service.close()
        except Exception:
            pass
    docker = sys.modules.get("toolgym.sandbox.docker_pool")
    if services and docker is not None and docker._REMOVER is not None:
        docker._REMOVER.drain()  # exit handlers run last-registered first: the remover's may be done


__all__ = ["JudgeError", "JudgeService", "Judgement", "close_services", "judge_service"]
