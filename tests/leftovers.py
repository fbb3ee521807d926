"""What a test run left behind: containers, temp dirs, mounts, processes, cgroups of its own.

Only what the run made is judged: every toolgym temp dir, cgroup and mount path carries its
maker's pid, containers a `toolgym.pid` label, and `run_pids` is the run's processes (pytest, its
workers, its CLIs and their descendants), so other toolgym work on the same machine is never
counted. Used by `test_zz_leftovers.py` (the last test of a process) and, with several test
workers, by `conftest.pytest_sessionfinish` once every worker has exited.
"""

from __future__ import annotations

import json
import re
import subprocess
import tempfile
import time
from pathlib import Path

_OWNER = re.compile(r"toolgym-(?:[a-z]+-)*?(\d+)-")


def made_by(text: str, run_pids: set[int]) -> bool:
    """True if a toolgym name or path in `text` was made by one of `run_pids`."""
    return any(int(pid) in run_pids for pid in _OWNER.findall(text))


def _containers(run_pids: set[int]) -> list[str]:
    listing = subprocess.run(["docker", "ps", "-a", "--filter", "label=toolgym", "--format", "{{json .}}"], capture_output=True, text=True)
    if listing.returncode != 0:
        return [f"(docker is not answering: {listing.stderr.strip()})"]
    out = []
    for line in listing.stdout.splitlines():
        info = json.loads(line)
        labels = dict(kv.split("=", 1) for kv in info.get("Labels", "").split(",") if "=" in kv)
        if int(labels.get("toolgym.pid", "0") or 0) in run_pids:
            out.append(info.get("ID", "?"))
    return out


def _processes(run_pids: set[int]) -> list[str]:
    """Processes in a sandbox cgroup the run made, and bwrap processes whose parent is one of the
    run's (a sandbox without a cgroup): found by cgroup and parentage in /proc, never by name."""
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
        if made_by(cgroup, run_pids) or (comm == "bwrap" and parent in run_pids):
            out.append(f"{entry.name} {comm}")
    return out


def find_leftovers(run_pids: set[int], wait: float = 10.0) -> list[str]:
    """What the run left, one line per kind; waits up to `wait` seconds for removals under way."""
    deadline = time.time() + wait
    while True:
        problems = []
        containers = _containers(run_pids)
        if containers:
            problems.append(f"containers: {containers}")
        temps = [p.name for p in Path(tempfile.gettempdir()).glob("toolgym-*") if made_by(p.name, run_pids)]
        if temps:
            problems.append(f"temp dirs: {temps}")
        mounts = [ln for ln in Path("/proc/mounts").read_text().splitlines() if "toolgym" in ln and made_by(ln, run_pids)]
        if mounts:
            problems.append(f"mounts: {mounts}")
        procs = _processes(run_pids)
        if procs:
            problems.append(f"processes: {procs}")
        cgroups = (
            [str(p) for p in Path("/sys/fs/cgroup").rglob("toolgym-*") if made_by(p.name, run_pids)]
            if Path("/sys/fs/cgroup").exists()
            else []
        )
        if cgroups:
            problems.append(f"cgroups: {cgroups}")
        if not problems or time.time() > deadline:
            return problems
        time.sleep(0.5)


def close_process_services() -> None:
    """Close what lives as long as the process (judge services, shared warm pools), as exit
    would, and wait for their containers' removal: closing must leave nothing either."""
    import gc

    gc.collect()  # sandboxes dropped without close() are closed by their finalizers
    from toolgym.sandbox import docker_pool
    from toolgym.verifiers.judge import close_services

    close_services()
    docker_pool.close_shared_pools()
    if docker_pool._REMOVER is not None:
        docker_pool._REMOVER.drain()
