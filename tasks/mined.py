"""On-disk format of mined suites: each project's tree stored once, tasks store what differs.

    DIR/suite.yaml              name, version, and per project: split, licence, task count
    DIR/projects/<key>.json     {"files": {path: text}}: the pristine project tree
    DIR/tasks/<key>.jsonl       one task per line; its `workspace` is {"$project": key,
                                "changed": {path: text}} (the buggy file(s))

Loading rebuilds every task's full workspace from its project (sharing the unchanged texts in
memory), so a few hundred tasks over real projects stay small on disk and in memory.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from toolgym.tasks.suite import DIRECTORY_FORMATS, TaskLoadError, TaskSuite, task_from_dict
from toolgym.tasks.task import Task


def task_row(task: Task, project_key: str, base: dict[str, str]) -> str:
    """One JSONL row for `task`, its workspace stored as the changes to `base`."""
    data = task.model_dump(mode="json")
    changed = {p: t for p, t in task.workspace.items() if base.get(p) != t}
    if set(base) - set(task.workspace):
        raise ValueError(f"task {task.id} deletes project files; mined tasks may only change them")
    data["workspace"] = {"$project": project_key, "changed": changed}
    return json.dumps(data)


def write_project(root: Path, key: str, files: dict[str, str]) -> None:
    """Store a project's pristine tree (atomically)."""
    path = root / "projects" / f"{key}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"files": files}))
    tmp.replace(path)


def load_mined_suite(root: str | Path) -> TaskSuite:
    """Load a mined suite directory (see the module docstring)."""
    root = Path(root)
    header_file = root / "suite.yaml"
    if not header_file.exists():
        raise TaskLoadError(f"{root}: no suite.yaml: not a mined suite directory (mine one with `toolgym tasks mine`)")
    header = yaml.safe_load(header_file.read_text()) or {}
    tasks: list[Task] = []
    for key in header.get("projects", {}):
        project_file, task_file = root / "projects" / f"{key}.json", root / "tasks" / f"{key}.jsonl"
        if not project_file.exists() or not task_file.exists():
            raise TaskLoadError(
                f"{root}: project {key} is listed in suite.yaml but {project_file.name} or {task_file.name} is missing; mine it again"
            )
        base = json.loads(project_file.read_text())["files"]
        for lineno, line in enumerate(task_file.read_text().splitlines(), 1):
            if not line.strip():
                continue
            where = f"{task_file}:{lineno}"
            try:
                data = json.loads(line)
                ref = data["workspace"]
                if ref.get("$project") != key:
                    raise TaskLoadError(f"{where}: workspace refers to project {ref.get('$project')!r}, not {key!r}")
                data["workspace"] = {**base, **ref["changed"]}
            except (ValueError, KeyError, TypeError, AttributeError) as err:
                raise TaskLoadError(f"{where}: not a mined task row ({err}); mine the project again") from None
            tasks.append(task_from_dict(data, where))
    return TaskSuite(str(header.get("name", root.name)), tasks, str(header.get("version", "1")))


# `TaskSuite.load` reads a mined suite directory (projects stored once) through this hook.
DIRECTORY_FORMATS.append((lambda path: (path / "projects").is_dir(), load_mined_suite))
