"""Agents the rollout runner drives.

- `TokenAgent`: a token-in/token-out `Policy` (HF in-process, sglang) plus the tokenizer that
  renders the chat; the only kind that yields trainable token data.
- `TextAgent`s answer with text given the chat messages: `OracleAgent` (replays the task's oracle),
  `FixedAgent` (the same action every turn: a null policy for benchmarks and do-nothing checks),
  `OpenAIAgent` (any OpenAI-compatible chat endpoint, for evaluation only: no token data).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, Protocol

import httpx

from toolgym.inference.chat import DEFAULT_SYSTEM
from toolgym.inference.policy import Policy, PolicyError, SamplingParams
from toolgym.tasks import Task


class TokenAgent:
    """A token-level policy with its tokenizer and sampling settings.

    `explore_tools` (training rollouts only; 0 = off): the chance, per turn, that the turn opens a
    call to a tool drawn uniformly from the episode's tools, whose arguments and anything after
    are the policy's own (see `harness/rollout.py`, `explored_call_prefix`): epsilon-greedy
    exploration of which tool a turn calls, for tools the policy almost never picks.
    """

    def __init__(
        self,
        policy: Policy,
        tokenizer: Any,
        sampling: SamplingParams | None = None,
        system: str | None = DEFAULT_SYSTEM,
        chat_template: str | None = None,
        explore_tools: float = 0.0,
    ) -> None:
        if not 0.0 <= explore_tools < 1.0:
            raise ValueError(f"explore_tools must be in [0, 1), got {explore_tools}")
        self.policy = policy
        self.tokenizer = tokenizer
        self.sampling = sampling or SamplingParams(max_new_tokens=96, temperature=1.0)
        self.system = system
        self.chat_template = chat_template
        self.explore_tools = explore_tools
        self.name = policy.name


class TextAgent(Protocol):
    """An agent that answers chat messages with text (tool calls as `<tool_call>` blocks)."""

    name: str

    async def respond(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], task: Task) -> str:
        """The assistant's next message."""
        ...


class OracleAgent:
    """Replays the task's oracle solution, one tool call per turn."""

    name = "oracle"

    async def respond(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], task: Task) -> str:
        """The next oracle call (or a plain message once the oracle is exhausted)."""
        turn = sum(1 for m in messages if m["role"] == "assistant")
        turns = task.oracle_turns()
        if turn < len(turns):
            return turns[turn]
        return "I have nothing more to do."


class FixedAgent:
    """Sends the same text every turn (a null policy)."""

    def __init__(self, text: str, name: str = "fixed") -> None:
        self.text = text
        self.name = name

    async def respond(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], task: Task) -> str:
        """The fixed text."""
        return self.text


class OpenAIAgent:
    """Any OpenAI-compatible `/v1/chat/completions` endpoint; tool calls in the API's own format.

    The API's `tool_calls` are turned into `<tool_call>` text for the environment, and the chat
    history is sent back in the API's format (assistant `tool_calls`, `tool` messages with ids).
    """

    #: HTTP statuses worth asking again (the OpenAI SDK's list): a timeout the server reports, a
    #: conflict, a rate limit, and the server's own failures. Any other 4xx is the request's fault.
    RETRY_STATUSES = frozenset({408, 409, 429}) | frozenset(range(500, 600))
    #: The longest a server's `Retry-After` may make one request wait, in seconds.
    MAX_RETRY_WAIT_S = 60.0

    def __init__(
        self,
        base_url: str,
        model: str = "default",
        api_key: str | None = None,
        temperature: float = 0.0,
        max_tokens: int = 512,
        timeout_s: float = 120.0,
        retries: int = 2,
        backoff_s: float = 0.5,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.name = f"openai:{self.base_url}#{model}"
        self.temperature, self.max_tokens = temperature, max_tokens
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.timeout_s = timeout_s
        #: A rate limit (429), an overloaded server (5xx) or a refused connection is asked again
        #: up to `retries` times, waiting as the server's `Retry-After` says or `backoff_s`
        #: doubling; only then is the turn a `PolicyError` (the episode `infra_error`, never the
        #: agent's failure). A hosted API under a campaign's concurrency rate-limits routinely.
        self.retries, self.backoff_s = retries, backoff_s
        #: Requests sent and not yet answered (the rollout runner's progress line shows it).
        self.in_flight = 0

    def _api_messages(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Our chat (assistant text with `<tool_call>` blocks) -> the API's message format."""
        from toolgym.envs.parsing import parse_tool_calls

        out: list[dict[str, Any]] = []
        pending_ids: list[str] = []
        for m in messages:
            if m["role"] == "assistant":
                parsed = parse_tool_calls(m["content"])
                calls = [
                    {"id": f"call_{len(out)}_{i}", "type": "function", "function": {"name": c.name, "arguments": json.dumps(c.arguments)}}
                    for i, c in enumerate(parsed.calls)
                ]
                pending_ids = [c["id"] for c in calls]
                msg: dict[str, Any] = {"role": "assistant", "content": parsed.content or None}
                if calls:
                    msg["tool_calls"] = calls
                out.append(msg)
            elif m["role"] == "tool":
                if pending_ids:
                    out.append({"role": "tool", "tool_call_id": pending_ids.pop(0), "content": m["content"]})
                else:  # an error observation with no call to answer: tell the model as the user
                    out.append({"role": "user", "content": m["content"]})
            else:
                out.append({"role": m["role"], "content": m["content"]})
        return out

    async def respond(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], task: Task) -> str:
        """One chat completion, rendered back as text with `<tool_call>` blocks."""
        body = {
            "model": self.model,
            "messages": self._api_messages(messages),
            "tools": tools,
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
        }
        resp = await self._post(f"{self.base_url}/chat/completions", body)
        try:
            message = resp.json()["choices"][0]["message"]
            if not isinstance(message, dict) or not all(isinstance(c, dict) for c in message.get("tool_calls") or []):
                raise TypeError("`message` and its `tool_calls` must be objects")
        except (KeyError, IndexError, ValueError, TypeError) as err:
            raise PolicyError(f"unexpected chat completion response ({type(err).__name__}: {err}): {resp.text[:200]}") from None
        parts = [message.get("content") or ""]
        for call in message.get("tool_calls") or []:
            fn = call.get("function", {})
            args = fn.get("arguments", "{}")
            try:
                args_obj = json.loads(args) if isinstance(args, str) else args
            except json.JSONDecodeError:
                args_obj = args  # leave it malformed: the environment reports it as a parse error
            parts.append("<tool_call>\n" + json.dumps({"name": fn.get("name"), "arguments": args_obj}) + "\n</tool_call>")
        return "\n".join(p for p in parts if p)

    async def _post(self, url: str, body: dict[str, Any]) -> httpx.Response:
        """POST `body`, asking again on a refused connection or a `RETRY_STATUSES` answer; the
        200 response, or `PolicyError` naming the last failure."""
        last = ""
        for attempt in range(self.retries + 1):
            wait = self.backoff_s * (2**attempt)
            self.in_flight += 1
            try:
                async with httpx.AsyncClient(timeout=self.timeout_s) as client:
                    resp = await client.post(url, json=body, headers=self.headers)
            except (httpx.ConnectError, httpx.ConnectTimeout) as err:  # nothing was sent: safe to repeat
                last = f"{self.base_url}: {type(err).__name__}: {err}"
            except httpx.TransportError as err:  # lost mid-request (or timed out): the turn is gone
                raise PolicyError(f"{self.base_url}: {type(err).__name__}: {err}") from None
            else:
                if resp.status_code == 200:
                    return resp
                last = f"{url}: HTTP {resp.status_code}: {resp.text[:200]}"
                if resp.status_code not in self.RETRY_STATUSES:
                    raise PolicyError(last)
                wait = retry_after_s(resp.headers, default=wait, most=self.MAX_RETRY_WAIT_S)
            finally:
                self.in_flight -= 1
            if attempt < self.retries:
                await asyncio.sleep(wait)
        raise PolicyError(f"failed after {self.retries + 1} attempts: {last}")


def retry_after_s(headers: httpx.Headers, default: float, most: float) -> float:
    """How long a server asked a client to wait (`retry-after-ms`, or `Retry-After` in seconds),
    at most `most`; `default` when it did not say (an HTTP date counts as not saying)."""
    for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        try:
            value = float(headers.get(name, "")) * scale
        except ValueError:
            continue
        if value >= 0:
            return min(value, most)
    return default
