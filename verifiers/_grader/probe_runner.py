"""Stage 1 of hidden-test grading: run the probes against the agent's code, emit plain data.

Runs inside the grading sandbox as `python3 -I probe_runner.py PROBES.json` with the workspace
as working directory. This process imports the agent's code, so nothing it prints is trusted
beyond what the code under test could compute anyway: it never sees an expected value, and the
judge (stage 2, another sandbox) accepts only builtin values of exact types, parsed with
`ast.literal_eval`. One JSON line per probe goes to the original stdout; the agent's own prints
are sent to stderr so they cannot interleave with the records.

Standard library only; everything it needs is imported before the workspace joins `sys.path`.
It reads and writes JSON with `_json`, the C half of `json`, and sets its alarm with `_signal`:
the full modules import `re` and `enum`, a third of this process's start-up (every grading pays it).
"""

import _json
import _signal
import os
import sys

PLAIN_SCALARS = (bool, int, float, complex, str, bytes, type(None))
PLAIN_CONTAINERS = (list, tuple, set, frozenset)


def is_plain(value, depth=0):
    """True for builtin values of exact builtin types only (no subclasses, no custom objects)."""
    if depth > 50:
        return False
    kind = type(value)
    if kind in PLAIN_SCALARS:
        return True
    if kind in PLAIN_CONTAINERS:
        return all(is_plain(item, depth + 1) for item in value)
    if kind is dict:
        return all(is_plain(k, depth + 1) and is_plain(v, depth + 1) for k, v in value.items())
    return False


class _Decoding:
    """What `_json.make_scanner` reads from a decoder: plain JSON, nothing hooked."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = float  # NaN, Infinity, -Infinity


def load_json(text):
    """The JSON value `text` holds (the probe spec, written by the host)."""
    value, end = _json.make_scanner(_Decoding())(text, len(text) - len(text.lstrip()))
    if text[end:].strip():
        raise ValueError("extra data after the probe spec")
    return value


def dump_record(record):
    """One record (a dict of strings) as a line of ASCII JSON, exactly as `json.dumps` writes it."""
    enc = _json.encode_basestring_ascii
    return "{" + ", ".join(enc(k) + ": " + enc(v) for k, v in record.items()) + "}\n"


class ProbeTimeout(Exception):
    """One probe ran past its time budget."""


def _alarm(signum, frame):
    raise ProbeTimeout("probe ran past its time budget")


def main():
    with open(sys.argv[1]) as f:
        spec = load_json(f.read())
    per_probe_s = float(spec.get("per_probe_s", 10))
    out = os.dup(1)
    os.dup2(2, 1)  # the agent's prints go to stderr
    sys.stdout = sys.stderr
    sys.path.insert(0, os.getcwd())
    _signal.signal(_signal.SIGALRM, _alarm)
    for probe in spec["probes"]:
        scope = {"__name__": "__toolgym_probe__"}
        record = {"id": probe["id"]}
        try:
            _signal.setitimer(_signal.ITIMER_REAL, per_probe_s)
            try:
                exec(compile(probe["code"], "<probe %s>" % probe["id"], "exec"), scope)
            finally:
                _signal.setitimer(_signal.ITIMER_REAL, 0)
            value = scope.get("result")
            if is_plain(value):
                record["value"] = repr(value)
            else:
                record["error"] = "NotPlainData"
                record["message"] = "result is a %s, not builtin data" % type(value).__name__
        except BaseException as err:  # SystemExit and KeyboardInterrupt included: each is a failed probe
            record["error"] = type(err).__name__ if type(err).__module__ == "builtins" else "Exception"
            record["error"] = "Timeout" if isinstance(err, ProbeTimeout) else record["error"]
            try:
                record["message"] = str(err)[:200]
            except BaseException:
                record["message"] = "(unprintable)"
        os.write(out, dump_record(record).encode())


if __name__ == "__main__":
    main()
