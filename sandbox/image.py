"""Build the sandbox base image without a registry: debootstrap a Debian root filesystem with
Python 3 and pytest, add the sandbox user, and `docker import` it. Cached by tag.

The same root filesystem can serve the bwrap backend (`SandboxConfig(rootfs=...)`).
A Dockerfile with the same contents ships beside this module for users with a registry.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
from pathlib import Path

from toolgym.sandbox.base import IMAGE_TAG, SandboxUnavailable, cache_dir

DEFAULT_TAG = IMAGE_TAG
ROOTFS_CACHE = cache_dir() / "rootfs" / f"bookworm-{IMAGE_TAG.rsplit(':', 1)[1]}"
#: Files debootstrap copies from the build host; the image gets neutral values instead.
NEUTRAL_ETC = {
    "hostname": "sandbox\n",
    "hosts": "127.0.0.1\tlocalhost sandbox\n::1\tlocalhost\n",
    "resolv.conf": "",
    "mailname": "sandbox\n",
}
PACKAGES = ("python3", "python3-pytest")
MIRROR = "http://deb.debian.org/debian"


def image_exists(tag: str = DEFAULT_TAG) -> bool:
    """True if dockerd has `tag`."""
    import docker

    from toolgym.sandbox.docker_pool import client

    try:
        client().images.get(tag)
        return True
    except docker.errors.ImageNotFound:
        return False


def build_rootfs(dest: Path = ROOTFS_CACHE, force: bool = False, log=print) -> Path:
    """debootstrap a minimal bookworm with Python 3 and pytest into `dest` (cached)."""
    if (dest / "usr" / "bin" / "python3").exists() and not force:
        return dest
    if shutil.which("debootstrap") is None:
        raise SandboxUnavailable("debootstrap not found: `apt-get install -y debootstrap`")
    if os.geteuid() != 0:
        raise SandboxUnavailable("building the root filesystem needs root (debootstrap)")
    tmp = dest.with_name(dest.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    log(f"debootstrap bookworm ({', '.join(PACKAGES)}) into {tmp} ...")
    proc = subprocess.run(
        ["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", "bookworm", str(tmp), MIRROR],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise SandboxUnavailable(f"debootstrap failed: {proc.stderr.strip()[-500:] or proc.stdout.strip()[-500:]}")
    for name, text in NEUTRAL_ETC.items():  # nothing of the build host's identity in the image
        (tmp / "etc" / name).write_text(text)
    with open(tmp / "etc" / "passwd", "a") as f:
        f.write("agent:x:1000:1000:agent:/home/agent:/bin/sh\n")
    with open(tmp / "etc" / "group", "a") as f:
        f.write("agent:x:1000:\n")
    for d in ("home/agent", "workspace", ".toolgym"):
        (tmp / d).mkdir(parents=True, exist_ok=True)
        os.chown(tmp / d, 1000, 1000)
    for junk in ("var/cache/apt/archives", "var/lib/apt/lists", "usr/share/doc", "usr/share/man", "usr/share/locale"):
        shutil.rmtree(tmp / junk, ignore_errors=True)
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)
    return dest


def build_image(tag: str = DEFAULT_TAG, force: bool = False, log=print) -> str:
    """Build (or reuse) the base image; returns its tag."""
    from toolgym.sandbox.docker_pool import client

    rootfs = build_rootfs(force=force, log=log)  # bwrap sandboxes use the same tree (cached)
    if not force and image_exists(tag):
        log(f"image {tag} already present")
        return tag
    log(f"docker import {rootfs} as {tag} ...")
    c = client()
    archive = rootfs.parent / "rootfs.tar"
    with tarfile.open(archive, "w") as tar:
        tar.add(str(rootfs), arcname=".")
    changes = ["USER 1000:1000", "WORKDIR /workspace", 'CMD ["sleep", "infinity"]']
    try:
        c.api.import_image_from_file(
            str(archive), repository=tag.split(":")[0], tag=tag.split(":")[1] if ":" in tag else "latest", changes=changes
        )
    finally:
        archive.unlink(missing_ok=True)
    if not image_exists(tag):
        raise SandboxUnavailable(f"docker import did not produce {tag}")
    return tag
