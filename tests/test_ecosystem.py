"""TRL, datasets and reasoning-gym: the adapter, real TRL GRPO/SFT steps, the exports, the suites."""

from __future__ import annotations

import inspect
import json
import os
import tempfile

import pytest
import torch
from conftest import run_cli

import toolgym
from toolgym.integrations.datasets import demonstrations_dataset, play_oracle, suite_to_dataset, tasks_from_dataset
from toolgym.integrations.trl_adapter import environment_factory, prepare_tokenizer
from toolgym.tasks import HiddenSpec, SuiteSpec, Task, ToolCall, builtin_suite, register_suite
from toolgym.verifiers import FinalState, Outcome, ScoreVerifier, VerifierError, register_scorer

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


def _tools(env_id: str) -> dict:
    env = toolgym.make(env_id).unwrapped
    try:
        return dict(env.tools)
    finally:
        env.close()


def _play(instance, calls: list[ToolCall]) -> list[str]:
    return [getattr(instance, c.name)(**c.arguments) for c in calls]


# ---- the adapter ------------------------------------------------------------------------------------


@pytest.mark.parametrize("env_id", ["records-v0", "shell-ops-v0", "rg-gcd-v0"])
def test_adapter_exposes_exactly_the_tools_with_their_schemas(env_id):
    from transformers.utils import get_json_schema

    cls = environment_factory(env_id)
    public = {n for n, _ in inspect.getmembers(cls, predicate=inspect.isfunction) if not n.startswith("_")}
    specs = _tools(env_id)
    assert public == set(specs) | {"reset", "get_reward"}
    for name, spec in specs.items():
        rendered = get_json_schema(getattr(cls, name))["function"]  # what TRL puts in the prompt
        ours = spec.schema["function"]
        assert rendered["name"] == ours["name"] and rendered["description"] == ours["description"]
        want = {}
        for arg, prop in ours["parameters"]["properties"].items():
            prop = dict(prop)
            if "default" in prop:  # transformers' schema has no defaults: the adapter says them in words
                prop["description"] += f" (default {json.dumps(prop.pop('default'))})"
            want[arg] = prop
        assert rendered["parameters"]["properties"] == want, name
        assert sorted(rendered["parameters"].get("required", [])) == sorted(ours["parameters"].get("required", []))


def test_reset_takes_every_column_and_needs_a_task_id():
    suite = builtin_suite("records")
    row = suite_to_dataset(suite, "train")[3]
    env = environment_factory("records-v0")()
    assert env.reset(**row) is None  # the prompt already holds the instruction
    assert env._env.task.id == row["task_id"]
    with pytest.raises(ValueError, match="task_id"):
        env.reset(prompt=row["prompt"])
    with pytest.raises(ValueError, match="not in the suite"):
        env.reset(task_id="0000000000000000")


@pytest.mark.parametrize("env_id,suite", [("records-v0", "records"), ("shell-ops-v0", "shell-ops"), ("rg-chain_sum-v0", "rg-chain_sum")])
def test_oracle_earns_one_and_doing_nothing_zero(env_id, suite):
    task = builtin_suite(suite).split("held-out").tasks[0]
    env = environment_factory(env_id)()
    env.reset(task_id=task.id)
    _play(env, list(task.oracle))
    assert env.get_reward() == 1.0 and env.last_outcome == Outcome.PASSED and env.last_verdict.passed
    env.reset(task_id=task.id)
    final = [spec for spec in _tools(env_id).values() if spec.final][0]
    args = {"text": "nothing"} if "text" in final.parameters.get("properties", {}) else {}
    getattr(env, final.name)(**args)
    assert env.get_reward() == 0.0 and env.last_outcome == Outcome.FAILED
    # calls after the episode ended get an error observation, not an exception
    assert "episode has ended" in getattr(env, final.name)(**args)


def test_bad_arguments_are_an_observation_not_an_exception():
    task = builtin_suite("records").split("train").tasks[0]
    env = environment_factory("records-v0")()
    env.reset(task_id=task.id)
    out = env.get(record="P01")  # wrong argument name, as a model might write it
    assert out.startswith("Error:") and "record_id" in out


def test_safety_penalty_is_applied_to_the_trl_reward():
    policy = {"rules": {"write_outside_workspace": {"action": "penalize", "penalty": 0.25}}}
    task = builtin_suite("shell-ops").split("train").tasks[0]
    env = environment_factory("shell-ops-v0", sandbox={"backend": "bwrap", "policy": policy})()
    env.reset(task_id=task.id)
    env.bash(command="echo x > /etc/evil; true")
    _play(env, list(task.oracle))
    assert env.last_outcome is None
    assert env.get_reward() == 0.75 and env.last_verdict.passed


def test_infra_error_gives_no_reward_instead_of_zero():
    task = builtin_suite("shell-ops").split("train").tasks[0]
    env = environment_factory("shell-ops-v0", sandbox={"backend": "bwrap"})()
    env.reset(task_id=task.id)
    env._env.sandbox.close()  # the sandbox dies mid-episode
    out = env.bash(command="ls")
    assert "will not be graded" in out
    assert env.get_reward() is None and env.last_outcome == Outcome.INFRA_ERROR
    env.reset(task_id=task.id)  # the next episode starts in a new sandbox
    _play(env, list(task.oracle))
    assert env.get_reward() == 1.0


# ---- real TRL GRPO steps ------------------------------------------------------------------------------


def _grpo_args(out: str, **kw):
    from trl import GRPOConfig

    # CPU: bf16 off, gradient checkpointing off, an explicit learning rate (TRL's defaults are for GPUs)
    base = dict(
        output_dir=out,
        max_steps=2,
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=256,
        max_tool_calling_iterations=4,
        learning_rate=1e-5,
        bf16=False,
        activation_checkpointing=False,
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        use_cpu=True,
        beta=0.0,
        shuffle_dataset=False,
    )
    return GRPOConfig(**{**base, **kw})


def _spy(cls):
    calls = []

    class Spy(cls):
        def get_reward(self):
            reward = super().get_reward()
            calls.append((self._env.task.id, self.last_outcome, self.last_verdict is not None, reward))
            return reward

    return Spy, calls


def test_trl_grpo_steps_get_rewards_from_our_verifier(tiny_dir):
    """Two real GRPOTrainer steps on records; the policy is first made to know one task's solution
    (a completion that solves it must earn 1 through TRL's loop; the other task's earns 0)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOTrainer

    tok = prepare_tokenizer(AutoTokenizer.from_pretrained(tiny_dir))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32)
    suite = builtin_suite("records")
    data = suite_to_dataset(suite, "train").select([0, 1])
    cls = environment_factory("records-v0")
    turns, passed = play_oracle(suite.split("train").tasks[0])
    assert passed
    tools = [getattr(cls, n) for n, _ in inspect.getmembers(cls, inspect.isfunction) if n in _tools("records-v0")]
    prompt = data[0]["prompt"]
    ids = tok.apply_chat_template(prompt + turns, tools=tools, tokenize=True, return_dict=False)
    n_prompt = len(tok.apply_chat_template(prompt, tools=tools, tokenize=True, add_generation_prompt=True, return_dict=False))
    x = torch.tensor([ids])
    opt = torch.optim.AdamW(model.parameters(), lr=5e-3)
    for _ in range(300):  # memorise task 0's oracle conversation
        loss = torch.nn.functional.cross_entropy(model(input_ids=x).logits[0, n_prompt - 1 : -1], x[0, n_prompt:])
        loss.backward()
        opt.step()
        opt.zero_grad()
    spy, calls = _spy(cls)
    with tempfile.TemporaryDirectory() as out:
        trainer = GRPOTrainer(
            model=model, args=_grpo_args(out, temperature=0.05), train_dataset=data, processing_class=tok, environment_factory=spy
        )
        trainer.train()
    assert trainer.state.global_step == 2
    assert len(calls) == 8 and all(graded for _, _, graded, _ in calls)
    by_task = {}
    for task_id, outcome, _, reward in calls:
        by_task.setdefault(task_id, []).append((outcome, reward))
    assert by_task[data[0]["task_id"]] == [(Outcome.PASSED, 1.0)] * 4  # solved -> 1, from our verifier
    assert all(r == 0.0 for _, r in by_task[data[1]["task_id"]])
    logged = [h["reward"] for h in trainer.state.log_history if "reward" in h]
    assert logged == [1.0, 0.0]  # TRL's own reward log agrees


def test_trl_grpo_steps_on_a_sandboxed_family(tiny_dir):
    """Two real GRPOTrainer steps on shell-ops in bwrap: every rollout graded by the state checker."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOTrainer

    tok = prepare_tokenizer(AutoTokenizer.from_pretrained(tiny_dir))
    model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32)
    data = suite_to_dataset(builtin_suite("shell-ops"), "train").select([0, 1])
    spy, calls = _spy(environment_factory("shell-ops-v0", sandbox={"backend": "bwrap"}))
    with tempfile.TemporaryDirectory() as out:
        trainer = GRPOTrainer(
            model=model, args=_grpo_args(out, max_completion_length=48), train_dataset=data, processing_class=tok, environment_factory=spy
        )
        trainer.train()
    assert trainer.state.global_step == 2
    assert len(calls) == 8
    assert {t for t, *_ in calls} == set(data["task_id"])
    assert all(graded and outcome.is_agent_attempt and reward == 0.0 for _, outcome, graded, reward in calls)


# ---- datasets -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("suite", ["records", "shell-ops", "rg-gcd"])
def test_suite_dataset_round_trip_keeps_ids_and_hides_the_grader(suite):
    s = builtin_suite(suite)
    for split in ("train", "held-out"):
        ds = suite_to_dataset(s, split)
        assert [t.id for t in tasks_from_dataset(ds)] == [t.id for t in s.split(split).tasks]
    ds = suite_to_dataset(s, "train")
    assert set(ds.column_names) == {"prompt", "tools", "task_id", "env_id", "suite", "split", "family", "difficulty"}
    task = s.split("train").tasks[0]
    blob = json.dumps(ds[0])
    for secret in list(task.hidden.files.values()) + [c.to_text() for c in task.oracle]:
        assert secret not in blob
    assert ds[0]["prompt"][-1] == {"role": "user", "content": task.instruction}


def test_demonstrations_render_to_the_tokens_of_our_rollouts(tiny_dir):
    """The SFT dataset, rendered by the chat template with its `tools` column, gives exactly the
    text of the token-level demonstrations our trainer uses (same renderer, same tool schemas)."""
    from transformers import AutoTokenizer

    from toolgym.harness.demonstrations import collect_demonstrations

    tok = AutoTokenizer.from_pretrained(tiny_dir)
    tasks = builtin_suite("records").split("train").tasks[:3]
    ds = demonstrations_dataset(tasks, "records")
    played = collect_demonstrations(tasks, tok, lambda e: toolgym.make(e).unwrapped, progress=False)
    for row, traj in zip(ds, played):
        text = tok.apply_chat_template(row["messages"], tools=json.loads(row["tools"]), tokenize=False)
        assert text == tok.decode(traj.token_ids) + "\n"  # the template closes the last turn with a newline


def test_sft_trainer_takes_the_demonstrations(tiny_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    tok = AutoTokenizer.from_pretrained(tiny_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32)
    ds = demonstrations_dataset(builtin_suite("records").split("train").tasks[:4], "records")
    with tempfile.TemporaryDirectory() as out:
        trainer = SFTTrainer(
            model=model,
            train_dataset=ds,
            processing_class=tok,
            args=SFTConfig(
                output_dir=out,
                max_steps=2,
                per_device_train_batch_size=2,
                learning_rate=1e-3,
                use_cpu=True,
                bf16=False,
                report_to=[],
                save_strategy="no",
                logging_steps=1,
                max_length=2048,
            ),
        )
        result = trainer.train()
    assert trainer.state.global_step == 2 and torch.isfinite(torch.tensor(result.training_loss))


def test_cli_writes_datasets_that_round_trip(tmp_path):
    import datasets

    out = tmp_path / "ds"
    r = run_cli("tasks", "records", "--limit", "1", "--to-dataset", str(out), "--demos", "3")
    assert r.returncode == 0, r.stderr
    assert "train 1000 rows, held_out 200 rows, sft 3 rows" in r.stdout
    loaded = datasets.load_from_disk(str(out))
    suite = builtin_suite("records")
    assert [t.id for t in tasks_from_dataset(loaded["held_out"])] == [t.id for t in suite.split("held-out").tasks]
    assert len(datasets.load_from_disk(str(out / "sft"))) == 3


def test_cli_to_dataset_on_a_missing_suite_is_one_line(tmp_path):
    r = run_cli("tasks", "no-such-suite", "--to-dataset", str(tmp_path / "x"))
    assert r.returncode != 0 and "no suite 'no-such-suite'" in r.stderr and "Traceback" not in r.stderr


# ---- reasoning-gym ---------------------------------------------------------------------------------------

#: Two datasets of different kinds (arithmetic, string) run every check; the splits of all
#: of them are checked by test_reasoning_gym_splits_are_disjoint.
RG_CHECKED = ["gcd", "spell_backward"]


def test_reasoning_gym_suites_pass_the_checker():
    """`toolgym check` (every check: gymnasium, cross-process determinism, oracle, do-nothing, reset,
    hacks, initial state) on two datasets, run side by side."""
    from concurrent.futures import ThreadPoolExecutor

    from toolgym.envs.checker import run_checks

    with ThreadPoolExecutor(max_workers=len(RG_CHECKED)) as pool:
        reports = dict(zip(RG_CHECKED, pool.map(lambda d: run_checks(f"toolgym/rg-{d}-v0", 3), RG_CHECKED)))
    for dataset, results in reports.items():
        assert all(r.ok for r in results), (dataset, [(r.name, r.detail) for r in results if not r.ok])
        assert {"oracle[train]", "oracle[held-out]", "do-nothing[held-out]", "determinism"} <= {r.name for r in results}


def test_reasoning_gym_splits_are_disjoint():
    from toolgym.envs.families.reasoning_gym import DEFAULT_DATASETS

    for dataset in DEFAULT_DATASETS:
        suite = builtin_suite(f"rg-{dataset}")
        report = suite.leaks()
        assert report.clean, (dataset, report.shared_ids[:3], report.near_duplicates[:3])
        assert len(suite.split("held-out")) == 100


def test_reasoning_gym_python_tool_runs_in_the_sandbox():
    task = builtin_suite("rg-gcd").split("train").tasks[0]
    env = toolgym.make("rg-gcd-v0").unwrapped
    try:
        env.reset(options={"task": task})
        obs = env.step([ToolCall(name="python", arguments={"code": "import os; print(os.getcwd(), 6 * 7)"})])[0]
        assert "/workspace 42" in obs
        obs = env.step([ToolCall(name="bash", arguments={"command": "ls"})])[0]  # not a tool of this env
        assert "unknown tool" in obs
    finally:
        env.close()


def test_score_verifier_grades_with_the_scorer_and_owns_its_failures():
    task = builtin_suite("rg-chain_sum").split("train").tasks[0]
    v = ScoreVerifier()
    good = v.verify(task, FinalState(answer=task.hidden.answer))
    assert good.passed and good.reward == 1.0 and good.outcome == Outcome.PASSED
    bad = v.verify(task, FinalState(answer=str(int(task.hidden.answer) + 1)))
    assert not bad.passed and bad.reward < 1.0 and bad.outcome == Outcome.FAILED
    assert v.verify(task, FinalState()).reward == 0.0

    def boom(task, answer):
        raise RuntimeError("scorer bug")

    register_scorer("test-boom", boom)
    broken = Task(
        env_id="toolgym/rg-chain_sum-v0", instruction="x", family="t", hidden=HiddenSpec(kind="score", answer="1", scorer="test-boom")
    )
    with pytest.raises(VerifierError, match="scorer bug"):
        v.verify(broken, FinalState(answer="1"))
    unknown = broken.model_copy(update={"hidden": HiddenSpec(kind="score", answer="1", scorer="nope")})
    with pytest.raises(VerifierError, match="no scorer 'nope'"):
        v.verify(unknown, FinalState(answer="1"))


def test_partial_credit_is_recorded_for_rejected_answers_and_its_failure_never_changes_the_grade():
    """A scorer's partial credit goes into a rejected answer's verdict details; a pass gets none;
    a partial-credit function that raises or leaves [0, 1] leaves the scorer's verdict as it is
    (failed, reward 0) and says why the credit is missing."""
    from toolgym.verifiers.score import register_partial_credit

    register_scorer("test-exact", lambda task, answer: float(answer == task.hidden.answer))
    credits = {"0.25": 0.25, "raise": None, "2": 2.0}

    def credit(task, answer):
        if credits[answer] is None:
            raise RuntimeError("credit bug")
        return credits[answer]

    register_partial_credit("test-exact", credit)
    task = Task(
        env_id="toolgym/rg-chain_sum-v0", instruction="x", family="t", hidden=HiddenSpec(kind="score", answer="1", scorer="test-exact")
    )
    v = ScoreVerifier()
    assert v.verify(task, FinalState(answer="1")).details == {}
    near = v.verify(task, FinalState(answer="0.25"))
    assert (near.outcome, near.reward, near.details) == (Outcome.FAILED, 0.0, {"partial_credit": 0.25})
    for answer, why in (("raise", "credit bug"), ("2", "outside")):
        verdict = v.verify(task, FinalState(answer=answer))
        assert (verdict.outcome, verdict.reward) == (Outcome.FAILED, 0.0)
        assert "partial_credit" not in verdict.details and why in verdict.details["partial_credit_error"]


def test_new_hidden_fields_leave_existing_task_ids_alone():
    import hashlib

    from toolgym.tasks.task import CONTENT_FIELDS

    task = builtin_suite("records").split("train").tasks[0]
    payload = {name: getattr(task, name) for name in CONTENT_FIELDS}
    payload["hidden"] = task.hidden.model_dump(mode="json", exclude={"scorer", "scorer_args", "runs"})
    payload["data"] = task.data
    blob = json.dumps(payload, sort_keys=True, ensure_ascii=True, separators=(",", ":"))
    assert task.id == hashlib.sha256(blob.encode()).hexdigest()[:16]


def test_leaky_held_out_items_are_replaced():
    def gen(seed, index, split="train"):
        # held-out repeats train for its first 5 indices, then is new
        n = index if split == "train" or index < 5 else 1000 + index
        return Task(
            env_id="toolgym/records-v0",
            instruction=f"question number {n} " + "x" * (n % 7),
            family="t",
            split=split,
            hidden=HiddenSpec(answer=str(n)),
        )

    register_suite(SuiteSpec(name="test-leaky", generator=gen, train_size=20, heldout_size=8, drop_heldout_leaks=True))
    suite = builtin_suite("test-leaky")
    assert suite.leaks().clean and len(suite.split("held-out")) == 8
    register_suite(
        SuiteSpec(
            name="test-leaky-all",
            # every held-out task is a train task (same content, same id) placed in held-out
            generator=lambda s, i, split="train": gen(s, i % 5, "train").with_split(split),
            train_size=5,
            heldout_size=3,
            drop_heldout_leaks=True,
        )
    )
    with pytest.raises(ValueError, match="cannot find 3 held-out tasks"):
        builtin_suite("test-leaky-all")
