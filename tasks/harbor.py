"""Import tasks in Harbor's task format (the layout TRL, SkyRL and Terminal-Bench read).

`load_harbor_dir` reads Harbor task directories whose environment toolgym's image can provide: a
Dockerfile built on it that copies a workspace (and a site layer) and does nothing else. The
workspace becomes the task's, `solution/solve.sh` its oracle, and its own `tests/test.sh` grades it
as Harbor runs it (`verifiers/harbor.py`). Any other environment (a base image from a registry,
`RUN` steps) is refused with the line that needs it. Exporting is `verifiers/harbor_export.py`.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from toolgym.sandbox.base import IMAGE_TAG, site_layer_dir
from toolgym.sandbox.fs import publish, staging_name
from toolgym.tasks.task import HiddenSpec, Task, ToolCall

#: Where a site layer goes in toolgym's image (Debian 12's Python 3.11).
SITE_PACKAGES = "/usr/local/lib/python3.11/dist-packages"


class HarborImportError(ValueError):
    """A Harbor task toolgym cannot load (the message names the file and the reason)."""


HARBOR_ENV = "toolgym/harbor-v0"


def environment_parts(dockerfile: str, where: str) -> tuple[str, str | None]:
    """(workspace directory, site-layer directory or None) a Dockerfile copies, if toolgym's
    image can provide its environment; else `HarborImportError` naming the line."""
    base, workspace, site = "", None, None
    for raw in dockerfile.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        word, _, rest = line.partition(" ")
        word, parts = word.upper(), rest.split()
        if word == "ARG" and rest.startswith("BASE="):
            base = rest.split("=", 1)[1].strip()
        elif word == "FROM":
            image = base if rest.strip() in ("${BASE}", "$BASE") else rest.strip()
            if not image.startswith(IMAGE_TAG.split(":")[0] + ":"):
                raise HarborImportError(
                    f"{where}: its environment starts FROM {image!r}, which needs a registry (toolgym provides {IMAGE_TAG} only)"
                )
        elif word == "COPY":
            args = [a for a in parts if not a.startswith("--chown")]
            if len(args) == 2 and args[1].rstrip("/") == "/workspace":
                workspace = args[0].rstrip("/")
            elif len(args) == 2 and args[1].rstrip("/") == SITE_PACKAGES:
                site = args[0].rstrip("/")
            else:
                raise HarborImportError(f"{where}: `{line}` copies somewhere toolgym's sandbox does not provide")
        elif word == "WORKDIR" and rest.strip().rstrip("/") == "/workspace":
            continue
        else:
            raise HarborImportError(f"{where}: `{line}` is a build step toolgym's image does not provide")
    if workspace is None:
        raise HarborImportError(f"{where}: no `COPY <dir>/ /workspace/`: toolgym needs the workspace as files")
    return workspace, site


def _texts(root: Path) -> dict[str, str]:
    out = {}
    for path in sorted(root.rglob("*")):
        if path.is_file():
            try:
                out[path.relative_to(root).as_posix()] = path.read_text()
            except UnicodeDecodeError:
                raise HarborImportError(f"{path}: not a text file (toolgym workspaces are text)") from None
    return out


def import_task(task_dir: Path, split: str = "held-out") -> Task:
    """One Harbor task directory as a toolgym task (see the module docstring)."""
    import tomllib

    task_dir = Path(task_dir)
    for required in ("instruction.md", "task.toml", "environment/Dockerfile", "tests/test.sh"):
        if not (task_dir / required).is_file():
            raise HarborImportError(f"{task_dir}: no {required}: not a Harbor task")
    try:
        config = tomllib.loads((task_dir / "task.toml").read_text())
    except tomllib.TOMLDecodeError as err:
        raise HarborImportError(f"{task_dir / 'task.toml'}: {err}") from None
    dockerfile = (task_dir / "environment" / "Dockerfile").read_text()
    workspace_dir, site_dir = environment_parts(dockerfile, str(task_dir / "environment" / "Dockerfile"))
    workspace = _texts(task_dir / "environment" / workspace_dir)
    data = {}
    if site_dir:
        site = task_dir / "environment" / site_dir
        digest = hashlib.sha256(
            json.dumps(sorted((p.relative_to(site).as_posix(), p.stat().st_size) for p in site.rglob("*") if p.is_file())).encode()
        ).hexdigest()[:12]
        name = f"harbor-{digest}"
        layer = site_layer_dir(name)
        if not layer.is_dir():
            # copied under a staging name, then published whole: a layer directory is never seen
            # half-copied by another process importing the same task
            staged = staging_name(layer)
            shutil.copytree(site, staged, symlinks=True)
            publish(staged, layer)
        data["site_layer"] = name
    files = {f"tests/{rel}": text for rel, text in _texts(task_dir / "tests").items()}
    files["environment/Dockerfile"] = dockerfile
    oracle = []
    if (task_dir / "solution" / "solve.sh").is_file():
        oracle = [
            ToolCall(name="bash", arguments={"command": (task_dir / "solution" / "solve.sh").read_text(), "timeout": 120}),
            ToolCall(name="submit", arguments={}),
        ]
    meta = config.get("metadata", {})
    verifier_s = float(config.get("verifier", {}).get("timeout_sec", 600.0))
    return Task(
        env_id=HARBOR_ENV,
        instruction=(task_dir / "instruction.md").read_text().strip(),
        family=f"harbor/{meta.get('category', 'task')}",
        split=split,
        workspace=workspace,
        hidden=HiddenSpec(kind="harbor", files=files, timeout_s=verifier_s),
        oracle=tuple(oracle),
        data=data,
        metadata={"harbor_dir": task_dir.name, **{k: v for k, v in meta.items() if isinstance(v, (str, int, float))}},
    )


def load_harbor_dir(root: Path) -> tuple[list[Task], dict[str, str]]:
    """(tasks, {directory: why it was not imported}) of every Harbor task directory under `root`
    (each task's split: its `toolgym` tag, else held-out)."""
    import tomllib

    tasks, skipped = [], {}
    for task_dir in sorted(p for p in Path(root).iterdir() if (p / "task.toml").is_file()):
        try:
            tags = tomllib.loads((task_dir / "task.toml").read_text()).get("metadata", {}).get("tags", [])
            split = "train" if "train" in tags else "held-out"
            tasks.append(import_task(task_dir, split))
        except (HarborImportError, tomllib.TOMLDecodeError) as err:
            skipped[task_dir.name] = str(err)
    return tasks, skipped


__all__ = ["HARBOR_ENV", "HarborImportError", "SITE_PACKAGES", "environment_parts", "import_task", "load_harbor_dir"]
