"""What the hardware computes fast: precision chosen from a probe, never assumed.

CPUs of one kind differ: an AMD EPYC with AVX-512 BF16 runs a bf16 matmul about as fast as fp32,
one with AVX2 only runs it about 50x slower (oneDNN emulates bf16 there). `auto` precision
settings (`model.rollout_dtype`, `rl.learner.autocast`) resolve here: bf16 only on CUDA with bf16
support, or on a CPU whose flags say bf16 is native (AVX512-BF16 or AMX) *and* a short matmul probe
agrees (so `ONEDNN_MAX_CPU_ISA=AVX2` emulation, or a flag the kernels cannot use, gives fp32).

`gemm_ceiling` measures the machine's own matmul throughput, the ceiling the benches report
model-FLOP utilisation against.
"""

from __future__ import annotations

import functools
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

#: /proc/cpuinfo flags that mean the CPU computes bf16 natively.
BF16_FLAGS = ("avx512_bf16", "amx_bf16")
#: A bf16 matmul slower than this many times fp32 is emulated, whatever the flags say.
SLOWER_THAN_FP32 = 2.0


@dataclass(frozen=True)
class Precision:
    """The dtype chosen for one use, and why (printed by the campaign, kept in its metrics)."""

    dtype: str  # "bf16" | "fp32"
    reason: str

    def as_dict(self) -> dict[str, str]:
        """A plain dict for JSON."""
        return asdict(self)


def cpu_flags() -> set[str]:
    """The CPU's feature flags from /proc/cpuinfo (empty where there is none)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def cpu_description() -> str:
    """One line naming the CPU and its vector capability, for figures that depend on it."""
    model = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    flags = cpu_flags()
    bf16 = [f for f in BF16_FLAGS if f in flags]
    return (
        f"{model}, {os.cpu_count()} cores, torch capability {torch.backends.cpu.get_cpu_capability()}"
        f"{', ' + '+'.join(bf16) if bf16 else ', no bf16 instructions'}"
    )


def _matmul_seconds(dtype: torch.dtype, m: int = 32, k: int = 576, n: int = 1536, repeats: int = 20) -> float:
    """Median time of one (m x k) @ (k x n) matmul in `dtype` on the CPU, in one thread (the
    probe must not depend on what the other core is doing)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        gen = torch.Generator().manual_seed(0)
        a = torch.randn(m, k, generator=gen).to(dtype)
        b = torch.randn(k, n, generator=gen).to(dtype)
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            a @ b
            times.append(time.perf_counter() - start)
        return sorted(times)[len(times) // 2]
    finally:
        torch.set_num_threads(threads)


@functools.lru_cache(maxsize=1)
def cpu_bf16() -> Precision:
    """bf16 if this CPU computes it natively (flags and a 2-matmul probe agree), else fp32."""
    flags = cpu_flags()
    have = [f for f in BF16_FLAGS if f in flags]
    if not have:
        return Precision(
            "fp32",
            f"CPU has no bf16 instructions ({torch.backends.cpu.get_cpu_capability()}; bf16 would be emulated, about 50x slower than fp32)",
        )
    slower = _matmul_seconds(torch.bfloat16) / max(_matmul_seconds(torch.float32), 1e-9)
    if slower > SLOWER_THAN_FP32:
        return Precision(
            "fp32",
            f"CPU flags {'+'.join(have)} but a bf16 matmul ran {slower:.1f}x slower than fp32 (kernels limited, e.g. ONEDNN_MAX_CPU_ISA)",
        )
    return Precision("bf16", f"CPU has {'+'.join(have)}: a bf16 matmul ran {slower:.2f}x the time of fp32")


def choose_bf16(setting: str | None, device: torch.device | str) -> Precision:
    """Resolve a precision setting: `auto` picks bf16 where it is native (CUDA with bf16 support,
    or `cpu_bf16`), fp32 elsewhere; `bf16`/`fp32`/None are taken as given (None = fp32)."""
    if setting is None or setting in ("fp32", "float32", "none"):
        return Precision("fp32", "set in the config")
    if setting in ("bf16", "bfloat16"):
        return Precision("bf16", "set in the config")
    if setting != "auto":
        raise ValueError(f"unknown precision {setting!r}; use auto, bf16 or fp32")
    if str(device).startswith("cuda"):
        if torch.cuda.is_available() and torch.cuda.is_bf16_supported():
            return Precision("bf16", f"CUDA device {torch.cuda.get_device_name()} supports bf16")
        return Precision("fp32", "CUDA device without bf16 support")
    return cpu_bf16()


def gemm_ceiling(dtype: torch.dtype = torch.float32, size: int = 1024, seconds: float = 1.5, threads: int | None = None) -> float:
    """This machine's matmul throughput in GFLOP/s for `dtype` with `threads` threads (default:
    torch's), on square `size` matrices: the ceiling model-FLOP utilisation is measured against."""
    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        gen = torch.Generator().manual_seed(0)
        a = torch.randn(size, size, generator=gen).to(dtype)
        b = torch.randn(size, size, generator=gen).to(dtype)
        a @ b  # warm-up: kernels chosen, memory touched
        best, end = 0.0, time.perf_counter() + seconds
        while time.perf_counter() < end:
            start = time.perf_counter()
            a @ b
            best = max(best, 2 * size**3 / (time.perf_counter() - start) / 1e9)
        return best
    finally:
        torch.set_num_threads(before)


__all__ = ["BF16_FLAGS", "Precision", "choose_bf16", "cpu_bf16", "cpu_description", "cpu_flags", "gemm_ceiling"]
