"""Inference: the policies that turn token ids into token ids, and what they need.

The `Policy` protocol and its backends (in-process Hugging Face `hf_policy` with its KV cache and
CPU attention, sglang over HTTP with weight sync), sampling, chat templates and their prefix-stability
check, hardware probing, the built-in pretrained and tiny models.

May import `toolgym.tasks` and `toolgym.sandbox` only (it knows nothing of environments or grading).
"""

from toolgym.inference.chat import ChatRenderer, TemplateError, load_template, observation_messages
from toolgym.inference.policy import Generation, Policy, PolicyError, SamplingParams

__all__ = [
    "ChatRenderer",
    "Generation",
    "Policy",
    "PolicyError",
    "SamplingParams",
    "TemplateError",
    "load_template",
    "observation_messages",
]
