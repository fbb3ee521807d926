"""Data-parallel training (DDP and FSDP2): 2 processes under torchrun (gloo) match 1 process on the
same global batch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).with_name("_ddp_step.py")
LR = 1e-2


@pytest.mark.parametrize("parallel", ["ddp", "fsdp2"])
def test_two_process_step_matches_one_process(tmp_path, parallel):
    import importlib.util

    single, ddp = tmp_path / "single.pt", tmp_path / "ddp.pt"
    spec = importlib.util.spec_from_file_location("_ddp_step", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main(str(single))  # the one-process reference, here
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", str(SCRIPT), str(ddp),
                        parallel],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    a, b = torch.load(single), torch.load(ddp)
    assert (a["world"], b["world"]) == (1, 2)
    assert abs(a["rl_loss"] - b["rl_loss"]) < 1e-6 and abs(a["sft_loss"] - b["sft_loss"]) < 1e-5
    assert abs(a["grad_norm"] - b["grad_norm"]) < 1e-5
    for stage in ("after_rl", "state"):
        moved = max((a[stage][k] - b[stage][k]).abs().max().item() for k in a[stage])
        # Adam's first steps are ~lr * sign(grad): float noise in near-zero gradients moves a weight
        # by a small fraction of lr at most; a wrong normaliser or a missing shard moves it by ~lr
        assert moved < 0.01 * LR, (stage, moved)
    changed = max((a["after_rl"][k] - a["state"][k]).abs().max().item() for k in a["state"])
    assert changed > 0.5 * LR  # the steps really moved the weights
