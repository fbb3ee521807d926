"""BFCL as toolgym environments, graded by BFCL's own checker: a fixed set of model outputs (right,
and wrong in each way BFCL tells apart) gets the same verdict through toolgym (model text parsed
by the environment, graded by the `bfcl-ast` scorer) as from `bfcl_eval`'s AST checker called
directly on the decoded calls; every oracle passes; doing nothing passes irrelevance only."""

import json

import pytest

import toolgym
from toolgym.envs.families.bfcl import CATEGORIES, SKIPPED, split_of, tool_schema
from toolgym.harness import FixedAgent, OracleAgent, RolloutRunner
from toolgym.tasks import ToolCall, builtin_suite
from toolgym.verifiers import Outcome
from toolgym.verifiers.bfcl import MODEL_NAME, checkers


@pytest.fixture(scope="module")
def suite():
    return builtin_suite("bfcl")


def _entry(suite, category, index=0):
    return [t for t in suite.tasks if t.family == category][index]


def _text(calls):
    return "\n".join(ToolCall(name=name, arguments=args).to_text() for call in calls for name, args in call.items())


def _bfcl_direct(task, calls):
    """BFCL's own verdict, called directly on the decoded calls (no toolgym code in between)."""
    ast_checker, is_empty_output, language = checkers()
    args = task.hidden.scorer_args
    if args["category"] == "irrelevance":
        return calls is None or is_empty_output(calls)
    if calls is None:
        return False
    return ast_checker(args["functions"], calls, args["ground_truth"], language.PYTHON, args["category"],
                       MODEL_NAME)["valid"]


def _through_toolgym(task, text):
    env = toolgym.make("bfcl-v0").unwrapped
    env.reset(options={"task": task})
    _, reward, terminated, _, _ = env.step(text)
    assert terminated
    return reward == 1.0


def _variants(task):
    """(label, decoded calls or None, the model's text) for right and wrong outputs."""
    oracle = [{c.name: dict(c.arguments)} for c in task.oracle]
    out = [("oracle", oracle, _text(oracle)), ("no call", [], "I cannot help with that."),
           ("malformed", None, "<tool_call>{\"name\": oops</tool_call>")]
    if oracle:
        name, args = next(iter(oracle[0].items()))
        out.append(("wrong function name", [{name + "_x": args}] + oracle[1:], _text([{name + "_x": args}] + oracle[1:])))
        if args:
            key = next(iter(args))
            missing = {k: v for k, v in args.items() if k != key}
            out.append(("missing parameter", [{name: missing}] + oracle[1:], _text([{name: missing}] + oracle[1:])))
            wrong_type = {**args, key: [args[key]]}
            out.append(("wrong type", [{name: wrong_type}] + oracle[1:], _text([{name: wrong_type}] + oracle[1:])))
            wrong_value = {**args, key: "certainly not this" if not isinstance(args[key], str) else args[key] + " zzz"}
            out.append(("wrong value", [{name: wrong_value}] + oracle[1:], _text([{name: wrong_value}] + oracle[1:])))
        extra = {**args, "unexpected_parameter": 1}
        out.append(("unexpected parameter", [{name: extra}] + oracle[1:], _text([{name: extra}] + oracle[1:])))
        out.append(("one call too many", oracle + oracle[:1], _text(oracle + oracle[:1])))
        if len(oracle) > 1:
            out.append(("calls reordered", oracle[::-1], _text(oracle[::-1])))
            out.append(("a call missing", oracle[:-1], _text(oracle[:-1])))
    else:  # irrelevance: a call to an offered function
        fn = task.hidden.scorer_args["functions"][0]["name"]
        out.append(("a call made", [{fn: {}}], _text([{fn: {}}])))
    return out


@pytest.mark.parametrize("category", CATEGORIES)
def test_toolgym_gives_bfcls_own_verdicts(suite, category):
    verdicts = {}
    for index in range(3):
        task = _entry(suite, category, index)
        for label, calls, text in _variants(task):
            ours, theirs = _through_toolgym(task, text), _bfcl_direct(task, calls)
            assert ours == theirs, f"{category}[{index}] {label}: toolgym {ours}, bfcl {theirs}"
            verdicts.setdefault(label, set()).add(ours)
    assert verdicts["oracle"] == {True}
    assert verdicts["no call"] == {category == "irrelevance"}
    if category != "irrelevance":  # each kind of mistake is one BFCL rejects
        for label in ("wrong function name", "missing parameter", "wrong type", "unexpected parameter"):
            assert verdicts[label] == {False}, label
    if category.startswith("parallel"):
        assert verdicts["calls reordered"] == {True} and verdicts["a call missing"] == {False}


def test_every_oracle_passes_and_doing_nothing_passes_irrelevance_only(suite):
    runner = RolloutRunner(lambda: toolgym.make("bfcl-v0").unwrapped, OracleAgent(), progress=False, concurrency=32)
    assert {t.outcome for t in runner.run(suite.tasks)} == {Outcome.PASSED}
    idle = RolloutRunner(lambda: toolgym.make("bfcl-v0").unwrapped, FixedAgent("I am not sure."), progress=False,
                         concurrency=32).run(suite.tasks)
    for t in idle:
        assert (t.outcome == Outcome.PASSED) == (t.family == "irrelevance"), t.family
    assert len(suite) == 1240 - sum(SKIPPED.values()) and sum(SKIPPED.values()) <= 4


def test_split_is_deterministic_per_id_and_disjoint(suite):
    held = suite.split("held-out").tasks
    train = suite.split("train").tasks
    assert 0.2 < len(held) / len(suite) < 0.3 and not {t.id for t in held} & {t.id for t in train}
    for t in held[:20]:
        assert split_of(t.metadata["bfcl_id"]) == "held-out" == t.split


def test_schemas_are_converted_and_names_keep_their_dots(suite):
    task = next(t for t in suite.tasks if "." in t.hidden.scorer_args["functions"][0]["name"])
    schema = tool_schema(task.hidden.scorer_args["functions"][0])
    assert "." in schema["function"]["name"] and schema["function"]["parameters"]["type"] == "object"
    types = {p.get("type") for p in schema["function"]["parameters"]["properties"].values()}
    assert types <= {"string", "integer", "number", "boolean", "array", "object", None}
    env = toolgym.make("bfcl-v0").unwrapped
    _, info = env.reset(options={"task": task})
    assert info["tools"] == [tool_schema(f) for f in task.hidden.scorer_args["functions"]]


def test_eval_cli_reports_bfcl_accuracy_per_category(tmp_path):
    from conftest import run_cli

    out = tmp_path / "ev"
    result = run_cli("eval", "--policy", "oracle", "--suite", "bfcl", "--tasks", "60", "--out", str(out))
    assert result.returncode == 0, result.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["overall"]["pass_at"]["1"]["value"] == 1.0 and set(report["by_family"]) <= set(CATEGORIES)
