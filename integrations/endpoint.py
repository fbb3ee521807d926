"""A training endpoint: an OpenAI-compatible Chat Completions server that records token-exact
trajectories of an unmodified agent (`toolgym serve`).

An agent written against the OpenAI API points its `base_url` at an episode's URL
(`http://HOST:PORT/episodes/<id>/v1`, or the plain `/v1` with an `X-Toolgym-Episode` header) and
runs its own loop. The endpoint never re-tokenizes what the policy produced:

- the first request of an episode is rendered with the chat template (its contents as data) and
  is the trajectory's prompt;
- a later request whose messages extend what the endpoint already saw (the agent appended the
  assistant message it got back, then tool results or a user turn) adds only the new messages,
  encoded as an observation delta after the policy's own end-of-turn token, and the policy
  continues from the exact ids it sampled;
- a request that does not extend it (the agent edited or dropped history) splits the
  trajectory: the part so far is kept, a new part starts from a fresh render, and the divergence
  is counted and reported, never silently re-tokenized into the old part.

Tool calls the policy writes (`<tool_call>{...}</tool_call>`) come back as the API's
`tool_calls`; the agent's `tool` messages become `tool` turns. The caller that owns the
environment closes an episode with its verdict (`close_episode`) and gets one `Trajectory` per
part: policy tokens exactly as sampled, with their log-probabilities, `loss_mask` 1 on them only.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from toolgym.envs.parsing import CLOSE, OPEN, parse_tool_calls
from toolgym.harness.trajectory import Segment, Trajectory
from toolgym.inference.chat import ChatRenderer
from toolgym.inference.policy import Policy, SamplingParams, current_episode
from toolgym.verifiers import Outcome

EPISODE_HEADER = "X-Toolgym-Episode"


class EndpointError(ValueError):
    """A request the endpoint cannot serve (the message is what the client reads)."""


def _text(content: Any) -> str:
    """A message's content as text (the API also allows a list of text parts)."""
    if content is None:
        return ""
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return str(content)


def normalize(message: dict[str, Any]) -> dict[str, Any]:
    """What of an API message decides the conversation: role, text, tool calls (name and parsed
    arguments), the tool call a result answers. Fields an SDK adds as null are ignored."""
    out: dict[str, Any] = {"role": message.get("role"), "content": _text(message.get("content"))}
    calls = message.get("tool_calls") or []
    if calls:
        parsed = []
        for call in calls:
            fn = call.get("function", {})
            try:
                args = json.loads(fn.get("arguments") or "{}")
            except ValueError:
                args = fn.get("arguments")
            parsed.append([call.get("id"), fn.get("name"), args])
        out["tool_calls"] = parsed
    if message.get("tool_call_id"):
        out["tool_call_id"] = message["tool_call_id"]
    return out


@dataclass
class _Episode:
    id: str
    tools: list[dict[str, Any]] | None
    renderer: ChatRenderer | None = None
    seen: list[dict[str, Any]] = field(default_factory=list)  # normalized API messages, as the agent holds them
    tool_names: dict[str, str] = field(default_factory=dict)  # tool call id -> function name
    context: list[int] = field(default_factory=list)
    parts: list[list[Segment]] = field(default_factory=list)
    divergences: int = 0
    turns: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


class Endpoint:
    """The server and its episodes (see the module docstring). `start()` serves on a thread."""

    def __init__(
        self,
        policy: Policy,
        tokenizer: Any,
        sampling: SamplingParams | None = None,
        chat_template: str | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        max_tokens: int = 4096,
        auto_open: bool = False,
        on_close=None,
    ) -> None:
        self.policy = policy
        self.tokenizer = tokenizer
        self.sampling = sampling or SamplingParams(max_new_tokens=256, temperature=1.0)
        self.chat_template = chat_template
        self.max_tokens = max_tokens
        #: serve (`toolgym serve`): an unknown episode id opens that episode on its first request,
        #: and `POST .../episodes/<id>/close {"reward": r}` closes it and hands its trajectories to
        #: `on_close`
        self.auto_open = auto_open
        self.on_close = on_close
        self.episodes: dict[str, _Episode] = {}
        self.stats = {"requests": 0, "divergences": 0, "errors": 0}
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._loop_thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server = ThreadingHTTPServer((host, port), _handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        """The server's base URL (`http://host:port`)."""
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> Endpoint:
        """Serve on background threads (the policy's coroutines run on one event loop, so
        concurrent episodes' turns batch as in the rollout runner)."""
        self._loop_thread.start()
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop serving."""
        self._server.shutdown()
        self._server.server_close()
        self._loop.call_soon_threadsafe(self._loop.stop)

    # ---- episodes ------------------------------------------------------------------------------

    def open_episode(self, tools: list[dict[str, Any]] | None = None, episode_id: str | None = None) -> str:
        """Start recording an episode; returns its base URL for the agent (`.../episodes/<id>/v1`).
        `tools`: the schemas the template renders (default: those of the first request)."""
        eid = episode_id or uuid.uuid4().hex[:16]
        with self._lock:
            if eid in self.episodes:
                raise EndpointError(f"episode {eid!r} is already open")
            self.episodes[eid] = _Episode(eid, tools)
        return f"{self.url}/episodes/{eid}/v1"

    def close_episode(
        self, episode_url_or_id: str, reward: float, outcome: Outcome, task_id: str = "", env_id: str = "", seed: int = 0, **fields: Any
    ) -> list[Trajectory]:
        """End an episode with the environment's verdict: one `Trajectory` per part (more than one
        only after a divergence), each carrying the verdict."""
        eid = episode_url_or_id.rstrip("/").split("/episodes/")[-1].split("/")[0]
        with self._lock:
            episode = self.episodes.pop(eid, None)
        if episode is None:
            raise EndpointError(f"no open episode {eid!r}")
        if hasattr(self.policy, "end_episode"):  # what the backend kept for the episode is freed (on its loop)
            self._loop.call_soon_threadsafe(self.policy.end_episode, eid)
        out = []
        for i, segments in enumerate(p for p in episode.parts if p):
            out.append(
                Trajectory(
                    task_id=task_id,
                    group_id=f"{eid}/{i}",
                    seed=seed,
                    policy=self.policy.name,
                    env_id=env_id,
                    segments=segments,
                    outcome=outcome,
                    reward=reward,
                    messages=list(episode.seen),
                    **fields,
                )
            )
        return out

    def divergences(self, episode_id: str) -> int:
        """How many times the agent's history stopped extending what the endpoint recorded."""
        return self.episodes[episode_id].divergences

    # ---- one chat completion -------------------------------------------------------------------

    def complete(self, episode_id: str | None, body: dict[str, Any]) -> dict[str, Any]:
        """Answer one `/v1/chat/completions` request body (see the module docstring)."""
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise EndpointError("`messages` must be a non-empty list")
        if episode_id is None:
            raise EndpointError(f"no episode: use an episode's base URL (.../episodes/<id>/v1) or the {EPISODE_HEADER} header")
        with self._lock:
            episode = self.episodes.get(episode_id)
            if episode is None and self.auto_open:
                episode = self.episodes[episode_id] = _Episode(episode_id, None)
        if episode is None:
            raise EndpointError(f"no open episode {episode_id!r}")
        with episode.lock:  # an agent's turns are sequential; a second one at once waits
            return self._complete(episode, messages, body)

    def _complete(self, episode: _Episode, messages: list[dict[str, Any]], body: dict[str, Any]) -> dict[str, Any]:
        normalized = [normalize(m) for m in messages]
        if episode.renderer is None:
            tools = episode.tools or body.get("tools") or None
            episode.renderer = ChatRenderer(self.tokenizer, tools, system=None, chat_template=self.chat_template)
        renderer = episode.renderer
        extends = (
            episode.parts
            and len(normalized) > len(episode.seen)
            and normalized[: len(episode.seen)] == episode.seen
            and all(m["role"] in ("tool", "user") for m in normalized[len(episode.seen) :])
        )
        if extends:
            new = self._template_messages(episode, messages[len(episode.seen) :])
            delta = renderer.delta_ids(new)
            episode.parts[-1].append(
                Segment(kind="observation", token_ids=delta, text=self.tokenizer.decode(delta, skip_special_tokens=False))
            )
            episode.context += delta
        else:
            if episode.parts:  # the agent's history is not what was recorded: a new part, counted
                episode.divergences += 1
                with self._lock:
                    self.stats["divergences"] += 1
            prompt = renderer.prompt_ids(self._template_messages(episode, messages))
            episode.parts.append(
                [Segment(kind="template", token_ids=prompt, text=self.tokenizer.decode(prompt, skip_special_tokens=False))]
            )
            episode.context = list(prompt)
        remaining = self.max_tokens - len(episode.context)
        if remaining <= 0:
            raise EndpointError(f"the episode has used its {self.max_tokens} tokens")
        wanted = body.get("max_completion_tokens") or body.get("max_tokens") or self.sampling.max_new_tokens
        sampling = self.sampling.model_copy(
            update={
                "max_new_tokens": max(1, min(int(wanted), remaining)),
                **({"temperature": float(body["temperature"])} if body.get("temperature") is not None else {}),
                **({"top_p": float(body["top_p"])} if body.get("top_p") is not None else {}),
                **({"seed": int(body["seed"])} if body.get("seed") is not None else {}),
            }
        )
        gen = asyncio.run_coroutine_threadsafe(self._generate(episode.id, list(episode.context), sampling), self._loop).result()
        ids = list(gen.token_ids)
        episode.parts[-1].append(
            Segment(
                kind="policy",
                token_ids=ids,
                logprobs=list(gen.logprobs),
                text=self.tokenizer.decode(ids, skip_special_tokens=False),
                weight_version=gen.weight_version,
            )
        )
        episode.context += ids
        finished = bool(ids) and ids[-1] == renderer.eot_id
        if not finished:  # cut off: close the turn so the next delta follows a well-formed chat
            episode.parts[-1].append(Segment(kind="template", token_ids=[renderer.eot_id], text=renderer.eot))
            episode.context.append(renderer.eot_id)
        text = self.tokenizer.decode(ids[:-1] if finished else ids, skip_special_tokens=False)
        message = self._assistant_message(episode, text)
        episode.seen = normalized + [normalize(message)]
        episode.turns += 1
        finish = "tool_calls" if message.get("tool_calls") else "stop" if finished else "length"
        return {
            "id": f"chatcmpl-{episode.id}-{episode.turns}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model") or self.policy.name,
            "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
            "usage": {
                "prompt_tokens": len(episode.context) - len(ids),
                "completion_tokens": len(ids),
                "total_tokens": len(episode.context),
            },
        }

    async def _generate(self, episode_id: str, context: list[int], sampling: SamplingParams):
        # the episode names the request, as in the rollout runner: a backend keeps the episode's
        # keys and values between its turns (HFPolicy) or routes it to one server (sglang)
        current_episode.set(episode_id)
        return await self.policy.generate(context, sampling)

    def _assistant_message(self, episode: _Episode, text: str) -> dict[str, Any]:
        parsed = parse_tool_calls(text)
        content = text
        if OPEN in text:  # the text around the tool call blocks is the message's content
            content = "".join(part.split(CLOSE, 1)[-1] for part in text.split(OPEN)).strip()
        message: dict[str, Any] = {"role": "assistant", "content": content or None}
        if parsed.calls:
            calls = []
            for i, call in enumerate(parsed.calls):
                call_id = f"call_{episode.id}_{episode.turns}_{i}"
                episode.tool_names[call_id] = call.name
                calls.append({"id": call_id, "type": "function", "function": {"name": call.name, "arguments": json.dumps(call.arguments)}})
            message["tool_calls"] = calls
        return message

    def _template_messages(self, episode: _Episode, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """API messages as the chat template's: assistant tool calls back as the policy's own
        `<tool_call>` text, tool results as `tool` turns named after their call."""
        out = []
        for m in messages:
            role, content = m.get("role"), _text(m.get("content"))
            if role == "assistant" and m.get("tool_calls"):
                blocks = [
                    f"{OPEN}\n{json.dumps({'name': c['function']['name'], 'arguments': json.loads(c['function'].get('arguments') or '{}')})}\n{CLOSE}"
                    for c in m["tool_calls"]
                ]
                content = "\n".join(([content] if content else []) + blocks)
            if role == "tool":
                out.append({"role": "tool", "name": episode.tool_names.get(m.get("tool_call_id", ""), "tool"), "content": content})
            elif role in ("system", "user", "assistant"):
                out.append({"role": role, "content": content})
            else:
                raise EndpointError(f"unsupported message role {role!r}")
        return out


def _handler(endpoint: Endpoint) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:  # requests are counted, not printed
            pass

        def _reply(self, code: int, payload: dict[str, Any]) -> None:
            data = json.dumps(payload).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _error(self, code: int, message: str) -> None:
            with endpoint._lock:
                endpoint.stats["errors"] += 1
            self._reply(code, {"error": {"message": message, "type": "invalid_request_error", "code": code}})

        def do_GET(self) -> None:
            if self.path.rstrip("/").endswith("/v1/models"):
                self._reply(200, {"object": "list", "data": [{"id": endpoint.policy.name, "object": "model", "owned_by": "toolgym"}]})
            else:
                self._error(404, f"no route {self.path}")

        def do_POST(self) -> None:
            path = self.path.split("?")[0].rstrip("/")
            if path.endswith("/close") and "/episodes/" in path and endpoint.on_close is not None:
                try:
                    body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                    reward = float(body.get("reward", 0.0))
                    outcome = Outcome(body.get("outcome") or ("passed" if reward >= 1.0 else "failed"))
                    trajectories = endpoint.close_episode(path[: -len("/close")], reward, outcome, task_id=str(body.get("task_id", "")))
                    endpoint.on_close(trajectories)
                    return self._reply(200, {"trajectories": len(trajectories)})
                except (EndpointError, ValueError, TypeError) as err:
                    return self._error(400, str(err))
            if not path.endswith("/v1/chat/completions"):
                return self._error(404, f"no route {self.path}: the endpoint serves /v1/chat/completions")
            episode = path.split("/episodes/", 1)[1].split("/")[0] if "/episodes/" in path else self.headers.get(EPISODE_HEADER)
            try:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                if body.get("stream"):
                    raise EndpointError("streaming is not supported: send stream=false")
                with endpoint._lock:
                    endpoint.stats["requests"] += 1
                self._reply(200, endpoint.complete(episode, body))
            except (EndpointError, ValueError, KeyError, TypeError) as err:
                self._error(400, str(err))

    return Handler


__all__ = ["EPISODE_HEADER", "Endpoint", "EndpointError", "normalize"]
