"""The trainer on a real (tiny) transformer: logprob agreement with the sampler, SFT learns, a
violating side effect lowers the advantage, infra errors stay out of the gradient, a SIGKILLed
campaign resumes exactly, bad configs are named, and the report is written."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from conftest import run_cli

import toolgym
from toolgym.harness import RolloutLimits, RolloutRunner, SamplingParams, TokenAgent
from toolgym.harness.demonstrations import collect_demonstrations
from toolgym.inference.hf_policy import HFPolicy
from toolgym.tasks import builtin_suite
from toolgym.trainers.batching import micro_batches, pack
from toolgym.trainers.campaign import Campaign, allocate
from toolgym.trainers.config import ConfigError, load_config
from toolgym.trainers.learner import Learner, LearnerConfig
from toolgym.verifiers import Outcome


def records_env(env_id=None):
    return toolgym.make("records-v0").unwrapped


@pytest.fixture
def fresh_policy(tiny_dir):
    return HFPolicy(tiny_dir, device="cpu", dtype="fp32")


def test_first_step_logprobs_agree_with_the_sampler(fresh_policy):
    """Same weights, fp32: the trainer's recomputed logprobs of the sampled tokens equal the
    rollout's to ~1e-4 (measured and logged every step as the train/inference gap)."""
    agent = TokenAgent(fresh_policy, fresh_policy.tokenizer, SamplingParams(max_new_tokens=24))
    runner = RolloutRunner(records_env, agent, group_size=2, progress=False, limits=RolloutLimits(max_turns=3, max_new_tokens_per_turn=24))
    trajs = runner.run(builtin_suite("records").tasks[:6])
    runner.close()
    batch = pack(trajs, [1.0, -1.0] * 6, fresh_policy.pad_id)
    metrics = Learner(fresh_policy.model, LearnerConfig(lr=1e-6)).rl_step(batch)
    assert batch.tokens > 50
    assert metrics["logprob_gap_max"] < 1e-4 and metrics["logprob_gap_mean"] < 1e-5
    assert metrics["ratio_min"] == pytest.approx(1.0) and metrics["grad_norm"] > 0


def test_tempered_rollouts_train_the_distribution_they_were_sampled_from(fresh_policy):
    """Sampled at T = 0.6: the rollout's logprobs are those of softmax(logits / 0.6), and a learner
    told the temperature recomputes them (ratio 1, gap ~1e-4); one that trains the untempered
    model sees them as off-policy."""
    agent = TokenAgent(fresh_policy, fresh_policy.tokenizer, SamplingParams(max_new_tokens=24, temperature=0.6))
    runner = RolloutRunner(records_env, agent, group_size=2, progress=False, limits=RolloutLimits(max_turns=2, max_new_tokens_per_turn=24))
    trajs = runner.run(builtin_suite("records").tasks[:4])
    runner.close()
    batch = pack(trajs, [1.0, -1.0] * 4, fresh_policy.pad_id)
    tempered = Learner(fresh_policy.model, LearnerConfig(lr=1e-9), temperature=0.6).rl_step(batch)
    assert tempered["logprob_gap_max"] < 1e-4 and tempered["ratio_min"] == pytest.approx(1.0)
    untempered = Learner(fresh_policy.model, LearnerConfig(lr=1e-9)).rl_step(batch)
    assert untempered["logprob_gap_mean"] > 100 * max(tempered["logprob_gap_mean"], 1e-6)


def test_a_campaign_can_list_a_suites_tools_in_another_order_per_demonstration(tmp_path, fresh_policy):
    """`envs.N.shuffle_tools`: the campaign makes that env with a per-episode tool order, so its
    demonstrations (and rollouts) do not all list the tools alike; the oracle still passes."""
    from toolgym.trainers.campaign_rollouts import env_options

    envs = [{"env": "records-v0", "suite": "records", "shuffle_tools": True}, {"env": "bfcl-v0", "suite": "bfcl"}]
    config = load_config(_write(tmp_path, _small_config(tmp_path, {"envs": envs})))
    assert env_options(config, "toolgym/records-v0") == {"shuffle_tools": True} and env_options(config, "toolgym/bfcl-v0") == {}
    pinned = load_config(_write(tmp_path, _small_config(tmp_path, {"envs": [{**envs[0], "pinned_tools": 1}]})))
    assert env_options(pinned, "toolgym/records-v0") == {"shuffle_tools": True, "pinned_tools": 1}
    with pytest.raises(ConfigError, match="pinned_tools needs shuffle_tools"):
        load_config(_write(tmp_path, _small_config(tmp_path, {"envs": [{**envs[1], "pinned_tools": 1}]})))
    tasks = builtin_suite("records").split("train").tasks[:8]
    demos = collect_demonstrations(
        tasks, fresh_policy.tokenizer, lambda env_id: toolgym.make(env_id, **env_options(config, env_id)).unwrapped, progress=False
    )
    assert all(d.outcome == Outcome.PASSED for d in demos)

    def order(demo):
        text = demo.segments[0].text
        return tuple(sorted(("search", "get", "answer"), key=lambda name: text.index(f'"name": "{name}"')))

    assert len({order(d) for d in demos}) >= 2


def test_sft_on_oracle_demonstrations_lowers_the_loss(fresh_policy):
    tasks = builtin_suite("records").split("train").tasks[:16]
    demos = collect_demonstrations(tasks, fresh_policy.tokenizer, records_env, progress=False)
    assert len(demos) == 16 and all(d.outcome == Outcome.PASSED for d in demos)  # every oracle passes
    # the demonstration tokens are rendered like rollouts: template, then policy/observation turns
    assert [s.kind for s in demos[0].segments][:3] == ["template", "policy", "observation"]
    learner = Learner(fresh_policy.model, LearnerConfig(lr=3e-3, token_budget=4096))
    batch = pack(demos, [0.0] * len(demos), fresh_policy.pad_id)
    first = learner.sft_step(batch)["sft_loss"]
    for _ in range(8):
        last = learner.sft_step(batch)["sft_loss"]
    assert last < first * 0.8


def test_micro_batches_respect_the_token_budget():
    lengths = [10, 300, 40, 50, 290, 5, 600]
    groups = micro_batches(lengths, 700)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    for g in groups:
        assert len(g) == 1 or max(lengths[i] for i in g) * len(g) <= 700


def test_micro_batched_gradient_equals_the_whole_batch_gradient(tiny_dir):
    """Accumulating over micro-batches with the batch's normaliser gives the same update as one
    big batch (token-mean)."""
    agent_policy = HFPolicy(tiny_dir, device="cpu", dtype="fp32")
    demos = collect_demonstrations(builtin_suite("records").split("train").tasks[:6], agent_policy.tokenizer, records_env, progress=False)
    batch = pack(demos, [0.5, -1.0, 2.0, 0.1, -0.3, 1.0], agent_policy.pad_id)
    grads = []
    for budget in (100_000, 900):
        policy = HFPolicy(tiny_dir, device="cpu", dtype="fp32")
        learner = Learner(policy.model, LearnerConfig(lr=1e-3, token_budget=budget, grad_clip=1e9))
        learner._step = lambda: 0.0  # keep the gradients to compare them
        learner.rl_step(batch)
        grads.append(torch.cat([p.grad.flatten() for p in policy.model.parameters() if p.grad is not None]))
    assert torch.allclose(grads[0], grads[1], atol=1e-6, rtol=1e-4)


def _small_config(tmp_path, extra=None):
    base = {
        "name": "test",
        "seed": 3,
        "out_dir": str(tmp_path / "run"),
        "model": {"init": "tiny"},
        "envs": [{"env": "records-v0", "suite": "records", "weight": 1, "train_tasks": 40, "eval_tasks": 2}],
        "eval": {"base_tasks": 2, "max_turns": 2},
        "sft": {"steps": 2, "batch_size": 4, "demos_per_suite": 8},
        "rl": {"steps": 4, "tasks_per_step": 2, "group_size": 2, "learner": {"lr": 1e-3, "token_budget": 4096}},
        "sampler": {"min_attempts": 2},
        "rollout": {"max_turns": 2, "max_new_tokens": 16, "concurrency": 8},
        "checkpoint": {"every": 1, "keep": 2},
    }
    base.update(extra or {})
    return base


def _write(tmp_path, data):
    path = tmp_path / "campaign.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_bad_configs_name_the_field(tmp_path):
    with pytest.raises(ConfigError, match=r"rl\.group_size"):
        load_config(_write(tmp_path, _small_config(tmp_path, {"rl": {"group_size": 1}})))
    with pytest.raises(ConfigError, match=r"rl\.learner\.lossy.*unknown field"):
        load_config(_write(tmp_path, _small_config(tmp_path, {"rl": {"learner": {"lossy": "ppo"}}})))
    with pytest.raises(ConfigError, match="rl.learner.loss 'nope'"):
        load_config(_write(tmp_path, _small_config(tmp_path, {"rl": {"learner": {"loss": "nope"}}})))
    (tmp_path / "broken.yaml").write_text("rl: [unclosed\n")
    out = run_cli("train", str(tmp_path / "broken.yaml"))
    assert out.returncode == 2 and out.stderr.startswith("error:") and "not valid YAML" in out.stderr
    out = run_cli("train", str(tmp_path / "missing.yaml"))
    assert out.returncode == 2 and "no such config file" in out.stderr


def test_evaluation_only_suites_are_checked(tmp_path):
    """A stage that does not exist, or a suite both trained and evaluation-only, is refused by name."""
    extra = {"env": "bfcl-v0", "suite": "bfcl", "stages": ["later"]}
    with pytest.raises(ConfigError, match=r"eval\.suites\[bfcl\]\.stages.*base, sft, initial, steps, final"):
        load_config(_write(tmp_path, _small_config(tmp_path, {"eval": {"suites": [extra]}})))
    extra = {"env": "records-v0", "suite": "records"}
    with pytest.raises(ConfigError, match="'records' is also in envs"):
        load_config(_write(tmp_path, _small_config(tmp_path, {"eval": {"suites": [extra]}})))


def test_demo_multi_turn_adds_bfcl_multi_as_an_evaluation_only_suite(tmp_path):
    """`toolgym demo --multi-turn N`'s override: BFCL multi-turn evaluated at every stage, with BFCL's
    own turns and 4,096 tokens per conversation; the trained mix is unchanged."""
    from toolgym.cli.train import DEMO_CONFIG, MULTI_TURN_SUITE, _load

    config = _load(DEMO_CONFIG, tmp_path, [f"eval.suites=[{MULTI_TURN_SUITE.format(tasks=5)}]"])
    (extra,) = config.eval.suites
    assert (extra.env, extra.suite, extra.tasks, extra.max_turns, extra.max_total_tokens) == ("bfcl-multi-v0", "bfcl-multi", 5, None, 4096)
    assert {"base", "sft", "final"} <= set(extra.stages) and [m.suite for m in config.envs] == ["bfcl"]


def test_demo_sandboxed_adds_mcp_inventory_undemonstrated_and_records_for_the_form(tmp_path):
    """`toolgym demo --sandboxed`'s overrides: mcp-inventory drawn for RL beside BFCL, never
    demonstrated, all of its first 60 held-out tasks evaluated; 192 `records` demonstrations
    beside BFCL's 576, one epoch; two turns; a later --set still applies on top."""
    from toolgym.cli.train import DEMO_CONFIG, SANDBOXED, _load

    config = _load(DEMO_CONFIG, tmp_path, [*SANDBOXED, "envs.2.call_cost=0.05"])
    bfcl, records, inventory = config.envs
    assert (bfcl.suite, bfcl.weight, bfcl.demonstrations, bfcl.demos) == ("bfcl", 1, True, None)
    assert (records.suite, records.weight, records.demos) == ("records", 0, 192)
    assert (inventory.suite, inventory.weight, inventory.demonstrations, inventory.eval_tasks) == ("mcp-inventory", 1, False, 60)
    assert inventory.call_cost == 0.05
    assert config.sft.steps * config.sft.batch_size == config.sft.demos_per_suite + records.demos
    assert (config.rollout.max_turns, config.eval.max_turns) == (2, 2)
    assert _load(DEMO_CONFIG, tmp_path, []).rollout.max_turns == 1  # the default job is unchanged


def test_an_evaluation_only_suite_is_evaluated_under_its_own_budget_and_never_trained(tmp_path):
    """`eval.suites`: BFCL beside a records campaign, at the final evaluation only, with its own
    turns and tokens: none of its tasks is a demonstration or drawn, its report records its own
    budget, and the headline says it was evaluated only."""
    data = _small_config(
        tmp_path,
        {
            "eval": {
                "base_tasks": 2,
                "max_turns": 2,
                "suites": [{"env": "bfcl-v0", "suite": "bfcl", "tasks": 3, "max_turns": 1, "max_total_tokens": 1500, "stages": ["final"]}],
            }
        },
    )
    data["sft"]["steps"], data["rl"]["steps"] = 1, 1
    campaign = Campaign(load_config(_write(tmp_path, data)), progress=False)
    result = campaign.run()
    assert set(campaign.samplers) == {"records"} and set(campaign.train_tasks) == {"records"}
    assert {t.env_id for t in campaign.demos} == {"toolgym/records-v0"}
    run = tmp_path / "run"
    assert sorted(p.name for p in (run / "eval").iterdir()) == ["base", "final", "sft"]
    assert not (run / "eval" / "sft" / "bfcl").exists() and not (run / "eval" / "base" / "bfcl").exists()
    report = json.loads((run / "eval" / "final" / "bfcl" / "report.json").read_text())
    assert report["overall"]["episodes"] == 3
    # each stage's report and trajectories name the stage: the weights differ under one model path
    assert report["policy"].endswith("@final")
    sft_lines = (run / "eval" / "sft" / "records" / "trajectories.jsonl").read_text().splitlines()
    assert {json.loads(line)["policy"] for line in sft_lines} == {report["policy"].replace("@final", "@sft")}
    assert report["budget"]["max_turns"] == 1 and report["budget"]["max_total_tokens"] == 1500
    trained = json.loads((run / "eval" / "final" / "records" / "report.json").read_text())["budget"]
    assert trained["max_turns"] == 2 and trained["max_total_tokens"] == 2048  # the trained suite keeps the campaign's
    rollouts = [json.loads(line) for path in (run / "rollouts").glob("*.jsonl") for line in path.read_text().splitlines()]
    assert rollouts and {r["env_id"] for r in rollouts} == {"toolgym/records-v0"}
    line = next(line for line in result["lines"] if line.startswith("bfcl "))
    assert line.startswith("bfcl held-out pass@1: final ") and line.endswith("(3 episodes; evaluated only, never trained on)")
    assert next(line for line in result["lines"] if line.startswith("records ")).startswith("records held-out pass@1: base ")


def test_allocation_by_weight():
    assert allocate(8, [3, 1]) == [6, 2] and allocate(3, [1, 1, 1]) == [1, 1, 1] and sum(allocate(7, [5, 1])) == 7
    assert allocate(8, [1, 0, 1]) == [4, 0, 4] and allocate(1, [0, 1]) == [0, 1]  # weight 0: demonstrated, never drawn


def _train_until(config_path, steps_done, run_dir):
    """Start `toolgym train` in a fresh process; SIGKILL it once `steps_done` RL steps are logged."""
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "toolgym.cli", "train", str(config_path)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    deadline = time.monotonic() + 600
    try:
        while time.monotonic() < deadline:
            lines = (
                [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
                if (run_dir / "metrics.jsonl").exists()
                else []
            )
            if sum(r["kind"] == "train" for r in lines) >= steps_done:
                break
            if proc.poll() is not None:
                raise AssertionError(f"training exited early: {proc.stderr.read().decode()[-800:]}")
            time.sleep(0.05)
        else:
            raise AssertionError("training made no progress")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # mid-step: no chance to clean up
        proc.wait()


def _steps(run_dir):
    """The RL step records of a run's metrics log."""
    return [r for r in (json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()) if r["kind"] == "train"]


def test_sigkill_mid_step_then_resume_continues_exactly(tmp_path):
    """Kill -9 during step 3; --resume restarts from the last checkpoint with the step count,
    metrics of finished steps and sampler state intact, and draws what an uninterrupted run draws."""
    data = _small_config(tmp_path)
    config_path = _write(tmp_path, data)
    run_dir = Path(data["out_dir"])
    _train_until(config_path, 2, run_dir)  # step 2 is logged; it is killed during step 3 or its checkpoint
    from toolgym.trainers.checkpoint import latest_checkpoint

    ckpt = latest_checkpoint(run_dir)
    assert ckpt is not None
    done = int(ckpt.name.split("-")[1])
    assert done >= 1 and json.loads((ckpt / "state.json").read_text())["step"] == done
    before = _steps(run_dir)[:done]
    out = run_cli("train", str(config_path), "--resume", timeout=900)
    assert out.returncode == 0, out.stderr[-2000:]
    assert f"resumed from {ckpt.name}" in out.stdout
    resumed = _steps(run_dir)
    assert [r["step"] for r in resumed] == [1, 2, 3, 4]  # nothing lost, nothing counted twice
    assert resumed[:done] == before  # the finished steps' metrics are intact

    # an uninterrupted run with the same seed draws the same tasks at the step after the checkpoint
    data2 = dict(data, out_dir=str(tmp_path / "straight"))
    out = run_cli("train", str(_write(tmp_path, data2)), timeout=900)
    assert out.returncode == 0, out.stderr[-2000:]
    straight = _steps(Path(data2["out_dir"]))
    said = [line for line in out.stdout.splitlines() if line.startswith("RL step ")]
    assert [line.split(":")[0] for line in said] == [f"RL step {i}/4" for i in range(1, 5)], out.stdout[-3000:]
    assert all(f"reward {r['reward_mean']:.3f} over {r['episodes']} episodes" in line for r, line in zip(straight, said))
    assert [r["tasks"] for r in straight[: done + 1]] == [r["tasks"] for r in resumed[: done + 1]]
    for name in (
        "report.md",
        "plots/reward.png",
        "final-model/config.json",
        "sft-model/config.json",
        "tensorboard",
        "eval/sft",
        "eval/final",
    ):
        assert (run_dir / name).exists(), name
    # the SFT stage's model is kept on its own: the same seed's SFT gives the same weights in both runs
    from safetensors.torch import load_file

    sft_a, sft_b = (load_file(str(d / "sft-model" / "model.safetensors")) for d in (run_dir, Path(data2["out_dir"])))
    assert sft_a.keys() == sft_b.keys() and all(torch.equal(sft_a[k], sft_b[k]) for k in sft_a)
    report = run_cli("report", str(run_dir))
    assert report.returncode == 0 and "report:" in report.stdout
    # every step records the process's memory, and the report says its peak
    assert all(r["peak_rss_gb"] > 0.99 * r["rss_gb"] > 0 for r in straight)
    assert "peak resident memory" in (run_dir / "report.md").read_text()


def test_a_mixed_batch_plays_each_task_on_its_own_env_id():
    from toolgym.harness import OracleAgent

    made = []

    def factory(env_id):
        made.append(env_id)
        return toolgym.make(env_id).unwrapped

    tasks = builtin_suite("records").tasks[:3] + builtin_suite("shell-ops").tasks[:2]
    runner = RolloutRunner(factory, OracleAgent(), progress=False, concurrency=2)
    try:
        trajs = runner.run(tasks)
    finally:
        runner.close()
    assert [t.env_id for t in trajs] == [t.env_id for t in tasks]
    assert all(t.outcome == Outcome.PASSED for t in trajs)
    assert set(made) == {"toolgym/records-v0", "toolgym/shell-ops-v0"} and len(made) <= 4  # pooled per env id


def test_set_overrides_reach_list_items_and_refuse_bad_paths(tmp_path):
    path = _write(tmp_path, _small_config(tmp_path))
    cfg = load_config(path, {"envs.0.eval_tasks": 7, "rl.learner.autocast": "bf16"})
    assert cfg.envs[0].eval_tasks == 7 and cfg.rl.learner.autocast == "bf16"
    with pytest.raises(ConfigError, match=r"envs is a list of 1; use an index below 1"):
        load_config(path, {"envs.3.eval_tasks": 7})
    with pytest.raises(ConfigError, match=r"model.chat_template 'nope'"):
        load_config(path, {"model.chat_template": "nope"})


def test_a_micro_batch_that_cannot_fit_is_refused_before_the_kernel_kills_it(tiny_dir):
    from toolgym.trainers.memory import TrainingMemoryError, auto_token_budget, bytes_per_token, check_fits

    policy = HFPolicy(tiny_dir, device="cpu", dtype="fp32")
    per_token = bytes_per_token(policy.model)
    assert 0 < per_token < 2**20 and 64 <= auto_token_budget(policy.model, torch.device("cpu")) <= 16384
    check_fits(policy.model, torch.device("cpu"), 4096, "RL step")  # fits
    with pytest.raises(
        TrainingMemoryError,
        match=r"RL step: .* tokens in one micro-batch need about .* GiB.*"
        r"rl\.learner\.token_budget",
    ):
        check_fits(policy.model, torch.device("cpu"), 10**13 // per_token, "RL step")
    # a bf16 model's layer activations are bf16: fewer bytes per token, the logits' share unchanged
    assert bytes_per_token(policy.model.to(torch.bfloat16)) < per_token


def test_micro_batches_keep_rows_with_a_shared_prefix_together():
    head = list(range(100, 130))
    group_a = [head + [1] * 20 + [i] * (5 + i) for i in range(3)]  # share 50 tokens
    group_b = [head + [2] * 20 + [i] * (5 + i) for i in range(3)]
    alone = [head + [3 + i] * 30 for i in range(2)]  # share only the head
    rows = [group_a[0], group_b[0], alone[0], group_a[1], group_b[1], group_a[2], alone[1], group_b[2]]
    lengths = [len(r) for r in rows]
    groups = micro_batches(lengths, 10_000, rows)
    as_sets = sorted(sorted(g) for g in groups)
    assert as_sets == sorted([[0, 3, 5], [1, 4, 7], [2, 6]])
    tight = micro_batches(lengths, 120, rows)  # the budget still rules: at most 2 rows of ~57 tokens
    assert sorted(i for g in tight for i in g) == list(range(8))
    assert all(len(g) * max(lengths[i] for i in g) <= 120 or len(g) == 1 for g in tight)


def test_partial_credit_of_one_or_more_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="partial_credit"):
        load_config(_write(tmp_path, _small_config(tmp_path, {"rl": {"partial_credit": 1.0}})))


def test_max_difficulty_and_train_families_keep_some_train_tasks_and_every_heldout_one(tmp_path):
    """`envs.N.max_difficulty` and `train_families`: RL draws (and SFT demonstrates) only those
    train tasks (evaluations read the held-out split, which they never filter); a filter that
    leaves none is refused. `rollout.explore_tools` is refused where
    its agent is not built (Ray's environment workers)."""
    envs = [{"env": "records-v0", "suite": "records", "max_difficulty": 1, "eval_tasks": 3}]
    campaign = Campaign(load_config(_write(tmp_path, _small_config(tmp_path, {"envs": envs}))), progress=False)
    kept = campaign.train_tasks["records"].values()
    every = builtin_suite("records").split("train").tasks
    assert {t.difficulty for t in kept} == {1} and len(kept) == sum(t.difficulty == 1 for t in every) < len(every)
    envs[0]["train_families"] = ["records/lookup"]
    campaign = Campaign(load_config(_write(tmp_path, _small_config(tmp_path, {"envs": envs}))), progress=False)
    assert {t.family for t in campaign.train_tasks["records"].values()} == {"records/lookup"}
    envs[0]["train_families"] = ["records/lookups"]  # a typo trains on nothing: refused
    with pytest.raises(ConfigError, match="no train task of suite records is left"):
        Campaign(load_config(_write(tmp_path, _small_config(tmp_path, {"envs": envs}))), progress=False)
    with pytest.raises(ConfigError, match="explore_tools works with backend: local"):
        load_config(_write(tmp_path, _small_config(tmp_path, {"rollout": {"explore_tools": 0.3, "backend": "ray"}})))
