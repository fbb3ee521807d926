"""Docker containers for the docker backend: started hardened with toolgym's init as PID 1 and
connected to the host, removed in the background, kept warm (and recycled) in pools, reset from
the host, and a reaper for those of dead runs. `DockerSandbox` (docker_backend.py) runs commands
in them.

A container runs as a host uid no account owns (`SandboxConfig.host_uid`) with no network, every
capability dropped, no-new-privileges, memory/CPU/pid limits, a read-only root, a tmpfs /tmp, no
System V or POSIX IPC, and the task workspace bind-mounted from a host directory. Its PID 1 is
`_native/init.py`: it reaps every orphan, and runs the commands the host hands it over a socket
it connected to once, at start (a fork per command instead of a `docker exec`). Containers carry
labels (`toolgym.run`, `toolgym.episode`, `toolgym.pid`); `reap()` removes those of dead runs. A
semaphore bounds concurrent daemon calls.
"""

from __future__ import annotations

import atexit
import os
import queue
import socket
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from toolgym.sandbox import fs
from toolgym.sandbox.base import (
    IMAGE_TAG,
    SITE_LAYER_MOUNT,
    WORKSPACE,
    SandboxConfig,
    SandboxInfraError,
    SandboxUnavailable,
    check_unowned_uid,
)
from toolgym.sandbox.docker_host import host_reset
from toolgym.sandbox.native import decoy_bin, init_script, observe_shim, wrapper_script
from toolgym.sandbox.observe import LOG_DIR
from toolgym.sandbox.reaper import reap_once
from toolgym.sandbox.resident import INIT_MOUNT, InitChannel

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
            "`apt-get install -y docker.io && dockerd &` (scripts/test.sh does this)"
        ) from None


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


def daemon_call(fn, *args, **kwargs):
    """One daemon call, bounded in concurrency; a failing daemon is `SandboxInfraError`."""
    import docker

    with _DAEMON_CALLS:
        try:
            return fn(*args, **kwargs)
        except docker.errors.ImageNotFound:
            raise
        except (docker.errors.DockerException, OSError) as err:
            raise SandboxInfraError(f"docker daemon call failed: {type(err).__name__}: {err}") from None


def exec_exit_code(api, exec_id: str, wait_s: float = 5.0) -> int | None:
    """An exec's exit code. dockerd can close the output stream a moment before it marks the
    exec finished (ExitCode still None), so wait for `Running` to turn false."""
    deadline = time.monotonic() + wait_s
    while True:
        info = daemon_call(api.exec_inspect, exec_id)
        if not info.get("Running") or time.monotonic() > deadline:
            return info.get("ExitCode")
        time.sleep(0.005)


def remove_container(remove, *args) -> bool:
    """`remove(*args, force=True)` until the container is gone; True once it is. The daemon can
    refuse a forced removal while the container is still stopping ("could not kill running
    container ... is not running", seen on a loaded machine) and then leaves it marked "Removal In
    Progress" for good: a later attempt finishes it, so refusals are retried with a backoff."""
    import docker

    for attempt in range(6):
        try:
            with _DAEMON_CALLS:
                remove(*args, force=True)
            return True
        except docker.errors.NotFound:
            return True
        except (docker.errors.DockerException, OSError):
            time.sleep(0.2 * 2**attempt)
    return False


def reap(c=None) -> int:
    """Remove toolgym containers (and their host dirs) whose owning process is gone."""
    c = c or client()
    removed = 0
    host = socket.gethostname()
    # The low-level list returns labels directly: the high-level one inspects each container and
    # fails if one disappears in between (another process removing its own).
    for info in daemon_call(c.api.containers, all=True, filters={"label": LABEL}):
        labels = info.get("Labels") or {}
        pid = int(labels.get("toolgym.pid", "0") or 0)
        alive = labels.get("toolgym.host") == host and pid > 0 and process_start(pid) == labels.get("toolgym.start", "")  # pids get reused
        if alive:
            continue
        removed += int(remove_container(c.api.remove_container, info["Id"]))
        state = labels.get("toolgym.state")
        if state and state.startswith(tempfile.gettempdir()) and "toolgym-docker-" in state:
            fs.remove_tree(state)
    return removed


#: No System V shared memory, semaphores or message queues, and no POSIX message queues, in a
#: container: they would outlive the processes that made them (state a reset could not see).
NO_IPC = {"kernel.shmmni": "0", "kernel.msgmni": "0", "kernel.sem": "0 0 0 0", "fs.mqueue.queues_max": "0"}


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


def new_slot(c, config: SandboxConfig, episode: str) -> _Slot:
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
    volumes = {
        str(state / "ws"): {"bind": WORKSPACE, "mode": "rw"},
        str(state / "log"): {"bind": LOG_DIR, "mode": "rw"},
        str(state / "home"): {"bind": "/root", "mode": "ro"},
        str(state / "ctl"): {"bind": CONTROL_DIR, "mode": "ro"},
        str(init_script()): {"bind": INIT_MOUNT, "mode": "ro"},
        str(wrapper_script()): {"bind": "/.toolgym-wrapper.sh", "mode": "ro"},
        str(decoy_bin()): {"bind": "/.toolgym-bin", "mode": "ro"},
    }
    if config.site_layer:
        volumes[str(Path(config.site_layer).resolve())] = {"bind": SITE_LAYER_MOUNT, "mode": "ro"}
    shim = observe_shim()
    if shim is not None:
        volumes[str(shim)] = {"bind": "/.toolgym-observe.so", "mode": "ro"}
    # `mounts`, not `volumes`: for a bind source that does not exist (a helper removed from the
    # cache), `volumes` would make an empty directory on the host in its place; a bind mount
    # fails to start instead (an infra error)
    from docker.types import Mount

    mounts = [
        Mount(target, source, type="bind", read_only=mode == "ro")
        for source, (target, mode) in ((src, (v["bind"], v["mode"])) for src, v in volumes.items())
    ]
    labels = {
        LABEL: "1",
        "toolgym.run": RUN_ID,
        "toolgym.episode": episode,
        "toolgym.pid": str(os.getpid()),
        "toolgym.start": process_start(os.getpid()),
        "toolgym.host": socket.gethostname(),
        "toolgym.state": str(state),
    }
    try:
        container = daemon_call(
            c.containers.run,
            config.image,
            command=["python3", "-I", "-S", INIT_MOUNT, "--connect", f"{CONTROL_DIR}/init.sock"],
            detach=True,
            network_mode="none",
            cap_drop=["ALL"],
            security_opt=["no-new-privileges"],
            user=f"{uid}:{uid}",
            mem_limit=f"{lim.memory_mb}m",
            memswap_limit=f"{lim.memory_mb}m",
            nano_cpus=int(lim.cpus * 1e9),
            pids_limit=lim.pids,
            read_only=True,
            tmpfs={"/tmp": "rw,size=64m,mode=1777"},
            sysctls=NO_IPC,
            mounts=mounts,
            labels=labels,
            working_dir=WORKSPACE,
            hostname="sandbox",
        )
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
            remove_container(slot.container.remove)
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
        reap_once(docker=reap)
        self.ready: queue.Queue[_Slot] = queue.Queue()
        self.closed = False
        self._want = threading.Semaphore(0)
        self._pending = 0  # containers asked of the filler and not ready yet
        self._pending_lock = threading.Lock()
        self._filler = threading.Thread(target=self._fill, daemon=True)
        for _ in range(size):
            self._ask()
        self._filler.start()

    def _ask(self) -> None:
        """One more container for the filler to start."""
        with self._pending_lock:
            self._pending += 1
        self._want.release()

    def _full(self) -> bool:
        # a recycling pool gets its used containers back: past `size` ready, another is waste
        return self.recycle and self.ready.qsize() >= self.size

    def _fill(self) -> None:
        while True:
            self._want.acquire()
            if self.closed:
                return
            if not self._full():
                try:
                    slot = new_slot(self.client, self.config, "warm")
                except Exception:
                    time.sleep(0.5)
                    self._want.release()  # still pending: try again
                    continue
                if self.closed:  # closed while this one was starting
                    remover().put(slot)
                    return
                (remover().put if self._full() else self.ready.put)(slot)
            with self._pending_lock:
                self._pending -= 1

    def wait_settled(self, timeout_s: float = 120.0) -> bool:
        """Wait until `size` containers are ready and none is being started (a benchmark's
        timing starts there, not while the pool still fills); False if it did not settle."""
        deadline = time.monotonic() + timeout_s
        while self.ready.qsize() < self.size or self._pending:
            if time.monotonic() > deadline or self.closed:
                return False
            time.sleep(0.05)
        return True

    def acquire(self, timeout_s: float = 120.0) -> _Slot:
        """A started container (waits for one if none is ready)."""
        if self.recycle:  # used ones come back: start a new container only when none is ready
            try:
                return self.ready.get_nowait()
            except queue.Empty:
                self._ask()
                return self.ready.get(timeout=timeout_s)
        slot = self.ready.get(timeout=timeout_s)
        self._ask()
        return slot

    def give_back(self, slot: _Slot) -> None:
        """A used container back into the pool, reset from the host (removed instead if it cannot
        be reset, or the pool is closed or holds `size` ready ones already)."""
        try:
            recycled = (
                not self.closed and self.recycle and self.ready.qsize() < self.size and slot.container is not None and host_reset(slot)
            )
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
