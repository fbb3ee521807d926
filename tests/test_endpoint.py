"""The training endpoint: an agent written only with the official `openai` SDK plays toolgym tasks
through it, and its episodes come back as token-exact trajectories that train."""

from __future__ import annotations

import json

import pytest

import toolgym
from toolgym.inference.hf_policy import HFPolicy
from toolgym.inference.policy import Generation, SamplingParams
from toolgym.integrations.endpoint import Endpoint
from toolgym.tasks import ToolCall, builtin_suite
from toolgym.verifiers import Outcome


def sdk_agent(base_url: str, instruction: str, tools: list[dict], execute, max_turns: int = 8, edit_history: bool = False) -> None:
    """A plain agent loop over the official SDK (no toolgym in it): tools run through `execute`."""
    from openai import OpenAI

    client = OpenAI(base_url=base_url, api_key="unused")
    messages = [{"role": "system", "content": "You are a careful assistant."}, {"role": "user", "content": instruction}]
    for turn in range(max_turns):
        reply = client.chat.completions.create(model="toolgym", messages=messages, tools=tools, temperature=1.0)
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            return
        for call in message.tool_calls:
            output, done = execute(call.function.name, json.loads(call.function.arguments))
            messages.append({"role": "tool", "tool_call_id": call.id, "content": output})
            if done:
                return
        if edit_history and turn == 0:
            messages[1]["content"] += " (Take your time.)"  # the agent rewrites what was said


class Recording:
    """Wraps a policy and keeps every generation it returned, in order."""

    def __init__(self, policy) -> None:
        self.policy, self.name, self.generations = policy, policy.name, []

    async def generate(self, prompt_ids, sampling):
        gen = await self.policy.generate(prompt_ids, sampling)
        self.generations.append(gen)
        return gen


class OracleTokens:
    """A stand-in for a model that writes the task's oracle calls, as tokens with log-probs."""

    name = "oracle-tokens"

    def __init__(self, tokenizer, eot_id: int) -> None:
        self.tokenizer, self.eot_id, self.turns = tokenizer, eot_id, []

    async def generate(self, prompt_ids, sampling):
        text = self.turns.pop(0) if self.turns else "I am done."
        ids = self.tokenizer.encode(text, add_special_tokens=False) + [self.eot_id]
        return Generation(token_ids=ids, logprobs=[-0.5] * len(ids))


def play(endpoint: Endpoint, env_id: str, task, edit_history: bool = False):
    env = toolgym.make(env_id).unwrapped
    try:
        obs, info = env.reset(options={"task": task})
        url = endpoint.open_episode(tools=info["tools"])
        state = {"reward": 0.0, "done": False}

        def execute(name, arguments):
            out, reward, terminated, truncated, _ = env.step([ToolCall(name=name, arguments=arguments)])
            state.update(reward=reward, done=terminated or truncated)
            return out, state["done"]

        sdk_agent(url, info["instruction"], info["tools"], execute, edit_history=edit_history)
        divergences = endpoint.divergences(url.split("/episodes/")[1].split("/")[0])
        outcome = Outcome.PASSED if state["reward"] >= 1.0 else Outcome.FAILED
        return endpoint.close_episode(url, state["reward"], outcome, task_id=task.id, env_id=env_id), divergences
    finally:
        env.close()


def check_exact(trajectories, generations):
    """Policy tokens are the sampled ids in order, with their log-probs; the mask is 1 on them only."""
    policy = [s for t in trajectories for s in t.segments if s.kind == "policy"]
    assert [s.token_ids for s in policy] == [list(g.token_ids) for g in generations]
    assert [s.logprobs for s in policy] == [list(g.logprobs) for g in generations]
    for t in trajectories:
        expected = [1 if s.kind == "policy" else 0 for s in t.segments for _ in s.token_ids]
        assert t.loss_mask == expected and sum(expected) == sum(len(s.token_ids) for s in t.segments if s.kind == "policy")


@pytest.fixture(scope="module")
def tiny(tiny_dir):
    return HFPolicy(tiny_dir, device="cpu", dtype="fp32", name="tiny")


def test_sdk_agent_episodes_are_token_exact_and_train(tiny, tiny_dir):
    """25 episodes each of records and shell-ops from a real (tiny) model through the endpoint,
    then one GRPO step on them."""
    from toolgym.trainers.batching import pack
    from toolgym.trainers.core_algos import grpo_advantages
    from toolgym.trainers.learner import Learner, LearnerConfig

    recorder = Recording(tiny)
    endpoint = Endpoint(recorder, tiny.tokenizer, SamplingParams(max_new_tokens=24, temperature=1.0)).start()
    trajectories = []
    try:
        for env_id, suite in (("records-v0", "records"), ("shell-ops-v0", "shell-ops")):
            for task in builtin_suite(suite).split("train").tasks[:25]:
                got, divergences = play(endpoint, env_id, task)
                assert divergences == 0 and len(got) == 1
                trajectories += got
    finally:
        endpoint.close()
    assert len(trajectories) == 50 and endpoint.stats["divergences"] == 0
    check_exact(trajectories, recorder.generations)
    import torch

    # one GRPO step on the endpoint's trajectories (groups of 5; a little noise gives every group variance)
    rewards = torch.tensor([t.reward for t in trajectories]) + torch.linspace(0, 0.1, len(trajectories))
    advantages = grpo_advantages(rewards, torch.arange(len(trajectories)) // 5)
    model = HFPolicy(tiny_dir, device="cpu", dtype="fp32").model
    before = {k: v.clone() for k, v in model.state_dict().items()}
    metrics = Learner(model, LearnerConfig(lr=1e-3)).rl_step(pack(trajectories, advantages, tiny.pad_id))
    assert metrics["train_tokens"] > 0 and metrics["grad_norm"] > 0
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_multi_turn_oracle_episodes_pass_and_an_edited_history_is_a_counted_split(tiny):
    tasks = builtin_suite("shell-ops").split("held-out").tasks[:3]
    renderer_eot = tiny.tokenizer.convert_tokens_to_ids("<|im_end|>")
    scripted = OracleTokens(tiny.tokenizer, renderer_eot)
    recorder = Recording(scripted)
    endpoint = Endpoint(recorder, tiny.tokenizer, chat_template=None).start()
    try:
        for task in tasks:
            scripted.turns = list(task.oracle_turns())
            got, divergences = play(endpoint, "shell-ops-v0", task)
            assert divergences == 0 and len(got) == 1 and got[0].outcome == Outcome.PASSED, got[0].reward
            assert [s.kind for s in got[0].segments][:3] == ["template", "policy", "observation"]
        # the agent rewrites its history after the first turn: the trajectory splits, counted
        task = tasks[0]
        scripted.turns = list(task.oracle_turns())
        start = len(recorder.generations)
        got, divergences = play(endpoint, "shell-ops-v0", task, edit_history=True)
        assert divergences == 1 and len(got) == 2 and endpoint.stats["divergences"] == 1
        assert got[1].segments[0].kind == "template" and "(Take your time.)" in got[1].segments[0].text
        check_exact(got, recorder.generations[start:])
    finally:
        endpoint.close()


def test_bad_requests_get_clear_errors(tiny):
    import httpx

    endpoint = Endpoint(tiny, tiny.tokenizer).start()
    try:
        url = endpoint.open_episode()
        r = httpx.post(f"{url}/chat/completions", json={"messages": []})
        assert r.status_code == 400 and "non-empty list" in r.json()["error"]["message"]
        r = httpx.post(f"{endpoint.url}/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]})
        assert r.status_code == 400 and "X-Toolgym-Episode" in r.json()["error"]["message"]
        r = httpx.post(f"{endpoint.url}/episodes/nope/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]})
        assert r.status_code == 400 and "no open episode" in r.json()["error"]["message"]
        r = httpx.post(f"{url}/chat/completions", json={"messages": [{"role": "user", "content": "x"}], "stream": True})
        assert r.status_code == 400 and "streaming" in r.json()["error"]["message"]
        assert httpx.get(f"{endpoint.url}/v1/models").json()["data"][0]["id"] == "tiny"
    finally:
        endpoint.close()


def test_toolgym_serve_records_an_episode_closed_over_http(tmp_path):
    """The command: an agent picks its own episode id in the base URL, closes it with a reward,
    and the trajectory lands in OUT/trajectories.jsonl."""
    import socket
    import subprocess
    import sys
    import time

    import httpx
    from openai import OpenAI

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "toolgym.cli",
            "serve",
            "--policy",
            "tiny",
            "--port",
            str(port),
            "--out",
            str(tmp_path),
            "--max-new-tokens",
            "8",
            "--dtype",
            "fp32",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        base = f"http://127.0.0.1:{port}/episodes/ep-1/v1"
        for _ in range(120):
            try:
                httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=1)
                break
            except httpx.TransportError:
                time.sleep(0.5)
        reply = OpenAI(base_url=base, api_key="x").chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hello"}])
        assert reply.choices[0].message.role == "assistant" and reply.usage.completion_tokens > 0
        assert httpx.post(f"http://127.0.0.1:{port}/episodes/ep-1/close", json={"reward": 1.0}).json() == {"trajectories": 1}
        row = json.loads((tmp_path / "trajectories.jsonl").read_text().splitlines()[0])
        assert row["reward"] == 1.0 and [s["kind"] for s in row["segments"]][:2] == ["template", "policy"]
        # the same endpoint serves an evaluation run by toolgym's own OpenAI client
        from conftest import run_cli

        res = run_cli(
            "eval",
            "--policy",
            f"openai:http://127.0.0.1:{port}/episodes/eval/v1#tiny",
            "--suite",
            "records",
            "--tasks",
            "2",
            "--concurrency",
            "1",
            "--max-turns",
            "2",
            "--out",
            str(tmp_path / "eval"),
        )
        assert res.returncode == 0, res.stderr[-500:]
        assert json.loads((tmp_path / "eval" / "report.json").read_text())["overall"]["episodes"] == 2
    finally:
        proc.terminate()
        proc.wait(timeout=10)
