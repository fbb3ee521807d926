"""`HarborVerifier`: a task imported from Harbor's format, graded by its own `tests/test.sh` the
way Harbor runs it.

Docker builds the task's environment (its Dockerfile over the pristine workspace and site layer;
the image is cached per task), a container starts with no network, the agent's final workspace
is copied in (deleted files removed), `tests/` is uploaded only then, `tests/test.sh` runs as
root, and the reward it wrote to `/logs/verifier/reward.txt` (or `reward.json`) is the verdict's.
A Docker failure is an infra error (ours); a test script that writes no reward fails the task
(its code ran in the agent's container, as in Harbor).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

from toolgym.tasks import Task
from toolgym.verifiers.verdict import FinalState, Outcome, TestResult, Verdict

DOCKERFILE = "environment/Dockerfile"


def _docker(*args: str, timeout_s: float = 600) -> str:
    env = dict(os.environ, DOCKER_BUILDKIT="0")  # local base images, never a registry
    res = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout_s, env=env)
    if res.returncode != 0:
        raise RuntimeError(f"docker {args[0]}: {(res.stderr or res.stdout).strip()[-300:]}")
    return res.stdout.strip()


def environment_image(task: Task) -> str:
    """The task's environment image (built once per task content, then reused)."""
    from toolgym.sandbox.base import cache_dir

    key = hashlib.sha256(
        json.dumps([task.hidden.files.get(DOCKERFILE), task.workspace, task.data.get("site_layer")], sort_keys=True).encode()
    ).hexdigest()[:16]
    tag = f"toolgym-harbor-env:{key}"
    if subprocess.run(["docker", "image", "inspect", tag], capture_output=True).returncode == 0:
        return tag
    with tempfile.TemporaryDirectory(prefix="toolgym-harbor-build-") as tmp:
        ctx = Path(tmp)
        (ctx / "Dockerfile").write_text(task.hidden.files[DOCKERFILE])
        (ctx / "workspace").mkdir()
        for rel, text in task.workspace.items():
            (ctx / "workspace" / rel).parent.mkdir(parents=True, exist_ok=True)
            (ctx / "workspace" / rel).write_text(text)
        if task.data.get("site_layer"):
            shutil.copytree(cache_dir() / "layers" / task.data["site_layer"], ctx / "site", symlinks=True)
        _docker("build", "-q", "-t", tag, str(ctx))
    return tag


class HarborVerifier:
    """Grades `harbor` tasks with their own `tests/test.sh` (see the module docstring)."""

    name = "harbor"

    def verify(self, task: Task, final_state: FinalState) -> Verdict:
        """Run the task's test script against the agent's final workspace, in its environment."""
        start = time.perf_counter()
        container = ""
        try:
            image = environment_image(task)
            container = _docker(
                "run", "-d", "--network", "none", "--name", f"toolgym-harbor-{uuid.uuid4().hex[:10]}", image, "sleep", "infinity"
            )
            with tempfile.TemporaryDirectory(prefix="toolgym-harbor-grade-") as tmp:
                root = Path(tmp)
                changed = {p: t for p, t in final_state.changes.items() if t is not None}
                for rel, text in changed.items():
                    (root / "ws" / rel).parent.mkdir(parents=True, exist_ok=True)
                    (root / "ws" / rel).write_text(text)
                if changed:
                    _docker("cp", f"{root / 'ws'}/.", f"{container}:/workspace/")
                removed = [p for p, t in final_state.changes.items() if t is None]
                if removed:
                    _docker("exec", "-u", "0", container, "rm", "-rf", "--", *[f"/workspace/{p}" for p in removed])
                for rel, text in task.hidden.files.items():
                    if rel.startswith("tests/"):
                        (root / rel).parent.mkdir(parents=True, exist_ok=True)
                        (root / rel).write_text(text)
                _docker("cp", str(root / "tests"), f"{container}:/tests")
            res = subprocess.run(
                ["docker", "exec", "-u", "0", container, "bash", "/tests/test.sh"],
                capture_output=True,
                text=True,
                timeout=task.hidden.timeout_s,
            )
            reward_text = subprocess.run(
                [
                    "docker",
                    "exec",
                    "-u",
                    "0",
                    container,
                    "sh",
                    "-c",
                    "cat /logs/verifier/reward.txt 2>/dev/null || cat /logs/verifier/reward.json",
                ],
                capture_output=True,
                text=True,
            ).stdout.strip()
        except subprocess.TimeoutExpired:
            return self._verdict(0.0, Outcome.TIMEOUT, f"tests/test.sh ran past {task.hidden.timeout_s}s", start)
        except (RuntimeError, OSError) as err:
            return self._verdict(0.0, Outcome.INFRA_ERROR, f"could not run the task's environment: {err}", start)
        finally:
            if container:
                subprocess.run(["docker", "rm", "-f", container], capture_output=True)
        try:
            reward = float(reward_text) if not reward_text.startswith("{") else float(json.loads(reward_text)["reward"])
        except (ValueError, KeyError, TypeError):
            return self._verdict(
                0.0, Outcome.FAILED, f"tests/test.sh wrote no reward (exit {res.returncode}: {(res.stdout + res.stderr)[-200:]!r})", start
            )
        ok = reward >= 1.0
        return self._verdict(reward, Outcome.PASSED if ok else Outcome.FAILED, f"tests/test.sh: reward {reward}", start)

    @staticmethod
    def _verdict(reward: float, outcome: Outcome, reason: str, start: float) -> Verdict:
        return Verdict(
            reward=reward,
            passed=outcome == Outcome.PASSED,
            outcome=outcome,
            reason=reason,
            tests=[TestResult(name="tests/test.sh", passed=outcome == Outcome.PASSED, message=reason)],
            duration_s=time.perf_counter() - start,
        )


__all__ = ["HarborVerifier", "environment_image"]
