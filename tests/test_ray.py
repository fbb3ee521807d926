"""Environment workers on a real local Ray cluster: same trajectories as the local path, killed
workers replaced and their episodes replayed, hung environments cut off."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import tempfile
import time
from pathlib import Path

import pytest

import toolgym
from toolgym.harness import RolloutLimits, RolloutRunner, SamplingParams, TokenAgent
from toolgym.harness.agents import FixedAgent
from toolgym.harness.ray_pool import RayRolloutRunner, actor_agent_spec, init_local_ray, serve_policy
from toolgym.inference.hf_policy import HFPolicy
from toolgym.tasks import builtin_suite
from toolgym.verifiers import Outcome

SHELL = {"toolgym/shell-ops-v0": {"sandbox": {"backend": "bwrap"}}}


def _bash(command: str, timeout: int = 30) -> FixedAgent:
    return FixedAgent(
        "<tool_call>\n" + json.dumps({"name": "bash", "arguments": {"command": command, "timeout": timeout}}) + "\n</tool_call>"
    )


@pytest.fixture(scope="module")
def cluster():
    import ray

    init_local_ray(num_cpus=4)
    yield
    ray.shutdown()


def _own_temp_dirs(pids: list[int]) -> list[str]:
    return [p.name for pid in pids for p in Path(tempfile.gettempdir()).glob(f"toolgym-*-{pid}-*")]


def test_workers_give_the_same_trajectories_as_the_local_path(cluster, tiny_dir):
    tasks = builtin_suite("records").split("train").tasks[:3]
    limits = RolloutLimits(max_turns=3, max_new_tokens_per_turn=24)
    sampling = SamplingParams(max_new_tokens=24, temperature=1.0)
    policy = HFPolicy(tiny_dir, device="cpu", dtype="fp32")
    local = RolloutRunner(
        lambda e: toolgym.make(e).unwrapped, TokenAgent(policy, policy.tokenizer, sampling), group_size=2, limits=limits, progress=False
    )
    expected = local.run(tasks, seed=5)
    local.close()
    handle = serve_policy(tiny_dir, "cpu", "fp32")
    remote = RayRolloutRunner({}, actor_agent_spec(handle, tiny_dir, sampling), workers=2, envs_per_worker=3, group_size=2, limits=limits)
    try:
        got = remote.run(tasks, seed=5)
    finally:
        remote.close()
    assert len(got) == len(expected) == 6
    for a, b in zip(expected, got):
        assert (a.task_id, a.group_id, a.sample_index) == (b.task_id, b.group_id, b.sample_index)
        assert a.token_ids == b.token_ids and a.loss_mask == b.loss_mask
        assert (a.outcome, a.reward) == (b.outcome, b.reward)
    assert not remote.stats


def test_killed_worker_is_replaced_and_its_episodes_replayed(cluster):
    tasks = builtin_suite("shell-ops").split("train").tasks[:4]
    runner = RayRolloutRunner(
        SHELL, {"kind": "text", "agent": _bash("sleep 1")}, workers=2, envs_per_worker=4, group_size=2, limits=RolloutLimits(max_turns=2)
    )
    before = runner.pids()

    async def kill_mid_batch():
        job = asyncio.create_task(runner.arun(tasks, seed=1))
        await asyncio.sleep(2.0)  # every episode is in its first `sleep 1` turn or later
        os.kill(before[0], signal.SIGKILL)
        return await job

    try:
        out = asyncio.run(kill_mid_batch())
        after = runner.pids()
    finally:
        runner.close()
    assert len(out) == 8
    assert all(t.outcome.is_agent_attempt for t in out), [(t.outcome, t.error) for t in out]  # all finished
    assert runner.stats["worker_lost"] >= 1 and runner.stats["resubmitted"] == runner.stats["worker_lost"]
    assert after[0] != before[0] and after[1] == before[1]  # Ray restarted the killed worker only
    assert not _own_temp_dirs(before + after)  # the killed worker's sandboxes were reaped


def test_episodes_lost_beyond_the_resubmits_are_infra_errors(cluster):
    tasks = builtin_suite("shell-ops").split("train").tasks[:2]
    runner = RayRolloutRunner(
        SHELL,
        {"kind": "text", "agent": _bash("sleep 1")},
        workers=1,
        envs_per_worker=4,
        group_size=2,
        limits=RolloutLimits(max_turns=3),
        max_resubmits=0,
    )
    pid = runner.pids()[0]

    async def kill_mid_batch():
        job = asyncio.create_task(runner.arun(tasks, seed=1))
        await asyncio.sleep(2.0)
        os.kill(pid, signal.SIGKILL)
        return await job

    try:
        out = asyncio.run(kill_mid_batch())
    finally:
        runner.close()
    assert [t.outcome for t in out] == [Outcome.INFRA_ERROR] * 4
    assert {t.error for t in out} == {"worker lost"}  # a trainer drops these groups whole


def test_hung_environment_is_cut_off_by_the_deadline(cluster):
    tasks = builtin_suite("shell-ops").split("train").tasks[:2]
    runner = RayRolloutRunner(
        SHELL,
        {"kind": "text", "agent": _bash("sleep 100", timeout=120)},
        workers=1,
        envs_per_worker=2,
        limits=RolloutLimits(max_turns=2),
        deadline_s=3,
    )
    before = runner.pids()
    try:
        out = runner.run(tasks, seed=1)
        # the watchdog killed the worker (ray.kill returns before the process is gone); Ray brings it back
        deadline = time.monotonic() + 60
        while (after := runner.pids()) == before and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        runner.close()
    assert [(t.outcome, t.error) for t in out] == [(Outcome.INFRA_ERROR, "deadline exceeded")] * 2
    assert runner.stats["deadline_exceeded"] == 2
    assert after != before
    assert not _own_temp_dirs(before + after)


def test_campaign_step_on_ray_matches_the_local_step(cluster, tmp_path):
    from toolgym.trainers.campaign import Campaign
    from toolgym.trainers.config import CampaignConfig

    def step(backend: str) -> dict:
        config = CampaignConfig.model_validate(
            {
                "name": backend,
                "out_dir": str(tmp_path / backend),
                "model": {"device": "cpu", "dtype": "fp32"},
                "envs": [{"env": "records-v0", "suite": "records", "train_tasks": 6}],
                "rl": {"steps": 1, "tasks_per_step": 3, "group_size": 2, "drop_zero_variance": False},
                "sampler": {"kind": "uniform"},
                "rollout": {"max_turns": 3, "max_new_tokens": 24, "backend": backend, "ray": {"workers": 2, "envs_per_worker": 3}},
            }
        )
        campaign = Campaign(config, progress=False)
        try:
            campaign.step = 1
            return campaign.rl_step()
        finally:
            campaign.close()

    local, remote = step("local"), step("ray")
    assert remote["tasks"] == local["tasks"]
    for key in ("reward_mean", "pass_rate", "response_tokens_mean", "episode_tokens_mean", "trained_trajectories"):
        assert remote[key] == local[key], key
    assert abs(remote["loss"] - local["loss"]) < 1e-6 and abs(remote["grad_norm"] - local["grad_norm"]) < 1e-5
    assert remote["ray"] == {}
