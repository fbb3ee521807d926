"""Which tool does a policy reach for at mcp-inventory's write turn, and does the sentence or the
tool's place in the list decide it? Teacher-forced on contexts from real rollouts.

    python bench/write_turn_tool.py runs/mcp-sft/sft-model runs/exp-i-progress/rollouts/step-*.jsonl \
        [--order list_items,remove_stock,add_stock,delete_item,history,notify_supplier,submit ...] [--turn first]

Contexts: every one-change mcp-inventory episode (one per task) whose first turn was a lone
`list_items` call; each is cut where its second turn begins (with `--turn first`: any episode, cut
where its first turn begins, the turn a direct write would skip the read in), and the policy's
next-token distribution after `<tool_call>\\n{"name": "` is read for the first token of each
tool's name.
With `--order`, the chat template's tool lines are put in that order (the same contexts
otherwise), so a probability that follows the place and not the sentence shows at once. Prints
the mean probability of each tool per kind and per order; writes `--out` (default
`runs/bench/write_turn_tool.json`).
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from toolgym.harness.trajectory import read_jsonl

TOOLS = ["list_items", "add_stock", "remove_stock", "delete_item", "history", "notify_supplier", "submit"]
KINDS = ("receive", "new", "ship", "discontinue", "exact")
HEAD = '<tool_call>\n{"name": "'
TOOL_LINE = re.compile(r"\n- (\w+)\(.*")


def contexts(paths: list[str], turn: str = "write") -> list[tuple[str, str]]:
    """(kind, text up to a turn's tool name) for one episode per one-change task: the write turn
    (the second) of an episode whose first turn was a lone `list_items` call, or with `turn="first"`
    the first turn of any episode (where a direct write would skip the read)."""
    out, seen = [], set()
    for path in paths:
        for traj in read_jsonl(path):
            kind = traj.family.split("/")[-1]
            if not traj.family.startswith("mcp-inventory/") or kind not in KINDS or traj.task_id in seen:
                continue
            policy = [i for i, s in enumerate(traj.segments) if s.kind == "policy"]
            first = traj.segments[policy[0]].text if policy else ""
            if turn == "first" and policy:
                cut = policy[0]
            elif len(policy) >= 2 and first.count("<tool_call>") == 1 and '"list_items"' in first:
                cut = policy[1]
            else:
                continue
            seen.add(traj.task_id)
            out.append((kind, "".join(s.text for s in traj.segments[:cut]) + HEAD))
    return out


def reorder(text: str, order: list[str]) -> str:
    """`text` with the chat template's tool lines in `order` (the lines themselves unchanged)."""
    lines = {m.group(1): m.group(0) for m in TOOL_LINE.finditer(text)}
    block = "".join(lines[name] for name in TOOLS)
    if block not in text:
        raise ValueError("the context's tool list is not in the shipped order; pass contexts from unshuffled rollouts")
    return text.replace(block, "".join(lines[name] for name in order))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="a model directory (an exported sft-model or final-model)")
    parser.add_argument("rollouts", nargs="+", help="rollout or evaluation trajectories (JSONL) with mcp-inventory episodes")
    parser.add_argument("--order", action="append", default=[], help="a comma-separated tool order to try besides the shipped one")
    parser.add_argument(
        "--turn", choices=("write", "first"), default="write", help="the write turn (after a lone list_items) or the first turn"
    )
    parser.add_argument("--out", default="runs/bench/write_turn_tool.json", help="where the JSON report goes")
    args = parser.parse_args()
    orders = [TOOLS] + [o.split(",") for o in args.order]
    for order in orders:
        if sorted(order) != sorted(TOOLS):
            sys.exit(f"error: --order must name each of {', '.join(TOOLS)} once")
    found = contexts(args.rollouts, args.turn)
    if not found:
        sys.exit(f"error: no one-change mcp-inventory episode with a {args.turn} turn to replay in these files")
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    first_token = {name: tokenizer.encode(name, add_special_tokens=False)[0] for name in TOOLS}
    report = []
    for order in orders:
        sums: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        counts: collections.Counter = collections.Counter()
        for kind, text in found:
            ids = tokenizer.encode(reorder(text, order), add_special_tokens=False)
            with torch.no_grad():
                probs = torch.softmax(model(torch.tensor([ids])).logits[0, -1].float(), -1)
            for name in TOOLS:
                sums[kind][name] += probs[first_token[name]].item()
            counts[kind] += 1
        print(f"tool order: {', '.join(order)}")
        for kind in KINDS:
            if counts[kind]:
                means = {name: sums[kind][name] / counts[kind] for name in TOOLS}
                report.append({"order": order, "kind": kind, "contexts": counts[kind], "p": means})
                print(f"  {kind:12s} ({counts[kind]:2d} contexts) " + " ".join(f"{n} {p:.3f}" for n, p in means.items()))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"model": args.model, "rollouts": args.rollouts, "turn": args.turn, "results": report}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
