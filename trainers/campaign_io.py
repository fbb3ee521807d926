"""A campaign's held-out evaluations, checkpoints (save and restore) and model export.

`EvalAndCheckpoints` is a part of `Campaign` (trainers/campaign.py), kept here so each file has one job.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from toolgym.harness.eval_run import run_eval
from toolgym.inference.host_memory import memory_fields
from toolgym.trainers.checkpoint import read_run_state, save_checkpoint
from toolgym.trainers.inference import merged_model
from toolgym.trainers.memory import release_memory
from toolgym.trainers.sampler import LearnabilitySampler


class EvalAndCheckpoints:
    """Evaluation, checkpoints and export (a part of `Campaign`: it reads the campaign's attributes)."""

    def evaluate(self, label: str, max_tasks: int = 0) -> dict[str, Any]:
        """Held-out pass@k per environment (harness `evaluate`), written under eval/<label>/; on
        each environment's first `eval_tasks` held-out tasks (and at most `max_tasks` if set), then
        on the evaluation-only suites (`eval.suites`) that join this stage."""
        c = self.config
        results = {}
        release_memory()  # training's peak goes back to the OS before evaluation batches need memory
        stage = "steps" if label.startswith("step-") else label
        # the trained suites, then the evaluation-only ones that join this stage, each with its budget
        plan = [(mix.suite, mix.eval_tasks, self.limits(evaluation=True)) for mix in c.envs]
        plan += [(extra.suite, extra.tasks, self.limits(evaluation=True, suite=extra)) for extra in c.eval.suites if stage in extra.stages]
        for name, eval_tasks, limits in plan:
            out = self.run_dir / "eval" / label / name
            tasks = min(t for t in (eval_tasks, max_tasks) if t) if (eval_tasks or max_tasks) else 0
            agent = self.agent(c.eval.temperature)
            # the weights change between stages under one model path: the report and every
            # trajectory name the stage (`toolgym compare` of two stages then tells them apart)
            agent.name = f"{self.policy.name}@{label}"
            report, _ = run_eval(
                agent.name,
                self.suites[name],
                "held-out",
                c.eval.samples,
                c.eval.ks,
                tasks,
                c.rollout.concurrency,
                c.seed,
                out,
                limits,
                progress=self.progress,
                agent=agent,
                env_factory=self.make_env,
            )
            results[name] = {f"pass@{k}": report.overall.pass_at[str(k)].value for k in c.eval.ks}
            results[name]["infra_error_rate"] = report.overall.outcome_rates.get("infra_error", 0.0)
            self.console.print(
                f"eval {label} {name}: "
                + ", ".join(
                    f"pass@{k} {report.overall.pass_at[str(k)].value:.3f} [{report.overall.pass_at[str(k)].low:.3f}, "
                    f"{report.overall.pass_at[str(k)].high:.3f}]"
                    for k in c.eval.ks
                )
            )
        assert self.metrics is not None
        self.metrics.log(self.step, {"label": label, **results, **memory_fields()}, kind="eval")
        return results

    def checkpoint(self) -> Path:
        """Save everything `--resume` needs (atomically)."""
        assert self.metrics is not None
        with self._draw_lock:
            state = {
                "rng": self.rng.bit_generator.state,
                "torch_rng": torch.get_rng_state().tolist(),
                "samplers": {s: sampler.state_dict() for s, sampler in self.samplers.items()},
                "metrics_lines": self.metrics.lines(),
            }
        model_state, optimizer_state = self.trainer.run("checkpoint")
        return save_checkpoint(self.run_dir, self.step, model_state, optimizer_state, state, self.config.checkpoint.keep)

    def _restore(self, path: Path) -> None:
        self.trainer.run("restore", str(path))  # every training process loads weights and optimizer
        state = read_run_state(path)
        self.step = int(state["step"])
        self.rng.bit_generator.state = state["rng"]
        torch.set_rng_state(torch.tensor(state["torch_rng"], dtype=torch.uint8))
        self.samplers = {s: LearnabilitySampler.from_state(st) for s, st in state["samplers"].items()}
        assert self.metrics is not None
        self.metrics.truncate(int(state["metrics_lines"]))

    def _export(self, name: str) -> Path:
        """The trained model as a `from_pretrained` directory (with the tokenizer)."""
        out = self.run_dir / name
        model = self._copy.policy.model if self._copy is not None else self.policy.model  # never the shards
        merged_model(model).save_pretrained(out)  # LoRA: merged weights; training keeps its adapters
        self.tokenizer.save_pretrained(out)
        return out


__all__ = ["EvalAndCheckpoints"]
