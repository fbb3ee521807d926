"""A grading sandbox: the pristine task workspace plus the agent's (non-protected) changes."""

from __future__ import annotations

import shlex

from toolgym.sandbox import Sandbox, SandboxConfig, SandboxError, make_sandbox
from toolgym.sandbox.base import workspace_rel
from toolgym.tasks import Task
from toolgym.verifiers.protect import is_protected, split_changes

#: MiB a grading sandbox's commands may write (a test run writes its report and little else).
GRADING_DISK_MB = 32


def _protected(path: str, task: Task) -> bool:
    return is_protected(path, tuple(task.hidden.protected))


def grading_config(config: SandboxConfig) -> SandboxConfig:
    """The sandbox config a grader's sandbox runs under (its docker pool is this config's)."""
    # a grader runs a command or two per sandbox: a fresh bwrap each beats starting a resident init;
    # grading writes a report and little else: code that fills the disk is stopped early
    limits = config.limits.model_copy(update={"disk_mb": min(config.limits.disk_mb, GRADING_DISK_MB)})
    return config.model_copy(update={"canary": False, "resident": False, "limits": limits})


def grading_sandbox(
    task: Task,
    changes: dict[str, str | None],
    config: SandboxConfig,
    modes: dict[str, int] | None = None,
    extra: dict[str, str] | None = None,
    pool=None,
) -> tuple[Sandbox, list[str]]:
    """A fresh sandbox from the pristine state with the agent's changes applied (and the
    grader's own `extra` files); returns it and the protected paths whose changes were dropped.
    The changes are written on the host as the sandbox's starting files (no command runs for
    them: a start less per grading); nothing of the agent's runs here until the grader says so.
    `pool`: a docker `WarmPool` of started containers for this config (default: the process's
    shared pool for it; a container is used once, never reused)."""
    keep, dropped = split_changes(changes, tuple(task.hidden.protected))
    files = dict(task.workspace)
    for path, text in keep.items():
        try:
            rel = workspace_rel(path)
        except SandboxError:
            rel = ""
        if not rel:  # not a workspace path: nothing an episode can produce; dropped like tampering
            dropped.append(path)
        elif text is None:  # a deleted file or directory, as `rm -rf` would
            for name in [n for n in files if n == rel or n.startswith(rel + "/")]:
                del files[name]
        else:
            files = {n: t for n, t in files.items() if not n.startswith(rel + "/")}  # a file replaced a dir
            files[rel] = text
    files.update(extra or {})
    config = grading_config(config)
    if pool is None and config.backend == "docker":
        from toolgym.sandbox.docker_pool import shared_pool

        pool = shared_pool(config)
    box = make_sandbox(files, config, pool=pool)
    try:
        apply_modes(box, task, changes, modes, dropped)
    except Exception:
        box.close()
        raise
    return box, sorted(dropped)


def apply_modes(box: Sandbox, task: Task, changes: dict[str, str | None], modes: dict[str, int] | None, dropped: list[str]) -> None:
    """Give the agent's files their permission bits (again after a `reset()`): one command."""
    chmods = [
        f"chmod {mode & 0o7777:o} -- {shlex.quote(p)}"
        for p, mode in (modes or {}).items()
        if p not in dropped and changes.get(p, "") is not None and not _protected(p, task)
    ]
    if chmods:
        box.exec(" ; ".join(chmods))
