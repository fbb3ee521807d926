"""`toolgym view RUN [RUN2]`: a web app over training runs (see `toolgym.viewer`)."""

from __future__ import annotations

import time
from pathlib import Path

import typer

from toolgym.cli.app import CLIError, app, console


@app.command()
def view(
    run: Path = typer.Argument(..., help="a training run directory (a campaign's out_dir)"),
    other: Path | None = typer.Argument(None, help="a second run to compare with"),
    host: str = typer.Option("127.0.0.1", help="address to listen on"),
    port: int = typer.Option(8080, help="port (0: any free one)"),
) -> None:
    """Browse a run in a web browser: overview and curves, rollouts by step (filters, audit
    sample), one episode token by token, and two evaluations compared task by task."""
    from toolgym.viewer.app import serve
    from toolgym.viewer.data import RunError

    try:
        server, url = serve([run] + ([other] if other else []), host, port)
    except RunError as err:
        raise CLIError(str(err)) from None
    console.print(f"viewing {run}{' and ' + str(other) if other else ''} at {url} (Ctrl-C stops)")
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        server.shutdown()
