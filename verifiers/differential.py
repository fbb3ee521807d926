"""Differential checks of mined tasks: the agent's function against the pristine one's behaviour,
decided where no agent code runs.

A package's own tests must import the agent's code, so whatever they report comes from a process
the agent's code controls: from inside it, code can tell a sentinel from a real test and forge
one but not the other. Differential checks do not depend on that process. At mining time the
miner calls the pristine function on recorded inputs (calls the passing tests made, plus
generated inputs of the same types) and stores what it did as data: the value it returned or the
items it yielded, the exception it raised, the state of its arguments after the call. At grading:

1. a probe process in a fresh grading sandbox (the agent's workspace) calls the agent's function
   on the same inputs and prints what it observed as plain data (`probe_runner.py`); that sandbox
   never holds an expected value, so nothing printed there is more than the code could compute;
2. the host compares those records with the stored ones, reading them with `ast.literal_eval`
   (no code of the agent's runs in the deciding process), type by type (1, 1.0 and True differ).

A missing, malformed or forged record is the agent's failure. The inputs are data too: repr texts
of builtin values, or pickles made by the miner from the pristine package (a method's `self`).
"""

from __future__ import annotations

import json
import secrets

from toolgym.sandbox import Sandbox
from toolgym.tasks import DifferentialCase
from toolgym.verifiers._grader.records import matches, parse_probe_records, read_value, same
from toolgym.verifiers.judge import grader_source
from toolgym.verifiers.verdict import TestResult

#: The probe process's environment: one hash seed for the miner's records and every grading.
PROBE_ENV = {"PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1"}

#: Seconds one case may take in the probe process (the pristine code's tests run in under 2 s).
PER_CASE_S = 3.0

#: Turns whatever the call produced into builtin data: values of builtin types as they are,
#: iterators as the first 1000 items, other objects as their type and attributes; floats that
#: `repr` cannot read back as tagged strings. Runs in the probe process (agent code), so it only
#: describes; the host decides.
_OBSERVE = """def _observe(x, d=0):
    t = type(x)
    if t is float and (x != x or x in (float("inf"), float("-inf"))):
        return ["float", repr(x)]
    if t in (bool, int, float, str, bytes, type(None)):
        return x
    if d > 12:
        return ["deep"]
    if t in (list, tuple):
        return t(_observe(v, d + 1) for v in x)
    if t is dict:
        return ["dict", [[_observe(k, d + 1), _observe(v, d + 1)] for k, v in x.items()]]
    if t in (set, frozenset):
        return ["set", sorted((_observe(v, d + 1) for v in x), key=repr)]
    name = t.__module__ + "." + t.__qualname__
    attrs = getattr(x, "__dict__", None)
    if type(attrs) is dict:
        return ["object", name, _observe(dict(attrs), d + 1)]
    return ["opaque", name]
"""

_CALL = """import importlib, itertools
_target = importlib.import_module({module!r})
for _name in {qualname!r}.split("."):
    _owner, _target = _target, getattr(_target, _name)
    _raw = vars(_owner).get(_name) if isinstance(_owner, type) else None
    if isinstance(_raw, (classmethod, staticmethod)):
        _target = _raw.__func__
    elif isinstance(_raw, property):
        _target = _raw.fget
{args}
try:
    _value = _target(*args, **kwargs)
    if hasattr(type(_value), "__next__") and not isinstance(_value, (str, bytes)):
        _value = ["yield", list(itertools.islice(_value, 1000))]
    else:
        _value = ["return", _value]
except Exception as _err:
    _value = ["raise", type(_err).__module__ + "." + type(_err).__qualname__]
result = _observe([_value, args, kwargs])
"""


def module_name(path: str, import_root: str) -> str | None:
    """The import name of the source file `path` under `import_root`, or None if not importable."""
    root = "" if import_root in (".", "") else import_root.strip("/") + "/"
    if not path.endswith(".py") or not path.startswith(root):
        return None
    parts = path[len(root) : -3].split("/")
    if parts[-1] == "__init__":
        parts = parts[:-1]
    if not parts or not all(p.isidentifier() for p in parts):
        return None
    return ".".join(parts)


def case_code(module: str, qualname: str, args: tuple | list, import_root: str = ".") -> str:
    """Probe code that calls `module.qualname` on one recorded input (`args`: ["repr", text of
    [positional, keywords]], or ["pickle", base64 of that pair] with an optional third item, the
    repr of [[position, value]...], [[name, value]...]] to change after unpickling) and binds
    `result`."""
    kind, text = args[0], args[1]
    if kind == "repr":
        load = f"args, kwargs = {text}"
    elif kind == "pickle":
        load = f"import base64, pickle\nargs, kwargs = pickle.loads(base64.b64decode({text!r}))"
        if len(args) > 2:  # a generated input: builtin-data arguments changed after unpickling
            load += (
                f"\n_by_position, _by_name = {args[2]}\nfor _i, _v in _by_position:\n    args[_i] = _v\n"
                "for _k, _v in _by_name:\n    kwargs[_k] = _v"
            )
    else:
        raise ValueError(f"unknown argument encoding {kind!r}")
    path = "" if import_root in (".", "") else f"import sys\nsys.path.insert(0, {('/workspace/' + import_root.strip('/'))!r})\n"
    return path + _OBSERVE + _CALL.format(module=module, qualname=qualname, args=load)


def probe_files(cases: list[DifferentialCase] | tuple[DifferentialCase, ...], per_case_s: float = PER_CASE_S) -> tuple[str, dict[str, str]]:
    """(command, files): what a grading sandbox needs to run `cases` (inputs only, never the
    expected results), each within `per_case_s`; the command prints one record per case."""
    folder = f".toolgym-diff-{secrets.token_hex(6)}"
    spec = {"per_probe_s": per_case_s, "probes": [{"id": c.id, "code": c.code} for c in cases]}
    files = {f"{folder}/run.py": grader_source("probe_runner.py"), f"{folder}/cases.json": json.dumps(spec)}
    # `-s -P` and no -E: isolated like `-I` (no user site, no script directory on the path) but
    # with PROBE_ENV's fixed hash seed, so a result that follows set order is the same at mining
    # and at grading (the exec's environment is the grader's alone)
    return f"python3 -s -P {folder}/run.py {folder}/cases.json", files


def run_cases(box: Sandbox, cases: list[DifferentialCase], timeout_s: float, per_case_s: float = PER_CASE_S) -> dict[str, dict]:
    """Run `cases` in `box` (the miner's own sandbox) and return their records by case id."""
    command, files = probe_files(cases, per_case_s)
    for path, text in files.items():
        box.write_file(path, text)
    try:
        res = box.exec(command, timeout_s=timeout_s, env=PROBE_ENV)
    finally:
        box.exec(f"rm -rf {command.split()[2].split('/')[0]}")
    return parse_probe_records(res.stdout)


def judge(cases: tuple[DifferentialCase, ...], records: dict[str, dict]) -> list[TestResult]:
    """One result per case: the agent's record read as data and compared with the recorded one."""
    results = []
    for case in cases:
        record = records.get(case.id)
        name = f"differential::{case.id}"
        if record is None:
            results.append(TestResult(name=name, passed=False, message="no result: the call did not finish"))
            continue
        if "value" not in record:
            results.append(
                TestResult(name=name, passed=False, message=f"{record.get('error', 'error')}: {record.get('message', '')[:120]}")
            )
            continue
        passed = matches(record, case.expected)
        results.append(
            TestResult(name=name, passed=passed, message="" if passed else f"differs from the pristine behaviour on input {case.id}")
        )
    return results


__all__ = ["PER_CASE_S", "PROBE_ENV", "case_code", "judge", "module_name", "probe_files", "read_value", "run_cases", "same"]
