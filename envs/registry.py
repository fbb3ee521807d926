"""Registration through gymnasium's own registry, under the `toolgym/` namespace.

`register_env("records-v0", RecordsEnv, suite="records")` registers `toolgym/records-v0` with
gymnasium (so `gymnasium.make("toolgym/records-v0")` works) and remembers its suite
(`register_env("convert-v0", tasks=generate)` registers the suite from its generator too);
`make("records-v0")` is a thin helper; `registered()` lists toolgym environments with their suites.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import gymnasium as gym

NAMESPACE = "toolgym"


@dataclass(frozen=True)
class EnvInfo:
    """A registered toolgym environment."""

    id: str
    entry_point: str
    suite: str | None
    description: str
    #: its episodes run in a sandbox, whose side effects are recorded (a `SandboxEnv`)
    sandboxed: bool = False


_ENVS: dict[str, EnvInfo] = {}


def full_id(env_id: str) -> str:
    """`records-v0` -> `toolgym/records-v0` (ids already namespaced are kept)."""
    return env_id if "/" in env_id else f"{NAMESPACE}/{env_id}"


def register_env(
    env_id: str,
    entry_point: Callable | str | None = None,
    *,
    suite: str | None = None,
    max_turns: int | None = None,
    tasks: Callable | None = None,
    train_size: int = 200,
    heldout_size: int = 50,
    **kwargs: Any,
):
    """Register an environment class; usable as a call or as a class decorator.

    `suite` names the registered task suite the environment draws from by default. Or give the
    suite's generator here, `tasks=generate` (`(seed, index, split) -> Task`): one registration
    then names the environment, its suite (`suite`, by default the id without its version:
    `convert-v0` -> `convert`) and the tasks' `env_id` (generated tasks may leave it empty), with
    `train_size` train and `heldout_size` held-out tasks.
    """
    if tasks is not None:
        from toolgym.tasks import SuiteSpec, register_suite

        suite = suite or env_id.split("/")[-1].rsplit("-v", 1)[0]
        register_suite(
            SuiteSpec(
                name=suite,
                generator=tasks,
                train_size=train_size,
                heldout_size=heldout_size,
                description=(tasks.__doc__ or "").strip().split("\n")[0],
                env_id=full_id(env_id),
            )
        )

    def do(target: Callable | str) -> Callable | str:
        fid = full_id(env_id)
        if tasks is not None and isinstance(target, type):
            target.default_suite = suite  # `EnvClass()` draws from the suite too, not only make()
        env_kwargs = dict(kwargs)
        if suite is not None:
            env_kwargs["suite"] = suite
        if max_turns is not None:
            env_kwargs["max_turns"] = max_turns
        if fid in gym.registry:  # re-registration (e.g. a module imported twice) replaces quietly
            del gym.registry[fid]
        gym.register(id=fid, entry_point=target, kwargs=env_kwargs, disable_env_checker=True)
        ep = target if isinstance(target, str) else f"{target.__module__}:{target.__qualname__}"
        doc = "" if isinstance(target, str) else (target.__doc__ or "").strip().split("\n")[0]
        sandboxed = isinstance(target, type) and bool(getattr(target, "runs_in_sandbox", False))
        _ENVS[fid] = EnvInfo(fid, ep, suite or getattr(target, "default_suite", None), doc, sandboxed)
        return target

    return do(entry_point) if entry_point is not None else do


def registered() -> list[EnvInfo]:
    """Every registered toolgym environment, sorted by id (plugins loaded first)."""
    load_plugins()
    return [_ENVS[k] for k in sorted(_ENVS)]


def env_info(env_id: str) -> EnvInfo | None:
    """The registered toolgym environment `env_id` (`records-v0` or `toolgym/records-v0`), or None."""
    load_plugins()
    return _ENVS.get(full_id(env_id))


def make(env_id: str, **kwargs: Any) -> gym.Env:
    """`gymnasium.make` for a toolgym id (namespace optional); unknown ids list what exists."""
    load_plugins()
    fid = full_id(env_id)
    if fid not in gym.registry:
        known = ", ".join(sorted(_ENVS)) or "(none)"
        raise gym.error.UnregisteredEnv(
            f"no environment {fid!r}; registered: {known}. Import the module that registers it (toolgym --import FILE)."
        )
    return gym.make(fid, **kwargs)


_PLUGINS_LOADED = False


def load_plugins() -> None:
    """Import modules named in the `toolgym.envs` entry-point group (once per process)."""
    global _PLUGINS_LOADED
    if _PLUGINS_LOADED:
        return
    _PLUGINS_LOADED = True
    for ep in entry_points(group="toolgym.envs"):
        importlib.import_module(ep.value.split(":")[0])


def import_source(source: str) -> None:
    """Import a Python file path or a module name, for the registrations it makes."""
    path = Path(source)
    if source.endswith(".py") or path.exists():
        if not path.exists():
            raise FileNotFoundError(f"{source}: no such file")
        name = f"toolgym_user_{path.stem}"
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    else:
        importlib.import_module(source)
