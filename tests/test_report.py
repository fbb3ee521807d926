"""The campaign report's headline: base -> SFT -> final, each change paired on the tasks both graded."""

import json
import time

import toolgym
from toolgym.harness import FixedAgent, OracleAgent, RolloutRunner
from toolgym.harness.evaluate import evaluate
from toolgym.harness.evaluate import write_report as write_eval_report
from toolgym.harness.rollout import RolloutLimits
from toolgym.harness.trajectory import write_jsonl
from toolgym.tasks import builtin_suite
from toolgym.trainers.report import write_report


def _evaluation(run_dir, label, agent, tasks, suite="records", env="records-v0", max_turns=None):
    limits = RolloutLimits(max_turns=max_turns)
    runner = RolloutRunner(lambda: toolgym.make(env).unwrapped, agent, progress=False, concurrency=4, limits=limits)
    try:
        trajs = runner.run(tasks)
    finally:
        runner.close()
    out = run_dir / "eval" / label / suite
    write_jsonl(trajs, out / "trajectories.jsonl")
    write_eval_report(evaluate(trajs, [1], policy=label, suite=suite, suite_version="1", split="held-out", seed=0, samples_per_task=1), out)
    time.sleep(0.02)  # the report orders evaluations by their directories' times


def test_headline_pairs_final_with_sft_and_with_base_on_the_tasks_base_saw(tmp_path):
    tasks = builtin_suite("records").split("held-out").tasks[:8]
    (tmp_path / "metrics.jsonl").write_text(
        json.dumps({"kind": "sft", "step": 1, "time": 0.0, "sft_loss": 1.0, "sft_token_accuracy": 0.5}) + "\n"
    )
    _evaluation(tmp_path, "base", FixedAgent("I do not know."), tasks[:4])  # the base run sees the first 4 only
    _evaluation(tmp_path, "sft", FixedAgent("I do not know."), tasks)
    _evaluation(tmp_path, "final", OracleAgent(), tasks)
    headline = write_report(tmp_path)
    suite = headline["suites"]["records"]
    assert suite["base"] == 0.0 and suite["before"] == 0.0 and suite["after"] == 1.0
    assert suite["gain_points"] == 100.0 and suite["episodes"] == 8
    assert suite["base_gain_points"] == 100.0 and suite["base_episodes"] == 4
    line = headline["lines"][0]
    assert line.startswith("records held-out pass@1: base 0.000 -> SFT 0.000 -> final 1.000 (final - SFT +100.0")
    assert "final - base +100.0 points" in line and "paired on 4 episodes" in line
    assert "final - base (paired)" in (tmp_path / "report.md").read_text()


def test_the_report_shows_per_step_and_suite_which_families_had_a_gradient(tmp_path):
    row = {
        "kind": "train",
        "step": 1,
        "reward_mean": 0.5,
        "pass_rate": 0.5,
        "by_suite": {
            "mcp-inventory": {
                "episodes": 4,
                "pass_rate": 0.25,
                "turns_mean": 3.5,
                "side_effect_episodes": 0.25,
                "trained_token_share": 0.3,
                "groups_by_family": {"mcp-inventory/ship": {"groups": 2, "with_gradient": 1}},
            }
        },
    }
    (tmp_path / "metrics.jsonl").write_text(json.dumps(row) + "\n")
    write_report(tmp_path)
    report = (tmp_path / "report.md").read_text()
    assert "## Per step and suite" in report
    assert "| 1 | mcp-inventory | 0.250 | 3.5 | 25.0% | 30.0% | mcp-inventory/ship 1/2 |" in report


def test_a_sandboxed_suite_gets_a_line_of_side_effect_rates_by_stage_and_others_do_not(tmp_path):
    """mcp-inventory runs in a real sandbox: at `sft` the agent asks the supplier (a refused network
    attempt, recorded), at `final` it plays the oracle. records has no sandbox: no such line."""
    (tmp_path / "config.yaml").write_text(
        "envs:\n  - {env: mcp-inventory-v0, suite: mcp-inventory}\n  - {env: records-v0, suite: records}\n"
    )
    (tmp_path / "metrics.jsonl").write_text(
        json.dumps({"kind": "sft", "step": 1, "time": 0.0, "sft_loss": 1.0, "sft_token_accuracy": 0.5}) + "\n"
    )
    inventory = builtin_suite("mcp-inventory").split("held-out").tasks[:1]  # the notified item is in its stock
    records = builtin_suite("records").split("held-out").tasks[:2]
    item = next(iter(json.loads(inventory[0].workspace["inventory.json"])))
    notify = json.dumps({"name": "notify_supplier", "arguments": {"item": item}})
    notify = f"<tool_call>\n{notify}\n</tool_call>"
    _evaluation(tmp_path, "sft", FixedAgent(notify), inventory, "mcp-inventory", "mcp-inventory-v0", max_turns=1)
    _evaluation(tmp_path, "sft", FixedAgent("I do not know."), records)
    _evaluation(tmp_path, "final", OracleAgent(), inventory, "mcp-inventory", "mcp-inventory-v0")
    _evaluation(tmp_path, "final", OracleAgent(), records)
    lines = write_report(tmp_path)["lines"]
    effects = [line for line in lines if "side effects" in line]
    assert len(effects) == 1, lines
    assert effects[0].startswith("mcp-inventory held-out side effects: SFT 100.0% -> final 0.0% of episodes (events: SFT network")
    assert "final none" in effects[0]
