"""Apply a unified diff to a {path: text} workspace (strict: context must match)."""

from __future__ import annotations

import re

_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


class PatchError(ValueError):
    """The patch does not apply; the message names the file and hunk."""


def _strip(path: str) -> str:
    path = path.split("\t")[0].strip()
    if path == "/dev/null":
        return path
    return path[2:] if path.startswith(("a/", "b/")) else path


def apply_patch(files: dict[str, str], patch: str) -> dict[str, str | None]:
    """The changes (path -> new text, None if deleted) a unified diff makes to `files`."""
    lines = patch.splitlines(keepends=True)
    changes: dict[str, str | None] = {}
    i = 0
    while i < len(lines):
        if not lines[i].startswith("--- "):
            i += 1
            continue
        old, new = _strip(lines[i][4:]), _strip(lines[i + 1][4:]) if i + 1 < len(lines) else ""
        if not lines[i + 1].startswith("+++ "):
            raise PatchError(f"line {i + 2}: expected '+++' after '---'")
        i += 2
        target = new if new != "/dev/null" else old
        source = [] if old == "/dev/null" else (changes.get(old) or files.get(old, None))
        if source is None:
            raise PatchError(f"{old}: no such file in the workspace")
        src = source if isinstance(source, list) else source.splitlines(keepends=True)
        out: list[str] = []
        pos = 0
        while i < len(lines) and lines[i].startswith("@@"):
            m = _HUNK.match(lines[i])
            if not m:
                raise PatchError(f"{target}: bad hunk header {lines[i].strip()!r}")
            old_left = int(m.group(2) if m.group(2) is not None else 1)
            new_left = int(m.group(4) if m.group(4) is not None else 1)
            start = int(m.group(1)) - (0 if old_left == 0 else 1)
            out.extend(src[pos:start])
            pos = start
            i += 1
            # Consume exactly the hunk's line counts ("--- " of a next file also starts with "-").
            while i < len(lines) and (old_left > 0 or new_left > 0 or lines[i].startswith("\\")):
                tag, body = lines[i][:1], lines[i][1:]
                if tag in (" ", "-"):
                    old_left -= 1
                if tag in (" ", "+"):
                    new_left -= 1
                if tag == "\\":
                    if out and out[-1].endswith("\n"):
                        out[-1] = out[-1][:-1]
                elif tag in (" ", "-"):
                    if pos >= len(src) or src[pos].rstrip("\n") != body.rstrip("\n"):
                        raise PatchError(f"{target}: hunk does not apply at line {pos + 1}")
                    if tag == " ":
                        out.append(src[pos])
                    pos += 1
                else:
                    out.append(body)
                i += 1
        out.extend(src[pos:])
        changes[target] = None if new == "/dev/null" else "".join(out)
    if not changes:
        raise PatchError("no file changes found: expected a unified diff (--- a/x, +++ b/x, @@ hunks)")
    return changes
