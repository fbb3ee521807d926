"""Environments whose tools come from an MCP server that runs inside the episode's sandbox.

`MCPSandboxEnv` starts the task's MCP server (`task.data["mcp_server"]["command"]`) at every
reset, inside the freshly reset sandbox, and offers the agent the server's tools (names,
descriptions and input schemas from `list_tools`) plus `submit`. Each call is the MCP SDK's
`call_tool`; a result the server marks as an error is a tool error the agent reads. Because the
server is a process of the sandbox, everything it keeps dies with the episode: its memory with
its process, its files with the sandbox's reset. `submit` stops it before grading, so what it
wrote is final and whatever it did (a write outside the workspace, a network attempt) is in the
side-effect ledger like any command's. The sandbox reads a command's events when the command
ends, and the server's command is the episode's server: its events are recorded at the step that
ends the episode (`submit`, or the last turn).

The transport is MCP's stdio transport, end to end: the server reads stdin and writes stdout
inside the sandbox, where the sandbox's own `exec` runs it with both redirected to two FIFOs in
the sandbox's /tmp (`Sandbox.scratch_channel`, never the workspace); on the host the SDK's
`stdio_client` runs a two-`cat` bridge to those FIFOs as its "server process". The SDK's
session runs in its own event-loop thread, so the environment's `step` stays synchronous.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import json
import os
import secrets
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from toolgym.envs.parsing import CallError
from toolgym.envs.sandbox_env import SandboxEnv
from toolgym.envs.tools import InfraError, ToolArgumentError, ToolError, ToolSpec, tool
from toolgym.sandbox import ExecResult, Sandbox, SandboxError
from toolgym.sandbox.fs import remove_tree
from toolgym.tasks import ToolCall

#: The host's end of the stdio transport: feed the server's stdin FIFO, relay its stdout FIFO.
#: (A background command's stdin is /dev/null in a shell without job control: hence fd 3.)
BRIDGE = 'exec 3<&0; cat <&3 > "$1" & exec 3<&- cat < "$2"'
#: Seconds the server may take to start and answer `initialize` and `list_tools`.
START_TIMEOUT_S = 30.0
#: The server's exec ends with the episode; this only bounds a server nobody stopped.
SERVER_LIFETIME_S = 6 * 3600.0
#: Seconds to wait for a failed server's exit code and stderr before saying why it failed.
EXIT_REPORT_S = 5.0

_JSON_TYPES: dict[str, Callable[[Any], bool]] = {
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "array": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, dict),
    "null": lambda v: v is None,
}


@dataclass(frozen=True)
class MCPToolSpec(ToolSpec):
    """A tool the MCP server offers: validated against its input schema's top level (required
    and unknown arguments, JSON types); the server checks the rest and says what is wrong."""

    def validate(self, arguments: Any) -> dict[str, Any]:
        """The arguments as given, or `ToolArgumentError` saying what does not fit the schema."""
        if not isinstance(arguments, dict):
            raise ToolArgumentError(self.name, [f"arguments must be a JSON object, got {type(arguments).__name__}"])
        props = self.parameters.get("properties") or {}
        problems = [f"missing required argument `{k}`" for k in self.parameters.get("required", []) if k not in arguments]
        for key, value in arguments.items():
            if key not in props:
                if self.parameters.get("additionalProperties") is False:
                    problems.append(f"unknown argument `{key}` (expected: {', '.join(props) or 'no arguments'})")
                continue
            kinds = props[key].get("type")
            kinds = [kinds] if isinstance(kinds, str) else (kinds or [])
            if kinds and not any(_JSON_TYPES.get(k, lambda v: True)(value) for k in kinds):
                problems.append(f"argument `{key}` must be of type {'/'.join(kinds)}, got {value!r}")
        if problems:
            raise ToolArgumentError(self.name, problems)
        return dict(arguments)


def mcp_tool_spec(tool_info: Any) -> MCPToolSpec:
    """The `ToolSpec` of one tool from the SDK's `list_tools` result."""
    schema = dict(getattr(tool_info, "input_schema", None) or {"type": "object", "properties": {}})
    schema.setdefault("properties", {})
    return MCPToolSpec(
        name=tool_info.name, method="", description=(tool_info.description or "").strip(), final=False, args_model=None, parameters=schema
    )  # type: ignore[arg-type]


def _describe(err: BaseException) -> str:
    """`Type: message` of the innermost cause (anyio wraps a failed session in an ExceptionGroup)."""
    while isinstance(err, BaseExceptionGroup) and len(err.exceptions) == 1:
        err = err.exceptions[0]
    return f"{type(err).__name__}: {err}" if str(err) else type(err).__name__


class SandboxMCPServer:
    """One MCP server process inside `box` for one episode, and the SDK's client session to it.

    `tools` is the server's `list_tools` answer; `call()` runs one `call_tool` and waits;
    `stop()` ends the session, which ends the server (its stdin closes) and so its exec."""

    def __init__(self, box: Sandbox, command: str, env: dict[str, str] | None = None, start_timeout_s: float = START_TIMEOUT_S) -> None:
        try:
            from mcp.client.stdio import StdioServerParameters
        except ImportError:
            raise SandboxError("MCP-tool environments need the MCP SDK: pip install 'toolgym[mcp]'") from None
        self.box = box
        self.result: ExecResult | None = None  # the server's exec, once it ended
        self.failure: str | None = None
        host_dir, inner_dir, uid = box.scratch_channel()
        name = f".toolgym-mcp-{secrets.token_hex(6)}"
        self._dir = host_dir / name
        self._dir.mkdir(mode=0o700)
        for fifo in ("in", "out"):
            os.mkfifo(self._dir / fifo, 0o600)
        if uid is not None:
            for path in (self._dir, self._dir / "in", self._dir / "out"):
                os.chown(path, uid, uid)
        inner = f"{inner_dir}/{name}"
        self._exec = threading.Thread(
            target=self._serve, name="toolgym-mcp-server", daemon=True, args=(f"exec {command} < {inner}/in > {inner}/out", env)
        )
        self._exec.start()
        params = StdioServerParameters(command="/bin/sh", args=["-c", BRIDGE, "bridge", str(self._dir / "in"), str(self._dir / "out")])
        self._devnull = open(os.devnull, "w")
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="toolgym-mcp-client", daemon=True)
        self._thread.start()
        ready: concurrent.futures.Future = concurrent.futures.Future()
        self._main = asyncio.run_coroutine_threadsafe(self._session(params, ready), self._loop)
        self._started = False
        try:
            self.tools = ready.result(timeout=start_timeout_s)
            self._started = True
        except Exception as err:
            # The session usually fails because the server exited; its exec's result (exit code,
            # stderr) comes back a moment later on the other thread, so wait briefly for it.
            self._exec.join(timeout=EXIT_REPORT_S)
            why = self._why(_describe(err))
            self.stop()
            raise SandboxError(f"the MCP server `{command}` did not start: {why}") from None

    def _serve(self, cmd: str, env: dict[str, str] | None) -> None:
        try:
            self.result = self.box.exec(cmd, timeout_s=SERVER_LIFETIME_S, env=env)
        except Exception as err:  # the sandbox closed or failed under it
            self.failure = f"{type(err).__name__}: {err}"

    def _why(self, fallback: str) -> str:
        """What the server said when it ended, else `fallback`."""
        if self.result is not None:
            return f"it exited with code {self.result.exit_code}: {(self.result.stderr or self.result.stdout)[-300:]}"
        return self.failure or fallback

    async def _session(self, params: Any, ready: concurrent.futures.Future) -> None:
        """The session's whole life in one task (anyio's scopes must be left where entered)."""
        from mcp.client.session import ClientSession
        from mcp.client.stdio import stdio_client

        self._jobs: asyncio.Queue = asyncio.Queue()
        try:
            async with stdio_client(params, errlog=self._devnull) as (read, write):
                async with ClientSession(read, write) as session:
                    await session.initialize()
                    ready.set_result((await session.list_tools()).tools)
                    while (job := await self._jobs.get()) is not None:
                        work, answer = job
                        try:
                            answer.set_result(await work(session))
                        except Exception as err:
                            answer.set_exception(err)
        except BaseException as err:
            if not ready.done():
                ready.set_exception(err if isinstance(err, Exception) else RuntimeError(repr(err)))
            raise

    @property
    def alive(self) -> bool:
        """The session is up and the server's exec has not ended."""
        return not self._main.done() and self._exec.is_alive()

    def call(self, name: str, arguments: dict[str, Any], timeout_s: float) -> tuple[str, bool]:
        """(text of the result, whether the server marked it an error); `ToolError` when the server
        is gone or does not answer in time (it is stopped then: the episode goes on without it)."""
        if not self.alive:
            raise ToolError(f"the MCP server is not running ({self._why('it was stopped')})")
        answer: concurrent.futures.Future = concurrent.futures.Future()

        async def work(session):
            return await session.call_tool(name, arguments)

        self._loop.call_soon_threadsafe(self._jobs.put_nowait, (work, answer))
        try:
            result = answer.result(timeout=timeout_s)
        except concurrent.futures.TimeoutError:
            self.stop()
            raise ToolError(f"no answer within {timeout_s:.0f} s; the MCP server was stopped") from None
        except Exception as err:
            from mcp.shared.exceptions import MCPError

            if not isinstance(err, MCPError):  # not an error answer: the server may be gone, its report on its way
                self._exec.join(timeout=EXIT_REPORT_S)
            raise ToolError(f"the MCP server failed: {self._why(_describe(err))}") from None
        parts = []
        for block in result.content or []:
            text = getattr(block, "text", None)
            parts.append(text if text is not None else f"[{getattr(block, 'type', 'content')} content]")
        if not parts and getattr(result, "structured_content", None) is not None:
            parts.append(json.dumps(result.structured_content, sort_keys=True))
        return "\n".join(parts), bool(result.is_error)

    def stop(self) -> None:
        """End the session and the server (killed if it does not exit), and wait for its exec."""
        if self._thread.is_alive():
            if not self._main.done():
                if self._started:  # the session ends as it began: in its own task
                    self._loop.call_soon_threadsafe(self._jobs.put_nowait, None)
                else:  # still starting (a server that never answered): cancel it
                    self._main.cancel()
                try:
                    self._main.result(timeout=10)
                except BaseException:
                    self._main.cancel()
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
        self._exec.join(timeout=5)
        if self._exec.is_alive():  # a server that ignored the end of its stdin
            try:
                self.box.kill_all()
            except SandboxError:
                pass
            self._exec.join(timeout=10)
        if not self._thread.is_alive():
            self._loop.close()
        self._devnull.close()
        remove_tree(self._dir)


class MCPSandboxEnv(SandboxEnv):
    """A sandboxed environment whose tools are those of the task's MCP server (see the module
    docstring). A task names its server in `data["mcp_server"]`: `command` (run in the workspace
    by the sandbox's shell) and optionally `state_tools`, read-only tools whose answers are part
    of `state_hash()` (so `toolgym check` sees the server's state, not only its files)."""

    # The agent's tools are the server's, and `submit`: no shell or file tools of its own.
    bash = read_file = write_file = edit = None  # type: ignore[assignment]
    #: Seconds one tool call may take before the server is stopped.
    call_timeout_s: float = 60.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.server: SandboxMCPServer | None = None

    def load_task(self, task) -> None:
        """Reset (or build) the sandbox, then start the task's server in it and take its tools."""
        self._stop_server()
        super().load_task(task)
        spec = task.data.get("mcp_server") or {}
        if not spec.get("command"):
            raise InfraError(f"task {task.id} names no MCP server (data['mcp_server']['command'])")
        try:
            self.server = SandboxMCPServer(self._box(), spec["command"], env=spec.get("env"))
        except SandboxError as err:
            raise InfraError(str(err)) from err
        own = type(self)._tools
        offered = {t.name: mcp_tool_spec(t) for t in self.server.tools if t.name not in own}
        self._tools = {**offered, **own}
        self._state_tools = [name for name in spec.get("state_tools", ()) if name in offered]

    def call_tool(self, call: ToolCall) -> tuple[str, CallError | None]:
        """MCP tools go to the server; `submit` and the agent's mistakes as in `ToolEnv`."""
        spec = self._tools.get(call.name)
        if not isinstance(spec, MCPToolSpec):
            return super().call_tool(call)
        try:
            args = spec.validate(call.arguments)
        except ToolArgumentError as err:
            return "", CallError("invalid_arguments", str(err), call)
        try:
            text, is_error = self._server().call(call.name, args, self.call_timeout_s)
        except ToolError as err:
            return "", CallError("tool_error", f"`{call.name}` failed: {err}", call)
        if is_error:
            return "", CallError("tool_error", f"`{call.name}` failed: {text}", call)
        return text, None

    def step(self, action: Any) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """`SandboxEnv.step`; an episode that ends without `submit` (the turn limit, the safety
        policy) stops the server too, and its side effects join this last step's."""
        obs, reward, terminated, truncated, info = super().step(action)
        if (terminated or truncated) and self.server is not None and self.sandbox is not None:
            self._stop_server()
            events = self.sandbox.events()
            info["side_effects"] = info.get("side_effects", []) + [e.model_dump(mode="json") for e in events[self._reported :]]
            self._reported = len(events)
            info["side_effects_summary"] = self.sandbox.ledger.summary()
        return obs, reward, terminated, truncated, info

    @tool(final=True)
    def submit(self) -> str:
        """Declare the task done; the hidden checks run after this."""
        self._stop_server()  # what it wrote is final, and what it did is in the ledger before grading
        self.submitted = "submitted"
        return "submitted"

    def state_hash(self) -> str:
        """The workspace's hash and the answers of the task's read-only state tools."""
        base = super().state_hash()
        if self.server is None or not self._state_tools or not self.server.alive:
            return base
        answers = [self.server.call(name, {}, self.call_timeout_s) for name in self._state_tools]
        return hashlib.sha256(json.dumps([base, answers]).encode()).hexdigest()

    def close(self) -> None:
        """Stop the server, then close the sandbox."""
        self._stop_server()
        super().close()

    def _server(self) -> SandboxMCPServer:
        if self.server is None:
            raise ToolError("no MCP server: reset() was not called")
        return self.server

    def _stop_server(self) -> None:
        server, self.server = getattr(self, "server", None), None
        if server is not None:
            server.stop()


__all__ = ["BRIDGE", "MCPSandboxEnv", "MCPToolSpec", "SandboxMCPServer", "mcp_tool_spec"]
