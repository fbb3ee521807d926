"""The training endpoint's cost per turn, side by side in one run: the same turns played by
calling the policy directly (what the rollout runner does: generate, then render the observation
delta) and through the endpoint by an agent using the official `openai` SDK (HTTP, JSON, tool
call parsing, history matching, the same delta). Rounds alternate, so the machine's noise falls
on both alike.

Two policies: `instant` returns a fixed tool call at once (the endpoint's own overhead in
milliseconds), `tiny` is the tiny model generating 24 tokens (the overhead next to real work).

    python bench/endpoint.py [--turns 40] [--rounds 3] [--out runs/bench/endpoint.json]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import write_results  # noqa: E402  (bench/common.py)

from toolgym.inference.chat import ChatRenderer
from toolgym.inference.hf_policy import HFPolicy
from toolgym.inference.policy import Generation, SamplingParams
from toolgym.inference.tiny import build_tiny_policy
from toolgym.integrations.endpoint import Endpoint
from toolgym.verifiers import Outcome

CALL = '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>'
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "run a command",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
        },
    }
]


_LOOP = asyncio.new_event_loop()


class Instant:
    """A policy that answers every turn with the same tool call, at once."""

    name = "instant"

    def __init__(self, tokenizer, eot_id: int) -> None:
        self.ids = tokenizer.encode(CALL, add_special_tokens=False) + [eot_id]

    async def generate(self, prompt_ids, sampling):
        return Generation(token_ids=list(self.ids), logprobs=[-0.1] * len(self.ids))


def direct(policy, tokenizer, turns: int, sampling: SamplingParams) -> float:
    """Seconds per turn: generate, then append a tool result as a delta (the rollout's path)."""
    renderer = ChatRenderer(tokenizer, TOOLS, system=None)
    context = renderer.prompt_ids([{"role": "user", "content": "list the files"}])

    async def run() -> None:
        nonlocal context
        for _ in range(turns):
            gen = await policy.generate(context, sampling)
            context += list(gen.token_ids)
            context += renderer.delta_ids([{"role": "tool", "name": "bash", "content": "a.txt\nb.txt"}])

    start = time.perf_counter()
    _LOOP.run_until_complete(run())  # one loop for every round: the policy's batcher lives on it
    return (time.perf_counter() - start) / turns


def through_endpoint(policy, tokenizer, turns: int, sampling: SamplingParams) -> float:
    """Seconds per turn for an SDK agent whose every reply gets a tool result."""
    from openai import OpenAI

    endpoint = Endpoint(policy, tokenizer, sampling).start()
    try:
        url = endpoint.open_episode(tools=TOOLS)
        client = OpenAI(base_url=url, api_key="unused")
        messages = [{"role": "user", "content": "list the files"}]
        start = time.perf_counter()
        for turn in range(turns):
            message = client.chat.completions.create(model="x", messages=messages, tools=TOOLS).choices[0].message
            messages.append(message.model_dump(exclude_none=True))
            call_id = message.tool_calls[0].id if message.tool_calls else f"none-{turn}"
            messages.append({"role": "tool", "tool_call_id": call_id, "content": "a.txt\nb.txt"})
        per_turn = (time.perf_counter() - start) / turns
        assert endpoint.stats["divergences"] == 0
        # closed, as a trainer closes it: an episode left open is one a batching policy waits for
        endpoint.close_episode(url, 0.0, Outcome.FAILED)
        return per_turn
    finally:
        endpoint.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default="runs/bench/endpoint.json")
    args = parser.parse_args()
    tiny = HFPolicy(str(build_tiny_policy()), device="cpu", dtype="fp32", name="tiny")
    tok = tiny.tokenizer
    eot = tok.convert_tokens_to_ids("<|im_end|>")
    results = {}
    for name, policy, sampling in (
        ("instant", Instant(tok, eot), SamplingParams(max_new_tokens=64)),
        ("tiny", tiny, SamplingParams(max_new_tokens=24, temperature=1.0)),
    ):
        turns = args.turns if name == "instant" else max(8, args.turns // 4)
        a, b = [], []
        for _ in range(args.rounds):
            a.append(direct(policy, tok, turns, sampling))
            b.append(through_endpoint(policy, tok, turns, sampling))
        d, e = statistics.median(a), statistics.median(b)
        results[name] = {
            "direct_ms": d * 1000,
            "endpoint_ms": e * 1000,
            "overhead_ms": (e - d) * 1000,
            "ratio": e / d,
            "turns": turns,
            "rounds": args.rounds,
        }
        print(
            f"{name:8} per turn: direct {d * 1000:.1f} ms, through the endpoint {e * 1000:.1f} ms "
            f"(+{(e - d) * 1000:.1f} ms, {e / d:.2f}x; median of {args.rounds} rounds of {turns} turns)",
            flush=True,
        )
    write_results(args.out, results)


if __name__ == "__main__":
    main()
