"""pass@k estimator, bootstrap CIs, failure attribution in rollouts, exports, and `toolgym eval`/`show`."""

import itertools
import json

import pytest
from conftest import run_cli

import toolgym
from toolgym.harness import FixedAgent, OracleAgent, RolloutRunner, TokenAgent, evaluate, pass_at_k, read_jsonl, write_parquet
from toolgym.tasks import builtin_suite
from toolgym.verifiers import Outcome


@pytest.mark.parametrize("n, c", [(5, 0), (5, 1), (5, 3), (8, 8), (10, 4)])
def test_pass_at_k_is_exact_over_all_subsets(n, c):
    samples = [1] * c + [0] * (n - c)
    for k in range(1, n + 1):
        subsets = list(itertools.combinations(samples, k))
        brute = sum(any(s) for s in subsets) / len(subsets)
        assert pass_at_k(n, c, k) == pytest.approx(brute)


def test_pass_at_k_needs_enough_samples():
    with pytest.raises(ValueError, match="at least 4 samples"):
        pass_at_k(3, 1, 4)


def _runner(agent, **kw):
    return RolloutRunner(lambda: toolgym.make("records-v0").unwrapped, agent, progress=False, **kw)


def test_progress_off_a_terminal_says_it_is_alive_before_any_episode_ends(capsys, monkeypatch):
    """Written to a log (not a terminal), a run whose episodes all end late still prints a line
    every PLAIN_PROGRESS_S, not silence until the first episode ends."""
    import asyncio

    from toolgym.harness import rollout

    class SlowOracle(OracleAgent):
        async def respond(self, messages, tools, task):
            await asyncio.sleep(1.0)
            return await super().respond(messages, tools, task)

    monkeypatch.setattr(rollout, "PLAIN_PROGRESS_S", 0.2)
    tasks = builtin_suite("records").split("held-out").tasks[:2]
    runner = RolloutRunner(lambda: toolgym.make("records-v0").unwrapped, SlowOracle(), progress=True)
    trajs = runner.run(tasks)
    lines = capsys.readouterr().out.splitlines()
    assert all(t.outcome == Outcome.PASSED for t in trajs)
    assert any(line.startswith("rollouts: 0/2 done, 0 passed") for line in lines), lines
    assert any(line.startswith("rollouts: 2/2 done, 2 passed") for line in lines)


def test_progress_lines_say_how_far_the_policys_batch_has_decoded(capsys, monkeypatch, tiny_policy):
    """While a batch decodes (no episode done yet), each heartbeat line says how many tokens in it
    is, read from the real policy; between batches the policy reports nothing."""
    import re
    import time as clock

    from toolgym.harness import rollout

    monkeypatch.setattr(rollout, "PLAIN_PROGRESS_S", 0.1)
    slow = tiny_policy.model.register_forward_pre_hook(lambda module, args: clock.sleep(0.04))
    try:
        runner = RolloutRunner(
            lambda: toolgym.make("records-v0").unwrapped,
            TokenAgent(tiny_policy, tiny_policy.tokenizer),
            progress=True,
            limits=toolgym.harness.RolloutLimits(max_turns=1, max_new_tokens_per_turn=24),
        )
        runner.run(builtin_suite("records").tasks[:2], seed=3)
    finally:
        slow.remove()
    lines = capsys.readouterr().out.splitlines()
    # one batch of both episodes, or (a loaded machine: the second resets late) one batch each
    decoding = [
        (int(m.group(1)), int(m.group(2)))
        for line in lines
        if (m := re.match(r"rollouts: [01]/2 done, [01] passed, \d+ s \(a batch of ([12]) at token (\d+) of at most 24\)$", line))
    ]
    assert len(decoding) >= 2 and all(1 <= token <= 24 for _, token in decoding), lines
    assert any(line.startswith("rollouts: 2/2 done") and "batch" not in line for line in lines), lines
    assert tiny_policy.activity is None


def test_oracle_eval_and_ci():
    tasks = builtin_suite("records").split("held-out").tasks[:12]
    trajs = _runner(OracleAgent(), group_size=2).run(tasks)
    report = evaluate(trajs, [1, 2], policy="oracle", suite="records", suite_version="1", split="held-out", seed=0, samples_per_task=2)
    assert report.overall.pass_at["1"].value == 1.0 and report.overall.pass_at["2"].low == 1.0
    assert set(report.by_family) == {"records/lookup", "records/manager", "records/count"}
    assert report.overall.outcome_rates["passed"] == 1.0


def test_mixed_results_give_a_sensible_interval():
    tasks = builtin_suite("records").split("held-out").tasks[:30]
    good = _runner(OracleAgent()).run(tasks[:15])
    bad = _runner(FixedAgent('<tool_call>{"name": "answer", "arguments": {"text": "nobody"}}</tool_call>')).run(tasks[15:])
    report = evaluate(good + bad, [1], policy="mix", suite="records", suite_version="1", split="held-out", seed=0, samples_per_task=1)
    est = report.overall.pass_at["1"]
    assert est.value == 0.5 and 0.2 < est.low < 0.5 < est.high < 0.8
    assert report.overall.outcome_rates["failed"] == 0.5


def test_verifier_crash_is_verifier_error_not_failure():
    class Broken:
        def verify(self, task, state):
            raise RuntimeError("checker died")

    tasks = builtin_suite("records").tasks[:2]
    trajs = _runner(OracleAgent(), verifier=Broken()).run(tasks)
    assert all(t.outcome == Outcome.VERIFIER_ERROR and "checker died" in t.error for t in trajs)
    report = evaluate(trajs, [1], policy="o", suite="s", suite_version="1", split="train", seed=0, samples_per_task=1)
    assert report.overall.pass_at["1"].tasks == 0 and report.notes  # left out of pass@k, and said so


def test_group_shares_env_seed_but_samples_differ(tiny_policy, tmp_path):
    tasks = builtin_suite("records").tasks[:2]
    runner = _runner(
        TokenAgent(tiny_policy, tiny_policy.tokenizer),
        group_size=3,
        out_path=tmp_path / "t.jsonl",
        limits=toolgym.harness.RolloutLimits(max_turns=1, max_new_tokens_per_turn=12),
    )
    trajs = runner.run(tasks, seed=10)
    first = trajs[:3]
    assert {t.group_id for t in first} == {f"{tasks[0].id}:10"} and {t.seed for t in first} == {10}
    assert len({tuple(t.token_ids) for t in first}) == 3  # different samples within the group
    again = runner.run(tasks, seed=10)
    assert [t.token_ids for t in again] == [t.token_ids for t in trajs]  # and reruns reproduce them
    streamed = read_jsonl(tmp_path / "t.jsonl")
    assert sorted(t.token_ids for t in streamed) == sorted(t.token_ids for t in again)


def test_parquet_loads_with_datasets(tmp_path, tiny_policy):
    import datasets

    tasks = builtin_suite("records").tasks[:2]
    trajs = _runner(
        TokenAgent(tiny_policy, tiny_policy.tokenizer), limits=toolgym.harness.RolloutLimits(max_turns=1, max_new_tokens_per_turn=8)
    ).run(tasks)
    write_parquet(trajs, tmp_path / "t.parquet")
    ds = datasets.load_dataset("parquet", data_files=str(tmp_path / "t.parquet"), split="train", cache_dir=str(tmp_path / "cache"))
    assert len(ds) == 2 and ds[0]["token_ids"] == trajs[0].token_ids and ds[0]["loss_mask"] == trajs[0].loss_mask


def test_eval_cli_oracle_is_perfect(tmp_path):
    out = run_cli(
        "eval",
        "--policy",
        "oracle",
        "--suite",
        "records",
        "--split",
        "held-out",
        "-n",
        "2",
        "-k",
        "1,2",
        "--tasks",
        "20",
        "--out",
        str(tmp_path),
    )
    assert out.returncode == 0, out.stderr
    data = json.loads((tmp_path / "report.json").read_text())
    assert data["overall"]["pass_at"]["1"]["value"] == 1.0 and data["split"] == "held-out"
    assert data["policy"] == "oracle" and data["suite_version"] == "1" and data["seed"] == 0
    md = (tmp_path / "report.md").read_text()
    assert "pass@1" in md and "records/count" in md
    for png in ("passk.png", "outcomes.png"):
        assert (tmp_path / png).read_bytes()[:4] == b"\x89PNG"


def test_eval_cli_untrained_tiny_is_near_zero_with_format_errors(tmp_path):
    out = run_cli(
        "eval",
        "--policy",
        "tiny",
        "--tasks",
        "8",
        "-n",
        "2",
        "-k",
        "1,2",
        "--max-turns",
        "2",
        "--max-new-tokens",
        "24",
        "--out",
        str(tmp_path),
    )
    assert out.returncode == 0, out.stderr
    data = json.loads((tmp_path / "report.json").read_text())
    assert data["overall"]["pass_at"]["1"]["value"] <= 0.05
    assert data["overall"]["outcome_rates"]["format_error"] >= 0.9
    assert "format-error rate" in out.stdout
    show = run_cli("show", str(tmp_path / "trajectories.jsonl"), "--index", "1")
    assert show.returncode == 0
    assert "policy · " in show.stdout and "mask 1" in show.stdout and "observation · " in show.stdout
    assert "template · " in show.stdout and "mask 0" in show.stdout


@pytest.mark.parametrize(
    "args, needle",
    [
        (("eval", "--policy", "nope"), "unknown policy 'nope'"),
        (("eval", "--policy", "oracle", "-n", "1", "-k", "4"), "needs at least 4 samples"),
        (("eval", "--policy", "oracle", "-k", "x"), "expected comma-separated integers"),
        (("eval", "--policy", "oracle", "--split", "dev"), "no tasks in split 'dev'"),
        (("show", "/nonexistent.jsonl"), "no such file"),
    ],
)
def test_eval_bad_input(args, needle):
    out = run_cli(*args)
    assert out.returncode == 2 and needle in out.stderr and "Traceback" not in out.stderr


def _graded(task, passed):
    from toolgym.harness.trajectory import Trajectory

    return Trajectory(
        task_id=task,
        group_id=task,
        seed=0,
        policy="p",
        env_id="toolgym/records-v0",
        outcome=Outcome.PASSED if passed else Outcome.FAILED,
        reward=float(passed),
    )


def test_paired_difference_by_hand():
    from toolgym.harness.evaluate import paired_difference

    before = [_graded(f"t{i}", i < 4) for i in range(10)]  # 0.4
    after = [_graded(f"t{i}", i < 8) for i in range(10)]  # 0.8, never worse on a task
    infra = _graded("t9", True).model_copy(update={"outcome": Outcome.INFRA_ERROR})
    diff = paired_difference(before, after[:9] + [infra], seed=0)
    assert diff.tasks == 9 and diff.value == pytest.approx(4 / 9)  # t9 has no graded sample after: left out
    # a resample without any of the 4 gaining tasks has probability (5/9)^9 < 0.6%: the CI excludes 0
    assert 0 < diff.low <= diff.value <= diff.high
    same = paired_difference(before, before, seed=0)
    assert same.value == same.low == same.high == 0.0
