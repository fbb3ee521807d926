"""The docker backend: the docker SDK against a real dockerd, hardened by default.

Containers run a reaping init (pid 1: every orphan is reaped at once, so no zombie outlives a
command) as a host uid no account owns (`SandboxConfig.host_uid`) with no network, every capability dropped,
no-new-privileges, memory/CPU/pid limits, a read-only root, a tmpfs /tmp, and the task workspace
bind-mounted from a host directory (so hashing, diffing and resetting it is host-side and fast).
Containers carry labels (`toolgym.run`, `toolgym.episode`, `toolgym.pid`); `reap()` removes those
of dead runs at start-up. A `WarmPool` keeps started containers ready to hide creation latency,
closed ones are removed in the background, and a semaphore bounds concurrent daemon calls.

Processes left by a command are recorded and killed when it returns (as in the bwrap backend),
so both backends give the same semantics to the conformance suite.
"""

from __future__ import annotations

import atexit
import os
import queue
import shutil
import signal
import socket
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from toolgym.sandbox import fs
from toolgym.sandbox.base import (IMAGE_TAG, SITE_LAYER_MOUNT, WORKSPACE, Capabilities, ExecResult, Sandbox, SandboxConfig, SandboxError,
                                  SandboxInfraError, SandboxUnavailable, check_command_size, check_unowned_uid, host_path,
                                  workspace_rel)
from toolgym.sandbox.ledger import EffectKind, Ledger
from toolgym.sandbox.reaper import reap_once
from toolgym.sandbox.collect import STARTED_MARK, strip_started_mark
from toolgym.sandbox.native import decoy_bin, init_script, observe_shim, wrapper_script
from toolgym.sandbox.resident import INIT_MOUNT, InitChannel, InitLost, ResidentDied, run_command
from toolgym.sandbox.observe import (CANARY_PATH, LOG_DIR, check_output, ingest_event_log, new_canary,
                                     record_workspace_changes)

LABEL = "toolgym"
DEFAULT_IMAGE = IMAGE_TAG
_DAEMON_CALLS = threading.BoundedSemaphore(8)  # docker daemons time out under unbounded concurrency
RUN_ID = uuid.uuid4().hex[:12]


_CLIENT: Any = None
_CLIENT_LOCK = threading.Lock()


def client():
    """The process's docker client (made and pinged once: two daemon round trips a sandbox
    otherwise), or `SandboxUnavailable` saying how to start the daemon."""
    global _CLIENT
    try:
        import docker

        with _CLIENT_LOCK:
            if _CLIENT is None:
                c = docker.from_env(timeout=120)
                c.ping()
                _CLIENT = c
            return _CLIENT
    except Exception as err:
        raise SandboxUnavailable(
            f"cannot reach a docker daemon ({type(err).__name__}: {err}). Install and start it: "
            "`apt-get install -y docker.io && dockerd &` (scripts/test.sh does this)") from None


def process_start(pid: int) -> str:
    """A process's start time (clock ticks since boot), or "" if it is gone: pid + start = identity."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat.rsplit(")", 1)[1].split()[19]


#: Where the container's init (`_native/init.py`, its PID 1) finds the host's socket. The init
#: reaps every orphan, runs the commands the host hands it over that socket (a fork per command,
#: not a `docker exec`), and kills every other process before it answers. docker's `init=True`
#: would exit with its child, and `kill -9 -1` would take the container down.
CONTROL_DIR = "/.toolgym-ctl"


def _exit_code(api, exec_id: str, wait_s: float = 5.0) -> int | None:
    """An exec's exit code. dockerd can close the output stream a moment before it marks the
    exec finished (ExitCode still None), so wait for `Running` to turn false."""
    deadline = time.monotonic() + wait_s
    while True:
        info = _call(api.exec_inspect, exec_id)
        if not info.get("Running") or time.monotonic() > deadline:
            return info.get("ExitCode")
        time.sleep(0.005)


def _call(fn, *args, **kwargs):
    """One daemon call, bounded in concurrency; a failing daemon is `SandboxInfraError`."""
    import docker

    with _DAEMON_CALLS:
        try:
            return fn(*args, **kwargs)
        except docker.errors.ImageNotFound:
            raise
        except (docker.errors.DockerException, OSError) as err:
            raise SandboxInfraError(f"docker daemon call failed: {type(err).__name__}: {err}") from None


def reap(c=None) -> int:
    """Remove toolgym containers (and their host dirs) whose owning process is gone."""
    c = c or client()
    removed = 0
    host = socket.gethostname()
    # The low-level list returns labels directly: the high-level one inspects each container and
    # fails if one disappears in between (another process removing its own).
    for info in _call(c.api.containers, all=True, filters={"label": LABEL}):
        labels = info.get("Labels") or {}
        pid = int(labels.get("toolgym.pid", "0") or 0)
        alive = (labels.get("toolgym.host") == host and pid > 0
                 and process_start(pid) == labels.get("toolgym.start", ""))  # pids get reused
        if alive:
            continue
        try:
            _call(c.api.remove_container, info["Id"], force=True)
            removed += 1
        except Exception:  # already gone
            pass
        state = labels.get("toolgym.state")
        if state and state.startswith(tempfile.gettempdir()) and "toolgym-docker-" in state:
            fs.remove_tree(state)
    return removed


#: No System V shared memory, semaphores or message queues, and no POSIX message queues, in a
#: container: they would outlive the processes that made them (state a reset could not see).
NO_IPC = {"kernel.shmmni": "0", "kernel.msgmni": "0", "kernel.sem": "0 0 0 0", "fs.mqueue.queues_max": "0"}
#: Where the sandbox user can write in a container besides the workspace and the event log
#: (the root filesystem is read-only): emptied from the host by every reset.
SCRATCH_DIRS = ("/tmp", "/dev/shm")


class _Slot:
    """A started container with its own host directories."""

    def __init__(self, container: Any, state: Path, channel: InitChannel | None = None) -> None:
        self.container = container
        self.state = state
        self.channel = channel  # connected to the container's init
        self.init_pid: int | None = None  # the container's PID 1 as the host sees it, once found

    def release(self) -> None:
        """Close the host's end of the init's socket."""
        if self.channel is not None:
            self.channel.release()
            self.channel = None


def _slot_cgroup_dirs(slot: _Slot) -> dict[str, Path]:
    """The container's cgroup directories (memory, pids) on this host's layout."""
    cid = slot.container.id
    found: dict[str, Path] = {}
    for ctl in ("memory", "pids"):
        for base in (Path(f"/sys/fs/cgroup/{ctl}/docker/{cid}"), Path(f"/sys/fs/cgroup/docker/{cid}"),
                     Path(f"/sys/fs/cgroup/system.slice/docker-{cid}.scope")):
            if base.is_dir():
                found[ctl] = base
                break
    return found


def _kill_from_host(slot: _Slot) -> int | None:
    """Kill every process of the container but its init from the host, through its cgroup, and
    wait until the cgroup holds the init alone: no `docker exec` (a runc start, most of a
    reset's time). The count killed, or None where the host cannot (not root, no cgroup
    directory found): the in-container path runs then."""
    procs = _slot_cgroup_dirs(slot).get("pids", Path("/nonexistent")) / "cgroup.procs"
    if os.geteuid() != 0 or not procs.exists():
        return None
    killed: set[int] = set()
    deadline = time.monotonic() + 2
    while True:
        pids = [int(p) for p in procs.read_text().split()]
        init = slot.init_pid or _container_init(pids)
        if init is None:
            return None
        slot.init_pid = init
        others = [p for p in pids if p != init]
        if not others:
            return len(killed)
        if time.monotonic() > deadline:
            raise SandboxInfraError(f"reset left processes behind in the container: {others[:5]}")
        for pid in others:
            # pids are read from the container's cgroup a moment before: reuse needs the host's
            # pid counter to wrap around in between
            try:
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
            except ProcessLookupError:
                pass
        time.sleep(0.001)


def _clear_scratch_from_host(slot: _Slot) -> None:
    """Empty the container's scratch directories (`SCRATCH_DIRS`) through its init's root (no
    symlink is followed)."""
    for scratch in SCRATCH_DIRS:
        for entry in os.scandir(f"/proc/{slot.init_pid}/root{scratch}"):
            if entry.is_dir(follow_symlinks=False):
                fs.remove_tree(entry.path)
            else:
                os.unlink(entry.path)


def _host_reset(slot: _Slot) -> bool:
    """Make a used container as a started one was, from the host: every process but its init
    killed, scratch directories, workspace and event log emptied. False if the host cannot."""
    if _kill_from_host(slot) is None:
        return False
    _clear_scratch_from_host(slot)
    for directory in (slot.state / "ws", slot.state / "log"):
        for child in list(directory.iterdir()):
            fs.remove_tree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
    home = slot.state / "home"
    for child in list(home.iterdir()):  # the canary, if the last user had one
        fs.remove_tree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
    return True


def _container_init(pids: list[int]) -> int | None:
    """Which of a container's host pids is its PID 1 (the last NSpid field is 1)."""
    for pid in pids:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith("NSpid:") and line.split()[-1] == "1":
                return pid
    return None


def _new_slot(c, config: SandboxConfig, episode: str) -> _Slot:
    lim = config.limits
    uid = check_unowned_uid(config.host_uid)
    state = Path(tempfile.mkdtemp(prefix=f"toolgym-docker-{os.getpid()}-"))
    for name in ("ws", "log", "home", "ctl"):
        (state / name).mkdir()
    os.chown(state / "ws", uid, uid)
    os.chown(state / "log", uid, uid)
    os.chmod(state, 0o755)
    os.chmod(state / "ctl", 0o755)
    # The host listens; the container's init connects once at start, before anything else runs
    # there; then the listener is gone, so no process in the container can reach it later.
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(str(state / "ctl" / "init.sock"))
    os.chmod(state / "ctl" / "init.sock", 0o666)
    listener.listen(1)
    volumes = {str(state / "ws"): {"bind": WORKSPACE, "mode": "rw"},
               str(state / "log"): {"bind": LOG_DIR, "mode": "rw"},
               str(state / "home"): {"bind": "/root", "mode": "ro"},
               str(state / "ctl"): {"bind": CONTROL_DIR, "mode": "ro"},
               str(init_script()): {"bind": INIT_MOUNT, "mode": "ro"},
               str(wrapper_script()): {"bind": "/.toolgym-wrapper.sh", "mode": "ro"},
               str(decoy_bin()): {"bind": "/.toolgym-bin", "mode": "ro"}}
    if config.site_layer:
        volumes[str(Path(config.site_layer).resolve())] = {"bind": SITE_LAYER_MOUNT, "mode": "ro"}
    shim = observe_shim()
    if shim is not None:
        volumes[str(shim)] = {"bind": "/.toolgym-observe.so", "mode": "ro"}
    # docker makes a missing bind source an empty directory (on the host, where the helper was):
    # a helper that vanished from the cache is an infra error, never a silent directory
    for source in (wrapper_script(), decoy_bin(), init_script(), shim):
        if source is not None and not source.exists():
            listener.close()
            fs.remove_tree(state)
            raise SandboxInfraError(f"toolgym's sandbox helper {source} is missing (was the cache cleared?); "
                                    "restart the process to rebuild it")
    labels = {LABEL: "1", "toolgym.run": RUN_ID, "toolgym.episode": episode, "toolgym.pid": str(os.getpid()),
              "toolgym.start": process_start(os.getpid()),
              "toolgym.host": socket.gethostname(), "toolgym.state": str(state)}
    try:
        container = _call(
            c.containers.run, config.image, command=["python3", "-I", "-S", INIT_MOUNT, "--connect",
                                                     f"{CONTROL_DIR}/init.sock"], detach=True, network_mode="none",
            cap_drop=["ALL"], security_opt=["no-new-privileges"], user=f"{uid}:{uid}",
            mem_limit=f"{lim.memory_mb}m", memswap_limit=f"{lim.memory_mb}m", nano_cpus=int(lim.cpus * 1e9),
            pids_limit=lim.pids, read_only=True, tmpfs={"/tmp": "rw,size=64m,mode=1777"}, sysctls=NO_IPC,
            volumes=volumes, labels=labels, working_dir=WORKSPACE, hostname="sandbox")
    except Exception as err:
        listener.close()
        fs.remove_tree(state)
        import docker

        if isinstance(err, docker.errors.ImageNotFound):
            raise SandboxUnavailable(f"docker image {config.image!r} not found: run `toolgym sandbox build-image`") from None
        raise SandboxInfraError(f"cannot start a container: {err}") from None
    slot = _Slot(container, state)
    try:
        listener.settimeout(30)
        conn, _ = listener.accept()
        conn.settimeout(None)
        slot.channel = InitChannel(conn)
    except OSError as err:
        remover().put(slot)
        raise SandboxInfraError(f"the container's init did not connect: {err}") from None
    finally:
        listener.close()
        (state / "ctl" / "init.sock").unlink(missing_ok=True)
    return slot


class _Remover:
    """Removes closed containers in the background; `drain()` waits until all are gone."""

    def __init__(self) -> None:
        self.q: queue.Queue = queue.Queue()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        atexit.register(self.drain)

    def _run(self) -> None:
        while True:
            slot = self.q.get()
            slot.release()
            try:
                _call(slot.container.remove, force=True)
            except Exception:
                pass
            fs.remove_tree(slot.state)
            self.q.task_done()

    def put(self, slot: _Slot) -> None:
        self.q.put(slot)

    def drain(self) -> None:
        """Block until every queued container is removed."""
        self.q.join()


_REMOVER: _Remover | None = None


def remover() -> _Remover:
    """The process-wide background remover."""
    global _REMOVER
    if _REMOVER is None:
        _REMOVER = _Remover()
    return _REMOVER


class WarmPool:
    """Keeps `size` started containers ready for one sandbox config.

    `recycle=True`: a closed sandbox's container comes back into the pool after a reset from
    the host (every process killed through its cgroup, scratch directories, workspace and event
    log emptied; System V and POSIX IPC are off in every container), instead of being removed and
    replaced by a new one: no container start per use. Where the host cannot reset it (not
    root), it is removed as usual."""

    def __init__(self, config: SandboxConfig, size: int = 4, recycle: bool = False) -> None:
        self.config = config
        self.size = size
        self.recycle = recycle
        self.client = client()
        reap_once(docker=True)
        self.ready: queue.Queue[_Slot] = queue.Queue()
        self.closed = False
        self._want = threading.Semaphore(0)
        self._filler = threading.Thread(target=self._fill, daemon=True)
        for _ in range(size):
            self._want.release()
        self._filler.start()

    def _fill(self) -> None:
        while True:
            self._want.acquire()
            if self.closed:
                return
            try:
                slot = _new_slot(self.client, self.config, "warm")
                if self.closed:  # closed while this one was starting
                    remover().put(slot)
                    return
                self.ready.put(slot)
            except Exception:
                time.sleep(0.5)
                self._want.release()

    def acquire(self, timeout_s: float = 120.0) -> _Slot:
        """A started container (waits for one if none is ready)."""
        if self.recycle:  # used ones come back: start a new container only when none is ready
            try:
                return self.ready.get_nowait()
            except queue.Empty:
                self._want.release()
                return self.ready.get(timeout=timeout_s)
        slot = self.ready.get(timeout=timeout_s)
        self._want.release()
        return slot

    def give_back(self, slot: _Slot) -> None:
        """A used container back into the pool, reset from the host (removed instead if it cannot
        be reset, or the pool is closed or holds `size` ready ones already)."""
        try:
            recycled = (not self.closed and self.recycle and self.ready.qsize() < self.size
                        and slot.container is not None and _host_reset(slot))
        except Exception:  # whatever stops the reset, the container is not used again
            recycled = False
        (self.ready.put if recycled else remover().put)(slot)
        if recycled and self.closed:  # closed meanwhile: nothing may stay in the pool
            self.close()

    def close(self) -> None:
        """Stop refilling and remove the idle containers (one being started is removed too)."""
        self.closed = True
        self._want.release()
        if self._filler is not threading.current_thread():
            self._filler.join(timeout=60)
        while True:
            try:
                remover().put(self.ready.get_nowait())
            except queue.Empty:
                break


_SHARED_POOLS: dict[str, WarmPool] = {}
_SHARED_LOCK = threading.Lock()


def shared_pool(config: SandboxConfig, size: int = 8) -> WarmPool:
    """The process's recycling warm pool for `config` (started on first use; closed at exit):
    short-lived sandboxes such as graders' take a started container, and give it back reset
    from the host, instead of paying a container start and removal per use."""
    key = config.model_dump_json()
    with _SHARED_LOCK:
        pool = _SHARED_POOLS.get(key)
        if pool is None:
            pool = _SHARED_POOLS[key] = WarmPool(config, size=size, recycle=True)
        return pool


@atexit.register
def close_shared_pools() -> None:
    """Close the shared pools and wait until their containers are removed."""
    with _SHARED_LOCK:
        pools = list(_SHARED_POOLS.values())
        _SHARED_POOLS.clear()
    for pool in pools:
        pool.close()
    if pools:
        remover().drain()


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

    def __init__(self, workspace: dict[str, str] | None = None, config: SandboxConfig | None = None,
                 pool: WarmPool | None = None, episode: str | None = None) -> None:
        self.config = config or SandboxConfig(backend="docker", image=DEFAULT_IMAGE)
        self.client = client()
        reap_once(docker=True)
        self.limits = self.config.limits
        self.uid = check_unowned_uid(self.config.host_uid)  # a host uid no account owns
        self.ledger = Ledger()
        self.closed = False
        self.episode = episode or uuid.uuid4().hex[:8]
        self.pristine = Path(tempfile.mkdtemp(prefix=f"toolgym-docker-pristine-{os.getpid()}-"))
        fs.write_files(self.pristine, workspace or {})
        self._pristine_tree = fs.read_tree(self.pristine)
        self.canary_token, self._canary_text = new_canary() if self.config.canary else (None, "")
        self.pool = pool
        self._busy = threading.Lock()  # one command at a time through the container's init
        self.slot = pool.acquire() if pool is not None else _new_slot(self.client, self.config, self.episode)
        self._snapshots: dict[str, Path] = {}
        self._prepare_slot()

    # ---- host-side state ---------------------------------------------------------------------------

    @property
    def ws(self) -> Path:
        return self.slot.state / "ws"

    def _prepare_slot(self) -> None:
        self._restore_dir(self.pristine)
        home = self.slot.state / "home"
        if self.config.canary:
            fs.write_files(home, {".aws/credentials": self._canary_text})
            os.chmod(home / ".aws", 0o755)
            os.chmod(home / ".aws" / "credentials", 0o644)
        (self.slot.state / "log" / "events").write_text("")
        os.chown(self.slot.state / "log" / "events", self.uid, self.uid)

    def _restore_dir(self, source: Path) -> None:
        for child in list(self.ws.iterdir()):
            if child.is_dir() and not child.is_symlink():
                fs.remove_tree(child)
            else:
                child.unlink()
        shutil.copytree(source, self.ws, symlinks=True, dirs_exist_ok=True)
        fs.chown_tree(self.ws, self.uid)

    # ---- Sandbox API ----------------------------------------------------------------------------

    @property
    def capabilities(self) -> Capabilities:
        """docker: hardened container, cgroup limits; writes outside the workspace fail (read-only root)."""
        notes = ["root filesystem is read-only: outside writes fail and are seen by the observation shim"]
        if observe_shim() is None:
            notes.append("no C compiler: the observation shim is off")
        return Capabilities(backend="docker", cgroups=True, overlay_reset=False, root_writes_observed=False,
                            persistent_processes=False, notes=notes)

    def _check_open(self) -> None:
        if self.closed or getattr(self, "closing", False):
            raise SandboxInfraError("sandbox is closed")

    def _env(self, env: dict[str, str] | None, timeout: float) -> dict[str, str]:
        lim = self.limits
        variables = {"PATH": "/.toolgym-bin:/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin", "HOME": "/root", "LANG": "C.UTF-8", "USER": "agent", "TOOLGYM_LOG_DIR": LOG_DIR,
                     "TOOLGYM_WORKSPACE": WORKSPACE, "TOOLGYM_CANARY": CANARY_PATH,
                     "TOOLGYM_ULIMITS": f"-c 0,-t {lim.cpu_time_s},-f {(lim.file_size_mb << 20) // 512}",
                     "TOOLGYM_TIMEOUT": str(max(1, int(timeout + 0.999)))}
        if observe_shim() is not None:
            variables["LD_PRELOAD"] = "/.toolgym-observe.so"
        variables.update(env or {})
        return variables

    def _raw_exec(self, argv: list[str], env: dict[str, str] | None = None, workdir: str = WORKSPACE) -> tuple[int, str]:
        api = self.client.api
        ex = _call(api.exec_create, self.slot.container.id, argv, user=f"{self.uid}:{self.uid}",
                   workdir=workdir, environment=env)
        out = _call(api.exec_start, ex["Id"])
        code = _exit_code(api, ex["Id"])
        return (code if code is not None else -1), out.decode("utf-8", errors="replace")

    def exec(self, cmd: str, timeout_s: float | None = None, cwd: str = WORKSPACE, env: dict[str, str] | None = None,
             stdin: str | None = None) -> ExecResult:
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
        ex = _call(api.exec_create, self.slot.container.id, ["/bin/sh", "/.toolgym-wrapper.sh", cmd],
                   user=f"{self.uid}:{self.uid}", workdir=cwd, environment=self._env(env, timeout))
        keep, kill_at = self.limits.output_bytes, self.limits.output_kill_bytes
        out, err = bytearray(), bytearray()
        total = [0, 0]
        state = {"overflow": False, "timed_out": False}
        done, overflow = threading.Event(), threading.Event()

        def reader() -> None:
            # Only reads (and keeps draining past the cap) so the command never blocks on a full
            # pipe; killing is the caller's job.
            try:
                for chunk_out, chunk_err in _call(api.exec_start, ex["Id"], stream=True, demux=True):
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
        code = _exit_code(api, ex["Id"])
        code = 137 if code is None else code
        duration = time.perf_counter() - start
        timed_out = state["timed_out"] or (code in (124, 137) and duration >= timeout - 0.05)
        result = ExecResult(exit_code=code, stdout=out.decode("utf-8", errors="replace"),
                            stderr=err.decode("utf-8", errors="replace"), truncated=total[0] > len(out) or total[1] > len(err),
                            timed_out=timed_out, duration_s=duration)
        self._observe(result, counters, state["overflow"])
        return result

    def _exec_through_init(self, channel: InitChannel, cmd: str, timeout: float, cwd: str,
                           env: dict[str, str] | None, stdin: str | None) -> ExecResult:
        counters = self._counters()
        variables = self._env(env, timeout)
        del variables["TOOLGYM_TIMEOUT"]  # the host enforces the deadline: it asks the init to kill
        variables["TOOLGYM_STARTED_MARK"] = STARTED_MARK
        start = time.perf_counter()
        try:
            got, code = run_command(channel, cmd, cwd, variables, stdin, timeout, self.limits.output_bytes,
                                    self.limits.output_kill_bytes)
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
            raise SandboxInfraError(f"the container could not start the command: "
                                    f"{got.err.decode(errors='replace').strip()[-300:]}")
        result = ExecResult(exit_code=code if code >= 0 else 128 - code, stdout=got.out.decode("utf-8", errors="replace"),
                            stderr=got.err.decode("utf-8", errors="replace"), truncated=got.truncated,
                            timed_out=got.timed_out, duration_s=time.perf_counter() - start)
        self._observe(result, counters, got.overflow)
        return result

    def _kill_inside(self) -> int:
        """`kill -9 -1` as the sandbox user: every process but the container's init."""
        code, out = self._raw_exec(["/bin/sh", "-c", "n=$(ls -d /proc/[0-9]* | wc -l); kill -9 -1 2>/dev/null; "
                                    "echo $((n - 2))"])
        try:
            return max(0, int(out.strip().splitlines()[-1]))
        except (ValueError, IndexError):
            return 0

    def _cgroup_dirs(self) -> dict[str, Path]:
        return _slot_cgroup_dirs(self.slot)

    def _counters(self) -> dict[str, int]:
        out = {"oom": 0, "pids_max": 0}
        dirs = self._cgroup_dirs()
        for ctl, fname, key, name in (("memory", "memory.oom_control", "oom_kill", "oom"),
                                      ("memory", "memory.events", "oom_kill", "oom"),
                                      ("pids", "pids.events", "max", "pids_max")):
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
        changes = [(rel, "delete" if what == "deleted" else "write")
                   for rel, what in fs.diff_trees(self._pristine_tree, current).items()]
        for rel, entry in current.items():
            if entry.kind == "file" and entry.mode & 0o6000:
                changes.append((rel, "setuid"))
        record_workspace_changes(led, changes, set(self._pristine_tree), self.config.protected)
        after = self._counters()
        if after["oom"] > before["oom"]:
            result.oom_killed, result.limit_hit = True, "memory"
        elif after["pids_max"] > before["pids_max"]:
            result.limit_hit = "pids"
        if overflow:
            result.limit_hit = "output"
        if result.exit_code in (128 + 24, 128 + 25) and result.limit_hit is None:  # SIGXCPU, SIGXFSZ
            result.limit_hit = "cpu" if result.exit_code == 128 + 24 else "file_size"
        if result.limit_hit:
            led.record(EffectKind.RESOURCE_LIMIT, detail=f"{result.limit_hit} limit hit")
        if result.timed_out:
            led.record(EffectKind.RESOURCE_LIMIT, detail="timeout")

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
        _, out = self._raw_exec(["/bin/sh", "-c", 'for p in /proc/[0-9]*; do pid=${p#/proc/}; '
                                 '[ "$pid" = 1 ] || [ "$pid" = $$ ] || { read -r s < $p/stat; echo "$s"; }; done'])
        return [line for line in out.splitlines() if line.strip()]

    def host_channel(self) -> tuple[Path, str, int | None]:
        """The workspace: a host directory bound in."""
        return self.ws, WORKSPACE, self.uid

    def kill_all(self) -> int:
        """Kill every process in the container but its init."""
        self._check_open()
        killed = self._kill_from_host()
        return self._kill_inside() if killed is None else killed

    def _kill_from_host(self) -> int | None:
        """See `_kill_from_host` (module level)."""
        return _kill_from_host(self.slot)

    def _clear_tmp_from_host(self) -> None:
        _clear_scratch_from_host(self.slot)

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
        self._restore_dir(self.pristine)
        (self.slot.state / "log" / "events").write_text("")
        self.ledger.clear()

    def snapshot(self) -> str:
        """Copy the workspace aside; returns the snapshot id."""
        self._check_open()
        sid = uuid.uuid4().hex[:8]
        dest = self.pristine.parent / f"{self.pristine.name}-snap-{sid}"
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
        if not idle and _kill_from_host(self.slot) is not None:
            idle = self._busy.acquire(timeout=10)
        if idle and self.pool is not None and self.pool.recycle:
            self.pool.give_back(self.slot)  # reset from the host, or removed if it cannot be
        else:
            remover().put(self.slot)
        fs.remove_tree(self.pristine)
        for snap in self._snapshots.values():
            fs.remove_tree(snap)
        if wait:
            remover().drain()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass
