"""What every bench script shares: writing its numbers to `runs/bench/*.json`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_results(out: str | Path, results: Any) -> Path:
    """Write `results` as indented JSON (parents created) and say where."""
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2))
    print(f"written to {path}")
    return path
