"""One way to grade an episode: whatever an environment's author wrote (a `grade()` override, a
hidden answer, a hidden state checker run in a clean sandbox), `toolgym check`'s episodes (`step`'s
reward), evaluation (the rollout runner and pass@k), `toolgym eval` and the reward a GRPO step
trains with agree on every episode. Ways of grading that cannot be honoured are refused when the
class is defined, and the traps of authoring (a dropped split, a missing env id, non-JSON state)
are named."""

import json

import pytest
import torch
from conftest import ROOT, run_cli
from grading_envs import STATE_TASK, CounterEnv, SumEnv, _answer_task, _counter_task

import toolgym
from toolgym.envs.checker import run_episode
from toolgym.envs.core import StateNotJSON
from toolgym.harness import RolloutRunner, evaluate
from toolgym.sandbox import SafetyPolicy
from toolgym.tasks import GeneratorError, SuiteSpec, Task, ToolCall, builtin_suite, register_suite
from toolgym.trainers.core_algos import grpo_advantages
from toolgym.trainers.rewards import shaped_reward, trained_reward


class Scripted:
    """Plays a fixed list of turns (a text agent for the rollout runner)."""

    name = "scripted"

    def __init__(self, turns):
        self.turns = list(turns)

    async def respond(self, messages, tools, task):
        played = sum(1 for m in messages if m["role"] == "assistant")
        return self.turns[played] if played < len(self.turns) else ""


# ---- episodes: (actions) per environment, each a pass, a near miss or a miss -----------------------


def _episodes():
    counter = [_counter_task(5), _counter_task(6)]
    sums = [_answer_task(2, 3), _answer_task(4, 4)]
    call = lambda name, **a: ToolCall(name=name, arguments=a).to_text()  # noqa: E731
    return [
        ("gp-counter-v0", {}, counter[0], [call("add", n=5), call("done")]),  # 1.0 by grade()
        ("gp-counter-v0", {}, counter[1], [call("add", n=2), call("done")]),  # 0.25 by grade()
        ("gp-counter-v0", {}, counter[1], [call("done")]),  # 0.0
        ("gp-sum-v0", {}, sums[0], [call("submit_sum", value=5)]),
        ("gp-sum-v0", {}, sums[1], [call("submit_sum", value=7)]),
        (
            "gp-state-v0",
            {"sandbox": {"backend": "bwrap"}},
            STATE_TASK,
            [call("write_file", path="greeting.txt", content="hello"), call("submit")],
        ),
        (
            "gp-state-v0",
            {"sandbox": {"backend": "bwrap"}},
            STATE_TASK,
            [call("write_file", path="greeting.txt", content="hi"), call("submit")],
        ),
    ]


EXPECTED = [1.0, 0.25, 0.0, 1.0, 0.0, 1.0, 0.0]


def test_check_eval_and_a_grpo_step_agree_on_every_episode_for_every_kind_of_grading():
    by_check, by_eval = [], []
    for env_id, kwargs, task, actions in _episodes():
        env = toolgym.make(env_id, tasks=[task], **kwargs).unwrapped
        try:
            reward, terminated, _ = run_episode(env, task, actions)  # what `toolgym check` sums
            assert terminated
            by_check.append(reward)
            runner = RolloutRunner(lambda: env, Scripted(actions), progress=False)
            (traj,) = runner.run([task])  # what evaluation and training roll out
            by_eval.append(traj)
        finally:
            env.close()
    assert by_check == EXPECTED
    assert [t.reward for t in by_eval] == EXPECTED
    assert [t.outcome.value for t in by_eval] == ["passed", "failed", "failed", "passed", "failed", "passed", "failed"]
    # pass@1 of the evaluation report counts exactly the episodes that reward 1.0 passes, per task:
    # five tasks, two of them played twice (counter 6: 0 and 0; the state task: 1 and 0)
    report = evaluate(by_eval, [1], policy="scripted", suite="mixed", suite_version="1", split="train", seed=0, samples_per_task=1)
    assert report.overall.pass_at["1"].value == pytest.approx((1 + 0 + 1 + 0 + 0.5) / 5)
    # the reward one GRPO step trains with (no side effects here: the verdict's own)
    trained = [trained_reward(t, shaped_reward(t, SafetyPolicy()), "drop", None, 0) for t in by_eval]
    assert trained == EXPECTED
    adv = grpo_advantages(torch.tensor(trained[:3]), torch.zeros(3, dtype=torch.long))
    assert adv[0] > adv[1] > adv[2]


def test_toolgym_eval_grades_an_environment_that_overrides_grade_by_its_grade(tmp_path):
    out = run_cli(
        "--import",
        str(ROOT / "tests" / "grading_envs.py"),
        "eval",
        "--policy",
        "oracle",
        "--suite",
        "gp-counter",
        "--tasks",
        "4",
        "--out",
        str(tmp_path / "ev"),
    )
    assert out.returncode == 0, out.stdout + out.stderr
    report = json.loads((tmp_path / "ev" / "report.json").read_text())
    assert report["overall"]["pass_at"]["1"]["value"] == 1.0  # the hidden answer "never" would give 0.0


# ---- what cannot be honoured is refused when the class is defined ------------------------------------


def test_overriding_both_grade_and_verifier_is_refused_at_class_definition():
    with pytest.raises(TypeError, match="overrides both grade\\(\\) and verifier\\(\\)"):

        class Both(toolgym.ToolEnv):
            def grade(self) -> float:
                return 1.0

            def verifier(self):
                return None


def test_a_grade_that_takes_arguments_or_is_a_coroutine_is_refused():
    with pytest.raises(TypeError, match="write `def grade\\(self\\) -> float`"):

        class WithArgs(toolgym.ToolEnv):
            def grade(self, answer) -> float:
                return 1.0

    with pytest.raises(TypeError, match="is a coroutine"):

        class Async(toolgym.ToolEnv):
            async def grade(self) -> float:
                return 1.0


def test_a_tool_method_an_environment_attribute_would_hide_is_refused():
    with pytest.raises(toolgym.envs.ToolDefinitionError, match='keeps self.done.*@tool\\(name="done"\\)'):

        class Hidden(toolgym.ToolEnv):
            @toolgym.tool(final=True)
            def done(self) -> str:
                """Finish."""
                return "done"


def test_submits_must_name_a_parameter_of_the_tool():
    with pytest.raises(toolgym.envs.ToolDefinitionError, match="submits='answer' names no parameter"):

        class Wrong(toolgym.ToolEnv):
            @toolgym.tool(submits="answer")
            def finish(self, value: str) -> None:
                """Finish."""


# ---- the traps of authoring, named -------------------------------------------------------------------


def test_a_generator_that_drops_the_split_is_named_instead_of_emptying_held_out():
    def forgets(seed, index, split):
        return Task(env_id="toolgym/x-v0", instruction=f"task {index}", family="f")  # no split=split

    register_suite(SuiteSpec(name="gp-forgets", generator=forgets, train_size=2, heldout_size=2))
    with pytest.raises(GeneratorError, match="forgets.*split 'train' when asked for 'held-out'.*split=split"):
        builtin_suite("gp-forgets")


def test_a_generated_task_without_env_id_needs_a_registered_environment():
    def no_env(seed, index, split):
        return Task(instruction=f"task {index}", family="f", split=split)

    register_suite(SuiteSpec(name="gp-no-env", generator=no_env, train_size=1, heldout_size=1))
    with pytest.raises(GeneratorError, match="no env_id.*register_env\\(ENV_ID, tasks=generator\\)"):
        builtin_suite("gp-no-env")
    # one registration names the env, its suite and the tasks' env id
    suite = builtin_suite("gp-sum")
    assert {t.env_id for t in suite.tasks} == {"toolgym/gp-sum-v0"}
    assert {t.split for t in suite.tasks} == {"train", "held-out"}
    assert SumEnv.default_suite == "gp-sum" and len(SumEnv().tasks) == 200


def test_state_hash_names_an_attribute_that_is_not_json():
    env = CounterEnv(tasks=[_counter_task(3)])
    env.reset(seed=0)
    env.state_hash()  # the default state is JSON
    env.helper = object()
    with pytest.raises(StateNotJSON, match="CounterEnv.helper is not JSON data.*_helper"):
        env.state_hash()
