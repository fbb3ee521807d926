"""`HFPolicy`: a transformers causal LM in-process, with requests from concurrent episodes batched.

Episodes call `await policy.generate(...)`; requests that arrive while a batch is running are
gathered into the next batch (left-padded, one KV cache), which runs in a worker thread so the
event loop keeps stepping environments meanwhile. Throughput grows with concurrency.
"""

from __future__ import annotations

import asyncio
import secrets
import threading
from dataclasses import dataclass
from typing import Any

import torch

from toolgym.harness.policy import Generation, PolicyError, SamplingParams
from toolgym.harness.prefix import MIN_SHARED, cache_kwarg, common_prefix_length, prefix_cache


@dataclass
class _Request:
    prompt: list[int]
    sampling: SamplingParams
    future: asyncio.Future


_MASK32 = 0xFFFFFFFF


def _hash32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer mix on int64 tensors (values stay below 2**63: no overflow on any device)."""
    x = x & _MASK32
    x = ((x ^ (x >> 16)) * 0x7FEB352D) & _MASK32
    x = ((x ^ (x >> 15)) * 0x5BD1E995) & _MASK32
    return x ^ (x >> 16)


def gumbel_noise(seeds: torch.Tensor, step: int, vocab: int) -> torch.Tensor:
    """Gumbel(0, 1) noise of shape (rows, vocab), a pure function of (row seed, step, token id).

    Counter-based instead of a stateful generator: one batched op for every row, the same
    numbers on every device, and a row's noise never depends on which rows share its batch.
    """
    row = _hash32(seeds * 0x9E3779B1 + _hash32(torch.full_like(seeds, step + 0x632BE5AB)))
    cols = torch.arange(vocab, device=seeds.device, dtype=torch.int64)
    bits = _hash32(row.unsqueeze(1) ^ _hash32(cols * 0x27D4EB2F + 0x165667B1).unsqueeze(0))
    uniform = (bits.to(torch.float64) + 0.5) / 4294967296.0
    return (-torch.log(-torch.log(uniform))).to(torch.float32)


def filter_logits(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Per-row top-k (0 = off) and nucleus (1.0 = off) cuts, as -inf, for the whole batch at once."""
    vocab = logits.shape[-1]
    if bool((top_k > 0).any()):
        k = torch.where(top_k > 0, top_k.clamp(max=vocab), torch.full_like(top_k, vocab))
        kth = torch.sort(logits, dim=-1, descending=True).values.gather(1, (k - 1).unsqueeze(1))
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if bool((top_p < 1.0).any()):
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        drop_sorted = (torch.cumsum(probs, dim=-1) - probs) >= top_p.unsqueeze(1)  # keeps the top token
        drop = torch.zeros_like(drop_sorted).scatter(1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def sample_tokens(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                  seeds: torch.Tensor, step: int) -> torch.Tensor:
    """One token per row: greedy where temperature is 0, else the Gumbel-max trick (an exact
    sample of softmax(filtered logits / T)), with no per-row Python loop and no host sync."""
    greedy = torch.argmax(logits, dim=-1)
    scaled = filter_logits(logits / temperature.clamp(min=1e-6).unsqueeze(1), top_k, top_p)
    sampled = torch.argmax(scaled + gumbel_noise(seeds, step, logits.shape[-1]), dim=-1)
    return torch.where(temperature > 0, sampled, greedy)


def default_device() -> str:
    """CUDA when a GPU is present, else CPU."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def resolve_dtype(dtype: str | torch.dtype | None, device: str) -> torch.dtype:
    """`bf16`/`fp16`/`fp32` (or a torch dtype); default bf16 on CUDA, fp32 elsewhere."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype is None or dtype == "auto":
        return torch.bfloat16 if str(device).startswith("cuda") else torch.float32
    names = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16,
             "fp32": torch.float32, "float32": torch.float32}
    if dtype not in names:
        raise ValueError(f"unknown dtype {dtype!r}; use one of bf16, fp16, fp32 or auto")
    return names[dtype]


#: Generation checks "every row finished?" on the host once per this many tokens, not per token.
SYNC_EVERY = 8


class HFPolicy:
    """A Hugging Face causal LM as a batched token-in/token-out policy (CPU or GPU).

    `model` is a local directory or a hub id, loaded with `from_pretrained`.
    """

    def __init__(self, model: str | Any, tokenizer: Any | None = None, device: str | None = None,
                 dtype: str | torch.dtype | None = None, max_batch: int = 128, name: str | None = None) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        device = device or default_device()
        if str(device).startswith("cuda") and not torch.cuda.is_available():
            raise ValueError(f"device {device!r} asked for, but torch sees no CUDA GPU here; use --device cpu")
        dtype = resolve_dtype(dtype, device)
        #: The directory or hub id the weights came from (None for an in-memory model): where a
        #: remote copy of this policy (a Ray `PolicyActor`) loads from before weights are pushed.
        self.source: str | None = model if isinstance(model, str) else None
        if isinstance(model, str):
            self.name = name or f"hf:{model}"
            self.tokenizer = tokenizer or AutoTokenizer.from_pretrained(model)
            self.model = AutoModelForCausalLM.from_pretrained(model, dtype=dtype)
        else:
            self.name = name or "hf:in-memory"
            self.tokenizer, self.model = tokenizer, model
        self.model.to(device=device, dtype=dtype).eval()
        self.device = torch.device(device)
        self.dtype = dtype
        self.max_batch = max_batch
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self.default_stop = {i for i in (self.tokenizer.eos_token_id,) if i is not None}
        for tok in ("<|im_end|>", "<|eot_id|>"):
            tid = self.tokenizer.get_vocab().get(tok)
            if tid is not None:
                self.default_stop.add(tid)
        #: The weight version generations report (the trainer bumps it after each update).
        self.version = 0
        # Held while a batch generates: a weight push waits for the batch, so every turn was
        # sampled by exactly the weights its version names.
        self._weights_lock = threading.Lock()
        self._pending: list[_Request] = []
        self._wakeup: asyncio.Event | None = None
        self._worker: asyncio.Task | None = None
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
        # only the last position's logits are sampled from: the LM head skips the others
        return self.model(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=True,
                          logits_to_keep=1, **{cache_kwarg(self.model): cache})

    def _prefill(self, prompts: list[list[int]]) -> tuple[Any, torch.Tensor, torch.Tensor, Any]:
        """The batch's first forward: (output, attention mask, positions, KV cache).

        Rows are left-padded. When they share a prefix (the system prompt and tool list, a GRPO
        group's task), it runs once and its cache is repeated: the layout is then [prefix][pads]
        [row's own tokens], the mask has zeros only on the pads, positions continue the prefix."""
        from transformers import DynamicCache

        dev, n = self.device, len(prompts)
        shared = common_prefix_length(prompts) if n > 1 else 0
        if shared < MIN_SHARED:
            shared = 0
        rest = [p[shared:] for p in prompts]
        width = max(len(r) for r in rest)
        ids = torch.full((n, width), self.pad_id, dtype=torch.long)
        attn = torch.zeros((n, width), dtype=torch.long)
        for i, r in enumerate(rest):
            ids[i, width - len(r):] = torch.tensor(r)
            attn[i, width - len(r):] = 1
        ids, attn = ids.to(dev), attn.to(dev)
        pos = (shared + attn.cumsum(-1) - 1).clamp(min=0)
        if shared:
            _, cache = prefix_cache(self.model, torch.tensor([prompts[0][:shared]], device=dev), n, logits=False)
            attn = torch.cat([torch.ones((n, shared), dtype=attn.dtype, device=dev), attn], dim=1)
        else:
            cache = DynamicCache()
        return self._forward(ids, attn, pos, cache), attn, pos, cache

    def load_weights(self, state: dict[str, torch.Tensor], version: int) -> None:
        """Replace the weights (a trainer's push) once the running batch is done; later turns
        report `version`."""
        with self._weights_lock:
            self.model.load_state_dict(state)
            self.version = version

    def generate_batch(self, prompts: list[list[int]], samplings: list[SamplingParams]) -> list[Generation]:
        """Generate completions for several prompts at once (left padding, shared KV cache).

        Sampling, stop checks and bookkeeping stay on the policy's device; tokens and logprobs
        are copied back once at the end. A row's tokens depend only on its prompt and seed,
        never on its batch (counter-based noise; see `gumbel_noise`)."""
        with self._weights_lock:
            generations = self._generate_batch(prompts, samplings)
            for g in generations:
                g.weight_version = self.version
        return generations

    @torch.no_grad()
    def _generate_batch(self, prompts: list[list[int]], samplings: list[SamplingParams]) -> list[Generation]:
        if not prompts:
            return []
        if min(len(p) for p in prompts) == 0:
            raise PolicyError("empty prompt")
        self.batch_sizes.append(len(prompts))
        dev, n = self.device, len(prompts)
        # a row without a seed asked for fresh randomness: it gets its own, never a fixed default
        seeds = torch.tensor([s.seed & _MASK32 if s.seed is not None else secrets.randbits(31) for s in samplings],
                             dtype=torch.long, device=dev)
        temperature = torch.tensor([s.temperature for s in samplings], dtype=torch.float32, device=dev)
        top_k = torch.tensor([s.top_k for s in samplings], dtype=torch.long, device=dev)
        top_p = torch.tensor([s.top_p for s in samplings], dtype=torch.float32, device=dev)
        limit = torch.tensor([s.max_new_tokens for s in samplings], dtype=torch.long, device=dev)
        stop_sets = [sorted(set(s.stop_token_ids) or self.default_stop) or [-1] for s in samplings]
        stops = torch.full((n, max(len(x) for x in stop_sets)), -1, dtype=torch.long, device=dev)
        for i, row in enumerate(stop_sets):
            stops[i, : len(row)] = torch.tensor(row)
        max_new = max(s.max_new_tokens for s in samplings)
        tokens = torch.full((n, max_new), self.pad_id, dtype=torch.long, device=dev)
        logps = torch.zeros((n, max_new), dtype=torch.float32, device=dev)
        lengths = torch.zeros(n, dtype=torch.long, device=dev)
        stopped = torch.zeros(n, dtype=torch.bool, device=dev)
        done = torch.zeros(n, dtype=torch.bool, device=dev)
        out, attn, pos, cache = self._prefill(prompts)
        # the mask's future columns are allocated once (a view grows, no copy per token)
        width = attn.shape[1]
        full_attn = torch.ones((n, width + max_new), dtype=attn.dtype, device=dev)
        full_attn[:, :width] = attn
        # asking "all done?" syncs with the device: on CPU it is free, on an accelerator batch it
        sync_every = 1 if torch.device(dev).type == "cpu" else SYNC_EVERY
        for step in range(max_new):
            logits = out.logits[:, -1, :].float()
            tok = sample_tokens(logits, temperature, top_k, top_p, seeds, step)
            tok = torch.where(done, torch.full_like(tok, self.pad_id), tok)
            active = ~done
            tokens[:, step] = tok
            logps[:, step] = torch.log_softmax(logits, dim=-1).gather(1, tok.unsqueeze(1)).squeeze(1)
            lengths += active.long()
            hit_stop = active & (tok.unsqueeze(1) == stops).any(dim=1)
            stopped |= hit_stop
            done |= hit_stop | (lengths >= limit)
            if step == max_new - 1 or (step % sync_every == sync_every - 1 and bool(done.all())):
                break
            attn = full_attn[:, : width + step + 1]
            pos = pos[:, -1:] + 1
            out = self._forward(tok.unsqueeze(1), attn, pos, cache)  # the cache object grows in place
        tokens_h, logps_h = tokens.tolist(), logps.tolist()
        lengths_h, stopped_h = lengths.tolist(), stopped.tolist()
        return [Generation(token_ids=tokens_h[i][: lengths_h[i]], logprobs=logps_h[i][: lengths_h[i]],
                           finish_reason="stop" if stopped_h[i] else "length") for i in range(n)]
