"""Several inference servers behind one policy: sticky routing, failover, weight updates in order,
distributed weight groups. Servers are `harness.protocol_server` (sglang's protocol; sglang itself
is CUDA-only), in threads or as their own processes that the tests kill."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections import defaultdict

import pytest
import torch

import toolgym
from toolgym.harness import RolloutLimits, RolloutRunner, SamplingParams, TokenAgent
from toolgym.harness.rollout import sampling_seed
from toolgym.inference.hf_policy import HFPolicy
from toolgym.inference.policy import current_episode
from toolgym.inference.protocol_server import ProtocolServer
from toolgym.inference.sglang_client import SGLangPolicy
from toolgym.inference.weight_sync import WeightBroadcaster
from toolgym.tasks import builtin_suite
from toolgym.verifiers import Outcome


def start_servers(model_dir: str, n: int, delay_ms: float = 0.0, ports: list[int] | None = None):
    """`n` protocol servers as processes; returns (processes, urls) once all listen."""
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "toolgym.inference.protocol_server",
                model_dir,
                "--delay-ms",
                str(delay_ms),
                "--port",
                str(ports[i] if ports else 0),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        for i in range(n)
    ]
    urls = []
    for p in procs:
        line = p.stdout.readline()
        assert line.startswith("listening on"), f"protocol server did not start: {line!r}"
        urls.append(line.split()[-1])
    return procs, urls


def stop(procs) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait(timeout=30)


def test_episodes_stick_to_one_server_and_spread_over_both(tiny_policy):
    tasks = builtin_suite("records").tasks[:6]
    with ProtocolServer(tiny_policy) as a, ProtocolServer(tiny_policy) as b:
        policy = SGLangPolicy([a.url, b.url])
        agent = TokenAgent(policy, tiny_policy.tokenizer, SamplingParams(max_new_tokens=24))
        runner = RolloutRunner(
            lambda: toolgym.make("records-v0").unwrapped, agent, group_size=2, progress=False, limits=RolloutLimits(max_turns=3)
        )
        trajs = runner.run(tasks, seed=5)
        server_of_seed = {r["sampling_params"]["sampling_seed"]: name for name, srv in (("a", a), ("b", b)) for r in srv.requests}
    by_episode = defaultdict(set)
    for t in trajs:
        assert t.outcome != Outcome.INFRA_ERROR, t.error
        for turn in range(len(t.turns)):
            by_episode[(t.task_id, t.sample_index)].add(server_of_seed[sampling_seed(t.seed, t.sample_index, turn)])
    assert sum(len(t.turns) for t in trajs) > len(trajs)  # multi-turn episodes
    assert all(len(servers) == 1 for servers in by_episode.values())  # every turn on the episode's server
    assert {s for servers in by_episode.values() for s in servers} == {"a", "b"}  # both used


def test_routing_moves_only_a_lost_servers_episodes():
    policy = SGLangPolicy(["http://h1", "http://h2", "http://h3"])
    keys = [f"task-{i}:0:0" for i in range(60)]
    before = {k: policy.route(k, [0, 1, 2]) for k in keys}
    after = {k: policy.route(k, [0, 2]) for k in keys}
    assert {k for k in keys if before[k] != after[k]} == {k for k in keys if before[k] == 1}
    assert len(set(before.values())) == 3


def test_weight_update_order_and_version_on_every_server(tiny_policy, tiny_dir):
    with ProtocolServer(tiny_policy) as a, ProtocolServer(tiny_policy) as b:
        policy = SGLangPolicy([a.url, b.url])

        async def main():
            await policy.update_weights_from_disk(tiny_dir, version=7)
            token = current_episode.set("episode-x")
            gen = await policy.generate([5, 6, 7], SamplingParams(max_new_tokens=3, seed=1))
            current_episode.reset(token)
            await policy.aclose()
            return gen

        gen = asyncio.run(main())
        for server in (a, b):
            assert server.calls == ["pause_generation", "update_weights_from_disk", "continue_generation"]
            assert server.weight_updates == [tiny_dir] and server.weight_version == "7"
    assert gen.weight_version == 7 and policy.version == 7


def test_server_lost_mid_batch_fails_its_turns_and_the_batch_goes_on(tiny_dir):
    procs, urls = start_servers(tiny_dir, 2, delay_ms=250)
    try:
        tok = HFPolicy(tiny_dir, device="cpu").tokenizer
        policy = SGLangPolicy(urls, retries=2, backoff_s=0.05, probe_interval_s=0.5)
        agent = TokenAgent(policy, tok, SamplingParams(max_new_tokens=16))
        runner = RolloutRunner(
            lambda: toolgym.make("records-v0").unwrapped, agent, group_size=2, progress=False, limits=RolloutLimits(max_turns=4)
        )
        tasks = builtin_suite("records").tasks[:6]

        async def batch():
            job = asyncio.create_task(runner.arun(tasks, seed=11))
            await asyncio.sleep(0.6)  # every episode has a turn in flight (each takes >= 250 ms)
            os.kill(procs[0].pid, signal.SIGKILL)
            return await job

        trajs = asyncio.run(batch())
        lost = [t for t in trajs if t.outcome == Outcome.INFRA_ERROR]
        assert len(trajs) == 12 and lost, "the killed server had turns in flight"
        assert all("lost mid-turn" in t.error for t in lost)
        assert len(lost) < len(trajs)  # the other server's episodes finished
        assert all(t.turns for t in trajs if t not in lost)
        assert policy.healthy == [False, True]

        # the server comes back on its address: probed, and put back in rotation
        port = int(urls[0].rsplit(":", 1)[1])
        stop(procs[:1])
        procs[0:1], _ = start_servers(tiny_dir, 1, ports=[port])

        async def later():
            await asyncio.sleep(0.6)  # past the probe interval
            token = current_episode.set(next(f"k{i}" for i in range(100) if policy.route(f"k{i}", [0, 1]) == 0))
            gen = await policy.generate([5, 6, 7], SamplingParams(max_new_tokens=2, seed=0))
            current_episode.reset(token)
            return gen

        assert len(asyncio.run(later()).token_ids) == 2
        assert policy.healthy == [True, True]
    finally:
        stop(procs)


def test_distributed_weight_update_reaches_every_server_process(tiny_dir):
    procs, urls = start_servers(tiny_dir, 2)
    try:
        local = HFPolicy(tiny_dir, device="cpu")
        g = torch.Generator().manual_seed(0)
        state = {k: v + 0.02 * torch.randn(v.shape, generator=g) for k, v in local.model.state_dict().items()}
        sampling = SamplingParams(max_new_tokens=6, seed=3)
        before = local.generate_batch([[5, 6, 7]], [sampling])[0]
        local.load_weights(state, 4)
        expected = local.generate_batch([[5, 6, 7]], [sampling])[0]
        policy = SGLangPolicy(urls)
        sender = WeightBroadcaster(policy, backend="gloo")

        async def main():
            await sender.connect()
            await sender.push(state, version=4)
            outs = []
            for i in range(2):  # one request routed to each server
                token = current_episode.set(next(f"k{j}" for j in range(100) if policy.route(f"k{j}", [0, 1]) == i))
                outs.append(await policy.generate([5, 6, 7], sampling))
                current_episode.reset(token)
            await sender.close()
            await policy.aclose()
            return outs

        outs = asyncio.run(main())
    finally:
        stop(procs)
    assert before.token_ids != expected.token_ids or before.logprobs != pytest.approx(expected.logprobs, abs=1e-3)
    for gen in outs:  # each server samples exactly what the pushed weights sample here
        assert gen.weight_version == 4
        assert gen.token_ids == expected.token_ids
        assert gen.logprobs == pytest.approx(expected.logprobs, abs=1e-4)


def test_a_server_back_after_missing_an_update_loads_it_before_serving(tiny_policy, tiny_dir):
    with ProtocolServer(tiny_policy) as a, ProtocolServer(tiny_policy) as b:
        policy = SGLangPolicy([a.url, b.url], probe_interval_s=60.0)

        async def main():
            policy._mark_down(1)  # b is out of rotation (refused a connection) during the update
            await policy.update_weights_from_disk(tiny_dir, version=3)
            assert b.calls == [] and a.weight_version == "3"
            policy._next_probe[1] = 0.0  # its next probe is due
            assert await policy._in_rotation() == [0, 1]  # probed: healthy, and caught up first
            await policy.aclose()

        asyncio.run(main())
        assert b.calls == ["update_weights_from_disk"] and b.weight_version == "3"
