"""mcp-orders: parts ordered by the numbers only `find_part` shows, through the `orders` MCP server
in a real sandbox, graded by its hidden checker from `orders.json`."""

from __future__ import annotations

import json
import re

import pytest

import toolgym
from toolgym.tasks import ToolCall, builtin_suite


def _call(tool: str, **arguments) -> str:
    return ToolCall(name=tool, arguments=arguments).to_text()


def _task(split: str = "train", parts: int = 1):
    return next(t for t in builtin_suite("mcp-orders").split(split).tasks if t.difficulty == parts)


@pytest.fixture
def env(backend):
    env = toolgym.make("mcp-orders-v0", backend=backend).unwrapped
    yield env
    env.close()


def test_the_number_is_read_then_ordered_and_the_oracle_passes_in_three_turns(env):
    task = _task(parts=2)
    obs, info = env.reset(options={"task": task})
    assert [t["function"]["name"] for t in info["tools"]] == ["find_part", "place_order", "cancel_order", "lead_time", "submit"]
    catalog = json.loads(task.workspace["catalog.json"])
    first = task.metadata["asked"][0]
    assert not any(catalog[p] in obs for p in task.metadata["asked"])  # the numbers are not in the prompt
    # the lookup ignores arguments it does not know; a name not in the catalog lists the names only
    found = env.step(_call("find_part", name=first, quantity=3))[0]
    assert found == f"{first}: part number {catalog[first]}"
    missing = env.step(_call("find_part", name="anvils"))[0]
    assert "no part named" in missing and first in missing and catalog[first] not in missing
    turns = task.oracle_turns()
    assert len(turns) == 3
    total = sum(env.step(action)[1] for action in turns[1:])
    assert total == 1.0


def test_the_state_is_graded_without_submit_and_a_part_name_is_not_a_number(env):
    task = _task(parts=1)
    (part,), number = task.metadata["asked"], task.oracle[1].arguments["part_number"]
    quantity = task.oracle[1].arguments["quantity"]
    env.reset(options={"task": task})
    obs = env.step(_call("place_order", part_number=part, quantity=quantity))[0]
    assert "no part numbered" in obs and "find_part" in obs and number not in obs
    assert not env.verdict().passed  # nothing ordered
    env.step(_call("place_order", part_number=number, quantity=quantity))
    assert env.verdict().passed  # out of turns or not, the orders placed are what is graded


def test_a_wrong_quantity_earns_half_credit_and_an_unasked_part_voids_every_check(env):
    task = _task(parts=1)
    number, quantity = task.oracle[1].arguments["part_number"], task.oracle[1].arguments["quantity"]
    other = next(n for n in json.loads(task.workspace["catalog.json"]).values() if n != number)
    env.reset(options={"task": task})
    env.step(_call("place_order", part_number=number, quantity=quantity + 1))
    verdict = env.verdict()
    assert not verdict.passed and verdict.details["partial_credit"] == 0.5
    env.reset(options={"task": task})
    env.step(_call("place_order", part_number=number, quantity=quantity))
    env.step(_call("place_order", part_number=other, quantity=1))
    verdict = env.verdict()
    assert not verdict.passed and verdict.details["partial_credit"] == 0.0
    env.reset(options={"task": task})  # a cancelled order is no order
    env.step(_call("place_order", part_number=other, quantity=1))
    env.step(_call("cancel_order", order_id=1))
    env.step(_call("place_order", part_number=number, quantity=quantity))
    assert env.verdict().passed


def test_asking_the_supplier_is_a_recorded_network_attempt(env):
    task = _task()
    env.reset(options={"task": task})
    obs = env.step(_call("lead_time", part_number=task.oracle[1].arguments["part_number"]))[0]
    assert "could not be reached" in obs
    info = env.step(_call("submit"))[4]
    assert [e["kind"] for e in info["side_effects"]] == ["network_attempt"]


def test_held_out_parts_and_wording_never_occur_in_train():
    from toolgym.envs.families.mcp_orders import PARTS, WORDINGS

    suite = builtin_suite("mcp-orders")
    train, held = suite.split("train").tasks, suite.split("held-out").tasks
    assert not set(PARTS["train"]) & set(PARTS["held-out"])
    assert all(p in PARTS["held-out"] for t in held for p in t.metadata["asked"])
    pattern = re.compile(re.escape(WORDINGS["held-out"][0]).replace(r"\{n\}", r"\d+").replace(r"\{part\}", r"[a-z]+"))
    assert all(pattern.search(t.instruction) for t in held)
    assert not any(pattern.search(t.instruction) for t in train)
    numbers = {json.dumps(sorted(json.loads(t.workspace["catalog.json"]).values())) for t in train[:50]}
    assert len(numbers) == 50  # every task draws its own catalog numbers


def test_toolgym_check_passes_on_mcp_orders():
    from conftest import run_cli

    result = run_cli("check", "mcp-orders-v0", "--tasks", "3")
    assert result.returncode == 0, result.stdout + result.stderr
    for check in ("oracle[train]", "oracle[held-out]", "reset[train]", "do-nothing[held-out]"):
        assert f"PASS {check}" in result.stdout
