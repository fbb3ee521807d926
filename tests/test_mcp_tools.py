"""Environments whose tools come from an MCP server inside the sandbox (`envs/mcp_tools.py`),
played through the MCP SDK's client over the stdio transport, on both backends."""

from __future__ import annotations

import json
import os
import re
import subprocess

import pytest

import toolgym
from toolgym.envs.tools import InfraError
from toolgym.harness import FixedAgent, OracleAgent, RolloutRunner
from toolgym.harness.rollout import RolloutLimits
from toolgym.tasks import ToolCall, builtin_suite


def _call(name: str, **arguments) -> str:
    return ToolCall(name=name, arguments=arguments).to_text()


def _task(split: str = "train", kind: str | None = None):
    tasks = builtin_suite("mcp-inventory").split(split).tasks
    return next(t for t in tasks if kind is None or kind in t.metadata["kinds"])


@pytest.fixture
def env(backend):
    env = toolgym.make("mcp-inventory-v0", backend=backend).unwrapped
    yield env
    env.close()


def test_the_tools_are_the_servers_and_the_oracle_passes(env):
    task = _task(kind="exact")
    obs, info = env.reset(options={"task": task})
    names = [t["function"]["name"] for t in info["tools"]]
    assert names == ["list_items", "add_stock", "remove_stock", "delete_item", "history", "notify_supplier", "submit"]
    assert "bash" not in obs and "add_stock(item: string, quantity: integer)" in obs  # schemas from list_tools
    listing, _, _, _, info = env.step(_call("list_items"))
    stock = json.loads(task.workspace["inventory.json"])
    assert not any(info["errors"].values()) and listing == "\n".join(f"{k}: {v}" for k, v in sorted(stock.items()))
    total = 0.0
    for action in task.oracle_turns():
        obs, reward, terminated, _, info = env.step(action)
        total += reward
    assert terminated and total == 1.0 and info["side_effects"] == []


def test_shuffled_tools_list_the_servers_tools_in_another_order_per_episode(backend):
    env = toolgym.make("mcp-inventory-v0", backend=backend, shuffle_tools=True).unwrapped
    task = _task(kind="ship")
    try:
        orders = set()
        for seed in range(4):
            _, info = env.reset(seed=seed, options={"task": task})
            orders.add(tuple(t["function"]["name"] for t in info["tools"]))
        assert len(orders) >= 2 and all(len(o) == 7 and "submit" in o and "add_stock" in o for o in orders)
        total = sum(env.step(action)[1] for action in task.oracle_turns())  # the order changes no call
        assert total == 1.0
    finally:
        env.close()


def test_do_nothing_fails_and_mistakes_are_tool_errors(env):
    task = _task()
    env.reset(options={"task": task})
    obs, _, _, _, info = env.step(_call("remove_stock", item="no-such-thing", quantity=1))
    assert "no item named 'no-such-thing'" in obs and info["errors"]["tool_error"] == 1  # the server's own error, seen by the agent
    obs, _, _, _, info = env.step(_call("add_stock", item="x", quantity="3"))
    assert "must be of type integer" in obs  # checked against the input schema before the server sees it
    obs, _, _, _, info = env.step(_call("bash", command="ls"))
    assert "unknown tool `bash`" in obs
    _, reward, terminated, _, _ = env.step(_call("submit"))
    assert terminated and reward == 0.0


def test_reset_restarts_the_server_with_the_pristine_state(env):
    """The server's memory (`history`) and its file (`inventory.json`) both come back."""
    task = _task()
    env.reset(options={"task": task})
    first_hash = env.state_hash()
    before, *_ = env.step(_call("list_items"))
    env.step(_call("add_stock", item="sprockets-x", quantity=5))
    history, *_ = env.step(_call("history"))
    assert history == "add 5 sprockets-x"
    assert env.state_hash() != first_hash  # the state tools are part of the hash
    env.reset(options={"task": task})
    after, *_ = env.step(_call("list_items"))
    history, *_ = env.step(_call("history"))
    assert after == before and history == "no operations yet"
    assert env.sandbox.read_file("inventory.json") == task.workspace["inventory.json"]
    assert env.state_hash() == first_hash


def test_the_ledger_sees_what_the_server_does(env):
    task = _task()
    env.reset(options={"task": task})
    item = sorted(json.loads(task.workspace["inventory.json"]))[0]
    obs, *_ = env.step(_call("notify_supplier", item=item))
    assert "could not be reached" in obs
    _, reward, terminated, _, info = env.step(_call("submit"))
    kinds = [e["kind"] for e in info["side_effects"]]
    assert terminated and "network_attempt" in kinds
    assert info["side_effects_summary"]["counts"]["network_attempt"] >= 1 and reward < 1.0


def test_an_episode_cut_by_the_turn_limit_still_records_the_servers_side_effects(backend):
    env = toolgym.make("mcp-inventory-v0", backend=backend, max_turns=2).unwrapped
    try:
        task = _task()
        env.reset(options={"task": task})
        item = sorted(json.loads(task.workspace["inventory.json"]))[0]
        env.step(_call("notify_supplier", item=item))
        _, _, terminated, truncated, info = env.step(_call("list_items"))
        assert truncated and not terminated
        assert "network_attempt" in [e["kind"] for e in info["side_effects"]]
        assert env.server is None  # stopped: nothing of the episode runs on
    finally:
        env.close()


def test_an_episode_out_of_turns_is_graded_by_the_stock_it_left():
    """The hidden checker grades the stock, `submit` or not: the write alone, cut by the turn limit
    before `submit`, passes; the same limit with the wrong write fails."""
    task = next(t for t in builtin_suite("mcp-inventory").split("train").tasks if t.metadata["kinds"] == ["ship"])
    write = task.oracle[0]
    wrong = ToolCall(name="add_stock", arguments=write.arguments).to_text()
    outcomes = []
    for agent in (OracleAgent(), FixedAgent(wrong)):
        runner = RolloutRunner(lambda: toolgym.make("mcp-inventory-v0").unwrapped, agent, progress=False, limits=RolloutLimits(max_turns=1))
        try:
            (traj,) = runner.run([task])
        finally:
            runner.close()  # its pooled environments hold sandboxes
        assert traj.limit_hit == "turns"  # both were cut before `submit`
        outcomes.append(traj.outcome)
    assert outcomes == ["passed", "truncated"], outcomes


def test_a_server_that_cannot_start_is_an_infra_error_that_says_why():
    task = _task()
    broken = task.model_copy(update={"data": {"mcp_server": {"command": "python3 -c 'import sys; sys.exit(\"no database\")'"}}})
    env = toolgym.make("mcp-inventory-v0").unwrapped
    try:
        with pytest.raises(InfraError, match="did not start: it exited with code 1: no database"):
            env.reset(options={"task": broken})
        # the environment is still usable for a good task
        env.reset(options={"task": task})
        obs, *_ = env.step(_call("history"))
        assert obs == "no operations yet"
    finally:
        env.close()


def test_a_server_that_dies_mid_episode_is_a_tool_error_not_a_crash():
    task = _task()
    env = toolgym.make("mcp-inventory-v0").unwrapped
    try:
        env.reset(options={"task": task})
        env.sandbox.kill_all()  # the server's process is gone (as if it crashed)
        obs, _, terminated, _, info = env.step(_call("list_items"))
        assert not terminated and info["errors"]["tool_error"] == 1 and "MCP server" in obs
        _, reward, terminated, _, _ = env.step(_call("submit"))
        assert terminated and reward == 0.0
    finally:
        env.close()


def test_toolgym_check_passes_on_the_mcp_environment():
    from conftest import run_cli

    result = run_cli("check", "mcp-inventory-v0", "--tasks", "3")
    assert result.returncode == 0, result.stdout + result.stderr
    for check in ("oracle[train]", "oracle[held-out]", "reset[train]", "do-nothing[held-out]", "hacks[train]"):
        assert f"PASS {check}" in result.stdout


def test_no_bridge_process_outlives_the_environment():
    env = toolgym.make("mcp-inventory-v0").unwrapped
    env.reset(options={"task": _task()})
    env.step(_call("list_items"))
    env.close()
    children = subprocess.run(["ps", "-o", "pid=,args=", "--ppid", str(os.getpid())], capture_output=True, text=True).stdout
    assert "cat" not in children and "bridge" not in children, children


def test_partial_credit_counts_the_asked_changes_that_are_right_and_voids_collateral():
    """A three-change task: the verdict passes only on the exact stock; a failure records how many
    asked changes are right (training may use it), doing nothing earns 0, and touching an item the
    task never asked about voids every check."""
    task = next(t for t in builtin_suite("mcp-inventory").split("train").tasks if len(t.metadata["kinds"]) == 3)
    changes = [c for c in task.oracle if c.name != "submit"]
    env = toolgym.make("mcp-inventory-v0").unwrapped
    try:

        def credit(calls):
            env.reset(options={"task": task})
            for call in calls:
                env.step(call.to_text())
            verdict = env.verdict()
            return verdict.passed, verdict.reward, verdict.details.get("partial_credit")

        assert credit([]) == (False, 0.0, 0.0)
        assert credit(changes[:1]) == (False, 0.0, pytest.approx(1 / 3))
        assert credit(changes[:2]) == (False, 0.0, pytest.approx(2 / 3))
        assert credit(changes) == (True, 1.0, None)
        asked = {c.arguments["item"] for c in changes}
        other = next(i for i in json.loads(task.workspace["inventory.json"]) if i not in asked)
        assert credit([*changes[:2], ToolCall(name="add_stock", arguments={"item": other, "quantity": 1})]) == (False, 0.0, 0.0)
    finally:
        env.close()


def test_a_failed_check_credits_progress_toward_the_target_and_debits_the_wrong_way():
    """A `ship` task: shipping part of the asked units earns part of the way, receiving units
    instead loses some (below doing nothing, 0), and touching another item voids the credit. The
    verdict stays binary: only the exact stock passes."""
    task = next(t for t in builtin_suite("mcp-inventory").split("train").tasks if t.metadata["kinds"] == ["ship"])
    (ship,) = [c for c in task.oracle if c.name != "submit"]
    item, n = ship.arguments["item"], ship.arguments["quantity"]
    stock = json.loads(task.workspace["inventory.json"])
    other = next(i for i in stock if i != item)
    env = toolgym.make("mcp-inventory-v0").unwrapped
    try:

        def credit(*calls):
            env.reset(options={"task": task})
            for call in calls:
                env.step(call.to_text())
            verdict = env.verdict()
            return verdict.passed, verdict.details.get("partial_credit")

        assert credit(ship) == (True, None)
        assert credit() == (False, 0.0)
        if n > 1:
            assert credit(ToolCall(name="remove_stock", arguments={"item": item, "quantity": 1})) == (False, pytest.approx(1 - (n - 1) / n))
        assert credit(ToolCall(name="add_stock", arguments={"item": item, "quantity": n})) == (False, -1.0)
        assert credit(ToolCall(name="add_stock", arguments={"item": other, "quantity": 1})) == (False, 0.0)
    finally:
        env.close()


def _sentence_pattern(wording: str) -> re.Pattern:
    """A wording template as a regex over instructions (`{n}` a number, `{item}` a word)."""
    return re.compile(re.escape(wording).replace(r"\{n\}", r"\d+").replace(r"\{item\}", r"[a-z]+"))


def test_train_tasks_use_every_train_wording_and_never_a_held_out_one():
    from toolgym.envs.families.mcp_inventory import WORDINGS

    suite = builtin_suite("mcp-inventory")
    train = [t.instruction for t in suite.split("train").tasks]
    held = [t.instruction for t in suite.split("held-out").tasks]
    for kind, wordings in WORDINGS["train"].items():
        assert len(wordings) > 1, kind
        for wording in wordings:
            pattern = _sentence_pattern(wording)
            assert any(pattern.search(text) for text in train), f"{kind}: {wording!r} never used"
            assert not any(pattern.search(text) for text in held), f"train wording in held-out: {wording!r}"
    for wording in (w for ws in WORDINGS["held-out"].values() for w in ws):
        pattern = _sentence_pattern(wording)
        assert any(pattern.search(text) for text in held), wording
        assert not any(pattern.search(text) for text in train), f"held-out wording in train: {wording!r}"
