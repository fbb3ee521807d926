"""`SGLangPolicy`: an httpx client for sglang's native HTTP API (token-in/token-out).

It sends `input_ids` + `sampling_params` + `return_logprob` to `POST /generate` and reads the
output ids and their logprobs from `meta_info.output_token_logprobs` (`[logprob, token_id, text]`
triples), `meta_info.finish_reason.type` and `meta_info.weight_version`.

**Several servers** (or one sglang router URL) stand behind one policy:
- *Sticky routing.* Every turn of an episode goes to the same server, so its prefix cache holds
  the episode's context: the routing key is the episode id the rollout runner sets
  (`harness.policy.current_episode`), mapped by rendezvous hashing over the healthy servers. A
  server leaving or rejoining moves only its own episodes. Requests with no episode go to the
  least busy server.
- *Health rotation.* A server that refuses a connection is taken out of rotation and the request
  goes to another one (nothing was sent). A server lost mid-request fails that turn with
  `PolicyError` (the rollout runner makes the episode `infra_error`); other episodes carry on.
  A server out of rotation is probed (`GET /health`) every `probe_interval_s` and put back when
  it answers, after replaying the last weight update it missed.
- *Weight updates* go to every server directly, in sglang's documented order: `POST
  /pause_generation` on all, then `POST /update_weights_from_disk` (or
  `/update_weights_from_distributed` after `/init_weights_update_group`, see
  `harness.weight_sync`), then `POST /continue_generation`. Each carries `weight_version`.

The sglang server is CUDA-only and cannot run on the project's CPU machines. The tests run this
client over real HTTP against `toolgym.inference.protocol_server`, a small server that speaks the
same documented request/response format backed by an in-process model; it is to be checked
against a real sglang server on a GPU machine (see docs/sglang.md).
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import weakref
from typing import Any

import httpx

from toolgym.inference.policy import Generation, PolicyError, SamplingParams, current_episode


class SGLangPolicy:
    """Token-in/token-out policy backed by one or more sglang servers (see the module docstring)."""

    def __init__(
        self,
        urls: str | list[str],
        timeout_s: float = 120.0,
        retries: int = 3,
        backoff_s: float = 0.5,
        name: str | None = None,
        max_connections: int = 256,
        probe_interval_s: float = 2.0,
        pause_mode: str = "retract",
    ) -> None:
        self.urls = [u.rstrip("/") for u in ([urls] if isinstance(urls, str) else urls)]
        if not self.urls:
            raise ValueError("SGLangPolicy needs at least one server URL")
        self.name = name or f"sglang:{','.join(self.urls)}"
        self.timeout_s, self.retries, self.backoff_s = timeout_s, retries, backoff_s
        self.probe_interval_s = probe_interval_s
        #: How `/pause_generation` treats running requests: "retract" puts them back in the queue
        #: to finish on the new weights; "abort" ends them; "in_place" freezes them.
        self.pause_mode = pause_mode
        self.healthy = [True] * len(self.urls)
        self._next_probe = [0.0] * len(self.urls)
        self._missed_update: set[int] = set()  # out of rotation during a weight update
        self._last_update: tuple[str, dict[str, Any]] | None = None
        #: The weight version of the last update (None before any).
        self.version: int | None = None
        self._next = itertools.cycle(range(len(self.urls)))
        self._inflight = [0] * len(self.urls)
        self._limits = httpx.Limits(max_connections=max_connections)
        self._clients: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # event loop -> client

    def _http(self) -> httpx.AsyncClient:
        # one client per event loop: a trainer runs each step's rollouts in a fresh loop (and may
        # push weights from another thread's loop), and httpx connections belong to their loop
        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None or client.is_closed:
            client = self._clients[loop] = httpx.AsyncClient(timeout=self.timeout_s, limits=self._limits)
        return client

    async def aclose(self) -> None:
        """Close this event loop's HTTP connections."""
        client = self._clients.pop(asyncio.get_running_loop(), None)
        if client is not None:
            await client.aclose()

    # ---- routing and health ------------------------------------------------------------------

    def route(self, key: str | None, candidates: list[int]) -> int:
        """The server for a request: by rendezvous hash of `key` among `candidates` (sticky), or
        the least busy one when there is no key (ties round-robin)."""
        if key is not None:
            return max(candidates, key=lambda i: hashlib.sha256(f"{key}|{self.urls[i]}".encode()).digest())
        start = next(self._next)
        order = sorted(candidates, key=lambda i: (i - start) % len(self.urls))
        return min(order, key=lambda i: self._inflight[i])

    def _mark_down(self, index: int) -> None:
        self.healthy[index] = False
        self._next_probe[index] = asyncio.get_running_loop().time() + self.probe_interval_s

    async def _in_rotation(self) -> list[int]:
        """Healthy servers, after probing those out of rotation whose probe is due."""
        now = asyncio.get_running_loop().time()
        due = [i for i, ok in enumerate(self.healthy) if not ok and self._next_probe[i] <= now]
        if due:
            back = await asyncio.gather(*(self._probe(i) for i in due))
            for i, ok in zip(due, back):
                if ok:
                    self.healthy[i] = True
                else:
                    self._next_probe[i] = now + self.probe_interval_s
        return [i for i, ok in enumerate(self.healthy) if ok]

    async def _probe(self, index: int) -> bool:
        """True when server `index` answers `/health` and has the current weights. A server that
        missed an update from disk loads it first; one that missed an update over a
        distributed group cannot catch up alone and stays out (re-form the group)."""
        if not await self._answers(self.urls[index]):
            return False
        try:
            if index in self._missed_update:
                if self._last_update is None:
                    return False
                path, body = self._last_update
                await self._control(index, path, body)
                self._missed_update.discard(index)
            return True
        except PolicyError:
            return False

    # ---- requests ------------------------------------------------------------------------------

    @staticmethod
    def request_body(prompt_ids: list[int], sampling: SamplingParams) -> dict[str, Any]:
        """The JSON body of `POST /generate` for one prompt."""
        params: dict[str, Any] = {
            "max_new_tokens": sampling.max_new_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "skip_special_tokens": False,
            "no_stop_trim": True,  # keep the end-of-turn token in the output ids
        }
        if sampling.top_k:
            params["top_k"] = sampling.top_k
        if sampling.stop_token_ids:
            params["stop_token_ids"] = list(sampling.stop_token_ids)
        if sampling.seed is not None:
            params["sampling_seed"] = sampling.seed
        return {"input_ids": list(prompt_ids), "sampling_params": params, "return_logprob": True, "logprob_start_len": -1}

    @staticmethod
    def parse_response(data: dict[str, Any]) -> Generation:
        """Read output ids, logprobs, finish reason and weight version from a `/generate` response."""
        try:
            meta = data["meta_info"]
            triples = meta["output_token_logprobs"]
            token_ids = [int(t[1]) for t in triples]
            logprobs = [float(t[0]) for t in triples]
            if "output_ids" in data and list(data["output_ids"]) != token_ids:
                raise PolicyError("output_ids and output_token_logprobs disagree")
            reason = (meta.get("finish_reason") or {}).get("type", "stop")
            version = meta.get("weight_version")
            version = int(version) if version not in (None, "", "default") else None
        except (KeyError, TypeError, IndexError, ValueError) as err:
            raise PolicyError(f"unexpected /generate response ({type(err).__name__}: {err}): {str(data)[:200]}") from None
        return Generation(
            token_ids=token_ids,
            logprobs=logprobs,
            weight_version=version,
            finish_reason=reason if reason in ("stop", "length", "abort") else "stop",
        )

    @property
    def in_flight(self) -> int:
        """Requests sent to the servers and not yet answered (the rollout runner's progress line)."""
        return sum(self._inflight)

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Generation:
        """One completion from the episode's server (see the module docstring for failures)."""
        body = self.request_body(prompt_ids, sampling)
        key = current_episode.get()
        last = "no server in rotation"
        for attempt in range(self.retries + 1):
            if attempt:
                await asyncio.sleep(self.backoff_s * (2 ** (attempt - 1)))
            candidates = await self._in_rotation()
            while candidates:
                index = self.route(key, candidates)
                url = self.urls[index] + "/generate"
                self._inflight[index] += 1
                try:
                    resp = await self._http().post(url, json=body)
                except (httpx.ConnectError, httpx.ConnectTimeout) as err:  # nothing sent: try another
                    self._mark_down(index)
                    candidates.remove(index)
                    last = f"{url}: {type(err).__name__}: {err}"
                    continue
                except httpx.TransportError as err:  # lost mid-request: this turn is gone
                    self._mark_down(index)
                    raise PolicyError(f"{url}: server lost mid-turn ({type(err).__name__}: {err}); taken out of rotation") from None
                finally:
                    self._inflight[index] -= 1
                if resp.status_code >= 500:  # overloaded or warming up: back off, then retry
                    last = f"{url}: HTTP {resp.status_code}: {resp.text[:200]}"
                    break
                if resp.status_code >= 400:  # a bad request will not get better by retrying
                    raise PolicyError(f"{url}: HTTP {resp.status_code}: {resp.text[:200]}")
                return self.parse_response(resp.json())
        raise PolicyError(f"failed after {self.retries + 1} attempts: {last}")

    async def _control(self, index: int, path: str, body: dict[str, Any] | None) -> dict[str, Any]:
        """A control request (weights, cache, pause) to one server, retried on transport errors."""
        url = self.urls[index] + path
        last: Exception | None = None
        for attempt in range(self.retries + 1):
            try:
                resp = await self._http().post(url, json=body)
                if resp.status_code >= 400:
                    raise PolicyError(f"{url}: HTTP {resp.status_code}: {resp.text[:200]}")
                data = resp.json() if resp.content else {}
                if isinstance(data, dict) and data.get("success") is False:
                    raise PolicyError(f"{url}: {data.get('message', data)}")
                return data
            except httpx.TransportError as err:
                last = err
                if attempt < self.retries:
                    await asyncio.sleep(self.backoff_s * (2**attempt))
        raise PolicyError(f"{url}: failed after {self.retries + 1} attempts: {type(last).__name__}: {last}")

    # ---- health and weights ------------------------------------------------------------------

    async def _answers(self, url: str) -> bool:
        """True when `url` answers `GET /health` with 200."""
        try:
            return (await self._http().get(url + "/health", timeout=5.0)).status_code == 200
        except httpx.TransportError:
            return False

    async def health(self) -> list[bool]:
        """`GET /health` on every server."""
        return list(await asyncio.gather(*(self._answers(u) for u in self.urls)))

    async def wait_healthy(self, timeout_s: float = 600.0, poll_s: float = 1.0) -> None:
        """Wait until every server answers `/health`, or raise `PolicyError`."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            status = await self.health()
            if all(status):
                return
            if loop.time() > deadline:
                down = [u for u, ok in zip(self.urls, status) if not ok]
                raise PolicyError(f"sglang server(s) not healthy after {timeout_s}s: {down}")
            await asyncio.sleep(poll_s)

    async def _update_all(self, path: str, body: dict[str, Any], version: int | None, during: Any = None) -> None:
        """Pause every server in rotation, apply one weight update to all, resume all.

        `during` (a coroutine) runs alongside the update requests: the trainer's broadcast for
        `/update_weights_from_distributed`. Servers out of rotation get an update from disk
        when they come back (see `_probe`). The distributed group is a collective over every
        server: with one of them gone the broadcast cannot complete and the update fails after
        the group's timeout (use disk updates where servers come and go)."""
        if version is not None:
            body = dict(body, weight_version=str(version))
        live = await self._in_rotation()
        if not live:
            raise PolicyError("no sglang server in rotation to update")
        await asyncio.gather(*(self._control(i, "/pause_generation", {"mode": self.pause_mode}) for i in live))
        try:
            requests = [self._control(i, path, body) for i in live]
            results = await asyncio.gather(*requests, *([during] if during is not None else []), return_exceptions=True)
            failed = [r for r in results if isinstance(r, BaseException)]
            if failed:
                raise PolicyError(f"weight update failed: {failed[0]}")
        finally:
            await asyncio.gather(*(self._control(i, "/continue_generation", {}) for i in live), return_exceptions=True)
        self._missed_update |= {i for i in range(len(self.urls)) if i not in live}
        # only an update from disk can be replayed to a server that comes back
        self._last_update = (path, body) if path == "/update_weights_from_disk" else None
        self.version = version

    async def update_weights_from_disk(self, model_path: str, version: int | None = None) -> None:
        """Every server loads the checkpoint at `model_path` (pause, update, resume)."""
        await self._update_all("/update_weights_from_disk", {"model_path": model_path, "flush_cache": True}, version)

    async def init_weights_update_group(
        self, master_address: str, master_port: int, group_name: str, backend: str = "nccl", ranks_per_server: int = 1, join: Any = None
    ) -> int:
        """Ask every server to join a weight-update process group with the trainer as rank 0
        (server i takes ranks 1 + i*ranks_per_server...); `join` is the trainer's own join
        (a coroutine, see `harness.weight_sync`), run alongside. Returns the world size."""
        world = 1 + ranks_per_server * len(self.urls)
        body = {
            "master_address": master_address,
            "master_port": master_port,
            "world_size": world,
            "group_name": group_name,
            "backend": backend,
        }
        requests = [
            self._control(i, "/init_weights_update_group", dict(body, rank_offset=1 + i * ranks_per_server)) for i in range(len(self.urls))
        ]
        results = await asyncio.gather(*requests, *([join] if join is not None else []), return_exceptions=True)
        failed = [r for r in results if isinstance(r, BaseException)]
        if failed:
            raise PolicyError(f"weight update group failed: {failed[0]}")
        return world

    async def update_weights_from_distributed(
        self, names: list[str], dtypes: list[str], shapes: list[list[int]], group_name: str, broadcast: Any, version: int | None = None
    ) -> None:
        """Every server receives the named tensors that `broadcast` (a coroutine: the trainer's
        rank-0 broadcasts, in `names` order) sends over the group (pause, update, resume)."""
        body = {"names": names, "dtypes": dtypes, "shapes": shapes, "group_name": group_name, "flush_cache": True}
        await self._update_all("/update_weights_from_distributed", body, version, during=broadcast)

    async def destroy_weights_update_group(self, group_name: str) -> None:
        """Every server leaves the weight-update group."""
        await asyncio.gather(
            *(self._control(i, "/destroy_weights_update_group", {"group_name": group_name}) for i in range(len(self.urls)))
        )

    async def flush_cache(self) -> None:
        """Drop every server's prefix cache."""
        for i in range(len(self.urls)):
            await self._control(i, "/flush_cache", None)
