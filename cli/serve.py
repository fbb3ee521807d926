"""`toolgym serve`: the training endpoint (an OpenAI-compatible server recording trajectories)."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import typer

from toolgym.cli.app import CLIError, app, console


@app.command()
def serve(
    policy: str = typer.Option("tiny", help="tiny | hf:MODEL (dir, hub id, smollm2-135m) | sglang:URL[,URL]"),
    host: str = typer.Option("127.0.0.1", help="address to listen on"),
    port: int = typer.Option(8000, help="port (0: any free one)"),
    out: Path = typer.Option(Path("runs/serve"), help="closed episodes' trajectories go to OUT/trajectories.jsonl"),
    max_new_tokens: int = typer.Option(256, help="tokens per turn unless a request asks for fewer"),
    temperature: float = typer.Option(1.0, help="sampling temperature unless a request sets one"),
    tokenizer: str | None = typer.Option(None, help="tokenizer for sglang: policies"),
    device: str | None = typer.Option(None, help="tiny/hf: cpu, cuda, cuda:1"),
    dtype: str = typer.Option("auto", help="tiny/hf: bf16 | fp16 | fp32 | auto"),
) -> None:
    """Serve a policy as an OpenAI-compatible Chat Completions endpoint that records token-exact
    trajectories: an agent uses base_url http://HOST:PORT/episodes/<any id>/v1 (one id per
    episode), then POSTs {"reward": r} to .../episodes/<id>/close; its trajectory is written out."""
    from toolgym.harness.agents import TokenAgent
    from toolgym.harness.specs import make_agent
    from toolgym.inference.policy import SamplingParams
    from toolgym.integrations.endpoint import Endpoint

    agent = make_agent(
        policy,
        SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature),
        tokenizer,
        device=device,
        dtype=None if dtype == "auto" else dtype,
    )
    if not isinstance(agent, TokenAgent):
        raise CLIError(f"--policy {policy!r} does not give token ids; the endpoint needs tiny, hf: or sglang:")
    out.mkdir(parents=True, exist_ok=True)
    path = out / "trajectories.jsonl"
    lock = threading.Lock()

    def write(trajectories) -> None:
        with lock, path.open("a") as f:
            for t in trajectories:
                f.write(json.dumps(t.model_dump(mode="json")) + "\n")
        console.print(
            f"episode closed: {len(trajectories)} trajector{'y' if len(trajectories) == 1 else 'ies'}, "
            f"reward {trajectories[0].reward if trajectories else '-'}"
        )

    endpoint = Endpoint(
        agent.policy, agent.tokenizer, agent.sampling, agent.chat_template, host=host, port=port, auto_open=True, on_close=write
    ).start()
    console.print(f"serving {agent.policy.name} at {endpoint.url}/episodes/<episode>/v1 (trajectories: {path}); Ctrl-C stops")
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        endpoint.close()
