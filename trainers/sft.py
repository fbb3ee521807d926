"""The SFT warm start's parts: oracle demonstrations (checked per suite) and their batches."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
from rich.console import Console

from toolgym.harness.demonstrations import collect_demonstrations
from toolgym.harness.trajectory import Trajectory
from toolgym.tasks import Task
from toolgym.verifiers import Outcome


def oracle_demonstrations(
    train_tasks: dict[str, dict[str, Task]],
    per_suite: int | dict[str, int],
    tokenizer: Any,
    make_env: Callable[..., Any],
    concurrency: int,
    progress: bool,
    console: Console,
    skip_families: tuple[str, ...] = (),
    family_limits: dict[str, int] | None = None,
) -> tuple[list[Trajectory], dict[str, Any]]:
    """The oracle played on the first `per_suite` train tasks of every suite (a dict: per suite by
    name, the rest of the suites none; leaving out the
    families in `skip_families`, and taking at most `family_limits[f]` tasks of family f: the
    rest are filled from the other families), rendered as the policy's tokens: (the passing
    demonstrations, per-suite oracle pass rate and infra errors). Raises when none passes: the
    environments, not the model, are broken then."""
    limits = {**(family_limits or {}), **{family: 0 for family in skip_families}}

    def demonstrated(name: str, suite: dict[str, Task]) -> list[Task]:
        wanted = per_suite.get(name, 0) if isinstance(per_suite, dict) else per_suite
        taken: list[Task] = []
        per_family: dict[str, int] = {}
        for task in suite.values():
            if len(taken) == wanted:
                break
            if per_family.get(task.family, 0) < limits.get(task.family, wanted):
                per_family[task.family] = per_family.get(task.family, 0) + 1
                taken.append(task)
        return taken

    tasks = [t for name, suite in train_tasks.items() for t in demonstrated(name, suite)]
    console.print(f"SFT: collecting {len(tasks)} oracle demonstrations")
    played = collect_demonstrations(tasks, tokenizer, make_env, progress=progress, concurrency=concurrency)
    checks: dict[str, Any] = {}
    for suite, suite_tasks in train_tasks.items():
        mine = [t for t in played if t.task_id in suite_tasks]
        checks[suite] = {
            "oracle_pass_rate": sum(t.outcome == Outcome.PASSED for t in mine) / max(1, len(mine)),
            "infra_errors": sum(t.outcome == Outcome.INFRA_ERROR for t in mine),
            "episodes": len(mine),
        }
        console.print(
            f"oracle on {len(mine)} {suite} train tasks: pass@1 "
            f"{checks[suite]['oracle_pass_rate']:.3f}, infra errors {checks[suite]['infra_errors']}"
        )
    demos = [t for t in played if t.outcome == Outcome.PASSED]
    if not demos:
        raise RuntimeError("no oracle demonstration passed its verifier: check the environments")
    return demos, checks


def train_families(train_tasks: dict[str, dict[str, Task]]) -> set[str]:
    """Every family that a train task of some suite has."""
    return {t.family for suite in train_tasks.values() for t in suite.values()}


def sft_batches(demos: list[Trajectory], steps: int, batch_size: int, rng: np.random.Generator) -> Iterator[list[Trajectory]]:
    """`steps` batches of demonstrations: epochs in a fresh random order, no batch split across two."""
    order = rng.permutation(len(demos))
    for i in range(steps):
        start = (i * batch_size) % len(demos)
        if start + batch_size > len(demos):
            order = rng.permutation(len(demos))
            start = 0
        yield [demos[int(j)] for j in order[start : start + batch_size]]


def sft_learning_rate(lr: float, step: int, steps: int, schedule: str = "constant", warmup_steps: int = 0) -> float:
    """The learning rate of SFT step `step` (0-based) of `steps`: a linear warmup over the first
    `warmup_steps`, then `lr` held (constant) or decayed towards 0 (linear, cosine) so that the
    last step's rate is the smallest. Decay is why the stage's end point does not hang on its
    last few batches: at a constant rate the model moves as far on them as on the first ones."""
    if step < warmup_steps:
        return lr * (step + 1) / (warmup_steps + 1)
    if schedule == "constant":
        return lr
    span = max(1, steps - warmup_steps)
    done = (step - warmup_steps + 1) / (span + 1)  # never 0 inside the stage: every step learns
    if schedule == "linear":
        return lr * (1.0 - done)
    if schedule == "cosine":
        return lr * 0.5 * (1.0 + math.cos(math.pi * done))
    raise ValueError(f"unknown SFT schedule {schedule!r}: use constant, linear or cosine")


@contextmanager
def sft_progress(steps: int, enabled: bool) -> Iterator[Callable[[float], None]]:
    """A progress bar for SFT; yields `advance(loss)`."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = [TextColumn("SFT"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), TextColumn("loss {task.fields[loss]:.3f}")]
    with Progress(*columns, disable=not enabled) as bar:
        bar_id = bar.add_task("sft", total=steps, loss=float("nan"))
        # not a terminal (a log file, CI): a plain line per step instead of a bar drawn at the end
        plain = enabled and not bar.console.is_terminal
        started, done = time.perf_counter(), [0]

        def advance(loss: float) -> None:
            bar.update(bar_id, advance=1, loss=loss)
            done[0] += 1
            if plain:
                print(f"SFT: {done[0]}/{steps} steps, loss {loss:.3f}, {time.perf_counter() - started:.0f} s", flush=True)

        yield advance


__all__ = ["oracle_demonstrations", "sft_batches", "sft_learning_rate", "sft_progress"]
