"""`toolgym tasks export SUITE --format harbor --out DIR` and `toolgym tasks import DIR`: tasks
in Harbor's format, both ways."""

from __future__ import annotations

from pathlib import Path

import typer

from toolgym.cli.app import CLIError, app, console, load_suite


@app.command("tasks-export", hidden=True)
def tasks_export(
    suite: str = typer.Argument(..., help="registered suite name, or a suite directory/JSONL"),
    out: Path = typer.Option(..., "--out", help="directory to write the tasks into"),
    format: str = typer.Option("harbor", "--format", help="harbor (the only format so far)"),
    split: str | None = typer.Option(None, help="train or held-out (default: every task)"),
    limit: int = typer.Option(0, help="export at most this many tasks (0: all)"),
) -> None:
    """Write a suite's tasks in Harbor's task format (instruction.md, task.toml, environment/,
    tests/test.sh with toolgym's grader, solution/solve.sh); tasks that cannot be are listed."""
    from toolgym.verifiers.harbor_export import export_tasks

    if format != "harbor":
        raise CLIError(f"unknown format {format!r}: the one format is harbor")
    s = load_suite(suite)
    if split and split not in s.splits:
        raise CLIError(f"suite {s.name!r} has no split {split!r}; it has: {', '.join(s.splits)}")
    tasks = (s.split(split) if split else s).tasks
    tasks = tasks[:limit] if limit > 0 else tasks
    written, skipped = export_tasks(tasks, out, s.name)
    for task_id, why in list(skipped.items())[:5]:
        console.print(f"skipped {task_id}: {why}", markup=False, soft_wrap=True)
    console.print(f"wrote {len(written)} Harbor tasks to {out}" + (f"; skipped {len(skipped)}" if skipped else ""))
    if not written:
        raise CLIError("no task of this suite could be exported (see above)")


@app.command("tasks-import", hidden=True)
def tasks_import(
    directory: Path = typer.Argument(..., help="a directory of Harbor task directories"),
    format: str = typer.Option("harbor", "--format", help="harbor (the only format so far)"),
) -> None:
    """Check which Harbor tasks in DIR toolgym can play (the directory is then a suite: `--suite
    DIR` anywhere), and say why each other one cannot."""
    from toolgym.tasks.harbor import load_harbor_dir

    if format != "harbor":
        raise CLIError(f"unknown format {format!r}: the one format is harbor")
    if not directory.is_dir():
        raise CLIError(f"{directory}: no such directory")
    tasks, skipped = load_harbor_dir(directory)
    for name, why in skipped.items():
        console.print(f"cannot import {name}: {why}", markup=False, soft_wrap=True)
    console.print(
        f"{len(tasks)} Harbor tasks import from {directory}"
        + (f"; {len(skipped)} cannot" if skipped else "")
        + (f" (use it as a suite: --suite {directory})" if tasks and not skipped else "")
    )
    if not tasks:
        raise CLIError("no task in this directory can be imported (see above)")
