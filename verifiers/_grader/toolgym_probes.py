"""Stage 2 of hidden-test grading: what hidden pytest tests use to read the probes' results.

This module runs in the judging sandbox, which holds only the hidden tests, this file and the
probe results: no file of the agent's workspace and no process that ran agent code. Values
arrive as the `repr` of builtin data and are parsed with `ast.literal_eval` (which executes
nothing), so a result can never be an object that compares equal to anything.

    from toolgym_probes import probe, assert_same

    def test_sum_to_3():
        out, args = probe("case_0")       # the probe bound result = [sum_to(3), [3]]
        assert_same(out, 6)               # exact types: True is not 1, 6.0 is not 6
        assert_same(args, [3])            # the inputs were not mutated
"""

import ast
import json
import math
import os

_HERE = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(_HERE, "probe_results.json")) as _f:
    RESULTS = json.load(_f)


def probe(probe_id):
    """The value a probe produced; fails the test if the probe raised, timed out or is missing."""
    record = RESULTS.get(probe_id)
    if record is None:
        raise AssertionError(f"probe {probe_id} produced no result: the code under test crashed or exited")
    if "error" in record:
        raise AssertionError(f"probe {probe_id} raised {record['error']}: {record.get('message', '')}")
    try:
        return ast.literal_eval(record["value"])
    except (ValueError, SyntaxError, MemoryError, RecursionError) as err:
        raise AssertionError(f"probe {probe_id} returned data that is not a plain literal ({err})") from None


def raised(probe_id):
    """The exception name a probe raised, or None if it returned a value."""
    record = RESULTS.get(probe_id)
    if record is None:
        raise AssertionError(f"probe {probe_id} produced no result: the code under test crashed or exited")
    return record.get("error")


def same(got, want, rel_tol=1e-9, abs_tol=1e-9):
    """Equal with exact types at every level (floats within a tolerance)."""
    if type(got) is not type(want):
        return False
    if isinstance(want, float):
        return math.isclose(got, want, rel_tol=rel_tol, abs_tol=abs_tol) or (math.isnan(got) and math.isnan(want))
    if isinstance(want, (list, tuple)):
        return len(got) == len(want) and all(same(a, b, rel_tol, abs_tol) for a, b in zip(got, want))
    if isinstance(want, dict):
        return got.keys() == want.keys() and all(same(got[k], want[k], rel_tol, abs_tol) for k in want)
    return got == want


def assert_same(got, want):
    """`same`, with a message naming both values and their types."""
    assert same(got, want), f"got {got!r} ({type(got).__name__}), expected {want!r} ({type(want).__name__})"
