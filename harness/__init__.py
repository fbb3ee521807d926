"""Harness: token-in/token-out policies, multi-turn rollouts, trajectories and evaluation.

May import `toolgym.envs`, `toolgym.verifiers` and the layers below.
"""

from toolgym.harness.agents import FixedAgent, OpenAIAgent, OracleAgent, TokenAgent
from toolgym.harness.evaluate import EvalReport, evaluate, pass_at_k, render_markdown, write_report
from toolgym.harness.rollout import RolloutLimits, RolloutRunner, run_episode
from toolgym.harness.trajectory import Segment, Trajectory, read_jsonl, write_jsonl, write_parquet
from toolgym.inference.chat import ChatRenderer, TemplateError, load_template, observation_messages
from toolgym.inference.policy import Generation, Policy, PolicyError, SamplingParams

__all__ = [
    "ChatRenderer",
    "EvalReport",
    "FixedAgent",
    "Generation",
    "OpenAIAgent",
    "OracleAgent",
    "Policy",
    "PolicyError",
    "RolloutLimits",
    "RolloutRunner",
    "SamplingParams",
    "Segment",
    "TemplateError",
    "TokenAgent",
    "Trajectory",
    "evaluate",
    "load_template",
    "observation_messages",
    "pass_at_k",
    "read_jsonl",
    "render_markdown",
    "run_episode",
    "write_jsonl",
    "write_parquet",
    "write_report",
]
