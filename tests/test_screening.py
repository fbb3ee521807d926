"""The campaign's SFT side and its screen on a real (tiny) model: the SFT anchor replays the
demonstrations by step, families are skipped or limited in the demonstrations, and the screen
draws by learnability (stratified by family, declining scored by the chance of not calling)."""

import pytest
import torch
from test_trainer import _small_config, _write

import toolgym
from toolgym.tasks import builtin_suite
from toolgym.trainers.batching import pack
from toolgym.trainers.campaign import Campaign
from toolgym.trainers.checkpoint import MetricsLog
from toolgym.trainers.config import ConfigError, load_config


def test_the_sft_anchor_replays_the_sft_demonstrations_drawn_by_step(tmp_path):
    """`rl.sft_anchor` packs `sft_anchor_batch` of the SFT stage's own demonstrations per step,
    the same ones for the same step (a resumed run replays what an uninterrupted one did), and
    an update with it reports the anchor's NLL; off, there is no anchor batch."""
    data = _small_config(tmp_path)
    data["rl"].update(sft_anchor=0.5, sft_anchor_batch=3)
    campaign = Campaign(load_config(_write(tmp_path, data)), progress=False)
    try:
        from toolgym.trainers.checkpoint import MetricsLog

        campaign.metrics = MetricsLog(campaign.run_dir)
        first, again, other = campaign.anchor_batch(1), campaign.anchor_batch(1), campaign.anchor_batch(2)
        assert first.input_ids.shape[0] == 3 and first.tokens > 0
        assert torch.equal(first.input_ids, again.input_ids)
        assert not torch.equal(first.input_ids, other.input_ids)
        demo_rows = {tuple(t.token_ids) for t in campaign.demonstrations()}
        for row, n in zip(first.input_ids.tolist(), first.attention.sum(1).tolist()):
            assert tuple(row[:n]) in demo_rows  # the SFT stage's demonstrations, not new data
        rl_batch = pack(campaign.demonstrations()[:4], [1.0, -1.0, 0.5, -0.5], campaign.policy.pad_id)
        metrics = campaign.trainer.run("rl", (rl_batch, first, 0.5))
        assert metrics["anchor_nll"] > 0 and metrics["anchor_tokens"] == first.tokens
        # a resumed run replays the demonstrations (same ones) but logs the oracle row only once
        from toolgym.trainers.checkpoint import read_metrics

        kept, campaign.demos = campaign.demos, None
        assert [t.token_ids for t in campaign.demonstrations()] == [t.token_ids for t in kept]
        assert [r["kind"] for r in read_metrics(campaign.run_dir)].count("oracle") == 1
    finally:
        campaign.close()
    data["rl"]["sft_anchor"] = 0.0
    data["out_dir"] = str(tmp_path / "off")
    off = Campaign(load_config(_write(tmp_path, data)), progress=False)
    try:
        assert off.anchor_batch(1) is None
    finally:
        off.close()


def test_a_stratified_screened_draw_takes_one_task_per_family(tmp_path):
    """`sampler.stratify` with `screen: 2`: the step's tasks are split across the suite's families
    before the screen, and the screen keeps the split (one scoring pass over every family's
    candidates, each family cut to its share)."""
    from toolgym.trainers.campaign import Campaign

    cfg = load_config(
        _write(
            tmp_path,
            _small_config(
                tmp_path,
                {
                    "sft": {"steps": 0},
                    "sampler": {"screen": 2, "stratify": True},
                    "rl": {"steps": 1, "tasks_per_step": 3, "group_size": 2, "dynamic_sampling": 0},
                },
            ),
        )
    )
    campaign = Campaign(cfg, progress=False)
    try:
        families = {t.family for t in campaign.train_tasks["records"].values()}
        assert len(families) >= 3
        chosen = campaign.draw()
        assert len(chosen) == 3 and len({t.family for _, t in chosen}) == 3
        passes = []
        score = campaign._screen.log_probabilities
        campaign._screen.log_probabilities = lambda model, tasks, *a, **kw: passes.append(len(tasks)) or score(model, tasks, *a, **kw)
        for _ in range(2):
            chosen = campaign.draw()
            assert len(chosen) == 3 and len({t.family for _, t in chosen}) == 3
        assert passes == [6, 6]  # one pass a draw: 2 candidates per task, every family
        assert campaign._screen_stats["screen_candidates"] == 18
    finally:
        campaign.close()


def test_skipped_families_are_never_demonstrated(tiny_policy):
    """`sft.skip_families`: the first N train tasks of the other families are demonstrated (N of
    them still), none of a skipped family, so SFT and the anchor never show what those ask."""
    from rich.console import Console

    from toolgym.trainers.sft import oracle_demonstrations

    train = {t.id: t for t in builtin_suite("bfcl").tasks if t.split == "train"}
    assert any(t.family == "irrelevance" for t in list(train.values())[:12])
    demos, checks = oracle_demonstrations(
        {"bfcl": train},
        12,
        tiny_policy.tokenizer,
        lambda env_id: toolgym.make(env_id).unwrapped,
        4,
        False,
        Console(quiet=True),
        ("irrelevance",),
    )
    expected = [t.id for t in train.values() if t.family != "irrelevance"][:12]
    assert sorted(d.task_id for d in demos) == sorted(expected)
    assert checks["bfcl"] == {"oracle_pass_rate": 1.0, "infra_errors": 0, "episodes": 12}


def test_each_suite_gives_its_own_count_of_demonstrations(tiny_policy):
    """An envs entry's `demos`: each suite gives the first N of its own train tasks (a few
    multi-turn demonstrations beside many single-turn ones), and a suite with no count none."""
    from rich.console import Console

    from toolgym.trainers.sft import oracle_demonstrations

    bfcl = {t.id: t for t in builtin_suite("bfcl").tasks if t.split == "train"}
    records = {t.id: t for t in builtin_suite("records").tasks if t.split == "train"}
    demos, checks = oracle_demonstrations(
        {"bfcl": bfcl, "records": records},
        {"bfcl": 6, "records": 2},
        tiny_policy.tokenizer,
        lambda env_id: toolgym.make(env_id).unwrapped,
        4,
        False,
        Console(quiet=True),
    )
    expected = list(bfcl)[:6] + list(records)[:2]
    assert sorted(d.task_id for d in demos) == sorted(expected)
    assert (checks["bfcl"]["episodes"], checks["records"]["episodes"]) == (6, 2)
    demos, _ = oracle_demonstrations(
        {"bfcl": bfcl, "records": records},
        {"bfcl": 3},
        tiny_policy.tokenizer,
        lambda env_id: toolgym.make(env_id).unwrapped,
        4,
        False,
        Console(quiet=True),
    )
    assert sorted(d.task_id for d in demos) == sorted(list(bfcl)[:3])


def test_a_limited_family_gives_at_most_its_limit_and_the_others_fill_the_rest(tiny_policy):
    """`sft.family_limits`: a family gives at most its limit of demonstrations (its first tasks in
    the suite's order), and the other families fill the suite's count, so SFT shows a little of
    what that family asks and leaves the rest to the reward."""
    from rich.console import Console

    from toolgym.trainers.sft import oracle_demonstrations

    train = {t.id: t for t in builtin_suite("bfcl").tasks if t.split == "train"}
    first = list(train.values())[:16]
    assert sum(t.family == "irrelevance" for t in first) >= 3
    demos, checks = oracle_demonstrations(
        {"bfcl": train},
        16,
        tiny_policy.tokenizer,
        lambda env_id: toolgym.make(env_id).unwrapped,
        4,
        False,
        Console(quiet=True),
        family_limits={"irrelevance": 2},
    )
    irrelevant = [t.id for t in train.values() if t.family == "irrelevance"][:2]
    others = [t.id for t in train.values() if t.family != "irrelevance"][:14]
    assert sorted(d.task_id for d in demos) == sorted(irrelevant + others)
    assert checks["bfcl"]["episodes"] == 16


def test_a_task_that_declining_passes_is_screened_by_the_chance_of_not_opening_a_call(tiny_policy):
    """BFCL irrelevance: any answer without a call passes, so its predicted pass rate is 1 - p(the
    answer opens with `<tool_call>`), from a plain forward over prompt + opener; a calling task's is
    still p(its reference). The oracle's fixed declining sentence is never what is scored."""
    from toolgym.envs.parsing import OPEN
    from toolgym.trainers.screening import ReferenceScreen

    suite = builtin_suite("bfcl")
    irrelevant = next(t for t in suite.tasks if t.family == "irrelevance" and t.split == "train")
    calling = next(t for t in suite.tasks if t.family == "simple_python" and t.split == "train")
    screen = ReferenceScreen(tiny_policy.tokenizer, lambda env_id: toolgym.make(env_id).unwrapped, declines=True)
    model = tiny_policy.model
    predicted = screen.predicted_pass_rates(model, [irrelevant, calling], tiny_policy.pad_id)
    assert screen.declines == {irrelevant.id}

    def p_of(ids: list[int], mask: list[int]) -> float:
        """The probability of the masked tokens of `ids` under a plain forward."""
        tokens = torch.tensor([ids])
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=tokens).logits[0, :-1].float(), -1)
        picked = logp.gather(1, tokens[0, 1:, None])[:, 0]
        return float((picked * torch.tensor(mask[1:], dtype=torch.float32)).sum().exp())

    reference = screen.references[irrelevant.id]
    prompt = reference.token_ids[: reference.loss_mask.index(1)]
    opener = tiny_policy.tokenizer.encode(OPEN, add_special_tokens=False)
    p_call = p_of(prompt + opener, [0] * len(prompt) + [1] * len(opener))
    assert predicted[irrelevant.id] == pytest.approx(1 - p_call, abs=1e-4)
    assert predicted[irrelevant.id] != pytest.approx(p_of(reference.token_ids, reference.loss_mask), abs=1e-3)
    ref = screen.references[calling.id]
    by_hand = p_of(ref.token_ids, ref.loss_mask)
    assert 0 < predicted[calling.id] == pytest.approx(by_hand, rel=1e-3)


def test_the_screen_scores_references_with_the_sampling_model_and_keeps_the_most_learnable(tmp_path):
    """`sampler.screen: 3`: three candidates per task needed, each reference solution scored by the
    model rollouts sample from (the sum of its policy tokens' log-probabilities, as a plain forward
    pass computes it); a task whose oracle fails is never scored."""
    import torch

    from toolgym.tasks import Task
    from toolgym.trainers.campaign import Campaign

    cfg = load_config(
        _write(
            tmp_path,
            _small_config(
                tmp_path,
                {
                    "sft": {"steps": 0},
                    "sampler": {"screen": 3},
                    "rl": {"steps": 1, "tasks_per_step": 2, "group_size": 2, "dynamic_sampling": 0},
                },
            ),
        )
    )
    campaign = Campaign(cfg, progress=False)
    try:
        batch = campaign.collect(1)
        assert len(batch.chosen) == 2
        assert batch.extra["screen_candidates"] == 6 and batch.extra["screen_scored"] == 6
        assert 0.0 <= batch.extra["screen_kept_predicted_pass"] <= 1.0 and batch.extra["screen_seconds"] > 0
        screen = campaign._screen
        task = batch.chosen[0][1]
        reference = screen.references[task.id]
        ids = torch.tensor([reference.token_ids])
        with torch.no_grad():
            logp = torch.log_softmax(campaign.screen_model()(input_ids=ids).logits[0, :-1].float(), -1)
        by_hand = float((logp.gather(1, ids[0, 1:, None])[:, 0] * torch.tensor(reference.loss_mask[1:])).sum())
        scored = screen.log_probabilities(campaign.screen_model(), [task], campaign.policy.pad_id)
        assert scored[task.id] == pytest.approx(by_hand, abs=1e-3) and by_hand < 0
        data = task.model_dump()
        data["hidden"]["answer"], data["id"] = "a place no record names", ""
        broken = Task.model_validate(data)  # its oracle's answer no longer passes
        assert screen.log_probabilities(campaign.screen_model(), [broken], campaign.policy.pad_id) == {}
        assert screen.references[broken.id] is None
    finally:
        campaign.close()


def test_a_suite_learned_from_its_reward_alone_is_neither_demonstrated_nor_screened(tmp_path):
    """`envs[i].demonstrations: false`: SFT shows only the other suites, and the draw takes that
    suite's tasks from the sampler as they come (no reference solution scored), while the
    demonstrated suite is still screened."""
    envs = [
        {"env": "records-v0", "suite": "records", "weight": 1, "train_tasks": 40, "eval_tasks": 2},
        {
            "env": "mcp-inventory-v0",
            "suite": "mcp-inventory",
            "weight": 1,
            "train_tasks": 40,
            "eval_tasks": 2,
            "demonstrations": False,
            "sandbox": {"backend": "bwrap"},
        },
    ]
    cfg = load_config(
        _write(
            tmp_path,
            _small_config(
                tmp_path,
                {
                    "envs": envs,
                    "sft": {"steps": 1, "batch_size": 2, "demos_per_suite": 4},
                    "sampler": {"screen": 2},
                    "rl": {"steps": 1, "tasks_per_step": 4, "group_size": 2, "dynamic_sampling": 0},
                },
            ),
        )
    )
    campaign = Campaign(cfg, progress=False)
    try:
        campaign.run_dir.mkdir(parents=True, exist_ok=True)
        campaign.metrics = MetricsLog(campaign.run_dir)
        demos = campaign.demonstrations()
        assert len(demos) == 4 and {d.env_id for d in demos} == {"toolgym/records-v0"}
        chosen = campaign.draw()
        assert sorted(s for s, _ in chosen) == ["mcp-inventory"] * 2 + ["records"] * 2
        # only the records candidates were scored: 2 tasks x 2 candidates
        assert campaign._screen_stats["screen_candidates"] == 4
        assert not any(task_id in campaign._screen.references for task_id in campaign.train_tasks["mcp-inventory"])
    finally:
        campaign.close()


def test_demonstrations_are_needed_where_sft_runs(tmp_path):
    envs = [{"env": "records-v0", "suite": "records", "demonstrations": False}]
    with pytest.raises(ConfigError, match="every env has demonstrations: false"):
        load_config(_write(tmp_path, _small_config(tmp_path, {"envs": envs})))


def test_an_env_of_weight_zero_is_demonstrated_but_one_env_must_be_drawn(tmp_path):
    envs = [{"env": "records-v0", "suite": "records", "weight": 0}]
    with pytest.raises(ConfigError, match="every weight is 0"):
        load_config(_write(tmp_path, _small_config(tmp_path, {"envs": envs})))


@pytest.mark.parametrize("name", ["demo.yaml", "records.yaml", "mcp_reward_sft.yaml", "mcp_reward_rl.yaml"])
def test_every_shipped_campaign_config_is_valid(name):
    from pathlib import Path

    config = load_config(Path(__file__).resolve().parents[1] / "examples" / name)
    drawn = [mix for mix in config.envs if mix.weight > 0]
    assert drawn and all(toolgym.envs.env_info(mix.env) is not None for mix in config.envs)
    # the reward-only family is never demonstrated and is drawn for RL
    if name.startswith("mcp_reward"):
        inventory = next(mix for mix in config.envs if mix.suite == "mcp-inventory")
        assert not inventory.demonstrations and inventory.weight > 0
