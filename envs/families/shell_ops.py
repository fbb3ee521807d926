"""`shell-ops`: file-system and text-processing chores, graded by a hidden state checker.

Kinds: organise files by extension, extract a CSV column, rename by pattern, fix permissions,
count matching lines, sort and de-duplicate, replace text in config files, clean up temporary
files. Each task has oracle shell commands. Held-out tasks use other file names, words and
wordings than train.
"""

from __future__ import annotations

import json

import numpy as np

from toolgym.envs.registry import register_env
from toolgym.envs.sandbox_env import SandboxEnv
from toolgym.tasks import HELDOUT, HiddenSpec, SuiteSpec, Task, ToolCall, register_suite

POOLS = {
    "train": {
        "words": ["alpha", "bravo", "delta", "echo", "golf", "hotel", "india", "kilo", "lima", "mike"],
        "cities": ["Oslo", "Lima", "Porto", "Kyoto", "Dakar"],
        "exts": ["txt", "csv", "log"],
        "levels": ["ERROR", "WARN"],
    },
    HELDOUT: {
        "words": ["amber", "basil", "cedar", "dune", "ember", "fjord", "grove", "heath"],
        "cities": ["Tartu", "Cusco", "Braga"],
        "exts": ["md", "json", "ini"],
        "levels": ["FATAL", "DEBUG"],
    },
}

WORDING = {
    "train": {
        "by_ext": "Move every file in `inbox/` into `sorted/<extension>/` (e.g. inbox/a.txt -> sorted/txt/a.txt). Leave inbox/ empty.",
        "column": "Write the values of the `{col}` column of `data.csv` (no header, one per line, in file order) to `{out}`.",
        "rename": "Rename every `.jpeg` file in `photos/` to end in `.jpg` instead (keep the rest of each name).",
        "perms": "Make every `.sh` file in `scripts/` executable and make sure no other file there is executable.",
        "count": "Write the number of lines in `logs/app.log` that contain `{level}` to `count.txt`.",
        "sort": "Write the lines of `names.txt` sorted alphabetically and without duplicates to `names_sorted.txt`.",
        "replace": "In every `.conf` file under `config/`, replace each `{old}` with `{new}`.",
        "cleanup": "Delete every `.tmp` file under `build/`, and nothing else.",
    },
    HELDOUT: {
        "by_ext": "Sort the files of `inbox/` into per-extension folders under `sorted/` (inbox/x.md goes to sorted/md/x.md); inbox/ must end up empty.",
        "column": "Extract column `{col}` from `data.csv` into `{out}`: values only, header excluded, one per line, same order.",
        "rename": "Every file in `photos/` ending in `.jpeg` should end in `.jpg`; rename them.",
        "perms": "In `scripts/`, shell scripts (`.sh`) must be executable and all other files must not be.",
        "count": "How many lines of `logs/app.log` mention `{level}`? Put the number in `count.txt`.",
        "sort": "Produce `names_sorted.txt`: the distinct lines of `names.txt` in alphabetical order.",
        "replace": "Substitute `{new}` for every occurrence of `{old}` in the `.conf` files below `config/`.",
        "cleanup": "Remove the `.tmp` files from `build/` (recursively); keep every other file.",
    },
}
KINDS = list(WORDING["train"])

CHECKER = '''"""Hidden state checker (generated)."""
import json, os, stat, sys
SPEC = json.loads(%r)
out = open(sys.argv[1], "w")
def report(name, ok, message=""):
    out.write(json.dumps({"name": name, "passed": bool(ok), "message": message}) + "\\n")
def text(path):
    with open(path) as f:
        return f.read()
for path, want in SPEC.get("files", {}).items():
    if want is None:
        report("absent:" + path, not os.path.lexists(path))
        continue
    try:
        got = text(path)
    except OSError as err:
        report("content:" + path, False, str(err))
        continue
    same = got.strip() == want.strip() if SPEC.get("strip") else got == want
    report("content:" + path, same, "" if same else "got %%r" %% got[:80])
for path in SPEC.get("executable", []):
    report("exec:" + path, os.path.exists(path) and bool(os.stat(path).st_mode & stat.S_IXUSR))
for path in SPEC.get("not_executable", []):
    report("noexec:" + path, os.path.exists(path) and not os.stat(path).st_mode & 0o111)
for d, names in SPEC.get("tree", {}).items():
    got = sorted(os.listdir(d)) if os.path.isdir(d) else []
    report("tree:" + d, got == sorted(names), "got %%s" %% got)
# a JSON object checked key by key: one check per asked key, passed when that key is right and
# no key that was not asked changed (doing nothing earns nothing; collateral voids every check)
for path, want in SPEC.get("json_keys", {}).items():
    try:
        got = json.loads(text(path))
        assert isinstance(got, dict)
    except (OSError, ValueError, AssertionError) as err:
        for key in want["asked"]:
            report("key:" + path + ":" + key, False, "not a JSON object: %%s" %% err)
        continue
    expected = want["expected"]
    stray = sorted(k for k in set(got) | set(expected) if k not in want["asked"] and got.get(k) != expected.get(k))
    for key in want["asked"]:
        right = got.get(key) == expected.get(key)
        why = "" if right and not stray else "got %%r, want %%r" %% (got.get(key), expected.get(key)) if not right else "unasked keys changed: %%s" %% stray
        report("key:" + path + ":" + key, right and not stray, why)
out.close()
'''


def _names(rng, pool, n, suffixes):
    words = rng.choice(pool["words"], size=n, replace=n > len(pool["words"]))
    return [f"{w}{i}.{suffixes[int(rng.integers(len(suffixes)))]}" for i, w in enumerate(words)]


def generate_shell_ops_task(seed: int, index: int, split: str = "train") -> Task:
    """Deterministic `(seed, index, split) -> Task` for shell-ops."""
    rng = np.random.default_rng([seed, index, 11])
    key = HELDOUT if split == HELDOUT else "train"
    pool, wording = POOLS[key], WORDING[key]
    kind = KINDS[index % len(KINDS)]
    ws: dict[str, str] = {}
    spec: dict = {"files": {}, "strip": False}
    fmt: dict = {}
    if kind == "by_ext":
        names = _names(rng, pool, int(rng.integers(3, 8)), pool["exts"])
        for n in names:
            ws[f"inbox/{n}"] = f"{n} {int(rng.integers(1000))}\n"
            spec["files"][f"sorted/{n.rsplit('.', 1)[1]}/{n}"] = ws[f"inbox/{n}"]
            spec["files"][f"inbox/{n}"] = None
        spec["tree"] = {"inbox": []}
        oracle = 'cd inbox && for f in *; do mkdir -p ../sorted/${f##*.} && mv "$f" ../sorted/${f##*.}/; done'
    elif kind == "column":
        cols = ["name", "city", "score"]
        col = cols[int(rng.integers(3))]
        rows = [
            (str(rng.choice(pool["words"])), str(rng.choice(pool["cities"])), str(int(rng.integers(100))))
            for _ in range(int(rng.integers(3, 9)))
        ]
        ws["data.csv"] = "name,city,score\n" + "".join(",".join(r) + "\n" for r in rows)
        out = f"{col}_values.txt"
        fmt = {"col": col, "out": out}
        spec["files"][out] = "".join(r[cols.index(col)] + "\n" for r in rows)
        spec["strip"] = True
        oracle = f"tail -n +2 data.csv | cut -d, -f{cols.index(col) + 1} > {out}"
    elif kind == "rename":
        names = [f"{w}_{i:03d}" for i, w in enumerate(rng.choice(pool["words"], size=int(rng.integers(2, 6))))]
        keep = f"{rng.choice(pool['words'])}_notes.txt"
        ws[f"photos/{keep}"] = "not a photo\n"
        for n in names:
            ws[f"photos/{n}.jpeg"] = f"JPEG {n}\n"
            spec["files"][f"photos/{n}.jpg"] = ws[f"photos/{n}.jpeg"]
            spec["files"][f"photos/{n}.jpeg"] = None
        spec["files"][f"photos/{keep}"] = "not a photo\n"
        oracle = 'cd photos && for f in *.jpeg; do mv "$f" "${f%.jpeg}.jpg"; done'
    elif kind == "perms":
        names = _names(rng, pool, int(rng.integers(3, 7)), ["sh", "txt", "py"])
        spec["executable"], spec["not_executable"] = [], []
        for n in names:
            ws[f"scripts/{n}"] = "#!/bin/sh\necho hi\n" if n.endswith(".sh") else "data\n"
            (spec["executable"] if n.endswith(".sh") else spec["not_executable"]).append(f"scripts/{n}")
        if not spec["executable"]:
            ws["scripts/run.sh"] = "#!/bin/sh\necho run\n"
            spec["executable"].append("scripts/run.sh")
        oracle = "chmod a-x scripts/*; chmod u+x scripts/*.sh"
    elif kind == "count":
        level = str(rng.choice(pool["levels"]))
        lines = [
            f"2026-11-{int(rng.integers(1, 29)):02d} {rng.choice(pool['levels'] + ['INFO', 'INFO'])} {rng.choice(pool['words'])}"
            for _ in range(int(rng.integers(5, 20)))
        ]
        ws["logs/app.log"] = "\n".join(lines) + "\n"
        fmt = {"level": level}
        spec["files"]["count.txt"] = str(sum(level in ln for ln in lines)) + "\n"
        spec["strip"] = True
        oracle = f"grep -c {level} logs/app.log > count.txt || true"
    elif kind == "sort":
        names = [str(w) for w in rng.choice(pool["words"], size=int(rng.integers(4, 12)))]
        ws["names.txt"] = "\n".join(names) + "\n"
        spec["files"]["names_sorted.txt"] = "\n".join(sorted(set(names))) + "\n"
        spec["strip"] = True
        oracle = "LC_ALL=C sort -u names.txt > names_sorted.txt"
    elif kind == "replace":
        old, new = (str(w) for w in rng.choice(pool["words"], size=2, replace=False))
        fmt = {"old": old, "new": new}
        for i in range(int(rng.integers(1, 4))):
            body = f"name = {old}\nmode = {rng.choice(pool['words'])}\nbackup = {old}-{i}\n"
            ws[f"config/app{i}.conf"] = body
            spec["files"][f"config/app{i}.conf"] = body.replace(old, new)
        ws["config/readme.txt"] = f"{old} stays here\n"
        spec["files"]["config/readme.txt"] = ws["config/readme.txt"]
        oracle = f"sed -i 's/{old}/{new}/g' config/*.conf"
    else:  # cleanup
        names = _names(rng, pool, int(rng.integers(3, 8)), ["tmp", "o", "txt"])
        if not any(n.endswith(".tmp") for n in names):  # always something to clean up
            names[0] = names[0].rsplit(".", 1)[0] + ".tmp"
        for i, n in enumerate(names):
            path = f"build/{'sub/' if i % 2 else ''}{n}"
            ws[path] = f"{n}\n"
            spec["files"][path] = None if n.endswith(".tmp") else ws[path]
        oracle = "find build -name '*.tmp' -delete"
    instruction = wording[kind].format(**fmt) + " Use the bash tool; call `submit` when done."
    return Task(
        env_id="toolgym/shell-ops-v0",
        instruction=instruction,
        family=f"shell-ops/{kind}",
        difficulty=1 + (kind in ("by_ext", "perms", "replace")),
        split=split,
        workspace=ws,
        hidden=HiddenSpec(kind="state", files={"check.py": CHECKER % json.dumps(spec)}, timeout_s=30),
        oracle=(ToolCall(name="bash", arguments={"command": oracle}), ToolCall(name="submit", arguments={})),
        metadata={"kind": kind, "seed": seed, "index": index},
    )


register_suite(
    SuiteSpec(
        name="shell-ops",
        generator=generate_shell_ops_task,
        train_size=320,
        heldout_size=104,
        description="file and text chores in a sandbox; hidden state checker",
    )
)


@register_env("shell-ops-v0", suite="shell-ops")
class ShellOpsEnv(SandboxEnv):
    """Do a file-system or text-processing chore with shell commands; graded by a hidden checker."""

    default_suite = "shell-ops"
    max_turns = 12


__all__ = ["ShellOpsEnv", "generate_shell_ops_task"]
