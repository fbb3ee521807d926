"""The docker backend: `DockerSandbox`, a task workspace in a hardened container (docker_pool.py starts, pools,
resets and removes the containers).

Commands run through the container's init (PID 1, connected to the host when the container started): a fork
per command, not a `docker exec`; a second command while one runs, and the few maintenance commands, use
`docker exec`. The workspace is a host directory bind-mounted in, so hashing, diffing and resetting it is
host-side and fast. Processes left by a command are recorded and killed when it returns (as in the bwrap
backend), so both backends give the same semantics to the conformance suite."""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import threading
import time
import uuid
from pathlib import Path

from toolgym.sandbox import fs
from toolgym.sandbox.base import (
    WORKSPACE,
    Capabilities,
    ExecResult,
    Sandbox,
    SandboxConfig,
    SandboxError,
    SandboxInfraError,
    check_command_size,
    check_unowned_uid,
    host_path,
    workspace_rel,
)
from toolgym.sandbox.collect import STARTED_MARK, strip_started_mark
from toolgym.sandbox.docker_host import cgroup_dirs, clear_scratch_from_host, kill_from_host
from toolgym.sandbox.docker_pool import DEFAULT_IMAGE, WarmPool, client, daemon_call, exec_exit_code, new_slot, remover
from toolgym.sandbox.docker_pool import reap as docker_pool_reap
from toolgym.sandbox.ledger import EffectKind, Ledger
from toolgym.sandbox.native import observe_shim
from toolgym.sandbox.observe import (
    CANARY_PATH,
    LOG_DIR,
    check_output,
    ingest_event_log,
    new_canary,
    record_limits,
    record_workspace_changes,
)
from toolgym.sandbox.reaper import reap_once
from toolgym.sandbox.resident import InitChannel, InitLost, ResidentDied, run_command

#: Kill everything, clear /tmp, then wait (up to ~1 s) until only init and this shell remain.
RESET_SCRIPT = """kill -9 -1 2>/dev/null; find /tmp -mindepth 1 -delete 2>/dev/null
i=0
while [ $i -lt 100 ]; do
  n=0
  for p in /proc/[0-9]*; do
    pid=${p#/proc/}; [ "$pid" = 1 ] || [ "$pid" = $$ ] || n=$((n + 1))
  done
  [ $n -eq 0 ] && exit 0
  kill -9 -1 2>/dev/null; sleep 0.01; i=$((i + 1))
done
ls -d /proc/[0-9]* | tr '\\n' ' '; exit 1"""


class DockerSandbox(Sandbox):
    """A hardened docker container over a task workspace (see the module docstring)."""

    def __init__(
        self,
        workspace: dict[str, str] | None = None,
        config: SandboxConfig | None = None,
        pool: WarmPool | None = None,
        episode: str | None = None,
    ) -> None:
        self.config = config or SandboxConfig(backend="docker", image=DEFAULT_IMAGE)
        self.client = client()
        reap_once(docker=docker_pool_reap)
        self.limits = self.config.limits
        self.uid = check_unowned_uid(self.config.host_uid)  # a host uid no account owns
        self.ledger = Ledger()
        self.closed = False
        self.episode = episode or uuid.uuid4().hex[:8]
        # The pristine workspace stays in memory: it is written straight into the container's
        # directory (no copy of it on disk to write, read back and copy per sandbox).
        self._workspace = dict(workspace or {})
        self.canary_token, self._canary_text = new_canary() if self.config.canary else (None, "")
        self.pool = pool
        self._busy = threading.Lock()  # one command at a time through the container's init
        self._snapshots: dict[str, Path] = {}
        try:
            self.slot = pool.acquire() if pool is not None else new_slot(self.client, self.config, self.episode)
        except BaseException:  # no container: nothing of this sandbox may stay on the host
            self.closed = True
            raise
        self._prepare_slot()
        self._pristine_tree = fs.read_tree(self.ws)  # before any command: the pristine tree
        self._pristine_bytes = fs.tree_bytes(self.ws)

    # ---- host-side state ---------------------------------------------------------------------------

    @property
    def ws(self) -> Path:
        return self.slot.state / "ws"

    def _prepare_slot(self) -> None:
        self._write_pristine()
        home = self.slot.state / "home"
        if self.config.canary:
            fs.write_files(home, {".aws/credentials": self._canary_text})
            os.chmod(home / ".aws", 0o755)
            os.chmod(home / ".aws" / "credentials", 0o644)
        (self.slot.state / "log" / "events").write_text("")
        os.chown(self.slot.state / "log" / "events", self.uid, self.uid)

    def _clear_ws(self) -> None:
        for child in list(self.ws.iterdir()):
            if child.is_dir() and not child.is_symlink():
                fs.remove_tree(child)
            else:
                child.unlink()

    def _write_pristine(self) -> None:
        """The workspace as the task gave it, owned by the sandbox's uid."""
        self._clear_ws()
        fs.write_files(self.ws, self._workspace)
        fs.chown_tree(self.ws, self.uid)

    def _restore_dir(self, source: Path) -> None:
        self._clear_ws()
        shutil.copytree(source, self.ws, symlinks=True, dirs_exist_ok=True)
        fs.chown_tree(self.ws, self.uid)

    # ---- Sandbox API ----------------------------------------------------------------------------

    @property
    def capabilities(self) -> Capabilities:
        """docker: hardened container, cgroup limits; writes outside the workspace fail (read-only root)."""
        notes = ["root filesystem is read-only: outside writes fail and are seen by the observation shim"]
        if observe_shim() is None:
            notes.append("no C compiler: the observation shim is off")
        return Capabilities(
            backend="docker", cgroups=True, overlay_reset=False, root_writes_observed=False, persistent_processes=False, notes=notes
        )

    def _check_open(self) -> None:
        if self.closed or getattr(self, "closing", False):
            raise SandboxInfraError("sandbox is closed")

    def _env(self, env: dict[str, str] | None, timeout: float) -> dict[str, str]:
        lim = self.limits
        variables = {
            "PATH": "/.toolgym-bin:/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin",
            "HOME": "/root",
            "LANG": "C.UTF-8",
            "USER": "agent",
            "TOOLGYM_LOG_DIR": LOG_DIR,
            "TOOLGYM_WORKSPACE": WORKSPACE,
            "TOOLGYM_CANARY": CANARY_PATH,
            "TOOLGYM_ULIMITS": f"-c 0,-t {lim.cpu_time_s},-f {(lim.file_size_mb << 20) // 512}",
            "TOOLGYM_TIMEOUT": str(max(1, int(timeout + 0.999))),
        }
        if observe_shim() is not None:
            variables["LD_PRELOAD"] = "/.toolgym-observe.so"
        variables.update(env or {})
        return variables

    def _raw_exec(self, argv: list[str], env: dict[str, str] | None = None, workdir: str = WORKSPACE) -> tuple[int, str]:
        api = self.client.api
        ex = daemon_call(api.exec_create, self.slot.container.id, argv, user=f"{self.uid}:{self.uid}", workdir=workdir, environment=env)
        out = daemon_call(api.exec_start, ex["Id"])
        code = exec_exit_code(api, ex["Id"])
        return (code if code is not None else -1), out.decode("utf-8", errors="replace")

    def exec(
        self, cmd: str, timeout_s: float | None = None, cwd: str = WORKSPACE, env: dict[str, str] | None = None, stdin: str | None = None
    ) -> ExecResult:
        """Run `cmd` via the wrapper; output capped; killed after `timeout_s`. Through the
        container's init (a fork) when it is free, else with a `docker exec`."""
        self._check_open()
        check_command_size(cmd, env)
        channel = self.slot.channel
        if channel is not None and self._busy.acquire(blocking=False):
            try:
                return self._exec_through_init(channel, cmd, timeout_s or self.limits.timeout_s, cwd, env, stdin)
            finally:
                self._busy.release()
        timeout = timeout_s or self.limits.timeout_s
        if stdin is not None:  # docker exec stdin needs a hijacked socket; a file is simpler and safe
            stdin_file = self.slot.state / "log" / "stdin"
            stdin_file.write_text(stdin)
            os.chown(stdin_file, self.uid, self.uid)
            cmd = f"( {cmd} ) < {LOG_DIR}/stdin"
        counters = self._counters()
        api = self.client.api
        start = time.perf_counter()
        ex = daemon_call(
            api.exec_create,
            self.slot.container.id,
            ["/bin/sh", "/.toolgym-wrapper.sh", cmd],
            user=f"{self.uid}:{self.uid}",
            workdir=cwd,
            environment=self._env(env, timeout),
        )
        keep, kill_at = self.limits.output_bytes, self.limits.output_kill_bytes
        out, err = bytearray(), bytearray()
        total = [0, 0]
        state = {"overflow": False, "timed_out": False}
        done, overflow = threading.Event(), threading.Event()

        def reader() -> None:
            # Only reads (and keeps draining past the cap) so the command never blocks on a full
            # pipe; killing is the caller's job.
            try:
                for chunk_out, chunk_err in daemon_call(api.exec_start, ex["Id"], stream=True, demux=True):
                    for i, (chunk, buf) in enumerate(((chunk_out, out), (chunk_err, err))):
                        if not chunk:
                            continue
                        total[i] += len(chunk)
                        if len(buf) < keep:
                            buf += chunk[: keep - len(buf)]
                    if total[0] + total[1] > kill_at:
                        overflow.set()
            except Exception:
                pass
            finally:
                done.set()

        thread = threading.Thread(target=reader, daemon=True)
        thread.start()
        # The wrapper's own `timeout` kills the command; this host-side guard catches anything else.
        deadline = time.monotonic() + timeout + 10
        while not done.wait(0.02):
            if overflow.is_set() and not state["overflow"]:
                state["overflow"] = True
                self._kill_inside()
            if time.monotonic() > deadline and not state["timed_out"]:
                state["timed_out"] = True
                self._kill_inside()
                deadline = time.monotonic() + 10
            elif state["timed_out"] and time.monotonic() > deadline:
                break
        if self.closed:  # removed by close() mid-command: not the command's result
            raise SandboxInfraError("sandbox is closed")
        code = exec_exit_code(api, ex["Id"])
        code = 137 if code is None else code
        duration = time.perf_counter() - start
        timed_out = state["timed_out"] or (code in (124, 137) and duration >= timeout - 0.05)
        result = ExecResult(
            exit_code=code,
            stdout=out.decode("utf-8", errors="replace"),
            stderr=err.decode("utf-8", errors="replace"),
            truncated=total[0] > len(out) or total[1] > len(err),
            timed_out=timed_out,
            duration_s=duration,
        )
        self._observe(result, counters, state["overflow"])
        return result

    def _exec_through_init(
        self, channel: InitChannel, cmd: str, timeout: float, cwd: str, env: dict[str, str] | None, stdin: str | None
    ) -> ExecResult:
        counters = self._counters()
        variables = self._env(env, timeout)
        del variables["TOOLGYM_TIMEOUT"]  # the host enforces the deadline: it asks the init to kill
        variables["TOOLGYM_STARTED_MARK"] = STARTED_MARK
        start = time.perf_counter()
        try:
            got, code = run_command(
                channel, cmd, cwd, variables, stdin, timeout, self.limits.output_bytes, self.limits.output_kill_bytes, self.over_disk_limit
            )
        except (ResidentDied, InitLost) as lost:
            if self.closed or getattr(self, "closing", False):
                raise SandboxInfraError("sandbox is closed") from None
            if not (isinstance(lost, InitLost) and self._counters()["oom"] > counters["oom"]):
                raise SandboxInfraError(f"the container's init is gone: {lost}") from None
            got, code = lost.got, -signal.SIGKILL  # the memory limit's doing: the command's result
        started = strip_started_mark(got)
        if self.closed or getattr(self, "closing", False):
            raise SandboxInfraError("sandbox is closed")
        if not started:
            raise SandboxInfraError(f"the container could not start the command: {got.err.decode(errors='replace').strip()[-300:]}")
        result = ExecResult(
            exit_code=code if code >= 0 else 128 - code,
            stdout=got.out.decode("utf-8", errors="replace"),
            stderr=got.err.decode("utf-8", errors="replace"),
            truncated=got.truncated,
            timed_out=got.timed_out,
            duration_s=time.perf_counter() - start,
        )
        self._observe(result, counters, got.overflow)
        return result

    def _kill_inside(self) -> int:
        """`kill -9 -1` as the sandbox user: every process but the container's init."""
        code, out = self._raw_exec(["/bin/sh", "-c", "n=$(ls -d /proc/[0-9]* | wc -l); kill -9 -1 2>/dev/null; echo $((n - 2))"])
        try:
            return max(0, int(out.strip().splitlines()[-1]))
        except (ValueError, IndexError):
            return 0

    def _cgroup_dirs(self) -> dict[str, Path]:
        return cgroup_dirs(self.slot)

    def _counters(self) -> dict[str, int]:
        out = {"oom": 0, "pids_max": 0}
        dirs = self._cgroup_dirs()
        for ctl, fname, key, name in (
            ("memory", "memory.oom_control", "oom_kill", "oom"),
            ("memory", "memory.events", "oom_kill", "oom"),
            ("pids", "pids.events", "max", "pids_max"),
        ):
            path = dirs.get(ctl, Path("/nonexistent")) / fname
            try:
                for line in path.read_text().splitlines():
                    k, v = line.split()
                    if k == key:
                        out[name] = max(out[name], int(v))
            except (OSError, ValueError):
                pass
        return out

    def _observe(self, result: ExecResult, before: dict[str, int], overflow: bool) -> None:
        led = self.ledger
        events = self.slot.state / "log" / "events"
        ingest_event_log(events, led)
        if not events.exists():
            led.record(EffectKind.LEDGER_TAMPER, detail="the event log was removed")
            events.write_text("")
            os.chown(events, self.uid, self.uid)
        check_output(led, self.canary_token, result.stdout, result.stderr)
        current = fs.read_tree(self.ws)  # one read per exec: this runs after every command
        changes = [(rel, "delete" if what == "deleted" else "write") for rel, what in fs.diff_trees(self._pristine_tree, current).items()]
        for rel, entry in current.items():
            if entry.kind == "file" and entry.mode & 0o6000:
                changes.append((rel, "setuid"))
        record_workspace_changes(led, changes, set(self._pristine_tree), self.config.protected)
        record_limits(led, result, before, self._counters(), overflow, self._disk_check)

    def written_bytes(self) -> int:
        """The workspace's growth since it was made, measured on the host's bind directory (the
        container's /tmp is a tmpfs of its own, bounded by docker)."""
        return max(0, fs.tree_bytes(self.ws) - self._pristine_bytes)

    def read_file(self, path: str) -> str:
        """Text of a workspace file, read on the host (symlinks may not leave the workspace)."""
        self._check_open()
        target = host_path(self.ws, workspace_rel(path))
        if target.is_symlink():
            resolved = target.resolve()
            if self.ws.resolve() not in resolved.parents:
                raise SandboxError(f"cannot read {path}: it is a link that leaves the workspace")
        try:
            return target.read_text(errors="replace")
        except (FileNotFoundError, IsADirectoryError) as err:
            raise SandboxError(f"cannot read {path}: {err.strerror}") from None

    def read_host_bytes(self, path: str) -> bytes:
        """A workspace file's bytes from the host-side bind directory (no symlink followed out)."""
        self._check_open()
        try:
            return fs.read_regular(host_path(self.ws, workspace_rel(path)))
        except FileNotFoundError as err:
            raise SandboxError(f"cannot read {path}: {err}") from None

    def write_file(self, path: str, text: str) -> None:
        """Write a workspace file on the host, owned by the sandbox user."""
        self._check_open()
        rel = workspace_rel(path)
        if not rel:
            raise SandboxError("write_file needs a file path")
        target = host_path(self.ws, rel)
        if target.is_symlink():
            raise SandboxError(f"cannot write {path}: it is a symlink")
        parent = target.parent
        parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        p = target
        while p != self.ws and self.ws in p.parents:
            os.chown(p, self.uid, self.uid, follow_symlinks=False)
            p = p.parent

    def files(self) -> dict[str, fs.Entry]:
        """The workspace tree, read on the host."""
        self._check_open()
        return fs.read_tree(self.ws)

    def pristine_files(self) -> dict[str, fs.Entry]:
        """The pristine workspace tree."""
        return dict(self._pristine_tree)

    def live_processes(self) -> list[str]:
        """Every process in the container but its init and the listing shell, zombies included."""
        self._check_open()
        _, out = self._raw_exec(
            [
                "/bin/sh",
                "-c",
                'for p in /proc/[0-9]*; do pid=${p#/proc/}; [ "$pid" = 1 ] || [ "$pid" = $$ ] || { read -r s < $p/stat; echo "$s"; }; done',
            ]
        )
        return [line for line in out.splitlines() if line.strip()]

    def host_channel(self) -> tuple[Path, str, int | None]:
        """The workspace: a host directory bound in."""
        return self.ws, WORKSPACE, self.uid

    def scratch_channel(self) -> tuple[Path, str, int | None]:
        """The container's /tmp (a tmpfs) through its init's root: the host must be root and
        must have found the init (`kill_from_host`), as for a host-side reset."""
        self._check_open()
        if self.slot.init_pid is None:
            self._kill_from_host()  # finds the init where the host can
        tmp = Path(f"/proc/{self.slot.init_pid}/root/tmp")
        if self.slot.init_pid is None or not os.access(tmp, os.W_OK):
            raise SandboxError(
                "the host cannot reach this container's /tmp (it needs root and the container's "
                "cgroup); run as root, or use the bwrap backend"
            )
        return tmp, "/tmp", self.uid

    def kill_all(self) -> int:
        """Kill every process in the container but its init."""
        self._check_open()
        killed = self._kill_from_host()
        return self._kill_inside() if killed is None else killed

    def _kill_from_host(self) -> int | None:
        """See `docker_pool.kill_from_host`."""
        return kill_from_host(self.slot)

    def _clear_tmp_from_host(self) -> None:
        clear_scratch_from_host(self.slot)

    def reset(self) -> None:
        """Kill everything, clear /tmp, restore the pristine workspace, clear the ledger.

        Proves that no process of the previous episode remains (zombies included): from the host,
        the container's cgroup must hold its init alone; else, inside, the check counts every pid
        but the init's and its own. `SandboxInfraError` if any is left."""
        self._check_open()
        if self._kill_from_host() is not None:
            self._clear_tmp_from_host()
        else:
            code, out = self._raw_exec(["/bin/sh", "-c", RESET_SCRIPT])
            if code != 0:
                raise SandboxInfraError(f"reset left processes behind in the container: {out.strip()[-200:]}")
        self._write_pristine()
        (self.slot.state / "log" / "events").write_text("")
        self.ledger.clear()

    def snapshot(self) -> str:
        """Copy the workspace aside; returns the snapshot id."""
        self._check_open()
        sid = uuid.uuid4().hex[:8]
        dest = Path(tempfile.mkdtemp(prefix=f"toolgym-docker-snap-{os.getpid()}-{sid}-")) / "ws"
        shutil.copytree(self.ws, dest, symlinks=True)
        self._snapshots[sid] = dest
        return sid

    def restore(self, snapshot_id: str) -> None:
        """Return the workspace to a snapshot (processes killed first)."""
        snapshot = self._snapshot_path(snapshot_id)
        if self._kill_from_host() is None:
            self._kill_inside()
        self._restore_dir(snapshot)

    def close(self, wait: bool = False) -> None:
        """Hand the container to the background remover and delete host directories."""
        if self.closed:
            return
        self.closing = True
        self.closed = True
        # A command still running through the init must end (and its thread let go of the
        # socket) before the container may serve anyone else.
        idle = self._busy.acquire(blocking=False)
        if not idle and kill_from_host(self.slot) is not None:
            idle = self._busy.acquire(timeout=10)
        if idle and self.pool is not None and self.pool.recycle:
            self.pool.give_back(self.slot)  # reset from the host, or removed if it cannot be
        else:
            remover().put(self.slot)
        for snap in self._snapshots.values():
            fs.remove_tree(snap.parent)
        if wait:
            remover().drain()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass
