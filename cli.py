"""The `toolgym` command line (typer + rich). Every command exits non-zero with one readable
line on bad input; `--import FILE_OR_MODULE` loads user environments first."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from toolgym.sandbox.base import IMAGE_TAG

app = typer.Typer(add_completion=False, no_args_is_help=True, help="toolgym: environments, verifiers, "
                  "rollouts and training for LLM agents that use tools.")
console = Console(highlight=False)
err_console = Console(stderr=True, highlight=False)


class CLIError(Exception):
    """An error reported as one line with a non-zero exit."""


@app.callback()
def _root(imports: list[str] = typer.Option([], "--import", "-i", help="Python file or module that "
                                            "registers environments (repeatable).")) -> None:
    from toolgym.envs import import_source

    for source in imports:
        import_source(source)
    _root.imports = tuple(imports)  # type: ignore[attr-defined]


def _imports() -> tuple[str, ...]:
    return getattr(_root, "imports", ())


def load_suite(name_or_path: str):
    """A registered suite name or a path to a suite directory / JSONL file."""
    from toolgym.tasks import TaskSuite, builtin_suite, suite_specs

    if Path(name_or_path).exists():
        return TaskSuite.load(name_or_path)
    if name_or_path in suite_specs():
        return builtin_suite(name_or_path)
    known = ", ".join(sorted(suite_specs())) or "(none)"
    raise CLIError(f"no suite {name_or_path!r}: not a path, and registered suites are: {known}")


@app.command()
def envs() -> None:
    """List registered environments with their task suites."""
    from toolgym.envs import registered

    table = Table("id", "suite", "description")
    for info in registered():
        table.add_row(info.id, info.suite or "-", info.description)
    console.print(table)


@app.command()
def tasks(suite: str = typer.Argument(..., help="registered suite name, or a suite directory/JSONL"),
          split: Optional[str] = typer.Option(None, help="train or held-out"),
          limit: int = typer.Option(10, help="how many tasks to list"),
          save: Optional[Path] = typer.Option(None, help="write the (split of the) suite to a dir or .jsonl"),
          check: bool = typer.Option(True, help="check held-out/train disjointness")) -> None:
    """Show a task suite: counts per split and family, and the first tasks."""
    s = load_suite(suite)
    if split:
        if split not in s.splits:
            raise CLIError(f"suite {s.name!r} has no split {split!r}; it has: {', '.join(s.splits)}")
        shown = s.split(split)
    else:
        shown = s
    console.print(f"suite [bold]{s.name}[/] v{s.version}: {len(s)} tasks; splits {s.splits}")
    console.print(f"families: {shown.families}")
    table = Table("id", "split", "family", "diff", "instruction")
    for task in shown.tasks[:limit]:
        table.add_row(task.id, task.split, task.family, str(task.difficulty), task.instruction[:70])
    console.print(table)
    if check and "held-out" in s.splits and "train" in s.splits:
        report = s.leaks()
        console.print(f"split check: {len(report.shared_ids)} shared ids, "
                      f"{len(report.near_duplicates)} near-duplicate instructions")
        if not report.clean:
            raise CLIError("held-out overlaps train (see above)")
    if save:
        out = shown.save(save)
        console.print(f"saved {len(shown)} tasks to {out}")


@app.command()
def play(env: str = typer.Argument(..., help="environment id, e.g. records-v0"),
         seed: int = typer.Option(0, help="seed that picks the task"),
         task: Optional[str] = typer.Option(None, help="task id to play instead of a seeded pick"),
         split: str = typer.Option("train", help="train or held-out")) -> None:
    """Play an episode at the terminal by typing tool calls (`search field=name value="Ada Moreau"`)."""
    from toolgym.envs import make
    from toolgym.envs.parsing import parse_command_line

    e = make(env, split=split)
    options = {"task": task} if task else None
    obs, info = e.reset(seed=seed, options=options)
    console.print(f"[bold]task {info['task_id']}[/] ({info.get('family')}, difficulty {info.get('difficulty')})")
    console.print(obs)
    console.print("\nType a tool call: `name key=value ...`, `name {json}` or raw <tool_call> text; "
                  "`:tools`, `:help`, `:quit`.")
    while True:
        try:
            line = input("tool> ")
        except EOFError:
            console.print("\nend of input: episode abandoned")
            raise typer.Exit(1)
        line = line.strip()
        if not line:
            continue
        if line in (":q", ":quit", ":exit"):
            console.print("episode abandoned")
            raise typer.Exit(1)
        if line in (":help", ":tools"):
            for spec in e.unwrapped.tools.values():
                console.print(f"  {spec.signature()}: {spec.description}")
            continue
        parsed = parse_command_line(line)
        if parsed.errors:
            console.print(f"[red]could not read that:[/] {parsed.errors[0].message}")
            continue
        obs, reward, terminated, truncated, info = e.step(parsed.calls)
        console.print(obs)
        if terminated or truncated:
            state = "finished" if terminated else f"truncated after {info['turn']} turns"
            console.print(f"[bold]episode {state}: reward {reward}[/]")
            return


@app.command()
def check(env: str = typer.Argument(..., help="environment id"),
          tasks_per_split: int = typer.Option(30, "--tasks", help="tasks sampled per split (0 = all)")) -> None:
    """Check an environment: gymnasium contract, determinism, oracle, do-nothing, reset."""
    from toolgym.envs.checker import run_checks
    from toolgym.envs.registry import full_id, make

    make(env).close()  # fail early, with the registry's message, on an unknown id

    def show(r) -> None:
        mark = "[green]PASS[/]" if r.ok else "[red]FAIL[/]"
        console.print(f"{mark} {escape(r.name)}: {escape(r.detail)}")

    results = run_checks(full_id(env), tasks_per_split, _imports(), on_result=show)
    failed = [r for r in results if not r.ok]
    if failed:
        raise CLIError(f"{len(failed)} of {len(results)} checks failed for {full_id(env)}")
    console.print(f"all {len(results)} checks passed for {full_id(env)}")


sandbox_app = typer.Typer(help="Sandbox backends: build the docker image, reap leftovers, probe.")
app.add_typer(sandbox_app, name="sandbox")


@sandbox_app.command("build-image")
def sandbox_build_image(tag: str = typer.Option(IMAGE_TAG, help="image tag"),
                        force: bool = typer.Option(False, help="rebuild even if the image exists")) -> None:
    """Build the docker base image (Python 3 + pytest) with debootstrap + docker import, no registry."""
    from toolgym.sandbox.image import build_image

    console.print(f"image ready: {build_image(tag, force=force, log=console.print)}")


@sandbox_app.command("reap")
def sandbox_reap() -> None:
    """Remove containers, temp dirs and cgroups left by dead toolgym processes."""
    from toolgym.sandbox.reaper import reap_stale

    console.print(f"removed {reap_stale(docker=True)} leftover(s)")


@sandbox_app.command("probe")
def sandbox_probe(backend: str = typer.Option("bwrap", help="bwrap | docker")) -> None:
    """Start a sandbox, run a command, print the backend's capabilities."""
    from toolgym.sandbox import SandboxConfig, make_sandbox

    with make_sandbox({"hello.txt": "hi\n"}, SandboxConfig(backend=backend)) as box:
        res = box.exec("cat hello.txt && id -u")
        caps = box.capabilities
    console.print(f"{backend}: exit {res.exit_code}, output {res.stdout.split()}; capabilities {caps.model_dump()}")
    if res.exit_code != 0:
        raise CLIError(f"{backend} sandbox could not run a command: {res.stderr.strip()}")


def _print_report(report) -> None:
    o = report.overall
    ks = ", ".join(f"pass@{k} = {o.pass_at[str(k)].value:.3f} [{o.pass_at[str(k)].low:.3f}, "
                   f"{o.pass_at[str(k)].high:.3f}]" for k in report.ks)
    console.print(f"[bold]{escape(report.policy)}[/] on {report.suite}/{report.split}: {ks}")
    r = o.outcome_rates
    console.print(f"  episodes {o.episodes}; format-error rate {r['format_error']:.2f}, timeout {r['timeout']:.2f}, "
                  f"infra-error {r['infra_error']:.2f}; safety events/episode {o.safety_event_rate:.2f}; "
                  f"tool calls/episode {o.mean_tool_calls:.1f}")


@app.command("eval")
def eval_(policy: str = typer.Option(..., help="oracle | null | tiny | hf:PATH | sglang:URL[,URL] | openai:URL[#MODEL]"),
          suite: str = typer.Option("records", help="registered suite name, or a suite directory/JSONL"),
          split: str = typer.Option("held-out", help="which split to evaluate on"),
          samples: int = typer.Option(1, "-n", "--samples", help="samples per task"),
          k: str = typer.Option("1", "-k", help="comma-separated k values for pass@k"),
          max_tasks: int = typer.Option(0, "--tasks", help="evaluate the first N tasks only (0 = all)"),
          concurrency: int = typer.Option(16, help="episodes in flight"),
          seed: int = typer.Option(0, help="seed for environments, sampling and bootstrap"),
          out: Path = typer.Option(Path("runs/eval"), help="output directory"),
          max_turns: Optional[int] = typer.Option(None, help="turn limit (default: the env's)"),
          max_new_tokens: int = typer.Option(96, help="tokens per turn"),
          temperature: float = typer.Option(1.0, help="sampling temperature (0 = greedy)"),
          tokenizer: Optional[str] = typer.Option(None, help="tokenizer for sglang: policies"),
          device: Optional[str] = typer.Option(None, help="tiny/hf: policies: cpu, cuda, cuda:1 (default: cuda if present)"),
          dtype: str = typer.Option("auto", help="tiny/hf: policies: bf16 | fp16 | fp32 | auto (bf16 on CUDA)")) -> None:
    """Evaluate a policy on a suite split: pass@k with CIs, outcome and safety rates, a report."""
    from toolgym.harness.eval_run import run_eval
    from toolgym.harness.policy import SamplingParams
    from toolgym.harness.rollout import RolloutLimits

    try:
        ks = sorted({int(x) for x in k.split(",") if x.strip()})
    except ValueError:
        raise CLIError(f"-k {k!r}: expected comma-separated integers such as 1,8") from None
    if not ks or min(ks) < 1:
        raise CLIError("-k values must be >= 1")
    limits = RolloutLimits(max_turns=max_turns, max_new_tokens_per_turn=max_new_tokens)
    sampling = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature)
    report, paths = run_eval(policy, load_suite(suite), split, samples, ks, max_tasks, concurrency, seed, out,
                             limits, sampling, tokenizer, device=device, dtype=dtype)
    _print_report(report)
    console.print(f"report: {paths['markdown']}  numbers: {paths['json']}  trajectories: {paths['trajectories']}")


@app.command()
def show(path: Path = typer.Argument(..., help="trajectories JSONL"),
         index: int = typer.Option(0, help="which trajectory (line)"),
         tokens: bool = typer.Option(True, help="show token segments with their loss mask")) -> None:
    """Print a readable transcript of one trajectory, masked spans marked."""
    from toolgym.harness.trajectory import read_jsonl

    if not path.exists():
        raise CLIError(f"{path}: no such file")
    trajs = read_jsonl(path)
    if not 0 <= index < len(trajs):
        raise CLIError(f"{path} has {len(trajs)} trajectories; --index must be in 0..{len(trajs) - 1}")
    t = trajs[index]
    console.print(f"[bold]task {t.task_id}[/] ({t.family}, difficulty {t.difficulty}, {t.split}) policy {escape(t.policy)}")
    console.print(f"outcome [bold]{t.outcome.value}[/], reward {t.reward}, {len(t.turns)} turns, {t.tool_calls} tool calls"
                  + (f", error: {escape(t.error)}" if t.error else ""))
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
def check_template_cmd(model: str = typer.Argument(..., help="tiny | qwen2.5 | qwen3 | llama3 | model dir | hub id")) -> None:
    """Prove a chat template is prefix-stable for multi-turn tool use, or say where it is not."""
    from toolgym.harness.template_check import check_model_or_format

    report = check_model_or_format(model)
    if report.ok:
        console.print(f"[green]PASS[/] {escape(report.template)}: {report.explanation} "
                      f"({report.incremental_tokens} tokens)")
        return
    console.print(f"[red]FAIL[/] {escape(report.template)}: {escape(report.explanation)}")
    if report.mismatch_at is not None:
        console.print(f"  first differing token: {report.mismatch_at}")
        console.print(f"  incremental: {escape(repr(report.incremental_text))}")
        console.print(f"  full render: {escape(repr(report.full_text))}")
    raise typer.Exit(1)


@app.command()
def verify(task_dir: Path = typer.Argument(..., help="a task folder (task.yaml, workspace/, hidden/)"),
           patch: Optional[Path] = typer.Option(None, help="a unified diff against the task's workspace"),
           backend: str = typer.Option("bwrap", help="sandbox backend: bwrap | docker")) -> None:
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
def build_tiny(out: Optional[Path] = typer.Option(None, help="directory (default: ~/.cache/toolgym/tiny-policy-v1)"),
               overwrite: bool = typer.Option(False, help="rebuild even if it exists")) -> None:
    """Build the tiny CPU policy (tokenizer trained here + a small Qwen2 model)."""
    from toolgym.harness.tiny import DEFAULT_DIR, build_tiny_policy

    path = build_tiny_policy(out or DEFAULT_DIR, overwrite=overwrite)
    console.print(f"tiny policy at {path}")


@app.command()
def demo(out: Path = typer.Option(Path("runs/demo"), help="output directory"),
         tasks_: int = typer.Option(40, "--tasks", help="held-out tasks per evaluation")) -> None:
    """The main job on the embedded defaults: evaluate the oracle and the untrained tiny policy on
    the records held-out split, then the oracle on sandboxed shell-ops tasks in the local bwrap
    sandbox with the hidden state checker; reports in OUT/oracle, OUT/tiny and OUT/shell-ops."""
    from toolgym.harness.eval_run import run_eval
    from toolgym.harness.policy import SamplingParams
    from toolgym.harness.rollout import RolloutLimits

    suite = load_suite("records")
    console.print("[bold]1/3[/] oracle policy (an upper bound: every task must pass)")
    report, paths = run_eval("oracle", suite, "held-out", 1, [1], tasks_, 16, 0, out / "oracle")
    _print_report(report)
    console.print("[bold]2/3[/] untrained tiny policy (a lower bound: near 0, mostly format errors)")
    report, paths = run_eval("tiny", suite, "held-out", 4, [1, 4], tasks_, 32, 0, out / "tiny",
                             RolloutLimits(max_turns=4, max_new_tokens_per_turn=48),
                             SamplingParams(max_new_tokens=48, temperature=1.0))
    _print_report(report)
    tiny_md = paths["markdown"]
    console.print("[bold]3/3[/] oracle on sandboxed shell-ops tasks (bwrap sandbox, hidden state checker)")
    report, paths = run_eval("oracle", load_suite("shell-ops"), "held-out", 1, [1], min(tasks_, 16), 4, 0,
                             out / "shell-ops")
    _print_report(report)
    console.print(f"reports: {out / 'oracle' / 'report.md'}, {tiny_md}, {paths['markdown']}")


def main() -> None:
    """Entry point: run the app, turning known errors into one line and exit code 2."""
    import gymnasium

    from toolgym.harness.policy import PolicyError
    from toolgym.sandbox import SandboxError
    from toolgym.tasks import SplitLeakError, TaskLoadError

    try:
        rc = app(standalone_mode=False)  # click returns a raised Exit's code in this mode
        if isinstance(rc, int) and rc != 0:
            sys.exit(rc)
    except typer.Exit as exit_:
        sys.exit(exit_.exit_code)
    except (CLIError, TaskLoadError, SplitLeakError, KeyError, ValueError, FileNotFoundError, OSError,
            gymnasium.error.Error, PolicyError, SandboxError) as err:
        msg = err.args[0] if isinstance(err, KeyError) and err.args else err
        err_console.print(f"error: {msg}")
        sys.exit(2)
    except Exception as err:  # click usage errors and anything unforeseen: still one line
        import click

        if isinstance(err, click.exceptions.ClickException):
            err.show()
            sys.exit(err.exit_code)
        if isinstance(err, click.exceptions.Abort):
            sys.exit(130)
        err_console.print(f"error: {type(err).__name__}: {err}")
        sys.exit(1)


if __name__ == "__main__":
    main()
