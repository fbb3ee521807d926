"""Parse tool calls out of a model's raw text (Hermes/Qwen `<tool_call>{json}</tool_call>` blocks).

Parsing never raises: every problem becomes a `CallError` with a class (for counting) and a
message that tells the model exactly what was wrong.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from toolgym.tasks import ToolCall

OPEN, CLOSE = "<tool_call>", "</tool_call>"

#: The classes of malformed calls, counted in `info["errors"]`.
ERROR_CLASSES = ("no_tool_call", "parse_error", "unknown_tool", "invalid_arguments", "tool_error")


@dataclass
class CallError:
    """One malformed or failed call: `kind` is one of `ERROR_CLASSES`."""

    kind: str
    message: str
    call: ToolCall | None = None


@dataclass
class ParsedAction:
    """The outcome of parsing one action: calls in order, parse errors, and the free text."""

    calls: list[ToolCall] = field(default_factory=list)
    errors: list[CallError] = field(default_factory=list)
    content: str = ""


def _coerce_call(obj: Any, index: int) -> ToolCall | CallError:
    where = f"tool call #{index}"
    if not isinstance(obj, dict):
        return CallError(
            "parse_error", f'{where}: expected a JSON object like {{"name": "...", "arguments": {{...}}}}, got ' + type(obj).__name__
        )
    if "function" in obj and isinstance(obj["function"], dict):  # OpenAI-style nesting
        obj = obj["function"]
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return CallError("parse_error", f'{where}: missing "name" (a string naming the tool)')
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # some models emit arguments as a JSON string
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError as err:
            return CallError(
                "parse_error", f'{where} ({name}): "arguments" is a string that is not valid JSON ({err.msg} at char {err.pos})'
            )
    if args is None:
        args = {}
    if not isinstance(args, dict):
        return CallError("parse_error", f'{where} ({name}): "arguments" must be a JSON object, got {type(args).__name__}')
    extra = set(obj) - {"name", "arguments", "parameters", "id", "type"}
    if extra:
        return CallError("parse_error", f'{where} ({name}): unexpected key(s) {sorted(extra)}; put tool arguments inside "arguments"')
    return ToolCall(name=name, arguments=args)


def parse_tool_calls(text: str) -> ParsedAction:
    """Extract every `<tool_call>` block from `text`; never raises."""
    result = ParsedAction()
    pos, index, free = 0, 0, []
    while True:
        start = text.find(OPEN, pos)
        if start < 0:
            free.append(text[pos:])
            break
        free.append(text[pos:start])
        end = text.find(CLOSE, start)
        index += 1
        if end < 0:
            result.errors.append(CallError("parse_error", f"tool call #{index}: {OPEN} is never closed with {CLOSE}"))
            break
        body = text[start + len(OPEN) : end].strip()
        pos = end + len(CLOSE)
        try:
            obj = json.loads(body)
        except json.JSONDecodeError as err:
            result.errors.append(
                CallError(
                    "parse_error", f"tool call #{index}: invalid JSON ({err.msg} at line {err.lineno} column {err.colno}): {body[:80]!r}"
                )
            )
            continue
        parsed = _coerce_call(obj, index)
        (result.errors if isinstance(parsed, CallError) else result.calls).append(parsed)
    result.content = "".join(free).strip()
    if CLOSE in result.content:
        result.errors.append(CallError("parse_error", f"found {CLOSE} without a matching {OPEN}"))
    return result


def coerce_action(action: Any) -> ParsedAction:
    """Accept raw text, a `ToolCall`, a dict, or a list of those; return a `ParsedAction`."""
    if isinstance(action, str):
        return parse_tool_calls(action)
    items = action if isinstance(action, (list, tuple)) else [action]
    result = ParsedAction()
    for i, item in enumerate(items, 1):
        if isinstance(item, ToolCall):
            result.calls.append(item)
            continue
        parsed = _coerce_call(item, i)
        (result.errors if isinstance(parsed, CallError) else result.calls).append(parsed)
    return result


_CMD = re.compile(r"^\s*(\w[\w\-]*)\s*(.*)$", re.S)


def parse_command_line(line: str) -> ParsedAction:
    """Parse a person's typed call: `name key=value ...`, `name {json}`, or raw `<tool_call>` text."""
    import shlex

    if OPEN in line:
        return parse_tool_calls(line)
    m = _CMD.match(line)
    if not m:
        return ParsedAction(errors=[CallError("parse_error", "type a tool name followed by key=value arguments")])
    name, rest = m.group(1), m.group(2).strip()
    if rest.startswith("{"):
        return coerce_action({"name": name, "arguments": rest})
    args: dict[str, Any] = {}
    try:
        tokens = shlex.split(rest)
    except ValueError as err:
        return ParsedAction(errors=[CallError("parse_error", f"could not split arguments: {err}")])
    for tok in tokens:
        if "=" not in tok:
            return ParsedAction(errors=[CallError("parse_error", f"argument {tok!r} is not key=value")])
        key, value = tok.split("=", 1)
        try:
            args[key] = json.loads(value)
            if not isinstance(args[key], (int, float, bool, list, dict)) or args[key] is None:
                args[key] = value
        except json.JSONDecodeError:
            args[key] = value
    return ParsedAction(calls=[ToolCall(name=name, arguments=args)])
