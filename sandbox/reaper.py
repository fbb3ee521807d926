"""Remove what dead toolgym processes left behind: temp dirs, cgroups, docker containers.

Every toolgym temp dir and cgroup name carries its creator's pid (`toolgym-<kind>-<pid>-...`);
docker containers carry `toolgym.pid`/`toolgym.host` labels. `reap_stale()` runs once per
process, when the first sandbox is made, so a crashed run never poisons the next one.
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Callable
from pathlib import Path

from toolgym.sandbox import fs

_NAME = re.compile(r"^toolgym-(?:[a-z]+-)*?(\d+)-")
_DONE: set[str] = set()


def owner_alive(name: str) -> bool:
    """True if the pid encoded in a toolgym temp/cgroup name is a live process (or no pid is encoded)."""
    m = _NAME.match(name)
    return m is None or Path(f"/proc/{m.group(1)}").exists()


def stale_temp_dirs() -> list[Path]:
    """Temp dirs of dead toolgym processes."""
    return [p for p in Path(tempfile.gettempdir()).glob("toolgym-*") if not owner_alive(p.name)]


def reap_stale(docker: Callable[[], int] | None = None) -> int:
    """Remove stale temp dirs and cgroups (and containers, with `docker`: the docker backend's
    own reaper, passed in so this module never imports the backend); returns how many."""
    count = 0
    for path in stale_temp_dirs():
        fs.remove_tree(path)
        count += 1
    from toolgym.sandbox.cgroups import V1, V2_ROOT, _own_v1_path, _own_v2_path

    parents = (
        [V2_ROOT / _own_v2_path()]
        if (V2_ROOT / "cgroup.controllers").exists()
        else [root / _own_v1_path(ctl) for ctl, root in V1.items() if root.is_dir()]
    )
    for parent in parents:
        for d in parent.glob("toolgym-*") if parent.is_dir() else []:
            if not owner_alive(d.name):
                try:
                    d.rmdir()
                    count += 1
                except OSError:
                    pass
    if docker is not None:
        count += docker()
        _DONE.add("docker")
    _DONE.add("local")
    return count


def reap_once(docker: Callable[[], int] | None = None) -> None:
    """`reap_stale` the first time it is called in this process."""
    if "local" not in _DONE or (docker is not None and "docker" not in _DONE):
        reap_stale(docker)
