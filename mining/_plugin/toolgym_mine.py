"""pytest plugin the miner loads (`-p toolgym_mine`): per-test outcomes and, optionally, coverage.

Runs inside the mining sandbox over trusted code (the pristine project or one of our own
mutants), never at grading time. Writes one JSON line per test to `$TOOLGYM_MINE_OUT`:
`{"nodeid", "outcome", "duration", "message", "covers"}` (outcome: passed, failed, error,
skipped or timeout), where `covers` lists the functions of
the project's source (not its tests) that the test called, as "relpath::qualname", when
`$TOOLGYM_MINE_COVER` names the source root.

With `$TOOLGYM_MINE_CALLS` naming a file that lists functions of the project's source, one
"relpath::qualname" per line, every call of those functions made while a test runs is captured
for differential grading in the same run: one JSON line per distinct call to
`$TOOLGYM_MINE_CALLS_OUT`, `{"function", "test", "args", "view"}`, where
`args` is ["repr", text] when the positional and keyword arguments are builtin data whose `repr`
reads back, else ["pickle", base64] when they pickle (a method's `self` included) without naming
a test module; then `view` shows which of them are builtin data (see `_view`). Standard library only.
"""

import base64
import json
import os
import pickle
import pickletools
import signal
import sys

import pytest

_OUT = os.environ.get("TOOLGYM_MINE_OUT")
_ROOT = os.environ.get("TOOLGYM_MINE_COVER")
_TESTS = tuple(p for p in os.environ.get("TOOLGYM_MINE_TESTS", "").split(":") if p)
_records = {}
_current = set()
_cache = {}
_CALLS = os.environ.get("TOOLGYM_MINE_CALLS", "")
_calls = {}  # (function, test, kind, text) -> the builtin-data view of a pickled call's arguments, in first-seen order
_per_test = {}  # (function, test) -> calls seen
_test = [""]
_PLAIN = (bool, int, float, complex, str, bytes, type(None))
# calls of one function captured per test at most (the distinct ones kept): a function called in
# a hot loop costs no more than this many argument captures
_MAX_CALLS_PER_TEST = 64
_MAX_ARGS_CHARS = 4000
# With `$TOOLGYM_MINE_TEST_LIMIT` (seconds), a test whose call runs longer is stopped there and
# recorded as "timeout": a test too slow to use, or a mutant that loops, costs that long and no
# more (the sandbox's own timeout stays the backstop for code a signal cannot interrupt).
_LIMIT = float(os.environ.get("TOOLGYM_MINE_TEST_LIMIT") or 0)
_timed_out = set()


class _TestTimeout(Exception):
    """Raised in a test that ran past `$TOOLGYM_MINE_TEST_LIMIT`."""


def _on_alarm(signum, frame):
    _timed_out.add(_test[0])
    raise _TestTimeout(f"the test ran past {_LIMIT} s")


def _plain(value, depth=0):
    """Builtin data of exact builtin types whose `repr` reads back as the same value."""
    kind = type(value)
    if depth > 20:
        return False
    if kind is float:
        return value == value and value not in (float("inf"), float("-inf"))
    if kind is complex:
        return False
    if kind in _PLAIN:
        return True
    if kind in (list, tuple):
        return all(_plain(v, depth + 1) for v in value)
    if kind is dict:
        return all(_plain(k, depth + 1) and _plain(v, depth + 1) for k, v in value.items())
    return False


def _call_args(frame):
    """(positional, keyword) arguments of the call that `frame` starts."""
    code, values = frame.f_code, frame.f_locals
    names = code.co_varnames
    n, kwonly = code.co_argcount, code.co_kwonlyargcount
    positional = [values[v] for v in names[:n]]
    kwargs = {v: values[v] for v in names[n:n + kwonly] if v in values}
    i = n + kwonly
    if code.co_flags & 0x04:  # *args
        positional += list(values[names[i]])
        i += 1
    if code.co_flags & 0x08:  # **kwargs
        kwargs.update(values[names[i]])
    return positional, kwargs


def _unusable_pickle(data):
    """True if a pickle may import from a test module (absent or different when graded), or names
    the `time` or `datetime` module: a clock inside the arguments (a TTL cache's timer) makes the
    result depend on when the call runs, and grading runs long after mining. A string argument
    that merely looks like one of these only costs that call its check."""
    for _, arg, _ in pickletools.genops(data):
        if isinstance(arg, str) and (arg.startswith(("test", "conftest")) or ".test" in arg or "tests." in arg
                                     or arg in ("time", "datetime")):
            return True
    return False


def _view(positional, kwargs):
    """repr of the arguments with each one that is not builtin data replaced by ["x"] (the others
    as ["v", value]): what a generated input may change in a pickled call."""
    slot = lambda v: ["v", v] if _plain(v) else ["x"]
    return repr([[slot(v) for v in positional], {k: slot(v) for k, v in kwargs.items()}])


def _capture(frame, function):
    seen = _per_test.get((function, _test[0]), 0)
    if seen >= _MAX_CALLS_PER_TEST:
        return
    _per_test[(function, _test[0])] = seen + 1
    try:
        positional, kwargs = _call_args(frame)
        if _plain(positional) and _plain(kwargs):
            text = repr([positional, kwargs])
            kind = "repr"
        else:
            data = pickle.dumps((positional, kwargs), protocol=4)
            if len(data) > _MAX_ARGS_CHARS:
                return
            kind, text = "pickle", base64.b64encode(data).decode()
        key = (function, _test[0], kind, text)
        if len(text) > _MAX_ARGS_CHARS or key in _calls:
            return
        # the slow checks only for a call not seen before
        if kind == "pickle" and _unusable_pickle(data):
            return
        _calls[key] = _view(positional, kwargs) if kind == "pickle" else None
    except Exception:  # an argument that cannot be captured: that call is not a check
        return


def _wanted_functions():
    """{(absolute file, qualname): "relpath::qualname"} of the functions whose calls are captured."""
    if not _CALLS:
        return {}
    with open(_CALLS) as f:
        names = [line.strip() for line in f if "::" in line]
    return {("/workspace/" + n.partition("::")[0], n.partition("::")[2]): n for n in names}


_WANTED = _wanted_functions()
_targets = {}  # code object -> its name in _WANTED, or "" (cached: one dict lookup per call)


def _call_target(frame, event, arg):
    code = frame.f_code
    name = _targets.get(code)
    if name is None:
        name = _targets[code] = _WANTED.get((code.co_filename, code.co_qualname), "")
    if name:
        _capture(frame, name)


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
    _test[0] = item.nodeid
    if _ROOT:
        sys.settrace(_trace)
    elif _CALLS:
        sys.settrace(_call_target)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    if _LIMIT:
        signal.signal(signal.SIGALRM, _on_alarm)
        signal.setitimer(signal.ITIMER_REAL, _LIMIT)
    try:
        yield
    finally:
        if _LIMIT:
            signal.setitimer(signal.ITIMER_REAL, 0)


def pytest_runtest_teardown(item):
    if _ROOT or _CALLS:
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
    if report.nodeid in _timed_out:
        rec["outcome"] = "timeout"
    if report.when == "teardown" and _ROOT:
        rec["covers"] = sorted(_current)


def pytest_sessionfinish(session, exitstatus):
    calls_out = os.environ.get("TOOLGYM_MINE_CALLS_OUT")
    if calls_out:
        with open(calls_out, "w") as f:
            for (function, test, kind, text), view in _calls.items():
                f.write(json.dumps({"function": function, "test": test, "args": [kind, text], "view": view}) + "\n")
    if _OUT:
        with open(_OUT, "w") as f:
            for rec in _records.values():
                f.write(json.dumps(rec) + "\n")
