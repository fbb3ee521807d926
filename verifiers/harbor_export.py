"""Export toolgym tasks in Harbor's task format (the layout TRL, SkyRL and Terminal-Bench read).

    DIR/<task>/instruction.md           the instruction, as the agent reads it
    DIR/<task>/task.toml                timeouts, resources, metadata (toolgym's task id and env)
    DIR/<task>/environment/Dockerfile   toolgym's sandbox image + the workspace (+ the site layer)
    DIR/<task>/tests/test.sh            runs toolgym's grader and writes /logs/verifier/reward.txt
    DIR/<task>/solution/solve.sh        the oracle, as shell commands

`tests/` holds everything hidden (the spec with the grading copies, differential records,
checker) and reaches the container only after the agent ends, as Harbor uploads it. The grader
(`verifiers/_grader/harbor_grade.py`) runs in the agent's container, as Harbor's verifiers do:
weaker than toolgym's own grading, where no agent process ever shares a sandbox with the judge.
Tasks of kinds `state` (shell-ops) and `package-tests` (swe-pypi) export; the others are skipped
with the reason. Importing is `tasks/harbor.py`.
"""

from __future__ import annotations

import base64
import json
import shutil
import textwrap
from pathlib import Path

from toolgym.sandbox.base import IMAGE_TAG, cache_dir
from toolgym.tasks.harbor import SITE_PACKAGES
from toolgym.tasks.task import Task
from toolgym.verifiers.differential import PER_CASE_S, PROBE_ENV
from toolgym.verifiers.judge import grader_source
from toolgym.verifiers.package_tests import TEST_ENV, pytest_command, pytest_ini
from toolgym.verifiers.protect import ALWAYS, is_protected

EXPORTED_KINDS = ("state", "package-tests")


class ExportError(ValueError):
    """A task that cannot be written in Harbor's format (the message says why)."""


def solve_script(task: Task) -> str:
    """The oracle's tool calls as a shell script (bash commands as they are, file writes through
    base64 so any content survives)."""
    lines = ["#!/bin/bash", "# the oracle of toolgym task " + task.id, "set -e", "cd /workspace"]
    for call in task.oracle:
        args = call.arguments
        if call.name == "bash":
            lines.append(args["command"])
        elif call.name == "write_file":
            data = base64.b64encode(args["content"].encode()).decode()
            lines += [
                f"mkdir -p \"$(dirname '{args['path']}')\"",
                f"base64 -d > '{args['path']}' <<'TOOLGYM_EOF'",
                *textwrap.wrap(data, 76),
                "TOOLGYM_EOF",
            ]
        elif call.name == "edit":
            payload = base64.b64encode(json.dumps(args).encode()).decode()
            lines.append(
                "python3 -c 'import base64, json, sys; a = json.loads(base64.b64decode(sys.argv[1])); "
                't = open(a["path"]).read(); open(a["path"], "w").write(t.replace(a["old"], a["new"], 1))\' ' + payload
            )
        elif call.name != "submit":
            raise ExportError(f"its oracle calls {call.name!r}, which has no shell form")
    return "\n".join(lines) + "\n"


def grading_spec(task: Task) -> dict:
    """What `harbor_grade.py` needs: the hidden spec, the protected paths and their pristine text,
    and the commands and environments toolgym's own grader uses."""
    hidden = task.hidden
    patterns = list(ALWAYS) + list(hidden.protected)
    spec = {
        "hidden": hidden.model_dump(mode="json"),
        "protected": patterns,
        "tests_dir": "/tests",
        "pristine": {p: t for p, t in task.workspace.items() if is_protected(p, tuple(hidden.protected))},
    }
    if hidden.kind == "package-tests":
        spec.update(
            pytest_command=pytest_command("{args}"),
            pytest_ini=pytest_ini(hidden.runs[0].pythonpath),
            test_env=TEST_ENV,
            probe_env=PROBE_ENV,
            per_case_s=PER_CASE_S,
        )
    return spec


def _toml(task: Task, verifier_s: float) -> str:
    difficulty = "easy" if task.difficulty <= 3 else "medium" if task.difficulty <= 6 else "hard"
    return textwrap.dedent(f"""\
        version = "1.0"

        [metadata]
        author_name = "toolgym"
        difficulty = "{difficulty}"
        category = {json.dumps(task.family)}
        tags = ["toolgym", {json.dumps(task.family.split("/")[0])}, {json.dumps(task.split)}]
        toolgym_task_id = "{task.id}"
        toolgym_env = {json.dumps(task.env_id)}

        [verifier]
        timeout_sec = {verifier_s:.1f}

        [agent]
        timeout_sec = 1800.0

        [environment]
        build_timeout_sec = 600.0
        cpus = 1
        memory_mb = 2048
        allow_internet = false
        """)


def _dockerfile(site: bool) -> str:
    site_line = f"COPY site/ {SITE_PACKAGES}/\n" if site else ""
    return (
        f"# toolgym's sandbox image: `toolgym sandbox build-image` builds it without a registry; with one,\n"
        f"# sandbox/Dockerfile in toolgym's repository builds the same (Debian 12, python3, pytest).\n"
        f"ARG BASE={IMAGE_TAG}\nFROM ${{BASE}}\n{site_line}COPY --chown=1000:1000 workspace/ /workspace/\n"
        f"WORKDIR /workspace\n"
    )


def export_task(task: Task, dest: Path) -> Path:
    """Write `task` as a Harbor task directory `dest`; `ExportError` if it cannot be."""
    hidden = task.hidden
    if hidden.kind not in EXPORTED_KINDS:
        raise ExportError(f"tasks graded by {hidden.kind!r} do not export (only {', '.join(EXPORTED_KINDS)})")
    solve = solve_script(task)
    layer = task.data.get("site_layer")
    if layer and not (cache_dir() / "layers" / layer).is_dir():
        raise ExportError(f"its site layer {layer!r} is not built here (mine the suite on this machine first)")
    if dest.exists():
        shutil.rmtree(dest)
    env_dir = dest / "environment"
    for rel, text in task.workspace.items():
        path = env_dir / "workspace" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    (env_dir / "workspace").mkdir(parents=True, exist_ok=True)
    if layer:
        shutil.copytree(cache_dir() / "layers" / layer, env_dir / "site", symlinks=True)
    (env_dir / "Dockerfile").write_text(_dockerfile(bool(layer)))
    (dest / "instruction.md").write_text(task.instruction.rstrip() + "\n")
    runs = max(1, len(hidden.runs)) + (1 if hidden.differential else 0)
    (dest / "task.toml").write_text(_toml(task, hidden.timeout_s * runs + 60))
    tests = dest / "tests"
    tests.mkdir()
    (tests / "spec.json").write_text(json.dumps(grading_spec(task)))
    for name in ("harbor_grade.py", "records.py", "probe_runner.py"):
        (tests / name).write_text(grader_source(name))
    (tests / "test.sh").write_text(
        "#!/bin/bash\n# toolgym's grader (harbor_grade.py); Harbor reads /logs/verifier/reward.txt\n"
        "mkdir -p /logs/verifier\n"
        "python3 -I /tests/harbor_grade.py /tests/spec.json /logs/verifier\n"
    )
    (dest / "solution").mkdir()
    (dest / "solution" / "solve.sh").write_text(solve)
    for script in (tests / "test.sh", dest / "solution" / "solve.sh"):
        script.chmod(0o755)
    return dest


def export_tasks(tasks: list[Task], out: Path, prefix: str) -> tuple[list[Path], dict[str, str]]:
    """Export each task to `out/<prefix>-<id>`; returns (written directories, {task id: why skipped})."""
    written, skipped = [], {}
    for task in tasks:
        try:
            written.append(export_task(task, out / f"{prefix}-{task.id}"))
        except ExportError as err:
            skipped[task.id] = str(err)
    return written, skipped


def run_trial(task_dir: Path, oracle: bool, timeout_s: float = 600) -> float:
    """Play one exported task as Harbor would, with docker and no network: build its environment,
    run `solution/solve.sh` (if `oracle`), upload `tests/`, run `tests/test.sh` as root, and
    return the reward it wrote. Raises `RuntimeError` with docker's words when a step fails."""
    import os
    import subprocess
    import uuid

    def docker(*args: str) -> str:
        env = dict(os.environ, DOCKER_BUILDKIT="0")  # the local base image, never a registry
        res = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout_s, env=env)
        if res.returncode != 0:
            raise RuntimeError(f"docker {args[0]} failed: {(res.stderr or res.stdout).strip()[-400:]}")
        return res.stdout.strip()

    tag = f"toolgym-harbor-{uuid.uuid4().hex[:12]}"
    docker("build", "-q", "-t", tag, str(task_dir / "environment"))
    container = ""
    try:
        container = docker("run", "-d", "--network", "none", tag, "sleep", "infinity")
        if oracle:
            docker("cp", str(task_dir / "solution"), f"{container}:/solution")
            docker("exec", container, "bash", "/solution/solve.sh")
        docker("cp", str(task_dir / "tests"), f"{container}:/tests")
        docker("exec", "-u", "0", container, "bash", "/tests/test.sh")
        return float(docker("exec", "-u", "0", container, "cat", "/logs/verifier/reward.txt"))
    finally:
        if container:
            subprocess.run(["docker", "rm", "-f", container], capture_output=True)
        subprocess.run(["docker", "rmi", "-f", tag], capture_output=True)


__all__ = ["EXPORTED_KINDS", "ExportError", "export_task", "export_tasks", "grading_spec", "run_trial", "solve_script"]
