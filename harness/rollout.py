"""The rollout runner: many episodes at once (asyncio), G per task sharing a seed (a GRPO group).

Every failure is attributed to an outcome on its own trajectory (policy error -> infra_error,
verifier crash -> verifier_error, turn or token limit -> truncated, no parsable tool call ->
format_error); one bad episode never crashes the batch. The agent's limits are counted in its own
work (turns, tokens); the wall-clock watchdog only catches a hung policy or environment, and an
episode it stops is infra_error (with `limit_hit="watchdog"`), never the agent's failure: with
batched generation an episode's wall time is mostly other episodes' work and the machine's load. Blocking environment and verifier work runs in threads, off
the event loop. Trajectories stream to a JSONL file as they finish.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from toolgym.envs import ToolEnv
from toolgym.harness.agents import TextAgent, TokenAgent
from toolgym.harness.trajectory import Segment, Trajectory, TurnRecord
from toolgym.inference.chat import ChatRenderer, observation_messages
from toolgym.inference.policy import current_episode
from toolgym.tasks import Task, ToolCall
from toolgym.verifiers import FinalState, Outcome, Verdict

#: Off a terminal, the longest stretch without a progress line (seconds).
PLAIN_PROGRESS_S = 30.0


class RolloutLimits(BaseModel):
    """Per-episode limits."""

    max_turns: int | None = Field(default=None, description="None = the environment's own max_turns")
    max_new_tokens_per_turn: int = 96
    max_total_tokens: int = 4096
    watchdog_s: float = Field(
        default=3600.0,
        gt=0,
        description="wall-clock seconds after which an episode is stopped as hung: infra_error, never scored against the agent",
    )


def sampling_seed(seed: int, sample_index: int, turn: int) -> int:
    """A per-(episode, sample, turn) sampling seed: the G samples of a group differ, reruns agree."""
    digest = hashlib.sha256(f"{seed}:{sample_index}:{turn}".encode()).digest()
    return int.from_bytes(digest[:4], "little")


def explored_call_prefix(explore: float, tools: list[dict[str, Any]], seed: int, sample_index: int, turn: int) -> str:
    """Tool exploration for one turn (`TokenAgent.explore_tools`): with probability `explore`,
    drawn from the episode's seed, sample and turn (reruns agree), the opening of a call to a tool
    drawn uniformly from `tools`, up to its arguments (`<tool_call>\n{"name": "X", "arguments":`,
    cut before the space, which a tokenizer joins to the brace that follows: a forced lone space
    is a token the policy never writes there), which the policy then continues; otherwise "".
    Uniform: the draw knows nothing of the task."""
    if explore <= 0 or not tools:
        return ""
    rng = random.Random(sampling_seed(seed, sample_index, turn) ^ 0x5EED)
    if rng.random() >= explore:
        return ""
    names = [str(t.get("function", t)["name"]) for t in tools]
    text = ToolCall(name=rng.choice(names)).to_text()
    return text[: text.index('"arguments":') + len('"arguments":')]


async def run_episode(
    env: ToolEnv,
    agent: TokenAgent | TextAgent,
    task: Task,
    seed: int,
    sample_index: int = 0,
    limits: RolloutLimits | None = None,
    verifier: Any = None,
) -> Trajectory:
    """Play one episode and grade it; never raises (failures become outcomes)."""
    limits = limits or RolloutLimits()
    traj = Trajectory(
        task_id=task.id,
        group_id=f"{task.id}:{seed}",
        sample_index=sample_index,
        seed=seed,
        policy=agent.name,
        env_id=task.env_id,
        family=task.family,
        difficulty=task.difficulty,
        split=task.split,
    )
    start = time.perf_counter()
    episode = f"{traj.group_id}:{sample_index}"
    routing = current_episode.set(episode)  # the policy's routing key
    try:
        terminated, valid_calls = await asyncio.wait_for(_play(env, agent, task, seed, sample_index, limits, traj), limits.watchdog_s)
    except TimeoutError:  # a hung policy, server or environment: ours, not the agent's
        traj.outcome, traj.limit_hit = Outcome.INFRA_ERROR, "watchdog"
        traj.error = f"episode still running after the {limits.watchdog_s:.0f} s watchdog (policy or environment hung)"
        traj.duration_s = time.perf_counter() - start
        return traj
    except Exception as err:  # policy/server/env failures: ours, not the agent's
        traj.outcome, traj.error = Outcome.INFRA_ERROR, f"{type(err).__name__}: {err}"
        traj.duration_s = time.perf_counter() - start
        return traj
    finally:
        current_episode.reset(routing)
        end_episode = getattr(getattr(agent, "policy", None), "end_episode", None)
        if end_episode is not None:  # optional in the Policy protocol: frees what the policy kept for it
            end_episode(episode)
    await _grade(env, task, traj, verifier, terminated, valid_calls)
    traj.duration_s = time.perf_counter() - start
    return traj


async def _play(
    env: ToolEnv, agent: Any, task: Task, seed: int, sample_index: int, limits: RolloutLimits, traj: Trajectory
) -> tuple[bool, int]:
    """Run the turns; returns (terminated by the agent, number of well-formed tool calls)."""
    if limits.max_turns is not None:
        env.max_turns = limits.max_turns
    env.grade_on_submit = False  # the runner grades the finished episode (`env.verdict`): grade once
    obs, info = await asyncio.to_thread(env.reset, seed=seed, options={"task": task})
    token_level = isinstance(agent, TokenAgent)
    tools = info["tools"]
    renderer = None
    if token_level:
        renderer = ChatRenderer(agent.tokenizer, tools, agent.system, agent.chat_template)
        messages = renderer.initial_messages(info["instruction"])
        prompt = renderer.prompt_ids(messages)
        traj.segments.append(Segment(kind="template", token_ids=prompt, text=agent.tokenizer.decode(prompt, skip_special_tokens=False)))
        context = list(prompt)
    else:
        messages = [{"role": "user", "content": info["instruction"]}]
    traj.messages = messages
    valid_calls, turn, terminated = 0, 0, False
    while True:
        record = TurnRecord()
        t0 = time.perf_counter()
        if token_level:
            assert renderer is not None
            remaining = limits.max_total_tokens - len(context)
            if remaining <= 0:  # token budget spent: the episode is truncated
                traj.limit_hit = "tokens"
                break
            budget = min(agent.sampling.max_new_tokens, limits.max_new_tokens_per_turn, remaining)
            prefix = explored_call_prefix(agent.explore_tools, tools, seed, sample_index, turn)
            forced = agent.tokenizer.encode(prefix, add_special_tokens=False) if prefix else []
            if len(forced) >= budget:  # no room left for the policy to write the arguments
                forced = []
            sampling = agent.sampling.model_copy(
                update={"max_new_tokens": budget - len(forced), "seed": sampling_seed(seed, sample_index, turn)}
            )
            gen = await agent.policy.generate(context + forced, sampling)
            ids = forced + list(gen.token_ids)
            text_ids = ids[:-1] if ids and ids[-1] == renderer.eot_id else ids
            action = agent.tokenizer.decode(text_ids, skip_special_tokens=False)
            traj.segments.append(
                Segment(
                    kind="policy",
                    token_ids=ids,
                    logprobs=[0.0] * len(forced) + list(gen.logprobs),
                    text=agent.tokenizer.decode(ids, skip_special_tokens=False),
                    weight_version=gen.weight_version,
                    forced=len(forced),
                )
            )
            context += ids
            if not ids or ids[-1] != renderer.eot_id:  # cut off: close the turn so the chat stays well-formed
                traj.segments.append(Segment(kind="template", token_ids=[renderer.eot_id], text=renderer.eot))
                context.append(renderer.eot_id)
                # The turn ran into its token cap (the agent's own limit): reported, so a budget
                # that cuts answers short shows in the evaluation instead of passing as failures.
                # A limit that ends the episode (turns, total tokens) overrides it.
                traj.limit_hit = traj.limit_hit or "turn_tokens"
            record.new_tokens = len(ids)
        else:
            action = await agent.respond(messages, tools, task)
        record.generate_s = time.perf_counter() - t0
        messages.append({"role": "assistant", "content": action})
        t1 = time.perf_counter()
        obs, reward, terminated, truncated, info = await asyncio.to_thread(env.step, action)
        record.env_s = time.perf_counter() - t1
        record.tool_calls = sum(1 for r in info["tool_results"] if not r["error"])
        record.errors = [e["kind"] for e in info["turn_errors"]]
        valid_calls += record.tool_calls + record.errors.count("invalid_arguments") + record.errors.count("tool_error")
        traj.turns.append(record)
        traj.tool_calls = info["tool_calls"]
        traj.tool_errors = {k: v for k, v in info["errors"].items() if v}
        traj.side_effects += info.get("side_effects", [])  # each step reports its new events only
        turn += 1
        if truncated and not terminated:
            traj.limit_hit = "turns"
        if terminated or truncated:
            break
        # an environment may answer with messages of its own (e.g. the user's next request)
        obs_msgs = info.get("observation_messages") or observation_messages(info["tool_results"])
        messages.extend(obs_msgs)
        if token_level:
            assert renderer is not None
            delta = renderer.delta_ids(obs_msgs)
            traj.segments.append(
                Segment(kind="observation", token_ids=delta, text=agent.tokenizer.decode(delta, skip_special_tokens=False))
            )
            context += delta
    return terminated, valid_calls


async def _grade(env: ToolEnv, task: Task, traj: Trajectory, verifier: Any, terminated: bool, valid_calls: int) -> None:
    try:
        state = FinalState(**await asyncio.to_thread(env.final_state))
        traj.answer = state.answer
    except Exception as err:  # the environment could not hand over its state: ours, not the agent's
        traj.outcome, traj.error = Outcome.INFRA_ERROR, f"{type(err).__name__}: {err}"
        traj.reward = 0.0
        return
    try:
        # the environment's own grading path (its grade() or its verifier), unless the caller
        # handed the runner a verifier of its own
        if verifier is not None:
            verdict: Verdict = await asyncio.to_thread(verifier.verify, task, state)
        else:
            verdict = await asyncio.to_thread(env.verdict, state)
    except Exception as err:  # the verifier's failure, never the agent's
        traj.outcome, traj.error = Outcome.VERIFIER_ERROR, f"{type(err).__name__}: {err}"
        traj.reward = 0.0
        return
    traj.verdict = verdict
    traj.reward = verdict.reward
    # Tampering the verifier found (dropped protected edits, forged reports) joins the ledger.
    traj.side_effects = traj.side_effects + [dict(e, step=len(traj.turns)) for e in verdict.details.get("side_effects", [])]
    if verdict.outcome in (Outcome.INFRA_ERROR, Outcome.VERIFIER_ERROR):
        traj.outcome = verdict.outcome
    elif verdict.passed:
        traj.outcome = Outcome.PASSED
    elif terminated:
        traj.outcome = Outcome.FAILED
    elif valid_calls == 0:
        traj.outcome = Outcome.FORMAT_ERROR
    else:  # cut by its turn or token limit before it finished
        traj.outcome = Outcome.TRUNCATED
        traj.limit_hit = traj.limit_hit or "turns"


class RolloutRunner:
    """Runs G episodes per task concurrently and streams trajectories to `out_path`.

    `env_factory` builds an environment: called with the task's env id when it takes an
    argument (so a batch may mix environments, each task played on its own env id), else with
    none. Environments are pooled per env id and reused across episodes.
    """

    def __init__(
        self,
        env_factory: Callable[..., ToolEnv],
        agent: TokenAgent | TextAgent | None,
        group_size: int = 1,
        concurrency: int = 16,
        limits: RolloutLimits | None = None,
        out_path: str | Path | None = None,
        progress: bool = True,
        verifier: Any = None,
    ) -> None:
        self.env_factory = env_factory
        self.agent = agent
        self.group_size = group_size
        self.concurrency = concurrency
        self.limits = limits or RolloutLimits()
        self.out_path = Path(out_path) if out_path else None
        self.progress = progress
        self.verifier = verifier
        self._pools: dict[str, list[ToolEnv]] = {}
        self._by_env_id = _takes_an_argument(env_factory)

    def acquire(self, env_id: str) -> ToolEnv:
        """A pooled environment for `env_id` (a new one when the pool is empty)."""
        pool = self._pools.setdefault(env_id if self._by_env_id else "", [])
        if pool:
            return pool.pop()
        return self.env_factory(env_id) if self._by_env_id else self.env_factory()

    def release(self, env_id: str, env: ToolEnv) -> None:
        """Return an environment to its pool."""
        self._pools.setdefault(env_id if self._by_env_id else "", []).append(env)

    def _generating(self) -> str:
        """What the agent's policy is generating now, for a progress line: a local policy's batch,
        or a remote one's requests awaiting an answer ("" when it says nothing: a scripted agent,
        or nothing in flight)."""
        source = getattr(self.agent, "policy", None) or self.agent
        in_flight = getattr(source, "in_flight", 0)
        if in_flight:
            return f" ({in_flight} request{'s' if in_flight != 1 else ''} awaiting the server)"
        activity = getattr(source, "activity", None)
        if not activity:
            return ""
        rows, tokens, most = activity
        if tokens == 0:
            return f" (prefilling a batch of {rows})"
        return f" (a batch of {rows} at token {tokens} of at most {most})"

    async def amap(self, jobs: list[tuple], play: Callable[..., Any], label: str = "episodes") -> list[Any]:
        """`await play(env, *job)` for every job (a tuple whose first item is the Task),
        `concurrency` at a time, each on a pooled env of the task's env id; results in job
        order, with a progress bar."""
        sem = asyncio.Semaphore(self.concurrency)
        results: list[Any] = [None] * len(jobs)
        columns = [TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), TextColumn("{task.fields[passed]} passed")]
        with Progress(*columns, disable=not self.progress, transient=False) as bar:
            bar_id = bar.add_task(label, total=len(jobs), passed=0)
            passed = [0]
            # not a terminal (a log file, CI): a plain line every tenth of the work or PLAIN_PROGRESS_S instead
            plain = self.progress and not bar.console.is_terminal
            started, last = time.perf_counter(), [time.perf_counter()]
            done = [0]

            def say() -> None:
                last[0] = now = time.perf_counter()
                print(f"{label}: {done[0]}/{len(jobs)} done, {passed[0]} passed, {now - started:.0f} s{self._generating()}", flush=True)

            async def one(i: int, job: tuple) -> None:
                env_id = job[0].env_id
                async with sem:
                    env = self.acquire(env_id)
                    try:
                        results[i] = await play(env, *job)
                    finally:
                        self.release(env_id, env)
                passed[0] += int(getattr(results[i], "outcome", None) == Outcome.PASSED)
                bar.update(bar_id, advance=1, passed=passed[0])
                done[0] += 1
                if plain and (
                    done[0] % max(1, len(jobs) // 10) == 0 or done[0] == len(jobs) or time.perf_counter() - last[0] > PLAIN_PROGRESS_S
                ):
                    say()

            async def heartbeat() -> None:
                # the first episodes of a big batch end together, minutes in: say it is alive meanwhile
                while True:
                    await asyncio.sleep(PLAIN_PROGRESS_S)
                    if time.perf_counter() - last[0] >= PLAIN_PROGRESS_S:
                        say()

            beat = asyncio.create_task(heartbeat()) if plain else None
            try:
                await asyncio.gather(*(one(i, job) for i, job in enumerate(jobs)))
            finally:
                if beat is not None:
                    beat.cancel()
        return results

    async def arun(self, tasks: list[Task], seed: int = 0, seeds: list[int] | None = None) -> list[Trajectory]:
        """All episodes of `tasks`, ordered by task then sample. Task i uses env seed
        `seeds[i]` if given (a trainer keeps a task's seed stable across steps), else `seed + i`;
        the G samples of a group share it."""
        sink = None
        if self.out_path:
            self.out_path.parent.mkdir(parents=True, exist_ok=True)
            sink = self.out_path.open("w")

        async def play(env: ToolEnv, task: Task, task_seed: int, g: int) -> Trajectory:
            traj = await run_episode(env, self.agent, task, task_seed, g, self.limits, self.verifier)
            if sink:
                sink.write(traj.model_dump_json() + "\n")
                sink.flush()
            return traj

        seeds = seeds if seeds is not None else [seed + i for i in range(len(tasks))]
        jobs = [(task, seeds[i], g) for i, task in enumerate(tasks) for g in range(self.group_size)]
        try:
            return await self.amap(jobs, play, "rollouts")
        finally:
            if sink:
                sink.close()

    def run(self, tasks: list[Task], seed: int = 0) -> list[Trajectory]:
        """Synchronous wrapper around `arun`."""
        return asyncio.run(self.arun(tasks, seed))

    def close(self) -> None:
        """Close pooled environments."""
        for pool in self._pools.values():
            for env in pool:
                env.close()
        self._pools.clear()


def _takes_an_argument(fn: Callable) -> bool:
    """True if `fn` can be called with one positional argument (the env id)."""
    import inspect

    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return False
    return any(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL) for p in params)
