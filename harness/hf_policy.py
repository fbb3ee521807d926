"""`HFPolicy`: a transformers causal LM in-process, with requests from concurrent episodes batched.

Episodes call `await policy.generate(...)`; requests that arrive while a batch is running are
gathered into the next batch (left-padded, one KV cache), which runs in a worker thread so the
event loop keeps stepping environments meanwhile. Throughput grows with concurrency.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import torch

from toolgym.harness.policy import Generation, PolicyError, SamplingParams


@dataclass
class _Request:
    prompt: list[int]
    sampling: SamplingParams
    future: asyncio.Future


def _sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> int:
    """One token id from a 1-D logits row under `params`."""
    if params.temperature == 0.0:
        return int(torch.argmax(logits))
    logits = logits / params.temperature
    if params.top_k and params.top_k < logits.numel():
        kth = torch.topk(logits, params.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if params.top_p < 1.0:
        sorted_p, order = torch.sort(probs, descending=True)
        keep = torch.cumsum(sorted_p, 0) - sorted_p < params.top_p
        mask = torch.zeros_like(probs, dtype=torch.bool)
        mask[order[keep]] = True
        probs = torch.where(mask, probs, torch.zeros_like(probs))
        probs = probs / probs.sum()
    return int(torch.multinomial(probs, 1, generator=generator))


class HFPolicy:
    """A Hugging Face causal LM as a batched token-in/token-out policy (CPU or GPU).

    `model` is a local directory or a hub id, loaded with `from_pretrained`.
    """

    def __init__(self, model: str | Any, tokenizer: Any | None = None, device: str = "cpu",
                 dtype: torch.dtype = torch.float32, max_batch: int = 64, name: str | None = None) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if isinstance(model, str):
            self.name = name or f"hf:{model}"
            self.tokenizer = tokenizer or AutoTokenizer.from_pretrained(model)
            self.model = AutoModelForCausalLM.from_pretrained(model, dtype=dtype)
        else:
            self.name = name or "hf:in-memory"
            self.tokenizer, self.model = tokenizer, model
        self.model.to(device).eval()
        self.device = device
        self.max_batch = max_batch
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self.default_stop = {i for i in (self.tokenizer.eos_token_id,) if i is not None}
        for tok in ("<|im_end|>", "<|eot_id|>"):
            tid = self.tokenizer.get_vocab().get(tok)
            if tid is not None:
                self.default_stop.add(tid)
        self._pending: list[_Request] = []
        self._wakeup: asyncio.Event | None = None
        self._worker: asyncio.Task | None = None
        self._cache_kw: str | None = None
        self.batch_sizes: list[int] = []  # observed batch sizes, for benchmarks and tests

    # ---- async, batched --------------------------------------------------------------------------

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Generation:
        """Queue one request; it joins the next batch."""
        loop = asyncio.get_running_loop()
        if self._worker is None or self._worker.done() or self._worker.get_loop() is not loop:
            self._wakeup = asyncio.Event()
            self._worker = loop.create_task(self._run_batches())
        future: asyncio.Future = loop.create_future()
        self._pending.append(_Request(list(prompt_ids), sampling, future))
        assert self._wakeup is not None
        self._wakeup.set()
        return await future

    async def _run_batches(self) -> None:
        assert self._wakeup is not None
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            for _ in range(3):  # let episodes that are ready right now enqueue too
                await asyncio.sleep(0)
            while self._pending:
                batch, self._pending = self._pending[: self.max_batch], self._pending[self.max_batch:]
                try:
                    results = await asyncio.to_thread(
                        self.generate_batch, [r.prompt for r in batch], [r.sampling for r in batch])
                except Exception as err:  # reported to every waiting episode, never swallowed
                    for r in batch:
                        if not r.future.done():
                            r.future.set_exception(PolicyError(f"{self.name}: {type(err).__name__}: {err}"))
                    continue
                for r, res in zip(batch, results):
                    if not r.future.done():
                        r.future.set_result(res)

    # ---- sync core -----------------------------------------------------------------------------

    def _forward(self, ids: torch.Tensor, attn: torch.Tensor, pos: torch.Tensor, cache: Any) -> Any:
        # transformers >= 5.2x renamed `past_key_values` to `cache`; accept both releases.
        if self._cache_kw is None:
            import inspect

            params = inspect.signature(self.model.forward).parameters
            self._cache_kw = "cache" if "cache" in params else "past_key_values"
        return self.model(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=True,
                          **{self._cache_kw: cache})

    @torch.no_grad()
    def generate_batch(self, prompts: list[list[int]], samplings: list[SamplingParams]) -> list[Generation]:
        """Generate completions for several prompts at once (left padding, shared KV cache)."""
        from transformers import DynamicCache

        if not prompts:
            return []
        self.batch_sizes.append(len(prompts))
        n = len(prompts)
        width = max(len(p) for p in prompts)
        if min(len(p) for p in prompts) == 0:
            raise PolicyError("empty prompt")
        ids = torch.full((n, width), self.pad_id, dtype=torch.long)
        attn = torch.zeros((n, width), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, width - len(p):] = torch.tensor(p)
            attn[i, width - len(p):] = 1
        ids, attn = ids.to(self.device), attn.to(self.device)
        pos = (attn.cumsum(-1) - 1).clamp(min=0)
        gens = [torch.Generator().manual_seed(s.seed) if s.seed is not None else None for s in samplings]
        stops = [set(s.stop_token_ids) or self.default_stop for s in samplings]
        tokens: list[list[int]] = [[] for _ in range(n)]
        logps: list[list[float]] = [[] for _ in range(n)]
        reasons = ["length"] * n
        done = [False] * n
        cache = DynamicCache()
        out = self._forward(ids, attn, pos, cache)
        max_new = max(s.max_new_tokens for s in samplings)
        temps = torch.tensor([max(s.temperature, 1e-6) for s in samplings], device=self.device).unsqueeze(1)
        simple = [s.temperature > 0 and s.top_k == 0 and s.top_p >= 1.0 for s in samplings]
        for _ in range(max_new):
            logits = out.logits[:, -1, :].float()
            logprobs = torch.log_softmax(logits, dim=-1)
            probs = torch.softmax(logits / temps, dim=-1)  # one batched op; rows sample below
            greedy = torch.argmax(logits, dim=-1).tolist()
            step_tokens = []
            for i in range(n):
                if done[i]:
                    step_tokens.append(self.pad_id)
                    continue
                if samplings[i].temperature == 0.0:
                    tok = greedy[i]
                elif simple[i]:  # per-row generator: a row's sample does not depend on its batch
                    tok = int(torch.multinomial(probs[i], 1, generator=gens[i]))
                else:
                    tok = _sample(logits[i], samplings[i], gens[i])
                tokens[i].append(tok)
                step_tokens.append(tok)
                if tok in stops[i]:
                    done[i], reasons[i] = True, "stop"
                elif len(tokens[i]) >= samplings[i].max_new_tokens:
                    done[i] = True
            picked = torch.tensor(step_tokens, device=self.device).unsqueeze(1)
            chosen = logprobs.gather(1, picked).squeeze(1).tolist()
            for i in range(n):
                if len(logps[i]) < len(tokens[i]):
                    logps[i].append(chosen[i])
            if all(done):
                break
            nxt = picked
            attn = torch.cat([attn, torch.ones((n, 1), dtype=attn.dtype, device=self.device)], dim=1)
            pos = pos[:, -1:] + 1
            out = self._forward(nxt, attn, pos, cache)  # the cache object grows in place
        return [Generation(token_ids=t, logprobs=lp, finish_reason=r)  # type: ignore[arg-type]
                for t, lp, r in zip(tokens, logps, reasons)]
