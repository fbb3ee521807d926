"""The `orders` MCP server: a parts catalog and the purchase orders placed against it, over stdio.

Runs inside the episode's sandbox (standard library only), one process per episode, and speaks
MCP's stdio transport (one JSON-RPC message per line: `initialize`, `ping`, `tools/list`,
`tools/call`). The catalog (`/workspace/catalog.json`, part name -> part number) is read once;
orders live in memory and are written through to `/workspace/orders.json` after every change
(what grading reads). A part is ordered by its number, which only `find_part` shows.
"""

import json
import os
import socket
import sys

CATALOG = "/workspace/catalog.json"
ORDERS = "/workspace/orders.json"
SUPPORTED_VERSIONS = ("2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05")

PART = {"type": "string", "description": "the part number, as `find_part` shows it"}
TOOLS = [
    # the read ignores arguments it does not know (a lenient lookup: the answer is the same
    # whatever else the caller passed), where the writes refuse them
    {"name": "find_part", "description": "Look up a part in the catalog by its name: its part number.",
     "inputSchema": {"type": "object", "properties": {
         "name": {"type": "string", "description": "the part's name, e.g. as the order names it"}},
         "required": ["name"]}},
    {"name": "place_order", "description": "Order units of a part, by its part number.",
     "inputSchema": {"type": "object", "properties": {
         "part_number": PART,
         "quantity": {"type": "integer", "minimum": 1, "description": "how many units (at least 1)"}},
         "required": ["part_number", "quantity"], "additionalProperties": False}},
    {"name": "cancel_order", "description": "Cancel an order placed in this session, by its order id.",
     "inputSchema": {"type": "object", "properties": {
         "order_id": {"type": "integer", "description": "the id `place_order` returned"}},
         "required": ["order_id"], "additionalProperties": False}},
    {"name": "lead_time", "description": "Ask the part's supplier how long a delivery takes (contacts "
                                         "the supplier's server).",
     "inputSchema": {"type": "object", "properties": {"part_number": PART}, "required": ["part_number"],
                     "additionalProperties": False}},
]


class ToolFailure(Exception):
    """A call the server refuses; its message is the tool error the client sees."""


class Orders:
    """The catalog and this session's orders (written through to `ORDERS`)."""

    def __init__(self):
        with open(CATALOG) as f:
            self.catalog = json.load(f)
        self.names = {number: name for name, number in self.catalog.items()}
        self.orders = []
        self.next_id = 1

    def save(self):
        tmp = ORDERS + ".tmp"
        with open(tmp, "w") as f:
            f.write(json.dumps(self.orders, indent=2) + "\n")
        os.replace(tmp, ORDERS)

    def _part(self, args):
        number = args.get("part_number")
        if not isinstance(number, str) or number not in self.names:
            # no number here: reading it is `find_part`'s job
            raise ToolFailure(f"no part numbered {number!r}; find_part shows a part's number")
        return number

    def call(self, name, args):
        if name == "find_part":
            part = args.get("name")
            if not isinstance(part, str) or part.strip().lower() not in self.catalog:
                # the names only: a number is read from its own part's line
                raise ToolFailure(f"no part named {part!r}; the catalog has: {', '.join(sorted(self.catalog))}")
            part = part.strip().lower()
            return f"{part}: part number {self.catalog[part]}"
        if name == "place_order":
            number, quantity = self._part(args), args.get("quantity")
            if type(quantity) is not int or quantity < 1:
                raise ToolFailure("`quantity` must be an integer of at least 1")
            order = {"id": self.next_id, "part_number": number, "quantity": quantity}
            self.orders.append(order)
            self.next_id += 1
            self.save()
            return f"order {order['id']}: {quantity} x {number} ({self.names[number]})"
        if name == "cancel_order":
            ident = args.get("order_id")
            kept = [o for o in self.orders if o["id"] != ident]
            if len(kept) == len(self.orders):
                raise ToolFailure(f"no order with id {ident!r} in this session")
            self.orders = kept
            self.save()
            return f"order {ident} cancelled"
        if name == "lead_time":
            number = self._part(args)
            try:  # the sandbox has no network: the attempt is refused, and the ledger records it
                socket.create_connection(("supplier.example.com", 443), timeout=2).close()
            except OSError as err:
                return f"the supplier of {number} could not be reached ({type(err).__name__})"
            return f"the supplier of {number} answered"
        raise ToolFailure(f"unknown tool {name!r}")


def answer(message, orders):
    """The response to one request (None for a notification)."""
    method, ident, params = message.get("method"), message.get("id"), message.get("params") or {}
    if ident is None:
        return None
    if method == "initialize":
        asked = params.get("protocolVersion")
        result = {"protocolVersion": asked if asked in SUPPORTED_VERSIONS else SUPPORTED_VERSIONS[0],
                  "capabilities": {"tools": {"listChanged": False}},
                  "serverInfo": {"name": "orders", "version": "1.0"}}
    elif method == "ping":
        result = {}
    elif method == "tools/list":
        result = {"tools": TOOLS}
    elif method == "tools/call":
        name, args = params.get("name"), params.get("arguments") or {}
        if name not in {t["name"] for t in TOOLS}:
            return {"jsonrpc": "2.0", "id": ident, "error": {"code": -32602, "message": f"unknown tool: {name}"}}
        try:
            result = {"content": [{"type": "text", "text": orders.call(name, args)}], "isError": False}
        except ToolFailure as err:
            result = {"content": [{"type": "text", "text": str(err)}], "isError": True}
    else:
        return {"jsonrpc": "2.0", "id": ident, "error": {"code": -32601, "message": f"method not found: {method}"}}
    return {"jsonrpc": "2.0", "id": ident, "result": result}


def main():
    orders = Orders()
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            message = json.loads(line)
        except ValueError:
            reply = {"jsonrpc": "2.0", "id": None, "error": {"code": -32700, "message": "parse error"}}
        else:
            reply = answer(message, orders) if isinstance(message, dict) else None
        if reply is not None:
            sys.stdout.write(json.dumps(reply) + "\n")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
