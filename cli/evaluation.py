"""Evaluation and inspection commands: eval, show, check-template, verify, build-tiny."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape

from toolgym.cli.app import CLIError, app, console, load_suite
from toolgym.trainers.config import RolloutSettings

#: `toolgym eval`'s budget defaults are the campaign's, so their numbers compare
_ROLLOUT = RolloutSettings()


def _print_report(report) -> None:
    o = report.overall
    ks = ", ".join(
        f"pass@{k} = {o.pass_at[str(k)].value:.3f} [{o.pass_at[str(k)].low:.3f}, {o.pass_at[str(k)].high:.3f}]" for k in report.ks
    )
    console.print(f"[bold]{escape(report.policy)}[/] on {report.suite}/{report.split}: {ks}")
    r = o.outcome_rates
    console.print(
        f"  episodes {o.episodes}; format-error rate {r['format_error']:.2f}, truncated "
        f"{r.get('truncated', 0):.2f}, timeout {r['timeout']:.2f}, infra-error {r['infra_error']:.2f}; "
        f"safety events/episode {o.safety_event_rate:.2f}; tool calls/episode {o.mean_tool_calls:.1f}"
    )
    if len(report.by_family) > 1:  # e.g. BFCL's categories: accuracy per category, as the leaderboard reports it
        for family, g in report.by_family.items():
            est = g.pass_at.get("1")
            if est is not None and est.tasks:
                console.print(f"  {family}: accuracy {est.value:.3f} [{est.low:.3f}, {est.high:.3f}] ({g.episodes} episodes)")
    if o.limits_hit:
        console.print("  limits hit: " + ", ".join(f"{k} {v}" for k, v in sorted(o.limits_hit.items())))
    for label, est in (("best-of-n (most confident sample)", o.best_of_n), ("majority vote", o.majority_vote)):
        if est is not None:
            console.print(f"  {label}: {est.value:.3f} [{est.low:.3f}, {est.high:.3f}]")


@app.command("eval")
def eval_(
    policy: str = typer.Option(
        ..., help="oracle | null | tiny | hf:MODEL (dir, hub id, smollm2-135m) | sglang:URL[,URL] | openai:URL[#MODEL]"
    ),
    suite: str = typer.Option("records", help="registered suite name, or a suite directory/JSONL"),
    split: str = typer.Option("held-out", help="which split to evaluate on"),
    samples: int = typer.Option(1, "-n", "--samples", help="samples per task"),
    k: str = typer.Option("1", "-k", help="comma-separated k values for pass@k"),
    max_tasks: int = typer.Option(0, "--tasks", help="evaluate the first N tasks only (0 = all)"),
    concurrency: int = typer.Option(16, help="episodes in flight"),
    seed: int = typer.Option(0, help="seed for environments, sampling and bootstrap"),
    out: Path = typer.Option(Path("runs/eval"), help="output directory"),
    max_turns: int | None = typer.Option(None, help="turn limit (default: the env's)"),
    max_new_tokens: int = typer.Option(_ROLLOUT.max_new_tokens, help="tokens per turn (the campaign's default)"),
    max_total_tokens: int = typer.Option(
        _ROLLOUT.max_total_tokens, help="tokens per episode, prompt and observations included (the campaign's default)"
    ),
    temperature: float = typer.Option(1.0, help="sampling temperature (0 = greedy)"),
    top_p: float = typer.Option(_ROLLOUT.top_p, help="nucleus sampling"),
    watchdog: float = typer.Option(3600.0, help="seconds before a hung episode is stopped (infra_error, never the agent's failure)"),
    tokenizer: str | None = typer.Option(None, help="tokenizer for sglang: policies"),
    device: str | None = typer.Option(None, help="tiny/hf: policies: cpu, cuda, cuda:1 (default: cuda if present)"),
    dtype: str = typer.Option("auto", help="tiny/hf: policies: bf16 | fp16 | fp32 | auto (bf16 on CUDA)"),
    shuffle_tools: bool = typer.Option(
        False, "--shuffle-tools", help="list each episode's tools in an order drawn per episode (as a campaign's envs.N.shuffle_tools)"
    ),
) -> None:
    """Evaluate a policy on a suite split: pass@k with CIs, outcome and safety rates, a report."""
    from toolgym.harness.eval_run import run_eval
    from toolgym.harness.rollout import RolloutLimits
    from toolgym.inference.policy import SamplingParams

    try:
        ks = sorted({int(x) for x in k.split(",") if x.strip()})
    except ValueError:
        raise CLIError(f"-k {k!r}: expected comma-separated integers such as 1,8") from None
    if not ks or min(ks) < 1:
        raise CLIError("-k values must be >= 1")
    limits = RolloutLimits(
        max_turns=max_turns, max_new_tokens_per_turn=max_new_tokens, max_total_tokens=max_total_tokens, watchdog_s=watchdog
    )
    sampling = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p)
    report, paths = run_eval(
        policy,
        load_suite(suite),
        split,
        samples,
        ks,
        max_tasks,
        concurrency,
        seed,
        out,
        limits,
        sampling,
        tokenizer,
        device=device,
        dtype=dtype,
        shuffle_tools=shuffle_tools,
    )
    _print_report(report)
    console.print(f"report: {paths['markdown']}  numbers: {paths['json']}  trajectories: {paths['trajectories']}")


@app.command()
def show(
    path: Path = typer.Argument(..., help="trajectories JSONL"),
    index: int = typer.Option(0, help="which trajectory (line)"),
    tokens: bool = typer.Option(True, help="show token segments with their loss mask"),
) -> None:
    """Print a readable transcript of one trajectory, masked spans marked."""
    from toolgym.harness.trajectory import read_jsonl

    if not path.exists():
        raise CLIError(f"{path}: no such file")
    trajs = read_jsonl(path)
    if not 0 <= index < len(trajs):
        raise CLIError(f"{path} has {len(trajs)} trajectories; --index must be in 0..{len(trajs) - 1}")
    t = trajs[index]
    console.print(f"[bold]task {t.task_id}[/] ({t.family}, difficulty {t.difficulty}, {t.split}) policy {escape(t.policy)}")
    console.print(
        f"outcome [bold]{t.outcome.value}[/], reward {t.reward}, {len(t.turns)} turns, {t.tool_calls} tool calls"
        + (f", error: {escape(t.error)}" if t.error else "")
    )
    if tokens and t.has_tokens:
        console.print(f"{len(t.token_ids)} tokens, {sum(t.loss_mask)} trained (mask 1)\n")
        for seg in t.segments:
            trained = seg.kind == "policy"
            label = f"[{'green' if trained else 'dim'}]── {seg.kind} · {len(seg.token_ids)} tokens · mask {int(trained)} ──[/]"
            console.print(label)
            console.print(escape(seg.text), style=None if trained else "dim")
    else:
        for m in t.messages:
            console.print(f"[bold]{m['role']}[/]: {escape(str(m['content']))}")
    if t.verdict:
        console.print(f"verdict: {escape(t.verdict.reason)}")


@app.command("check-template")
def check_template_cmd(
    model: str = typer.Argument(
        ...,
        help="a built-in format (qwen2.5, qwen2.5-compact, qwen3, llama3), a built-in model (tiny, smollm2-135m), a model dir or a hub id",
    ),
) -> None:
    """Prove a chat template is prefix-stable for multi-turn tool use, or say where it is not."""
    from toolgym.inference.template_check import check_model_or_format

    report = check_model_or_format(model)
    if report.ok:
        console.print(f"[green]PASS[/] {escape(report.template)}: {report.explanation} ({report.incremental_tokens} tokens)")
        return
    console.print(f"[red]FAIL[/] {escape(report.template)}: {escape(report.explanation)}")
    if report.mismatch_at is not None:
        console.print(f"  first differing token: {report.mismatch_at}")
        console.print(f"  incremental: {escape(repr(report.incremental_text))}")
        console.print(f"  full render: {escape(repr(report.full_text))}")
    raise typer.Exit(1)


@app.command()
def verify(
    task_dir: Path = typer.Argument(..., help="a task folder (task.yaml, workspace/, hidden/)"),
    patch: Path | None = typer.Option(None, help="a unified diff against the task's workspace"),
    backend: str = typer.Option("bwrap", help="sandbox backend: bwrap | docker"),
) -> None:
    """Grade a candidate solution by hand with the task's real verifier (exit 0 only if it passes)."""
    import yaml

    from toolgym.sandbox import SandboxConfig
    from toolgym.tasks import task_from_dict
    from toolgym.tasks.suite import _read_tree
    from toolgym.verifiers import FinalState, verifier_for
    from toolgym.verifiers.patch import PatchError, apply_patch

    meta = task_dir / "task.yaml"
    if not meta.exists():
        raise CLIError(f"{task_dir}: no task.yaml (save a suite with `toolgym tasks SUITE --save DIR` to get task folders)")
    data = yaml.safe_load(meta.read_text()) or {}
    data["workspace"] = _read_tree(task_dir / "workspace")
    data["hidden"] = {**(data.get("hidden") or {}), "files": _read_tree(task_dir / "hidden")}
    task = task_from_dict(data, str(meta))
    changes: dict = {}
    if patch is not None:
        if not patch.exists():
            raise CLIError(f"{patch}: no such file")
        try:
            changes = apply_patch(dict(task.workspace), patch.read_text())
        except PatchError as err:
            raise CLIError(f"{patch}: {err}") from None
    verdict = verifier_for(task, SandboxConfig(backend=backend)).verify(task, FinalState(changes=changes))
    for t in verdict.tests:
        console.print(f"  {'[green]pass[/]' if t.passed else '[red]fail[/]'} {escape(t.name)} {escape(t.message)}")
    for e in verdict.details.get("side_effects", []):
        console.print(f"  [yellow]{e['kind']}[/] {escape(str(e.get('path')))}: {escape(e.get('detail', ''))}")
    console.print(f"[bold]{verdict.outcome.value}[/]: reward {verdict.reward:.2f} ({escape(verdict.reason)})")
    if not verdict.passed:
        raise typer.Exit(1)


@app.command("build-tiny")
def build_tiny(
    out: Path | None = typer.Option(None, help="directory (default: ~/.cache/toolgym/tiny-policy-v1)"),
    overwrite: bool = typer.Option(False, help="rebuild even if it exists"),
) -> None:
    """Build the tiny CPU policy (tokenizer trained here + a small Qwen2 model)."""
    from toolgym.inference.tiny import DEFAULT_DIR, build_tiny_policy

    path = build_tiny_policy(out or DEFAULT_DIR, overwrite=overwrite)
    console.print(f"tiny policy at {path}")


def _is_evaluation(d: Path) -> bool:
    return (d / "report.json").exists() and (d / "trajectories.jsonl").exists()


def _evaluation_dir(d: Path) -> Path:
    """`d`, or the one suite evaluation inside it (a campaign's `OUT/eval/STAGE` holds one per
    suite); a CLIError that names the candidates otherwise."""
    if _is_evaluation(d):
        return d
    inside = sorted(p for p in d.iterdir() if p.is_dir() and _is_evaluation(p)) if d.is_dir() else []
    if len(inside) == 1:
        console.print(f"{d}: comparing its one suite evaluation, {inside[0]}")
        return inside[0]
    hint = f"; it holds one per suite, name one: {', '.join(str(p) for p in inside)}" if inside else ""
    raise CLIError(f"{d}: not an evaluation directory (needs report.json and trajectories.jsonl from `toolgym eval --out`){hint}")


@app.command()
def compare(
    first: Path = typer.Argument(..., help="an evaluation directory (report.json, trajectories.jsonl)"),
    second: Path = typer.Argument(..., help="another evaluation of the same tasks"),
) -> None:
    """Compare two evaluations of the same tasks: pass@1 of each, the paired difference with its
    95% CI, the tasks that flipped either way, and a loud warning if their budgets differ."""
    from toolgym.harness.evaluate import EvalReport, budget_warning, paired_difference, per_task_pass_rate
    from toolgym.harness.trajectory import read_jsonl

    loaded = []
    for d in (first, second):
        d = _evaluation_dir(d)
        report, trajs = d / "report.json", d / "trajectories.jsonl"
        try:
            loaded.append((EvalReport.model_validate_json(report.read_text()), read_jsonl(trajs)))
        except ValueError as err:
            raise CLIError(f"{d}: unreadable evaluation ({str(err).splitlines()[0]})") from None
    (ra, ta), (rb, tb) = loaded
    warning = budget_warning(ra, rb)
    if warning:
        console.print(f"[bold red]{escape(warning)}[/]")
    a, b = per_task_pass_rate(ta), per_task_pass_rate(tb)
    common = sorted(set(a) & set(b))
    if not common:
        raise CLIError("the two evaluations share no graded task: nothing to compare")
    diff = paired_difference(ta, tb)
    gained = [t for t in common if b[t] > a[t]]
    lost = [t for t in common if b[t] < a[t]]
    console.print(
        f"{escape(ra.policy)}: pass@1 {sum(a[t] for t in common) / len(common):.3f}; "
        f"{escape(rb.policy)}: pass@1 {sum(b[t] for t in common) / len(common):.3f} on {len(common)} shared tasks"
    )
    console.print(
        f"difference (second - first) {diff.value * 100:+.1f} points, 95% CI [{diff.low * 100:+.1f}, "
        f"{diff.high * 100:+.1f}], paired; {len(gained)} task(s) flipped to pass, {len(lost)} to fail"
    )
    for label, ids in (("gained", gained), ("lost", lost)):
        for task_id in ids[:10]:
            console.print(f"  {label}: {task_id}")
