"""Any toolgym environment as an MCP server (`toolgym mcp ENV`): an MCP client plays its episodes.

The server offers the environment's own tools (their JSON schemas as MCP input schemas) and one
more, `reset`, which starts an episode on a task (by id, or drawn with a seed) and returns the
instruction. Every tool call is one environment step: the result's text is the observation, and
its structured content carries the reward, whether the episode ended, and the side effects the
sandbox recorded. A call the environment rejects (a bad argument, no episode yet) comes back as a
tool error the client can read, never as a dead server.

Environment steps may block (sandbox commands), so they run in a worker thread; one server plays
one episode at a time, like one environment instance.

    toolgym mcp shell-ops-v0 --split held-out      # speaks MCP on stdin/stdout
"""

from __future__ import annotations

from typing import Any

import anyio

RESET_TOOL = "reset"
RESET_SCHEMA = {
    "type": "object",
    "properties": {
        "task_id": {"type": "string", "description": "the task to play (default: one drawn with `seed`)"},
        "seed": {"type": "integer", "description": "seed for drawing a task"},
    },
    "additionalProperties": False,
}


class EnvironmentMCP:
    """The MCP handlers for one environment instance (see the module docstring)."""

    def __init__(self, env_id: str, split: str | None = None, **env_kwargs: Any) -> None:
        import toolgym

        kwargs = dict(env_kwargs)
        if split:
            kwargs["split"] = split
        self.env_id = env_id
        self.env = toolgym.make(env_id, **kwargs).unwrapped
        self.started = False
        self.ended = False

    def tools(self) -> list:
        """`reset` and the environment's tools, as MCP tool descriptions."""
        import mcp_types as types

        out = [
            types.Tool(
                name=RESET_TOOL,
                description=f"Start an episode of {self.env_id}: returns the task's "
                "instruction. Call it before any other tool, and again for the next episode.",
                input_schema=RESET_SCHEMA,
            )
        ]
        for schema in self.env.tool_schemas():
            fn = schema.get("function", schema)
            out.append(
                types.Tool(
                    name=fn["name"],
                    description=fn.get("description", ""),
                    input_schema=fn.get("parameters") or {"type": "object", "properties": {}},
                )
            )
        return out

    def call(self, name: str, arguments: dict[str, Any]) -> tuple[str, dict[str, Any], bool]:
        """(text, structured content, is error) of one tool call; blocking (runs the environment)."""
        from toolgym.tasks import ToolCall

        if name == RESET_TOOL:
            options = {"task": arguments["task_id"]} if arguments.get("task_id") else None
            try:
                obs, info = self.env.reset(seed=arguments.get("seed"), options=options)
            except ValueError as err:
                return f"Error: {err}", {}, True
            self.started, self.ended = True, False
            return obs, {"task_id": info["task_id"], "family": info.get("family")}, False
        if not self.started or self.ended:
            return (("Error: no episode is running; call `reset` first" + (" (the last one ended)" if self.ended else "")), {}, True)
        if name not in self.env.tools:
            return f"Error: unknown tool {name!r}; tools: {', '.join([RESET_TOOL, *self.env.tools])}", {}, True
        obs, reward, terminated, truncated, info = self.env.step([ToolCall(name=name, arguments=arguments)])
        self.ended = terminated or truncated
        error = any(r.get("error") for r in info.get("tool_results", []))
        structured = {"reward": reward, "terminated": terminated, "truncated": truncated, "side_effects": info.get("side_effects", [])}
        if self.ended:
            structured["outcome"] = "truncated" if truncated else "passed" if reward >= 1.0 else "failed"
        return obs, structured, error

    def server(self):
        """An MCP `Server` whose handlers play this environment."""
        import mcp_types as types
        from mcp.server import Server

        async def list_tools(ctx, params):
            return types.ListToolsResult(tools=self.tools())

        async def call_tool(ctx, params):
            text, structured, error = await anyio.to_thread.run_sync(self.call, params.name, dict(params.arguments or {}))
            return types.CallToolResult(
                content=[types.TextContent(type="text", text=text)], structured_content=structured or None, is_error=error
            )

        return Server(f"toolgym-{self.env_id}", on_list_tools=list_tools, on_call_tool=call_tool)

    def close(self) -> None:
        """Close the environment (its sandbox)."""
        self.env.close()


def serve_stdio(env_id: str, split: str | None = None) -> None:
    """Serve `env_id` over MCP on stdin/stdout until the client disconnects."""
    from mcp.server.stdio import stdio_server

    handlers = EnvironmentMCP(env_id, split)
    server = handlers.server()

    async def main() -> None:
        async with stdio_server() as (read_stream, write_stream):
            await server.run(read_stream, write_stream, server.create_initialization_options())

    try:
        anyio.run(main)
    finally:
        handlers.close()


__all__ = ["EnvironmentMCP", "RESET_TOOL", "serve_stdio"]
