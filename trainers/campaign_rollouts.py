"""Where a campaign's rollouts come from: the policy it builds, the environments, agents and
limits of its episodes, the screen that keeps the most learnable of the drawn tasks, the weights
rollouts sample with and how new weights reach them.

`RolloutSide` is a part of `Campaign` (trainers/campaign.py), kept here so each file has one job.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

import toolgym
from toolgym.envs import full_id
from toolgym.harness import RolloutLimits, RolloutRunner, SamplingParams, TokenAgent
from toolgym.harness.trajectory import Trajectory
from toolgym.inference.hf_policy import HFPolicy
from toolgym.sandbox import SandboxConfig
from toolgym.tasks import Task
from toolgym.trainers.config import CampaignConfig, EnvMix, EvalSuite
from toolgym.trainers.ray_backend import ray_runner, start_ray
from toolgym.trainers.screening import ReferenceScreen


def env_options(config: CampaignConfig, env_id: str) -> dict[str, Any]:
    """The keyword arguments the campaign makes `env_id` with: its sandbox settings and its tool
    order (`EnvMix.shuffle_tools`), from the first entry of `envs` or `eval.suites` naming it."""
    for mix in [*config.envs, *config.eval.suites]:
        if full_id(mix.env) != env_id:
            continue
        options: dict[str, Any] = {}
        if mix.sandbox is not None:
            options["sandbox"] = mix.sandbox
        if getattr(mix, "shuffle_tools", False):
            options["shuffle_tools"] = True
            if mix.pinned_tools:
                options["pinned_tools"] = mix.pinned_tools
        return options
    return {}


def build_policy(config: CampaignConfig) -> HFPolicy:
    """The policy to train: the tiny model toolgym builds (sized by the config), or any HF model."""
    settings = config.model
    if settings.init == "tiny":
        from toolgym.inference.tiny import DEFAULT_DIR, build_tiny_policy

        t = settings.tiny
        path = build_tiny_policy(
            DEFAULT_DIR.with_name(f"tiny-policy-v1-h{t.hidden}-l{t.layers}-v{t.vocab}"),
            vocab_size=t.vocab,
            hidden=t.hidden,
            layers=t.layers,
            seed=config.seed,
        )
        return HFPolicy(str(path), device=settings.device, dtype=settings.dtype, name="tiny")
    return HFPolicy(settings.init, device=settings.device, dtype=settings.dtype)


def allocate(n: int, weights: list[float]) -> list[int]:
    """Split `n` tasks by weight (largest remainder; every env of positive weight gets one when n
    allows; an env of weight 0 gets none: it is demonstrated and evaluated, never drawn)."""
    w = np.array(weights, dtype=float) / sum(weights)
    counts = np.floor(w * n).astype(int)
    if n >= int((w > 0).sum()):
        counts = np.where(w > 0, np.maximum(counts, 1), 0)
    while counts.sum() < n:
        counts[int(np.argmax(w * n - counts))] += 1
    while counts.sum() > n:
        counts[int(np.argmax(counts))] -= 1
    return counts.tolist()


@dataclass
class RolloutBatch:
    """One step's rollouts, before any training on them."""

    step: int
    chosen: list[tuple[str, Task]]
    trajectories: list[Trajectory]
    started: float
    seconds: float
    extra: dict[str, Any]


def episode_seed(seed: int, step: int, index: int) -> int:
    """The env/sampling seed of task `index` at `step`: new samples every step, identical on resume."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{step}:{index}".encode()).digest()[:4], "little")


class RolloutSide:
    """The campaign's rollout side (a part of `Campaign`: it reads the campaign's attributes)."""

    @staticmethod
    def _sandbox_config(mix: EnvMix) -> SandboxConfig:
        return SandboxConfig.model_validate(mix.sandbox or {})

    def make_env(self, env_id: str):
        """An environment for `env_id` with the campaign's settings for it (sandbox, tool order)."""
        return toolgym.make(env_id, **env_options(self.config, env_id)).unwrapped

    def agent(self, temperature: float, policy: Any = None, explore_tools: float = 0.0) -> TokenAgent:
        """A token agent on `policy` (default: the training model, which samples with the current
        weights); `explore_tools` for RL rollouts only (`rollout.explore_tools`)."""
        r = self.config.rollout
        default = self._copy.policy if self._copy is not None else self.policy
        return TokenAgent(
            policy or default,
            self.tokenizer,
            SamplingParams(max_new_tokens=r.max_new_tokens, temperature=temperature, top_p=r.top_p),
            explore_tools=explore_tools,
        )

    def limits(self, evaluation: bool = False, suite: EvalSuite | None = None) -> RolloutLimits:
        """Per-episode limits of the campaign (of its evaluations with `evaluation`; of the
        evaluation-only `suite`, its own turns and tokens per episode)."""
        r = self.config.rollout
        if suite is not None:
            return RolloutLimits(
                max_turns=suite.max_turns,
                max_new_tokens_per_turn=r.max_new_tokens,
                max_total_tokens=suite.max_total_tokens or r.max_total_tokens,
            )
        turns = (self.config.eval.max_turns if evaluation else None) or r.max_turns
        return RolloutLimits(max_turns=turns, max_new_tokens_per_turn=r.max_new_tokens, max_total_tokens=r.max_total_tokens)

    def weights(self) -> Any:
        """Where rollouts sample from (see `trainers/inference.py`), chosen by the config."""
        if self._weights is None:
            from toolgym.trainers import inference

            r = self.config.rollout
            if r.servers:
                backend = "nccl" if self.policy.device.type == "cuda" else "gloo"
                self._weights = inference.ServerWeights(r.servers, r.weight_sync, self.run_dir / "weights", self.tokenizer, backend)
            elif r.backend == "ray":
                from toolgym.harness.ray_pool import serve_policy

                start_ray(r.ray)
                self._weights = inference.ActorWeights(
                    serve_policy(self.policy.source, self.config.model.device or "cpu", self.config.model.dtype)
                )
            elif self._copy is not None:  # several training processes: rank 0's copy samples
                self._weights = self._copy
            elif r.max_staleness > 0:  # the learner updates its model while rollouts sample
                self._weights = inference.CopiedWeights(self.policy)
            else:
                self._weights = inference.SharedWeights(self.policy)
        return self._weights

    def publish(self, version: int) -> None:
        """Send the current weights to the rollout policy as `version` (RL updates applied).
        Several training processes: gathered from them first, and rank 0's copy refreshed."""
        if self.world == 1:
            if self._copy is not None:  # the sampling copy (another dtype); also serves evaluation
                self._copy.push(self.policy.model, version)
            if self.weights() is not self._copy:
                self.weights().push(self.policy.model, version)
        else:
            state = self.trainer.run("weights")
            assert self._copy is not None
            self._copy.push(self.policy.model, version, state)
            if self.weights() is not self._copy:  # servers or a Ray actor: from the (plain) copy
                self.weights().push(self._copy.policy.model, version, state)
        self._published = True

    def runner(self) -> Any:
        """The rollout runner (environments pooled across steps): local, or Ray environment
        workers (`rollout.backend: ray`)."""
        if self._runner is None:
            r = self.config.rollout
            agent = self.agent(r.temperature, self.weights().policy, r.explore_tools)
            if r.backend == "ray":
                handle = getattr(self.weights(), "handle", None)  # a PolicyActor, unless servers serve
                env_kwargs = {full_id(m.env): env_options(self.config, full_id(m.env)) for m in self.config.envs}
                self._runner = ray_runner(self.config, agent, self.policy.source, self.limits(), env_kwargs, handle)
            else:
                self._runner = RolloutRunner(
                    self.make_env,
                    agent,
                    group_size=self.config.rl.group_size,
                    concurrency=r.concurrency,
                    limits=self.limits(),
                    progress=self.progress,
                )
        return self._runner

    def screened(self, suite: str, drawn: dict[str | None, list[str]], quotas: dict[str | None, int]) -> dict[str | None, list[str]]:
        """Each family's candidates (`drawn`; one family, None, unless the draw is stratified) cut
        to its quota: the ones whose reference solutions, scored by the sampling policy in one
        pass, predict the most reward variance (`sampler.screen`, trainers/screening.py); adds to
        the step's screen metrics."""
        over = [task_id for family, ids in drawn.items() if len(ids) > quotas[family] for task_id in ids]
        if not over:
            return drawn
        start = time.perf_counter()
        if self._screen is None:
            self._screen = ReferenceScreen(
                self.tokenizer, self.make_env, self.config.rollout.concurrency, declines=self.config.sampler.screen_declines
            )
            # the SFT stage already played these tasks' oracles: their demonstrations are the references
            self._screen.references.update({d.task_id: d for d in self.demos or []})
        tasks = [self.train_tasks[suite][i] for i in over]
        predicted = self._screen.predicted_pass_rates(
            self.screen_model(),
            tasks,
            self.policy.pad_id,
            self.config.rollout.max_total_tokens,
            temperature=self.config.rollout.temperature,
        )
        sampler = self.samplers[suite]
        kept = {
            family: sampler.keep_screened(ids, quotas[family], predicted) if len(ids) > quotas[family] else ids
            for family, ids in drawn.items()
        }
        stats = self._screen_stats
        stats["screen_candidates"] = stats.get("screen_candidates", 0) + len(over)
        stats["screen_scored"] = stats.get("screen_scored", 0) + len(predicted)
        stats["screen_seconds"] = stats.get("screen_seconds", 0.0) + time.perf_counter() - start
        kept_predictions = [predicted[i] for ids in kept.values() for i in ids if i in predicted]
        if kept_predictions:  # the mean over every screen of the step (dynamic sampling screens again)
            before, mean = stats.get("screen_kept", 0), stats.get("screen_kept_predicted_pass", 0.0)
            stats["screen_kept"] = before + len(kept_predictions)
            stats["screen_kept_predicted_pass"] = (mean * before + sum(kept_predictions)) / stats["screen_kept"]
        return kept

    def screen_model(self) -> torch.nn.Module:
        """The model whose probabilities the screen reads: the one rollouts sample from when it is
        local, else the trained weights (the same version once published)."""
        policy = getattr(self.weights(), "policy", None)
        if isinstance(policy, HFPolicy):
            return policy.model
        return (self._copy.policy if self._copy is not None else self.policy).model


__all__ = ["RolloutBatch", "RolloutSide", "allocate", "build_policy", "episode_seed"]
