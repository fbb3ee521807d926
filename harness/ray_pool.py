"""Environment workers on Ray: episodes played on remote actors, failures turned into data.

`RayRolloutRunner` has the API of `RolloutRunner` (`arun(tasks, seeds=...)`, `run`, `close`)
and returns the same trajectories for the same seeds, but each episode is played by an
`EnvWorker` actor that hosts up to K environments (sandboxes on its own node):

- **Episode requests.** A request names the task, its env seed and sample index; the worker
  plays it with its agent (a `PolicyActor` handle for an in-process HF model served on Ray, an
  sglang URL list, or a text agent) and grades it where the sandbox lives.
- **Backpressure.** At most `envs_per_worker` episodes are in flight per worker.
- **A worker that dies** (its process killed, its node lost) is noticed at `ray.get`
  (`RayActorError`); Ray restarts it (`max_restarts=-1`, the constructor runs again) and the
  lost episodes are resubmitted with the same seed, which replays them exactly (deterministic
  reset and counter-based sampling). After `max_resubmits` losses an episode is returned as
  `infra_error` ("worker lost"), and a trainer drops its whole GRPO group: a group is never
  trained half-empty.
- **A hung environment** is cut off by the per-episode deadline: the worker is killed (and
  restarted by Ray) and the episode is `infra_error` ("deadline exceeded").

Ray is the control plane only (actor lifecycle, restarts, placement); `ray.init` is left to the
caller (`init_local_ray` starts a small local cluster with the dashboard off and a capped object
store).
"""

from __future__ import annotations

import asyncio
import os
from collections import Counter
from typing import Any

from toolgym.harness.rollout import RolloutLimits
from toolgym.harness.trajectory import Trajectory
from toolgym.inference.policy import Generation, SamplingParams
from toolgym.tasks import Task
from toolgym.verifiers import Outcome


def _ray():
    try:
        import ray
    except ImportError as err:
        raise ImportError("the Ray runner needs ray: pip install 'toolgym[ray]'") from err
    return ray


def init_local_ray(num_cpus: int | None = None, object_store_mb: int = 256) -> None:
    """Start (or join) a local Ray cluster for a single machine: no dashboard, a small object store."""
    ray = _ray()
    if not ray.is_initialized():
        ray.init(
            num_cpus=num_cpus or max(4, os.cpu_count() or 1),
            include_dashboard=False,
            object_store_memory=object_store_mb * 2**20,
            log_to_driver=False,
            configure_logging=False,
        )


class PolicyActor:
    """An `HFPolicy` served as a Ray actor: every worker's requests join its batches.

    Weights are pushed with `load_state_dict` (through the object store) under a version number;
    every `Generation` reports the version that sampled it."""

    def __init__(self, model_path: str, device: str | None = None, dtype: str | None = None) -> None:
        from toolgym.inference.hf_policy import HFPolicy

        self.policy = HFPolicy(model_path, device=device, dtype=dtype)

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Generation:
        """One completion (its `weight_version` says which weights sampled it)."""
        return await self.policy.generate(prompt_ids, sampling)

    def load_state_dict(self, state: dict[str, Any], version: int) -> int:
        """Replace the weights (the trainer's new ones) once the running batch is done; returns
        the new version."""
        self.policy.load_weights(state, version)
        return version


class RemotePolicy:
    """The `Policy` protocol over a `PolicyActor` handle (what a worker's `TokenAgent` uses)."""

    def __init__(self, handle: Any, name: str = "ray-policy") -> None:
        self.handle = handle
        self.name = name

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Generation:
        """Forward to the actor (awaiting its ObjectRef)."""
        return await self.handle.generate.remote(prompt_ids, sampling)


class EnvWorker:
    """Hosts environments and plays whole episodes (see the module docstring)."""

    def __init__(self, env_kwargs: dict[str, dict[str, Any]], agent_spec: dict[str, Any], limits: RolloutLimits) -> None:
        from toolgym.harness.rollout import RolloutRunner
        from toolgym.sandbox.reaper import reap_stale

        reap_stale()  # a restarted worker first removes what its killed predecessor left behind
        self.env_kwargs = env_kwargs
        self.limits = limits
        self.agent = self._agent(agent_spec)
        self.runner = RolloutRunner(self._make_env, self.agent, concurrency=1 << 30, limits=limits, progress=False)

    def _make_env(self, env_id: str):
        import toolgym

        return toolgym.make(env_id, **self.env_kwargs.get(env_id, {})).unwrapped

    @staticmethod
    def _agent(spec: dict[str, Any]):
        kind = spec["kind"]
        if kind == "text":
            return spec["agent"]
        from transformers import AutoTokenizer

        from toolgym.harness.agents import TokenAgent

        tokenizer = AutoTokenizer.from_pretrained(spec["tokenizer"])
        if kind == "actor":
            policy: Any = RemotePolicy(spec["handle"], spec.get("name", "ray-policy"))
        elif kind == "sglang":
            from toolgym.inference.sglang_client import SGLangPolicy

            policy = SGLangPolicy(spec["urls"])
        else:
            raise ValueError(f"unknown agent kind {kind!r}: text | actor | sglang")
        return TokenAgent(policy, tokenizer, spec["sampling"])

    async def play(self, task: Task, seed: int, sample_index: int) -> Trajectory:
        """One episode, graded here (where its sandbox is)."""
        from toolgym.harness.rollout import run_episode

        env = self.runner.acquire(task.env_id)
        try:
            return await run_episode(env, self.agent, task, seed, sample_index, self.limits)
        finally:
            self.runner.release(task.env_id, env)

    def pid(self) -> int:
        """The worker's process id (tests kill it)."""
        return os.getpid()

    def close(self) -> None:
        """Close the hosted environments (and their sandboxes)."""
        self.runner.close()


class RayRolloutRunner:
    """`RolloutRunner`'s API over a pool of `EnvWorker` actors (see the module docstring)."""

    def __init__(
        self,
        env_kwargs: dict[str, dict[str, Any]],
        agent_spec: dict[str, Any],
        workers: int = 2,
        envs_per_worker: int = 8,
        group_size: int = 1,
        limits: RolloutLimits | None = None,
        deadline_s: float = 600.0,
        max_resubmits: int = 2,
    ) -> None:
        ray = _ray()
        self.group_size = group_size
        self.limits = limits or RolloutLimits()
        self.envs_per_worker = envs_per_worker
        self.deadline_s = deadline_s
        self.max_resubmits = max_resubmits
        actor = ray.remote(max_restarts=-1, max_task_retries=0, num_cpus=0, max_concurrency=envs_per_worker + 2)(EnvWorker)
        self.workers = [actor.remote(env_kwargs, agent_spec, self.limits) for _ in range(workers)]
        self._slots = [asyncio.Semaphore(envs_per_worker) for _ in range(workers)]
        #: What went wrong in the last `arun`: workers lost, deadlines, resubmissions.
        self.stats: Counter[str] = Counter()

    async def _play_on(self, w: int, task: Task, seed: int, g: int) -> Trajectory | str:
        """The trajectory, or why the worker could not return one ("worker lost", "deadline")."""
        ray = _ray()
        from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError

        async with self._slots[w]:
            ref = self.workers[w].play.remote(task, seed, g)
            try:
                return await asyncio.wait_for(ref, self.deadline_s)
            except TimeoutError:
                ray.kill(self.workers[w], no_restart=False)  # the watchdog: Ray restarts the worker
                self.stats["deadline_exceeded"] += 1
                return "deadline exceeded"
            except (RayActorError, ActorDiedError, ActorUnavailableError):
                self.stats["worker_lost"] += 1
                return "worker lost"

    async def _episode(self, index: int, task: Task, seed: int, g: int) -> Trajectory:
        reason = ""
        for attempt in range(self.max_resubmits + 1):
            w = (index + attempt) % len(self.workers)  # a resubmission goes to the next worker
            result = await self._play_on(w, task, seed, g)
            if isinstance(result, Trajectory):
                return result
            reason = result
            if reason == "deadline exceeded":
                break  # the same seed would hang again
            self.stats["resubmitted"] += 1
            await asyncio.sleep(0.5 * (attempt + 1))  # give Ray time to restart the actor
        return Trajectory(
            task_id=task.id,
            group_id=f"{task.id}:{seed}",
            sample_index=g,
            seed=seed,
            policy="ray",
            env_id=task.env_id,
            family=task.family,
            difficulty=task.difficulty,
            split=task.split,
            outcome=Outcome.INFRA_ERROR,
            error=reason,
        )

    async def arun(self, tasks: list[Task], seed: int = 0, seeds: list[int] | None = None) -> list[Trajectory]:
        """All episodes of `tasks`, ordered by task then sample (as `RolloutRunner.arun`)."""
        self.stats.clear()
        seeds = seeds if seeds is not None else [seed + i for i in range(len(tasks))]
        jobs = [(task, seeds[i], g) for i, task in enumerate(tasks) for g in range(self.group_size)]
        return list(await asyncio.gather(*(self._episode(i, *job) for i, job in enumerate(jobs))))

    def run(self, tasks: list[Task], seed: int = 0) -> list[Trajectory]:
        """Synchronous wrapper around `arun`."""
        return asyncio.run(self.arun(tasks, seed))

    def pids(self, timeout_s: float = 60.0) -> list[int]:
        """Worker process ids (waiting for a worker that Ray is restarting)."""
        import time

        ray = _ray()
        from ray.exceptions import ActorUnavailableError, RayActorError

        deadline = time.monotonic() + timeout_s
        while True:
            try:
                return ray.get([w.pid.remote() for w in self.workers])
            except (ActorUnavailableError, RayActorError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def close(self) -> None:
        """Close the workers' environments, stop the workers, and reap anything a killed one left."""
        ray = _ray()
        from toolgym.sandbox.reaper import reap_stale

        try:
            ray.get([w.close.remote() for w in self.workers], timeout=60)
        except Exception:  # a worker that cannot close cleanly is killed; the reaper cleans up after it
            pass
        for w in self.workers:
            ray.kill(w, no_restart=True)
        self.workers = []
        reap_stale()


def serve_policy(model_path: str, device: str | None = None, dtype: str | None = None) -> Any:
    """Start a `PolicyActor` for `model_path`; returns its handle (for `agent_spec`)."""
    ray = _ray()
    return ray.remote(num_cpus=0, max_concurrency=1024)(PolicyActor).remote(model_path, device, dtype)


def actor_agent_spec(handle: Any, tokenizer_path: str, sampling: SamplingParams) -> dict[str, Any]:
    """The agent spec for workers that sample from a `PolicyActor`."""
    return {"kind": "actor", "handle": handle, "tokenizer": tokenizer_path, "sampling": sampling}


__all__ = ["EnvWorker", "PolicyActor", "RayRolloutRunner", "RemotePolicy", "actor_agent_spec", "init_local_ray", "serve_policy"]
