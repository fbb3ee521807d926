"""The swe-pypi environment over mined tasks: the env contract (`toolgym check`), episodes with
the code-repair tools, and evaluation with pass@k per package and per mutation operator."""

from __future__ import annotations

import json
import os

from conftest import run_cli

import toolgym
from toolgym.tasks.mined import load_mined_suite


def test_an_episode_with_the_tools_fixes_the_bug_and_scores_one(mined):
    task = load_mined_suite(mined[0]).tasks[0]
    env = toolgym.make("swe-pypi-v0", tasks=[task]).unwrapped
    try:
        obs, info = env.reset(seed=0, options={"task": task})
        assert "some of its tests fail" in obs and info["task_id"] == task.id
        cmd = task.instruction.split("(`")[1].split("`)")[0]
        out, *_ = env.step(f'<tool_call>{{"name": "bash", "arguments": {{"command": "{cmd}"}}}}</tool_call>')
        assert "failed" in out  # the visible tests show the failure inside the sandbox
        for call in task.oracle:
            obs, reward, terminated, truncated, info = env.step(call.to_text())
        assert terminated and reward == 1.0
        env.reset(seed=0, options={"task": task})
        _, reward, terminated, _, _ = env.step('<tool_call>{"name": "submit", "arguments": {}}</tool_call>')
        assert terminated and reward == 0.0
    finally:
        env.close()


def test_toolgym_check_passes_on_the_mined_suite(mined):
    env = {"TOOLGYM_SWE_PYPI": str(mined[0])}
    os.environ.update(env)
    try:
        res = run_cli("check", "swe-pypi-v0", "--tasks", "3", timeout=900)
    finally:
        os.environ.pop("TOOLGYM_SWE_PYPI")
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-1000:]
    for check in ("oracle[train]", "do-nothing[held-out]", "reset[train]", "hacks[held-out]"):
        assert f"PASS {check}" in res.stdout


def test_eval_reports_pass_at_k_per_package_and_operator(mined, tmp_path):
    res = run_cli(
        "eval", "--policy", "oracle", "--suite", str(mined[0]), "--split", "held-out", "-n", "1", "--out", str(tmp_path), timeout=900
    )
    assert res.returncode == 0, res.stderr[-1000:]
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["overall"]["pass_at"]["1"]["value"] == 1.0
    assert set(report["by_metadata"]["package"]) == {"tinyheld"}
    assert all(f.startswith("swe-pypi/") for f in report["by_family"])
    text = (tmp_path / "report.md").read_text()
    assert "package `tinyheld`" in text and "family `swe-pypi/" in text
