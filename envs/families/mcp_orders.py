"""`mcp-orders`: order parts by their part numbers with the tools of an MCP server in the sandbox.

Every task needs a read before its write. The sentence names a part ("Order 7 castors."), but
`place_order` takes a part number, and only `find_part` (by name) shows a number: each task
draws its own catalog of five to seven parts with fresh random numbers, so a number is never
worth remembering, only reading. The agent's tools are the `orders` MCP server's (`find_part`,
`place_order`, `cancel_order`, `lead_time`) and `submit`; the server
(`_mcp/orders_server.py`, standard library only) starts in the sandbox at every reset and writes
the orders through to `orders.json`. `lead_time` contacts the supplier's server: a network
attempt the sandbox refuses and the side-effect ledger records.

A hidden state checker reads `orders.json`: one check per asked part, passed when that part's
ordered total is the asked quantity and no part that was not asked for was ordered (such an
order fails every check). Tasks ask for one or two parts. Held-out tasks use other part names
and a wording that train tasks never use.

Why it exists: mcp-inventory's write tool depends on what the sentence means (receive, ship,
discontinue), which SmolLM2-135M never learned from its reward (docs/results, 2026-12-03 to
2026-12-07). Here the write tool is always the same, and what decides the episode is the
observation: the number on the line of the part the sentence names.
"""

from __future__ import annotations

import json
from importlib import resources

import numpy as np

from toolgym.envs.mcp_tools import MCPSandboxEnv
from toolgym.envs.registry import register_env
from toolgym.tasks import HELDOUT, HiddenSpec, SuiteSpec, Task, ToolCall, register_suite

SUITE = "mcp-orders"
SERVER_PATH = ".mcp/orders_server.py"
#: `-I`: the server ignores PYTHON* variables and the workspace is not on its import path.
SERVER = {"command": f"python3 -I {SERVER_PATH}"}

PARTS = {
    "train": ["bolts", "nuts", "washers", "screws", "hinges", "brackets", "rivets", "springs", "gaskets", "clamps", "dowels", "shims"],
    HELDOUT: ["pulleys", "bearings", "couplings", "sprockets", "valves", "fuses", "castors", "latches"],
}
#: Train tasks draw each sentence from several wordings; held-out tasks use one that train never shows.
WORDINGS = {
    "train": ("Order {n} {part}.", "We are running out of {part}: order {n}.", "Place an order for {n} {part}.", "Buy {n} {part}."),
    HELDOUT: ("Please put in a purchase order for {n} {part}.",),
}

#: The hidden orders checker: one check per asked part number, passed when its ordered total is
#: the asked quantity and nothing unasked was ordered. A failed check's `credit` (training only)
#: is 0.5 when the right part was ordered in the wrong quantity, else 0.
ORDERS_CHECKER = '''"""Hidden orders checker (generated)."""
import json, sys
SPEC = json.loads(%r)
out = open(sys.argv[1], "w")
def report(part, ok, credit, message=""):
    out.write(json.dumps({"name": "order:" + part, "passed": ok, "credit": credit, "message": message}) + "\\n")
try:
    with open("orders.json") as f:
        orders = json.load(f)
    assert isinstance(orders, list)
    totals = {}
    for order in orders:  # only the server writes the file; never trust it
        number, quantity = order["part_number"], order["quantity"]
        assert isinstance(number, str) and type(quantity) is int
        totals[number] = totals.get(number, 0) + quantity
except (OSError, ValueError, AssertionError, KeyError, TypeError) as err:
    totals, broken = {}, "orders.json is not a list of orders: %%s" %% err
else:
    broken = ""
want = SPEC["orders"]
stray = sorted(number for number in totals if number not in want)
for number, quantity in sorted(want.items()):
    got = totals.get(number, 0)
    if got == quantity and not stray and not broken:
        report(number, True, 1.0)
    elif broken or stray:
        report(number, False, 0.0, broken or "parts not asked for were ordered: %%s" %% stray)
    else:
        report(number, False, 0.5 if got else 0.0, "ordered %%d, want %%d" %% (got, quantity))
out.close()
'''


def server_source() -> str:
    """The orders MCP server's source (it is copied into every task's workspace)."""
    return resources.files("toolgym.envs.families").joinpath("_mcp", "orders_server.py").read_text()


def generate_mcp_orders_task(seed: int, index: int, split: str = "train") -> Task:
    """Deterministic `(seed, index, split) -> Task` for mcp-orders."""
    rng = np.random.default_rng([seed, index, 31])
    key = HELDOUT if split == HELDOUT else "train"
    names = [str(n) for n in rng.permutation(PARTS[key])][: int(rng.integers(5, 8))]
    numbers = [f"P-{int(x)}" for x in rng.choice(np.arange(1000, 10000), size=len(names), replace=False)]
    catalog = dict(zip(names, numbers))
    asked = [names[int(i)] for i in rng.choice(len(names), size=1 + index % 2, replace=False)]
    quantities = [int(rng.integers(2, 50)) for _ in asked]
    wordings = WORDINGS[key]
    sentences = [wordings[int(rng.integers(len(wordings)))].format(n=n, part=part) for part, n in zip(asked, quantities)]
    instruction = " ".join(sentences) + " Use the tools listed below; call `submit` when the orders are placed."
    orders = [ToolCall(name="place_order", arguments={"part_number": catalog[p], "quantity": n}) for p, n in zip(asked, quantities)]
    reads = [ToolCall(name="find_part", arguments={"name": p}) for p in asked]
    done = ToolCall(name="submit", arguments={})
    spec = {"orders": {catalog[p]: n for p, n in zip(asked, quantities)}}
    return Task(
        env_id="toolgym/mcp-orders-v0",
        instruction=instruction,
        family=f"mcp-orders/{len(asked)}-part",
        difficulty=len(asked),
        split=split,
        workspace={"catalog.json": json.dumps(catalog, indent=2) + "\n", "orders.json": "[]\n", SERVER_PATH: server_source()},
        hidden=HiddenSpec(kind="state", files={"check.py": ORDERS_CHECKER % json.dumps(spec)}, protected=(".mcp",), timeout_s=30),
        oracle=(*reads, *orders, done),
        data={"mcp_server": SERVER},
        # the oracle in three turns (every read; every order; submit), so it fits the budget of
        # the sandboxed main job (two turns; the state is graded whether or not `submit` came)
        metadata={
            "asked": asked,
            "seed": seed,
            "index": index,
            "oracle_texts": ["\n".join(c.to_text() for c in reads), "\n".join(c.to_text() for c in orders), done.to_text()],
        },
    )


register_suite(
    SuiteSpec(
        name=SUITE,
        generator=generate_mcp_orders_task,
        train_size=240,
        heldout_size=120,
        version="1",
        description="order parts by the numbers only a read shows, through an MCP server in the sandbox; hidden state checker",
    )
)


@register_env("mcp-orders-v0", suite=SUITE)
class MCPOrdersEnv(MCPSandboxEnv):
    """Order parts by their part numbers with the tools of an MCP server; graded by a hidden checker."""

    default_suite = SUITE
    max_turns = 8


__all__ = ["ORDERS_CHECKER", "WORDINGS", "MCPOrdersEnv", "generate_mcp_orders_task", "server_source"]
