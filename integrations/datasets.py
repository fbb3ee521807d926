"""toolgym suites and demonstrations as Hugging Face `datasets` (what TRL's trainers take).

- `suite_to_dataset`: one row per task: `prompt` (system + user messages), `tools` (the env's
  tool schemas as a JSON string), `task_id`, `env_id`, `suite`, `split`, `family`, `difficulty`.
  It is what `GRPOTrainer` takes (with `trainers.trl_adapter.environment_factory`, whose
  `reset` reads `task_id`). Hidden tests, answers and oracles are never written.
- `tasks_from_dataset`: the round trip: rows back to the suite's `Task`s, same ids.
- `demonstrations_dataset`: each task's oracle played through its environment and verifier, as a
  conversation with tool calls (`messages` + `tools`), the format `SFTTrainer` takes; only
  demonstrations that pass their verifier are kept.
- `write_suite_dataset`: both (a `DatasetDict` per split) to a directory (`toolgym tasks SUITE
  --to-dataset DIR`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path
from typing import Any

import toolgym
from toolgym.inference.chat import DEFAULT_SYSTEM
from toolgym.tasks import Task, TaskLoadError, TaskSuite, ToolCall, builtin_suite, suite_specs

#: `datasets` split names must be identifiers: toolgym's `held-out` is stored as `held_out`.
SPLIT_NAMES = {"train": "train", "held-out": "held_out"}


def _require_datasets():
    try:
        import datasets
    except ImportError as err:
        raise ImportError("exporting to datasets needs the datasets package: pip install 'toolgym[datasets]'") from err
    return datasets


@lru_cache(maxsize=64)
def tool_schemas(env_id: str) -> str:
    """The env's tool schemas as a JSON string (how TRL's `tools` column is stored)."""
    env = toolgym.make(env_id).unwrapped
    try:
        return json.dumps(env.tool_schemas())
    finally:
        env.close()


def task_row(task: Task, suite: str, system: str | None = DEFAULT_SYSTEM) -> dict[str, Any]:
    """One dataset row for `task` (no hidden spec, no oracle)."""
    prompt = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": task.instruction}]
    return {
        "prompt": prompt,
        "tools": tool_schemas(task.env_id),
        "task_id": task.id,
        "env_id": task.env_id,
        "suite": suite,
        "split": task.split,
        "family": task.family,
        "difficulty": task.difficulty,
    }


def suite_to_dataset(suite: TaskSuite, split: str | None = None, system: str | None = DEFAULT_SYSTEM):
    """A `datasets.Dataset` of the suite's tasks (one split, or all)."""
    datasets = _require_datasets()
    tasks = suite.split(split).tasks if split else suite.tasks
    return datasets.Dataset.from_list([task_row(t, suite.name, system) for t in tasks])


def tasks_from_dataset(rows: Iterable[dict[str, Any]], suite: TaskSuite | None = None) -> list[Task]:
    """The tasks the rows name, from `suite` or the registered suite each row names (same ids)."""
    cache: dict[str, dict[str, Task]] = {}
    out = []
    for row in rows:
        name = row.get("suite")
        if suite is not None:
            by_id = cache.setdefault(suite.name, {t.id: t for t in suite.tasks})
        elif name in suite_specs():
            by_id = cache.setdefault(name, {t.id: t for t in builtin_suite(name).tasks})
        else:
            raise TaskLoadError(
                f"row {row.get('task_id')!r} names suite {name!r}, which is not registered: "
                "pass the suite (TaskSuite.load(...)) to tasks_from_dataset"
            )
        task = by_id.get(row["task_id"])
        if task is None:
            raise TaskLoadError(f"task {row['task_id']!r} is not in suite {name!r} (another version of the suite?)")
        out.append(task)
    return out


def play_oracle(task: Task, env: Any = None) -> tuple[list[dict[str, Any]], bool]:
    """The oracle's conversation for `task` (assistant tool calls and tool results) and whether
    the verifier passed it; `env` (an environment of the task's env id) is reused if given."""
    own = env is None
    env = toolgym.make(task.env_id).unwrapped if own else env
    env.grade_on_submit = False  # graded once, below
    try:
        env.reset(options={"task": task})
        messages: list[dict[str, Any]] = []
        for call in task.oracle:
            if env.done:
                break
            _, _, _, _, info = env.step([ToolCall(name=call.name, arguments=call.arguments)])
            messages.append(
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [{"type": "function", "function": {"name": call.name, "arguments": dict(call.arguments)}}],
                }
            )
            if not env.done:  # like a rollout: no observation after the call that ended the episode
                messages += [{"role": "tool", "name": r["name"] or "error", "content": r["content"]} for r in info["tool_results"]]
        verdict = env.verdict()
        return messages, verdict.passed
    finally:
        if own:
            env.close()


def demonstrations_dataset(tasks: list[Task], suite: str, system: str | None = DEFAULT_SYSTEM):
    """Oracle demonstrations as conversations with tools (`messages`, `tools`, ids), for SFTTrainer."""
    datasets = _require_datasets()
    rows = []
    envs: dict[str, Any] = {}  # one environment per env id, reset for each task
    try:
        for task in tasks:
            if task.env_id not in envs:
                envs[task.env_id] = toolgym.make(task.env_id).unwrapped
            turns, passed = play_oracle(task, envs[task.env_id])
            if not passed:
                continue
            row = task_row(task, suite, system)
            row["messages"] = row.pop("prompt") + turns
            rows.append(row)
    finally:
        for env in envs.values():
            env.close()
    if not rows:
        raise ValueError(f"no oracle demonstration of suite {suite!r} passed its verifier")
    # tool-call arguments differ in shape per tool: store them as JSON so Arrow has one column type
    for row in rows:
        for m in row["messages"]:
            for tc in m.get("tool_calls", []):
                tc["function"]["arguments"] = json.dumps(tc["function"]["arguments"])
    return datasets.Dataset.from_list(rows)


def write_suite_dataset(suite: TaskSuite, out_dir: str | Path, demos: int = 0) -> dict[str, int]:
    """Write the suite as a `DatasetDict` (train, held_out) to `out_dir` and, with `demos` > 0,
    the first `demos` train tasks' oracle demonstrations to `out_dir/sft`. Returns row counts."""
    datasets = _require_datasets()
    datasets.disable_progress_bars()  # one line per split from the caller instead
    out = Path(out_dir)
    splits = {SPLIT_NAMES.get(s, s.replace("-", "_")): suite_to_dataset(suite, s) for s in suite.splits}
    datasets.DatasetDict(splits).save_to_disk(str(out))
    counts = {name: len(ds) for name, ds in splits.items()}
    if demos:
        sft = demonstrations_dataset(suite.split("train").tasks[:demos], suite.name)
        sft.save_to_disk(str(out / "sft"))
        counts["sft"] = len(sft)
    return counts


__all__ = [
    "SPLIT_NAMES",
    "demonstrations_dataset",
    "play_oracle",
    "suite_to_dataset",
    "task_row",
    "tasks_from_dataset",
    "tool_schemas",
    "write_suite_dataset",
]
