"""Shared-prefix forward passes give the logits, gradients and generations of plain ones."""

from __future__ import annotations

import torch

from toolgym.inference.hf_policy import HFPolicy
from toolgym.inference.policy import SamplingParams
from toolgym.inference.prefix import common_prefix_length, forward_logits, shared_prefix_length


def _batch(vocab: int, prefix: int = 40) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    head = torch.randint(10, vocab, (prefix,), generator=g)
    rows = [torch.cat([head, torch.randint(10, vocab, (n,), generator=g)]) for n in (5, 17, 9, 30)]
    width = max(len(r) for r in rows)
    ids = torch.zeros((len(rows), width), dtype=torch.long)
    attention = torch.zeros_like(ids)
    for i, r in enumerate(rows):
        ids[i, : len(r)], attention[i, : len(r)] = r, 1
    return ids, attention


def test_shared_prefix_logits_and_gradients_match_the_plain_forward(tiny_dir):
    policy = HFPolicy(tiny_dir, device="cpu", dtype="fp32")
    model = policy.model
    ids, attention = _batch(model.config.vocab_size)
    assert shared_prefix_length(ids, attention) == 40

    def loss_and_grads(fn):
        model.zero_grad()
        logits = fn()
        logp = torch.log_softmax(logits[:, :-1].float(), -1).gather(2, ids[:, 1:, None]).squeeze(2)
        loss = -(logp * attention[:, 1:]).sum()
        loss.backward()
        return logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}

    plain, g_plain = loss_and_grads(lambda: model(input_ids=ids, attention_mask=attention).logits)
    shared, g_shared = loss_and_grads(lambda: forward_logits(model, ids, attention))
    real = attention.bool()
    assert (plain[real] - shared[real]).abs().max() < 1e-4
    for name in g_plain:
        assert torch.allclose(g_plain[name], g_shared[name], rtol=1e-3, atol=1e-5), name


def test_generation_with_a_shared_prefix_equals_each_prompt_alone(tiny_dir):
    policy = HFPolicy(tiny_dir, device="cpu", dtype="fp32")
    head = list(range(100, 160))
    prompts = [head + [200 + i] * (i + 1) for i in range(4)]
    assert common_prefix_length(prompts) == 60
    sampling = [SamplingParams(max_new_tokens=12, temperature=1.0, seed=7 + i) for i in range(4)]
    together = policy.generate_batch(prompts, sampling)
    for p, s, g in zip(prompts, sampling, together):
        alone = policy.generate_batch([p], [s])[0]
        assert alone.token_ids == g.token_ids
        assert max(abs(a - b) for a, b in zip(alone.logprobs, g.logprobs)) < 1e-4


def test_identical_prompts_are_prefilled_once_and_sample_as_if_alone(tiny_dir):
    """A GRPO group's samples share one prompt: the batch computes it once, and each row still
    generates exactly what it generates alone with its own seed (and its own kept episode)."""
    policy = HFPolicy(tiny_dir, device="cpu", dtype="fp32")
    task_a, task_b = list(range(100, 150)), list(range(100, 120)) + list(range(300, 340))
    prompts = [task_a, task_b, task_a, task_a, task_b]
    sampling = [SamplingParams(max_new_tokens=10, temperature=1.0, seed=11 + i) for i in range(5)]
    before = policy.kv.computed_tokens
    together = policy.generate_batch(prompts, sampling, [f"ep{i}" for i in range(5)])
    assert policy.kv.deduplicated_tokens == 2 * len(task_a) + len(task_b)
    assert policy.kv.computed_tokens - before == len(task_a) + len(task_b) - 20  # their 20 shared tokens once
    assert len({tuple(g.token_ids) for g in together[0::2]}) > 1  # different seeds, different samples
    for p, s, g in zip(prompts, sampling, together):
        alone = policy.generate_batch([p], [s])[0]
        assert alone.token_ids == g.token_ids
        assert max(abs(a - b) for a, b in zip(alone.logprobs, g.logprobs)) < 1e-4
    # each row's episode kept its own keys and values: a second turn continues each one correctly
    follow = [p + g.token_ids + [7, 8, 9] for p, g in zip(prompts, together)]
    second = policy.generate_batch(follow, sampling, [f"ep{i}" for i in range(5)])
    assert policy.kv.reused_tokens > 0
    for p, s, g in zip(follow, sampling, second):
        assert policy.generate_batch([p], [s])[0].token_ids == g.token_ids


def test_rows_done_early_leave_the_batch_and_keep_their_episodes(tiny_dir):
    """Once most rows are done the batch decodes only the rest: every row still generates what it
    generates alone, and a row dropped early continues its episode from its kept cache."""
    policy = HFPolicy(tiny_dir, device="cpu", dtype="fp32")
    prompts = [list(range(100 + i, 140 + 3 * i)) for i in range(6)]
    budgets = [2, 3, 4, 16, 16, 5]
    sampling = [SamplingParams(max_new_tokens=b, temperature=1.0, seed=40 + i) for i, b in enumerate(budgets)]
    shrinks = []
    original = policy._keep_rows

    def spy(pre, prompts_, keys, tokens, lengths, live, batch_rows):
        shrinks.append(len(live))
        return original(pre, prompts_, keys, tokens, lengths, live, batch_rows)

    policy._keep_rows = spy
    together = policy.generate_batch(prompts, sampling, [f"ep{i}" for i in range(6)])
    assert shrinks[0] == 6 and shrinks[-1] < 6  # dropped rows were stored, then the batch went on smaller
    assert [len(g.token_ids) for g in together] == [min(b, len(g.token_ids)) for b, g in zip(budgets, together)]
    for p, s, g in zip(prompts, sampling, together):
        alone = policy.generate_batch([p], [s])[0]
        assert alone.token_ids == g.token_ids
        assert max(abs(a - b) for a, b in zip(alone.logprobs, g.logprobs)) < 1e-4
    follow = [p + g.token_ids + [5, 6] for p, g in zip(prompts, together)]
    reused = policy.kv.reused_tokens
    second = policy.generate_batch(follow, sampling, [f"ep{i}" for i in range(6)])
    assert policy.kv.reused_tokens - reused == sum(len(p) + len(g.token_ids) - 1 for p, g in zip(prompts, together))
    for p, s, g in zip(follow, sampling, second):
        assert policy.generate_batch([p], [s])[0].token_ids == g.token_ids


def test_masked_logprobs_equal_the_full_computation(tiny_dir):
    """Computing only the policy positions (the LM head skips the rest) gives the same values and
    gradients as computing every position and masking."""
    from toolgym.trainers.batching import sequence_logprobs

    model = HFPolicy(tiny_dir, device="cpu", dtype="fp32").model
    ids, attention = _batch(model.config.vocab_size)
    mask = torch.zeros((ids.shape[0], ids.shape[1] - 1))
    for i, n in enumerate(attention.sum(1).tolist()):
        mask[i, n // 2 : n - 1] = 1.0  # past the shared prefix for some rows, inside it for others
    mask[0, 3:6] = 1.0
    results = []
    for masked in (False, True):
        model.zero_grad()
        logp, ent = sequence_logprobs(model, ids, attention, with_entropy=True, mask=mask if masked else None)
        (-(logp * mask).sum()).backward()
        results.append((logp * mask, ent * mask, {n: p.grad.clone() for n, p in model.named_parameters()}))
    (a, ea, ga), (b, eb, gb) = results
    assert (a - b).abs().max() < 1e-5 and (ea - eb).abs().max() < 1e-4
    for name in ga:
        assert torch.allclose(ga[name], gb[name], rtol=1e-3, atol=1e-6), name
