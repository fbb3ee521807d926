"""The long-lived judge service of hidden-test grading: verdicts stay right when judgements run
side by side, a judge that dies is the grader's fault (never the agent's) and comes back, and
no agent file ever reaches it."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from toolgym.sandbox import SandboxConfig
from toolgym.tasks import builtin_suite
from toolgym.verifiers import FinalState, HiddenTestVerifier, Outcome
from toolgym.verifiers.judge import judge_service


@pytest.fixture
def config(backend):
    return SandboxConfig(backend=backend)


def fix(task) -> FinalState:
    call = task.oracle[0]
    return FinalState(changes={call.arguments["path"]: call.arguments["content"]})


def test_judgements_side_by_side_keep_their_own_verdicts(config):
    tasks = builtin_suite("code-repair").tasks[:4]
    jobs = [(t, fix(t), Outcome.PASSED) for t in tasks] + [(t, FinalState(), Outcome.FAILED) for t in tasks]
    verifier = HiddenTestVerifier(config)
    with ThreadPoolExecutor(8) as pool:
        verdicts = list(pool.map(lambda job: verifier.verify(job[0], job[1]), jobs))
    assert [v.outcome for v in verdicts] == [want for _, _, want in jobs], [v.reason for v in verdicts]
    assert all(set(v.details["stages_s"]) == {"probe_sandbox", "probes", "judge"} for v in verdicts)


def test_a_dead_judge_is_the_graders_fault_and_comes_back(config):
    task = builtin_suite("code-repair").tasks[0]
    killed = []

    def kill_the_judge(_probe_box):  # while the probes run, the judge server dies (ours, not the agent's)
        service = judge_service(config)
        service.box.kill_all()
        killed.append(service)

    broken = HiddenTestVerifier(config, on_sandbox=kill_the_judge).verify(task, fix(task))
    assert killed and broken.outcome in (Outcome.VERIFIER_ERROR, Outcome.INFRA_ERROR)
    assert not broken.outcome.is_agent_attempt and "judge" in broken.reason
    again = HiddenTestVerifier(config).verify(task, fix(task))  # a new service starts
    assert again.outcome == Outcome.PASSED and judge_service(config) is not killed[0]


def test_the_judge_holds_no_agent_file(config):
    """The judge's directory holds what the grader wrote, whatever the agent's workspace had."""
    task = builtin_suite("code-repair").tasks[0]
    service = judge_service(config)
    seen = service.judge(
        {
            "test_list.py": "import os\n\ndef test_list():\n    print(sorted(os.listdir('.')))\n"
            "    assert sorted(os.listdir('.')) == ['output.txt', 'pytest.ini', 'test_list.py']\n",
            "pytest.ini": "[pytest]\n",
        },
        30,
    )
    assert seen.exit_code == 0, seen.output
    files = sorted(p.name for p in service.host_dir.iterdir())
    assert files == [".judge"], files  # the job's directory is gone after the judgement
    assert not any(path in task.workspace for path in files)


def test_a_conftest_that_adds_options_still_gets_them(config):
    """The server keeps pytest's argument parser between parses; a conftest adding an option
    must still see it parsed (the kept parser is rebuilt), and fixtures stay available."""
    service = judge_service(config)
    seen = service.judge(
        {
            "conftest.py": "def pytest_addoption(parser):\n    parser.addoption('--flavour', default='plain')\n",
            "test_opt.py": "def test_opt(request):\n    assert request.config.getoption('flavour') == 'plain'\n\n"
            "def test_fixtures(tmp_path, monkeypatch, capsys):\n    print('hi')\n"
            "    assert capsys.readouterr().out == 'hi\\n' and tmp_path.is_dir()\n",
            "pytest.ini": "[pytest]\n",
        },
        30,
    )
    assert seen.exit_code == 0, seen.output
    assert seen.junit is not None and seen.junit.count("<testcase") == 2
