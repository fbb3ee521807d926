"""ToolEnv contract: gymnasium registry, determinism (also across processes), check_env, the records family."""

import subprocess
import sys

import gymnasium
import pytest

import toolgym
from toolgym.envs.checker import episode_trace_hash, run_episode


def test_registered_under_toolgym_namespace():
    ids = {e.id: e.suite for e in toolgym.registered()}
    assert ids["toolgym/records-v0"] == "records"
    assert "toolgym/records-v0" in gymnasium.registry
    env = gymnasium.make("toolgym/records-v0")
    assert isinstance(env.unwrapped, toolgym.ToolEnv)


def test_the_registry_knows_which_envs_run_in_a_sandbox():
    from toolgym.envs import env_info

    assert env_info("mcp-inventory-v0").sandboxed and env_info("toolgym/shell-ops-v0").sandboxed
    assert not env_info("records-v0").sandboxed and not env_info("bfcl-v0").sandboxed
    assert env_info("nope-v0") is None


def test_make_unknown_id_lists_known_ones():
    with pytest.raises(gymnasium.error.UnregisteredEnv, match="registered: .*toolgym/records-v0"):
        toolgym.make("nope-v0")


def test_make_passes_kwargs():
    env = toolgym.make("records-v0", split="held-out", max_turns=5).unwrapped
    assert env.max_turns == 5 and all(t.split == "held-out" for t in env.tasks) and len(env.tasks) == 200


def test_reset_observation_has_instruction_and_tools(records_env):
    obs, info = records_env.reset(seed=5)
    assert obs.startswith(records_env.task.instruction)
    assert "search(field: string, value: string)" in obs and "<tool_call>" in obs
    assert [t["function"]["name"] for t in info["tools"]] == ["search", "get", "answer"]
    assert info["task_id"] == records_env.task.id


def test_shuffle_tools_lists_the_tools_in_an_order_drawn_per_episode():
    env = toolgym.make("records-v0", shuffle_tools=True).unwrapped
    task = env.tasks[0]

    def listed(seed):
        obs, info = env.reset(seed=seed, options={"task": task})
        names = [t["function"]["name"] for t in info["tools"]]
        in_text = [line[2:].split("(")[0] for line in obs.splitlines() if line.startswith("- ")]
        assert in_text == names  # the text and the schemas agree on the order
        return tuple(names)

    orders = {seed: listed(seed) for seed in range(12)}
    assert all(sorted(o) == ["answer", "get", "search"] for o in orders.values())
    assert len(set(orders.values())) >= 3  # the order varies with the seed...
    assert listed(5) == orders[5]  # ...and the same episode lists the same order again
    # an unknown tool's error lists the episode's order, and calls are unaffected by it
    env.reset(seed=5, options={"task": task})
    obs, _, _, _, _ = env.step('<tool_call>{"name": "nope", "arguments": {}}</tool_call>')
    assert ", ".join(orders[5]) in obs
    plain = toolgym.make("records-v0").unwrapped
    assert [t["function"]["name"] for t in plain.reset(seed=5, options={"task": task})[1]["tools"]] == ["search", "get", "answer"]


def test_pinned_tools_keep_their_places_while_the_rest_are_drawn():
    env = toolgym.make("records-v0", shuffle_tools=True, pinned_tools=1).unwrapped
    task = env.tasks[0]
    orders = {tuple(t["function"]["name"] for t in env.reset(seed=seed, options={"task": task})[1]["tools"]) for seed in range(12)}
    assert {o[0] for o in orders} == {"search"}  # the pinned head stays first...
    assert {o[1:] for o in orders} == {("get", "answer"), ("answer", "get")}  # ...the rest are drawn
    with pytest.raises(ValueError, match="pinned_tools"):
        toolgym.make("records-v0", shuffle_tools=True, pinned_tools=-1)


def test_same_seed_same_episode_in_process(records_env):
    a = episode_trace_hash("records-v0", 11)
    b = episode_trace_hash("records-v0", 11)
    c = episode_trace_hash("records-v0", 12)
    assert a == b and a != c


def test_same_seed_same_episode_across_processes():
    code = "from toolgym.envs.checker import episode_trace_hash as h; print(h('records-v0', 3))"
    outs = {
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={"PYTHONHASHSEED": str(s), "PATH": "/usr/bin:/bin"},
        ).stdout.strip()
        for s in (1, 2)
    }
    assert outs == {episode_trace_hash("records-v0", 3)}


def test_seeded_reset_draws_tasks_deterministically(records_env):
    picks = [records_env.reset(seed=s)[1]["task_id"] for s in range(20)]
    again = [records_env.reset(seed=s)[1]["task_id"] for s in range(20)]
    assert picks == again and len(set(picks)) > 10


def test_gymnasium_check_env_passes(records_env):
    from gymnasium.utils.env_checker import check_env

    check_env(records_env, skip_render_check=True)


def test_oracle_solves_and_other_answers_fail(records_env):
    for task in records_env.tasks[:60]:
        reward, terminated, _ = run_episode(records_env, task, [c.to_text() for c in task.oracle])
        assert terminated and reward == 1.0, task.id
    task = records_env.tasks[0]
    reward, _, _ = run_episode(
        records_env,
        task,
        [c.to_text() for c in task.oracle[:-1]] + [toolgym.ToolCall(name="answer", arguments={"text": "nobody"}).to_text()],
    )
    assert reward == 0.0


def test_records_tasks_need_several_tool_calls():
    suite = toolgym.tasks.builtin_suite("records")
    lengths = {d: min(len(t.oracle) for t in suite if t.difficulty == d) for d in (1, 2, 3)}
    assert lengths[1] >= 3 and lengths[2] >= 4 and lengths[3] >= 2
    assert max(len(t.oracle) for t in suite if t.difficulty == 3) >= 5


def test_render_ansi():
    env = toolgym.make("records-v0", render_mode="ansi").unwrapped
    env.reset(seed=0)
    env.step("hello")
    text = env.render()
    assert "[action]\nhello" in text and "no tool call found" in text
