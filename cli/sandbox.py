"""`toolgym sandbox ...`: build the image, reap leftovers, probe a backend."""

from __future__ import annotations

import typer

from toolgym.cli.app import CLIError, app, console
from toolgym.sandbox.base import IMAGE_TAG

sandbox_app = typer.Typer(help="Sandbox backends: build the docker image, reap leftovers, probe.")
app.add_typer(sandbox_app, name="sandbox")


@sandbox_app.command("build-image")
def sandbox_build_image(
    tag: str = typer.Option(IMAGE_TAG, help="image tag"), force: bool = typer.Option(False, help="rebuild even if the image exists")
) -> None:
    """Build the docker base image (Python 3 + pytest) with debootstrap + docker import, no registry."""
    from toolgym.sandbox.image import build_image

    console.print(f"image ready: {build_image(tag, force=force, log=console.print)}")


@sandbox_app.command("reap")
def sandbox_reap() -> None:
    """Remove containers, temp dirs and cgroups left by dead toolgym processes."""
    from toolgym.sandbox.docker_pool import reap
    from toolgym.sandbox.reaper import reap_stale

    console.print(f"removed {reap_stale(docker=reap)} leftover(s)")


@sandbox_app.command("probe")
def sandbox_probe(backend: str = typer.Option("bwrap", help="bwrap | docker")) -> None:
    """Start a sandbox, run a command, print the backend's capabilities."""
    from toolgym.sandbox import SandboxConfig, make_sandbox

    with make_sandbox({"hello.txt": "hi\n"}, SandboxConfig(backend=backend)) as box:
        res = box.exec("cat hello.txt && id -u")
        caps = box.capabilities
    console.print(f"{backend}: exit {res.exit_code}, output {res.stdout.split()}; capabilities {caps.model_dump()}")
    if res.exit_code != 0:
        raise CLIError(f"{backend} sandbox could not run a command: {res.stderr.strip()}")
