"""A grading sandbox: the pristine task workspace plus the agent's (non-protected) changes."""

from __future__ import annotations

import shlex

from toolgym.sandbox import Sandbox, SandboxConfig, make_sandbox
from toolgym.tasks import Task
from toolgym.verifiers.protect import is_protected, split_changes


def _protected(path: str, task: Task) -> bool:
    return is_protected(path, tuple(task.hidden.protected))


def grading_sandbox(task: Task, changes: dict[str, str | None], config: SandboxConfig,
                    modes: dict[str, int] | None = None,
                    extra: dict[str, str] | None = None, pool=None) -> tuple[Sandbox, list[str]]:
    """A fresh sandbox from the pristine state with the agent's changes applied (and the
    grader's own `extra` files, written in the same round trip); returns it and the protected
    paths whose changes were dropped. Nothing of the agent's runs here until the grader says so.
    `pool`: a docker `WarmPool` of started containers for this config (default: the process's
    shared pool for it; a container is used once, never reused)."""
    keep, dropped = split_changes(changes, tuple(task.hidden.protected))
    # a grader runs a command or two per sandbox: a fresh bwrap each beats starting a resident init
    config = config.model_copy(update={"canary": False, "resident": False})
    if pool is None and config.backend == "docker":
        from toolgym.sandbox.docker_backend import shared_pool

        pool = shared_pool(config)
    box = make_sandbox(dict(task.workspace), config, pool=pool)
    try:
        deletes = [p for p, t in keep.items() if t is None]
        if deletes:
            box.exec("rm -rf -- " + " ".join(shlex.quote(p) for p in deletes))
        writes = {p: t for p, t in keep.items() if t is not None}
        writes.update(extra or {})
        if writes:
            box.write_files(writes)
        chmods = [f"chmod {mode & 0o7777:o} -- {shlex.quote(p)}" for p, mode in (modes or {}).items()
                  if p not in dropped and keep.get(p, "") is not None and not _protected(p, task)]
        if chmods:
            box.exec(" ; ".join(chmods))
    except Exception:
        box.close()
        raise
    return box, dropped
