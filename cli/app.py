"""The app, its consoles and the shared helpers of every command group."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="toolgym: environments, verifiers, rollouts and training for LLM agents that use tools.",
)
console = Console(highlight=False)
err_console = Console(stderr=True, highlight=False)


class CLIError(Exception):
    """An error reported as one line with a non-zero exit."""


@app.callback()
def _root(
    imports: list[str] = typer.Option([], "--import", "-i", help="Python file or module that registers environments (repeatable)."),
) -> None:
    from toolgym.envs import import_source

    for source in imports:
        import_source(source)
    _root.imports = tuple(imports)  # type: ignore[attr-defined]


def _imports() -> tuple[str, ...]:
    return getattr(_root, "imports", ())


def load_suite(name_or_path: str):
    """A registered suite name or a path to a suite directory / JSONL file. A bare registered name
    is the registered suite even where a file or folder of that name sits in the current
    directory (a run or data folder called `bfcl` must not shadow BFCL); `./NAME` is the path."""
    from toolgym.tasks import TaskSuite, builtin_suite, suite_specs

    if name_or_path in suite_specs():
        return builtin_suite(name_or_path)
    if Path(name_or_path).exists():
        return TaskSuite.load(name_or_path)
    known = ", ".join(sorted(suite_specs())) or "(none)"
    raise CLIError(f"no suite {name_or_path!r}: not a path, and registered suites are: {known}")
