"""Shared fixtures. Real components only: no mocks of anything that runs on this machine."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def records_env():
    """A fresh records-v0 environment (unwrapped ToolEnv)."""
    import toolgym

    env = toolgym.make("records-v0").unwrapped
    yield env
    env.close()


def run_cli(*args: str, input: str | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    """Run `python -m toolgym.cli ...` in a fresh process, as a user would run `toolgym ...`."""
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    return subprocess.run([sys.executable, "-m", "toolgym.cli", *args], capture_output=True, text=True,
                          input=input, timeout=timeout, env=env)
