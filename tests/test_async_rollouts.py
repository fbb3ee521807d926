"""Weight versions per turn, bounded staleness, asynchronous rollouts, and a campaign whose
rollouts sample from inference servers (sglang's protocol) that get the weights after each step."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from toolgym.inference.hf_policy import HFPolicy
from toolgym.inference.protocol_server import ProtocolServer
from toolgym.trainers.campaign import Campaign
from toolgym.trainers.config import CampaignConfig


def _config(tmp_path: Path, name: str, **rollout) -> CampaignConfig:
    return CampaignConfig.model_validate(
        {
            "name": name,
            "seed": 1,
            "out_dir": str(tmp_path / name),
            "model": {"device": "cpu", "dtype": "fp32"},
            "envs": [{"env": "records-v0", "suite": "records", "train_tasks": 20, "eval_tasks": 2}],
            "sft": {"steps": 0},
            "rl": {
                "steps": 3,
                "tasks_per_step": 2,
                "group_size": 2,
                "drop_zero_variance": False,
                "learner": {"lr": 1e-3, "token_budget": 4096},
            },
            "sampler": {"kind": "uniform"},
            "checkpoint": {"every": 5},
            "rollout": {"max_turns": 3, "max_new_tokens": 16, "concurrency": 8, **rollout},
        }
    )


def test_a_batch_two_versions_old_is_dropped_and_counted_one_version_old_is_kept(tmp_path):
    campaign = Campaign(_config(tmp_path, "stale", max_staleness=1), progress=False)
    try:
        campaign.publish(0)
        batch = campaign.collect(1)  # sampled by version 0
        versions = {v for t in batch.trajectories for v in t.weight_versions}
        assert versions == {0} and all(t.turns for t in batch.trajectories)
        campaign.step = 3  # the learner holds version 2: these rollouts are 2 versions old
        dropped = campaign.learn(batch)
        assert dropped["stale_dropped"] == len(batch.trajectories) == 4
        assert dropped["staleness_max"] == 2 and "loss" not in dropped  # nothing trained
        campaign.step = 2  # version 1: one version old is within max_staleness=1
        kept = campaign.learn(batch)
        assert kept["stale_dropped"] == 0 and kept["staleness_max"] == 1
        assert kept["trained_trajectories"] == 4 and "loss" in kept
    finally:
        campaign.close()


def test_async_campaign_overlaps_rollouts_with_updates_within_the_bound(tmp_path):
    campaign = Campaign(_config(tmp_path, "async", max_staleness=1), progress=False)
    campaign.run()
    steps = [
        json.loads(line)
        for line in (tmp_path / "async" / "metrics.jsonl").read_text().splitlines()
        if json.loads(line).get("kind") == "train"
    ]
    assert [s["step"] for s in steps] == [1, 2, 3]
    assert all(s["staleness_max"] <= 1 and s["stale_dropped"] == 0 for s in steps)
    # the next batch started before the update it trails: some of its turns were sampled by the
    # weights one version behind the learner's (synchronous training never shows this)
    assert any(s["staleness_max"] == 1 for s in steps[1:])
    assert all(s["trained_trajectories"] == 4 for s in steps)
    assert (tmp_path / "async" / "report.md").exists()


def test_campaign_on_inference_servers_pushes_weights_after_each_step(tmp_path, tiny_dir):
    # two servers (sglang's protocol, in threads) each with their own copy of the starting weights
    servers = [ProtocolServer(HFPolicy(tiny_dir, device="cpu", dtype="fp32")) for _ in range(2)]
    for server in servers:
        server.__enter__()
    try:
        config = _config(tmp_path, "servers", servers=[s.url for s in servers])
        config.rl.steps = 1
        config.rl.learner.weight_decay = 0.1  # the weights move even if every reward is equal
        campaign = Campaign(config, progress=False)
        try:
            campaign.publish(0)
            campaign.step = 1
            metrics = campaign.learn(campaign.collect(1))
            trained = {k: v.detach().clone() for k, v in campaign.policy.model.state_dict().items()}
        finally:
            campaign.close()
        assert metrics["infra_or_verifier_errors"] == 0 and metrics["staleness_max"] == 0
        assert sum(len(s.requests) for s in servers) >= 4  # every episode sampled from the servers
        for server in servers:
            assert server.calls == ["pause_generation", "update_weights_from_disk", "continue_generation"] * 2
            assert server.weight_version == "1"
            served = server.policy.model.state_dict()
            assert max((served[k] - trained[k]).abs().max().item() for k in trained) == 0.0
    finally:
        for server in servers:
            server.close()
    moved = any(not torch.equal(v, HFPolicy(tiny_dir, device="cpu", dtype="fp32").model.state_dict()[k]) for k, v in trained.items())
    assert moved  # the step changed the weights the servers now serve
