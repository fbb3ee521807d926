"""What the viewer reads from a run directory, and nothing more: each page asks for its part.

    RUN/config.yaml               the campaign's configuration
    RUN/metrics.jsonl             one row per SFT/RL step and evaluation
    RUN/plots/*.png               the curves the report drew
    RUN/rollouts/step-NNNN.jsonl  every RL rollout of a step (a `Trajectory` per line)
    RUN/eval/<label>/<suite>/     report.json and trajectories.jsonl of each evaluation

A step's rollouts are read when a page asks for that step, and summarised once per file version
(rows for the table: a few fields per rollout); a whole trajectory is parsed only for the episode
page. A directory that is not a run, or a run still being written, is reported as such.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class RunError(ValueError):
    """The directory is not a (readable) training run or evaluation."""


@dataclass(frozen=True)
class Row:
    """One rollout in a table: where it is, and what the filters and sorts need."""

    source: str  # file relative to the run directory
    index: int  # line number in it
    task_id: str
    suite: str
    family: str
    outcome: str
    reward: float
    tokens: int
    turns: int
    effects: tuple[str, ...]
    limit_hit: str | None


def _summary(line: str, source: str, index: int) -> Row:
    t = json.loads(line)
    suite = t.get("env_id", "").split("/")[-1].rsplit("-v", 1)[0]
    tokens = sum(len(s.get("token_ids", [])) for s in t.get("segments", []))
    return Row(
        source,
        index,
        t.get("task_id", ""),
        suite,
        t.get("family", ""),
        t.get("outcome", ""),
        float(t.get("reward", 0.0)),
        tokens,
        len(t.get("turns", [])),
        tuple(sorted({e.get("kind", "") for e in t.get("side_effects", [])})),
        t.get("limit_hit"),
    )


class Run:
    """One run directory (see the module docstring)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.is_dir():
            raise RunError(f"{self.path}: no such directory")
        if not any((self.path / name).exists() for name in ("config.yaml", "metrics.jsonl", "rollouts", "eval")):
            raise RunError(f"{self.path}: not a toolgym run (no config.yaml, metrics.jsonl, rollouts/ or eval/)")
        self._rows: dict[str, tuple[float, list[Row]]] = {}
        self._lock = threading.Lock()

    @property
    def name(self) -> str:
        """The run's directory name."""
        return self.path.name

    def config_text(self) -> str:
        """config.yaml as written, or an empty string."""
        path = self.path / "config.yaml"
        return path.read_text() if path.exists() else ""

    def metrics(self) -> list[dict[str, Any]]:
        """The metric rows (a half-written last line is skipped)."""
        path = self.path / "metrics.jsonl"
        rows = []
        if path.exists():
            for line in path.read_text().splitlines():
                try:
                    rows.append(json.loads(line))
                except ValueError:
                    continue
        return rows

    def plots(self) -> list[str]:
        """The run's PNG plots (relative paths)."""
        return (
            sorted(p.relative_to(self.path).as_posix() for p in (self.path / "plots").glob("*.png"))
            if (self.path / "plots").is_dir()
            else []
        )

    def evaluations(self) -> dict[str, dict[str, dict[str, Any]]]:
        """{label: {suite: report.json}} in the order they were written."""
        from toolgym.trainers.report import read_evaluations

        return read_evaluations(self.path)

    def steps(self) -> list[str]:
        """Rollout files, oldest step first (relative paths)."""
        root = self.path / "rollouts"
        return sorted(p.relative_to(self.path).as_posix() for p in root.glob("step-*.jsonl")) if root.is_dir() else []

    def eval_sources(self) -> list[str]:
        """Evaluation trajectory files (relative paths), in the campaign's order (base, sft or
        initial, step-N, final; other labels after), so that comparing the first with the last
        compares the model before training with the trained one."""
        root = self.path / "eval"
        if not root.is_dir():
            return []

        def stage(source: str) -> tuple:
            label = source.split("/")[1]
            if label.startswith("step-") and label[5:].isdigit():
                return (2, int(label[5:]), source)
            return ({"base": 0, "initial": 1, "sft": 1, "final": 3}.get(label, 4), 0, source)

        return sorted((p.relative_to(self.path).as_posix() for p in root.glob("*/*/trajectories.jsonl")), key=stage)

    def _file(self, source: str) -> Path:
        path = (self.path / source).resolve()
        if self.path.resolve() not in path.parents or path.suffix != ".jsonl" or not path.is_file():
            raise RunError(f"{source}: not a trajectory file of this run")
        return path

    def rows(self, source: str) -> list[Row]:
        """Summaries of every trajectory in `source` (cached per file version)."""
        path = self._file(source)
        stamp = path.stat().st_mtime
        with self._lock:
            hit = self._rows.get(source)
        if hit and hit[0] == stamp:
            return hit[1]
        rows = []
        with path.open() as f:
            for index, line in enumerate(f):
                try:
                    rows.append(_summary(line, source, index))
                except (ValueError, AttributeError, TypeError):
                    continue  # a half-written last line while the run goes on
        with self._lock:
            self._rows[source] = (stamp, rows)
        return rows

    def trajectory(self, source: str, index: int) -> dict[str, Any]:
        """One whole trajectory (as its JSON object)."""
        with self._file(source).open() as f:
            for i, line in enumerate(f):
                if i == index:
                    try:
                        return json.loads(line)
                    except ValueError:
                        raise RunError(f"{source}:{index + 1} is not a whole trajectory (still being written?)") from None
        raise RunError(f"{source} has no trajectory #{index}")


def audit_sample(rows: list[Row], per_kind: int = 2, seed: int = 0) -> list[tuple[str, Row]]:
    """One step's audit sample, labelled: the same rollouts `audit.md` shows (`audit_indices`)."""
    from toolgym.trainers.report import audit_indices

    top, drawn = audit_indices([r.reward for r in rows], per_kind, seed)
    return [("top reward", rows[i]) for i in top] + [("random", rows[i]) for i in drawn]


def flips(a: list[Row], b: list[Row]) -> tuple[list[tuple[Row, Row]], list[tuple[Row, Row]], int]:
    """(passed in A only, passed in B only, tasks in both) on the tasks both evaluated (the first
    sample of each task)."""
    first_a = {r.task_id: r for r in reversed(a)}
    first_b = {r.task_id: r for r in reversed(b)}
    common = sorted(set(first_a) & set(first_b))
    only_a = [(first_a[t], first_b[t]) for t in common if first_a[t].outcome == "passed" and first_b[t].outcome != "passed"]
    only_b = [(first_a[t], first_b[t]) for t in common if first_b[t].outcome == "passed" and first_a[t].outcome != "passed"]
    return only_a, only_b, len(common)


__all__ = ["Row", "Run", "RunError", "audit_sample", "flips"]
