"""`@tool`: turn a typed, documented method into a tool with a JSON schema and validated arguments.

The schema comes from the type hints and the docstring (first paragraph = description; a
Google-style `Args:` section describes the parameters). Arguments are validated by a strict
pydantic model built from the same hints, so `"3"` is not silently taken for `3`.
A tool without hints or a docstring fails when its class is defined, not at the first step.
"""

from __future__ import annotations

import inspect
import re
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

_TOOL_ATTR = "__toolgym_tool__"


class ToolDefinitionError(TypeError):
    """A method marked `@tool` cannot become a tool (missing hints, docstring, ...)."""


class ToolArgumentError(ValueError):
    """Arguments given to a tool do not match its schema; `problems` lists each one."""

    def __init__(self, tool: str, problems: list[str]) -> None:
        self.tool = tool
        self.problems = problems
        super().__init__(f"invalid arguments for `{tool}`: " + "; ".join(problems))


class ToolError(Exception):
    """Raise inside a tool for an expected failure; the message becomes the observation."""


class InfraError(RuntimeError):
    """The environment's own machinery failed (a sandbox died, cannot start or is exhausted, a
    helper is missing, a daemon call failed, a bug in a tool): not the agent's doing.

    It is never shown to the agent: it leaves `step`, and the rollout runner ends the episode
    with outcome `infra_error`, which pass@k and training leave out.
    """


def tool(fn: Callable | None = None, *, name: str | None = None, final: bool = False, submits: str | None = None):
    """Mark a method as a tool. `final=True` tools end the episode (answer/submit).

    `submits="value"` declares what the episode submits: the validated argument `value` becomes
    the environment's `submitted` answer (what `final_state()` hands to the verifier) before the
    method runs, so the method body may be empty. It implies `final=True`.

    Usable bare (`@tool`) or with options (`@tool(final=True)`, `@tool(submits="answer")`).
    """

    def mark(f: Callable) -> Callable:
        setattr(f, _TOOL_ATTR, {"name": name or f.__name__, "final": final or submits is not None, "submits": submits})
        return f

    return mark(fn) if fn is not None else mark


def _parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    doc = inspect.cleandoc(doc)
    description = doc.split("\n\n")[0].replace("\n", " ").strip()
    params: dict[str, str] = {}
    match = re.search(r"^(?:Args|Arguments|Parameters):\s*\n(.*?)(?:\n\S|\Z)", doc, re.S | re.M)
    if match:
        current = None
        for line in match.group(1).splitlines():
            m = re.match(r"\s+(\w+)(?:\s*\([^)]*\))?:\s*(.*)", line)
            if m and (current is None or len(line) - len(line.lstrip()) <= 8):
                current = m.group(1)
                params[current] = m.group(2).strip()
            elif current and line.strip():
                params[current] += " " + line.strip()
    for m in re.finditer(r":param\s+(\w+):\s*(.+)", doc):
        params[m.group(1)] = m.group(2).strip()
    return description, params


_TYPE_WORDS = {
    "string": "a string",
    "integer": "an integer",
    "number": "a number",
    "boolean": "true or false",
    "array": "a list",
    "object": "an object",
}


@dataclass(frozen=True)
class ToolSpec:
    """A tool's name, description, JSON schema and argument validator."""

    name: str
    method: str
    description: str
    final: bool
    args_model: type[BaseModel]
    parameters: dict[str, Any]
    #: the argument whose value the episode submits (`@tool(submits=...)`), or None
    submits: str | None = None

    @property
    def schema(self) -> dict[str, Any]:
        """OpenAI/Hermes function schema: `{"type": "function", "function": {...}}`."""
        return {"type": "function", "function": {"name": self.name, "description": self.description, "parameters": self.parameters}}

    def signature(self) -> str:
        """A one-line human signature, e.g. `search(field: string, value: string)`."""
        props = self.parameters.get("properties", {})
        required = set(self.parameters.get("required", []))
        args = []
        for arg, prop in props.items():
            kind = prop.get("type") or "/".join(p.get("type", "any") for p in prop.get("anyOf", [])) or "any"
            args.append(f"{arg}: {kind}" + ("" if arg in required else "?"))
        return f"{self.name}({', '.join(args)})"

    def validate(self, arguments: Any) -> dict[str, Any]:
        """Validated arguments as a dict, or `ToolArgumentError` saying exactly what is wrong."""
        if not isinstance(arguments, dict):
            raise ToolArgumentError(self.name, [f"arguments must be a JSON object, got {type(arguments).__name__}"])
        try:
            model = self.args_model.model_validate(arguments)
        except ValidationError as err:
            raise ToolArgumentError(self.name, [self._problem(e) for e in err.errors()]) from None
        return {k: getattr(model, k) for k in self.args_model.model_fields}

    def _problem(self, e: dict) -> str:
        field = ".".join(str(p) for p in e["loc"]) or "(arguments)"
        props = self.parameters.get("properties", {})
        if e["type"] == "missing":
            return f"missing required argument `{field}`"
        if e["type"] == "extra_forbidden":
            return f"unknown argument `{field}` (expected: {', '.join(props) or 'no arguments'})"
        want = props.get(str(e["loc"][0]), {}).get("type") if e["loc"] else None
        want_txt = _TYPE_WORDS.get(want or "", e["msg"].lower())
        return f"argument `{field}` must be {want_txt}, got {e.get('input')!r}"


def build_spec(fn: Callable) -> ToolSpec:
    """Build the `ToolSpec` of a function marked with `@tool`."""
    mark = getattr(fn, _TOOL_ATTR)
    where = f"tool `{fn.__qualname__}`"
    if not fn.__doc__ or not fn.__doc__.strip():
        raise ToolDefinitionError(f"{where} has no docstring; the first paragraph becomes its description")
    description, param_docs = _parse_docstring(fn.__doc__)
    try:
        hints = typing.get_type_hints(fn)
    except Exception as err:  # an unresolvable forward reference
        raise ToolDefinitionError(f"{where}: cannot resolve type hints ({err})") from None
    fields: dict[str, Any] = {}
    for pname, param in list(inspect.signature(fn).parameters.items())[1:]:  # skip self
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise ToolDefinitionError(f"{where}: *args/**kwargs cannot be described in a schema")
        if pname not in hints:
            raise ToolDefinitionError(f"{where}: parameter `{pname}` has no type hint")
        default = ... if param.default is inspect.Parameter.empty else param.default
        fields[pname] = (hints[pname], Field(default, description=param_docs.get(pname)))
    model = create_model(  # type: ignore[call-overload]
        f"{mark['name']}_args", __config__=ConfigDict(strict=True, extra="forbid"), **fields
    )
    parameters = model.model_json_schema()
    parameters.pop("title", None)
    for prop in parameters.get("properties", {}).values():
        prop.pop("title", None)
    parameters.setdefault("properties", {})
    submits = mark.get("submits")
    if submits is not None and submits not in fields:
        raise ToolDefinitionError(
            f"{where}: submits={submits!r} names no parameter of the tool (its parameters: {', '.join(fields) or 'none'})"
        )
    return ToolSpec(mark["name"], fn.__name__, description, mark["final"], model, parameters, submits)


def collect_tools(cls: type) -> dict[str, ToolSpec]:
    """All `@tool` methods of `cls` (including inherited ones), by tool name."""
    specs: dict[str, ToolSpec] = {}
    for klass in reversed(cls.__mro__):
        for attr in vars(klass).values():
            # A subclass that overrides a tool without `@tool` removes it.
            if callable(attr) and hasattr(attr, _TOOL_ATTR) and getattr(cls, attr.__name__, None) is attr:
                spec = build_spec(attr)
                specs[spec.name] = spec
    return specs
