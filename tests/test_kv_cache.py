"""Generation keeps each episode's keys and values between turns: the same tokens as a fresh
prefill, never stale after a weight change, freed when the episode ends; the CPU attention path
computes what SDPA computes."""

from __future__ import annotations

import torch

import toolgym
from toolgym.harness.agents import TokenAgent
from toolgym.harness.rollout import RolloutLimits, RolloutRunner
from toolgym.inference.hf_policy import HFPolicy
from toolgym.inference.kv_cache import BufferLayer, CachedEpisode, EpisodeKVStore
from toolgym.inference.policy import SamplingParams
from toolgym.tasks import builtin_suite


def _two_turns(policy: HFPolicy, keys):
    """Turn 1 on four prompts sharing a head, then turn 2 on each prompt + its reply + an
    observation, with `keys` naming the episodes (or None)."""
    gen = torch.Generator().manual_seed(0)
    vocab = policy.model.config.vocab_size
    head = torch.randint(10, vocab, (40,), generator=gen).tolist()
    prompts = [head + torch.randint(10, vocab, (3 + 4 * i,), generator=gen).tolist() for i in range(4)]
    first = [SamplingParams(max_new_tokens=8, seed=i, stop_token_ids=(-1,)) for i in range(4)]
    out1 = policy.generate_batch(prompts, first, keys)
    prompts2 = [p + g.token_ids + torch.randint(10, vocab, (5 + i,), generator=gen).tolist() for i, (p, g) in enumerate(zip(prompts, out1))]
    second = [SamplingParams(max_new_tokens=8, seed=50 + i, stop_token_ids=(-1,)) for i in range(4)]
    return prompts2, second, policy.generate_batch(prompts2, second, keys)


def test_a_cached_turn_generates_what_a_fresh_prefill_generates(tiny_dir):
    cached = HFPolicy(tiny_dir, device="cpu", dtype="fp32")
    prompts2, second, with_cache = _two_turns(cached, [f"ep{i}" for i in range(4)])
    assert cached.kv.reused_tokens == sum(len(p) for p in prompts2) - sum(5 + i for i in range(4)) - 4 * 1
    fresh = HFPolicy(tiny_dir, device="cpu", dtype="fp32")
    for prompt, sampling, got in zip(prompts2, second, with_cache):
        alone = fresh.generate_batch([prompt], [sampling])[0]
        assert got.token_ids == alone.token_ids
        assert max(abs(a - b) for a, b in zip(got.logprobs, alone.logprobs)) < 1e-4


def test_changed_weights_are_never_served_from_the_cache(tiny_dir):
    policy = HFPolicy(tiny_dir, device="cpu", dtype="fp32")
    keys = ["a", "b", "c", "d"]
    prompts2, second, _ = _two_turns(policy, keys)
    with torch.no_grad():  # an optimizer step, in place
        for p in policy.model.parameters():
            p.add_(0.01 * torch.randn_like(p))
    reused = policy.kv.reused_tokens
    again = policy.generate_batch([p + [7] for p in prompts2], second, keys)
    assert policy.kv.reused_tokens == reused  # the store was emptied: nothing computed by old weights
    fresh = HFPolicy(policy.model, tokenizer=policy.tokenizer, device="cpu", dtype="fp32")
    for prompt, sampling, got in zip(prompts2, second, again):
        assert fresh.generate_batch([prompt + [7]], [sampling])[0].token_ids == got.token_ids


def _play_tiny(tiny_dir, tasks: int, seed: int, max_turns: int, max_new: int, concurrency: int, group_size: int = 1, max_batch: int = 128):
    """`tasks` records train tasks played by the tiny policy through the rollout runner: (policy, trajectories)."""
    policy = HFPolicy(tiny_dir, device="cpu", dtype="fp32", max_batch=max_batch)
    agent = TokenAgent(policy, policy.tokenizer, SamplingParams(max_new_tokens=max_new, temperature=1.0))
    runner = RolloutRunner(
        lambda env_id: toolgym.make(env_id).unwrapped,
        agent,
        group_size=group_size,
        concurrency=concurrency,
        progress=False,
        limits=RolloutLimits(max_turns=max_turns, max_new_tokens_per_turn=max_new),
    )
    try:
        return policy, runner.run(builtin_suite("records").split("train").tasks[:tasks], seed=seed)
    finally:
        runner.close()


def test_episodes_are_freed_when_they_end_and_turns_are_batched_together(tiny_dir):
    policy, trajs = _play_tiny(tiny_dir, tasks=2, seed=4, max_turns=3, max_new=12, concurrency=6, group_size=3)
    assert len(trajs) == 6 and all(t.has_tokens for t in trajs)
    assert policy.kv.reused_tokens > 0
    assert len(policy.kv) == 0 and policy.kv.nbytes == 0 and not policy._live  # every episode released
    # each turn of the six episodes was one batch (the batcher waits for episodes still stepping)
    assert policy.batch_sizes[0] == 6 and len(policy.batch_sizes) <= max(len(t.turns) for t in trajs) + 1


def test_episodes_that_start_as_others_end_join_the_next_batch_not_a_batch_of_leftovers(tiny_dir):
    """More episodes run at once than a batch holds: after each batch the leftover requests wait
    for the episodes that start in the answered ones' place, so every batch but the last is full
    (20 episodes, 8 at a time, 6 rows a batch: 6, 6, 6, 2; a batch of the 2 leftovers after each
    full one made 5 batches)."""
    policy, trajs = _play_tiny(tiny_dir, tasks=20, seed=2, max_turns=1, max_new=4, concurrency=8, max_batch=6)
    assert len(trajs) == 20 and all(t.has_tokens for t in trajs)
    assert policy.batch_sizes == [6, 6, 6, 2] and not policy._live


def test_the_store_keeps_only_strict_prefixes_within_its_memory_bound():
    entry = CachedEpisode(tokens=[1, 2, 3], keys=[torch.zeros(2, 3, 4)], values=[torch.zeros(2, 3, 4)])
    store = EpisodeKVStore(max_bytes=2 * entry.nbytes)
    store.put("a", entry)
    assert store.take("a", [1, 2, 3]) is None  # not a strict prefix (nothing left to compute)
    store.put("a", entry)
    assert store.take("a", [1, 9, 3, 4]) is None and len(store) == 0  # another path: dropped
    for key in "abc":
        store.put(key, entry)
    assert len(store) == 2 and store.take("a", [1, 2, 3, 4]) is None  # the oldest was evicted
    assert store.take("c", [1, 2, 3, 4]) is entry


def test_buffer_layer_layouts_hold_the_same_cache():
    torch.manual_seed(0)
    plain = BufferLayer(2, 3, 4, 5, torch.float32, torch.device("cpu"))
    transposed = BufferLayer(2, 3, 4, 5, torch.float32, torch.device("cpu"), keys_transposed=True)
    past_k, past_v = torch.randn(3, 2, 4), torch.randn(3, 2, 4)
    new_k, new_v = torch.randn(2, 3, 6, 4), torch.randn(2, 3, 6, 4)  # past the capacity: grows
    for layer in (plain, transposed):
        layer.write([1], past_k, past_v)
        layer.advance(2)
        keys, values = layer.update(new_k, new_v)
        assert layer.get_seq_length() == 8 and layer.capacity >= 8
        # attention reads the filled columns only, never the room left for later tokens
        assert keys.shape == (2, 3, 8, 4) and values.shape == keys.shape
        assert torch.equal(keys[:, :, 2:], new_k) and torch.equal(values[:, :, 2:], new_v)
        assert layer.get_mask_sizes(1) == (9, 0)
    for layer in (plain, transposed):
        k, v = layer.read(1, torch.tensor([0, 1, 2, 7]))
        assert torch.equal(k, torch.cat([past_k, new_k[1][:, [0, 5]]], dim=1))
        assert torch.equal(v, torch.cat([past_v, new_v[1][:, [0, 5]]], dim=1))


def test_grouped_query_attention_equals_sdpa():
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from toolgym.inference.cpu_attention import grouped_query_attention

    torch.manual_seed(0)
    module = torch.nn.Module()
    module.num_key_value_groups, module.is_causal = 3, True
    module.eval()
    q, k, v = torch.randn(2, 6, 1, 8), torch.randn(2, 2, 10, 8), torch.randn(2, 2, 10, 8)
    mask = torch.zeros(2, 1, 1, 10)
    mask[1, :, :, 7:] = torch.finfo(torch.float32).min  # padding: row 1 sees 7 keys
    got, _ = grouped_query_attention(module, q, k, v, mask, scaling=8**-0.5)
    want, _ = sdpa_attention_forward(module, q, k, v, mask, scaling=8**-0.5)
    assert got.shape == want.shape == (2, 1, 6, 8)
    assert torch.allclose(got, want, atol=1e-5)


def test_a_decoding_step_attends_over_the_whole_buffer_once_it_is_filled_enough():
    layer = BufferLayer(2, 3, 4, 8, torch.float32, torch.device("cpu"), keys_transposed=True)
    layer.whole_buffer_at = 0.5
    layer.update(torch.randn(2, 3, 2, 4), torch.randn(2, 3, 2, 4))  # a prefill: the filled columns only
    assert layer.get_mask_sizes(1) == (3, 0)  # 3 of 8 filled after the step: below half
    keys, values = layer.update(torch.randn(2, 3, 1, 4), torch.randn(2, 3, 1, 4))
    assert keys.shape == values.shape == (2, 3, 3, 4)
    assert layer.get_mask_sizes(1) == (8, 0) and layer.get_mask_sizes(2) == (5, 0)  # one token only
    new_k = torch.randn(2, 3, 1, 4)
    keys, values = layer.update(new_k, torch.randn(2, 3, 1, 4))
    assert keys.shape == values.shape == (2, 3, 8, 4)  # the whole buffer, unwritten columns still 0
    assert torch.equal(keys[:, :, 3:4], new_k) and not keys[:, :, 4:].any() and not values[:, :, 4:].any()
    assert layer.get_seq_length() == 4 and layer.keys.shape == (2, 3, 4, 4)


def test_whole_buffer_decoding_generates_what_the_filled_columns_generate(tiny_dir):
    """The columns not yet written are masked (causality over the whole buffer), so attending
    over them changes nothing: same tokens and logprobs, rows of different lengths (left
    padding), sampled and across a cached second turn, in fp32 (SDPA) and bf16 (the CPU matmul
    path, `inference/cpu_attention.py`)."""
    for dtype, tolerance in (("fp32", 1e-4), ("bf16", 2e-2)):
        runs = []
        for share in (0.0, 1e-6):
            policy = HFPolicy(tiny_dir, device="cpu", dtype=dtype)
            policy.whole_buffer_at = share
            _, _, out = _two_turns(policy, [f"ep{i}" for i in range(4)])
            assert policy.kv.reused_tokens > 0
            runs.append(out)
        for filled, whole in zip(*runs):
            assert filled.token_ids == whole.token_ids
            assert max(abs(a - b) for a, b in zip(filled.logprobs, whole.logprobs)) < tolerance
