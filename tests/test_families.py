"""The sandboxed families: sizes, split hygiene, and (on both backends) every oracle passes the
real verifier while doing nothing fails."""

import os
from concurrent.futures import ThreadPoolExecutor

import pytest

import toolgym
from toolgym.sandbox import SandboxConfig
from toolgym.tasks import builtin_suite
from toolgym.verifiers import FinalState, Outcome, verifier_for

#: Every task on bwrap; every 4th on docker (a full docker pass costs ~15 min of this machine:
#: run it with TOOLGYM_DOCKER_STRIDE=1). TOOLGYM_FAMILY_STRIDE thins both for quick local runs.
STRIDE = int(os.environ.get("TOOLGYM_FAMILY_STRIDE", "1"))
DOCKER_STRIDE = int(os.environ.get("TOOLGYM_DOCKER_STRIDE", "4"))


@pytest.mark.parametrize("suite, train, heldout", [("code-repair", 300, 100), ("shell-ops", 300, 100)])
def test_sizes_and_splits(suite, train, heldout):
    s = builtin_suite(suite)
    assert s.splits["train"] >= train and s.splits["held-out"] >= heldout
    assert len(set(s.ids())) == len(s)
    s.check_disjoint()


def test_code_repair_heldout_uses_unseen_templates():
    s = builtin_suite("code-repair")
    train = {t.metadata["template"] for t in s.split("train")}
    held = {t.metadata["template"] for t in s.split("held-out")}
    assert train and held and not (train & held)
    kinds = {t.metadata["bug"] for t in s}
    assert {"off_by_one", "wrong_operator", "wrong_base_case", "swapped_arguments", "wrong_comparison",
            "missing_edge_case"} <= kinds
    assert {t.difficulty for t in s} >= {1, 2, 3}


def test_no_git_history_and_hidden_files_stay_hidden():
    for name in ("code-repair", "shell-ops"):
        for task in builtin_suite(name):
            assert not any(p == ".git" or p.startswith(".git/") for p in task.workspace)
            assert not set(task.hidden.files) & set(task.workspace)
            assert "tests_hidden" not in "".join(task.workspace)


def _oracle_state(env, task):
    env.reset(options={"task": task})
    for call in task.oracle:
        env.step(call.to_text())
    return FinalState(**env.final_state())


@pytest.mark.parametrize("suite, env_id", [("code-repair", "code-repair-v0"), ("shell-ops", "shell-ops-v0")])
def test_every_oracle_passes_and_doing_nothing_fails(backend, suite, env_id):
    tasks = builtin_suite(suite).tasks[:: STRIDE * (DOCKER_STRIDE if backend == "docker" else 1)]
    config = SandboxConfig(backend=backend)

    def one(task):
        env = toolgym.envs.make(env_id, sandbox=config).unwrapped
        env.grade_on_submit = False  # grade here, once, with the verifier
        try:
            verifier = verifier_for(task, config)
            good = verifier.verify(task, _oracle_state(env, task))
            env.reset(options={"task": task})
            env.step(toolgym.ToolCall(name="submit").to_text())
            nothing = verifier.verify(task, FinalState(**env.final_state()))
            return task.id, good.outcome, nothing.outcome, good.reason
        finally:
            env.close()

    with ThreadPoolExecutor(max_workers=6) as pool:
        results = list(pool.map(one, tasks))
    bad_oracles = [(tid, reason) for tid, good, _, reason in results if good != Outcome.PASSED]
    passing_nothing = [tid for tid, _, nothing, _ in results if nothing == Outcome.PASSED]
    assert not bad_oracles, bad_oracles[:5]
    assert not passing_nothing, passing_nothing[:5]
