"""pytest plugin the miner loads (`-p toolgym_mine`): per-test outcomes and, optionally, coverage.

Runs inside the mining sandbox over trusted code (the pristine project or one of our own
mutants), never at grading time. Writes one JSON line per test to `$TOOLGYM_MINE_OUT`:
`{"nodeid", "outcome", "duration", "message", "covers"}`, where `covers` lists the functions of
the project's source (not its tests) that the test called, as "relpath::qualname", when
`$TOOLGYM_MINE_COVER` names the source root. Standard library only.
"""

import json
import os
import sys

_OUT = os.environ.get("TOOLGYM_MINE_OUT")
_ROOT = os.environ.get("TOOLGYM_MINE_COVER")
_TESTS = tuple(p for p in os.environ.get("TOOLGYM_MINE_TESTS", "").split(":") if p)
_records = {}
_current = set()
_cache = {}


def _relevant(code):
    """'relpath::qualname' for code objects of the project's source, else None (cached)."""
    hit = _cache.get(code)
    if hit is None:
        path = code.co_filename
        hit = ""
        if path.startswith(_ROOT) and path.endswith(".py"):
            rel = os.path.relpath(path, "/workspace")
            base = os.path.basename(rel)
            if not (base.startswith("test_") or base.endswith("_test.py") or base == "conftest.py"
                    or any(rel == t or rel.startswith(t + "/") for t in _TESTS)):
                hit = rel + "::" + code.co_qualname
        _cache[code] = hit
    return hit or None


def _trace(frame, event, arg):
    # A global trace function sees only calls of Python functions (C calls never reach it, unlike
    # a profile function) and returns None, so no line is traced: cheap enough for whole suites.
    name = _relevant(frame.f_code)
    if name:
        _current.add(name)


def pytest_runtest_setup(item):
    _current.clear()
    if _ROOT:
        sys.settrace(_trace)


def pytest_runtest_teardown(item):
    if _ROOT:
        sys.settrace(None)


def pytest_runtest_logreport(report):
    rec = _records.setdefault(report.nodeid, {"nodeid": report.nodeid, "outcome": "passed", "duration": 0.0,
                                               "message": "", "covers": []})
    rec["duration"] += report.duration
    if report.failed and rec["outcome"] == "passed":
        rec["outcome"] = "failed" if report.when == "call" else "error"
        text = str(getattr(report, "longrepr", "") or "")
        lines = [ln.strip() for ln in text.splitlines() if ln.strip().startswith("E ")]
        rec["message"] = (lines[0][1:].strip() if lines else text.strip().splitlines()[-1:][0] if text.strip() else "")[:300]
    elif report.skipped and rec["outcome"] == "passed":
        rec["outcome"] = "skipped"
    if report.when == "teardown" and _ROOT:
        rec["covers"] = sorted(_current)


def pytest_sessionfinish(session, exitstatus):
    if _OUT:
        with open(_OUT, "w") as f:
            for rec in _records.values():
                f.write(json.dumps(rec) + "\n")
