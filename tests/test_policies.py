"""Policies: HF batching correctness, the sglang client over real HTTP, the OpenAI-compatible agent."""

import asyncio
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch

import toolgym
from toolgym.harness import OpenAIAgent, PolicyError, RolloutRunner, SamplingParams, TokenAgent
from toolgym.inference.protocol_server import ProtocolServer
from toolgym.inference.sglang_client import SGLangPolicy
from toolgym.tasks import builtin_suite
from toolgym.verifiers import Outcome


def test_tiny_policy_loads_like_any_hf_model(tiny_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    assert model.config.model_type == "qwen2"
    for special in ("<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>"):
        assert len(tok.encode(special, add_special_tokens=False)) == 1
    text = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}],
        tools=[{"type": "function", "function": {"name": "f", "description": "d", "parameters": {"type": "object", "properties": {}}}}],
        tokenize=False,
        add_generation_prompt=True,
    )
    assert "<tools>" in text and text.endswith("<|im_start|>assistant\n")


def test_batched_generation_equals_one_at_a_time(tiny_policy):
    prompts = [[5, 6, 7], [8, 9, 10, 11, 12, 13, 14], [20]]
    samplings = [SamplingParams(max_new_tokens=12, seed=s, temperature=t) for s, t in ((1, 1.0), (2, 0.0), (3, 0.7))]
    together = tiny_policy.generate_batch(prompts, samplings)
    alone = [tiny_policy.generate_batch([p], [s])[0] for p, s in zip(prompts, samplings)]
    for a, b in zip(together, alone):
        assert a.token_ids == b.token_ids
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
        assert len(a.token_ids) == 12 and a.finish_reason == "length"


def test_logprobs_are_the_models(tiny_policy):
    import torch

    gen = tiny_policy.generate_batch([[5, 6, 7]], [SamplingParams(max_new_tokens=5, seed=0)])[0]
    ids = torch.tensor([[5, 6, 7] + gen.token_ids])
    with torch.no_grad():
        logits = tiny_policy.model(ids).logits[0].float()
    lp = torch.log_softmax(logits, -1)
    ref = [float(lp[2 + i, t]) for i, t in enumerate(gen.token_ids)]
    assert gen.logprobs == pytest.approx(ref, abs=1e-4)
    # sampled at T = 0.5: the logprobs of the distribution sampled from, softmax(logits / 0.5)
    hot = tiny_policy.generate_batch([[5, 6, 7]], [SamplingParams(max_new_tokens=5, seed=0, temperature=0.5)])[0]
    with torch.no_grad():
        logits = tiny_policy.model(torch.tensor([[5, 6, 7] + hot.token_ids])).logits[0].float()
    lp = torch.log_softmax(logits / 0.5, -1)
    assert hot.logprobs == pytest.approx([float(lp[2 + i, t]) for i, t in enumerate(hot.token_ids)], abs=1e-4)


def test_concurrent_requests_are_batched(tiny_policy):
    tiny_policy.batch_sizes.clear()

    async def main():
        return await asyncio.gather(*[tiny_policy.generate([5, 6, 7 + i], SamplingParams(max_new_tokens=4, seed=i)) for i in range(16)])

    outs = asyncio.run(main())
    assert len(outs) == 16 and max(tiny_policy.batch_sizes) == 16


def test_stop_token_ends_generation(tiny_policy):
    first = tiny_policy.generate_batch([[5, 6, 7]], [SamplingParams(max_new_tokens=8, temperature=0)])[0]
    stop = first.token_ids[2]
    gen = tiny_policy.generate_batch([[5, 6, 7]], [SamplingParams(max_new_tokens=8, temperature=0, stop_token_ids=(stop,))])[0]
    assert gen.token_ids == first.token_ids[: first.token_ids.index(stop) + 1] and gen.finish_reason == "stop"


# ---- sglang client over real HTTP -----------------------------------------------------------------


def test_sglang_client_matches_in_process_generation(tiny_policy):
    sampling = SamplingParams(max_new_tokens=10, seed=7, temperature=1.0)
    direct = tiny_policy.generate_batch([[5, 6, 7, 8]], [sampling])[0]
    with ProtocolServer(tiny_policy) as server:
        client = SGLangPolicy(server.url)

        async def main():
            ok = await client.health()
            gen = await client.generate([5, 6, 7, 8], sampling)
            await client.aclose()
            return ok, gen

        ok, gen = asyncio.run(main())
        body = server.requests[-1]
    assert ok == [True]
    assert gen.token_ids == direct.token_ids and gen.logprobs == pytest.approx(direct.logprobs, abs=1e-5)
    assert body["input_ids"] == [5, 6, 7, 8] and body["return_logprob"] is True
    assert body["sampling_params"]["max_new_tokens"] == 10 and body["sampling_params"]["sampling_seed"] == 7


def test_sglang_client_retries_then_succeeds(tiny_policy):
    with ProtocolServer(tiny_policy, fail_first=2) as server:
        client = SGLangPolicy(server.url, retries=3, backoff_s=0.01)
        gen = asyncio.run(client.generate([5, 6], SamplingParams(max_new_tokens=3, seed=0)))
        assert len(gen.token_ids) == 3 and len(server.requests) == 3


def test_sglang_client_spreads_over_servers_and_updates_weights(tiny_policy, tiny_dir):
    with ProtocolServer(tiny_policy) as a, ProtocolServer(tiny_policy) as b:
        client = SGLangPolicy([a.url, b.url])

        async def main():
            await asyncio.gather(*[client.generate([5, 6, i + 7], SamplingParams(max_new_tokens=2, seed=i)) for i in range(6)])
            await client.update_weights_from_disk(tiny_dir)
            await client.flush_cache()
            await client.aclose()

        asyncio.run(main())
        assert len(a.requests) > 0 and len(b.requests) > 0 and len(a.requests) + len(b.requests) == 6
        assert a.weight_updates == [tiny_dir] and b.weight_updates == [tiny_dir]


def test_sglang_failed_weight_update_raises(tiny_policy):
    with ProtocolServer(tiny_policy) as server:
        with pytest.raises(PolicyError, match="weight update failed"):
            asyncio.run(SGLangPolicy(server.url).update_weights_from_disk("/nonexistent/ckpt"))


def test_sglang_bad_request_is_not_retried(tiny_policy):
    with ProtocolServer(tiny_policy) as server:
        with pytest.raises(PolicyError, match="HTTP 400"):
            asyncio.run(SGLangPolicy(server.url, retries=3).generate([], SamplingParams()))
        assert len(server.requests) == 1


def test_dead_server_is_infra_error_and_batch_survives(tiny_policy):
    # Port 9 on loopback: nothing listens; every request fails fast.
    agent = TokenAgent(SGLangPolicy("http://127.0.0.1:9", retries=1, backoff_s=0.01), tiny_policy.tokenizer)
    tasks = builtin_suite("records").tasks[:3]
    runner = RolloutRunner(lambda: toolgym.make("records-v0").unwrapped, agent, group_size=2, progress=False)
    trajs = runner.run(tasks)
    assert len(trajs) == 6 and all(t.outcome == Outcome.INFRA_ERROR for t in trajs)
    assert all("failed after 2 attempts" in t.error for t in trajs)


def test_parse_response_rejects_garbage():
    with pytest.raises(PolicyError, match="unexpected /generate response"):
        SGLangPolicy.parse_response({"text": "hi"})
    gen = SGLangPolicy.parse_response(
        {
            "output_ids": [4, 5],
            "meta_info": {"output_token_logprobs": [[-0.1, 4, None], [-0.2, 5, None]], "finish_reason": {"type": "length"}},
        }
    )
    assert gen.token_ids == [4, 5] and gen.logprobs == [-0.1, -0.2] and gen.finish_reason == "length"


# ---- OpenAI-compatible chat endpoint --------------------------------------------------------------


class _LocalServer:
    """A local HTTP endpoint on a free port (a stand-in for a remote API that cannot be reached
    from here): every POST's JSON body goes to `reply`, which returns (status, headers, body)."""

    def __init__(self):
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):
                raw = self.rfile.read(int(self.headers["Content-Length"]))
                status, headers, data = outer.reply(json.loads(raw))
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()


class _ChatServer(_LocalServer):
    """An OpenAI-compatible endpoint that answers with the task's oracle calls in the API's own
    `tool_calls` format."""

    def __init__(self, oracle_by_instruction):
        self.bodies, self.oracle_by_instruction = [], oracle_by_instruction
        super().__init__()

    def reply(self, body):
        self.bodies.append(body)
        user = next(m["content"] for m in body["messages"] if m["role"] == "user")
        turn = sum(1 for m in body["messages"] if m["role"] == "assistant")
        call = self.oracle_by_instruction[user][turn]
        msg = {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": f"c{turn}", "type": "function", "function": {"name": call.name, "arguments": json.dumps(call.arguments)}}
            ],
        }
        return 200, {}, json.dumps({"choices": [{"index": 0, "message": msg, "finish_reason": "tool_calls"}]}).encode()


def test_openai_agent_solves_tasks_over_http():
    tasks = builtin_suite("records").split("held-out").tasks[:4]
    server = _ChatServer({t.instruction: t.oracle for t in tasks})
    agent = OpenAIAgent(server.url, model="m")
    runner = RolloutRunner(lambda: toolgym.make("records-v0").unwrapped, agent, progress=False)
    trajs = runner.run(tasks)
    server.httpd.shutdown()
    assert [t.outcome for t in trajs] == [Outcome.PASSED] * 4 and not any(t.has_tokens for t in trajs)
    last = server.bodies[-1]
    assert last["model"] == "m" and [t["function"]["name"] for t in last["tools"]] == ["search", "get", "answer"]
    roles = [m["role"] for m in last["messages"]]
    assert roles[:3] == ["user", "assistant", "tool"]
    assert last["messages"][2]["tool_call_id"] == last["messages"][1]["tool_calls"][0]["id"]


def test_openai_agent_unreachable_is_policy_error():
    agent = OpenAIAgent("http://127.0.0.1:9/v1")
    with pytest.raises(PolicyError):
        asyncio.run(agent.respond([{"role": "user", "content": "x"}], [], builtin_suite("records").tasks[0]))


class _ScriptedServer(_LocalServer):
    """An endpoint that answers the n-th POST with the n-th scripted (status, headers) reply (the
    last one repeats); a 200 carries a plain chat completion, or `body` when given. `delay_s`
    holds every answer."""

    def __init__(self, replies, delay_s: float = 0.0, body: str | None = None):
        self.times, self.replies, self.delay_s, self.body = [], replies, delay_s, body
        super().__init__()

    def reply(self, body):
        import time

        self.times.append(time.monotonic())
        time.sleep(self.delay_s)
        status, headers = self.replies[min(len(self.times), len(self.replies)) - 1]
        if self.body is not None:
            return status, headers, self.body.encode()
        answer = (
            {"choices": [{"index": 0, "message": {"role": "assistant", "content": "done"}}]}
            if status == 200
            else {"error": {"message": f"scripted {status}"}}
        )
        return status, headers, json.dumps(answer).encode()


def _ask(agent):
    return asyncio.run(agent.respond([{"role": "user", "content": "x"}], [], builtin_suite("records").tasks[0]))


def test_openai_agent_waits_out_a_rate_limit_as_the_server_asks():
    """429 and 503 are asked again, after the wait the server names (`retry-after-ms`, then
    `Retry-After` in seconds), and the third answer is used."""
    server = _ScriptedServer([(429, {"retry-after-ms": "300"}), (503, {"Retry-After": "1"}), (200, {})])
    try:
        assert _ask(OpenAIAgent(server.url, retries=2, backoff_s=0.01)) == "done"
    finally:
        server.httpd.shutdown()
    assert len(server.times) == 3
    gaps = [b - a for a, b in zip(server.times, server.times[1:])]
    assert gaps[0] >= 0.3 and gaps[1] >= 1.0, gaps  # the server's waits, not the 0.01 s backoff


def _turn_fails(replies, match, body=None) -> int:
    """Ask a scripted server once; the turn must fail with `PolicyError` matching `match`.
    Returns how many requests the server saw."""
    server = _ScriptedServer(replies, body=body)
    try:
        with pytest.raises(PolicyError, match=match):
            _ask(OpenAIAgent(server.url, retries=2, backoff_s=0.01))
    finally:
        server.httpd.shutdown()
    return len(server.times)


def test_openai_agent_gives_up_with_the_servers_own_words():
    """A server that stays overloaded fails the turn after 1 + retries attempts; a bad request
    (400) is not repeated; nor is a 200 that is not a chat completion. All are `PolicyError`
    (the runner makes the episode infra_error)."""
    assert _turn_fails([(503, {})], r"failed after 3 attempts: .*HTTP 503: .*scripted 503") == 3
    assert _turn_fails([(400, {}), (200, {})], r"HTTP 400: .*scripted 400") == 1
    for body in (
        '{"choices": []}',
        '{"choices": [{"message": "hi"}]}',
        "not json",
        '{"choices": [{"message": {"content": null, "tool_calls": ["f()"]}}]}',
    ):
        assert _turn_fails([(200, {})], "unexpected chat completion response", body=body) == 1


def test_progress_lines_count_requests_awaiting_a_remote_server(capsys, monkeypatch):
    """A remote policy has no batch to report: the heartbeat says how many of its requests are
    out, and nothing once they are answered."""
    import re

    from toolgym.harness import rollout

    monkeypatch.setattr(rollout, "PLAIN_PROGRESS_S", 0.1)
    server = _ScriptedServer([(200, {})], delay_s=0.6)
    try:
        runner = RolloutRunner(
            lambda: toolgym.make("records-v0").unwrapped,
            OpenAIAgent(server.url),
            progress=True,
            limits=toolgym.harness.RolloutLimits(max_turns=1),
        )
        trajs = runner.run(builtin_suite("records").tasks[:2])
    finally:
        server.httpd.shutdown()
    assert len(trajs) == 2 and len(server.times) == 2
    lines = capsys.readouterr().out.splitlines()
    waiting = [line for line in lines if re.match(r"rollouts: [01]/2 done, 0 passed, \d+ s \([12] requests? awaiting the server\)$", line)]
    assert waiting, lines
    assert any(line.startswith("rollouts: 2/2 done") and "awaiting" not in line for line in lines), lines


# ---- batched sampling on the policy's device --------------------------------------------------------


def test_a_rows_tokens_do_not_depend_on_its_batch(tiny_dir):
    """Device set explicitly; each row sampled alone equals the same row inside a batch of 8,
    for plain, top-k and top-p sampling and greedy."""
    from toolgym.inference.hf_policy import HFPolicy

    policy = HFPolicy(tiny_dir, device="cpu", dtype="fp32")
    assert str(policy.device) == "cpu" and policy.dtype == torch.float32
    prompts = [[5, 6, 7 + i, 9][: 2 + i % 3] + [30 + i] for i in range(8)]
    samplings = [
        SamplingParams(
            max_new_tokens=10,
            seed=100 + i,
            temperature=(0.0, 1.0, 0.7, 1.3)[i % 4],
            top_k=(0, 0, 20, 0)[i % 4],
            top_p=(1.0, 1.0, 1.0, 0.8)[i % 4],
        )
        for i in range(8)
    ]
    batch = policy.generate_batch(prompts, samplings)
    for prompt, sampling, together in zip(prompts, samplings, batch):
        alone = policy.generate_batch([prompt], [sampling])[0]
        assert alone.token_ids == together.token_ids
        assert alone.logprobs == pytest.approx(together.logprobs, abs=1e-4)


def test_seeds_differ_and_repeat():
    from toolgym.inference.sampling import uniform_draws

    seeds = torch.tensor([1, 2, 1])
    draws = uniform_draws(seeds, 0)
    assert draws[0] == draws[2] and draws[0] != draws[1]
    assert uniform_draws(seeds, 1)[0] != draws[0]  # a new step, a new draw
    many = uniform_draws(torch.arange(50000), 7)
    assert 0 < float(many.min()) and float(many.max()) < 1 and abs(float(many.mean()) - 0.5) < 0.01


def test_sampling_never_draws_a_cut_token():
    """Tokens removed by top-k/top-p (probability 0) are never sampled, whatever the draw."""
    from toolgym.inference.hf_policy import sample_tokens

    logits = torch.tensor([3.0, 2.5, 0.0, -1.0, -2.0]).repeat(5000, 1)
    n = logits.shape[0]
    ones = torch.ones(n)
    toks = sample_tokens(logits, ones, torch.full((n,), 2), ones, torch.arange(n), 0)
    assert set(toks.tolist()) == {0, 1}


def test_inverse_cdf_samples_the_softmax():
    """20,000 rows with different seeds: token frequencies match softmax(logits / T)."""
    from toolgym.inference.hf_policy import sample_tokens

    logits = torch.tensor([2.0, 1.0, 0.0, -1.0, -3.0]).repeat(20000, 1)
    n = logits.shape[0]
    ones = torch.ones(n)
    for temp in (1.0, 0.5):
        toks = sample_tokens(logits, ones * temp, torch.zeros(n, dtype=torch.long), ones, torch.arange(n), 3)
        freq = torch.bincount(toks, minlength=5).float() / n
        assert torch.allclose(freq, torch.softmax(logits[0] / temp, -1), atol=0.015), freq


def test_top_k_and_top_p_cuts_match_a_reference():
    from toolgym.inference.hf_policy import filter_logits

    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 30, generator=gen)
    top_k = torch.tensor([0, 3, 10, 0, 0, 5])
    top_p = torch.tensor([1.0, 1.0, 1.0, 0.5, 0.9, 0.7])
    got = filter_logits(logits, top_k, top_p)
    for i in range(6):  # the straightforward one-row reference
        row = logits[i].clone()
        if top_k[i] > 0:
            row[row < torch.topk(row, int(top_k[i])).values[-1]] = float("-inf")
        probs = torch.softmax(row, -1)
        order = torch.argsort(probs, descending=True)
        kept, mass = [], 0.0
        for j in order.tolist():
            if mass >= float(top_p[i]) or probs[j] == 0:
                break
            kept.append(j)
            mass += float(probs[j])
        ref = torch.full_like(row, float("-inf"))
        ref[kept] = row[kept]
        assert torch.equal(torch.isinf(got[i]), torch.isinf(ref)), i


def test_cuda_device_works_or_says_why(tiny_dir):
    from toolgym.inference.hf_policy import HFPolicy

    if torch.cuda.is_available():  # the GPU machine: every tensor on the device, bf16 by default
        policy = HFPolicy(tiny_dir, device="cuda")
        assert (
            policy.dtype == torch.bfloat16
            and len(policy.generate_batch([[5, 6]], [SamplingParams(max_new_tokens=4, seed=0)])[0].token_ids) == 4
        )
    else:
        with pytest.raises(ValueError, match="no CUDA GPU"):
            HFPolicy(tiny_dir, device="cuda")
