"""File-tree helpers: read a tree into entries, merge an overlay (lower + upper), hash and diff;
publish a cache entry built under a staging name.

An `Entry` is (kind, mode, digest): digest is the sha256 of a file's bytes or a symlink's target.
The workspace hash covers paths, modes, bytes and link targets, so deletes, renames, permission
changes and symlinks all change it, and a reset must give the pristine hash back exactly.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import uuid
from pathlib import Path
from typing import NamedTuple

OPAQUE_XATTRS = ("user.overlay.opaque", "trusted.overlay.opaque")


class Entry(NamedTuple):
    """One tree entry."""

    kind: str  # file | dir | symlink | other
    mode: int
    digest: str


def _entry(path: str, st: os.stat_result) -> Entry:
    mode = stat.S_IMODE(st.st_mode)
    if stat.S_ISLNK(st.st_mode):
        return Entry("symlink", 0o777, hashlib.sha256(os.readlink(path).encode()).hexdigest())
    if stat.S_ISDIR(st.st_mode):
        return Entry("dir", mode, "")
    if stat.S_ISREG(st.st_mode):
        h = hashlib.sha256()
        try:
            with open(path, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    h.update(chunk)
        except OSError:
            h.update(b"<unreadable>")
        return Entry("file", mode, h.hexdigest())
    return Entry("other", mode, f"{st.st_mode:o}")


def is_whiteout(st: os.stat_result) -> bool:
    """Overlayfs marks a deleted lower entry with a 0/0 character device in the upper layer."""
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == 0


def is_opaque(path: str) -> bool:
    """An opaque upper directory hides everything below it in the lower layer."""
    for name in OPAQUE_XATTRS:
        try:
            if os.getxattr(path, name, follow_symlinks=False) in (b"y", b"Y"):
                return True
        except OSError:
            continue
    return False


def read_tree(root: str | Path) -> dict[str, Entry]:
    """Every entry under `root` (not following symlinks), keyed by relative path."""
    out: dict[str, Entry] = {}
    root = str(root)
    if not os.path.isdir(root):
        return out

    def walk(directory: str, prefix: str) -> None:
        with os.scandir(directory) as it:
            for de in it:
                rel = prefix + de.name
                st = de.stat(follow_symlinks=False)
                out[rel] = _entry(de.path, st)
                if stat.S_ISDIR(st.st_mode):
                    walk(de.path, rel + "/")

    walk(root, "")
    return out


def _drop_below(tree: dict[str, Entry], rel: str) -> None:
    prefix = rel + "/"
    for key in [k for k in tree if k == rel or k.startswith(prefix)]:
        del tree[key]


def merged_tree(lower: str | Path, upper: str | Path) -> dict[str, Entry]:
    """The tree an overlay of `upper` on `lower` shows (whiteouts and opaque dirs applied)."""
    tree = read_tree(lower)
    upper = str(upper)
    if not os.path.isdir(upper):
        return tree

    def walk(directory: str, prefix: str) -> None:
        with os.scandir(directory) as it:
            for de in sorted(it, key=lambda d: d.name):
                rel = prefix + de.name
                st = de.stat(follow_symlinks=False)
                if is_whiteout(st):
                    _drop_below(tree, rel)
                    continue
                if stat.S_ISDIR(st.st_mode):
                    if is_opaque(de.path) or (rel in tree and tree[rel].kind != "dir"):
                        _drop_below(tree, rel)
                    tree[rel] = _entry(de.path, st)
                    walk(de.path, rel + "/")
                else:
                    _drop_below(tree, rel)
                    tree[rel] = _entry(de.path, st)

    walk(upper, "")
    return tree


def upper_changes(upper: str | Path) -> list[tuple[str, str]]:
    """(relative path, 'write' | 'delete' | 'setuid') for every entry an overlay's upper layer holds.

    Directories that only exist because a file below them changed are not reported themselves.
    """
    out: list[tuple[str, str]] = []
    upper = str(upper)
    if not os.path.isdir(upper):
        return out

    def walk(directory: str, prefix: str) -> None:
        with os.scandir(directory) as it:
            for de in it:
                rel = prefix + de.name
                st = de.stat(follow_symlinks=False)
                if is_whiteout(st):
                    out.append((rel, "delete"))
                elif stat.S_ISDIR(st.st_mode):
                    before = len(out)
                    walk(de.path, rel + "/")
                    if len(out) == before and is_opaque(de.path):
                        out.append((rel, "write"))
                else:
                    out.append((rel, "write"))
                    if st.st_mode & (stat.S_ISUID | stat.S_ISGID) and stat.S_ISREG(st.st_mode):
                        out.append((rel, "setuid"))

    walk(upper, "")
    return out


def tree_hash(tree: dict[str, Entry]) -> str:
    """A sha256 over sorted (path, kind, mode, digest); 16 hex characters."""
    h = hashlib.sha256()
    for rel in sorted(tree):
        e = tree[rel]
        h.update(f"{rel}\0{e.kind}\0{e.mode:o}\0{e.digest}\n".encode())
    return h.hexdigest()[:16]


def diff_trees(before: dict[str, Entry], after: dict[str, Entry]) -> dict[str, str]:
    """path -> added | deleted | modified | mode | type for every difference."""
    out: dict[str, str] = {}
    for rel in sorted(set(before) | set(after)):
        a, b = before.get(rel), after.get(rel)
        if a == b:
            continue
        if a is None:
            out[rel] = "added"
        elif b is None:
            out[rel] = "deleted"
        elif a.kind != b.kind:
            out[rel] = "type"
        elif a.digest != b.digest:
            out[rel] = "modified"
        else:
            out[rel] = "mode"
    return out


def tree_bytes(root: str | Path) -> int:
    """Disk space the files under `root` use (allocated blocks: a sparse file counts what it
    holds), not following symlinks; 0 if `root` is gone."""
    total = 0
    stack = [str(root)]
    while stack:
        try:
            with os.scandir(stack.pop()) as it:
                for de in it:
                    try:
                        st = de.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    total += st.st_blocks * 512
                    if stat.S_ISDIR(st.st_mode):
                        stack.append(de.path)
        except OSError:
            continue
    return total


def read_regular(path: str | Path) -> bytes:
    """Bytes of a regular file, refusing a symlink at the last component and anything not a
    regular file (a FIFO would block the reader, a device would read the host)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as err:
        raise FileNotFoundError(f"{path}: {err.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise FileNotFoundError(f"{path}: not a regular file")
        return f.read()


def write_files(root: str | Path, files: dict[str, str], owner: tuple[int, int] | None = None) -> None:
    """Write a {relative path: text} mapping under `root` (parents created)."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    for rel, text in files.items():
        target = root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    if owner is not None:
        chown_tree(root, owner[0])


def chown_tree(root: str | Path, uid: int) -> None:
    """Give `root` and everything below it (links themselves, not their targets) to uid:uid."""
    os.chown(root, uid, uid)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            os.chown(os.path.join(dirpath, name), uid, uid, follow_symlinks=False)


def _force_writable(func, path, exc) -> None:
    # Overlay work dirs are created with mode 000; make them removable and retry.
    if isinstance(exc[1] if isinstance(exc, tuple) else exc, FileNotFoundError):
        return  # already gone (removed concurrently)
    try:
        os.chmod(os.path.dirname(path), 0o700)
        os.chmod(path, 0o700)
    except OSError:
        pass
    try:
        func(path)
    except FileNotFoundError:
        pass


def remove_tree(path: str | Path) -> None:
    """Remove a directory tree, including overlay work dirs with mode 000."""
    if os.path.lexists(path):
        shutil.rmtree(path, onerror=_force_writable)


def empty_dir(path: str | Path) -> None:
    """Make `path` an empty directory (removing what is there)."""
    remove_tree(path)
    os.makedirs(path, exist_ok=True)


def materialize(lower: str | Path, upper: str | Path, dest: str | Path) -> None:
    """Write the merged overlay view of (lower, upper) as a plain directory at `dest`."""
    dest = Path(dest)
    remove_tree(dest)
    shutil.copytree(lower, dest, symlinks=True)

    def walk(directory: str, prefix: str) -> None:
        with os.scandir(directory) as it:
            for de in it:
                rel = prefix + de.name
                st = de.stat(follow_symlinks=False)
                target = dest / rel
                if is_whiteout(st):
                    if target.is_dir() and not target.is_symlink():
                        remove_tree(target)
                    elif os.path.lexists(target):
                        target.unlink()
                    continue
                if stat.S_ISDIR(st.st_mode):
                    if os.path.lexists(target) and (not target.is_dir() or target.is_symlink() or is_opaque(de.path)):
                        if target.is_dir() and not target.is_symlink():
                            remove_tree(target)
                        else:
                            target.unlink()
                    target.mkdir(exist_ok=True)
                    os.chmod(target, stat.S_IMODE(st.st_mode))
                    walk(de.path, rel + "/")
                else:
                    if target.is_dir() and not target.is_symlink():
                        remove_tree(target)
                    elif os.path.lexists(target):
                        target.unlink()
                    if stat.S_ISLNK(st.st_mode):
                        os.symlink(os.readlink(de.path), target)
                    else:
                        shutil.copy2(de.path, target)

    if os.path.isdir(upper):
        walk(str(upper), "")


def staging_name(path: str | Path) -> Path:
    """A sibling of `path` no other thread or process will pick: build a cache entry there, then
    `publish` it, so no reader ever sees it half-built."""
    path = Path(path)
    return path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")


def publish(staged: str | Path, path: str | Path) -> bool:
    """Atomically move a finished `staged` file or directory to `path`. If another builder
    published a directory there first, keep theirs and drop ours; returns whether ours is the
    one in place."""
    try:
        if Path(staged).is_file():
            os.replace(staged, path)  # files: replacing an identical copy is harmless
        else:
            os.rename(staged, path)  # directories: fails if another builder published first
        return True
    except OSError:
        shutil.rmtree(staged, ignore_errors=True)
        return False
