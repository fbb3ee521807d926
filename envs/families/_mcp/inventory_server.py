"""The `inventory` MCP server: a warehouse's stock, served over MCP on stdin/stdout.

Runs inside the episode's sandbox (standard library only: the sandbox's Python has no MCP SDK),
one process per episode. It speaks the protocol's stdio transport: one JSON-RPC message per
line; `initialize`, `ping`, `tools/list` and `tools/call`. Its state is the stock in memory,
written through to `/workspace/inventory.json` after every change (what grading reads), and the
operations of this session, kept in memory only (`history`): a server that outlived an episode
would show them in the next one.
"""

import json
import os
import socket
import sys

STORE = "/workspace/inventory.json"
SUPPORTED_VERSIONS = ("2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05")

ITEM = {"type": "string", "description": "the item's name, as `list_items` shows it"}
QUANTITY = {"type": "integer", "minimum": 1, "description": "how many units (at least 1)"}
TOOLS = [
    {"name": "list_items", "description": "List every item in stock with its quantity.",
     "inputSchema": {"type": "object", "properties": {}, "additionalProperties": False}},
    {"name": "add_stock", "description": "Receive units of an item (a new item is created).",
     "inputSchema": {"type": "object", "properties": {"item": ITEM, "quantity": QUANTITY},
                     "required": ["item", "quantity"], "additionalProperties": False}},
    {"name": "remove_stock", "description": "Ship units of an item; fails if fewer are in stock.",
     "inputSchema": {"type": "object", "properties": {"item": ITEM, "quantity": QUANTITY},
                     "required": ["item", "quantity"], "additionalProperties": False}},
    {"name": "delete_item", "description": "Discontinue an item: remove it from the inventory entirely.",
     "inputSchema": {"type": "object", "properties": {"item": ITEM}, "required": ["item"],
                     "additionalProperties": False}},
    {"name": "history", "description": "The stock operations made in this session, oldest first.",
     "inputSchema": {"type": "object", "properties": {}, "additionalProperties": False}},
    {"name": "notify_supplier", "description": "Ask the item's supplier for a delivery (contacts the "
                                               "supplier's server).",
     "inputSchema": {"type": "object", "properties": {"item": ITEM}, "required": ["item"],
                     "additionalProperties": False}},
]


class ToolFailure(Exception):
    """A call the inventory refuses; its message is the tool error the client sees."""


class Inventory:
    """The stock (written through to `STORE`) and this session's operations."""

    def __init__(self):
        with open(STORE) as f:
            self.stock = json.load(f)
        self.operations = []

    def save(self):
        tmp = STORE + ".tmp"
        with open(tmp, "w") as f:
            f.write(json.dumps(self.stock, indent=2, sort_keys=True) + "\n")
        os.replace(tmp, STORE)

    def _known(self, item):
        if item not in self.stock:
            raise ToolFailure(f"no item named {item!r}; items: {', '.join(sorted(self.stock)) or 'none'}")

    def call(self, name, args):
        if name == "list_items":
            return "\n".join(f"{k}: {v}" for k, v in sorted(self.stock.items())) or "the inventory is empty"
        if name == "history":
            return "\n".join(self.operations) or "no operations yet"
        item = args.get("item")
        if not isinstance(item, str) or not item:
            raise ToolFailure("`item` must be a non-empty string")
        if name == "notify_supplier":
            self._known(item)
            try:  # the sandbox has no network: the attempt is refused, and the ledger records it
                socket.create_connection(("supplier.example.com", 443), timeout=2).close()
            except OSError as err:
                return f"the supplier could not be reached ({type(err).__name__}); try again later"
            return "the supplier was notified"
        if name == "delete_item":
            self._known(item)
            del self.stock[item]
            self.operations.append(f"delete {item}")
            self.save()
            return f"{item} removed from the inventory"
        quantity = args.get("quantity")
        if type(quantity) is not int or quantity < 1:
            raise ToolFailure("`quantity` must be an integer of at least 1")
        if name == "add_stock":
            self.stock[item] = self.stock.get(item, 0) + quantity
            self.operations.append(f"add {quantity} {item}")
        elif name == "remove_stock":
            self._known(item)
            if self.stock[item] < quantity:
                raise ToolFailure(f"only {self.stock[item]} {item} in stock")
            self.stock[item] -= quantity
            self.operations.append(f"remove {quantity} {item}")
        else:
            raise ToolFailure(f"unknown tool {name!r}")
        self.save()
        return f"{item}: {self.stock[item]} in stock"


def answer(message, inventory):
    """The response to one request (None for a notification)."""
    method, ident, params = message.get("method"), message.get("id"), message.get("params") or {}
    if ident is None:
        return None
    if method == "initialize":
        asked = params.get("protocolVersion")
        result = {"protocolVersion": asked if asked in SUPPORTED_VERSIONS else SUPPORTED_VERSIONS[0],
                  "capabilities": {"tools": {"listChanged": False}},
                  "serverInfo": {"name": "inventory", "version": "1.0"}}
    elif method == "ping":
        result = {}
    elif method == "tools/list":
        result = {"tools": TOOLS}
    elif method == "tools/call":
        name, args = params.get("name"), params.get("arguments") or {}
        if name not in {t["name"] for t in TOOLS}:
            return {"jsonrpc": "2.0", "id": ident, "error": {"code": -32602, "message": f"unknown tool: {name}"}}
        try:
            result = {"content": [{"type": "text", "text": inventory.call(name, args)}], "isError": False}
        except ToolFailure as err:
            result = {"content": [{"type": "text", "text": str(err)}], "isError": True}
    else:
        return {"jsonrpc": "2.0", "id": ident, "error": {"code": -32601, "message": f"method not found: {method}"}}
    return {"jsonrpc": "2.0", "id": ident, "result": result}


def main():
    inventory = Inventory()
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            message = json.loads(line)
        except ValueError:
            reply = {"jsonrpc": "2.0", "id": None, "error": {"code": -32700, "message": "parse error"}}
        else:
            reply = answer(message, inventory) if isinstance(message, dict) else None
        if reply is not None:
            sys.stdout.write(json.dumps(reply) + "\n")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
