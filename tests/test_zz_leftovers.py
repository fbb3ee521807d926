"""Runs last: the test run must leave no container, process, mount, cgroup or temp dir of its own.

Only what this run made is judged (`conftest.RUN_PIDS`: pytest, its CLIs and descendants; every
toolgym temp dir, cgroup and mount path carries its maker's pid, containers a `toolgym.pid`
label), so other toolgym work on the same machine cannot fail it."""

import json
import re
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from conftest import RUN_PIDS

_OWNER = re.compile(r"toolgym-(?:[a-z]+-)*?(\d+)-")


def _ours(text: str) -> bool:
    """True if a toolgym name or path in `text` was made by a process of this run."""
    return any(int(pid) in RUN_PIDS for pid in _OWNER.findall(text))


def _our_containers() -> list[str]:
    listing = subprocess.run(["docker", "ps", "-a", "--filter", "label=toolgym", "--format", "{{json .}}"],
                             capture_output=True, text=True)
    if listing.returncode != 0:
        pytest.fail(f"docker is not answering: {listing.stderr}")
    out = []
    for line in listing.stdout.splitlines():
        info = json.loads(line)
        labels = dict(kv.split("=", 1) for kv in info.get("Labels", "").split(",") if "=" in kv)
        if int(labels.get("toolgym.pid", "0") or 0) in RUN_PIDS:
            out.append(info.get("ID", "?"))
    return out


def _our_processes() -> list[str]:
    """Processes in a sandbox cgroup this run made, and bwrap processes whose parent is one of
    this run's (a sandbox without a cgroup): the sandboxes' own processes, found by their cgroup
    and parentage in /proc, never by name across the machine."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cgroup = (entry / "cgroup").read_text()
            comm = (entry / "comm").read_text().strip()
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError):
            continue  # gone meanwhile
        if _ours(cgroup) or (comm == "bwrap" and parent in RUN_PIDS):
            out.append(f"{entry.name} {comm}")
    return out


def test_nothing_left_behind():
    import gc

    gc.collect()  # sandboxes dropped without close() are closed by their finalizers
    from toolgym.sandbox import docker_pool
    from toolgym.verifiers.judge import close_services

    # what lives as long as the process (judge services, shared warm pools) is closed at exit:
    # close it now, as exit would, and check that closing leaves nothing either
    close_services()
    docker_pool.close_shared_pools()

    if docker_pool._REMOVER is not None:
        docker_pool._REMOVER.drain()
    deadline = time.time() + 10
    while True:
        problems = []
        containers = _our_containers()
        if containers:
            problems.append(f"containers: {containers}")
        temps = [p.name for p in Path(tempfile.gettempdir()).glob("toolgym-*") if _ours(p.name)]
        if temps:
            problems.append(f"temp dirs: {temps}")
        mounts = [ln for ln in Path("/proc/mounts").read_text().splitlines() if "toolgym" in ln and _ours(ln)]
        if mounts:
            problems.append(f"mounts: {mounts}")
        procs = _our_processes()
        if procs:
            problems.append(f"processes: {procs}")
        cgroups = [str(p) for p in Path("/sys/fs/cgroup").rglob("toolgym-*") if _ours(p.name)] \
            if Path("/sys/fs/cgroup").exists() else []
        if cgroups:
            problems.append(f"cgroups: {cgroups}")
        if not problems or time.time() > deadline:
            break
        time.sleep(0.5)
    assert not problems, "; ".join(problems)


def test_the_check_sees_only_this_runs_names():
    """A name made by another process (a pid outside this run) is not judged; one of ours is."""
    import os

    assert _ours(f"toolgym-bwrap-{os.getpid()}-abc")
    stranger = max(RUN_PIDS) + 100_000  # no pid of this run
    assert not _ours(f"toolgym-bwrap-{stranger}-abc") and not _ours("toolgym-cache")
