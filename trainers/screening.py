"""Predicting a task's pass rate before rolling it out, from the policy's probability of the
task's reference solution (`sampler.screen`).

In a short campaign the learnability sampler rarely sees a task twice, so its per-task posterior
stays at the prior and only a family's pooled pass rate steers the draw: at low entropy most
groups still come back all-pass or all-fail. One forward pass costs far less than G rollouts and
says much more about one task: the probability the policy assigns to the task's oracle
demonstration (its calls, rendered as the policy's own tokens; at the rollouts' temperature) is the
chance that sampling reproduces it exactly, a lower bound on the pass rate (other answers may pass too).
Measured on BFCL from one SFT checkpoint (33 train entries, 6 rollouts each): the correlation of
that probability with the group's pass rate was 0.86, and of the candidates ranked in the top half
by predicted p(1-p), 6% came back with zero reward variance against 76% of the bottom half.

`ReferenceScreen` keeps each task's reference (the oracle played once through its environment and
verifier; a task whose oracle fails or is missing has none and is never screened) and scores a
list of tasks with a model in one batched, gradient-free pass.

A task that any answer without a call passes (`env.nothing_solves`: BFCL's irrelevance) has no one
reference: every way of declining passes, and the oracle's fixed sentence is only one of them
(a policy never shown it declines in its own words, and that sentence's probability says nothing
about how often). Its pass rate is read from the probability that the answer opens a tool call
(`envs.parsing.OPEN`, scored in the same pass): predicted pass = 1 - p(opener). Opt-in
(`sampler.screen_declines`): the main job's SFT demonstrates that sentence, and its figures were
measured with it scored like any reference.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from toolgym.envs.parsing import OPEN
from toolgym.harness.demonstrations import collect_demonstrations
from toolgym.harness.trajectory import Segment, Trajectory
from toolgym.tasks import Task
from toolgym.trainers.batching import micro_batches, pack, select, sequence_logprobs
from toolgym.verifiers import Outcome

#: tokens per forward micro-batch of the screen (rows x longest row)
SCREEN_TOKEN_BUDGET = 16384


class ReferenceScreen:
    """Reference demonstrations per task and their log-probability under a model."""

    def __init__(self, tokenizer: Any, make_env: Callable[[str], Any], concurrency: int = 16, declines: bool = False) -> None:
        self.tokenizer = tokenizer
        self.make_env = make_env
        self.concurrency = concurrency
        #: score tasks that declining passes by the call opener (`sampler.screen_declines`; False:
        #: by their oracle's sentence, like any reference)
        self.score_declines = declines
        #: task id -> its passing oracle demonstration, or None (no oracle, or it failed)
        self.references: dict[str, Trajectory | None] = {}
        #: task ids that any answer without a call passes: scored by the call opener's probability
        self.declines: set[str] = set()
        self._judged: set[str] = set()

    def ensure(self, tasks: list[Task]) -> None:
        """Play the oracle once on every task that has no reference yet; with `score_declines`,
        note the tasks that declining passes (asked of one environment per env id, then closed)."""
        fresh = [t for t in tasks if self.score_declines and t.id not in self._judged]
        for env_id in sorted({t.env_id for t in fresh}):  # one environment per env id answers for its tasks
            env = self.make_env(env_id)
            try:
                self.declines.update(t.id for t in fresh if t.env_id == env_id and env.nothing_solves(t))
            finally:
                env.close()
        self._judged.update(t.id for t in fresh)
        missing = [t for t in tasks if t.id not in self.references]
        if not missing:
            return
        played = collect_demonstrations(missing, self.tokenizer, self.make_env, concurrency=self.concurrency, progress=False)
        by_id = {t.task_id: t for t in played}
        for task in missing:
            demo = by_id.get(task.id)
            self.references[task.id] = demo if demo is not None and demo.outcome == Outcome.PASSED else None

    def log_probabilities(
        self, model: torch.nn.Module, tasks: list[Task], pad_id: int, max_len: int | None = None, temperature: float = 1.0
    ) -> dict[str, float]:
        """log p(reference | task) under `model` sampled at `temperature`, summed over the
        reference's policy tokens, for every task that has a reference (the others are left out);
        for a task that declining passes (`declines`), log p(the answer opens a call) instead."""
        self.ensure(tasks)
        known = [t.id for t in tasks if self.references.get(t.id) is not None]
        if not known:
            return {}
        rows = [
            self.opener(self.references[i]) if i in self.declines else self.references[i]  # type: ignore[arg-type]
            for i in known
        ]
        batch = pack(rows, [0.0] * len(known), pad_id, max_len)
        device = next(model.parameters()).device
        lengths = batch.attention.sum(1).tolist()
        out: dict[str, float] = {}
        with torch.no_grad():
            for group in micro_batches(lengths, SCREEN_TOKEN_BUDGET):
                mb = select(batch, group).to(device)
                logp, _ = sequence_logprobs(model, mb.input_ids, mb.attention, share_prefix=False, mask=mb.mask, temperature=temperature)
                sums = (logp.float() * mb.mask).sum(1).tolist()
                out.update({known[i]: s for i, s in zip(group, sums)})
        return out

    def predicted_pass_rates(
        self, model: torch.nn.Module, tasks: list[Task], pad_id: int, max_len: int | None = None, temperature: float = 1.0
    ) -> dict[str, float]:
        """Each screened task's predicted pass rate: p(reference), or 1 - p(a call opens) for a
        task that declining passes (see the module docstring)."""
        logps = self.log_probabilities(model, tasks, pad_id, max_len, temperature)
        return {i: 1.0 - predicted_pass_rate(lp) if i in self.declines else predicted_pass_rate(lp) for i, lp in logps.items()}

    def opener(self, reference: Trajectory) -> Trajectory:
        """`reference`'s prompt followed by the tokens that open a tool call, as the policy's:
        their log-probability is that of the answer starting with a call."""
        head: list[Segment] = []
        for segment in reference.segments:
            if segment.kind == "policy":
                break
            head.append(segment)
        ids = self.tokenizer.encode(OPEN, add_special_tokens=False)
        return reference.model_copy(update={"segments": [*head, Segment(kind="policy", token_ids=ids, logprobs=[0.0] * len(ids))]})


def predicted_pass_rate(log_probability: float) -> float:
    """The chance that sampling (at the temperature `log_probability` was taken at) reproduces the
    reference exactly: a lower bound of the task's pass rate."""
    return math.exp(min(0.0, log_probability))


__all__ = ["ReferenceScreen", "SCREEN_TOKEN_BUDGET", "predicted_pass_rate"]
