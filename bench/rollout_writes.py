"""Which write tool do a run's own mcp-inventory rollouts call, per kind, as training goes on?

    python bench/rollout_writes.py runs/exp-r-three-kinds [--window 4] [--by-wording]

Reads `RUN/rollouts/step-*.jsonl` and, per window of `--window` RL steps and per one-change kind
(`receive`, `ship`, ...), prints how many episodes passed and, among the episodes that no tool
exploration touched (`rollout.explore_tools`), the share whose first write (the first call to a
tool other than the reads `list_items` and `history`) went to each tool. A policy that tells the
sentences apart calls `add_stock` after `receive` and `remove_stock` after `ship`; one that does
not calls the same tool in every kind, whichever one the reward last favoured. Each row also gives
the mean tool calls of its passes: a pass that walked the whole tool list makes five or more, one
that read and wrote makes two or three. With `--by-wording`, each kind's row is split by the
sentence's wording (numbers read `N`, item names `X`), read from the instruction itself so it works
for any suite version. Writes `--out` (default `runs/bench/rollout_writes.json`).
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import sys
from pathlib import Path

from toolgym.envs.families.mcp_inventory import ITEMS, SERVER
from toolgym.harness.trajectory import read_jsonl

READS = tuple(SERVER["state_tools"])  # the server's read-only tools: list_items, history
CALL_NAME = re.compile(r'"name":\s*"(\w+)"')
INSTRUCTION = re.compile(r"<\|im_start\|>user\n(.*?) Change the stock with", re.S)
ITEM_NAMES = "|".join(name for names in ITEMS.values() for name in names)
ITEM_NAME = re.compile(rf"\b({ITEM_NAMES})\b")


def first_write(texts: list[str]) -> str:
    """The first tool called that is not a read, or `none`."""
    names = [name for text in texts for name in CALL_NAME.findall(text)]
    return next((name for name in names if name not in READS), "none")


def wording(texts: list[str]) -> str:
    """A one-change task's sentence as its template (`N` for numbers, `X` for the item), or `?`."""
    found = next((m.group(1) for text in texts if (m := INSTRUCTION.search(text))), None)
    return ITEM_NAME.sub("X", re.sub(r"\d+", "N", found)) if found else "?"


def summarise(paths: list[Path], by_wording: bool = False) -> dict[str, dict]:
    """Per one-change kind (and wording, if asked): episodes, passes, on-policy first writes by tool."""
    out: dict[str, dict] = {}
    for path in paths:
        for traj in read_jsonl(path):
            kind = traj.family.removeprefix("mcp-inventory/")
            if kind == traj.family or "+" in kind:
                continue  # another family, or a task with several changes
            if by_wording:
                kind += ": " + wording([seg.text or "" for seg in traj.segments if seg.kind != "policy"])
            row = out.setdefault(kind, {"episodes": 0, "passed": 0, "pass_calls": 0, "writes": collections.Counter()})
            row["episodes"] += 1
            if traj.outcome.value == "passed":
                row["passed"] += 1
                row["pass_calls"] += traj.tool_calls
            policy = [s for s in traj.segments if s.kind == "policy"]
            if not any(s.forced for s in policy):
                row["writes"][first_write([s.text for s in policy])] += 1
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", help="a campaign's output folder (with rollouts/step-*.jsonl)")
    parser.add_argument("--window", type=int, default=4, help="RL steps per row")
    parser.add_argument("--out", default="runs/bench/rollout_writes.json", help="where the JSON report goes")
    parser.add_argument("--by-wording", action="store_true", help="split each kind by the sentence's wording")
    args = parser.parse_args()
    if args.window < 1:
        sys.exit(f"error: --window must be at least 1, not {args.window}")
    steps = sorted(Path(args.run, "rollouts").glob("step-*.jsonl"))
    if not steps:
        sys.exit(f"error: no rollouts/step-*.jsonl under {args.run}")
    report = []
    for start in range(0, len(steps), args.window):
        rows = summarise(steps[start : start + args.window], args.by_wording)
        span = f"{start + 1}-{min(start + args.window, len(steps))}"
        print(f"steps {span}:")
        for kind, row in sorted(rows.items()):
            total = sum(row["writes"].values())
            shares = {tool: count / total for tool, count in row["writes"].most_common()} if total else {}
            calls = row["pass_calls"] / row["passed"] if row["passed"] else None
            report.append(
                {
                    "steps": span,
                    "kind": kind,
                    "episodes": row["episodes"],
                    "passed": row["passed"],
                    "calls_per_pass": calls,
                    "on_policy": total,
                    "writes": shares,
                }
            )
            top = " ".join(f"{tool} {share:.2f}" for tool, share in list(shares.items())[:4])
            per_pass = f"{calls:4.1f}" if calls is not None else "   -"
            print(
                f"  {kind:12s} passed {row['passed']:3d}/{row['episodes']:3d} ({per_pass} calls each)   first write, {total:3d} unexplored: {top}"
            )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"run": args.run, "window": args.window, "results": report}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
