"""Asynchronous rollouts with bounded staleness.

With `rollout.max_staleness: k` (k >= 1) a background thread plays the rollouts of the next
steps while the learner updates: the batch of step s may start once the learner has applied
s - 1 - k updates, so at most k updates happen between a batch's start and its training (k = 0
would be the synchronous loop, which the campaign runs without this thread). The rollout
policy samples from its own copy of the weights (or from servers), refreshed after every update;
each turn records the version that sampled it.

At training time `stale_groups` drops every GRPO group with a trajectory whose oldest turn is
more than k versions behind the learner (a server that missed an update, a very long episode),
and counts them. The truncated importance-sampling weights on the rollout logprobs
(`rl.learner.tis_cap`) correct what staleness is left, and the learner logs the
train/inference logprob gap every step.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from toolgym.harness.trajectory import Trajectory


def stale_groups(trajs: list[Trajectory], current_version: int, max_staleness: int) -> set[str]:
    """Group ids with a trajectory more than `max_staleness` versions behind `current_version`
    (the learner's weights before this update)."""
    return {t.group_id for t in trajs if t.staleness(current_version) > max_staleness}


class RolloutPipeline:
    """Produces `collect(step)` for steps `first..last` in a background thread, at most
    `max_staleness` updates ahead of the learner (see the module docstring)."""

    def __init__(self, collect: Callable[[int], Any], first: int, last: int, max_staleness: int) -> None:
        self.collect = collect
        self.first, self.last = first, last
        self.max_staleness = max_staleness
        self._trained = first - 1  # updates the learner has applied
        self._ready: dict[int, Any] = {}
        self._error: BaseException | None = None
        self._stopping = False
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._produce, name="rollouts", daemon=True)

    def start(self) -> RolloutPipeline:
        """Start producing."""
        self._thread.start()
        return self

    def _produce(self) -> None:
        for step in range(self.first, self.last + 1):
            with self._cond:
                self._cond.wait_for(lambda: self._stopping or self._trained >= step - 1 - self.max_staleness)
                if self._stopping:
                    return
            try:
                batch = self.collect(step)
            except BaseException as err:  # handed to the learner's thread, which raises it
                with self._cond:
                    self._error = err
                    self._cond.notify_all()
                return
            with self._cond:
                self._ready[step] = batch
                self._cond.notify_all()

    def get(self, step: int) -> Any:
        """Step `step`'s rollouts (waits for them; re-raises the producer's error)."""
        with self._cond:
            self._cond.wait_for(lambda: step in self._ready or self._error is not None)
            if step in self._ready:
                return self._ready.pop(step)
            raise RuntimeError(f"rollouts for step {step} failed: {self._error}") from self._error

    def trained(self, step: int) -> None:
        """The learner has applied update `step` (and pushed its weights)."""
        with self._cond:
            self._trained = step
            self._cond.notify_all()

    def close(self, timeout_s: float = 30.0) -> None:
        """Stop after the batch in progress (if any); the thread is a daemon, so an interrupted
        run does not wait for a long batch beyond `timeout_s`."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout_s)


__all__ = ["RolloutPipeline", "stale_groups"]
