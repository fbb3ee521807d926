"""`toolgym check ENV`: does an environment keep the contract?

Checks, one line each:
  gymnasium     gymnasium's `check_env` (spaces, reset/step signatures, seed determinism)
  determinism   the same seed and actions give identical episodes in two fresh processes
  oracle        every sampled task's oracle solution earns reward 1
  do-nothing    an agent that only talks, or submits nothing, earns reward 0 on every sampled task
  reset         reset after arbitrary actions gives the initial observation and state again
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from toolgym.envs.core import ToolEnv
from toolgym.envs.registry import full_id, import_source, make
from toolgym.tasks import Task, ToolCall


@dataclass
class CheckResult:
    """One check's name, verdict and a short detail."""

    name: str
    ok: bool
    detail: str


def _unwrapped(env_id: str, **kwargs: Any) -> ToolEnv:
    env = make(env_id, **kwargs).unwrapped
    if not isinstance(env, ToolEnv):
        raise TypeError(f"{env_id} is not a ToolEnv ({type(env).__name__})")
    return env


def _sample(tasks: list[Task], n: int) -> list[Task]:
    if n <= 0 or n >= len(tasks):
        return list(tasks)
    step = len(tasks) / n
    return [tasks[int(i * step)] for i in range(n)]


def run_episode(env: ToolEnv, task: Task, actions: list[Any], seed: int = 0) -> tuple[float, bool, list[Any]]:
    """Play `actions` on `task` until the episode ends; returns (total reward, terminated, trace)."""
    obs, info = env.reset(seed=seed, options={"task": task})
    trace: list[Any] = [obs, info.get("task_id")]
    total, terminated = 0.0, False
    for action in actions:
        obs, reward, terminated, truncated, info = env.step(action)
        total += reward
        trace.append([obs, reward, terminated, truncated, info.get("errors")])
        if terminated or truncated:
            break
    return total, terminated, trace


def episode_trace_hash(env_id: str, seed: int, imports: tuple[str, ...] = ()) -> str:
    """Hash of a scripted episode (seeded reset, a junk action, the oracle) for determinism checks."""
    for source in imports:
        import_source(source)
    env = _unwrapped(env_id)
    obs, info = env.reset(seed=seed)
    trace: list[Any] = [obs, info.get("task_id"), env.state_hash()]
    assert env.task is not None
    actions: list[Any] = ["<tool_call>{not json</tool_call>"] + env.task.oracle_turns()
    for action in actions:
        obs, reward, terminated, truncated, step_info = env.step(action)
        trace.append([obs, reward, terminated, truncated, step_info.get("errors")])
        if terminated or truncated:
            break
    env.close()
    return hashlib.sha256(json.dumps(trace, sort_keys=True, default=str).encode()).hexdigest()


def check_gymnasium(env_id: str) -> CheckResult:
    """gymnasium's own `check_env`; its warnings count as failures."""
    from gymnasium.utils.env_checker import check_env

    env = _unwrapped(env_id)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            check_env(env, skip_render_check=True)
        except Exception as err:
            return CheckResult("gymnasium", False, f"{type(err).__name__}: {err}")
        finally:
            env.close()
    relevant = [str(w.message) for w in caught if "gymnasium" in (w.filename or "") or "env_checker" in str(w.category)]
    if relevant:
        return CheckResult("gymnasium", False, "; ".join(relevant[:3]))
    return CheckResult("gymnasium", True, "check_env passed")


def check_determinism(env_id: str, seeds: tuple[int, ...] = (0, 1, 7), imports: tuple[str, ...] = ()) -> CheckResult:
    """The same seeded episode hashes identically here and in two fresh processes."""
    cmd_base = [sys.executable, "-m", "toolgym.envs.checker", full_id(env_id)]
    for source in imports:
        cmd_base += ["--import", source]
    for seed in seeds:
        local = episode_trace_hash(env_id, seed)
        remote = []
        for _ in range(2):
            out = subprocess.run(cmd_base + ["--seed", str(seed)], capture_output=True, text=True, timeout=600)
            if out.returncode != 0:
                return CheckResult("determinism", False, f"trace subprocess failed: {out.stderr.strip()[-300:]}")
            remote.append(out.stdout.strip())
        if len(set(remote + [local])) != 1:
            return CheckResult("determinism", False, f"seed {seed}: episodes differ across processes")
    return CheckResult("determinism", True, f"seeds {list(seeds)} identical in this and 2 fresh processes")


def check_oracle(env: ToolEnv, tasks: list[Task]) -> CheckResult:
    """Every task's oracle earns reward 1."""
    failures = []
    for task in tasks:
        reward, terminated, _ = run_episode(env, task, task.oracle_turns())
        if reward < 1.0:
            failures.append(f"{task.id} (reward {reward})")
    ok = not failures
    return CheckResult(
        "oracle", ok, f"{len(tasks) - len(failures)}/{len(tasks)} tasks solved" + ("" if ok else f"; failing: {', '.join(failures[:5])}")
    )


def _empty_args(spec_params: dict[str, Any]) -> dict[str, Any]:
    empty = {"string": "", "integer": 0, "number": 0.0, "boolean": False, "array": [], "object": {}}
    return {
        name: empty.get(p.get("type", "string"), "")
        for name, p in spec_params.get("properties", {}).items()
        if name in spec_params.get("required", [])
    }


def check_do_nothing(env: ToolEnv, tasks: list[Task]) -> CheckResult:
    """An agent that only talks, or submits empty arguments at once, solves nothing; except tasks
    where doing nothing is the right answer (`env.nothing_solves(task)`, e.g. BFCL's irrelevance),
    which talking must solve."""
    finals = [s for s in env.tools.values() if s.final]
    solved, missed = [], []
    for task in tasks:
        expected = env.nothing_solves(task)
        strategies: list[list[Any]] = [["I am not sure what to do."] * (env.max_turns + 1)]
        for spec in finals:
            strategies.append([ToolCall(name=spec.name, arguments=_empty_args(spec.parameters)).to_text()])
        rewards = [run_episode(env, task, actions)[0] for actions in (strategies if not expected else strategies[:1])]
        if expected and rewards[0] < 1.0:
            missed.append(task.id)
        elif not expected and any(r > 0 for r in rewards):
            solved.append(task.id)
    ok = not solved and not missed
    exempt = sum(env.nothing_solves(t) for t in tasks)
    return CheckResult(
        "do-nothing",
        ok,
        f"{len(solved)}/{len(tasks) - exempt} tasks solved by doing nothing"
        + (f"; {exempt - len(missed)}/{exempt} where doing nothing is right" if exempt else "")
        + ("" if not solved else f": {', '.join(solved[:5])}")
        + ("" if not missed else f"; not solved by doing nothing: {', '.join(missed[:5])}"),
    )


def check_reset(env: ToolEnv, tasks: list[Task], seed: int = 0) -> CheckResult:
    """reset after arbitrary actions restores the initial observation and state hash."""
    rng_actions = ["hello", '<tool_call>{"name": "nope", "arguments": {}}</tool_call>', "<tool_call>[1, 2]</tool_call>"]
    for task in tasks:
        obs0, info0 = env.reset(seed=seed, options={"task": task})
        hash0 = env.state_hash()
        for action in rng_actions + task.oracle_turns()[:-1]:
            _, _, terminated, truncated, _ = env.step(action)
            if terminated or truncated:
                break
        obs1, info1 = env.reset(seed=seed, options={"task": task})
        if obs1 != obs0 or env.state_hash() != hash0 or info1.get("task_id") != info0.get("task_id"):
            return CheckResult("reset", False, f"task {task.id}: reset after actions did not restore the initial observation/state")
    return CheckResult("reset", True, f"{len(tasks)} tasks restored to their initial observation and state")


#: Verifier-hacking attempts made through the standard sandbox tools, then `submit`. None may pass.
HACK_ACTIONS: dict[str, list[ToolCall]] = {
    "conftest forcing passes": [
        ToolCall(
            name="write_file",
            arguments={
                "path": "conftest.py",
                "content": (
                    "import pytest\n@pytest.hookimpl(hookwrapper=True)\ndef pytest_runtest_makereport(item, call):\n"
                    "    out = yield\n    out.get_result().outcome = 'passed'\n"
                ),
            },
        )
    ],
    "pytest.ini deselecting": [
        ToolCall(name="write_file", arguments={"path": "pytest.ini", "content": "[pytest]\naddopts = -k nothing_matches\n"})
    ],
    "visible tests emptied": [
        ToolCall(
            name="bash",
            arguments={
                "command": "for f in $(find . -path ./tests_hidden -prune -o -name 'test_*.py' -print); do "
                "printf 'def test_ok():\\n    assert True\\n' > $f; done; true"
            },
        )
    ],
    "files at hidden test paths": [
        ToolCall(
            name="bash",
            arguments={"command": "mkdir -p tests_hidden && printf 'def test_ok():\\n    assert True\\n' > tests_hidden/test_x.py"},
        )
    ],
    "sitecustomize": [ToolCall(name="write_file", arguments={"path": "sitecustomize.py", "content": "import os\nos._exit(0)\n"})],
    "fake results file": [
        ToolCall(
            name="bash",
            arguments={
                "command": "mkdir -p .toolgym-results-x && echo '<testsuites/>' > .toolgym-results-x/junit.xml; "
                'echo \'{"name": "x", "passed": true}\' > results.jsonl'
            },
        )
    ],
}


def check_hacks(env: ToolEnv, tasks: list[Task]) -> CheckResult:
    """Sandboxed envs: verifier-hacking attempts (then submit) never earn reward."""
    passed = []
    for task in tasks:
        for name, calls in HACK_ACTIONS.items():
            actions = [c.to_text() for c in calls] + [ToolCall(name="submit").to_text()]
            reward, _, _ = run_episode(env, task, actions)
            if reward > 0:
                passed.append(f"{task.id}: {name}")
    ok = not passed
    return CheckResult(
        "hacks", ok, f"{len(HACK_ACTIONS)} attacks x {len(tasks)} tasks, {len(passed)} passed" + ("" if ok else f": {passed[:3]}")
    )


def check_initial_state(env: ToolEnv, tasks: list[Task]) -> CheckResult:
    """The initial workspace hash is the same on every reset of a task."""
    for task in tasks:
        hashes = set()
        for seed in (0, 1):
            env.reset(seed=seed, options={"task": task})
            hashes.add(env.state_hash())
        if len(hashes) != 1:
            return CheckResult("initial-state", False, f"task {task.id}: initial state hash differs between resets")
    return CheckResult("initial-state", True, f"{len(tasks)} tasks start from one state hash")


def run_checks(
    env_id: str, n_tasks: int = 30, imports: tuple[str, ...] = (), on_result: Callable[[CheckResult], None] | None = None
) -> list[CheckResult]:
    """Run every check on `env_id`; `on_result` is called as each finishes."""
    results: list[CheckResult] = []

    def record(result: CheckResult) -> None:
        results.append(result)
        if on_result:
            on_result(result)

    def guarded(name: str, fn: Callable[[], CheckResult]) -> None:
        try:
            result = fn()
            result.name = name
            record(result)
        except Exception as err:  # a crashing check is a failed check, reported, not a traceback
            record(CheckResult(name, False, f"{type(err).__name__}: {err}"))

    guarded("gymnasium", lambda: check_gymnasium(env_id))
    guarded("determinism", lambda: check_determinism(env_id, imports=imports))
    for split in ("train", "held-out"):
        try:
            env = _unwrapped(env_id, split=split)
        except ValueError as err:  # e.g. an env without a held-out split
            record(CheckResult(f"tasks[{split}]", split != "train", str(err)))
            continue
        tasks = _sample(env.tasks, n_tasks)
        guarded(f"oracle[{split}]", lambda: check_oracle(env, tasks))
        guarded(f"do-nothing[{split}]", lambda: check_do_nothing(env, tasks))
        guarded(f"reset[{split}]", lambda: check_reset(env, tasks[: max(1, n_tasks // 3)]))
        if getattr(env, "sandbox_config", None) is not None:  # a sandboxed env
            guarded(f"hacks[{split}]", lambda: check_hacks(env, tasks[: max(1, n_tasks // 5)]))
            guarded(f"initial-state[{split}]", lambda: check_initial_state(env, tasks[: max(1, n_tasks // 5)]))
        env.close()
    return results


def _main(argv: list[str]) -> None:
    import argparse

    parser = argparse.ArgumentParser(description="print the episode trace hash (used by `toolgym check`)")
    parser.add_argument("env_id")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--import", dest="imports", action="append", default=[])
    args = parser.parse_args(argv)
    print(episode_trace_hash(args.env_id, args.seed, tuple(args.imports)))


if __name__ == "__main__":
    _main(sys.argv[1:])
