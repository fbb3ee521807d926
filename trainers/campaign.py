"""The training campaign: SFT warm start, then GRPO with the learnability sampler, evaluated on
held-out splits, with checkpoints, resume, metrics and a report.

One RL step: draw tasks (per environment, by weight, through each suite's sampler, before any
rollout) -> roll out G episodes per task with the harness (each on its own env id) -> verify ->
safety penalties from the ledger -> advantages per group (groups with an infra/verifier error
are dropped whole, zero-variance groups are left out of the gradient) -> masked loss in
micro-batches -> optimizer step -> the new weights go to whatever samples (see
`trainers/inference.py`: the shared in-process model, a copy, a Ray actor, or sglang servers).

With `rollout.max_staleness: k > 0` the rollouts of the next steps run in a background thread
while the learner updates (`trainers/pipeline.py`); groups more than k versions stale are dropped.
"""

from __future__ import annotations

import asyncio
import shutil
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml
from rich.console import Console

from toolgym.envs import full_id
from toolgym.harness import RolloutRunner
from toolgym.harness.trajectory import Trajectory, write_jsonl
from toolgym.inference.hardware import Precision, choose_bf16, cpu_description
from toolgym.inference.hf_policy import resolve_dtype
from toolgym.inference.host_memory import memory_fields
from toolgym.sandbox import SafetyPolicy
from toolgym.tasks import Task, builtin_suite
from toolgym.trainers import core_algos as ca
from toolgym.trainers.batching import TokenBatch, pack
from toolgym.trainers.campaign_io import EvalAndCheckpoints
from toolgym.trainers.campaign_rollouts import RolloutBatch, RolloutSide, allocate, build_policy, episode_seed
from toolgym.trainers.checkpoint import MetricsLog, latest_checkpoint, read_metrics
from toolgym.trainers.config import CampaignConfig, ConfigError
from toolgym.trainers.distributed import Coordinator, follow, init_training_processes, under_torchrun
from toolgym.trainers.inference import CopiedWeights
from toolgym.trainers.learner import Learner, apply_lora
from toolgym.trainers.memory import release_memory
from toolgym.trainers.pipeline import RolloutPipeline, stale_groups
from toolgym.trainers.rewards import broken_groups, groups_of, informative_groups, sampler_score, shaped_reward, trained_reward
from toolgym.trainers.sampler import LearnabilitySampler
from toolgym.trainers.screening import ReferenceScreen
from toolgym.trainers.sft import oracle_demonstrations, sft_batches, sft_learning_rate, sft_progress, train_families
from toolgym.trainers.step_metrics import rollout_metrics, staleness_metrics, suite_metrics
from toolgym.verifiers import Outcome


class Campaign(RolloutSide, EvalAndCheckpoints):
    """A training run in `config.out_dir` (see the module docstring)."""

    def __init__(self, config: CampaignConfig, progress: bool = True, console: Console | None = None) -> None:
        self.config = config
        self.progress = progress
        self.console = console or Console()
        self.run_dir = Path(config.out_dir)
        self.rng = np.random.default_rng(config.seed)
        torch.manual_seed(config.seed)
        # Several training processes (torchrun, see trainers/distributed.py): rank 0 runs the
        # campaign, the others follow its updates.
        self.rank, self.world = 0, 1
        if config.processes > 1 or under_torchrun():
            if not under_torchrun():
                raise RuntimeError(f"processes: {config.processes} needs torchrun: start it with `toolgym train`")
            self.rank, self.world = init_training_processes(config.model.device)
        with self._rank0_first():  # rank 0 may write the tiny model's directory
            self.policy = build_policy(config)
        self.tokenizer = self.policy.tokenizer
        if config.model.chat_template:  # on the shared tokenizer: rollouts, demonstrations and exports use it
            from toolgym.inference.chat import load_template

            self.tokenizer.chat_template = load_template(config.model.chat_template)
        if config.rl.learner.lora is not None:
            self.policy.model = apply_lora(self.policy.model, config.rl.learner.lora)
        # With several processes the training model is wrapped or sharded: rank 0 samples and
        # evaluates with its own copy (made before sharding), refreshed by `publish`. A copy also
        # samples when rollouts use another dtype than training (bf16 sampling, fp32 weights).
        rollout_dtype = config.model.rollout_dtype
        if rollout_dtype == "auto":  # bf16 sampling only where the hardware computes bf16 natively
            self.rollout_precision = choose_bf16("auto", self.policy.device)
            rollout_dtype = "bf16" if self.rollout_precision.dtype == "bf16" else None
        else:
            self.rollout_precision = Precision(rollout_dtype or str(self.policy.dtype).removeprefix("torch."), "set in the config")
        needs_copy = self.world > 1 or (
            rollout_dtype is not None and resolve_dtype(rollout_dtype, str(self.policy.device)) != self.policy.dtype
        )
        self._copy = CopiedWeights(self.policy, dtype=rollout_dtype) if needs_copy and self.rank == 0 else None
        r = config.rollout
        # the batches come from something other than the trained model itself: a copy in another
        # dtype, weights a step or more stale, a server or a Ray actor (tis_cap: auto corrects it)
        off_policy = self._copy is not None or r.max_staleness > 0 or bool(r.servers) or r.backend == "ray"
        self.learner = Learner(
            self.policy.model,
            config.rl.learner,
            off_policy=off_policy,
            generation_budget=min(r.max_total_tokens, r.max_turns * r.max_new_tokens),
            temperature=r.temperature,
        )
        self.trainer = Coordinator(self.learner)
        self.suites = {mix.suite: builtin_suite(mix.suite) for mix in [*config.envs, *config.eval.suites]}
        self.mix = {mix.suite: mix for mix in config.envs}
        self.train_tasks: dict[str, dict[str, Task]] = {}
        for mix in config.envs:
            tasks = self.suites[mix.suite].split("train").tasks
            tasks = [t for t in tasks if t.difficulty <= mix.max_difficulty] if mix.max_difficulty else tasks
            tasks = [t for t in tasks if t.family in mix.train_families] if mix.train_families else tasks
            tasks = tasks[: mix.train_tasks] if mix.train_tasks else tasks
            if not tasks:  # a typo in a family, or a max_difficulty below every task's: nothing to train on
                raise ConfigError(
                    f"envs entry {mix.env}: no train task of suite {mix.suite} is left by max_difficulty "
                    f"{mix.max_difficulty or 'any'} and train_families {mix.train_families or 'all'}"
                )
            self.train_tasks[mix.suite] = {t.id: t for t in tasks}
        families = train_families(self.train_tasks)
        named = dict.fromkeys([*config.sft.skip_families, *config.sft.family_limits])
        if missing := [name for name in named if name not in families]:  # a typo would silently change nothing
            raise ConfigError(
                f"sft.skip_families / sft.family_limits: no train task of family {', '.join(missing)} "
                f"(the train tasks' families: {', '.join(sorted(families))})"
            )
        self.samplers = {
            s: LearnabilitySampler(list(tasks), config.sampler, {i: t.family for i, t in tasks.items()})
            for s, tasks in self.train_tasks.items()
        }
        self.safety = {full_id(mix.env): self._sandbox_config(mix).policy for mix in config.envs}
        self.call_costs = {full_id(mix.env): mix.call_cost for mix in config.envs}
        self.metrics: MetricsLog | None = None
        self.step = 0
        self._runner: RolloutRunner | None = None
        self._weights: Any = None  # where rollouts sample from (trainers/inference.py)
        self._published = False
        self._last_step_end: float | None = None
        # the rollout thread draws tasks while the learner updates the samplers (async mode)
        self._draw_lock = threading.Lock()
        self.demos: list[Trajectory] | None = None  # the SFT stage's demonstrations (rl.sft_anchor replays them)
        self._screen: ReferenceScreen | None = None  # reference solutions of screened tasks (sampler.screen)
        self._screen_stats: dict[str, Any] = {}  # this step's screen: candidates, scored, seconds

    # ---- environments and agents ----------------------------------------------------------------

    @contextmanager
    def _rank0_first(self) -> Iterator[None]:
        """Rank 0 runs the block before the others (it may create files they read)."""
        import torch.distributed as dist

        if self.world > 1 and self.rank != 0:
            dist.barrier()
        yield
        if self.world > 1 and self.rank == 0:
            dist.barrier()

    # ---- the whole run ----------------------------------------------------------------------------

    def run(self, resume: bool = False, sft_only: bool = False) -> dict[str, Any]:
        """SFT (if configured), evaluation, RL steps with checkpoints, final evaluation, report.
        A follower rank (several training processes) only does the updates rank 0 announces."""
        c = self.config
        if self.rank != 0:
            follow(self.trainer)
            return {}
        self.run_dir.mkdir(parents=True, exist_ok=True)
        ckpt = latest_checkpoint(self.run_dir) if resume else None
        if resume and ckpt is None:
            self.console.print(f"no checkpoint in {self.run_dir}: starting from the beginning")
        if ckpt is None and (self.run_dir / "metrics.jsonl").exists():  # a fresh start (or nothing to resume)
            for stale in ("metrics.jsonl", "tensorboard", "checkpoints", "eval", "rollouts"):
                path = self.run_dir / stale
                shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
        (self.run_dir / "config.yaml").write_text(yaml.safe_dump(c.model_dump(mode="json"), sort_keys=False))
        self._record_precision()
        self.metrics = MetricsLog(self.run_dir)
        try:
            if ckpt is not None:
                self._restore(ckpt)
                self.console.print(f"resumed from {ckpt.name} (step {self.step})")
                self.publish(self.step)
            else:
                if c.eval.base_tasks:
                    self.publish(self.step)
                    self.evaluate("base", max_tasks=c.eval.base_tasks)
                if c.sft.steps:
                    self.sft_stage()
                self.publish(self.step)
                self.evaluate("sft" if c.sft.steps else "initial")
                self.checkpoint()
            if sft_only or (ckpt is None and c.sft.steps):
                # the SFT stage's model on its own: RL of other seeds, or evaluations on other suites,
                # start from the very weights this run's "SFT" numbers came from
                self._export("sft-model")
            if sft_only:
                return {"step": self.step}
            pipeline = None
            if c.rollout.max_staleness > 0 and self.step < c.rl.steps:
                pipeline = RolloutPipeline(self.collect, self.step + 1, c.rl.steps, c.rollout.max_staleness).start()
            try:
                while self.step < c.rl.steps:
                    self.step += 1
                    waited = time.perf_counter()
                    batch = pipeline.get(self.step) if pipeline else self.collect(self.step)
                    batch.extra["time_wait_s"] = time.perf_counter() - waited
                    learned = self.learn(batch)
                    learned.update(memory_fields())
                    self.metrics.log(self.step, learned)
                    self.say_step(learned)
                    if pipeline:
                        pipeline.trained(self.step)
                    if c.eval.every and self.step % c.eval.every == 0 and self.step < c.rl.steps:
                        self.evaluate(f"step-{self.step}")
                    if self.step % c.checkpoint.every == 0 or self.step == c.rl.steps:
                        self.checkpoint()
            finally:
                if pipeline:
                    pipeline.close()
            self.evaluate("final")
            self._export("final-model")
        finally:
            if self.world > 1:
                self.trainer.run("stop")  # the followers exit, also when this rank failed
            self.close()
        from toolgym.trainers.report import write_report

        return write_report(self.run_dir)

    def say_step(self, m: dict[str, Any]) -> None:
        """One line per RL step (terminal or log): what it sampled, what trained, where the time
        went. Rollouts show their own progress; without this line a log shows no step count."""
        if not self.progress:
            return
        groups = f"{m.get('trained_groups', 0)} of {m.get('groups_groups', 0)} groups trained"
        loss = f", loss {m['loss']:.3f}" if isinstance(m.get("loss"), float) else ""
        self.console.print(
            f"RL step {self.step}/{self.config.rl.steps}: reward {m.get('reward_mean', float('nan')):.3f} "
            f"over {m.get('episodes', 0)} episodes, {groups}{loss}, {m.get('time_step_s', 0.0):.0f} s "
            f"(rollouts {m.get('time_rollout_s', 0.0):.0f} s, update {m.get('time_train_s', 0.0):.0f} s)",
            soft_wrap=True,
        )

    def _record_precision(self) -> None:
        """Say which precision `auto` chose and why, on the screen and in `OUT/hardware.json`."""
        import json

        chosen = {
            "cpu": cpu_description(),
            "device": str(self.policy.device),
            "weights": str(self.policy.dtype).removeprefix("torch."),
            "rollout": self.rollout_precision.as_dict(),
            "train_autocast": self.learner.precision.as_dict(),
        }
        (self.run_dir / "hardware.json").write_text(json.dumps(chosen, indent=2) + "\n")
        self.console.print(
            f"hardware: {chosen['cpu']}\n  rollouts sample in {self.rollout_precision.dtype} "
            f"({self.rollout_precision.reason})\n  training computes in "
            f"{self.learner.precision.dtype} ({self.learner.precision.reason})"
        )

    def close(self) -> None:
        """Close environments and the metrics log."""
        if self._runner is not None:
            self._runner.close()
            self._runner = None
        if self._weights is not None:
            self._weights.close()
            self._weights = None
        if self.metrics is not None:
            self.metrics.close()

    # ---- SFT ------------------------------------------------------------------------------------

    def sft_stage(self) -> None:
        """Warm start on oracle demonstrations of train tasks (same renderer and masks as RL)."""
        s = self.config.sft
        demos = self.demonstrations()
        self.trainer.run("restart_optimizer", s.lr)  # a fresh optimizer for SFT, another for RL after
        with sft_progress(s.steps, self.progress) as advance:
            for i, chosen in enumerate(sft_batches(demos, s.steps, s.batch_size, self.rng)):
                lr = sft_learning_rate(s.lr, i, s.steps, s.schedule, s.warmup_steps)
                self.trainer.run("set_lr", lr)
                m = self.trainer.run("sft", pack(chosen, [0.0] * len(chosen), self.policy.pad_id, self.config.rollout.max_total_tokens))
                m.update(lr=lr, **memory_fields())
                self.metrics.log(i + 1, m, kind="sft")
                advance(m["sft_loss"])
        self.trainer.run("restart_optimizer", self.config.rl.learner.lr)
        release_memory()

    def demonstrations(self) -> list[Trajectory]:
        """The oracle demonstrations of the first `sft.demos_per_suite` (or the entry's own `demos`)
        train tasks of every suite with `demonstrations` on,
        played and checked once (logged as the `oracle` row), then kept. A resumed run replays
        them (the anchor needs them) but its log already has the row: it is not logged twice."""
        if self.demos is None:
            shown_mixes = [mix for mix in self.config.envs if mix.demonstrations]
            shown = {mix.suite: self.train_tasks[mix.suite] for mix in shown_mixes}
            self.demos, checks = oracle_demonstrations(
                shown,
                {mix.suite: mix.demos or self.config.sft.demos_per_suite for mix in shown_mixes},
                self.tokenizer,
                self.make_env,
                self.config.rollout.concurrency,
                self.progress,
                self.console,
                tuple(self.config.sft.skip_families),
                self.config.sft.family_limits,
            )
            assert self.metrics is not None
            if not any(r.get("kind") == "oracle" for r in read_metrics(self.run_dir)):
                self.metrics.log(0, checks, kind="oracle")
        return self.demos

    def anchor_batch(self, step: int) -> TokenBatch | None:
        """Step `step`'s SFT-anchor demonstrations, packed (drawn from the step alone, so a resumed
        campaign draws the same ones), or None when `rl.sft_anchor` is off."""
        rl = self.config.rl
        if rl.sft_anchor <= 0:
            return None
        demos = self.demonstrations()
        rng = np.random.default_rng([self.config.seed, step, 0x5F7])
        chosen = rng.choice(len(demos), size=min(max(rl.sft_anchor_batch, self.world), len(demos)), replace=False)
        return pack([demos[int(i)] for i in chosen], [0.0] * len(chosen), self.policy.pad_id, self.config.rollout.max_total_tokens)

    # ---- RL -------------------------------------------------------------------------------------

    def draw(self, n: int = 0, exclude: frozenset[str] = frozenset()) -> list[tuple[str, Task]]:
        """This step's tasks (`n`, default tasks_per_step): per environment by weight, each suite's
        sampler choosing (split evenly across its families with `sampler.stratify`), none of
        `exclude`."""
        counts = allocate(n or self.config.rl.tasks_per_step, [m.weight for m in self.config.envs])
        chosen = []
        s = self.config.sampler
        factor = s.screen if s.kind == "learnability" and s.screen > 1 else 1
        with self._draw_lock:
            for mix, n_env in zip(self.config.envs, counts):
                sampler = self.samplers[mix.suite]
                quotas = sampler.family_quotas(n_env, self.rng, exclude) if s.stratify else {None: n_env}
                # a suite never demonstrated is never screened by its reference solutions either
                screen = factor if mix.demonstrations else 1
                drawn = {family: sampler.draw(quota * screen, self.rng, exclude, family) for family, quota in quotas.items()}
                if screen > 1:
                    drawn = self.screened(mix.suite, drawn, quotas)
                suite_tasks = self.train_tasks[mix.suite]
                chosen += [(mix.suite, suite_tasks[task_id]) for ids in drawn.values() for task_id in ids]
        return chosen

    def rl_step(self) -> dict[str, Any]:
        """One synchronous campaign step (see the module docstring); returns its metrics."""
        if not self._published:
            self.publish(self.step - 1)
        return self.learn(self.collect(self.step))

    def collect(self, step: int) -> RolloutBatch:
        """Draw step `step`'s tasks and play G episodes of each (no training)."""
        c = self.config
        t0 = time.perf_counter()
        self._screen_stats = {}
        chosen = self.draw()
        tasks = [t for _, t in chosen]
        seeds = [episode_seed(c.seed, step, i) for i in range(len(tasks))]
        runner = self.runner()
        trajs = asyncio.run(runner.arun(tasks, seeds=seeds))
        # DAPO's dynamic sampling: groups with equal rewards carry no gradient; play more tasks
        # until the step has its configured number of informative groups (bounded rounds)
        rounds = 0
        while c.rl.drop_zero_variance and rounds < c.rl.dynamic_sampling:
            short = c.rl.tasks_per_step - len(self.informative_groups(trajs))
            more = self.draw(short, frozenset(t.id for t in tasks)) if short > 0 else []
            if not more:
                break
            rounds += 1
            seeds = [episode_seed(c.seed, step, len(tasks) + i) for i in range(len(more))]
            trajs = trajs + asyncio.run(runner.arun([t for _, t in more], seeds=seeds))
            chosen, tasks = chosen + more, tasks + [t for _, t in more]
        extra: dict[str, Any] = {"dynamic_extra_draws": rounds, "dynamic_extra_tasks": len(tasks) - c.rl.tasks_per_step if rounds else 0}
        extra.update(self._screen_stats)
        if c.rollout.backend == "ray":
            extra["ray"] = dict(runner.stats)  # workers lost, resubmissions
        return RolloutBatch(step, chosen, trajs, t0, time.perf_counter() - t0, extra)

    def informative_groups(self, trajs: list[Trajectory]) -> list[str]:
        """Group ids, in play order, that can carry a gradient (`rewards.informative_groups`)."""
        return informative_groups(trajs, [self.trained_reward(t) for t in trajs])

    def trained_reward(self, traj: Trajectory) -> float:
        """The reward an episode trains with (`rewards.trained_reward` of the shaped reward)."""
        rl = self.config.rl
        cost = self.call_costs.get(traj.env_id, 0.0)
        return trained_reward(traj, self.shaped_reward(traj), rl.overlong, self.learner.generation_budget, rl.overlong_buffer, cost)

    def learn(self, batch: RolloutBatch) -> dict[str, Any]:
        """Price, filter and train on one step's rollouts (already graded), then publish the new weights."""
        c = self.config
        trajs, chosen, t_rollout = batch.trajectories, batch.chosen, batch.seconds
        if c.rollout.save:  # every trained episode, readable with `toolgym show`
            write_jsonl(trajs, self.run_dir / "rollouts" / f"step-{batch.step:04d}.jsonl")
        tasks = [t for _, t in chosen]
        suite_of = {t.id: s for s, t in chosen}
        rewards = [self.trained_reward(t) for t in trajs]
        groups = groups_of(trajs)
        broken = broken_groups(trajs, groups)
        with self._draw_lock:
            for g, idx in groups.items():  # infra/verifier errors say nothing about the task: not counted
                if g not in broken:
                    task_id = trajs[idx[0]].task_id
                    self.samplers[suite_of[task_id]].update(task_id, [self.sampler_score(trajs[i]) for i in idx], self.step)
        # the learner holds version step - 1; older rollouts than max_staleness allows are dropped
        stale = stale_groups(trajs, self.step - 1, c.rollout.max_staleness) - broken
        keep = [i for g, idx in groups.items() if g not in broken and g not in stale for i in idx]
        metrics: dict[str, Any] = rollout_metrics(trajs, rewards, t_rollout, broken)
        metrics["tasks"] = [t.id for t in tasks]
        metrics["by_suite"] = suite_metrics(trajs, rewards, suite_of)
        metrics.update(batch.extra)
        metrics.update(staleness_metrics(trajs, self.step - 1, sum(len(groups[g]) for g in stale)))
        train_metrics: dict[str, Any] = {}
        if keep:
            r = torch.tensor([rewards[i] for i in keep])
            gid = torch.tensor([list(groups).index(trajs[i].group_id) for i in keep])
            adv = ca.ADVANTAGES[c.rl.advantage](r, gid)
            signal = ca.group_signal(r, gid)
            metrics.update({f"groups_{k}": v for k, v in signal.items()})
            metrics["groups_zero_variance_frac"] = signal["zero_variance"] / max(1, signal["groups"])
            metrics["groups_all_pass_frac"] = signal["all_pass"] / max(1, signal["groups"])
            metrics["groups_all_fail_frac"] = signal["all_fail"] / max(1, signal["groups"])
            live = ~ca.zero_variance_mask(r, gid) if c.rl.drop_zero_variance else torch.ones(len(keep), dtype=torch.bool)
            # a stable batch: at most tasks_per_step groups train (dynamic sampling may have played more)
            trained_groups = list(dict.fromkeys(trajs[keep[j]].group_id for j in range(len(keep)) if live[j]))
            trained_groups = set(trained_groups[: c.rl.tasks_per_step])
            overlong = [j for j in range(len(keep)) if trajs[keep[j]].outcome == Outcome.TRUNCATED]
            dropped = set(overlong) if c.rl.overlong == "drop" else set()  # DAPO's overlong filtering
            metrics["overlong_episodes"], metrics["overlong_dropped"] = len(overlong), len(dropped)
            metrics["trained_groups"] = len(trained_groups)
            train = [
                (trajs[keep[j]], float(adv[j]))
                for j in range(len(keep))
                if live[j] and j not in dropped and trajs[keep[j]].group_id in trained_groups and trajs[keep[j]].has_tokens
            ]
            if len(train) < self.world:  # every training process needs a share of the batch
                metrics["skipped_update"] = f"{len(train)} trajectories for {self.world} training processes"
                train = []
            if train:
                packed = pack([t for t, _ in train], [a for _, a in train], self.policy.pad_id, c.rollout.max_total_tokens)
                anchor = self.anchor_batch(batch.step)
                train_metrics = self.trainer.run("rl", packed if anchor is None else (packed, anchor, c.rl.sft_anchor))
            metrics["trained_trajectories"] = len(train)
        metrics.update(train_metrics)
        self.publish(self.step)
        now = time.perf_counter()
        metrics["time_rollout_s"] = t_rollout
        metrics["time_train_s"] = train_metrics.get("train_seconds", 0.0)
        # wall time of the step: since the previous step ended (rollouts overlap it when async)
        metrics["time_step_s"] = now - (self._last_step_end if self._last_step_end is not None else batch.started)
        self._last_step_end = now
        for suite, sampler in self.samplers.items():
            metrics[f"sampler/{suite}"] = sampler.summary()
        return metrics

    def sampler_score(self, traj: Trajectory) -> float:
        """What one attempt adds to the sampler's running rate (`rewards.sampler_score`)."""
        return sampler_score(traj, self.shaped_reward(traj), self.config.rl.partial_credit)

    def shaped_reward(self, traj: Trajectory) -> float:
        """The verifier's reward less the env's safety prices (`rewards.shaped_reward`)."""
        return shaped_reward(traj, self.safety.get(traj.env_id, SafetyPolicy()), self.config.rl.partial_credit)


__all__ = ["Campaign", "RolloutBatch", "allocate", "build_policy", "episode_seed"]
