"""The learnability sampler: draws by E[p(1-p)] before rollout, retires and re-tests, persists."""

import numpy as np
import pytest

from toolgym.trainers.sampler import LearnabilitySampler, SamplerConfig, beta_tail


def test_draws_are_proportional_to_expected_reward_variance():
    ids = ["half", "mostly-pass", "mostly-fail", "unseen"]
    s = LearnabilitySampler(ids, SamplerConfig(floor=0.0, decay=1.0, min_attempts=1000))
    s.update("half", [1, 0] * 5)
    s.update("mostly-pass", [1] * 9 + [0])
    s.update("mostly-fail", [0] * 9 + [1])
    w = np.array([s.stats[t].learnability for t in ids])
    assert w[0] > w[3] > w[1] and w[1] == pytest.approx(w[2])  # p ~ 1/2 teaches most; difficulty plays no part
    rng = np.random.default_rng(0)
    counts = dict.fromkeys(ids, 0)
    for _ in range(20000):
        counts[s.draw(1, rng)[0]] += 1
    freq = np.array([counts[t] for t in ids]) / 20000
    assert np.allclose(freq, w / w.sum(), atol=0.015)


def test_expected_learnability_by_hand():
    s = LearnabilitySampler(["a"])
    assert s.stats["a"].learnability == pytest.approx(1 / 6)  # Beta(1, 1): E[p(1-p)] = 1/6
    s.config = SamplerConfig(decay=1.0)
    s.update("a", [1, 1, 0])  # Beta(3, 2): ab / ((a+b)(a+b+1)) = 6 / 30
    assert s.stats["a"].learnability == pytest.approx(0.2) and s.stats["a"].mean == pytest.approx(0.6)


def test_solved_and_unsolvable_tasks_retire_and_are_retested():
    cfg = SamplerConfig(min_attempts=8, retest_every=5, decay=1.0)
    s = LearnabilitySampler(["easy", "hard", "mid1", "mid2"], cfg)
    s.update("easy", [1.0] * 40, step=3)
    s.update("hard", [0.0] * 60, step=3)
    s.update("mid1", [1, 0] * 10)
    assert s.stats["easy"].retired == "solved" and s.stats["easy"].retired_at == 3
    assert s.stats["hard"].retired == "unsolvable" and s.stats["mid1"].retired is None
    summary = s.summary()
    assert summary["retired_solved"] == 1 and summary["retired_unsolvable"] == 1 and summary["active"] == 2
    rng = np.random.default_rng(1)
    draws = [s.draw(2, rng) for _ in range(20)]
    retested = [d for d in draws if {"easy", "hard"} & set(d)]
    assert len(retested) == 4  # draws 5, 10, 15, 20 re-test one retired task each; no other draw has one
    s.update("easy", [0.0] * 40)  # the policy moved: it is no longer solved
    assert s.stats["easy"].retired is None


def test_uniform_is_the_ablation():
    s = LearnabilitySampler(list("abcd"), SamplerConfig(kind="uniform"))
    s.update("a", [1] * 50)
    rng = np.random.default_rng(2)
    counts = {t: 0 for t in "abcd"}
    for _ in range(8000):
        for t in s.draw(2, rng):
            counts[t] += 1
    assert all(abs(c / 16000 - 0.25) < 0.02 for c in counts.values())


def test_state_round_trip_continues_the_same_draws():
    s = LearnabilitySampler([f"t{i}" for i in range(30)], SamplerConfig(min_attempts=2))
    rng = np.random.default_rng(3)
    for step in range(5):
        for t in s.draw(4, rng):
            s.update(t, [float(hash(t) % 2)] * 3, step)
    again = LearnabilitySampler.from_state(s.state_dict())
    state = rng.bit_generator.state
    a = [s.draw(4, rng) for _ in range(6)]
    rng.bit_generator.state = state
    b = [again.draw(4, rng) for _ in range(6)]
    assert a == b and again.state_dict() == s.state_dict()


def test_draws_are_distinct_and_bad_input_is_refused():
    s = LearnabilitySampler(list("abc"))
    assert sorted(s.draw(10, np.random.default_rng(0))) == ["a", "b", "c"]
    with pytest.raises(ValueError):
        LearnabilitySampler([])
    with pytest.raises(ValueError):
        SamplerConfig(kind="hardest-first")


def test_beta_tail():
    assert beta_tail(1, 1, hi=0.9) == pytest.approx(0.1, abs=0.002)
    assert beta_tail(41, 1, hi=0.9) > 0.95 and beta_tail(1, 61, lo=0.05) > 0.95


def test_unseen_tasks_of_a_family_inherit_its_pooled_pass_rate():
    """A short campaign rarely draws a task twice: after a few attempts per family, unseen tasks of
    a family that always passes or never does are drawn less than those of a family near 1/2."""
    groups = {f"{fam}{i}": fam for fam in ("easy", "hard", "mid") for i in range(20)}
    s = LearnabilitySampler(list(groups), SamplerConfig(floor=0.0, pool_strength=16), groups)
    s.update("easy0", [1.0] * 6)
    s.update("hard0", [0.0] * 6)
    s.update("mid0", [1.0, 0.0] * 3)
    w = dict(zip(groups, s.weights(list(groups))))
    assert w["mid5"] > 1.5 * w["easy5"] and w["mid5"] > 1.5 * w["hard5"]
    assert w["easy5"] == pytest.approx(w["easy9"])  # unseen siblings share the family's prior
    plain = LearnabilitySampler(list(groups), SamplerConfig(floor=0.0, pool_strength=0), groups)
    plain.update("easy0", [1.0] * 6)
    assert plain.weights(["easy5"])[0] == pytest.approx(1 / 6)  # no pooling: still the flat prior
    restored = LearnabilitySampler.from_state(s.state_dict())
    assert np.allclose(restored.weights(list(groups)), s.weights(list(groups)))
    assert s.summary()["group_pass_rate"] == {"easy": 1.0, "hard": 0.0, "mid": 0.5}


def test_screened_candidates_with_a_predicted_pass_rate_near_one_half_are_kept():
    s = LearnabilitySampler(["sure", "half", "hopeless", "unscreened", "likely"], SamplerConfig(screen=4))
    predicted = {"sure": 0.999, "half": 0.5, "hopeless": 0.0, "likely": 0.8}
    # Beta(1 + 8p, 1 + 8(1 - p)): p = 1/2 -> 25/110; p = 0.8 -> 0.196; unscreened Beta(1, 1) -> 1/6;
    # p = 0.999 or 0 -> 9/110 (the prediction outweighs the prior)
    assert s.screened_learnability("half", 0.5) == pytest.approx(25 / 110)
    assert s.screened_learnability("hopeless", 0.0) == pytest.approx(9 / 110)
    kept = s.keep_screened(["sure", "half", "hopeless", "unscreened", "likely"], 3, predicted)
    assert kept == ["half", "unscreened", "likely"]  # in the draw's order
    assert s.keep_screened(["sure", "hopeless"], 1, predicted) == ["sure"]  # a tie keeps the first drawn
    with pytest.raises(ValueError):
        SamplerConfig(screen=-1)


def test_family_quotas_split_evenly_and_give_a_small_family_s_excess_to_the_others():
    groups = {**{f"a{i}": "a" for i in range(10)}, **{f"b{i}": "b" for i in range(10)}, **{f"c{i}": "c" for i in range(10)}, "lone": "d"}
    s = LearnabilitySampler(list(groups), SamplerConfig(stratify=True), groups)
    rng = np.random.default_rng(0)
    for _ in range(20):
        q = s.family_quotas(8, rng)
        assert sum(q.values()) == 8 and q["d"] == 1  # "d" has one task: its share of 2 goes to the others
        assert sorted(q[f] for f in "abc") == [2, 2, 3]
    assert s.family_quotas(3, rng, exclude=frozenset(groups) - {"a0", "b0", "b1"}) == {"a": 1, "b": 2}
    assert sum(s.family_quotas(100, rng).values()) == 31  # never more than there are tasks


def test_a_stratified_draw_keeps_a_mastered_family_in_every_step():
    """Without `stratify`, a family that always passes is drawn at the floor's weight; with it,
    every draw of 4 over 4 families holds one task of each, the weights choosing within them."""
    groups = {f"{fam}{i}": fam for fam in ("solved", "x", "y", "z") for i in range(10)}
    for stratify in (False, True):
        s = LearnabilitySampler(list(groups), SamplerConfig(stratify=stratify, floor=0.001, min_attempts=100), groups)
        for i in range(10):
            s.update(f"solved{i}", [1.0] * 400)  # confidently passing: E[p(1-p)] about 0.0024
        rng = np.random.default_rng(1)
        drawn = []
        for _ in range(50):
            if stratify:
                ids = [t for f, q in s.family_quotas(4, rng).items() for t in s.draw(q, rng, family=f)]
            else:
                ids = s.draw(4, rng)
            assert len(set(ids)) == 4
            drawn.append(sum(groups[t] == "solved" for t in ids))
        if stratify:
            assert drawn == [1] * 50
        else:  # about 0.05 a draw expected
            assert sum(drawn) <= 10
    with pytest.raises(ValueError):
        SamplerConfig(stratify="sometimes")
