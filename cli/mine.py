"""`toolgym tasks mine`: mine bug-fix tasks from packages on the index (see `toolgym.mining`)."""

from __future__ import annotations

import time
from contextlib import contextmanager
from pathlib import Path

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from toolgym.cli.app import CLIError, app, console


@app.command("tasks-mine", hidden=True)
def tasks_mine(
    packages: list[str] | None = typer.Argument(None, help="PACKAGE or PACKAGE==VERSION (pin for reproducible suites)"),
    out: Path | None = typer.Option(None, help="suite directory to write (default with --default: the swe-pypi suite's own directory)"),
    default: bool = typer.Option(False, "--default", help="mine the swe-pypi default set (10 packages, train and held-out)"),
    split: str = typer.Option("train", help="split of the given packages: train or held-out"),
    seed: int = typer.Option(0, help="seed of the candidate order and the grading copies"),
    max_tasks: int = typer.Option(32, help="tasks kept per package at most"),
    max_tries: int = typer.Option(120, help="mutants tried per package at most"),
    workers: int = typer.Option(3, help="mutants tried in parallel (one sandbox each)"),
    backends: str = typer.Option("bwrap,docker", help="sandbox backends every kept task is verified on (comma-separated)"),
    name: str = typer.Option("swe-pypi", help="suite name written to suite.yaml"),
) -> None:
    """Mine tasks: fetch sdists, run their tests in the sandbox, keep AST mutants that break them."""
    from toolgym.envs.families.swe_pypi import DEFAULT_PACKAGES, default_suite_dir
    from toolgym.mining.miner import MineOptions
    from toolgym.mining.project import MiningError
    from toolgym.mining.run import mine_project, prefetch, write_header

    if split not in ("train", "held-out"):
        raise CLIError(f"--split must be train or held-out, not {split!r}")
    jobs = [(spec, s) for spec, s, _ in DEFAULT_PACKAGES] if default else [(p, split) for p in packages or []]
    if not jobs:
        raise CLIError("name at least one package (e.g. `toolgym tasks mine inflection==0.5.1 --out DIR`) or pass --default")
    if out is None:
        if not default:
            raise CLIError("--out DIR is required when mining your own packages")
        out = default_suite_dir()
    chosen = tuple(b.strip() for b in backends.split(",") if b.strip())
    if not chosen or any(b not in ("bwrap", "docker") for b in chosen):
        raise CLIError(f"--backends takes bwrap and/or docker, not {backends!r}")
    from toolgym.sandbox.image import ROOTFS_CACHE, image_exists

    if not (ROOTFS_CACHE / "usr" / "bin" / "python3").exists():
        raise CLIError(
            "the sandbox root filesystem is not built (mining and grading must use its Python): run `toolgym sandbox build-image`"
        )
    if "docker" in chosen and not image_exists():
        raise CLIError("the docker sandbox image is missing: run `toolgym sandbox build-image`, or pass --backends bwrap")
    options = MineOptions(seed=seed, max_tasks=max_tasks, max_tries=max_tries, workers=workers, backends=chosen)
    reports = []
    with console.status(f"downloading {len(jobs)} source distributions"):
        prefetch([spec for spec, _ in jobs])
    with _progress(console) as (bar_for, say):
        for spec, job_split in jobs:
            try:
                reports.append(mine_project(spec, job_split, out, options, log=say, progress_factory=bar_for))
            except MiningError as err:
                say(f"[red]skipped[/] {spec}: {err}")
            if reports:
                write_header(out, name, "0", reports)
    if not reports:
        raise CLIError("no package could be mined (see above)")
    table = Table("package", "split", "licence", "passing tests", "tried", "kept", "dropped (why)")
    for r in reports:
        tried = r.kept + sum(r.dropped.values())
        table.add_row(
            r.key,
            r.split,
            r.license,
            str(r.tests_passing),
            str(tried),
            str(r.kept),
            ", ".join(f"{k}: {v}" for k, v in r.dropped.most_common(3)),
        )
    console.print(table)
    console.print(f"{sum(r.kept for r in reports)} tasks in {out} (summary: {out / 'summary.md'})")


@contextmanager
def _progress(console):
    """(bar factory, log function): rich bars on a terminal; elsewhere (a log file, CI) one line
    per ten mutants tried and per package finished, flushed as it happens."""
    if console.is_terminal:
        with Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console
        ) as progress:

            def bar_for(key: str, total: int):
                handle = progress.add_task(f"{key}: mutants tried", total=total)
                return lambda done: progress.update(handle, completed=done)

            yield bar_for, progress.console.print
        return
    start = time.monotonic()

    def bar_for(key: str, total: int):
        def update(done: int) -> None:
            if done % 10 == 0 or done == total:
                console.print(f"{key}: {done}/{total} mutants tried ({time.monotonic() - start:.0f} s)")

        return update

    yield bar_for, console.print
