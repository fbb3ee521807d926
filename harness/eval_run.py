"""`run_eval`: roll out a policy on a suite split and write trajectories plus the report."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from toolgym.harness.evaluate import EvalBudget, EvalReport, evaluate, write_report
from toolgym.harness.rollout import RolloutLimits, RolloutRunner
from toolgym.harness.specs import make_agent
from toolgym.harness.trajectory import write_parquet
from toolgym.inference.host_memory import release_memory
from toolgym.inference.policy import SamplingParams
from toolgym.tasks import TaskSuite

#: Task metadata keys that become report slices when tasks carry them.
GROUP_KEYS = ("package",)


def run_eval(
    policy: str,
    suite: TaskSuite,
    split: str = "held-out",
    samples: int = 1,
    ks: list[int] | None = None,
    max_tasks: int = 0,
    concurrency: int = 16,
    seed: int = 0,
    out_dir: str | Path = "runs/eval",
    limits: RolloutLimits | None = None,
    sampling: SamplingParams | None = None,
    tokenizer: str | None = None,
    progress: bool = True,
    agent: Any = None,
    device: str | None = None,
    dtype: str | None = None,
    env_factory: Any = None,
    shuffle_tools: bool = False,
) -> tuple[EvalReport, dict[str, Path]]:
    """Evaluate `policy` on `suite`'s `split`; writes trajectories (JSONL, parquet) and the report.
    `shuffle_tools` lists each episode's tools in an order drawn per episode (`ToolEnv.shuffle_tools`)."""
    import toolgym

    ks = ks or [1]
    if max(ks) > samples:
        raise ValueError(f"pass@{max(ks)} needs at least {max(ks)} samples per task; pass -n {max(ks)} or more")
    part = suite.split(split)
    if len(part) == 0:
        raise ValueError(f"suite {suite.name!r} has no tasks in split {split!r} (splits: {suite.splits})")
    tasks = part.tasks[:max_tasks] if max_tasks > 0 else part.tasks
    agent = agent or make_agent(policy, sampling, tokenizer, device=device, dtype=dtype)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    def default_env(env_id: str):
        # Each task is played on its own env id (a suite may mix environments).
        options = {"shuffle_tools": True} if shuffle_tools else {}
        return toolgym.make(env_id, tasks=[t for t in tasks if t.env_id == env_id], **options).unwrapped

    runner = RolloutRunner(
        env_factory or default_env,
        agent,
        group_size=samples,
        concurrency=concurrency,
        limits=limits,
        out_path=out / "trajectories.jsonl",
        progress=progress,
    )
    try:
        trajs = runner.run(tasks, seed=seed)
    finally:
        runner.close()
        release_memory()  # the batches' memory back to the OS before the next stage needs it
    write_parquet(trajs, out / "trajectories.parquet")
    # Mined tasks carry their package: pass@k per package beside per family (= mutation operator).
    groups = {key: {t.id: str(t.metadata[key]) for t in tasks if key in t.metadata} for key in GROUP_KEYS}
    limits = runner.limits
    sampling_used = getattr(agent, "sampling", None)
    budget = EvalBudget(
        temperature=getattr(sampling_used, "temperature", None),
        top_p=getattr(sampling_used, "top_p", None),
        samples=samples,
        max_turns=limits.max_turns,
        max_new_tokens_per_turn=min(limits.max_new_tokens_per_turn, getattr(sampling_used, "max_new_tokens", 10**9)),
        max_total_tokens=limits.max_total_tokens,
        watchdog_s=limits.watchdog_s,
    )
    report = evaluate(
        trajs,
        ks,
        policy=agent.name,
        suite=suite.name,
        suite_version=suite.version,
        split=split,
        seed=seed,
        samples_per_task=samples,
        task_groups={k: v for k, v in groups.items() if v},
        budget=budget,
    )
    paths = write_report(report, out)
    paths["trajectories"] = out / "trajectories.jsonl"
    return report, paths
