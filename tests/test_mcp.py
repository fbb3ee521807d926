"""`toolgym mcp ENV`: an environment served over MCP, driven by the MCP SDK's own client over stdio."""

from __future__ import annotations

import sys

import anyio

from toolgym.tasks import builtin_suite


async def _episode(env_id: str, split: str, play) -> object:
    from mcp.client.session import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    server = StdioServerParameters(command=sys.executable, args=["-m", "toolgym.cli", "mcp", env_id, "--split", split])
    async with stdio_client(server) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            return await play(session)


def test_an_mcp_client_plays_an_episode_of_a_sandboxed_environment():
    task = builtin_suite("shell-ops").split("held-out").tasks[0]

    async def play(session):
        tools = {t.name: t for t in (await session.list_tools()).tools}
        assert {"reset", "bash", "read_file", "write_file", "submit"} <= set(tools)
        assert tools["bash"].input_schema["properties"]["command"]["type"] == "string"
        early = await session.call_tool("bash", {"command": "ls"})
        assert early.is_error and "call `reset` first" in early.content[0].text
        started = await session.call_tool("reset", {"task_id": task.id})
        assert task.instruction in started.content[0].text and started.structured_content["task_id"] == task.id
        bad = await session.call_tool("read_file", {"path": "../../etc/shadow"})
        assert bad.is_error and "Error" in bad.content[0].text  # the environment's own error, the episode goes on
        for call in task.oracle:
            result = await session.call_tool(call.name, call.arguments)
        assert result.structured_content["terminated"] and result.structured_content["reward"] == 1.0
        assert result.structured_content["outcome"] == "passed"
        # a second episode, on the untouched task, is graded a failure: reset restored the state
        await session.call_tool("reset", {"task_id": task.id})
        nothing = await session.call_tool("submit", {})
        assert nothing.structured_content["reward"] == 0.0 and nothing.structured_content["outcome"] == "failed"
        after = await session.call_tool("bash", {"command": "ls"})
        assert after.is_error and "the last one ended" in after.content[0].text

    anyio.run(_episode, "shell-ops-v0", "held-out", play)
