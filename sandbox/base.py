"""The `Sandbox` protocol, its data types and configuration.

A sandbox is an isolated place with a workspace directory (`/workspace` inside) where commands
run. `reset()` returns it to the pristine workspace, provably: `state_hash()` after `reset()`
equals the hash before any action. Every backend declares its `capabilities` and passes the
same conformance suite (tests/test_sandbox_conformance.py).
"""

from __future__ import annotations

import abc
import os
import pwd
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from toolgym.sandbox.ledger import Ledger, SafetyPolicy, SideEffect

WORKSPACE = "/workspace"
#: The sandbox base image (and rootfs) version: bump it when the image's contents change, so a
#: machine with an older build rebuilds instead of reusing it.
IMAGE_TAG = "toolgym/sandbox:v2"
#: Where a `SandboxConfig.site_layer` appears inside: the image Python's site directory for locally
#: installed packages (on `sys.path` even under `python3 -I`, ahead of Debian's own packages).
SITE_LAYER_MOUNT = "/usr/local/lib/python3.11/dist-packages"


#: The host uid (and gid) sandboxed processes run as by default: one that no account owns, so a
#: file the sandbox creates belongs to nobody on the host and a setuid bit on it grants nothing.
DEFAULT_HOST_UID = 1_999_999_000


def cache_dir() -> Path:
    """Where sandbox helpers and the root filesystem are cached: `$TOOLGYM_CACHE`, else
    `/var/cache/toolgym` for root (readable by the unprivileged sandbox uid, unlike /root), else
    `~/.cache/toolgym`."""
    if os.environ.get("TOOLGYM_CACHE"):
        return Path(os.environ["TOOLGYM_CACHE"])
    return Path("/var/cache/toolgym") if os.geteuid() == 0 else Path.home() / ".cache" / "toolgym"


def site_layer_dir(name: str) -> Path:
    """Where the site layer `name` (a task's installed dependencies) lives: `cache_dir()/layers`."""
    if not name or "/" in name or name.startswith("."):
        raise SandboxError(f"bad site layer name {name!r}: expected a plain directory name")
    return cache_dir() / "layers" / name


def with_site_layer(config: SandboxConfig, name: str | None) -> SandboxConfig:
    """`config` with the site layer `name` mounted (unchanged for None); `SandboxUnavailable`
    with the fix when the layer was never built on this machine."""
    if not name:
        return config
    path = site_layer_dir(name)
    if not (path / ".complete").exists():
        raise SandboxUnavailable(
            f"site layer {name!r} is not built on this machine ({path}): mine the suite again (`toolgym tasks mine ...`), which builds it"
        )
    return config.model_copy(update={"site_layer": str(path)})


def check_unowned_uid(uid: int) -> int:
    """`uid` if no host account owns it; else `SandboxUnavailable` naming the owner and the fix."""
    try:
        owner = pwd.getpwuid(uid).pw_name
    except KeyError:
        return uid
    raise SandboxUnavailable(
        f"host uid {uid} belongs to the account {owner!r}: sandboxed processes must run as a "
        "uid no account owns; set SandboxConfig(host_uid=...) to a free one"
    )


class SandboxError(RuntimeError):
    """The sandbox could not do what was asked (backend missing, daemon down, bad path)."""


class SandboxInfraError(SandboxError):
    """The sandbox itself failed: it died, could not start a command, is exhausted, or a helper
    or daemon call failed. Never the agent's doing (an agent's failing command is an ExecResult)."""


class SandboxUnavailable(SandboxError):
    """A backend cannot run on this machine; the message says what is missing and how to fix it."""


class Limits(BaseModel):
    """Resource limits for everything run in a sandbox."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    memory_mb: int = Field(default=512, ge=16)
    pids: int = Field(default=128, ge=8)
    cpu_time_s: int = Field(default=60, ge=1, description="CPU seconds per exec (rlimit fallback)")
    cpus: float = Field(default=1.0, gt=0)
    file_size_mb: int = Field(default=64, ge=1)
    disk_mb: int = Field(
        default=128,
        ge=1,
        description="bytes the sandbox's commands may write to the host's "
        "disk (workspace and scratch), in MiB: a command is stopped when it passes them",
    )
    output_bytes: int = Field(default=64_000, ge=1024, description="stdout/stderr kept per stream")
    output_kill_bytes: int = Field(default=8_000_000, description="output beyond this kills the exec")
    timeout_s: float = Field(default=30.0, gt=0)


class SandboxConfig(BaseModel):
    """How to build a sandbox: backend, image/rootfs, limits, protected paths, canary."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    backend: str = Field(default="bwrap", description="bwrap | docker")
    rootfs: str | None = Field(
        default=None, description="bwrap: an unpacked image directory (default: the toolgym rootfs if built, else the host's /)"
    )
    image: str = Field(default=IMAGE_TAG, description="docker: the image")
    limits: Limits = Field(default_factory=Limits)
    protected: tuple[str, ...] = Field(default=(), description="workspace paths the agent must not change")
    canary: bool = True
    policy: SafetyPolicy = Field(default_factory=SafetyPolicy)
    host_uid: int = Field(
        default=DEFAULT_HOST_UID,
        ge=1,
        lt=2**31 - 1,
        description="host uid/gid of sandboxed processes (docker always; bwrap when the harness "
        "runs as root: it drops to this uid before starting bwrap)",
    )
    site_layer: str | None = Field(
        default=None,
        description="a host directory of installed Python packages mounted "
        "read-only at SITE_LAYER_MOUNT (a task's dependencies, built once on the host: "
        "episodes and grading need no network)",
    )
    resident: bool = Field(
        default=True,
        description="bwrap: run commands through one resident init per "
        "sandbox state (a fork per exec) instead of a fresh bwrap per command",
    )


class ExecResult(BaseModel):
    """What running one command produced."""

    exit_code: int
    stdout: str = ""
    stderr: str = ""
    truncated: bool = False
    timed_out: bool = False
    duration_s: float = 0.0
    oom_killed: bool = False
    limit_hit: str | None = Field(default=None, description="memory | pids | output | cpu | file_size | disk")

    @property
    def ok(self) -> bool:
        """Exit code 0 and no limit or timeout."""
        return self.exit_code == 0 and not self.timed_out and self.limit_hit is None


class Capabilities(BaseModel):
    """What a backend can do on this machine."""

    backend: str
    network_isolated: bool = True
    persistent_processes: bool = False
    cgroups: bool = False
    overlay_reset: bool = False
    root_writes_observed: bool = False
    notes: list[str] = Field(default_factory=list)


class Sandbox(abc.ABC):
    """The protocol every backend implements (see the module docstring)."""

    config: SandboxConfig
    ledger: Ledger

    @property
    @abc.abstractmethod
    def capabilities(self) -> Capabilities:
        """What this backend can do here."""

    @abc.abstractmethod
    def exec(
        self, cmd: str, timeout_s: float | None = None, cwd: str = WORKSPACE, env: dict[str, str] | None = None, stdin: str | None = None
    ) -> ExecResult:
        """Run `cmd` with `/bin/sh -c` inside the sandbox; never raises for the command's failure."""

    @abc.abstractmethod
    def read_file(self, path: str) -> str:
        """Text of a workspace file (relative to the workspace, or absolute under it)."""

    @abc.abstractmethod
    def write_file(self, path: str, text: str) -> None:
        """Write a workspace file (parents created)."""

    def write_files(self, files: dict[str, str]) -> None:
        """Write several workspace files (backends may do it in one round trip)."""
        for path, text in files.items():
            self.write_file(path, text)

    def written_bytes(self) -> int:
        """Bytes the sandbox's commands have written to the host's disk (workspace and scratch),
        counted on the host's side; backends without such a count say 0."""
        return 0

    def over_disk_limit(self) -> bool:
        """True once the commands have written more than `limits.disk_mb` (a running command is
        stopped, and its result says `disk`)."""
        return self.written_bytes() > self.config.limits.disk_mb << 20

    def _disk_check(self, result: ExecResult) -> None:
        """After a command: over the disk limit is the command's limit hit (recorded by `_observe`)."""
        if result.limit_hit is None and self.over_disk_limit():
            result.limit_hit = "disk"

    @abc.abstractmethod
    def read_host_bytes(self, path: str) -> bytes:
        """A workspace file's bytes read from the host's side of the filesystem, never through a
        command run inside (graders read reports this way: nothing inside can forge the read)."""

    @abc.abstractmethod
    def files(self) -> dict[str, Any]:
        """The current workspace tree: relative path -> `fs.Entry`."""

    @abc.abstractmethod
    def reset(self) -> None:
        """Kill everything and restore the pristine workspace (and everything outside it)."""

    @abc.abstractmethod
    def snapshot(self) -> str:
        """Save the current workspace; returns a snapshot id for `restore`."""

    @abc.abstractmethod
    def restore(self, snapshot_id: str) -> None:
        """Return the workspace to a snapshot."""

    @abc.abstractmethod
    def live_processes(self) -> list[str]:
        """Processes of this sandbox that still exist, zombies included (empty after `reset()`);
        seen through the sandbox's own cgroup, namespace or container, never the whole host."""

    @abc.abstractmethod
    def kill_all(self) -> int:
        """Kill every process running in the sandbox; returns how many were killed."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release everything; leaves no process, mount, container or temp dir behind."""

    def host_channel(self) -> tuple[Path, str, int | None]:
        """A directory both sides see: (its host path, its path inside, the host uid the sandbox's
        processes run as, or None for the harness's own). For the grader's long-lived services
        (`verifiers/judge.py`); files the host puts there must be readable by that uid."""
        raise NotImplementedError(f"{type(self).__name__} has no host channel")

    def scratch_channel(self) -> tuple[Path, str, int | None]:
        """Like `host_channel`, but never the workspace: the sandbox's /tmp as the host sees it
        (emptied by `reset`), for an episode's own long-lived service (an MCP server's pipes)
        whose files must not show in the workspace or its final state. `SandboxError` where the
        host cannot reach it."""
        raise SandboxError(f"{type(self).__name__} has no scratch channel")

    # ---- shared behaviour ------------------------------------------------------------------------

    def state_hash(self) -> str:
        """Content hash of the workspace: paths, modes, bytes, symlink targets."""
        from toolgym.sandbox.fs import tree_hash

        return tree_hash(self.files())

    def diff(self) -> dict[str, str]:
        """Workspace changes vs pristine: path -> added | modified | deleted | mode."""
        from toolgym.sandbox.fs import diff_trees

        return diff_trees(self.pristine_files(), self.files())

    @abc.abstractmethod
    def pristine_files(self) -> dict[str, Any]:
        """The pristine workspace tree."""

    def _snapshot_path(self, snapshot_id: str) -> Any:
        """The saved snapshot for `snapshot_id`, or `SandboxError` (shared by the backends)."""
        if getattr(self, "closed", False):
            raise SandboxError("sandbox is closed")
        snapshots = getattr(self, "_snapshots", {})
        if snapshot_id not in snapshots:
            raise SandboxError(f"no snapshot {snapshot_id!r}")
        return snapshots[snapshot_id]

    def events(self) -> list[SideEffect]:
        """Side effects recorded since the last reset."""
        return list(self.ledger.events)

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


#: Bytes of command and environment one exec may carry: the command reaches the exec wrapper as
#: one argument, and the kernel takes 128 KiB per argument.
MAX_COMMAND_BYTES = 120 * 1024


def check_command_size(cmd: str, env: dict[str, str] | None) -> None:
    """`SandboxError` (the caller's input, not a sandbox failure) for a command too long to run."""
    size = len(cmd.encode()) + sum(len(k) + len(v.encode()) for k, v in (env or {}).items())
    if size > MAX_COMMAND_BYTES:
        raise SandboxError(
            f"the command and its environment are {size} bytes; the limit is {MAX_COMMAND_BYTES} (write long content to a file instead)"
        )


def workspace_rel(path: str) -> str:
    """Normalise a workspace path; refuses escapes (`..`, absolute paths elsewhere)."""
    p = path.strip()
    if p.startswith(WORKSPACE + "/"):
        p = p[len(WORKSPACE) + 1 :]
    elif p == WORKSPACE:
        p = ""
    if p.startswith("/"):
        raise SandboxError(f"path {path!r} is outside the workspace ({WORKSPACE})")
    parts = [x for x in Path(p).parts if x not in ("", ".")]
    if any(x == ".." for x in parts):
        raise SandboxError(f"path {path!r} escapes the workspace")
    return "/".join(parts)


def host_path(root: Path, rel: str) -> Path:
    """`root/rel`, refusing paths that leave `root` through symlinks."""
    target = root / rel
    resolved_root = root.resolve()
    parent = target.parent.resolve()
    if parent != resolved_root and resolved_root not in parent.parents:
        raise SandboxError(f"path {rel!r} leaves the workspace through a symlink")
    return target
