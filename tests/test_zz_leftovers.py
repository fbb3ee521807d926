"""Runs last: the whole test run must leave no container, process, mount, cgroup or temp dir."""

import subprocess
import tempfile
import time
from pathlib import Path

import pytest


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
        containers = subprocess.run(["docker", "ps", "-aq", "--filter", "label=toolgym"], capture_output=True,
                                    text=True)
        if containers.returncode != 0:
            pytest.fail(f"docker is not answering: {containers.stderr}")
        if containers.stdout.strip():
            problems.append(f"containers: {containers.stdout.split()}")
        temps = [p.name for p in Path(tempfile.gettempdir()).glob("toolgym-*")]
        if temps:
            problems.append(f"temp dirs: {temps}")
        mounts = [ln for ln in Path("/proc/mounts").read_text().splitlines() if "toolgym" in ln]
        if mounts:
            problems.append(f"mounts: {mounts}")
        procs = subprocess.run(["pgrep", "-af", "bwrap|toolgym-wrapper"], capture_output=True, text=True).stdout
        procs = [ln for ln in procs.splitlines() if "pgrep" not in ln]
        if procs:
            problems.append(f"processes: {procs}")
        cgroups = [str(p) for root in ("/sys/fs/cgroup",) for p in Path(root).rglob("toolgym-*")] \
            if Path("/sys/fs/cgroup").exists() else []
        if cgroups:
            problems.append(f"cgroups: {cgroups}")
        if not problems or time.time() > deadline:
            break
        time.sleep(0.5)
    assert not problems, "; ".join(problems)
