"""The miner: from a package spec to verified bug-fix tasks graded by the project's own tests.

Per project: fetch and unpack the sdist, build its site layer, run its tests twice in the
sandbox (the first run with per-test coverage; tests that fail, are skipped, flip between the
runs or take over `SLOW_TEST_S` are not used), record in one more run every call the passing tests
make into the functions that could become tasks (the inputs of their differential checks; a
function with no recorded call cannot have one and is not mutated), mutate those functions, run the
covering test files against each mutant, and keep a mutant only if some passing test now fails,
the files still finish in time, and the finished task verifies (the oracle passes, the unfixed
workspace fails) under the real grader. Candidates are drawn in a seeded order; every decision
is logged to `state/<key>.jsonl`, so an interrupted run resumes where it stopped.
"""

from __future__ import annotations

import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from toolgym.mining.differential import Recording, build_cases, callable_from_outside, record_inputs
from toolgym.mining.mutate import Mutant, mutants
from toolgym.mining.project import MiningError, Project
from toolgym.mining.pytest_run import capture_calls, run_tests, runner_files
from toolgym.mining.testfiles import base_name, grading_copy, rename_key, sentinel_sources, test_key, without_tests
from toolgym.sandbox import Limits, SandboxConfig, make_sandbox
from toolgym.tasks import HiddenSpec, Task, TestRun, ToolCall
from toolgym.verifiers.package_tests import PackageTestVerifier
from toolgym.verifiers.verdict import FinalState, Outcome

SLOW_TEST_S = 2.0
SUITE_NAME = "swe-pypi"
ENV_ID = "toolgym/swe-pypi-v0"


@dataclass
class MineOptions:
    """Knobs of one mining run (defaults: the default suite's)."""

    seed: int = 0
    max_tasks: int = 32
    max_tries: int = 120
    per_function: int = 2
    f2p_max: int = 8
    p2p_per_file: int = 6
    files_max: int = 2
    sentinels_per_file: int = 2
    workers: int = 3
    #: Sandbox backends every kept task is verified on (oracle passes, unfixed workspace fails).
    backends: tuple[str, ...] = ("bwrap", "docker")


@dataclass
class ProjectReport:
    """What mining one project kept and why the rest was dropped."""

    key: str
    split: str
    license: str = ""
    tests_passing: int = 0
    tests_unused: int = 0
    candidates: int = 0
    kept: int = 0
    dropped: Counter = field(default_factory=Counter)
    operators: Counter = field(default_factory=Counter)


def _mining_config(layer: Path) -> SandboxConfig:
    return SandboxConfig(canary=False, site_layer=str(layer), limits=Limits(memory_mb=1024, pids=256, timeout_s=600, cpu_time_s=600))


def _test_dirs(project: Project) -> list[str]:
    return sorted({t.rsplit("/", 1)[0] for t in project.test_files if "/" in t})


def _protected(project: Project) -> tuple[str, ...]:
    """What the agent may not change: tests, their data, test and build configuration."""
    tops = [d for d in _test_dirs(project)]
    singles = [t for t in project.test_files if "/" not in t]
    return tuple(sorted(set(tops + singles + ["conftest.py", "**/conftest.py", "setup.py", "setup.cfg", "pyproject.toml", "tox.ini"])))


class ProjectMiner:
    """Mines one project (see the module docstring)."""

    def __init__(self, project: Project, layer: Path, split: str, options: MineOptions) -> None:
        from toolgym.sandbox.docker_pool import WarmPool

        self.p = project
        self.layer = layer
        self.split = split
        self.o = options
        self.config = _mining_config(layer)
        self.report = ProjectReport(project.key, split, project.license)
        self.workspace = {**project.files, **runner_files(project.import_root, _test_dirs(project))}
        # docker verifications start from pre-started containers that mount the project's layer
        self.pool = (
            WarmPool(SandboxConfig(backend="docker", canary=False, site_layer=str(layer)), size=2) if "docker" in options.backends else None
        )
        self._local = threading.local()
        #: set once the project's quota is full: tries still running stop before verifying
        self.stopping = threading.Event()
        self._boxes: list = []
        self._lock = threading.Lock()

    # ---- sandboxes, one per worker thread -----------------------------------------------------

    def _box(self):
        box = getattr(self._local, "box", None)
        if box is None:
            box = make_sandbox(self.workspace, self.config)
            self._local.box = box
            with self._lock:
                self._boxes.append(box)
        return box

    def close(self) -> None:
        """Close every mining sandbox and the docker pool."""
        for box in self._boxes:
            box.close()
        if self.pool is not None:
            self.pool.close()

    # ---- baseline ------------------------------------------------------------------------------

    def baseline(self) -> None:
        """Run every test twice; keep the tests that pass both times, quickly, as usable."""
        dirs = tuple(_test_dirs(self.p))

        def run(cover: bool):
            box = self._box()
            try:
                # a test slower than `SLOW_TEST_S` is not used: stop it soon after (traced tests run
                # several times slower; one slow test dominated a whole package's baseline)
                return run_tests(box, self.p.import_root, self.p.test_files, 900, cover=cover, test_dirs=dirs, test_limit_s=SLOW_TEST_S + 1)
            finally:
                box.reset()

        # the traced run and the repeat run are independent: one core each
        with ThreadPoolExecutor(2) as pool:
            first_run, second_run = pool.submit(run, True), pool.submit(run, False)
            first, second = first_run.result(), second_run.result()
        if not first.records:
            raise MiningError(f"{self.p.key}: its tests did not run in the sandbox (exit {first.exit_code}): {first.stderr[-300:]}")
        again = second.outcomes()
        self.passing = {
            nid: rec
            for nid, rec in first.records.items()
            if rec["outcome"] == "passed" and again.get(nid) == "passed" and rec["duration"] <= SLOW_TEST_S
        }
        self.report.tests_passing = len(self.passing)
        self.report.tests_unused = len(first.records) - len(self.passing)
        self.covering: dict[str, set[str]] = {}
        for nid, rec in self.passing.items():
            for fn in rec["covers"]:
                self.covering.setdefault(fn, set()).add(nid)
        self.sentinel_names = {path: sentinel_sources(self.p.files[path]) for path in self.p.test_files}
        # a file can hold sentinels if one of its passing tests can be copied into one
        self.sentinel_files = {
            nid.split("::")[0] for nid in self.passing if base_name(nid) in self.sentinel_names.get(nid.split("::")[0], ())
        }
        self.calls = self._record_calls()

    def _record_calls(self) -> dict[str, list[dict]]:
        """Every call the covering tests make into each function that could become a task (a
        function a probe can call, tested in a file that can hold sentinels), from one traced run
        on the pristine tree: "relpath::qualname" -> calls (see `capture_calls`)."""
        functions = sorted(
            fn
            for fn, tests in self.covering.items()
            if callable_from_outside(*fn.split("::", 1), self.p.import_root) and any(t.split("::")[0] in self.sentinel_files for t in tests)
        )
        if not functions:
            return {}
        box = self._box()
        targets = sorted({t.split("[")[0] for fn in functions for t in self.covering[fn]})
        try:
            captured = capture_calls(box, targets, functions, 900)
        finally:
            box.reset()
        # only calls made by the tests that cover the function (every parametrisation of them)
        calls = {}
        for fn in functions:
            tests = {t.split("[")[0] for t in self.covering[fn]}
            kept = [c for c in captured.get(fn, ()) if c["test"].split("[")[0] in tests]
            if kept:
                calls[fn] = kept
        return calls

    # ---- candidates ----------------------------------------------------------------------------

    def candidates(self) -> list[Mutant]:
        """Mutants of covered functions, in a seeded order that spreads functions and operators."""
        out: list[Mutant] = []
        for path in self.p.source_files:
            # only functions whose tests sit in a file that can hold sentinels, and whose calls
            # could be recorded, can become tasks
            wanted = {fn.split("::", 1)[1] for fn in self.calls if fn.split("::", 1)[0] == path}
            if wanted:
                try:
                    out += list(mutants(path, self.p.files[path], wanted))
                except SyntaxError:
                    continue
        rng = np.random.default_rng([self.o.seed, sum(map(ord, self.p.key))])
        order = rng.permutation(len(out))
        shuffled = [out[i] for i in order]
        # round-robin over functions so one long function does not fill the project's quota
        by_fn: dict[str, list[Mutant]] = {}
        for m in shuffled:
            by_fn.setdefault(f"{m.path}::{m.function}", []).append(m)
        spread: list[Mutant] = []
        for rank in range(max((len(v) for v in by_fn.values()), default=0)):
            spread += [v[rank] for v in by_fn.values() if rank < len(v)]
        return spread

    # ---- one mutant ----------------------------------------------------------------------------

    def try_mutant(self, index: int, m: Mutant) -> tuple[str, Task | None]:
        """("kept", the task) or (why it was dropped, None); the worker's sandbox is reset after."""
        box = self._box()
        try:
            return self._try(box, index, m)
        except Exception as err:  # a bug of ours on one candidate is recorded, not the end of a long run
            return f"miner error ({type(err).__name__}: {str(err)[:120]})", None
        finally:
            box.reset()

    def _try(self, box, index: int, m: Mutant) -> tuple[str, Task | None]:
        covering = self.covering.get(f"{m.path}::{m.function}", set())
        # Only the tests that call the function run (each test function with all its parameters):
        # a big test module is still collected, but not run, for every mutant.
        targets = sorted({nid.split("[")[0] for nid in covering})
        # the baseline durations were traced (slower): 4x and a floor for collection is ample; a
        # mutant that loops forever costs this much of a worker
        budget = max(12.0, 4 * sum(self.passing[n]["duration"] for n in covering) + 8)
        # and a test that runs far past its baseline is stopped at once (a looping mutant)
        per_test = max(3.0, 4 * max((self.passing[n]["duration"] for n in covering), default=0.0))
        box.write_file(m.path, m.text)
        res = run_tests(box, self.p.import_root, targets, budget, test_limit_s=per_test)
        if res.timed_out or "timeout" in res.outcomes().values():
            return "too slow (timed out)", None
        if not res.records:
            return "breaks collection (no test ran)", None
        outcomes = res.outcomes()
        run_passing = covering
        f2p = sorted(nid for nid in run_passing if outcomes.get(nid) != "passed")
        if not f2p:
            return "no passing test fails (equivalent or untested mutant)", None
        p2p = sorted(nid for nid in run_passing if outcomes.get(nid) == "passed")
        if self.stopping.is_set():
            return "not needed (quota full)", None
        # The differential inputs first (cheap: two probe processes): a mutant that no input the
        # agent could be kept from seeing tells apart is dropped before its grading copies are run.
        box.write_file(m.path, self.p.files[m.path])
        recording = record_inputs(
            box,
            self.p.import_root,
            m.path,
            m.function,
            self.p.files[m.path],
            m.text,
            self.calls.get(f"{m.path}::{m.function}", []),
            np.random.default_rng([self.o.seed, index, 8]),
            self._case_budget(covering),
        )
        if isinstance(recording, str):
            return recording, None
        if not recording.could_hide(f2p):
            return "no hidden differential check (only inputs of tests that still pass tell the bug)", None
        task = self._task(box, index, m, f2p, p2p, res.records, recording)
        if isinstance(task, str):
            return task, None
        if self.stopping.is_set():
            return "not needed (quota full)", None
        problem = self._verify(task)
        if problem:
            return problem, None
        return "kept", task

    def _case_budget(self, covering: set[str]) -> float:
        """Seconds a probe process of differential cases may take (generous: traced durations)."""
        return max(30.0, 4 * sum(self.passing[n]["duration"] for n in covering) + 10)

    def _task(self, box, index: int, m: Mutant, f2p: list[str], p2p: list[str], records: dict, recording: Recording) -> Task | str:
        rng = np.random.default_rng([self.o.seed, index, 7])
        covering = self.covering.get(f"{m.path}::{m.function}", set())
        by_file = Counter(nid.split("::")[0] for nid in f2p)
        files = [f for f, _ in by_file.most_common(self.o.files_max)]
        runs, copies, graded_f2p = [], {}, []
        box.write_file(m.path, self.p.files[m.path])  # observe the grading copies on the pristine tree
        for fi, path in enumerate(files):
            f2p_here = [n for n in f2p if n.startswith(path + "::")]
            f2p_here = _sample(rng, f2p_here, self.o.f2p_max)
            # pass-to-pass: tests of the function that the bug left passing, and a few of the file's
            # other tests (a fix must not break them either)
            p2p_here = _sample(rng, [n for n in p2p if n.startswith(path + "::")], self.o.p2p_per_file - 2)
            others = sorted(n for n in self.passing if n.startswith(path + "::") and n not in covering)
            p2p_here += _sample(rng, others, 2)
            with_consts = self.sentinel_names[path]
            sources = [test_key(n) for n in f2p_here + p2p_here if base_name(n) in with_consts]
            if not sources:
                extra = sorted(n for n in self.passing if n.startswith(path + "::") and base_name(n) in with_consts)
                if extra:
                    pick = extra[int(rng.integers(0, len(extra)))]
                    p2p_here.append(pick)
                    sources = [test_key(pick)]
            if not sources:
                continue
            sources = list(dict.fromkeys(sources))[: self.o.sentinels_per_file]
            keep = {test_key(n) for n in f2p_here + p2p_here}
            seed = int(rng.integers(0, 2**31))
            run = self._observe(box, path, keep, set(sources), seed, [test_key(n) for n in f2p_here])
            if run is None:
                continue
            copy_text, test_run = run
            copies[path] = copy_text
            runs.append(test_run)
            graded_f2p += f2p_here
        if not runs or not any(r.fail_to_pass for r in runs):
            return "no sentinel possible (grading copy)"
        workspace = dict(self.p.files)
        workspace[m.path] = m.text
        withheld = self._withhold(rng, graded_f2p)
        cases = build_cases(box, m.path, self.p.files[m.path], m.text, recording, withheld, rng, self._case_budget(covering))
        if isinstance(cases, str):
            return cases
        for path, names in withheld.items():
            workspace[path] = without_tests(workspace[path], set(names))
        shown = [n for n in f2p if base_name(n) not in withheld.get(n.split("::")[0], ())]
        return Task(
            env_id=ENV_ID,
            instruction=_instruction(self.p, shown, records),
            family=f"swe-pypi/{m.operator}",
            difficulty=_difficulty(len(f2p), m.function_lines),
            split=self.split,
            workspace=workspace,
            hidden=HiddenSpec(
                kind="package-tests", files=copies, runs=tuple(runs), differential=cases, protected=_protected(self.p), timeout_s=120
            ),
            oracle=(
                ToolCall(name="write_file", arguments={"path": m.path, "content": self.p.files[m.path]}),
                ToolCall(name="submit", arguments={}),
            ),
            data={"site_layer": self.layer.name},
            metadata={
                "package": self.p.name,
                "version": self.p.version,
                "license": self.p.license,
                "operator": m.operator,
                "file": m.path,
                "function": m.function,
                "line": m.line,
                "fail_to_pass": len(f2p),
                "mutant_index": index,
                "differential": {
                    "cases": len(cases),
                    "distinguishing": sum(c.distinguishes for c in cases),
                    "unseen_distinguishing": sum(c.distinguishes and c.origin != "visible" for c in cases),
                },
                "withheld_tests": {p: sorted(n) for p, n in withheld.items()},
            },
        )

    def _withhold(self, rng: np.random.Generator, graded_f2p: list[str]) -> dict[str, list[str]]:
        """One broken test function the workspace does not show, when at least two broke among
        the tests the grading copies keep (a withheld test is always graded): a fix that
        special-cases the visible failures still fails it."""
        names = sorted({(n.split("::")[0], base_name(n)) for n in graded_f2p})
        if len(names) < 2:
            return {}
        path, name = names[int(rng.integers(0, len(names)))]
        return {path: [name]}

    def _observe(self, box, path: str, keep: set[str], sources: set[str], seed: int, f2p_keys: list[str]) -> tuple[str, TestRun] | None:
        """Build the grading copy of `path`, run it on the pristine tree, and read what passes.

        Sentinels that do not fail on pristine code are removed (the copy is rebuilt without them)."""
        for _ in range(2):
            copy = grading_copy(self.p.files[path], keep, sources, seed)
            if not copy.sentinels:
                return None
            name = path.rsplit("/", 1)[0] + "/test_tgcopy.py" if "/" in path else "test_tgcopy.py"
            box.write_file(name, copy.text)
            res = run_tests(box, self.p.import_root, [name], 120)
            box.exec(f"rm -f {name}")
            keys = {test_key(nid): rec["outcome"] for nid, rec in res.records.items()}
            is_sentinel = lambda k: base_name(k) in copy.sentinels
            real = {k: o for k, o in keys.items() if not is_sentinel(k)}
            bad_sentinels = {base_name(k) for k, o in keys.items() if is_sentinel(k) and o == "passed"}
            if any(o != "passed" for o in real.values()) or not real:
                return None  # the copy changes what the tests do: do not use this file
            if bad_sentinels:  # rebuild without the tests whose copy passes on pristine code
                sources = {src for src in sources if base_name(src) not in {copy.sentinels[b] for b in bad_sentinels}}
                if not sources:
                    return None
                continue
            sentinel_keys = tuple(sorted(k for k in keys if is_sentinel(k)))
            if not sentinel_keys:
                return None
            f2p = tuple(sorted(k for k in (rename_key(k, copy.renamed) for k in f2p_keys) if k in real))
            return copy.text, TestRun(
                file=path, passing=tuple(sorted(real)), sentinels=sentinel_keys, pythonpath=(self.p.import_root,), fail_to_pass=f2p
            )
        return None

    def _verify(self, task: Task) -> str | None:
        """None if, on every backend, the oracle passes and the unfixed workspace fails under the
        real grader; else why not."""
        for backend in self.o.backends:
            verifier = PackageTestVerifier(SandboxConfig(backend=backend, canary=False), pool=self.pool if backend == "docker" else None)
            fix = task.oracle[0].arguments
            fixed = verifier.verify(task, FinalState(changes={fix["path"]: fix["content"]}))
            if fixed.outcome != Outcome.PASSED:
                return f"oracle does not pass the grader on {backend} ({fixed.outcome.value}: {fixed.reason[:80]})"
            broken = verifier.verify(task, FinalState())
            if broken.outcome != Outcome.FAILED or broken.details.get("side_effects"):
                return f"unfixed workspace does not fail cleanly on {backend} ({broken.outcome.value})"
        return None


def _sample(rng: np.random.Generator, items: list[str], n: int) -> list[str]:
    """Up to `n` of `items` (seeded), in their original order."""
    if n <= 0 or not items:
        return []
    return [items[i] for i in sorted(rng.choice(len(items), min(n, len(items)), replace=False))]


def _instruction(project: Project, f2p: list[str], records: dict) -> str:
    """The failure as a user would report it: which tests fail and how (never the diff)."""
    shown = f2p[:3]
    lines = []
    for nid in shown:
        msg = (records.get(nid, {}).get("message") or "it fails").strip()
        lines.append(f"- `{nid}`: {msg[:160]}")
    more = f" (and {len(f2p) - len(shown)} more)" if len(f2p) > len(shown) else ""
    env = "" if project.import_root == "." else f"PYTHONPATH={project.import_root} "
    test_cmd = f"{env}python3 -m pytest -q " + " ".join(sorted({n.split("::")[0] for n in f2p}))
    return (
        f"A bug was introduced into {project.name} {project.version}: some of its tests fail now{more}.\n"
        + "\n".join(lines)
        + f"\n\nFind the bug in the library's source and fix it, so that the whole test suite passes again "
        f"(`{test_cmd}`). Do not edit the tests: they are restored before grading, and hidden tests "
        "check the fix as well. Call `submit` when you are done."
    )


def _difficulty(n_f2p: int, fn_lines: int) -> int:
    return max(1, min(10, 1 + (n_f2p <= 3) + (n_f2p == 1) + (fn_lines > 15) + (fn_lines > 40) + (fn_lines > 80)))
