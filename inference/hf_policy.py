"""`HFPolicy`: a transformers causal LM in-process, with requests from concurrent episodes batched.

Episodes call `await policy.generate(...)`; requests that arrive while a batch is running are
gathered into the next batch (one KV cache, preallocated), which runs in a worker thread so the
event loop keeps stepping environments meanwhile. Each episode's keys and values are kept between
its turns (`inference/kv_cache.py`), so a turn computes only its observation and its own tokens;
rows that start fresh share their common prefix (one forward for the system prompt and tool list).
"""

from __future__ import annotations

import asyncio
import secrets
import threading
from typing import Any

import torch

from toolgym.inference.hf_support import (
    GATHER_MAX_S,
    PAD_SLACK,
    SHRINK_AT,
    SYNC_EVERY,
    TRIM_EVERY,
    WHOLE_BUFFER_AT,
    _kv_shape,
    _Logits,
    _Prefill,
    _Request,
    default_device,
    resolve_dtype,
)
from toolgym.inference.host_memory import release_memory
from toolgym.inference.kv_cache import CachedEpisode, EpisodeKVStore, buffer_cache, weights_fingerprint
from toolgym.inference.policy import Generation, PolicyError, SamplingParams, current_episode
from toolgym.inference.prefix import MIN_SHARED, cache_kwarg, common_prefix_length
from toolgym.inference.sampling import _MASK32, filter_logits, sample_tokens, uniform_draws  # noqa: F401 (re-exported)


class HFPolicy:
    """A Hugging Face causal LM as a batched token-in/token-out policy (CPU or GPU).

    `model` is a local directory, a hub id or a built-in name (`smollm2-135m`, `tiny`), loaded
    with `from_pretrained`. Each episode's keys and values are kept between its turns (up to
    `cache_gb`), so a turn computes only the tokens the previous turn did not see. A batch holds
    at most `max_batch` requests and a KV cache of at most `batch_gb`; more wait for the next.
    """

    def __init__(
        self,
        model: str | Any,
        tokenizer: Any | None = None,
        device: str | None = None,
        dtype: str | torch.dtype | None = None,
        max_batch: int = 128,
        name: str | None = None,
        cache_gb: float = 4.0,
        batch_gb: float = 2.0,
    ) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from toolgym.inference.pretrained import resolve_model

        device = device or default_device()
        if str(device).startswith("cuda") and not torch.cuda.is_available():
            raise ValueError(f"device {device!r} asked for, but torch sees no CUDA GPU here; use --device cpu")
        dtype = resolve_dtype(dtype, device)
        #: The directory or hub id the weights came from (None for an in-memory model): where a
        #: remote copy of this policy (a Ray `PolicyActor`) loads from before weights are pushed.
        self.source: str | None = resolve_model(model) if isinstance(model, str) else None
        if self.source is not None:
            self.name = name or f"hf:{model}"
            self.tokenizer = tokenizer or AutoTokenizer.from_pretrained(self.source)
            self.model = AutoModelForCausalLM.from_pretrained(self.source, dtype=dtype)
        else:
            self.name = name or "hf:in-memory"
            self.tokenizer, self.model = tokenizer, model
        self.model.to(device=device, dtype=dtype).eval()
        self.device = torch.device(device)
        self.dtype = dtype
        # bf16 on a CPU: grouped-query attention as plain matmuls over keys stored transposed
        # (see inference/cpu_attention.py); SDPA elsewhere
        self._keys_transposed = self.device.type == "cpu" and dtype == torch.bfloat16
        if self._keys_transposed:
            from toolgym.inference import cpu_attention

            self.model.set_attn_implementation(cpu_attention.NAME)
        self.max_batch = max_batch
        #: Prefill work savers, on by default; benches switch them off to measure what they are
        #: worth. `chunk_prefill`: rows run in chunks of similar length, not all padded to the
        #: longest; `share_identical_prompts`: identical fresh prompts are computed once.
        self.chunk_prefill = True
        self.share_identical_prompts = True
        #: Decoding drops rows that are done once few enough still run (`SHRINK_AT`), instead of
        #: computing every row until the batch's longest generation ends.
        self.shrink_batch = True
        #: When more requests wait than a batch holds, the next batch also waits for the episodes
        #: that start as the answered ones end, not a batch of the leftovers alone (`_gather`).
        self.refill_batches = True
        #: bf16 on a CPU: a decoding step attends over the whole KV buffer once its filled
        #: columns reach this share of it (`kv_cache.BufferLayer.whole_buffer_at`; 0: never).
        self.whole_buffer_at = WHOLE_BUFFER_AT if self._keys_transposed else 0.0
        layers, heads, dim = _kv_shape(self.model)
        self._kv_token_bytes = 2 * layers * heads * dim * torch.finfo(dtype).bits // 8
        self.batch_bytes = int(batch_gb * 2**30)
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self.default_stop = {i for i in (self.tokenizer.eos_token_id,) if i is not None}
        for tok in ("<|im_end|>", "<|eot_id|>"):
            tid = self.tokenizer.get_vocab().get(tok)
            if tid is not None:
                self.default_stop.add(tid)
        #: The weight version generations report (the trainer bumps it after each update).
        self.version = 0
        #: Each episode's keys and values between its turns (emptied when the weights change).
        self.kv = EpisodeKVStore(int(cache_gb * 2**30))
        self._fingerprint: tuple[int, ...] | None = None
        # Held while a batch generates: a weight push waits for the batch, so every turn was
        # sampled by exactly the weights its version names.
        self._weights_lock = threading.Lock()
        self._pending: list[_Request] = []
        #: Episodes that asked for a turn and have not ended (the batcher waits for them).
        self._live: set[str] = set()
        #: How long a batch may wait for live episodes still stepping their environments.
        self.gather_s = 0.25
        #: Episodes that ended since the last batch's answers went out (`_gather`).
        self._ended = 0
        self._wakeup: asyncio.Event | None = None
        self._worker: asyncio.Task | None = None
        self.batch_sizes: list[int] = []  # observed batch sizes, for benchmarks and tests
        #: What the batch generating now has done, for progress lines: (rows, tokens decoded so
        #: far, at most); 0 tokens while it prefills; None between batches. A big batch's first
        #: episodes end minutes in, so "0 done" alone would look stuck.
        self.activity: tuple[int, int, int] | None = None

    # ---- async, batched --------------------------------------------------------------------------

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Generation:
        """Queue one request; it joins the next batch. The rollout runner's episode id
        (`current_episode`) names the episode whose cached keys and values it may reuse."""
        loop = asyncio.get_running_loop()
        if self._worker is None or self._worker.done() or self._worker.get_loop() is not loop:
            self._wakeup = asyncio.Event()
            self._worker = loop.create_task(self._run_batches())
        future: asyncio.Future = loop.create_future()
        episode = current_episode.get()
        if episode is not None:
            self._live.add(episode)
        self._pending.append(_Request(list(prompt_ids), sampling, future, episode))
        assert self._wakeup is not None
        self._wakeup.set()
        return await future

    def end_episode(self, episode: str) -> None:
        """The rollout runner's word that `episode` ended: drop its cached keys and values, and
        stop waiting for its next turn."""
        if episode in self._live:
            self._live.discard(episode)
            self._ended += 1
        self.kv.discard(episode)
        if self._wakeup is not None and self._pending:
            self._wakeup.set()

    async def _gather(self, leftovers: bool = False) -> None:
        """Wait until every live episode has a request pending (or `max_batch` are): episodes
        come back from their environment steps at different times, and a batch that leaves some
        behind costs a whole extra batch later. With `leftovers` (requests the last batch had no
        room for), an episode that ended since that batch's answers counts as coming back too:
        the rollout runner starts a new episode in its place, and a batch of the leftovers alone
        would run nearly empty. The wait ends after `gather_s` without a new request, and after
        `GATHER_MAX_S` in all."""
        loop = asyncio.get_running_loop()
        started = last_arrival = loop.time()
        seen = len(self._pending)
        while len(self._pending) < self.max_batch and (len(self._pending) < len(self._live) or (leftovers and self._ended > 0)):
            now = loop.time()
            if len(self._pending) != seen:
                seen, last_arrival = len(self._pending), now
            if now - last_arrival >= self.gather_s or now - started >= GATHER_MAX_S:
                return
            await asyncio.sleep(0.002)

    def _next_batch(self) -> list[_Request]:
        """The oldest pending request and, with it, the pending requests closest to its length
        that fit in one batch: at most `max_batch`, and a KV cache (rows x longest row) of at most
        `batch_bytes`. Rows of similar length waste less of the cache (every row is as wide as
        the longest) and of each decoding step's attention; the oldest always goes, so none
        waits forever."""

        def size(request: _Request) -> int:
            return len(request.prompt) + request.sampling.max_new_tokens

        oldest = self._pending[0]
        others = sorted(range(1, len(self._pending)), key=lambda i: abs(size(self._pending[i]) - size(oldest)))
        chosen, longest = [0], size(oldest)
        for i in others:
            if len(chosen) >= self.max_batch:
                break
            longest_next = max(longest, size(self._pending[i]))
            if (len(chosen) + 1) * longest_next * self._kv_token_bytes > self.batch_bytes:
                continue  # too wide with this one; a closer-length one further on may still fit
            chosen.append(i)
            longest = longest_next
        taken = set(chosen)
        batch = [self._pending[i] for i in sorted(taken)]
        self._pending = [r for i, r in enumerate(self._pending) if i not in taken]
        return batch

    async def _run_batches(self) -> None:
        assert self._wakeup is not None
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            for _ in range(3):  # let episodes that are ready right now enqueue too
                await asyncio.sleep(0)
            await self._gather()
            while self._pending:
                batch = self._next_batch()
                try:
                    results = await asyncio.to_thread(
                        self.generate_batch, [r.prompt for r in batch], [r.sampling for r in batch], [r.episode for r in batch]
                    )
                except Exception as err:  # reported to every waiting episode, never swallowed
                    for r in batch:
                        if not r.future.done():
                            r.future.set_exception(PolicyError(f"{self.name}: {type(err).__name__}: {err}"))
                    continue
                self._ended = 0
                for r, res in zip(batch, results):
                    if not r.future.done():
                        r.future.set_result(res)
                if self._pending and self.refill_batches:  # more than one batch held: wait for the answered rows' successors
                    for _ in range(3):
                        await asyncio.sleep(0)
                    await self._gather(leftovers=True)

    # ---- sync core -----------------------------------------------------------------------------

    def _forward(self, ids: torch.Tensor, attn: torch.Tensor, pos: torch.Tensor, cache: Any) -> Any:
        # only the last position's logits are sampled from: the LM head skips the others
        return self.model(
            input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=True, logits_to_keep=1, **{cache_kwarg(self.model): cache}
        )

    def _new_cache(self, rows: int, capacity: int) -> Any:
        cache = buffer_cache(rows, _kv_shape(self.model), capacity, self.dtype, self.device, self._keys_transposed)
        for layer in cache.layers:
            layer.whole_buffer_at = self.whole_buffer_at
        return cache

    def _shared_prefix(self, prompts: list[list[int]]) -> tuple[int, Any]:
        """The rows' common leading tokens (the system prompt and tool list, a GRPO group's task)
        run once: (length, a one-row cache holding them)."""
        shared = common_prefix_length(prompts) if len(prompts) > 1 else 0
        if shared < MIN_SHARED:
            return 0, None
        cache = self._new_cache(1, shared)
        ids = torch.tensor([prompts[0][:shared]], device=self.device)
        self._forward(ids, torch.ones_like(ids), torch.arange(shared, device=self.device).unsqueeze(0), cache)
        return shared, cache

    def _prefill(self, prompts: list[list[int]], keys: list[str | None], max_new: int) -> _Prefill:
        """The batch's first forward. Rows that start fresh with the same prompt (a GRPO group's
        samples of one task) are computed once and their cache, logits, mask and positions
        copied: the logits are those of the prompt alone, so every copy samples as if it had
        run by itself (its own seed decides its tokens)."""
        entries = [self.kv.take(k, p) for k, p in zip(keys, prompts)]
        first: dict[tuple[int, ...], int] = {}
        source = [i if entries[i] is not None else first.setdefault(tuple(p), i) for i, p in enumerate(prompts)]
        run = sorted(set(source))
        if len(run) == len(prompts) or not self.share_identical_prompts:
            return self._prefill_rows(prompts, entries, max_new)
        pre = self._prefill_rows([prompts[i] for i in run], [entries[i] for i in run], max_new)
        index = torch.tensor([run.index(i) for i in source], device=self.device)
        for layer in pre.cache.layers:
            layer.select_rows(index)
        self.kv.deduplicated_tokens += sum(len(prompts[i]) for i in range(len(prompts)) if source[i] != i)
        return _Prefill(
            _Logits(pre.out.logits[index]),
            pre.attention[index],
            pre.positions[index],
            pre.cache,
            [pre.past[j] for j in index.tolist()],
            [pre.new[j] for j in index.tolist()],
            pre.width,
        )

    def _prefill_rows(self, prompts: list[list[int]], entries: list[CachedEpisode | None], max_new: int) -> _Prefill:
        """The first forward of distinct rows. Each row's past comes from its episode's stored
        keys and values (a later turn) or from the batch's shared prefix (first turns); only the
        rest of its prompt runs. Cache layout per row: [past][pads] [pads][new tokens]
        [generated...]; the mask is 0 on pads, positions continue the row's own sequence."""
        dev, n = self.device, len(prompts)
        fresh = [i for i, e in enumerate(entries) if e is None]
        shared, prefix = self._shared_prefix([prompts[i] for i in fresh])
        past = [len(e.tokens) if e is not None else shared for e in entries]
        new = [len(p) - c for p, c in zip(prompts, past)]
        width_past, width_new = max(past), max(new)
        width = width_past + width_new
        cache = self._new_cache(n, width + max_new)
        for number, layer in enumerate(cache.layers):
            if prefix is not None and fresh:
                head = prefix.layers[number]
                layer.write(fresh, head.keys, head.values)
            for i, entry in enumerate(entries):
                if entry is not None:
                    layer.write(i, entry.keys[number], entry.values[number])
            layer.advance(width_past)
        attention = torch.zeros((n, width + max_new), dtype=torch.long)
        attention[:, width:] = 1
        ids = torch.full((n, width_new), self.pad_id, dtype=torch.long)
        pos = torch.zeros((n, width_new), dtype=torch.long)
        for i, p in enumerate(prompts):
            attention[i, : past[i]] = 1
            attention[i, width - new[i] : width] = 1
            ids[i, width_new - new[i] :] = torch.tensor(p[past[i] :])
            pos[i, width_new - new[i] :] = torch.arange(past[i], len(p))
        self.kv.reused_tokens += sum(len(e.tokens) for e in entries if e is not None)
        self.kv.computed_tokens += sum(new) + shared
        attention, ids, pos = attention.to(dev), ids.to(dev), pos.to(dev)
        out = self._forward_by_length(ids, attention, pos, cache, new, width_past)
        return _Prefill(out, attention, pos, cache, past, new, width)

    def _forward_by_length(
        self, ids: torch.Tensor, attention: torch.Tensor, pos: torch.Tensor, cache: Any, new: list[int], width_past: int
    ) -> Any:
        """The prompts' new tokens through the model, in chunks of rows of similar length.

        In one forward every row is padded to the longest prompt: with tool lists of a few
        hundred to several hundred tokens, most of a batch's prefill compute went to pads
        (64 BFCL held-out prompts: 44.5k padded positions for 15.7k real tokens). Each chunk runs only to its
        own longest row, on a small cache holding the rows' past, and its keys and values are
        copied into the batch's cache at the columns the single forward would have written
        (positions are explicit, so a key does not depend on its column)."""
        n, width_new = ids.shape
        width = width_past + width_new
        order = sorted(range(n), key=lambda i: new[i])
        chunks: list[list[int]] = []
        for i in order:
            if chunks and (not self.chunk_prefill or new[i] <= PAD_SLACK * max(1, new[chunks[-1][0]])):
                chunks[-1].append(i)
            else:
                chunks.append([i])
        if len(chunks) == 1:
            # the mask covers the filled columns; transformers pads it with zeros to the whole buffer
            return self._forward(ids, attention[:, :width], pos, cache)
        logits: torch.Tensor | None = None
        for chunk in chunks:
            w = max(new[i] for i in chunk)
            rows = torch.tensor(chunk, device=self.device)
            small = self._new_cache(len(chunk), width_past + w)
            for big_layer, layer in zip(cache.layers, small.layers):
                layer.write(slice(None), big_layer._key_columns(0, width_past)[rows], big_layer.value_buffer[rows, :, :width_past])
                layer.advance(width_past)
            cols = torch.cat([torch.arange(width_past), torch.arange(width - w, width)]).to(self.device)
            out = self._forward(ids[rows, width_new - w :], attention[rows][:, cols], pos[rows, width_new - w :], small)
            for big_layer, layer in zip(cache.layers, small.layers):
                big_layer.write(
                    chunk,
                    layer._key_columns(width_past, width_past + w),
                    layer.value_buffer[:, :, width_past : width_past + w],
                    start=width - w,
                )
            if logits is None:
                logits = out.logits.new_empty((n, *out.logits.shape[1:]))
            logits[rows] = out.logits
        for layer in cache.layers:
            layer.advance(width)
        return _Logits(logits)

    def _keep_rows(
        self,
        pre: _Prefill,
        prompts: list[list[int]],
        keys: list[str | None],
        tokens: torch.Tensor,
        lengths: torch.Tensor,
        live: torch.Tensor,
        batch_rows: list[int],
    ) -> None:
        """Store the episodes of the cache's rows `batch_rows` (original rows `live[b]`) for their
        next turn: the prompt and every generated token but the last (whose keys were never
        computed)."""
        for b in batch_rows:
            i = int(live[b])
            length = int(lengths[i])
            if keys[i] is None or length == 0:
                continue
            fed = length - 1
            cols = torch.cat([torch.arange(pre.past[i]), torch.arange(pre.width - pre.new[i], pre.width + fed)])
            cols = cols.to(self.device)
            rows = [layer.read(b, cols) for layer in pre.cache.layers]
            self.kv.put(
                keys[i], CachedEpisode(tokens=prompts[i] + tokens[i, :fed].tolist(), keys=[k for k, _ in rows], values=[v for _, v in rows])
            )

    def load_weights(self, state: dict[str, torch.Tensor], version: int) -> None:
        """Replace the weights (a trainer's push) once the running batch is done; later turns
        report `version`."""
        with self._weights_lock:
            self.model.load_state_dict(state)
            self.version = version

    def generate_batch(
        self, prompts: list[list[int]], samplings: list[SamplingParams], episodes: list[str | None] | None = None
    ) -> list[Generation]:
        """Generate completions for several prompts at once (left padding, one KV cache).

        `episodes` names the episode of each row (None: not cached between turns). Sampling,
        stop checks and bookkeeping stay on the policy's device; tokens and logprobs are copied
        back once at the end. A row's tokens depend only on its prompt and seed, never on its
        batch or on what was cached (counter-based draws; see `inference/sampling.py`)."""
        with self._weights_lock:
            fingerprint = weights_fingerprint(self.model)
            if fingerprint != self._fingerprint:  # new weights: every cached key and value is stale
                self.kv.clear()
                self._fingerprint = fingerprint
            try:
                generations = self._generate_batch(prompts, samplings, episodes or [None] * len(prompts))
            finally:
                self.activity = None
                # a batch's tensors differ in size from the next one's: without this the freed
                # memory stays in malloc's arenas and the process grows evaluation by evaluation
                release_memory(collect=False)
            for g in generations:
                g.weight_version = self.version
        return generations

    @torch.no_grad()
    def _generate_batch(self, prompts: list[list[int]], samplings: list[SamplingParams], episodes: list[str | None]) -> list[Generation]:
        if not prompts:
            return []
        if min(len(p) for p in prompts) == 0:
            raise PolicyError("empty prompt")
        self.batch_sizes.append(len(prompts))
        dev, n = self.device, len(prompts)
        # a row without a seed asked for fresh randomness: it gets its own, never a fixed default
        seeds = torch.tensor(
            [s.seed & _MASK32 if s.seed is not None else secrets.randbits(31) for s in samplings], dtype=torch.long, device=dev
        )
        temperature = torch.tensor([s.temperature for s in samplings], dtype=torch.float32, device=dev)
        scale = torch.where(temperature > 0, temperature, torch.ones_like(temperature))
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
        self.activity = (n, 0, max_new)
        pre = self._prefill(prompts, episodes, max_new)
        out, pos = pre.out, pre.positions
        # the batch's rows still decoding, as original row numbers (row b of the cache is live[b])
        live = torch.arange(n, device=dev)
        # asking "all done?" syncs with the device: on CPU it is free, on an accelerator batch it
        sync_every = 1 if torch.device(dev).type == "cpu" else SYNC_EVERY
        for step in range(max_new):
            self.activity = (n, step + 1, max_new)
            logits = out.logits[:, -1, :].float()
            tok = sample_tokens(logits, temperature[live], top_k[live], top_p[live], seeds[live], step)
            finished = done[live]
            tok = torch.where(finished, torch.full_like(tok, self.pad_id), tok)
            active = ~finished
            tokens[live, step] = tok
            # the logprob under the distribution sampled from, softmax(logits / T), which the
            # trainer recomputes (greedy rows: the model's own)
            logps[live, step] = torch.log_softmax(logits / scale[live].unsqueeze(1), dim=-1).gather(1, tok.unsqueeze(1)).squeeze(1)
            lengths[live] += active.long()
            hit_stop = active & (tok.unsqueeze(1) == stops[live]).any(dim=1)
            stopped[live] |= hit_stop
            done[live] |= hit_stop | (lengths[live] >= limit[live])
            if step == max_new - 1 or (step % sync_every == sync_every - 1 and bool(done.all())):
                break
            if self.shrink_batch and step % sync_every == sync_every - 1:
                running = ~done[live]
                if int(running.sum()) <= SHRINK_AT * len(live):
                    # most rows are done: store the finished rows' episodes, then decode only the rest
                    finished_rows = (~running).nonzero().squeeze(1)
                    self._keep_rows(pre, prompts, episodes, tokens, lengths, live, finished_rows.tolist())
                    keep = running.nonzero().squeeze(1)
                    for layer in pre.cache.layers:
                        layer.select_rows(keep)
                    pre.attention, pos, tok, live = pre.attention[keep], pos[keep], tok[keep], live[keep]
            if step % TRIM_EVERY == TRIM_EVERY - 1:
                release_memory(collect=False)
            pos = pos[:, -1:] + 1
            out = self._forward(tok.unsqueeze(1), pre.attention[:, : pre.width + step + 1], pos, pre.cache)
        self._keep_rows(pre, prompts, episodes, tokens, lengths, live, list(range(len(live))))
        tokens_h, logps_h = tokens.tolist(), logps.tolist()
        lengths_h, stopped_h = lengths.tolist(), stopped.tolist()
        generated = [tokens_h[i][: lengths_h[i]] for i in range(n)]
        return [
            Generation(token_ids=generated[i], logprobs=logps_h[i][: lengths_h[i]], finish_reason="stop" if stopped_h[i] else "length")
            for i in range(n)
        ]
