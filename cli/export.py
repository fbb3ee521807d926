"""`toolgym tasks export SUITE --format harbor --out DIR`: tasks in another project's format."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from toolgym.cli.app import CLIError, app, console, load_suite


@app.command("tasks-export", hidden=True)
def tasks_export(suite: str = typer.Argument(..., help="registered suite name, or a suite directory/JSONL"),
                 out: Path = typer.Option(..., "--out", help="directory to write the tasks into"),
                 format: str = typer.Option("harbor", "--format", help="harbor (the only format so far)"),
                 split: Optional[str] = typer.Option(None, help="train or held-out (default: every task)"),
                 limit: int = typer.Option(0, help="export at most this many tasks (0: all)")) -> None:
    """Write a suite's tasks in Harbor's task format (instruction.md, task.toml, environment/,
    tests/test.sh with toolgym's grader, solution/solve.sh); tasks that cannot be are listed."""
    from toolgym.tasks.harbor import export_tasks

    if format != "harbor":
        raise CLIError(f"unknown format {format!r}: the one format is harbor")
    s = load_suite(suite)
    if split and split not in s.splits:
        raise CLIError(f"suite {s.name!r} has no split {split!r}; it has: {', '.join(s.splits)}")
    tasks = (s.split(split) if split else s).tasks
    tasks = tasks[:limit] if limit > 0 else tasks
    written, skipped = export_tasks(tasks, out, s.name)
    for task_id, why in list(skipped.items())[:5]:
        console.print(f"skipped {task_id}: {why}")
    console.print(f"wrote {len(written)} Harbor tasks to {out}" + (f"; skipped {len(skipped)}" if skipped else ""))
    if not written:
        raise CLIError("no task of this suite could be exported (see above)")
