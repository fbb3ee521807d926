"""Sandboxes: isolated, resettable places where an agent's commands run, and the side-effect ledger.

Backends: `bwrap` (bubblewrap + overlayfs, the default: no daemon, millisecond reset) and
`docker` (hardened containers against a real dockerd). Both implement `Sandbox` and pass one
conformance suite. Imports nothing else of toolgym (the bottom layer, with `tasks`).
"""

from toolgym.sandbox.base import (
    WORKSPACE,
    Capabilities,
    ExecResult,
    Limits,
    Sandbox,
    SandboxConfig,
    SandboxError,
    SandboxInfraError,
    SandboxUnavailable,
    site_layer_dir,
    with_site_layer,
)
from toolgym.sandbox.ledger import Action, EffectKind, Ledger, Rule, SafetyPolicy, SideEffect

BACKENDS = ("bwrap", "docker")


def make_sandbox(workspace: dict[str, str] | None = None, config: SandboxConfig | None = None, pool=None) -> Sandbox:
    """A sandbox of `config.backend` over `workspace` ({relative path: text})."""
    config = config or SandboxConfig()
    if config.backend == "bwrap":
        from toolgym.sandbox.bwrap import BwrapSandbox

        return BwrapSandbox(workspace, config)
    if config.backend == "docker":
        from toolgym.sandbox.docker_backend import DockerSandbox

        return DockerSandbox(workspace, config, pool=pool)
    raise SandboxError(f"unknown sandbox backend {config.backend!r}; choose from {', '.join(BACKENDS)}")


__all__ = [
    "BACKENDS",
    "WORKSPACE",
    "Action",
    "Capabilities",
    "EffectKind",
    "ExecResult",
    "Ledger",
    "Limits",
    "Rule",
    "SafetyPolicy",
    "Sandbox",
    "SandboxConfig",
    "SandboxError",
    "SandboxInfraError",
    "SandboxUnavailable",
    "SideEffect",
    "make_sandbox",
    "site_layer_dir",
    "with_site_layer",
]
