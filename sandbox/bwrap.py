"""The default backend: bubblewrap + overlayfs. No daemon; reset is milliseconds.

Who owns it: a root harness drops to an unowned host uid (`SandboxConfig.host_uid`) before it starts bwrap,
so uid 1000 inside maps to a host uid no account owns (never to host root); an unprivileged harness runs
bwrap as itself.

Layout inside the sandbox (all namespaces unshared, no network, uid 1000):
  /usr /etc /opt /var ...  the root filesystem (the host's, or an unpacked image), bound
                           READ-ONLY: no binary or library outside the workspace can be replaced
                           during an episode or during grading; write attempts fail and the
                           observation shim records them
  /workspace               overlay on the pristine task workspace
  /root                    overlay holding a planted canary secret (~/.aws/credentials)
  /tmp                     a per-sandbox scratch directory
  /.toolgym                the event log the observation shim and exec wrapper append to

Commands run through a resident init (`resident.py`): one bwrap per sandbox state whose PID 1 forks each
command under the exec wrapper, so an exec is a fork and a wait (about a millisecond) rather than a sandbox
start (6-8 ms). State persists across commands while processes do not: the wrapper records anything a
command leaves running and the init kills and reaps every process before it answers. Reset and restore stop
the init (the overlay is mounted while it lives); the next exec starts a new one. A second exec while one
runs, a root filesystem without Python, or `SandboxConfig.resident=False` take the older path: a fresh bwrap
per command over the same upper layers, whose pid namespace dies with it. Limits come from a per-sandbox
cgroup where writable, else from rlimits."""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from pathlib import Path

from toolgym.sandbox import bwrap_host as host
from toolgym.sandbox import fs
from toolgym.sandbox.base import (
    SITE_LAYER_MOUNT,
    WORKSPACE,
    Capabilities,
    ExecResult,
    Sandbox,
    SandboxConfig,
    SandboxError,
    SandboxInfraError,
    check_command_size,
    check_unowned_uid,
)
from toolgym.sandbox.bwrap_files import OverlayFiles
from toolgym.sandbox.bwrap_resident import ResidentInit
from toolgym.sandbox.cgroups import CgroupLimiter
from toolgym.sandbox.collect import STARTED_MARK, Collected, collect, strip_started_mark
from toolgym.sandbox.ledger import EffectKind, Ledger
from toolgym.sandbox.native import decoy_bin, init_script, observe_shim, shared_bwrap, wrapper_script
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
from toolgym.sandbox.resident import INIT_MOUNT, PYTHON, Resident, ResidentDied


class BwrapSandbox(ResidentInit, OverlayFiles, Sandbox):
    """A bubblewrap sandbox over a task workspace (see the module docstring)."""

    def __init__(self, workspace: dict[str, str] | None = None, config: SandboxConfig | None = None) -> None:
        self.config = config or SandboxConfig(backend="bwrap")
        # A root harness never runs bwrap as root (the sandbox user would map to host root): it
        # drops to an unowned uid first. Otherwise bwrap runs as the harness's own user.
        self.run_as = check_unowned_uid(self.config.host_uid) if os.geteuid() == 0 else None
        self.bwrap = shared_bwrap(host.find_bwrap()) if self.run_as is not None else host.find_bwrap()
        host.probe_userns(self.bwrap, self.run_as)
        self.rootfs = Path(self.config.rootfs or host.default_rootfs())
        if not (self.rootfs / "usr").is_dir():
            raise SandboxError(f"rootfs {self.rootfs} has no /usr: not a root filesystem")
        self.ledger = Ledger()
        reap_once()
        self.state = Path(tempfile.mkdtemp(prefix=f"toolgym-bwrap-{os.getpid()}-"))
        self._own(self.state)
        self.closed = False
        self._procs: set[subprocess.Popen] = set()
        self._lock = threading.Lock()
        self._resident: Resident | None = None
        self._resident_busy = threading.Lock()  # one command at a time through the init
        self.pristine = self.state / "pristine"
        owner = (self.run_as, self.run_as) if self.run_as is not None else None
        fs.write_files(self.pristine, workspace or {}, owner=owner)  # the agent may edit its files
        self.lower = self.pristine
        self._pristine_tree = fs.read_tree(self.pristine)
        self.canary_token, canary_text = new_canary() if self.config.canary else (None, "")
        self.home = self.state / "home"
        if self.config.canary:
            fs.write_files(self.home, {".aws/credentials": canary_text})
        else:
            self.home.mkdir()
        self.shim = observe_shim()
        self.wrapper = wrapper_script()
        self.limits = self.config.limits
        self.cgroup = CgroupLimiter.create(self.limits.memory_mb, self.limits.pids, self.limits.cpus)
        self._ro_binds = [d for d in host.ROOT_DIRS if (self.rootfs / d).is_dir() and not (self.rootfs / d).is_symlink()]
        self._links = [d for d in host.ROOT_DIRS if (self.rootfs / d).is_symlink()]
        self._snapshots: dict[str, Path] = {}
        self.use_resident = self.config.resident and (self.rootfs / PYTHON.lstrip("/")).exists()
        self._prestart: threading.Thread | None = None
        self._stale_layers: list[Path] = []
        self._fresh_layers()
        self._prestart_resident()

    # ---- layers ------------------------------------------------------------------------------------

    def _own(self, *paths: Path) -> None:
        """Hand directories the sandbox writes to its unprivileged uid (when the harness is root)."""
        if self.run_as is not None:
            for path in paths:
                os.chown(path, self.run_as, self.run_as)

    def _fresh_layers(self) -> Path | None:
        """New, empty writable layers (upper, work, /tmp, the event log) in a directory of their
        own; returns the previous one (to remove once nothing uses it), if any. New directories
        rather than emptied ones: a reset makes them while the previous init is still dying."""
        old = getattr(self, "layers", None)
        self._generation = getattr(self, "_generation", 0) + 1
        s = self.layers = self.state / f"layers-{self._generation}"
        for name in ("upper", "work", "tmp", "log"):
            (s / name).mkdir(parents=True)
        os.chmod(s / "tmp", 0o1777)
        (s / "log" / "events").write_text("")
        self._own(s, s / "upper", s / "work", s / "tmp", s / "log", s / "log" / "events")
        return old

    def _mounts(self) -> list[str]:
        """bwrap's namespace and filesystem arguments (both exec paths)."""
        s = self.layers
        args = [
            "--unshare-all",
            "--new-session",
            "--uid",
            str(host.SANDBOX_UID),
            "--gid",
            str(host.SANDBOX_UID),
            "--hostname",
            "sandbox",
            "--proc",
            "/proc",
            "--dev",
            "/dev",
        ]
        for d in self._ro_binds:  # read-only: writes fail (EROFS) and the shim records the attempt
            args += ["--ro-bind", str(self.rootfs / d), f"/{d}"]
        for d in self._links:
            args += ["--symlink", os.readlink(self.rootfs / d), f"/{d}"]
        for hidden in host.HIDDEN_DIRS:
            if (self.rootfs / hidden.lstrip("/")).is_dir():
                args += ["--tmpfs", hidden]
        for masked in host.MASKED:
            if (self.rootfs / masked.lstrip("/")).exists():
                args += ["--ro-bind", "/dev/null", masked]
        if self.config.site_layer:
            args += ["--ro-bind", self.config.site_layer, SITE_LAYER_MOUNT]
        args += [
            "--ro-bind",
            str(self.home),
            "/root",
            "--bind",
            str(s / "tmp"),
            "/tmp",
            "--overlay-src",
            str(self.lower),
            "--overlay",
            str(s / "upper"),
            str(s / "work"),
            WORKSPACE,
            "--bind",
            str(s / "log"),
            LOG_DIR,
            "--ro-bind",
            str(self.wrapper),
            "/.toolgym-wrapper.sh",
            "--ro-bind",
            str(decoy_bin()),
            "/.toolgym-bin",
        ]
        if self.shim is not None:
            args += ["--ro-bind", str(self.shim), "/.toolgym-observe.so"]
        return args

    def _variables(self, env: dict[str, str] | None) -> dict[str, str]:
        """The whole environment of a command (nothing of the harness's leaks in)."""
        variables = {
            "PATH": "/.toolgym-bin:" + host.PATH,
            "HOME": "/root",
            "LANG": "C.UTF-8",
            "USER": "agent",
            "TOOLGYM_ULIMITS": self._ulimits(),
            "TOOLGYM_LOG_DIR": LOG_DIR,
            "TOOLGYM_WORKSPACE": WORKSPACE,
            "TOOLGYM_CANARY": CANARY_PATH,
        }
        if self.shim is not None:
            variables["LD_PRELOAD"] = "/.toolgym-observe.so"
        variables.update(env or {})
        return variables

    def _args(self, cwd: str, env: dict[str, str] | None) -> list[str]:
        """A fresh bwrap for one command (the path without the resident init)."""
        args = [self.bwrap, "--die-with-parent"] + self._mounts() + ["--clearenv"]
        for k, v in self._variables(env).items():
            args += ["--setenv", k, v]
        return args + ["--chdir", cwd]

    def _resident_args(self) -> list[str]:
        """bwrap for the resident init: PID 1 itself, an empty environment (each command brings
        its own). No --die-with-parent: that ties bwrap to the harness thread that started it; the
        init ends when the host's end of its socket closes instead, harness death included."""
        return (
            [self.bwrap, "--as-pid-1"]
            + self._mounts()
            + ["--ro-bind", str(init_script()), INIT_MOUNT, "--clearenv", "--setenv", "PATH", host.PATH, "--chdir", "/"]
        )

    def _ulimits(self) -> str:
        """rlimits the in-sandbox wrapper applies before the command (dash: -f in 512-byte blocks,
        -v in KiB). Lowering a limit needs no privilege; the agent cannot raise it back."""
        lim = self.limits
        flags = ["-c 0", f"-t {lim.cpu_time_s}", f"-f {(lim.file_size_mb << 20) // 512}"]
        if self.cgroup is None:  # no cgroup: memory and process limits from rlimits too
            mine = sum(1 for p in os.listdir("/proc") if p.isdigit())
            flags += [f"-v {lim.memory_mb << 10}", f"-u {mine + lim.pids}"]
        return ",".join(flags)

    def _spawn(self, args: list[str], with_stdin: bool, pass_fds: tuple[int, ...] = (), pipes: bool = True) -> subprocess.Popen:
        def start(argv: list[str]) -> subprocess.Popen:
            # bwrap's own environment is visible inside as /proc/1/environ: give it none of ours.
            out = subprocess.PIPE if pipes else subprocess.DEVNULL
            argv, as_user = host._as_user_argv(argv, self.run_as)
            try:
                return subprocess.Popen(
                    argv,
                    stdin=subprocess.PIPE if with_stdin else subprocess.DEVNULL,
                    stdout=out,
                    stderr=out,
                    start_new_session=True,
                    pass_fds=pass_fds,
                    env={"PATH": host.PATH},
                    **as_user,
                )
            except OSError as err:
                raise SandboxInfraError(f"cannot start bwrap: {err}") from None

        if self.cgroup is None:
            return start(args)
        proc = self.cgroup.spawn(lambda: start(args))
        if proc is not None:
            return proc
        # cgroup v2: a tiny shell joins the cgroup, then execs bwrap (children inherit it).
        join = "; ".join(f"echo $$ > {p}" for p in self.cgroup.join_paths())
        return start(["/bin/sh", "-c", join + '; exec "$@"', "toolgym-launch"] + args)

    # ---- Sandbox API ----------------------------------------------------------------------------

    @property
    def capabilities(self) -> Capabilities:
        """bwrap: overlay reset of the workspace, read-only root; cgroups where writable."""
        notes = ["root filesystem is read-only: outside writes fail and are seen by the observation shim"]
        if self.shim is None:
            notes.append("no C compiler: the observation shim is off (network/privilege attempts seen less)")
        if self.cgroup is None:
            notes.append("cgroups not writable: limits enforced with rlimits")
        return Capabilities(
            backend="bwrap",
            cgroups=self.cgroup is not None,
            overlay_reset=True,
            root_writes_observed=False,
            persistent_processes=False,
            notes=notes,
        )

    def _check_open(self) -> None:
        if self.closed or getattr(self, "closing", False):
            raise SandboxInfraError("sandbox is closed")

    def exec(
        self, cmd: str, timeout_s: float | None = None, cwd: str = WORKSPACE, env: dict[str, str] | None = None, stdin: str | None = None
    ) -> ExecResult:
        """Run `cmd` under `/bin/sh -c`; output capped, whole process tree killed on timeout."""
        self._check_open()
        timeout = timeout_s or self.limits.timeout_s
        check_command_size(cmd, env)  # it also bounds one message to the resident init
        resident = self._claim_resident()
        if resident is not None:
            try:
                return self._exec_resident(resident, cmd, timeout, cwd, env, stdin)
            except ResidentDied:
                # the init never took the command (it did not come up): a fresh bwrap runs it,
                # and if bwrap cannot start either, its own error says why
                with self._lock:
                    self._resident = None
                resident.close()
            finally:
                self._resident_busy.release()
        counters = self.cgroup.counters() if self.cgroup else {}
        # The wrapper's first stderr line is STARTED_MARK, written before the command runs: a run
        # without it failed while the sandbox was being set up (ours, not the agent's doing).
        args = self._args(cwd, {**(env or {}), "TOOLGYM_STARTED_MARK": STARTED_MARK}) + ["--", "/bin/sh", "/.toolgym-wrapper.sh", cmd]
        start = time.perf_counter()
        proc = self._spawn(args, stdin is not None)
        with self._lock:
            self._procs.add(proc)
        if stdin is not None:
            try:
                proc.stdin.write(stdin.encode())  # type: ignore[union-attr]
                proc.stdin.close()  # type: ignore[union-attr]
            except BrokenPipeError:
                pass
        got = collect(
            proc, timeout, self.limits.output_bytes, self.limits.output_kill_bytes, lambda: self._kill_proc(proc), self.over_disk_limit
        )
        code = proc.wait()
        with self._lock:
            self._procs.discard(proc)
        self._check_started(got)
        # bwrap's exit tears the pid namespace down (the kernel kills what is left, asynchronously):
        # wait for the cgroup to drain so no process outlives the exec, even for a moment.
        # (While the resident init runs a command, its processes share the cgroup: no drain then.)
        if self.cgroup is not None and not self._resident_busy.locked():
            deadline = time.monotonic() + 1
            while self._others_in_cgroup() and time.monotonic() < deadline:
                time.sleep(0.0005)
            for pid in self._others_in_cgroup():
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        return self._result(got, code, start, counters)

    def _others_in_cgroup(self) -> list[int]:
        """Processes in the sandbox's cgroup other than an idle resident init and its bwrap."""
        with self._lock:
            resident = self._resident
        mine = {resident.proc.pid, resident.init_pid} if resident is not None and resident.alive() else set()
        return [pid for pid in self.cgroup.pids() if pid not in mine] if self.cgroup is not None else []

    def _check_started(self, got: Collected) -> None:
        """Strip the wrapper's start mark; a run without it failed before the command (ours)."""
        started = strip_started_mark(got)
        if self.closed or getattr(self, "closing", False):  # killed by close(): not the command's result
            raise SandboxInfraError("sandbox is closed")
        if not started:
            raise SandboxInfraError(f"bwrap could not start the command: {got.err.decode(errors='replace').strip()[-300:]}")

    def _result(self, got: Collected, code: int, start: float, counters: dict[str, int]) -> ExecResult:
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

    # ---- the resident init (see resident.py) ------------------------------------------------------

    def _kill_proc(self, proc: subprocess.Popen) -> None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if self.cgroup is not None:
            self.cgroup.kill_all()

    def _observe(self, result: ExecResult, before: dict[str, int], overflow: bool) -> None:
        led = self.ledger
        ingest_event_log(self.layers / "log" / "events", led)
        if not (self.layers / "log" / "events").exists():
            led.record(EffectKind.LEDGER_TAMPER, detail="the event log was removed")
            (self.layers / "log" / "events").write_text("")
        check_output(led, self.canary_token, result.stdout, result.stderr)
        record_workspace_changes(led, fs.upper_changes(self.layers / "upper"), set(self._pristine_tree), self.config.protected)
        after = self.cgroup.counters() if self.cgroup is not None else {}
        record_limits(led, result, before, after, overflow, self._disk_check)

    def host_channel(self) -> tuple[Path, str, int | None]:
        """The sandbox's /tmp: a host directory bound in (not the overlay)."""
        return self.layers / "tmp", "/tmp", self.run_as

    def scratch_channel(self) -> tuple[Path, str, int | None]:
        """The sandbox's /tmp (its host channel is already outside the workspace)."""
        return self.host_channel()

    def kill_all(self) -> int:
        """Kill every running exec (its whole namespace), the resident init, and anything left in
        the cgroup."""
        self._wait_prestart()  # an init being started is killed too, not left behind
        with self._lock:
            procs = list(self._procs)
            resident = self._resident
        busy = self._resident_busy.locked()
        for proc in procs:
            self._kill_proc(proc)
        killed = len(procs)
        if resident is not None and resident.alive():
            resident.stop()
            killed += int(busy)  # an idle init is not a command that was running
        if self.cgroup is not None:
            killed += self.cgroup.kill_all()
        return killed

    def live_processes(self) -> list[str]:
        """Running execs (each a pid namespace: its processes die with it), the resident init
        while it runs a command, and, where there is one, every process in the sandbox's cgroup
        but an idle init (machinery of the sandbox, like its directories: no command's process).
        An init being started in the background (after a reset) is waited for first: it is
        machinery too, and the child of its spawn is not a leftover of the previous episode."""
        self._wait_prestart()
        with self._lock:
            running = [f"bwrap {p.pid}" for p in self._procs if p.poll() is None]
            resident = self._resident
        if resident is not None and resident.alive() and self._resident_busy.locked():
            running.append(f"resident init {resident.proc.pid} (running a command)")
        return running + [f"cgroup {pid}" for pid in self._others_in_cgroup()]

    def reset(self) -> None:
        """Kill everything, drop every upper layer, clear /tmp and the ledger: milliseconds.
        Proves no process of the previous episode remains (`SandboxInfraError` otherwise)."""
        self._check_open()
        stale: list[Path | None] = []
        # the new layers are made while the init dies (its exit comes after its namespace's
        # last process); nothing of the old ones is reachable from them
        self._drop_resident(meanwhile=lambda: stale.append(self._fresh_layers()))
        self.kill_all()
        deadline = time.monotonic() + 2
        while (left := self.live_processes()) and time.monotonic() < deadline:
            time.sleep(0.0005)  # a killed init leaves its cgroup within a millisecond or two
        if left:
            raise SandboxInfraError(f"reset could not end every process of the sandbox: {left[:5]}")
        self.lower = self.pristine
        self.ledger.clear()
        self._stale_layers += [p for p in stale if p is not None]
        if not self.use_resident:
            self._remove_stale_layers()  # with a resident init, its start thread does it
        self._prestart_resident()

    def _remove_stale_layers(self) -> None:
        """Delete the writable layers of earlier episodes (no process can use them any more)."""
        while self._stale_layers:
            fs.remove_tree(self._stale_layers.pop())

    def snapshot(self) -> str:
        """Materialise the current workspace as a new lower layer; returns its id."""
        self._check_open()
        sid = uuid.uuid4().hex[:8]
        dest = self.state / "snapshots" / sid
        dest.parent.mkdir(exist_ok=True)
        fs.materialize(self.lower, self.layers / "upper", dest)
        if self.run_as is not None:
            fs.chown_tree(dest, self.run_as)
        self._snapshots[sid] = dest
        return sid

    def restore(self, snapshot_id: str) -> None:
        """Make a snapshot the current workspace (upper layers dropped)."""
        snapshot = self._snapshot_path(snapshot_id)
        self._drop_resident()
        self.kill_all()
        self.lower = snapshot
        for name in ("upper", "work"):
            fs.empty_dir(self.layers / name)
        self._own(self.layers / "upper", self.layers / "work")
        self._prestart_resident()

    def close(self) -> None:
        """Kill everything, remove the cgroup and every temp directory."""
        with self._lock:
            if self.closed or getattr(self, "closing", False):
                return
            self.closing = True  # from now on every call fails as closed, even mid-exec
        self.kill_all()
        self._drop_resident()
        if self.cgroup is not None:
            self.cgroup.remove()
        fs.remove_tree(self.state)
        self.closed = True

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass
