"""Runs last: the test run must leave no container, process, mount, cgroup or temp dir of its own.

Only what this run made is judged (`conftest.RUN_PIDS`: pytest, its CLIs and descendants; every
toolgym temp dir, cgroup and mount path carries its maker's pid, containers a `toolgym.pid`
label), so other toolgym work on the same machine cannot fail it. With several test workers
(`pytest -n`), this is the last test of the worker that runs it, and `conftest.py` checks the
whole run again once every worker has exited."""

import os

from conftest import RUN_PIDS
from leftovers import close_process_services, find_leftovers, made_by


def test_nothing_left_behind():
    close_process_services()
    problems = find_leftovers(RUN_PIDS)
    assert not problems, "; ".join(problems)


def test_the_check_sees_only_this_runs_names():
    """A name made by another process (a pid outside this run) is not judged; one of ours is."""
    assert made_by(f"toolgym-bwrap-{os.getpid()}-abc", RUN_PIDS)
    stranger = max(RUN_PIDS) + 100_000  # no pid of this run
    assert not made_by(f"toolgym-bwrap-{stranger}-abc", RUN_PIDS) and not made_by("toolgym-cache", RUN_PIDS)
