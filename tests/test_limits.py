"""Limits are the agent's only when they count the agent's own work: a turn or token limit is
`truncated`; a wall-clock watchdog is ours (`infra_error`), also on a machine whose cores are
saturated by other processes. Evaluations record their budget, warn when two differ, and report
best-of-N and majority vote beside pass@k. A campaign step draws more tasks when zero-variance
groups leave too few informative ones (dynamic sampling) and drops overlong episodes."""

import asyncio
import shutil
import subprocess
import sys

import pytest

import toolgym
from toolgym.harness import FixedAgent, RolloutLimits, RolloutRunner, SamplingParams, TokenAgent, evaluate
from toolgym.harness.evaluate import EvalBudget, budget_warning
from toolgym.harness.trajectory import Segment, Trajectory
from toolgym.tasks import builtin_suite
from toolgym.verifiers import Outcome

SEARCH = '<tool_call>\n{"name": "search", "arguments": {"field": "name", "value": "Nobody"}}\n</tool_call>'


def _runner(agent, **kw):
    return RolloutRunner(lambda: toolgym.make("records-v0").unwrapped, agent, progress=False, **kw)


def test_a_turn_limit_truncates_the_episode():
    tasks = builtin_suite("records").split("held-out").tasks[:2]
    trajs = _runner(FixedAgent(SEARCH), limits=RolloutLimits(max_turns=2)).run(tasks)
    assert [t.outcome for t in trajs] == [Outcome.TRUNCATED] * 2
    assert [t.limit_hit for t in trajs] == ["turns"] * 2


class _SlowAgent:
    """An agent whose 'policy' takes wall-clock time it does not control (a busy server)."""

    name = "slow"

    async def respond(self, messages, tools, task):
        await asyncio.sleep(1.0)
        return SEARCH


def test_the_wall_clock_watchdog_is_infra_never_the_agents_failure():
    tasks = builtin_suite("records").split("held-out").tasks[:2]
    trajs = _runner(_SlowAgent(), limits=RolloutLimits(max_turns=4, watchdog_s=0.3)).run(tasks)
    assert {t.outcome for t in trajs} == {Outcome.INFRA_ERROR}
    assert {t.limit_hit for t in trajs} == {"watchdog"}
    report = evaluate(trajs, [1], policy="slow", suite="records", suite_version="1", split="held-out", seed=0, samples_per_task=1)
    assert report.overall.pass_at["1"].tasks == 0  # excluded from pass@k, not counted as failures
    assert report.overall.limits_hit == {"watchdog": 2}


@pytest.fixture
def saturated_cores():
    """Two CPU-bound processes on this 2-core machine for the duration of a test."""
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    yield
    for p in burners:
        p.kill()
        p.wait()


def _greedy_eval(policy, tasks, watchdog_s):
    agent = TokenAgent(policy, policy.tokenizer, SamplingParams(max_new_tokens=24, temperature=0.0))
    return _runner(agent, concurrency=8, limits=RolloutLimits(max_turns=3, max_new_tokens_per_turn=24, watchdog_s=watchdog_s)).run(tasks)


def test_an_evaluation_on_saturated_cores_grades_what_an_idle_machine_grades(tiny_policy, saturated_cores):
    """The same greedy evaluation with the cores saturated by other processes: every graded
    outcome equals the unloaded one, and an episode the watchdog stopped is infra, never timeout."""
    tasks = builtin_suite("records").split("held-out").tasks[:8]
    loaded = _greedy_eval(tiny_policy, tasks, watchdog_s=3600)
    tight = _greedy_eval(tiny_policy, tasks, watchdog_s=0.05)  # far below what a busy machine needs
    assert all(t.outcome != Outcome.TIMEOUT for t in loaded + tight)
    assert all(t.outcome == Outcome.INFRA_ERROR for t in tight if t.limit_hit == "watchdog")
    assert any(t.limit_hit == "watchdog" for t in tight)
    saturated_cores  # noqa: B018 (the burners stop after this test)
    graded = {t.task_id: t.outcome for t in loaded}
    for t in tight:
        if t.outcome.is_agent_attempt:
            assert t.outcome == graded[t.task_id]


def test_an_answer_cut_by_the_turn_token_cap_is_reported_as_a_limit(tiny_policy):
    """BFCL's single-turn episode ends after one model turn whatever it holds. An untrained model
    rarely ends its turn within 3 tokens: those episodes are failures *and* counted under
    `turn_tokens`, so a budget that cuts answers short shows in the evaluation; with room to
    spare no limit is reported."""
    from toolgym.tasks.bfcl import load_bfcl

    tasks = load_bfcl().split("held-out").tasks[:4]

    def run(tokens):
        agent = TokenAgent(tiny_policy, tiny_policy.tokenizer, SamplingParams(max_new_tokens=tokens, temperature=0.0))
        return RolloutRunner(
            lambda: toolgym.make("bfcl-v0").unwrapped,
            agent,
            progress=False,
            limits=RolloutLimits(max_turns=1, max_new_tokens_per_turn=tokens),
        ).run(tasks)

    short = run(3)
    assert all(t.outcome != Outcome.TRUNCATED for t in short)  # the episode ended; the turn was cut
    assert {t.limit_hit for t in short if t.turns[0].new_tokens == 3} == {"turn_tokens"}
    assert all(t.limit_hit is None for t in short if t.turns[0].new_tokens < 3)
    report = evaluate(short, [1], policy="tiny", suite="bfcl", suite_version="1", split="held-out", seed=0, samples_per_task=1)
    assert report.overall.limits_hit == {"turn_tokens": sum(t.turns[0].new_tokens == 3 for t in short)} != {}


def _traj(task, outcome, answer=None, logp=-1.0, sample=0):
    return Trajectory(
        task_id=task,
        group_id=task,
        sample_index=sample,
        seed=0,
        policy="p",
        env_id="e",
        family="f",
        outcome=outcome,
        answer=answer,
        reward=float(outcome == Outcome.PASSED),
        segments=[Segment(kind="policy", token_ids=[1, 2], logprobs=[logp, logp])],
    )


def test_best_of_n_and_majority_vote_beside_pass_at_k():
    P, F = Outcome.PASSED, Outcome.FAILED
    trajs = [  # task a: the confident sample passes, the majority ("x") fails
        _traj("a", P, "y", -0.1, 0),
        _traj("a", F, "x", -2.0, 1),
        _traj("a", F, "x", -3.0, 2),
        # task b: the confident sample fails, the majority ("z") passes
        _traj("b", F, "w", -0.1, 0),
        _traj("b", P, "z", -2.0, 1),
        _traj("b", P, "z", -3.0, 2),
    ]
    report = evaluate(trajs, [1, 3], policy="p", suite="s", suite_version="1", split="held-out", seed=0, samples_per_task=3)
    assert report.overall.best_of_n.value == pytest.approx(0.5)  # a passes, b fails
    assert report.overall.majority_vote.value == pytest.approx(0.5)  # a fails, b passes
    assert report.overall.pass_at["3"].value == 1.0


def test_comparing_evaluations_under_different_budgets_warns():
    base = dict(policy="p", suite="s", suite_version="1", split="held-out", seed=0, samples_per_task=1)
    trajs = [_traj("a", Outcome.PASSED)]
    a = evaluate(trajs, [1], budget=EvalBudget(temperature=0.0, max_turns=8, max_new_tokens_per_turn=64), **base)
    b = evaluate(trajs, [1], budget=EvalBudget(temperature=0.0, max_turns=8, max_new_tokens_per_turn=96), **base)
    assert budget_warning(a, a) == ""
    warning = budget_warning(a, b)
    assert warning.startswith("WARNING") and "max_new_tokens_per_turn: 64 vs 96" in warning


def test_eval_cli_records_its_budget(tmp_path):
    from conftest import run_cli

    out = tmp_path / "ev"
    result = run_cli(
        "eval",
        "--policy",
        "oracle",
        "--suite",
        "records",
        "--tasks",
        "3",
        "--out",
        str(out),
        "--max-new-tokens",
        "48",
        "--max-total-tokens",
        "1024",
        "--temperature",
        "0",
    )
    assert result.returncode == 0, result.stderr
    import json

    budget = json.loads((out / "report.json").read_text())["budget"]
    assert budget["max_total_tokens"] == 1024 and budget["temperature"] is None  # the oracle samples nothing
    assert "budget:" in (out / "report.md").read_text()


def test_dynamic_sampling_draws_more_tasks_and_overlong_episodes_leave_the_gradient(tmp_path):
    """An untrained tiny model fails everything: every group has zero variance, so the step plays
    extra rounds (bounded) of new tasks; episodes cut by their turn limit are dropped from the
    gradient (rl.overlong: drop) and priced under `penalize`, after the envs entry's cost per call."""
    from test_trainer import _small_config, _write

    from toolgym.trainers.campaign import Campaign
    from toolgym.trainers.config import load_config

    envs = [{"env": "records-v0", "suite": "records", "weight": 1, "train_tasks": 40, "eval_tasks": 2, "call_cost": 0.25}]
    cfg = load_config(_write(tmp_path, _small_config(tmp_path, {"sft": {"steps": 0}, "envs": envs})))
    assert cfg.rl.dynamic_sampling == 2 and cfg.rl.overlong == "drop"  # the defaults
    campaign = Campaign(cfg, progress=False)
    try:
        batch = campaign.collect(1)
        assert not campaign.informative_groups(batch.trajectories)
        assert batch.extra["dynamic_extra_draws"] == 2  # bounded: two extra rounds, then it trains what it has
        ids = [t.id for _, t in batch.chosen]
        assert len(ids) == len(set(ids)) > cfg.rl.tasks_per_step  # new tasks each round, none twice
        # make one group informative through a truncated episode: dropped from the gradient
        first = batch.trajectories[0]
        first.outcome, first.reward, first.limit_hit = Outcome.TRUNCATED, 1.0, "turns"
        campaign.step = 1
        metrics = campaign.learn(batch)
        assert metrics["overlong_episodes"] >= 1 and metrics["overlong_dropped"] == metrics["overlong_episodes"]
        assert metrics["trained_groups"] <= cfg.rl.tasks_per_step
        campaign.config.rl.overlong = "penalize"
        first.tool_calls = 0
        assert campaign.trained_reward(first) == pytest.approx(0.0)  # reward 1, truncated: penalty 1
        first.tool_calls = 2  # the envs entry's call_cost, 0.25 a call, comes off before the overlong penalty
        assert campaign.trained_reward(first) == pytest.approx(-0.5)
    finally:
        campaign.close()


def test_compare_cli_warns_loudly_on_different_budgets(tmp_path):
    from conftest import run_cli

    for name, tokens in (("a", "1024"), ("b", "2048")):
        assert (
            run_cli(
                "eval",
                "--policy",
                "oracle",
                "--suite",
                "records",
                "--tasks",
                "3",
                "--out",
                str(tmp_path / name),
                "--max-total-tokens",
                tokens,
            ).returncode
            == 0
        )
    result = run_cli("compare", str(tmp_path / "a"), str(tmp_path / "b"))
    assert result.returncode == 0, result.stderr
    assert "WARNING" in result.stdout and "max_total_tokens: 1024 vs 2048" in result.stdout
    assert "+0.0 points" in result.stdout and "0 task(s) flipped to pass" in result.stdout
    bad = run_cli("compare", str(tmp_path / "a"), str(tmp_path / "nowhere"))
    assert bad.returncode != 0 and "not an evaluation directory" in bad.stderr + bad.stdout
    # a campaign's stage directory (OUT/eval/final) holds one evaluation per suite
    stage = tmp_path / "stage"
    stage.mkdir()
    (tmp_path / "b").rename(stage / "records")
    inside = run_cli("compare", str(tmp_path / "a"), str(stage))
    assert inside.returncode == 0 and "+0.0 points" in inside.stdout and "its one suite evaluation" in inside.stdout
    shutil.copytree(stage / "records", stage / "other")
    two = run_cli("compare", str(tmp_path / "a"), str(stage))
    assert two.returncode != 0 and "name one" in two.stderr + two.stdout


def test_a_bf16_sampling_copy_gets_the_trained_weights_and_tis_corrects_it(tmp_path):
    """The copy path on any CPU (a tiny model, where emulated bf16 costs nothing): rollouts sample
    from a bf16 copy, the update is off-policy so TIS is on, and the copy receives the new weights."""
    import json

    import torch
    from test_trainer import _small_config, _write

    from toolgym.trainers.campaign import Campaign
    from toolgym.trainers.config import load_config

    cfg = load_config(
        _write(
            tmp_path,
            _small_config(
                tmp_path,
                {
                    "model": {"init": "tiny", "rollout_dtype": "bf16"},
                    "sft": {"steps": 0},
                    "rl": {
                        "steps": 1,
                        "tasks_per_step": 2,
                        "group_size": 2,
                        "drop_zero_variance": False,
                        "dynamic_sampling": 0,
                        "learner": {"lr": 1e-3, "token_budget": 4096},
                    },
                },
            ),
        )
    )
    campaign = Campaign(cfg, progress=False)
    assert campaign._copy is not None and campaign._copy.policy.dtype == torch.bfloat16
    assert campaign.learner.off_policy and campaign.learner.tis_cap() == 2.0
    campaign.run()
    train = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines() if json.loads(x)["kind"] == "train"]
    assert train[0]["tis_cap"] == 2.0 and train[0]["logprob_gap_mean"] > 0  # bf16 sampling vs fp32 training
    trained = dict(campaign.policy.model.named_parameters())["model.layers.0.mlp.down_proj.weight"]
    served = dict(campaign._copy.policy.model.named_parameters())["model.layers.0.mlp.down_proj.weight"]
    assert torch.equal(served, trained.detach().to(torch.bfloat16))
    # the report links an audit page: per step, the top-reward rollouts and as many random ones
    audit = (tmp_path / "run" / "audit.md").read_text()
    assert "## step-0001" in audit and "top reward #" in audit and "random #" in audit and "**user**" in audit
    report = (tmp_path / "run" / "report.md").read_text()
    assert "audit.md" in report and "TIS truncated" in report and "mismatch KL" in report
