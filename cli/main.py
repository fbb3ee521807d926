"""Entry point: every command module registers on the app; errors become one line."""

from __future__ import annotations

import sys

import typer

from toolgym.cli import envs, evaluation, export, mine, sandbox, serve, train, view  # noqa: F401  (they register their commands)
from toolgym.cli.app import CLIError, app, err_console


def main() -> None:
    """Entry point: run the app, turning known errors into one line and exit code 2."""
    import gymnasium

    from toolgym.inference.policy import PolicyError
    from toolgym.mining.project import MiningError
    from toolgym.sandbox import SandboxError
    from toolgym.tasks import SplitLeakError, TaskLoadError
    from toolgym.trainers.memory import TrainingMemoryError

    # `toolgym tasks mine|export|import ...` are commands of their own (`tasks SUITE` shows a suite).
    args = sys.argv[1:]
    for i, arg in enumerate(args[:-1]):
        if arg == "tasks" and args[i + 1] in ("mine", "export", "import"):
            sys.argv[1 + i : 3 + i] = [f"tasks-{args[i + 1]}"]
            break
        if not arg.startswith("-") and args[i - 1 : i] not in (["--import"], ["-i"]):
            break
    try:
        rc = app(standalone_mode=False)  # click returns a raised Exit's code in this mode
        if isinstance(rc, int) and rc != 0:
            sys.exit(rc)
    except typer.Exit as exit_:
        sys.exit(exit_.exit_code)
    except (
        CLIError,
        TaskLoadError,
        SplitLeakError,
        KeyError,
        ValueError,
        FileNotFoundError,
        OSError,
        gymnasium.error.Error,
        PolicyError,
        SandboxError,
        TrainingMemoryError,
        MiningError,
    ) as err:
        msg = err.args[0] if isinstance(err, KeyError) and err.args else err
        err_console.print(f"error: {msg}", soft_wrap=True, markup=False)  # one line, never wrapped
        sys.exit(2)
    except Exception as err:  # click usage errors and anything unforeseen: still one line
        import click

        if isinstance(err, click.exceptions.ClickException):
            err.show()
            sys.exit(err.exit_code)
        if isinstance(err, click.exceptions.Abort):
            sys.exit(130)
        err_console.print(f"error: {type(err).__name__}: {err}", soft_wrap=True, markup=False)
        sys.exit(1)
