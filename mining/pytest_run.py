"""Run a project's tests in a sandbox and read per-test outcomes (mining only, trusted code).

The miner runs the pristine project and its own mutants, never agent code, so it may use a
reporting plugin inside the test process (`_plugin/toolgym_mine.py`); grading does not (see
`verifiers/package_tests.py`). Results are read from the host's side of the filesystem.
"""

from __future__ import annotations

import json
import secrets
import shlex
from dataclasses import dataclass, field
from importlib import resources

from toolgym.sandbox import Sandbox, SandboxError
from toolgym.verifiers.package_tests import PYTEST_PRELOAD, TEST_ENV, pytest_ini

MINE_DIR = ".toolgym-mine"
# The grader's start-up (pytest from the image's bytecode, then an empty pycache prefix: a
# mutant and the pristine file can differ by one character in the same second, and a cached .pyc
# keyed by (mtime, size) would then run the wrong code), plus the reporting plugin.
RUN_SCRIPT = (
    PYTEST_PRELOAD
    + """import os
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import toolgym_mine
sys.pycache_prefix = os.environ["TOOLGYM_MINE_PYC"]
sys.exit(pytest.main(sys.argv[1:], plugins=[toolgym_mine]))
"""
)


def runner_files(import_root: str, test_dirs: list[str]) -> dict[str, str]:
    """Files the miner adds to a mining sandbox's workspace."""
    plugin = resources.files("toolgym.mining").joinpath("_plugin", "toolgym_mine.py").read_text()
    return {
        f"{MINE_DIR}/toolgym_mine.py": plugin,
        f"{MINE_DIR}/run.py": RUN_SCRIPT,
        f"{MINE_DIR}/pytest.ini": pytest_ini((import_root,)),
        f"{MINE_DIR}/tests.txt": ":".join(test_dirs),
    }


def _pytest_command(targets: list[str]) -> str:
    # --tb=line: the message the plugin keeps is the same, and a mutant that breaks two hundred
    # tests no longer spends 18 s formatting their tracebacks (it ran into the try's time limit)
    return (
        f"python3 -I -B {MINE_DIR}/run.py -c {MINE_DIR}/pytest.ini --rootdir /workspace -p no:cacheprovider -q "
        "--no-header -rN --tb=line " + " ".join(shlex.quote(t) for t in targets)
    )


@dataclass
class RunResult:
    """Per-test outcomes of one pytest run: nodeid -> {outcome, duration, message, covers}."""

    records: dict[str, dict] = field(default_factory=dict)
    timed_out: bool = False
    exit_code: int = 0
    duration_s: float = 0.0
    stderr: str = ""

    def outcomes(self) -> dict[str, str]:
        """nodeid -> passed | failed | error | skipped | timeout."""
        return {k: v["outcome"] for k, v in self.records.items()}


def run_tests(
    box: Sandbox,
    import_root: str,
    targets: list[str],
    timeout_s: float,
    cover: bool = False,
    test_dirs: tuple[str, ...] = (),
    test_limit_s: float | None = None,
) -> RunResult:
    """Run pytest on `targets` (files or node ids) in `box`; never raises for failing tests. With
    `test_limit_s`, a test whose call runs longer is stopped and recorded as "timeout"."""
    out = f"{MINE_DIR}/out-{secrets.token_hex(4)}.jsonl"
    env = dict(TEST_ENV, TOOLGYM_MINE_OUT=f"/workspace/{out}", TOOLGYM_MINE_PYC=f"/tmp/.toolgym-pyc-{secrets.token_hex(4)}")
    if test_limit_s:
        env["TOOLGYM_MINE_TEST_LIMIT"] = f"{test_limit_s:.3f}"
    if cover:
        env["TOOLGYM_MINE_COVER"] = "/workspace" if import_root == "." else f"/workspace/{import_root}"
        env["TOOLGYM_MINE_TESTS"] = ":".join(test_dirs)
    cmd = _pytest_command(targets)
    res = box.exec(cmd, timeout_s=timeout_s, env=env)
    result = RunResult(
        timed_out=res.timed_out, exit_code=res.exit_code, duration_s=res.duration_s, stderr=(res.stderr or res.stdout)[-2000:]
    )
    try:
        text = box.read_host_bytes(out).decode("utf-8", errors="replace")
    except SandboxError:
        return result
    for line in text.splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        result.records[rec["nodeid"]] = rec
    return result


def capture_calls(box: Sandbox, targets: list[str], functions: list[str], timeout_s: float) -> dict[str, list[dict]]:
    """Every distinct call of each of `functions` ("relpath::qualname") made by the tests
    `targets`, run on the tree now in `box`, in one pytest run: {function: [{"test", "args",
    "view"}]} (see the plugin). Functions never called are absent."""
    tag = secrets.token_hex(4)
    wanted, out = f"{MINE_DIR}/wanted-{tag}.txt", f"{MINE_DIR}/calls-{tag}.jsonl"
    box.write_file(wanted, "".join(f + "\n" for f in functions))
    env = dict(
        TEST_ENV,
        TOOLGYM_MINE_CALLS=f"/workspace/{wanted}",
        TOOLGYM_MINE_CALLS_OUT=f"/workspace/{out}",
        TOOLGYM_MINE_PYC=f"/tmp/.toolgym-pyc-{tag}",
    )
    box.exec(_pytest_command(targets), timeout_s=timeout_s, env=env)
    try:
        text = box.read_host_bytes(out).decode("utf-8", errors="replace")
    except SandboxError:
        return {}
    finally:
        box.exec(f"rm -f {wanted} {out}")
    calls: dict[str, list[dict]] = {}
    for line in text.splitlines():
        try:
            call = json.loads(line)
        except ValueError:
            continue
        calls.setdefault(call.pop("function"), []).append(call)
    return calls
