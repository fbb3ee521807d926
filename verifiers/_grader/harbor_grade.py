"""A toolgym task's grader inside a Harbor trial: `tests/test.sh` runs this after the agent ends.

    python3 -I /tests/harbor_grade.py /tests/spec.json /logs/verifier

Harbor runs its verifier in the container the agent worked in, so this is toolgym's grading
carried over as far as one container allows (the README says what that loses): the workspace
is `/workspace`; protected paths (tests, test configuration, import hooks) are put back from the
spec's pristine copies and files the agent added there are removed; then the task's kind decides:

- ``state``: the hidden checker runs against the workspace and prints JSON-line results;
- ``package-tests``: the differential probe calls the agent's function on the recorded inputs
  (no hidden test file is in the container yet) and the records are compared here, as data, with the
  pristine ones; then each grading copy runs under pytest with the grader's start-up, sentinels
  must fail and every counted test must pass.

Writes `reward.txt` (1 or 0, as Harbor reads it) and `details.json` to the output directory.
Standard library only; it never imports the workspace.
"""

import fnmatch
import json
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # /tests: ours, uploaded after the agent ended
from records import matches, parse_probe_records  # noqa: E402


def _protected(path, patterns):
    return any(path == p or path.startswith(p.rstrip("/") + "/") or fnmatch.fnmatch(path, p) for p in patterns)


def restore_protected(workspace, spec):
    """Put protected files back as they were and remove what the agent added under those paths."""
    patterns = spec["protected"]
    for root, dirs, files in os.walk(workspace):
        for name in files + dirs:
            full = os.path.join(root, name)
            rel = os.path.relpath(full, workspace)
            if _protected(rel, patterns) and rel not in spec["pristine"] and os.path.lexists(full):
                if os.path.isdir(full) and not os.path.islink(full):
                    if not any(p.startswith(rel + "/") for p in spec["pristine"]):
                        shutil.rmtree(full, ignore_errors=True)
                else:
                    os.unlink(full)
    for rel, text in spec["pristine"].items():
        full = os.path.join(workspace, rel)
        if os.path.islink(full) or os.path.isdir(full):
            shutil.rmtree(full, ignore_errors=True) if not os.path.islink(full) else os.unlink(full)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "w") as f:
            f.write(text)


def _run(cmd, timeout, env=None, cwd="/workspace"):
    try:
        return subprocess.run(cmd, shell=True, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None


def grade_state(spec, workspace, scratch):
    hidden = spec["hidden"]
    checker = os.path.join(scratch, "checker")
    for rel, text in hidden["files"].items():
        os.makedirs(os.path.dirname(os.path.join(checker, rel)), exist_ok=True)
        with open(os.path.join(checker, rel), "w") as f:
            f.write(text)
    results = os.path.join(scratch, "results.jsonl")
    cmd = (hidden.get("command") or "python3 -I {checker}/check.py {results}")
    res = _run(cmd.replace("{results}", results).replace("{checker}", checker), hidden["timeout_s"], cwd=workspace)
    if res is None or not os.path.exists(results):
        return [], "the checker did not finish"
    checks = [json.loads(line) for line in open(results) if line.strip()]
    return [(c["name"], bool(c["passed"])) for c in checks], f"{sum(c['passed'] for c in checks)}/{len(checks)} checks"


def grade_package_tests(spec, workspace, scratch):
    hidden = spec["hidden"]
    tests = []
    if hidden["differential"]:
        cases = os.path.join(scratch, "cases.json")
        with open(cases, "w") as f:
            json.dump({"per_probe_s": spec["per_case_s"],
                       "probes": [{"id": c["id"], "code": c["code"]} for c in hidden["differential"]]}, f)
        env = dict(spec["probe_env"], PATH=os.environ.get("PATH", "/usr/bin:/bin"))
        res = _run(f"python3 -s -P {spec['tests_dir']}/probe_runner.py {cases}", 60, env=env, cwd=workspace)
        records = parse_probe_records(res.stdout if res else "")
        tests += [("differential::" + c["id"], matches(records.get(c["id"]), c["expected"])) for c in hidden["differential"]]
    names = {}
    for i, run in enumerate(hidden["runs"]):  # the copies arrive only now, after the probe
        names[run["file"]] = os.path.join(os.path.dirname(run["file"]), f"test_tgharbor{i}.py")
        with open(os.path.join(workspace, names[run["file"]]), "w") as f:
            f.write(hidden["files"][run["file"]])
    ini = os.path.join(scratch, "pytest.ini")
    with open(ini, "w") as f:
        f.write(spec["pytest_ini"])
    forged = False
    for run in hidden["runs"]:
        report = os.path.join(scratch, f"junit-{len(tests)}.xml")
        env = dict(spec["test_env"], PATH=os.environ.get("PATH", "/usr/bin:/bin"))
        args = (f"-c {ini} --rootdir {workspace} -p no:cacheprovider -q --no-header -o junit_family=xunit1 "
                f"--junitxml={report} {names[run['file']]}")
        res = _run(spec["pytest_command"].replace("{args}", args), hidden["timeout_s"], env=env, cwd=workspace)
        results = {}
        try:
            module = os.path.basename(names[run["file"]])[:-3]
            for case in ET.parse(report).getroot().iter("testcase"):
                _, found, classes = case.get("classname", "").partition(module)
                if found:
                    key = "::".join([c for c in classes.split(".") if c] + [case.get("name", "")])
                    results[key] = not any(child.tag in ("failure", "error", "skipped") for child in case)
        except (OSError, ET.ParseError):
            pass
        if any(results.get(k) for k in run["sentinels"]) or (run["sentinels"] and res is not None and res.returncode == 0):
            forged = True
        tests += [(f"{run['file']}::{key}", results.get(key, False)) for key in run["passing"]]
    package_ok = all(ok for name, ok in tests if not name.startswith("differential::"))
    differing = sum(not ok for name, ok in tests if name.startswith("differential::"))
    note = ("; forged test results (a sentinel passed)" if forged else "") + \
           ("; inconsistent results (the package's tests passed, differential checks failed)"
            if package_ok and differing and not forged else "")
    return ([("sentinels", not forged)] + tests), f"{sum(ok for _, ok in tests)}/{len(tests)} hidden tests{note}"


def main():
    spec_path, out_dir = sys.argv[1], sys.argv[2]
    with open(spec_path) as f:
        spec = json.load(f)
    workspace = spec.get("workspace", "/workspace")
    scratch = os.path.join(out_dir, "scratch")
    os.makedirs(scratch, exist_ok=True)
    restore_protected(workspace, spec)
    kind = spec["hidden"]["kind"]
    if kind == "state":
        checks, reason = grade_state(spec, workspace, scratch)
    elif kind == "package-tests":
        checks, reason = grade_package_tests(spec, workspace, scratch)
    else:
        checks, reason = [], f"tasks of kind {kind!r} are not exported"
    passed = bool(checks) and all(ok for _, ok in checks)
    with open(os.path.join(out_dir, "reward.txt"), "w") as f:
        f.write("1" if passed else "0")
    with open(os.path.join(out_dir, "details.json"), "w") as f:
        json.dump({"passed": passed, "reason": reason, "checks": checks}, f, indent=1)
    shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
