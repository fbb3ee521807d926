"""Mining a whole package: `mine_project` runs a `ProjectMiner` (mining/miner.py) over one
project's candidates in a seeded order, resumably, and writes its tasks; `prefetch` downloads
sdists ahead; `write_header` writes a mined suite's summary.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

from toolgym.mining.miner import MineOptions, ProjectMiner, ProjectReport
from toolgym.mining.project import MiningError, build_site_layer, fetch_sdist, load_project
from toolgym.tasks.mined import task_row, write_project


def prefetch(specs: list[str], workers: int = 4) -> None:
    """Download the sdists of pinned `specs` into the mining cache at once (network time overlaps);
    a spec that fails here fails again, with its message, when `mine_project` reaches it."""
    from toolgym.sandbox.base import cache_dir

    def fetch(spec: str) -> None:
        try:
            fetch_sdist(spec, cache_dir() / "mining" / "sdists")
        except MiningError:
            pass

    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(fetch, [s for s in specs if "==" in s and not Path(s).is_file()]))


def mine_project(
    spec: str, split: str, out: Path, options: MineOptions | None = None, log: Callable[[str], None] = print, progress_factory=None
) -> ProjectReport:
    """Mine one package (`name`, `name==version`, or a local sdist file) into `out` (resumable);
    returns what was kept and dropped."""
    from toolgym.sandbox.base import cache_dir

    options = options or MineOptions()
    cache = cache_dir() / "mining"
    archive = Path(spec) if spec.endswith((".tar.gz", ".zip")) and Path(spec).is_file() else fetch_sdist(spec, cache / "sdists")
    project = load_project(archive, cache / "work")
    layer = build_site_layer(project, cache_dir() / "layers")  # where `site_layer_dir` looks
    key = project.key
    (out / "tasks").mkdir(parents=True, exist_ok=True)
    (out / "state").mkdir(parents=True, exist_ok=True)
    final = out / "tasks" / f"{key}.jsonl"
    state_file = out / "state" / f"{key}.json"
    if final.exists() and state_file.exists():
        saved = json.loads(state_file.read_text())
        report = ProjectReport(
            key,
            split,
            project.license,
            saved["tests_passing"],
            saved["tests_unused"],
            saved["candidates"],
            saved["kept"],
            Counter(saved["dropped"]),
            Counter(saved["operators"]),
        )
        log(f"{key}: already mined ({report.kept} tasks); skipping")
        return report
    write_project(out, key, project.files)
    miner = ProjectMiner(project, layer, split, options)
    decisions_file = out / "state" / f"{key}.decisions.jsonl"
    partial = out / "tasks" / f"{key}.partial.jsonl"
    done: dict[int, str] = {}
    if decisions_file.exists():
        for line in decisions_file.read_text().splitlines():
            rec = json.loads(line)
            done[rec["index"]] = rec["decision"]
    try:
        miner.baseline()
        cands = miner.candidates()
        report = miner.report
        report.candidates = len(cands)
        per_fn: Counter = Counter()
        kept = sum(1 for d in done.values() if d == "kept")
        for i, d in done.items():
            if d == "kept" and i < len(cands):
                per_fn[f"{cands[i].path}::{cands[i].function}"] += 1
        todo = [i for i in range(min(len(cands), options.max_tries)) if i not in done]
        bar = progress_factory(key, min(len(cands), options.max_tries)) if progress_factory else None
        if bar:
            bar(len(done))
        with ThreadPoolExecutor(options.workers) as pool, decisions_file.open("a") as dec, partial.open("a") as part:
            # Mutants are tried in parallel but decided in candidate order, so the kept set is the
            # same for a seed whatever the timing (a quota counts only decided candidates).
            def quota_full(i: int) -> bool:
                return per_fn[f"{cands[i].path}::{cands[i].function}"] >= options.per_function

            def record(i: int, decision: str) -> None:
                done[i] = decision
                dec.write(json.dumps({"index": i, "decision": decision}) + "\n")
                dec.flush()
                if bar:
                    bar(len(done))

            queue = list(todo)
            inflight: list[tuple[int, object]] = []
            while (queue or inflight) and kept < options.max_tasks:
                while queue and len(inflight) < options.workers:
                    i = queue.pop(0)
                    if quota_full(i):
                        inflight.append((i, None))
                    else:
                        inflight.append((i, pool.submit(miner.try_mutant, i, cands[i])))
                i, future = inflight.pop(0)
                decision, task = ("function quota reached", None) if future is None else future.result()
                if decision == "kept" and quota_full(i):
                    decision, task = "function quota reached", None
                if decision == "kept":
                    kept += 1
                    per_fn[f"{cands[i].path}::{cands[i].function}"] += 1
                    part.write(task_row(task, key, project.files) + "\n")
                    part.flush()
                record(i, decision)
            miner.stopping.set()  # undecided tries are not recorded: a resumed run tries them again
            for _, future in inflight:
                if future is not None:
                    future.cancel()
    finally:
        miner.close()
    rows = partial.read_text().splitlines() if partial.exists() else []
    final.write_text("".join(r + "\n" for r in rows[: options.max_tasks]))
    partial.unlink(missing_ok=True)
    report.kept = len(rows[: options.max_tasks])
    for i, d in done.items():
        if d == "kept":
            report.operators[cands[i].operator] += 1
        else:
            report.dropped[d.split(" (")[0]] += 1
    state_file.write_text(
        json.dumps(
            {
                "tests_passing": report.tests_passing,
                "tests_unused": report.tests_unused,
                "candidates": report.candidates,
                "kept": report.kept,
                "dropped": dict(report.dropped),
                "operators": dict(report.operators),
            }
        )
    )
    return report


def write_header(out: Path, name: str, version: str, reports: list[ProjectReport]) -> None:
    """Write `suite.yaml` (every project mined so far) and `summary.md`."""
    out.mkdir(parents=True, exist_ok=True)
    header_file = out / "suite.yaml"
    header = yaml.safe_load(header_file.read_text()) if header_file.exists() else {}
    projects = dict(header.get("projects") or {})
    for r in reports:
        projects[r.key] = {"split": r.split, "license": r.license, "tasks": r.kept}
    header_file.write_text(yaml.safe_dump({"name": name, "version": version, "projects": projects}, sort_keys=False))
    lines = [
        f"# {name} v{version}: mining summary",
        "",
        "| project | split | licence | passing tests | unusable | candidates tried | kept | kept by operator | dropped |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in reports:
        tried = r.kept + sum(r.dropped.values())
        lines.append(
            f"| {r.key} | {r.split} | {r.license} | {r.tests_passing} | {r.tests_unused} | {tried} of "
            f"{r.candidates} | {r.kept} | {dict(r.operators)} | {dict(r.dropped)} |"
        )
    (out / "summary.md").write_text("\n".join(lines) + "\n")
