"""Differential checks for a mined task: inputs of the mutated function and the pristine results.

The miner traces every call the covering tests make into the function (on the pristine tree,
once per package for all candidate functions: `pytest_run.capture_calls`),
adds generated inputs of the same types (empty, shorter, longer, negated, reversed), and calls
the pristine function and the mutant on each input (`record_inputs`, as soon as the mutant breaks
a test: a mutant that no input the agent could be kept from seeing tells apart is dropped before
its grading copies are built); the inputs kept are recorded again, in the
order grading calls them, twice in separate processes (with the grader's fixed hash seed: a
result that varies anyway, with time, randomness, addresses or the calls before it, is not a
check). What it keeps is data:
the input, the pristine record, where the input came from, and whether the mutant differs on it.
Grading compares the agent's function with those records outside the test process
(`verifiers/differential.py`).

A task is kept only if some input that the agent never sees (generated, or from the withheld
test) tells the mutant from the pristine code, so a fix that special-cases what the agent saw
cannot pass, even together with forged test results.
"""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass

import numpy as np

from toolgym.mining.testfiles import base_name
from toolgym.sandbox import Sandbox
from toolgym.tasks import DifferentialCase
from toolgym.verifiers.differential import PER_CASE_S, case_code, module_name, read_value, run_cases

TRACED_MAX = 32
GENERATED_MAX = 24
KEEP_DISTINGUISHING = 12
KEEP_OTHERS = 8
PRISTINE_RUNS = 2
MAX_EXPECTED_CHARS = 20_000
#: A case must finish within this at mining, a third of what grading allows it (`PER_CASE_S`):
#: a correct fix graded on a busy machine must not fail a check for want of time.
MINING_PER_CASE_S = PER_CASE_S / 3


def _variants(value) -> list:
    """Nearby values of the same type (the shapes bugs hide in: empty, boundary, longer)."""
    kind = type(value)
    if kind is str:
        return ["", value[:1], value + value, value.upper(), value[::-1]]
    if kind is bool:
        return [not value]
    if kind is int:
        return [0, 1, -1, value + 1, value - 1, 2 * value, -value]
    if kind is float:
        return [0.0, -value, value * 2.5, value + 0.5]
    if kind in (list, tuple):
        return [kind(), kind(reversed(value)), value[:1], value + value]
    return []


def _slots(key: tuple, view: str | None) -> tuple[list, dict]:
    """The builtin-data arguments of a recorded call, by position and by name (a pickled call's
    from its view; the others cannot be changed from outside)."""
    if key[0] == "repr":
        positional, keywords = ast.literal_eval(key[1])
        return dict(enumerate(positional)), dict(keywords)
    if not view:
        return {}, {}
    positional, keywords = ast.literal_eval(view)
    return ({j: s[1] for j, s in enumerate(positional) if s[0] == "v"}, {k: s[1] for k, s in keywords.items() if s[0] == "v"})


def generated_inputs(calls: list[tuple[tuple, str | None]], rng: np.random.Generator, limit: int) -> list[tuple]:
    """Up to `limit` new inputs, each a recorded call (its args key and view) with one builtin-data
    argument changed: ("repr", text) for a call of builtin data, ("pickle", base64, overrides)
    for a pickled one (the override applied after unpickling)."""
    out: dict[tuple, None] = {}
    seen = {key for key, _ in calls}
    order = rng.permutation(len(calls)) if calls else []
    for _ in range(3):
        for i in order:
            key, view = calls[i]
            positional, keywords = _slots(key, view)
            slots = [("p", j) for j in positional] + [("k", k) for k in keywords]
            if not slots:
                continue
            where, name = slots[int(rng.integers(0, len(slots)))]
            options = _variants(positional[name] if where == "p" else keywords[name])
            if not options:
                continue
            new = options[int(rng.integers(0, len(options)))]
            if key[0] == "repr":
                args, kwargs = ast.literal_eval(key[1])
                if where == "p":
                    args[name] = new
                else:
                    kwargs[name] = new
                made: tuple = ("repr", repr([args, kwargs]))
            else:
                made = ("pickle", key[1], repr([[[name, new]], []] if where == "p" else [[], [[name, new]]]))
            if made not in seen and made not in out and len(made[-1]) < 4000:
                out[made] = None
            if len(out) >= limit:
                return list(out)
    return list(out)


def callable_from_outside(path: str, function: str, import_root: str) -> bool:
    """Whether a probe process can import and call `function` of the source file `path`."""
    return module_name(path, import_root) is not None and "<locals>" not in function


@dataclass(frozen=True)
class Recording:
    """A mutant's differential inputs recorded once, before its grading copies are built: each
    case that gave data, with the pristine record and whether the mutant differs (a traced case's
    origin is settled later, when the withheld test is known), and the tests that made each
    traced input."""

    cases: tuple[DifferentialCase, ...]
    tests: dict[str, frozenset[str]]  # traced case id -> node ids of the tests that called with it

    def could_hide(self, broken: list[str]) -> bool:
        """Whether some input that tells the bug could stay unseen: a generated one, or one that
        only `broken` tests make (the withheld test is drawn from them). If not, no choice of a
        withheld test gives the task a hidden check: the miner drops it before any grading copy."""
        names = {(n.split("::")[0], base_name(n)) for n in broken}
        return any(
            c.distinguishes and (c.origin == "generated" or all((t.split("::")[0], base_name(t)) in names for t in self.tests[c.id]))
            for c in self.cases
        )


def record_inputs(
    box: Sandbox,
    import_root: str,
    path: str,
    function: str,
    pristine: str,
    mutant: str,
    calls: list[dict],
    rng: np.random.Generator,
    timeout_s: float,
) -> Recording | str:
    """The mutant's differential inputs (traced calls and generated ones) recorded on the pristine
    function and the mutant, or why it cannot have a differential check. `box` holds the pristine
    tree (and holds it again on return); `calls` are the function's calls recorded from the
    covering tests on the pristine tree (`capture_calls`)."""
    if not callable_from_outside(path, function, import_root):
        return "no differential check (the function cannot be called from outside)"
    module = module_name(path, import_root)
    tests: dict[tuple, set[str]] = {}
    views = {tuple(call["args"]): call.get("view") for call in calls}
    for call in calls:
        tests.setdefault(tuple(call["args"]), set()).add(call["test"])
    traced = list(tests)
    if len(traced) > TRACED_MAX:
        traced = [traced[i] for i in sorted(rng.choice(len(traced), TRACED_MAX, replace=False))]
    generated = generated_inputs([(key, views.get(key)) for key in traced], rng, GENERATED_MAX)
    inputs = [(key, "visible") for key in traced] + [(key, "generated") for key in generated]
    if not inputs:
        return "no differential check (no call of the function could be recorded)"
    cases = [
        DifferentialCase(id=f"c{i}", code=case_code(module, function, key, import_root), expected="", origin=origin)
        for i, (key, origin) in enumerate(inputs)
    ]
    kept = _recorded(box, path, pristine, mutant, cases, timeout_s, runs=1)
    if not any(c.distinguishes for c in kept):
        return "no hidden differential check (no input tells the bug from the fix)"
    made_by = {f"c{i}": frozenset(tests[key]) for i, key in enumerate(traced)}
    return Recording(tuple(kept), {c.id: made_by[c.id] for c in kept if c.id in made_by})


def build_cases(
    box: Sandbox,
    path: str,
    pristine: str,
    mutant: str,
    recording: Recording,
    withheld: dict[str, list[str]],
    rng: np.random.Generator,
    timeout_s: float,
) -> tuple[DifferentialCase, ...] | str:
    """The task's differential checks from `recording`, or why it cannot have any. `withheld`
    maps a test file to the test functions the workspace does not show; `box` holds the pristine
    tree (and holds it again on return)."""

    def origin(case: DifferentialCase) -> str:
        if case.origin == "generated":
            return "generated"
        # an input some visible test makes is visible
        hidden = all(base_name(t) in withheld.get(t.split("::")[0], ()) for t in recording.tests[case.id])
        return "withheld" if hidden else "visible"

    kept = [c.model_copy(update={"origin": origin(c)}) for c in recording.cases]
    if not any(c.distinguishes and c.origin != "visible" for c in kept):
        return "no hidden differential check (no unseen input tells the bug from the fix)"
    telling = [c for c in kept if c.distinguishes]
    others = [c for c in kept if not c.distinguishes]
    # the unseen inputs that tell the bug first, so the cap never drops all of them
    telling.sort(key=lambda c: c.origin == "visible")
    chosen = telling[:KEEP_DISTINGUISHING] + [others[i] for i in sorted(rng.permutation(len(others))[:KEEP_OTHERS])]
    order = rng.permutation(len(chosen))
    final = [chosen[j].model_copy(update={"id": f"d{n}", "expected": ""}) for n, j in enumerate(order)]
    # Recorded again as graded: these calls, in this order, in one process. A result that depends
    # on what ran before it in the process (a counter, a cache) changes here and is not a check.
    again = {c.id: c for c in _recorded(box, path, pristine, mutant, final, timeout_s)}
    before = {f"d{n}": chosen[j] for n, j in enumerate(order)}
    final = [again[c.id] for c in final if c.id in again and again[c.id].expected == before[c.id].expected]
    if not any(c.distinguishes and c.origin != "visible" for c in final):
        return "no hidden differential check (the telling results depend on the order of the calls)"
    return tuple(final)


def _recorded(
    box: Sandbox, path: str, pristine: str, mutant: str, cases: list[DifferentialCase], timeout_s: float, runs: int = PRISTINE_RUNS
) -> list[DifferentialCase]:
    """`cases` with the pristine function's records as `expected` and whether the mutant differs;
    a case whose `runs` pristine runs disagree, give no data, or (generated) raise is left out."""
    pristine_runs = [run_cases(box, cases, timeout_s, MINING_PER_CASE_S) for _ in range(runs)]
    box.write_file(path, mutant)
    try:
        mutant_run = run_cases(box, cases, timeout_s)  # as graded: the unfixed code gets grading's time
    finally:
        box.write_file(path, pristine)
    kept: list[DifferentialCase] = []
    for case in cases:
        records = [run.get(case.id) for run in pristine_runs]
        texts = {json.dumps(r, sort_keys=True) for r in records}
        if len(texts) != 1 or records[0] is None or "value" not in records[0]:
            continue  # no result, not data, or not the same every time: not a check
        expected = records[0]["value"]
        ok, value = read_value(expected)
        if not ok or len(expected) > MAX_EXPECTED_CHARS:
            continue
        if case.origin == "generated" and value[0][0] == "raise":
            continue  # a generated input may lie outside the function's contract: only results count
        got = mutant_run.get(case.id)
        distinguishes = got is None or got.get("value") != expected
        kept.append(case.model_copy(update={"expected": expected, "distinguishes": distinguishes}))
    return kept


__all__ = ["Recording", "build_cases", "callable_from_outside", "generated_inputs", "record_inputs"]
