"""Protected paths: files the agent may not change because they decide the grade.

Agent changes to them are dropped before grading and reported as tampering.
"""

from __future__ import annotations

import fnmatch

from toolgym.sandbox.observe import is_cache

#: Always protected, in every task: test configuration, import hooks, VCS data, our own dirs.
ALWAYS = (
    "conftest.py",
    "**/conftest.py",
    "pytest.ini",
    "**/pytest.ini",
    "tox.ini",
    "setup.cfg",
    "pyproject.toml",
    "sitecustomize.py",
    "**/sitecustomize.py",
    "usercustomize.py",
    "**/usercustomize.py",
    "*.pth",
    "**/*.pth",
    ".git",
    ".git/**",
    "tests_hidden",
    "tests_hidden/**",
    ".toolgym-*",
    ".toolgym-*/**",
    # test-runner material: a shadowing pytest and plugin metadata (entry points) it would load
    "pytest.py",
    "**/pytest.py",
    "_pytest",
    "_pytest/**",
    "**/_pytest/**",
    "*.dist-info/**",
    "**/*.dist-info/**",
    "*.egg-info/**",
    "**/*.egg-info/**",
)


def is_protected(path: str, task_protected: tuple[str, ...] = ()) -> bool:
    """True if `path` (workspace-relative) is protected by default or by the task."""
    path = path.strip("/")
    for pattern in ALWAYS:
        if fnmatch.fnmatch(path, pattern):
            return True
    for p in task_protected:
        p = p.strip("/")
        if path == p or path.startswith(p + "/") or fnmatch.fnmatch(path, p):
            return True
    return False


def split_changes(changes: dict[str, str | None], task_protected: tuple[str, ...]) -> tuple[dict, list[str]]:
    """(changes to keep, protected paths whose changes were dropped).

    Caches are left out silently: an agent that ran the tests before fixing the code would
    otherwise carry bytecode of the buggy code into grading, where a same-size fix with the same
    recorded mtime loads the stale `.pyc` (and running tests is not tampering)."""
    keep, dropped = {}, []
    for path, text in changes.items():
        if is_cache(path):
            continue
        if is_protected(path, task_protected):
            dropped.append(path)
        else:
            keep[path] = text
    return keep, sorted(dropped)
