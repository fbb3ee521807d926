"""Token-by-token: the loss mask is 1 exactly on policy tokens, and (for a prefix-stable template)
the trajectory equals a full re-render of the conversation."""

import asyncio

import pytest
from conftest import ScriptedTokenPolicy

import toolgym
from toolgym.harness import ChatRenderer, RolloutLimits, TokenAgent, run_episode
from toolgym.tasks import builtin_suite
from toolgym.verifiers import Outcome


class RecordingPolicy:
    """Wraps a real policy and records exactly which tokens it returned."""

    def __init__(self, inner):
        self.inner, self.name, self.returned = inner, inner.name, []

    async def generate(self, prompt_ids, sampling):
        gen = await self.inner.generate(prompt_ids, sampling)
        self.returned.append((list(prompt_ids), gen))
        return gen


def _play(agent, task, **limits):
    env = toolgym.make("records-v0").unwrapped
    return asyncio.run(run_episode(env, agent, task, seed=3, limits=RolloutLimits(**limits)))


@pytest.mark.parametrize("index", [0, 1, 2])  # difficulties 1, 2, 3
def test_mask_exact_and_equal_to_full_render(tiny_policy, index):
    task = builtin_suite("records").tasks[index]
    policy = ScriptedTokenPolicy(tiny_policy.tokenizer, task)
    traj = _play(TokenAgent(policy, tiny_policy.tokenizer), task)
    assert traj.outcome == Outcome.PASSED and traj.reward == 1.0

    # Mask: 1 exactly at the positions where the policy's returned tokens were appended.
    expected = [0] * len(traj.token_ids)
    for prompt_len, ids in policy.calls:
        assert traj.token_ids[prompt_len : prompt_len + len(ids)] == ids  # context = all tokens so far
        for i in range(prompt_len, prompt_len + len(ids)):
            expected[i] = 1
    assert traj.loss_mask == expected
    assert sum(traj.loss_mask) == sum(len(ids) for _, ids in policy.calls)
    lp = traj.logprobs
    assert all(lp[i] == -0.5 for i, m in enumerate(traj.loss_mask) if m) and all(
        lp[i] == 0.0 for i, m in enumerate(traj.loss_mask) if not m
    )

    # The tiny template is prefix-stable: the assembled tokens equal a full re-render.
    renderer = ChatRenderer(tiny_policy.tokenizer, toolgym.make("records-v0").unwrapped.tool_schemas())
    full = renderer.encode(renderer.render_text(traj.messages))
    assert traj.token_ids == full[: len(traj.token_ids)]
    assert tiny_policy.tokenizer.decode(full[len(traj.token_ids) :]).strip() == ""


def test_mask_with_the_real_tiny_model(tiny_policy):
    task = builtin_suite("records").tasks[5]
    rec = RecordingPolicy(tiny_policy)
    traj = _play(TokenAgent(rec, tiny_policy.tokenizer), task, max_turns=3, max_new_tokens_per_turn=24)
    assert len(rec.returned) == len(traj.turns) == 3
    pos, mask = 0, traj.loss_mask
    for prompt, gen in rec.returned:
        assert traj.token_ids[: len(prompt)] == prompt  # earlier tokens never re-encoded
        start = len(prompt)
        assert traj.token_ids[start : start + len(gen.token_ids)] == gen.token_ids
        assert mask[pos:start] == [0] * (start - pos)
        assert mask[start : start + len(gen.token_ids)] == [1] * len(gen.token_ids)
        assert traj.logprobs[start : start + len(gen.token_ids)] == gen.logprobs
        pos = start + len(gen.token_ids)
    assert all(m == 0 for m in mask[pos:])
    # An untrained model writes no parsable tool call: a format error, graded reward 0.
    assert traj.outcome == Outcome.FORMAT_ERROR and traj.reward == 0.0


def test_token_budget_stops_the_episode(tiny_policy):
    task = builtin_suite("records").tasks[5]
    prompt_len = None
    traj = _play(TokenAgent(tiny_policy, tiny_policy.tokenizer), task, max_turns=50, max_new_tokens_per_turn=16, max_total_tokens=700)
    prompt_len = len(traj.segments[0].token_ids)
    assert prompt_len < 700 and len(traj.token_ids) <= 700 + 1 + 80
    assert traj.outcome in (Outcome.FORMAT_ERROR, Outcome.TIMEOUT)


def test_tool_exploration_opens_calls_the_policy_then_continues(tiny_policy):
    """`explore_tools`: a turn that explores starts with the opening of a call to one of the
    episode's tools (never another name), the policy is asked to continue exactly after it, the
    forced tokens are trained (mask 1) with a NaN behaviour logprob, and the policy's own tokens
    keep theirs. The draw is the episode's: a rerun explores the same turns with the same tools."""
    from toolgym.harness.rollout import explored_call_prefix

    task = builtin_suite("records").tasks[5]
    tools = toolgym.make("records-v0").unwrapped.tool_schemas()
    names = {t["function"]["name"] for t in tools}
    draws = [explored_call_prefix(0.5, tools, seed, 0, 0) for seed in range(400)]
    assert 150 < sum(bool(d) for d in draws) < 250 and explored_call_prefix(0.0, tools, 1, 0, 0) == ""
    assert {d.split('"name": "')[1].split('"')[0] for d in draws if d} == names
    assert draws == [explored_call_prefix(0.5, tools, seed, 0, 0) for seed in range(400)]

    rec = RecordingPolicy(tiny_policy)
    agent = TokenAgent(rec, tiny_policy.tokenizer, explore_tools=0.99)
    traj = _play(agent, task, max_turns=3, max_new_tokens_per_turn=24)
    policy_segments = [s for s in traj.segments if s.kind == "policy"]
    assert len(policy_segments) == len(rec.returned) == 3
    for segment, (prompt, gen) in zip(policy_segments, rec.returned):
        assert segment.forced > 0 and segment.text.startswith('<tool_call>\n{"name": "')
        assert segment.text.split('"name": "')[1].split('"')[0] in names
        forced = segment.token_ids[: segment.forced]
        assert prompt[-len(forced) :] == forced and segment.token_ids[segment.forced :] == gen.token_ids
        start = len(prompt) - len(forced)
        assert traj.loss_mask[start : start + len(segment.token_ids)] == [1] * len(segment.token_ids)
        lp = traj.logprobs[start : start + len(segment.token_ids)]
        assert all(x != x for x in lp[: segment.forced]) and lp[segment.forced :] == gen.logprobs
    with pytest.raises(ValueError, match="explore_tools"):
        TokenAgent(rec, tiny_policy.tokenizer, explore_tools=1.0)
