"""Environment and task commands: envs, tasks, play, check."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from toolgym.cli.app import CLIError, _imports, app, console, load_suite


@app.command()
def envs() -> None:
    """List registered environments with their task suites."""
    from toolgym.envs import registered

    table = Table("id", "suite", "description")
    for info in registered():
        table.add_row(info.id, info.suite or "-", info.description)
    console.print(table)


@app.command()
def tasks(
    suite: str = typer.Argument(..., help="registered suite name, or a suite directory/JSONL"),
    split: str | None = typer.Option(None, help="train or held-out"),
    limit: int = typer.Option(10, help="how many tasks to list"),
    save: Path | None = typer.Option(None, help="write the (split of the) suite to a dir or .jsonl"),
    to_dataset: Path | None = typer.Option(
        None, "--to-dataset", help="write the suite as a Hugging Face DatasetDict (train, held_out) to this directory"
    ),
    demos: int = typer.Option(
        0, help="with --to-dataset: also write the first N train tasks' oracle demonstrations (SFTTrainer format) to DIR/sft"
    ),
    check: bool = typer.Option(True, help="check held-out/train disjointness"),
) -> None:
    """Show a task suite: counts per split and family, and the first tasks.

    `toolgym tasks mine PKG==VER --out DIR` mines a new suite from PyPI packages (see `--help` there)."""
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
        console.print(f"split check: {len(report.shared_ids)} shared ids, {len(report.near_duplicates)} near-duplicate instructions")
        if not report.clean:
            raise CLIError("held-out overlaps train (see above)")
    if save:
        out = shown.save(save)
        console.print(f"saved {len(shown)} tasks to {out}")
    if to_dataset:
        from toolgym.integrations.datasets import write_suite_dataset

        try:
            counts = write_suite_dataset(s, to_dataset, demos=demos)
        except (ImportError, ValueError) as err:
            raise CLIError(str(err)) from None
        console.print(f"wrote datasets to {to_dataset}: " + ", ".join(f"{k} {v} rows" for k, v in counts.items()))


@app.command()
def play(
    env: str = typer.Argument(..., help="environment id, e.g. records-v0"),
    seed: int = typer.Option(0, help="seed that picks the task"),
    task: str | None = typer.Option(None, help="task id to play instead of a seeded pick"),
    split: str = typer.Option("train", help="train or held-out"),
) -> None:
    """Play an episode at the terminal by typing tool calls (`search field=name value="Ada Moreau"`)."""
    from toolgym.envs import make
    from toolgym.envs.parsing import parse_command_line

    e = make(env, split=split)
    options = {"task": task} if task else None
    obs, info = e.reset(seed=seed, options=options)
    console.print(f"[bold]task {info['task_id']}[/] ({info.get('family')}, difficulty {info.get('difficulty')})")
    console.print(obs)
    console.print("\nType a tool call: `name key=value ...`, `name {json}` or raw <tool_call> text; `:tools`, `:help`, `:quit`.")
    while True:
        try:
            line = input("tool> ")
        except EOFError:
            console.print("\nend of input: episode abandoned")
            raise typer.Exit(1) from None
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
def check(
    env: str = typer.Argument(..., help="environment id"),
    tasks_per_split: int = typer.Option(30, "--tasks", help="tasks sampled per split (0 = all)"),
) -> None:
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


@app.command()
def mcp(
    env_id: str = typer.Argument(..., help="environment id, e.g. shell-ops-v0"),
    split: str | None = typer.Option(None, help="train or held-out (default: the environment's)"),
) -> None:
    """Serve an environment over MCP on stdin/stdout: its tools, plus `reset`, for any MCP client
    (each call is one environment step; results carry reward, end of episode and side effects)."""
    try:
        from toolgym.integrations.mcp_server import serve_stdio
    except ImportError as err:
        raise CLIError(f"the MCP SDK is missing ({err}): pip install 'toolgym[mcp]'") from None
    serve_stdio(env_id, split)
