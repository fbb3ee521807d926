"""Probe records as data: read from a probe process's output and compared, never executed.

Shared by the host's graders (`verifiers/differential.py`, `verifiers/hidden_tests.py`) and by
the grader a Harbor export carries (`harbor_grade.py`). Standard library only.
"""

import ast
import json


def parse_probe_records(stdout):
    """{probe id: record} from the runner's JSON lines; the first well-formed record per id wins
    and anything else on the stream is ignored."""
    records = {}
    for line in stdout.splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if (isinstance(rec, dict) and isinstance(rec.get("id"), str) and rec["id"] not in records
                and (isinstance(rec.get("value"), str) or isinstance(rec.get("error"), str))):
            records[rec["id"]] = {k: str(rec[k])[:100_000] for k in ("value", "error", "message") if k in rec}
    return records


def read_value(text):
    """(True, value) for a record's text that reads back as builtin data, else (False, None)."""
    try:
        return True, ast.literal_eval(text)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False, None


def same(a, b):
    """Equal values of equal types, all the way down (1, 1.0 and True are three answers)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return a == b


def matches(record, expected):
    """True if a probe record holds a value equal, type by type, to the `expected` record text."""
    if not record or "value" not in record:
        return False
    ok, got = read_value(record["value"])
    return ok and same(got, read_value(expected)[1])
