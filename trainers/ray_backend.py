"""A campaign's rollouts on Ray environment workers (`rollout.backend: ray`)."""

from __future__ import annotations

from typing import Any

from toolgym.harness import RolloutLimits, TokenAgent


def start_ray(settings: Any) -> None:
    """Join the configured cluster (`rollout.ray.address`), or start a local one."""
    import ray

    from toolgym.harness.ray_pool import init_local_ray

    if settings.address:
        ray.init(address=settings.address, ignore_reinit_error=True, log_to_driver=False)
    else:
        init_local_ray()


def ray_runner(
    config: Any,
    agent: TokenAgent,
    tokenizer_path: str | None,
    limits: RolloutLimits,
    env_kwargs: dict[str, dict[str, Any]],
    actor: Any = None,
) -> Any:
    """`EnvWorker`s for the campaign's environments (each made with its `env_kwargs` entry),
    sampling from the configured servers, or else from the `PolicyActor` handle `actor`."""
    from toolgym.harness.ray_pool import RayRolloutRunner, actor_agent_spec

    r = config.rollout
    start_ray(r.ray)
    if r.servers:  # every worker samples from the servers directly
        spec = {"kind": "sglang", "urls": list(r.servers), "tokenizer": tokenizer_path, "sampling": agent.sampling}
    else:
        spec = actor_agent_spec(actor, tokenizer_path, agent.sampling)
    return RayRolloutRunner(
        env_kwargs,
        spec,
        workers=r.ray.workers,
        envs_per_worker=r.ray.envs_per_worker,
        group_size=config.rl.group_size,
        limits=limits,
        deadline_s=r.ray.deadline_s,
        max_resubmits=r.ray.max_resubmits,
    )


__all__ = ["ray_runner", "start_ray"]
