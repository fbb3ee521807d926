"""`mcp-inventory`: keep a warehouse's stock with the tools of an MCP server in the sandbox.

The agent's only tools are those the `inventory` MCP server offers (`list_items`, `add_stock`,
`remove_stock`, `delete_item`, `history`, `notify_supplier`) and `submit`. The server
(`_mcp/inventory_server.py`, standard library only) starts in the sandbox at every reset and
keeps the stock in memory and in `inventory.json`; a hidden state checker compares that file
with the expected stock, one check per item the task asks to change (any other item changed fails
them all). A failed check reports how far its item moved toward the target (`credit`, training
only): 0 where it started, 1 at the target, below 0 for a change the wrong way. Tasks ask for one
to three changes; "exactly N in stock" needs a look at the current stock first (the instruction
never shows it). Held-out tasks use other items, and
one wording per kind that train tasks (four wordings per kind) never use.
"""

from __future__ import annotations

import json
from importlib import resources

import numpy as np

from toolgym.envs.mcp_tools import MCPSandboxEnv
from toolgym.envs.registry import register_env
from toolgym.tasks import HELDOUT, HiddenSpec, SuiteSpec, Task, ToolCall, register_suite

SUITE = "mcp-inventory"
SERVER_PATH = ".mcp/inventory_server.py"
#: `-I`: the server ignores PYTHON* variables and the workspace is not on its import path.
SERVER = {"command": f"python3 -I {SERVER_PATH}", "state_tools": ["list_items", "history"]}

ITEMS = {
    "train": ["bolts", "nuts", "washers", "screws", "hinges", "brackets", "rivets", "springs", "gaskets", "clamps"],
    HELDOUT: ["pulleys", "bearings", "couplings", "sprockets", "valves", "fuses", "castors", "latches"],
}
#: Train tasks draw each sentence from several wordings per kind, so the reward teaches the kind of
#: change and not one sentence; held-out tasks use one other wording per kind that train never shows.
WORDINGS = {
    "train": {
        "receive": (
            "Receive {n} {item}.",
            "{n} more {item} were delivered; put them in stock.",
            "Book in a shipment of {n} {item}.",
            "Increase the stock of {item} by {n}.",
        ),
        "ship": (
            "Ship {n} {item}.",
            "A customer ordered {n} {item}: take them out of stock.",
            "Dispatch {n} {item} to a customer.",
            "Lower the stock of {item} by {n}.",
        ),
        "discontinue": (
            "Discontinue {item}.",
            "Stop carrying {item}: drop them from the inventory.",
            "Remove {item} from the inventory entirely.",
            "{item} are retired; delete the item.",
        ),
        "exact": (
            "Make sure exactly {n} {item} are in stock.",
            "After a recount, the stock of {item} should read {n}.",
            "Set the stock of {item} to {n}.",
            "Bring {item} to a total of {n} units.",
        ),
        "new": (
            "Start stocking {item}: receive {n}.",
            "Add a new item, {item}, with {n} units.",
            "{n} {item} arrived, an item we never had before; stock them.",
            "Begin carrying {item} with {n} in stock.",
        ),
    },
    HELDOUT: {
        "receive": ("A delivery of {n} {item} arrived: add it to the stock.",),
        "ship": ("Send {n} {item} out of the warehouse.",),
        "discontinue": ("{item} are no longer sold: take them out of the inventory.",),
        "exact": ("The stock of {item} must end at {n}, no more and no fewer.",),
        "new": ("We now carry {item}; {n} of them came in today.",),
    },
}
KINDS = ("receive", "ship", "discontinue", "exact", "new")

#: The hidden stock checker: one check per asked item, passed when its count is right and no other
#: item changed. A failed check's `credit` is the share of the way from the start count to the
#: target that the item moved (an absent item counts as 0; the wrong presence caps it at 0.5), in
#: [-1, 1]: shipping some of the asked units earns some, receiving units that should have shipped
#: loses some, and touching an item never asked about voids every credit (0).
STOCK_CHECKER = '''"""Hidden stock checker (generated)."""
import json, sys
SPEC = json.loads(%r)
out = open(sys.argv[1], "w")
def report(item, ok, credit, message=""):
    out.write(json.dumps({"name": "stock:" + item, "passed": ok, "credit": credit, "message": message}) + "\\n")
def progress(start, got, want):
    if got is not None and (type(got) is not int):  # only the server writes the file; never trust it
        return 0.0
    gone = abs((0 if got is None else got) - (0 if want is None else want))
    whole = abs((0 if start is None else start) - (0 if want is None else want))
    share = max(-1.0, min(1.0, 1.0 - gone / max(whole, 1)))
    return share if (got is None) == (want is None) else min(share, 0.5)
try:
    with open("inventory.json") as f:
        got = json.load(f)
    assert isinstance(got, dict)
except (OSError, ValueError, AssertionError) as err:
    got, broken = {}, "inventory.json is not a JSON object: %%s" %% err
else:
    broken = ""
start, want, asked = SPEC["start"], SPEC["expected"], SPEC["asked"]
stray = sorted(k for k in set(got) | set(want) if k not in asked and got.get(k) != want.get(k))
for item in asked:
    right = got.get(item) == want.get(item) and not stray and not broken
    if right:
        report(item, True, 1.0)
    elif broken or stray:
        report(item, False, 0.0, broken or "unasked items changed: %%s" %% stray)
    else:
        report(item, False, progress(start.get(item), got.get(item), want.get(item)), "got %%r, want %%r" %% (got.get(item), want.get(item)))
out.close()
'''


def server_source() -> str:
    """The inventory MCP server's source (it is copied into every task's workspace)."""
    return resources.files("toolgym.envs.families").joinpath("_mcp", "inventory_server.py").read_text()


def stock_text(stock: dict[str, int]) -> str:
    """`inventory.json` as the server writes it."""
    return json.dumps(stock, indent=2, sort_keys=True) + "\n"


def generate_mcp_inventory_task(seed: int, index: int, split: str = "train") -> Task:
    """Deterministic `(seed, index, split) -> Task` for mcp-inventory."""
    rng = np.random.default_rng([seed, index, 23])
    # a stream of its own for the wordings, so the stock and the changes do not depend on them
    wording_rng = np.random.default_rng([seed, index, 29])
    key = HELDOUT if split == HELDOUT else "train"
    names = [str(n) for n in rng.permutation(ITEMS[key])]
    stocked, spare = names[: int(rng.integers(3, 6))], names[6:]
    stock = {item: int(rng.integers(4, 60)) for item in stocked}
    final = dict(stock)
    n_ops = 1 + index % 3
    kinds = [KINDS[(index // 3 + i) % len(KINDS)] for i in range(n_ops)]
    if not spare:
        kinds = [k if k != "new" else "receive" for k in kinds]
    sentences, calls = [], []
    free = [item for item in stocked]
    for kind in kinds:
        item = spare.pop(0) if kind == "new" else free.pop(int(rng.integers(len(free))))
        if kind in ("receive", "new"):
            n = int(rng.integers(1, 40))
            final[item] = final.get(item, 0) + n
            calls.append(ToolCall(name="add_stock", arguments={"item": item, "quantity": n}))
        elif kind == "ship":
            n = int(rng.integers(1, stock[item] + 1))
            final[item] -= n
            calls.append(ToolCall(name="remove_stock", arguments={"item": item, "quantity": n}))
        elif kind == "discontinue":
            n = 0
            del final[item]
            calls.append(ToolCall(name="delete_item", arguments={"item": item}))
        else:  # exact: a target other than the current count, reached by adding or removing
            n = int(rng.integers(0, 80))
            if n == stock[item]:
                n += 1
            final[item] = n
            diff = n - stock[item]
            calls.append(ToolCall(name="add_stock" if diff > 0 else "remove_stock", arguments={"item": item, "quantity": abs(diff)}))
        wordings = WORDINGS[key][kind]
        sentences.append(wordings[int(wording_rng.integers(len(wordings)))].format(n=n, item=item))
    # the tools are listed below the instruction by their own names (an earlier wording spoke of
    # "the `inventory` tools", and models called a tool named `inventory`, which does not exist)
    instruction = " ".join(sentences) + " Change the stock with the tools listed below; call `submit` when the stock is right."
    # one check per asked item (right count, nothing else touched), so a failure that got one of
    # two changes right shows as 1/2 in the verdict's partial credit; a pass is the exact stock
    asked = [str(c.arguments["item"]) for c in calls]
    spec = {"start": stock, "expected": final, "asked": asked}
    return Task(
        env_id="toolgym/mcp-inventory-v0",
        instruction=instruction,
        family=f"mcp-inventory/{'+'.join(sorted(set(kinds)))}" if n_ops > 1 else f"mcp-inventory/{kinds[0]}",
        difficulty=n_ops + ("exact" in kinds),
        split=split,
        workspace={"inventory.json": stock_text(stock), SERVER_PATH: server_source()},
        hidden=HiddenSpec(kind="state", files={"check.py": STOCK_CHECKER % json.dumps(spec)}, protected=(".mcp",), timeout_s=30),
        oracle=tuple(calls) + (ToolCall(name="submit", arguments={}),),
        data={"mcp_server": SERVER},
        metadata={"kinds": kinds, "seed": seed, "index": index},
    )


register_suite(
    SuiteSpec(
        name=SUITE,
        generator=generate_mcp_inventory_task,
        train_size=240,
        # `toolgym demo --sandboxed` evaluates the first 60 held-out tasks at every stage; 60-119
        # are a later slice no stage evaluates (`bench/later_heldout.py --suite mcp-inventory --skip 60`)
        heldout_size=120,
        # 2: train tasks draw from four wordings per kind (1 had one); held-out tasks are unchanged
        # 3: the stock checker reports each failed check's progress toward its target (`credit`)
        version="3",
        description="stock changes through the tools of an MCP server in the sandbox; hidden state checker",
    )
)


@register_env("mcp-inventory-v0", suite=SUITE)
class MCPInventoryEnv(MCPSandboxEnv):
    """Change a warehouse's stock with the tools of its MCP server; graded by a hidden checker."""

    default_suite = SUITE
    max_turns = 12


__all__ = ["STOCK_CHECKER", "WORDINGS", "MCPInventoryEnv", "generate_mcp_inventory_task", "server_source", "stock_text"]
