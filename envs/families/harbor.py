"""`harbor-v0`: tasks imported from Harbor's format, played in toolgym's sandbox with its standard
tools and graded by the task's own `tests/test.sh` (see `tasks/harbor.py`).

    toolgym eval --policy oracle --suite DIR_OF_HARBOR_TASKS
"""

from __future__ import annotations

from toolgym.envs.registry import register_env
from toolgym.envs.sandbox_env import SandboxEnv
from toolgym.tasks.harbor import load_harbor_dir
from toolgym.tasks.suite import DIRECTORY_FORMATS, TaskLoadError, TaskSuite


@register_env("harbor-v0")
class HarborEnv(SandboxEnv):
    """A Harbor task: its workspace in the sandbox, the standard tools, its own test script grades."""

    max_turns = 30


def load_harbor_suite(root) -> TaskSuite:
    """A directory of Harbor task directories as a suite (what cannot be imported is an error
    that names it, so a run never silently evaluates fewer tasks than the directory holds)."""
    tasks, skipped = load_harbor_dir(root)
    if skipped:
        name, why = next(iter(skipped.items()))
        raise TaskLoadError(f"{len(skipped)} Harbor task(s) in {root} cannot be imported; first, {name}: {why}")
    return TaskSuite(root.name, tasks, "1")


# `TaskSuite.load` reads a directory of Harbor task directories through this hook.
DIRECTORY_FORMATS.append((lambda path: any((p / "task.toml").is_file() for p in path.iterdir() if p.is_dir()), load_harbor_suite))

__all__ = ["HarborEnv", "load_harbor_suite"]
