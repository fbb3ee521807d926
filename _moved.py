"""Old import paths of modules that moved, kept working.

`harness/` once held the inference engines and the integrations too; they now live in
`toolgym.inference` and `toolgym.integrations` (see docs/design.md). Code written against the old
paths (`toolgym.harness.hf_policy`, `toolgym.trainers.trl_adapter`, ...) still imports: a finder
on `sys.meta_path` answers an old name with the module at its new one (the same module object,
imported only when asked for).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys

_INFERENCE = [
    "chat",
    "cpu_attention",
    "hardware",
    "hf_policy",
    "host_memory",
    "kv_cache",
    "policy",
    "prefix",
    "pretrained",
    "protocol_server",
    "sampling",
    "sglang_client",
    "template_check",
    "tiny",
    "weight_sync",
]

#: old module name -> new module name
MOVED: dict[str, str] = {
    **{f"toolgym.harness.{name}": f"toolgym.inference.{name}" for name in _INFERENCE},
    **{f"toolgym.harness.{name}": f"toolgym.integrations.{name}" for name in ("endpoint", "mcp_server", "datasets")},
    "toolgym.trainers.trl_adapter": "toolgym.integrations.trl_adapter",
    "toolgym.harness.packing": "toolgym.trainers.packing",
}


class _Alias(importlib.abc.Loader):
    """Loads an old name as the already-importable module at its new name."""

    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec):  # noqa: D102 - the loader protocol
        module = importlib.import_module(self.target)
        self._spec = module.__spec__  # importlib sets the alias's spec on it; it is put back below
        return module

    def exec_module(self, module) -> None:  # noqa: D102 - already executed under its new name
        module.__spec__ = self._spec


class MovedModuleFinder(importlib.abc.MetaPathFinder):
    """Finds the modules named in `MOVED` under their old names."""

    def find_spec(self, fullname, path=None, target=None):  # noqa: D102 - the finder protocol
        new = MOVED.get(fullname)
        if new is None:
            return None
        return importlib.util.spec_from_loader(fullname, _Alias(new))


def install() -> None:
    """Put the finder on `sys.meta_path` (once)."""
    if not any(isinstance(f, MovedModuleFinder) for f in sys.meta_path):
        sys.meta_path.append(MovedModuleFinder())
