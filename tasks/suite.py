"""`TaskSuite`: a named, versioned list of tasks with splits; load/save as task folders or JSONL.

On disk, a suite directory holds `suite.yaml` (name, version) and one folder per task:

    <task-id>/task.yaml        instruction, env_id, family, difficulty, split, hidden spec, oracle, data
    <task-id>/workspace/...    the initial workspace files (what the agent starts with)
    <task-id>/hidden/...       hidden verifier files (tests or checker; never shown to the agent)

A broken task file fails loading with a `TaskLoadError` that names the file, the field and the fix.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import yaml
from pydantic import ValidationError

from toolgym.tasks.dedup import LeakReport, find_leaks
from toolgym.tasks.task import Task

TRAIN = "train"
HELDOUT = "held-out"


#: Other on-disk suite formats: (does this directory hold one?, its loader). A format module
#: registers itself here, so this module imports none of them.
DIRECTORY_FORMATS: list[tuple[Callable[[Path], bool], Callable[[Path], TaskSuite]]] = []


class TaskLoadError(ValueError):
    """A task file could not be loaded; the message names the file, the field and the fix."""


class SplitLeakError(ValueError):
    """Held-out tasks overlap the train split (same content hash or near-duplicate instruction)."""


def _describe_validation(err: ValidationError) -> str:
    parts = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "(task)"
        fix = {"missing": "add this field", "extra_forbidden": "remove this field (it is not part of a task)"}.get(
            e["type"], "fix its value"
        )
        parts.append(f"field `{loc}`: {e['msg']} ({fix})")
    return "; ".join(parts)


def task_from_dict(data: dict, source: str) -> Task:
    """Validate one task dict, turning pydantic errors into a `TaskLoadError` naming `source`."""
    if not isinstance(data, dict):
        raise TaskLoadError(f"{source}: expected a mapping of task fields, got {type(data).__name__}")
    try:
        return Task.model_validate(data)
    except ValidationError as err:
        raise TaskLoadError(f"{source}: {_describe_validation(err)}") from None


def _read_tree(root: Path) -> dict[str, str]:
    files: dict[str, str] = {}
    if root.is_dir():
        for path in sorted(root.rglob("*")):
            if path.is_file():
                files[path.relative_to(root).as_posix()] = path.read_text()
    return files


class TaskSuite:
    """An ordered collection of tasks with a name and a version."""

    def __init__(self, name: str, tasks: Iterable[Task], version: str = "1") -> None:
        self.name = name
        self.version = str(version)
        self.tasks: list[Task] = list(tasks)
        self._by_id = {t.id: t for t in self.tasks}

    def __len__(self) -> int:
        return len(self.tasks)

    def __iter__(self) -> Iterator[Task]:
        return iter(self.tasks)

    def __getitem__(self, key: int | str) -> Task:
        if isinstance(key, str):
            if key not in self._by_id:
                raise KeyError(f"no task with id {key!r} in suite {self.name!r}")
            return self._by_id[key]
        return self.tasks[key]

    def split(self, split: str) -> TaskSuite:
        """The tasks of one split (`train` or `held-out`), as a suite of the same name/version."""
        return TaskSuite(self.name, [t for t in self.tasks if t.split == split], self.version)

    @property
    def splits(self) -> dict[str, int]:
        """Task count per split."""
        return dict(Counter(t.split for t in self.tasks))

    @property
    def families(self) -> dict[str, int]:
        """Task count per family."""
        return dict(Counter(t.family for t in self.tasks))

    def ids(self) -> list[str]:
        """Task ids in order."""
        return [t.id for t in self.tasks]

    # ---- hygiene ---------------------------------------------------------------------------------

    def leaks(self, threshold: float = 0.9) -> LeakReport:
        """Overlaps between this suite's train and held-out splits."""
        return find_leaks(self.split(TRAIN).tasks, self.split(HELDOUT).tasks, threshold)

    def check_disjoint(self, threshold: float = 0.9) -> None:
        """Raise `SplitLeakError` if held-out shares a content hash or near-duplicate with train."""
        report = self.leaks(threshold)
        if not report.clean:
            raise SplitLeakError(
                f"suite {self.name!r}: {len(report.shared_ids)} held-out task(s) share a content "
                f"hash with train (e.g. {report.shared_ids[:3]}), {len(report.near_duplicates)} "
                f"near-duplicate instruction(s) (e.g. {report.near_duplicates[:3]}). Regenerate "
                "held-out from a disjoint seed range or template set."
            )

    # ---- JSONL -----------------------------------------------------------------------------------

    def save_jsonl(self, path: str | Path) -> Path:
        """Write one task per line (first line: a `{"suite": ..., "version": ...}` header)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w") as f:
            f.write(json.dumps({"suite": self.name, "version": self.version}) + "\n")
            for task in self.tasks:
                f.write(task.model_dump_json() + "\n")
        return path

    @classmethod
    def load_jsonl(cls, path: str | Path) -> TaskSuite:
        """Load a JSONL suite written by `save_jsonl` (the header line is optional)."""
        path = Path(path)
        name, version, tasks = path.stem, "1", []
        for lineno, line in enumerate(path.read_text().splitlines(), 1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                data = json.loads(line)
            except json.JSONDecodeError as err:
                raise TaskLoadError(
                    f"{where}: not valid JSON ({err.msg} at column {err.colno}); each line must be one JSON object"
                ) from None
            if lineno == 1 and isinstance(data, dict) and "suite" in data and "instruction" not in data:
                name, version = str(data["suite"]), str(data.get("version", "1"))
                continue
            tasks.append(task_from_dict(data, where))
        return cls(name, tasks, version)

    # ---- directory of task folders -------------------------------------------------------------

    def save_dir(self, root: str | Path) -> Path:
        """Write `suite.yaml` and one folder per task (see the module docstring)."""
        root = Path(root)
        root.mkdir(parents=True, exist_ok=True)
        header = {"name": self.name, "version": self.version, "order": self.ids()}
        (root / "suite.yaml").write_text(yaml.safe_dump(header))
        for task in self.tasks:
            folder = root / task.id
            folder.mkdir(exist_ok=True)
            meta = task.model_dump(mode="json", exclude={"workspace"})
            meta["hidden"].pop("files", None)
            (folder / "task.yaml").write_text(yaml.safe_dump(meta, sort_keys=False, allow_unicode=True))
            for sub, files in (("workspace", task.workspace), ("hidden", task.hidden.files)):
                for rel, text in files.items():
                    target = folder / sub / rel
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_text(text)
        return root

    @classmethod
    def load_dir(cls, root: str | Path) -> TaskSuite:
        """Load a directory written by `save_dir` (or by hand in the same layout)."""
        root = Path(root)
        header: dict = {}
        if (root / "suite.yaml").exists():
            header = yaml.safe_load((root / "suite.yaml").read_text()) or {}
        tasks = []
        for folder in sorted(p for p in root.iterdir() if p.is_dir()):
            task_file = folder / "task.yaml"
            if not task_file.exists():
                raise TaskLoadError(f"{folder}: no task.yaml; every task folder needs one (instruction, env_id, family, ...)")
            try:
                data = yaml.safe_load(task_file.read_text())
            except yaml.YAMLError as err:
                raise TaskLoadError(f"{task_file}: not valid YAML ({err}); fix the syntax") from None
            if not isinstance(data, dict):
                raise TaskLoadError(f"{task_file}: expected a mapping of task fields")
            data["workspace"] = _read_tree(folder / "workspace")
            hidden = dict(data.get("hidden") or {})
            hidden["files"] = _read_tree(folder / "hidden")
            data["hidden"] = hidden
            tasks.append(task_from_dict(data, str(task_file)))
        if not tasks and not (root / "suite.yaml").exists():
            raise TaskLoadError(f"{root}: not a suite (no suite.yaml and no task folder); `toolgym tasks SUITE --save DIR` writes one")
        order = {tid: i for i, tid in enumerate(header.get("order") or [])}
        tasks.sort(key=lambda t: order.get(t.id, len(order)))  # saved order; hand-made folders last
        return cls(header.get("name", root.name), tasks, str(header.get("version", "1")))

    @classmethod
    def load(cls, path: str | Path) -> TaskSuite:
        """Load a suite from a directory or a `.jsonl` file."""
        path = Path(path)
        if not path.exists():
            raise TaskLoadError(f"{path}: no such file or directory")
        for claims, load in DIRECTORY_FORMATS:  # e.g. mined suites (tasks/mined.py): projects stored once
            if path.is_dir() and claims(path):
                return load(path)
        return cls.load_dir(path) if path.is_dir() else cls.load_jsonl(path)

    def save(self, path: str | Path) -> Path:
        """Save as JSONL when `path` ends in `.jsonl`, else as a directory."""
        path = Path(path)
        return self.save_jsonl(path) if path.suffix == ".jsonl" else self.save_dir(path)
