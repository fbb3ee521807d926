"""`SGLangPolicy`: an httpx client for sglang's native HTTP API (token-in/token-out).

It sends `input_ids` + `sampling_params` + `return_logprob` to `POST /generate` and reads the
output ids and their logprobs from `meta_info.output_token_logprobs` (`[logprob, token_id, text]`
triples) and `meta_info.finish_reason.type`. It health-checks (`GET /health`), retries with
exponential backoff, spreads requests over several servers (or one sglang router URL), and
drives the weight-update endpoints the trainer calls (`POST /update_weights_from_disk`,
`POST /flush_cache`).

The sglang server is CUDA-only and cannot run on the project's CPU machines. The tests run this
client over real HTTP against `toolgym.harness.protocol_server`, a small server that speaks the
same documented request/response format backed by an in-process model; it is to be checked
against a real sglang server on a GPU machine (see docs/sglang.md).
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import httpx

from toolgym.harness.policy import Generation, PolicyError, SamplingParams


class SGLangPolicy:
    """Token-in/token-out policy backed by one or more sglang servers."""

    def __init__(self, urls: str | list[str], timeout_s: float = 120.0, retries: int = 3,
                 backoff_s: float = 0.5, name: str | None = None, max_connections: int = 256) -> None:
        self.urls = [u.rstrip("/") for u in ([urls] if isinstance(urls, str) else urls)]
        if not self.urls:
            raise ValueError("SGLangPolicy needs at least one server URL")
        self.name = name or f"sglang:{','.join(self.urls)}"
        self.timeout_s, self.retries, self.backoff_s = timeout_s, retries, backoff_s
        self._next = itertools.cycle(range(len(self.urls)))
        self._inflight = [0] * len(self.urls)
        self._limits = httpx.Limits(max_connections=max_connections)
        self._client: httpx.AsyncClient | None = None

    def _http(self) -> httpx.AsyncClient:
        if self._client is None or self._client.is_closed:
            self._client = httpx.AsyncClient(timeout=self.timeout_s, limits=self._limits)
        return self._client

    async def aclose(self) -> None:
        """Close the HTTP connections."""
        if self._client is not None:
            await self._client.aclose()

    def _pick(self) -> int:
        # Least in-flight requests first; ties broken round-robin.
        start = next(self._next)
        order = [(start + i) % len(self.urls) for i in range(len(self.urls))]
        return min(order, key=lambda i: self._inflight[i])

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
        return {"input_ids": list(prompt_ids), "sampling_params": params, "return_logprob": True,
                "logprob_start_len": -1}

    @staticmethod
    def parse_response(data: dict[str, Any]) -> Generation:
        """Read output ids, logprobs and finish reason from a `/generate` response."""
        try:
            meta = data["meta_info"]
            triples = meta["output_token_logprobs"]
            token_ids = [int(t[1]) for t in triples]
            logprobs = [float(t[0]) for t in triples]
            if "output_ids" in data and list(data["output_ids"]) != token_ids:
                raise PolicyError("output_ids and output_token_logprobs disagree")
            reason = (meta.get("finish_reason") or {}).get("type", "stop")
        except (KeyError, TypeError, IndexError, ValueError) as err:
            raise PolicyError(f"unexpected /generate response ({type(err).__name__}: {err}): "
                              f"{str(data)[:200]}") from None
        return Generation(token_ids=token_ids, logprobs=logprobs,
                          finish_reason=reason if reason in ("stop", "length", "abort") else "stop")

    async def _post(self, index: int, path: str, body: dict[str, Any] | None) -> dict[str, Any]:
        url = self.urls[index] + path
        last: Exception | None = None
        for attempt in range(self.retries + 1):
            try:
                resp = await self._http().post(url, json=body)
                if resp.status_code >= 500:
                    raise PolicyError(f"{url}: HTTP {resp.status_code}: {resp.text[:200]}")
                if resp.status_code >= 400:  # a bad request will not get better by retrying
                    raise _Fatal(f"{url}: HTTP {resp.status_code}: {resp.text[:200]}")
                return resp.json() if resp.content else {}
            except _Fatal as err:
                raise PolicyError(str(err)) from None
            except (httpx.TransportError, PolicyError) as err:
                last = err
                if attempt < self.retries:
                    await asyncio.sleep(self.backoff_s * (2 ** attempt))
        raise PolicyError(f"{url}: failed after {self.retries + 1} attempts: {type(last).__name__}: {last}")

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Generation:
        """One completion from the least busy server."""
        index = self._pick()
        self._inflight[index] += 1
        try:
            data = await self._post(index, "/generate", self.request_body(prompt_ids, sampling))
        finally:
            self._inflight[index] -= 1
        return self.parse_response(data)

    async def health(self) -> list[bool]:
        """`GET /health` on every server."""
        async def one(url: str) -> bool:
            try:
                return (await self._http().get(url + "/health", timeout=5.0)).status_code == 200
            except httpx.TransportError:
                return False

        return list(await asyncio.gather(*(one(u) for u in self.urls)))

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

    async def update_weights_from_disk(self, model_path: str) -> None:
        """Ask every server to load new weights from `model_path` (the trainer's checkpoint)."""
        for i in range(len(self.urls)):
            data = await self._post(i, "/update_weights_from_disk", {"model_path": model_path})
            if not data.get("success", False):
                raise PolicyError(f"{self.urls[i]}: weight update failed: {data.get('message', data)}")

    async def flush_cache(self) -> None:
        """Drop every server's prefix cache (after a weight update)."""
        for i in range(len(self.urls)):
            await self._post(i, "/flush_cache", None)


class _Fatal(Exception):
    """A 4xx response: not retried."""
