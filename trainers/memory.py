"""How many tokens a micro-batch may hold: sized from the model and the free memory.

A fixed token budget ignores the model: 16384 tokens is nothing for a 0.4 M-parameter model and
24 GB of activations for SmolLM2-135M (the kernel kills the trainer mid-step). Here the budget
is the free memory (a share of it) over an estimate of the activation memory one token of a
forward and backward holds. The estimate was measured against SmolLM2-135M on the CPU (SDPA
attention, fp32: 2.0 MB per token; bf16 autocast: 1.5 MB): per layer about 12 hidden-size and 6
MLP-size vectors per token, in the weights' dtype (half the bytes for a bf16 model, as on a GPU),
plus the LM head's float32 logits at the trained positions.

Before a step, `check_fits` refuses a micro-batch that would not fit, with a message that says
what to change, instead of letting the kernel's OOM killer end the run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from toolgym.inference.host_memory import release_memory

if TYPE_CHECKING:  # torch is imported by the functions: the CLI imports this module for its error type
    import torch

#: The share of the free memory one micro-batch's activations may take (the rest: the sampling
#: copy of the model, the episodes' KV caches, evaluation batches, the allocator's slack).
MEMORY_SHARE = 0.35
#: Never more than this many padded tokens per micro-batch (beyond it nothing gets faster).
MAX_AUTO_BUDGET = 16384


class TrainingMemoryError(MemoryError):
    """A training step would need more memory than the machine has free; says what to change."""


def bytes_per_token(model: torch.nn.Module) -> int:
    """Activation memory one token holds through a forward and backward (an estimate, see the
    module docstring)."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    hidden = config.hidden_size
    intermediate = getattr(config, "intermediate_size", None) or 4 * hidden
    weight = next(model.parameters(), None)
    width = weight.element_size() if weight is not None and weight.is_floating_point() else 4
    per_layer = width * (12 * hidden + 6 * intermediate)
    lm_head = 4 * 3 * config.vocab_size // 4  # logits, log-softmax and their gradient, at ~1 in 4 positions
    return config.num_hidden_layers * per_layer + lm_head


def free_memory(device: torch.device) -> int:
    """Bytes free for training on `device` (the host's available memory for the CPU). On CUDA,
    what the driver has free plus what torch's caching allocator holds unused: after an
    evaluation's KV caches are freed, the allocator keeps their blocks for reuse, and the driver
    counts them as taken (on an H200, 76 of 139 GiB 'free' after a 64-task evaluation)."""
    if device.type == "cuda":
        import torch

        free, _ = torch.cuda.mem_get_info(device)
        cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        return int(free + cached)
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 8 * 2**30  # not Linux: assume a modest machine


def auto_token_budget(model: torch.nn.Module, device: torch.device) -> int:
    """Padded tokens per micro-batch that fit in `MEMORY_SHARE` of the free memory."""
    fits = int(MEMORY_SHARE * free_memory(device) / bytes_per_token(model))
    return max(64, min(MAX_AUTO_BUDGET, fits))


def check_fits(model: torch.nn.Module, device: torch.device, padded_tokens: int, what: str) -> None:
    """Raise `TrainingMemoryError` if `padded_tokens` in one forward/backward would not fit."""
    need = padded_tokens * bytes_per_token(model)
    free = free_memory(device)
    if need > 0.9 * free:
        raise TrainingMemoryError(
            f"{what}: {padded_tokens} tokens in one micro-batch need about {need / 2**30:.1f} GiB of activations, "
            f"but {free / 2**30:.1f} GiB are free: set rl.learner.token_budget lower (or to auto), shorten "
            f"rollout.max_total_tokens, or use rl.learner.autocast: bf16"
        )


__all__ = [
    "MAX_AUTO_BUDGET",
    "MEMORY_SHARE",
    "TrainingMemoryError",
    "auto_token_budget",
    "bytes_per_token",
    "check_fits",
    "free_memory",
    "release_memory",
]
