"""The `toolgym` command line (typer + rich), split by area: `envs` (envs, tasks, play, check),
`evaluation` (eval, show, check-template, verify, build-tiny), `sandbox` (sandbox ...), `train`
(train, sft, report, demo). Every command exits non-zero with one readable line on bad input;
`--import FILE_OR_MODULE` loads user environments first."""

from toolgym.cli.main import app, main

__all__ = ["app", "main"]
