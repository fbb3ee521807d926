"""Padding-free training forwards give the logits and gradients of padded ones, never mix rows,
and fall back to padding for a model that cannot carry the segments."""

from __future__ import annotations

import pytest
import torch

import toolgym
from toolgym.harness.demonstrations import collect_demonstrations
from toolgym.inference.hf_policy import HFPolicy
from toolgym.inference.prefix import forward_logits
from toolgym.tasks import builtin_suite
from toolgym.trainers import batching
from toolgym.trainers.batching import pack, sequence_logprobs
from toolgym.trainers.learner import Learner, LearnerConfig, LoraSettings, apply_lora
from toolgym.trainers.packing import PackingUnsupported, packed_logits


def _batch(vocab: int, prefix: int, lengths=(5, 17, 9, 30)) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded rows sharing `prefix` tokens, and a keep mask on the second half of each row."""
    g = torch.Generator().manual_seed(prefix)
    head = torch.randint(10, vocab, (prefix,), generator=g)
    rows = [torch.cat([head, torch.randint(10, vocab, (n,), generator=g)]) for n in lengths]
    ids = torch.zeros((len(rows), max(len(r) for r in rows)), dtype=torch.long)
    attention = torch.zeros_like(ids)
    keep = torch.zeros_like(ids, dtype=torch.bool)
    for i, r in enumerate(rows):
        ids[i, : len(r)], attention[i, : len(r)] = r, 1
        keep[i, max(prefix, len(r) // 2) : len(r) - 1] = True
    return ids, attention, keep


def _logits_and_grads(model, fn, ids, attention, keep):
    model.zero_grad()
    logits = fn(model, ids, attention, keep)
    (logits.float().logsumexp(-1) * torch.linspace(0.5, 1.5, logits.shape[0])).sum().backward()
    return logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("prefix", [40, 0], ids=["shared-prefix", "no-prefix"])
def test_packed_logits_and_gradients_equal_the_padded_forward(tiny_dir, prefix):
    model = HFPolicy(tiny_dir, device="cpu", dtype="fp32").model
    assert model.config.num_key_value_heads < model.config.num_attention_heads  # grouped-query attention
    ids, attention, keep = _batch(model.config.vocab_size, prefix)
    padded, g_padded = _logits_and_grads(model, forward_logits, ids, attention, keep)
    packed, g_packed = _logits_and_grads(model, packed_logits, ids, attention, keep)
    assert packed.shape == padded.shape == (int(keep.sum()), model.config.vocab_size)
    assert (packed - padded).abs().max() < 1e-4
    for name in g_padded:
        assert torch.allclose(g_padded[name], g_packed[name], rtol=1e-3, atol=1e-6), name
    assert model.config._attn_implementation == "sdpa"  # the model's own attention is back


def test_answers_that_start_alike_are_packed_from_their_first_trained_token(tiny_dir):
    """A GRPO group: one prompt, answers whose first tokens agree. The prefix run once stops at
    the first trained position, and the answers run packed (not the padded fallback)."""
    model = HFPolicy(tiny_dir, device="cpu", dtype="fp32").model
    ids, attention, keep = _batch(model.config.vocab_size, 40, lengths=(25, 31, 22))
    ids[:, 40:50] = ids[0, 40:50]  # every answer starts with the same 10 tokens
    keep[:] = False
    for i, n in enumerate(attention.sum(1).tolist()):
        keep[i, 39 : n - 1] = True  # the answer's tokens, from its first one (predicted at column 39)
    padded, g_padded = _logits_and_grads(model, forward_logits, ids, attention, keep)
    packed, g_packed = _logits_and_grads(model, packed_logits, ids, attention, keep)
    assert (packed - padded).abs().max() < 1e-4
    for name in g_padded:
        assert torch.allclose(g_padded[name], g_packed[name], rtol=1e-3, atol=1e-6), name


def test_a_row_never_sees_another_row(tiny_dir):
    """Changing one row's tokens leaves every other row's packed logits as they were."""
    model = HFPolicy(tiny_dir, device="cpu", dtype="fp32").model
    ids, attention, keep = _batch(model.config.vocab_size, 20)
    with torch.no_grad():
        before = packed_logits(model, ids, attention, keep)
        changed = ids.clone()
        changed[1, 25:30] = (changed[1, 25:30] + 7) % model.config.vocab_size
        after = packed_logits(model, changed, attention, keep)
    rows = torch.arange(ids.shape[0]).unsqueeze(1).expand_as(keep)[keep]  # the row of each kept logit
    assert (after[rows != 1] - before[rows != 1]).abs().max() < 1e-5
    assert (after[rows == 1] - before[rows == 1]).abs().max() > 1e-3


class _DropsKeywords(torch.nn.Module):
    """A causal LM whose forward passes only the arguments it knows (not the segments) on."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner
        self.config = inner.config

    def set_attn_implementation(self, name: str) -> None:
        self.inner.set_attn_implementation(name)

    def forward(self, input_ids, attention_mask=None, position_ids=None, logits_to_keep=0, use_cache=None, **_):
        return self.inner(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, logits_to_keep=logits_to_keep, use_cache=False
        )


def test_a_model_that_drops_the_segments_fails_loudly_and_trains_padded(tiny_dir, monkeypatch):
    model = HFPolicy(tiny_dir, device="cpu", dtype="fp32").model
    ids, attention, keep = _batch(model.config.vocab_size, 0)
    wrapped = _DropsKeywords(model)
    with pytest.raises(PackingUnsupported, match="toolgym_segments"):
        packed_logits(wrapped, ids, attention, keep)
    assert model.config._attn_implementation == "sdpa"
    monkeypatch.setattr(batching, "_PACKING_REFUSED", {})
    mask = keep[:, :-1].float()
    with pytest.warns(UserWarning, match="padding-free training forward unavailable"):
        logp, _ = sequence_logprobs(wrapped, ids, attention, mask=mask, pack=True)
    expected, _ = sequence_logprobs(model, ids, attention, mask=mask)
    assert (logp - expected).abs().max() < 1e-5
    assert batching._PACKING_REFUSED[_DropsKeywords]  # not tried again for this class


def test_a_row_that_is_all_shared_prefix_has_no_segment_of_its_own(tiny_dir):
    model = HFPolicy(tiny_dir, device="cpu", dtype="fp32").model
    ids, attention, keep = _batch(model.config.vocab_size, 30, lengths=(0, 12, 7))
    assert int(attention[0].sum()) == 30  # row 0 is the others' shared prefix and nothing more
    with torch.no_grad():
        padded = forward_logits(model, ids, attention, keep)
        packed = packed_logits(model, ids, attention, keep)
    assert (packed - padded).abs().max() < 1e-4


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_sft_steps_packed_and_padded_learn_the_same(tiny_dir, lora):
    """The learner's SFT step on demonstrations of different lengths: the same loss and the same
    update with or without padding (with LoRA, through peft's wrapper)."""
    tokenizer = HFPolicy(tiny_dir, device="cpu", dtype="fp32").tokenizer
    demos = collect_demonstrations(
        builtin_suite("records").split("train").tasks[:6], tokenizer, lambda *a: toolgym.make("records-v0").unwrapped, progress=False
    )
    batch = pack(demos, [0.0] * len(demos), tokenizer.pad_token_id or 0)
    lengths = batch.attention.sum(1)
    assert lengths.max() - lengths.min() >= 20  # padding to the longest row would be real work
    results = []
    for packing in (True, False):
        policy = HFPolicy(tiny_dir, device="cpu", dtype="fp32")
        settings = LoraSettings(r=4, alpha=8) if lora else None
        if settings:
            torch.manual_seed(0)  # the adapters' initial weights, the same in both arms
            policy.model = apply_lora(policy.model, settings)
        learner = Learner(policy.model, LearnerConfig(lr=1e-3, packing=packing, lora=settings))
        metrics = learner.sft_step(batch)
        results.append((metrics["sft_loss"], torch.cat([p.detach().flatten() for p in policy.model.parameters()])))
    (loss_packed, weights_packed), (loss_padded, weights_padded) = results
    assert abs(loss_packed - loss_padded) < 1e-5
    assert torch.allclose(weights_packed, weights_padded, rtol=1e-4, atol=1e-6)
