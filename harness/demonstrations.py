"""Demonstrations for SFT: each task's oracle played through its environment as tokens.

`OracleTokenPolicy` is a real `Policy` (token ids in, token ids out) that answers turn i with
the tokens of the task's i-th oracle call and the end-of-turn token. Run through the rollout
runner, it yields trajectories whose tokens come from exactly the renderer and segment path of
RL rollouts (prompt, policy segments as the policy would emit them, observation deltas), so the
tokens SFT trains on are the tokens the policy later sees.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from toolgym.envs import ToolEnv
from toolgym.harness.agents import TokenAgent
from toolgym.harness.rollout import RolloutLimits, RolloutRunner
from toolgym.harness.trajectory import Trajectory
from toolgym.inference.chat import end_of_turn_token
from toolgym.inference.policy import Generation, SamplingParams
from toolgym.tasks import Task


class OracleTokenPolicy:
    """Emits one task's oracle calls as tokens, one call per turn (logprobs 0: not sampled)."""

    def __init__(self, tokenizer: Any, task: Task) -> None:
        self.name = "oracle-tokens"
        self.tokenizer = tokenizer
        self.turns = task.oracle_turns()
        self.eot = tokenizer.convert_tokens_to_ids(end_of_turn_token(tokenizer))
        self.calls = 0

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Generation:
        """The next oracle call's tokens, ended by the end-of-turn token."""
        text = self.turns[self.calls] if self.calls < len(self.turns) else "done"
        self.calls += 1
        ids = self.tokenizer.encode(text, add_special_tokens=False) + [self.eot]
        return Generation(token_ids=ids, logprobs=[0.0] * len(ids), finish_reason="stop")


def collect_demonstrations(
    tasks: list[Task],
    tokenizer: Any,
    env_for: Callable[[str], ToolEnv],
    limits: RolloutLimits | None = None,
    concurrency: int = 8,
    progress: bool = True,
) -> list[Trajectory]:
    """Play every task's oracle as tokens through its environment and verifier (all episodes are
    returned: the oracle's pass rate is itself a check of the environments)."""
    import asyncio

    from toolgym.harness.rollout import run_episode

    limits = limits or RolloutLimits(max_new_tokens_per_turn=4096, max_total_tokens=1 << 16)
    runner = RolloutRunner(env_for, None, concurrency=concurrency, limits=limits, progress=progress)

    async def play(env: ToolEnv, task: Task) -> Trajectory:
        agent = TokenAgent(
            OracleTokenPolicy(tokenizer, task), tokenizer, SamplingParams(max_new_tokens=limits.max_new_tokens_per_turn, temperature=0.0)
        )
        return await run_episode(env, agent, task, seed=0, limits=limits)

    try:
        trajs = asyncio.run(runner.amap([(task,) for task in tasks], play, "demonstrations"))
    finally:
        runner.close()
    return trajs


__all__ = ["OracleTokenPolicy", "collect_demonstrations"]
