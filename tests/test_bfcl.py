"""BFCL as toolgym environments, graded by BFCL's own checker: a fixed set of model outputs (right,
and wrong in each way BFCL tells apart) gets the same verdict through toolgym (model text parsed
by the environment, graded by the `bfcl-ast` scorer) as from `bfcl_eval`'s AST checker called
directly on the decoded calls; every oracle passes; doing nothing passes irrelevance only."""

import json

import pytest

import toolgym
from toolgym.envs.families.bfcl import tool_schema
from toolgym.harness import FixedAgent, OracleAgent, RolloutRunner
from toolgym.tasks import ToolCall, builtin_suite
from toolgym.tasks.bfcl import CATEGORIES, LIVE_CATEGORIES, MODEL_NAME, SKIPPED, checkers, is_irrelevance, split_of
from toolgym.verifiers import Outcome


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
    if is_irrelevance(args["category"]):
        return calls is None or is_empty_output(calls)
    if calls is None:
        return False
    return ast_checker(args["functions"], calls, args["ground_truth"], language.PYTHON, args["category"], MODEL_NAME)["valid"]


def _through_toolgym(task, text):
    env = toolgym.make("bfcl-v0").unwrapped
    env.reset(options={"task": task})
    _, reward, terminated, _, _ = env.step(text)
    assert terminated
    return reward == 1.0


def _variants(task):
    """(label, decoded calls or None, the model's text) for right and wrong outputs."""
    oracle = [{c.name: dict(c.arguments)} for c in task.oracle]
    out = [
        ("oracle", oracle, _text(oracle)),
        ("no call", [], "I cannot help with that."),
        ("malformed", None, '<tool_call>{"name": oops</tool_call>'),
    ]
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


@pytest.fixture(scope="module")
def live():
    return builtin_suite("bfcl-live")


@pytest.mark.parametrize("category", LIVE_CATEGORIES)
def test_the_live_suite_gets_bfcls_own_verdicts(live, category):
    """BFCL's live categories: the same verdicts through toolgym as from BFCL's checker directly."""
    for index in range(2):
        task = _entry(live, category, index)
        for label, calls, text in _variants(task):
            ours, theirs = _through_toolgym(task, text), _bfcl_direct(task, calls)
            assert ours == theirs, f"{category}[{index}] {label}: toolgym {ours}, bfcl {theirs}"
            if label in ("oracle", "no call"):
                assert ours == (label == "oracle" or is_irrelevance(category)), (category, label)


def test_the_live_suite_is_all_held_out_and_unlike_the_training_suite(live, suite):
    """Every live entry is held out (never trained on), none is a `bfcl` entry, every category is
    in the first few hundred, the oracle passes and doing nothing passes live irrelevance only."""
    assert live.splits == {"held-out": len(live)} and len(live) >= 2200
    assert not {t.metadata["bfcl_id"] for t in live} & {t.metadata["bfcl_id"] for t in suite}
    first = live.tasks[:300]
    assert {t.family for t in first} == set(LIVE_CATEGORIES)
    runner = RolloutRunner(lambda: toolgym.make("bfcl-v0").unwrapped, OracleAgent(), progress=False, concurrency=32)
    assert {t.outcome for t in runner.run(first)} == {Outcome.PASSED}
    idle = RolloutRunner(lambda: toolgym.make("bfcl-v0").unwrapped, FixedAgent("I am not sure."), progress=False, concurrency=32).run(first)
    for t in idle:
        assert (t.outcome == Outcome.PASSED) == (t.family == "live_irrelevance"), t.family


def test_every_oracle_passes_and_doing_nothing_passes_irrelevance_only(suite):
    runner = RolloutRunner(lambda: toolgym.make("bfcl-v0").unwrapped, OracleAgent(), progress=False, concurrency=32)
    assert {t.outcome for t in runner.run(suite.tasks)} == {Outcome.PASSED}
    idle = RolloutRunner(lambda: toolgym.make("bfcl-v0").unwrapped, FixedAgent("I am not sure."), progress=False, concurrency=32).run(
        suite.tasks
    )
    for t in idle:
        assert (t.outcome == Outcome.PASSED) == (t.family == "irrelevance"), t.family
    skipped = sum(SKIPPED.get(c, 0) for c in CATEGORIES)  # SKIPPED also counts bfcl-live's, once it is loaded
    assert len(suite) == 1240 - skipped and skipped <= 4


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


# ---- multi-turn -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def multi():
    return builtin_suite("bfcl-multi")


def _bfcl_multi_direct(task, decoded):
    """BFCL's multi-turn checker called directly on hand-made decoded call strings."""
    import uuid

    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import multi_turn_checker

    checkers()
    args = task.hidden.scorer_args
    if len(decoded) != len(args["ground_truth"]):
        return False
    model = f"direct_{uuid.uuid4().hex}"
    try:
        return multi_turn_checker(decoded, args["ground_truth"], dict(args["entry"]), args["category"], model)["valid"]
    finally:
        for name in [n for n in vars(multi_turn_utils) if n.startswith(model)]:
            del vars(multi_turn_utils)[name]


def _play(task, steps):
    """Play `steps` (one model step each: a list of (name, arguments) calls, or [] to hand the turn
    back) through the environment; the reward it ends with (0 if it never ended)."""
    env = toolgym.make("bfcl-multi-v0").unwrapped
    env.reset(options={"task": task})
    reward = 0.0
    for calls in steps:
        _, reward, terminated, truncated, _ = env.step(_text([{n: a} for n, a in calls]) or "Done.")
        if terminated or truncated:
            break
    return reward == 1.0


def _as_string(name, args):
    return f"{name}(" + ", ".join(f"{k}={v!r}" for k, v in args.items()) + ")"


def _multi_variants(task):
    """(label, steps for the environment, decoded strings for BFCL) for right and wrong episodes."""
    gt = task.hidden.scorer_args["ground_truth"]
    from toolgym.tasks.bfcl_multi import instances, methods, parse_ground_truth

    table = methods(instances(task.hidden.scorer_args["entry"]))
    turns = [[(c.name, dict(c.arguments)) for c in (parse_ground_truth(s, table) for s in turn)] for turn in gt]

    def episode(turn_calls):
        steps, decoded = [], []
        for calls in turn_calls:
            steps += ([calls] if calls else []) + [[]]
            decoded.append([[_as_string(n, a) for n, a in calls]] if calls else [])
        return steps, decoded

    out = [("oracle", *episode(turns)), ("nothing", *episode([[] for _ in turns]))]
    first = next(i for i, t in enumerate(turns) if t)
    dropped = [t if i != first else t[:-1] for i, t in enumerate(turns)]
    out.append(("a call dropped", *episode(dropped)))
    name, args = turns[first][-1]
    if args:
        key = next(iter(args))
        value = args[key]
        changed = [
            t if i != first else t[:-1] + [(name, {**args, key: (value + "_x") if isinstance(value, str) else 12345})]
            for i, t in enumerate(turns)
        ]
        out.append(("an argument changed", *episode(changed)))
    steps, decoded = episode(turns)
    out.append(("stopped before the last request", steps[:-1], decoded[:-1]))
    return out


@pytest.mark.parametrize("category", ["multi_turn_base", "multi_turn_miss_func", "multi_turn_miss_param"])
def test_multi_turn_verdicts_are_bfcls(multi, category):
    seen = {}
    for task in [t for t in multi.tasks if t.family == category][:3]:
        for label, steps, decoded in _multi_variants(task):
            ours, theirs = _play(task, steps), _bfcl_multi_direct(task, decoded)
            assert ours == theirs, f"{task.metadata['bfcl_id']} {label}: toolgym {ours}, bfcl {theirs}"
            seen.setdefault(label, set()).add(ours)
    assert seen["oracle"] == {True} and seen["nothing"] == {False}
    assert seen["stopped before the last request"] == {False} and seen["a call dropped"] == {False}


def test_multi_turn_calls_run_methods_and_the_next_request_arrives_as_a_user_message(multi):
    # a miss_func entry whose first turn calls something and whose second request is a message
    task = next(
        t
        for t in multi.tasks
        if t.family == "multi_turn_miss_func" and "<tool_call>" in t.oracle_turns()[0] and t.hidden.scorer_args["entry"]["question"][1]
    )
    env = toolgym.make("bfcl-multi-v0").unwrapped
    env.reset(options={"task": task})
    obs, _, terminated, _, info = env.step(task.oracle_turns()[0])
    assert not terminated and info["tool_results"] and not info.get("observation_messages")
    # text without a call hands the turn back: the user's next request arrives
    _, _, terminated, _, info = env.step("Done.")
    assert not terminated and info["observation_messages"][0]["role"] == "user"
    assert info["observation_messages"][0]["content"] == str(task.hidden.scorer_args["entry"]["question"][1][0]["content"])
    # a name that is not one of the APIs' public methods runs nothing
    _, _, _, _, info = env.step(_text([{"__import__": {"name": "os"}}]))
    assert info["tool_results"][0]["error"] and "not defined" in info["tool_results"][0]["content"]


def test_lean_entries_offer_what_their_truth_calls_and_a_few_others_and_still_pass(multi):
    """bfcl-multi-lean: each entry offers the functions its ground truth calls plus at most
    LEAN_DISTRACTORS others of its own, the same draw every load; the cut leaves the verdict alone
    (the oracle still passes, doing nothing still fails), and the full suite is untouched."""
    from toolgym.tasks.bfcl_multi import LEAN_DISTRACTORS, lean_task

    lean = builtin_suite("bfcl-multi-lean")
    assert [t.id for t in lean.tasks] == [t.id for t in multi.tasks]
    for full, cut in list(zip(multi.tasks, lean.tasks))[:40]:
        offered = [d["name"] for d in full.hidden.scorer_args["entry"]["function"]]
        kept = [d["name"] for d in cut.hidden.scorer_args["entry"]["function"]]
        called = {c.name for c in full.oracle} & set(offered)
        assert called <= set(kept) and kept == [n for n in offered if n in kept]  # a subset, in the entry's order
        assert len(set(kept) - called) == min(LEAN_DISTRACTORS, len(set(offered) - called))
        assert kept == [d["name"] for d in lean_task(full).hidden.scorer_args["entry"]["function"]]
    assert any(len(t.hidden.scorer_args["entry"]["function"]) > 8 for t in multi.tasks[:40])
    for category in ("multi_turn_base", "multi_turn_miss_func"):
        task = next(t for t in lean.tasks if t.family == category)
        variants = dict((label, steps) for label, steps, _ in _multi_variants(task))
        assert _play(task, variants["oracle"]) and not _play(task, variants["nothing"])


@pytest.mark.parametrize("env_id", ["bfcl-v0", "bfcl-multi-v0"])
def test_toolgym_check_passes_on_both_bfcl_suites(env_id):
    from conftest import run_cli

    result = run_cli("check", env_id, "--tasks", "8")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "all 8 checks passed" in result.stdout.replace("\n", " ")


def test_partial_credit_ranks_near_misses_and_leaves_bfcls_verdict_alone(suite):
    """`rl.partial_credit`'s source: for a rejected answer, the verdict records how close it came
    (ToolRL's right functions, parameter names and values, each value judged by BFCL's checker);
    the pass and the reward stay BFCL's. On a parallel entry: the oracle is not given any (it
    passes); one wrong value, a missing call and an extra call each get credit strictly between 0
    and 1, ordered by how much is wrong; a wrong function name, no call, a malformed answer get 0."""
    task = _entry(suite, "parallel")
    oracle = [{c.name: dict(c.arguments)} for c in task.oracle]
    name, args = next(iter(oracle[0].items()))
    key = next(iter(args))
    one_wrong = [{name: {**args, key: "certainly not this"}}] + oracle[1:]
    two_wrong = [{name: {k: "certainly not this" for k in args}}] + oracle[1:]
    texts = {
        "oracle": _text(oracle),
        "one value wrong": _text(one_wrong),
        "every value of a call wrong": _text(two_wrong),
        "a call missing": _text(oracle[:-1]),
        "a call too many": _text(oracle + oracle[:1]),
        "wrong function names": _text([{n + "_x": a} for c in oracle for n, a in c.items()]),
        "no call": "I cannot help with that.",
        "malformed": '<tool_call>{"name": oops</tool_call>',
    }
    credit = {}
    for label, text in texts.items():
        runner = RolloutRunner(lambda: toolgym.make("bfcl-v0").unwrapped, FixedAgent(text), progress=False)
        (traj,) = runner.run([task])
        assert traj.reward == float(label == "oracle") and traj.outcome == (Outcome.PASSED if label == "oracle" else Outcome.FAILED), label
        credit[label] = traj.verdict.details.get("partial_credit")
    assert credit["oracle"] is None  # a pass needs no partial credit
    n, k = len(oracle), len(args)
    assert credit["a call missing"] == pytest.approx((n - 1) / n)
    assert credit["a call too many"] == pytest.approx(n / (n + 1))
    assert credit["one value wrong"] == pytest.approx((n - 1 + k / (k + 1)) / n)
    assert 0 < credit["every value of a call wrong"] < credit["one value wrong"] < 1
    assert credit["wrong function names"] == credit["no call"] == credit["malformed"] == 0.0
    irrelevant = _entry(suite, "irrelevance")
    fn = irrelevant.hidden.scorer_args["functions"][0]["name"]
    (called,) = RolloutRunner(lambda: toolgym.make("bfcl-v0").unwrapped, FixedAgent(_text([{fn: {}}])), progress=False).run([irrelevant])
    assert called.outcome == Outcome.FAILED and called.verdict.details["partial_credit"] == 0.0
