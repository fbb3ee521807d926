"""The workspace files of a bwrap sandbox: read and written inside it as the agent would, or
read on the host straight from the overlay layers where nothing in the sandbox may interfere.

`OverlayFiles` is a part of `BwrapSandbox` (sandbox/bwrap.py), kept here so each file has one job.
"""

from __future__ import annotations

import os

from toolgym.sandbox import fs
from toolgym.sandbox.base import WORKSPACE, SandboxError, workspace_rel


class OverlayFiles:
    """File access of `BwrapSandbox` (it reads the sandbox's `layers`, `lower` and pristine tree)."""

    def written_bytes(self) -> int:
        """The workspace's upper layer and /tmp, measured on the host."""
        return fs.tree_bytes(self.layers / "upper") + fs.tree_bytes(self.layers / "tmp")

    def read_file(self, path: str) -> str:
        """Text of a workspace file, read inside the sandbox (so links resolve as the agent sees them)."""
        rel = workspace_rel(path)
        res = self.exec(f"cat -- '{WORKSPACE}/{rel}'", timeout_s=10)
        if res.exit_code != 0:
            raise SandboxError(f"cannot read {path}: {res.stderr.strip() or 'no such file'}")
        return res.stdout

    def write_file(self, path: str, text: str) -> None:
        """Write a workspace file inside the sandbox (parents created), as the agent would."""
        rel = workspace_rel(path)
        if not rel:
            raise SandboxError("write_file needs a file path")
        parent = os.path.dirname(rel)
        mk = f"mkdir -p -- '{WORKSPACE}/{parent}' && " if parent else ""
        res = self.exec(f"{mk}cat > '{WORKSPACE}/{rel}'", timeout_s=10, stdin=text)
        if res.exit_code != 0:
            raise SandboxError(f"cannot write {path}: {res.stderr.strip()}")

    def write_files(self, files: dict[str, str]) -> None:
        """Write many files with one exec: a tar archive streamed in on stdin."""
        import base64
        import io
        import tarfile

        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            for path, text in files.items():
                rel = workspace_rel(path)
                if not rel:
                    raise SandboxError("write_files needs file paths")
                data = text.encode()
                info = tarfile.TarInfo(rel)
                info.size, info.mode = len(data), 0o644
                tar.addfile(info, io.BytesIO(data))
        res = self.exec(
            f"base64 -d | tar -x -f - -C {WORKSPACE} --no-same-owner --overwrite",
            stdin=base64.b64encode(buf.getvalue()).decode(),
            timeout_s=30,
        )
        if res.exit_code != 0:
            raise SandboxError(f"cannot write files: {res.stderr.strip()[-300:]}")

    def files(self) -> dict[str, fs.Entry]:
        """The merged workspace tree, computed on the host from the overlay layers."""
        self._check_open()
        return fs.merged_tree(self.lower, self.layers / "upper")

    def pristine_files(self) -> dict[str, fs.Entry]:
        """The pristine workspace tree."""
        return dict(self._pristine_tree)

    def read_host_bytes(self, path: str) -> bytes:
        """A workspace file's bytes read on the host from the overlay layers, never through a
        command inside the sandbox (nothing in the sandbox can change what is read)."""
        self._check_open()
        rel = workspace_rel(path)
        entry = fs.merged_tree(self.lower, self.layers / "upper").get(rel)
        if entry is None or entry.kind != "file":
            raise SandboxError(f"cannot read {path}: not a regular file in the workspace")
        upper = self.layers / "upper" / rel
        layer = upper if os.path.lexists(upper) else self.lower / rel
        try:
            return fs.read_regular(layer)
        except FileNotFoundError as err:
            raise SandboxError(f"cannot read {path}: {err}") from None


__all__ = ["OverlayFiles"]
