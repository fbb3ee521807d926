"""Run files: the metrics log (JSONL + TensorBoard) and atomic checkpoints.

A checkpoint directory is written under a temporary name and renamed into place only when
complete (weights, optimizer, sampler and RNG states, step, the number of metric lines so far),
so a `kill -9` at any moment leaves either the previous checkpoint or the new one, never half
of one. `--resume` loads the newest and truncates the metrics log back to it: no finished step is
lost and none is counted twice.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

import torch

CHECKPOINTS = "checkpoints"


class MetricsLog:
    """Append-only `metrics.jsonl` (one line per record, flushed) mirrored to TensorBoard."""

    def __init__(self, run_dir: Path, tensorboard: bool = True) -> None:
        self.path = run_dir / "metrics.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.writer = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.writer = SummaryWriter(str(run_dir / "tensorboard"))
            except ImportError:  # tensorboard missing: the JSONL still has every number
                self.writer = None

    def log(self, step: int, values: dict[str, Any], kind: str = "train") -> None:
        """One record for `step`."""
        record = {"kind": kind, "step": step, "time": time.time(), **values}
        with self.path.open("a") as f:
            f.write(json.dumps(record, default=_plain) + "\n")
            f.flush()
            os.fsync(f.fileno())
        if self.writer is not None:
            for key, value in _flatten(values).items():
                if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                    self.writer.add_scalar(f"{kind}/{key}", value, step)
            self.writer.flush()

    def lines(self) -> int:
        """Records written so far."""
        return len(read_metrics(self.path.parent))

    def truncate(self, lines: int) -> None:
        """Keep the first `lines` records (resume: drop what came after the checkpoint)."""
        kept = self.path.read_text().splitlines()[:lines] if self.path.exists() else []
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text("".join(line + "\n" for line in kept))
        os.replace(tmp, self.path)

    def close(self) -> None:
        """Flush and close TensorBoard."""
        if self.writer is not None:
            self.writer.close()


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """Every complete record of a run's metrics log (a torn last line is ignored)."""
    path = Path(run_dir) / "metrics.jsonl"
    out = []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out


def _flatten(values: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in values.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}/"))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _plain(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.tolist()
    return str(value)


def save_checkpoint(
    run_dir: Path, step: int, model_state: dict[str, Any], optimizer_state: dict[str, Any], state: dict[str, Any], keep: int
) -> Path:
    """Write checkpoint `step` (weights, optimizer state, the run's own state) atomically; keep
    the newest `keep`. Returns its directory."""
    root = run_dir / CHECKPOINTS
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".partial-{step}-{uuid.uuid4().hex[:6]}"
    tmp.mkdir()
    torch.save(model_state, tmp / "weights.pt")
    torch.save(optimizer_state, tmp / "optimizer.pt")
    (tmp / "state.json").write_text(json.dumps({**state, "step": step}, default=_plain))
    for f in tmp.iterdir():
        with f.open("rb") as fh:
            os.fsync(fh.fileno())
    final = root / f"step-{step:06d}"
    if final.exists():
        shutil.rmtree(final)
    os.rename(tmp, final)
    dir_fd = os.open(root, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    for old in sorted(p for p in root.iterdir() if p.name.startswith("step-"))[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    for partial in root.glob(".partial-*"):  # left by a killed run
        if partial != tmp:
            shutil.rmtree(partial, ignore_errors=True)
    return final


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete checkpoint, or None."""
    root = run_dir / CHECKPOINTS
    done = sorted(p for p in root.iterdir() if p.name.startswith("step-")) if root.is_dir() else []
    return done[-1] if done else None


def load_checkpoint(path: Path) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(weights, optimizer state, the run's own state: step, sampler, RNG...) of a checkpoint."""
    return (
        torch.load(path / "weights.pt", map_location="cpu", weights_only=True),
        torch.load(path / "optimizer.pt", map_location="cpu", weights_only=True),
        json.loads((path / "state.json").read_text()),
    )


def read_run_state(path: Path) -> dict[str, Any]:
    """A checkpoint's own state (step, sampler, RNG...) without loading its tensors."""
    return json.loads((path / "state.json").read_text())


__all__ = ["MetricsLog", "latest_checkpoint", "load_checkpoint", "read_metrics", "read_run_state", "save_checkpoint"]
