"""Registry of procedural task generators: `(seed, index, split) -> Task`, deterministic.

A registered suite names its generator, its split sizes and seeds; `builtin_suite(name)` builds
the train and held-out splits. Generation uses only `numpy.random.default_rng((seed, index))`, so
the same arguments give the same task in any process.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Protocol

from toolgym.tasks.suite import HELDOUT, TRAIN, TaskSuite
from toolgym.tasks.task import Task


class Generator(Protocol):
    """A deterministic task generator."""

    def __call__(self, seed: int, index: int, split: str = TRAIN) -> Task: ...


@dataclass(frozen=True)
class SuiteSpec:
    """How to build a built-in suite from its generator."""

    name: str
    generator: Generator
    train_size: int
    heldout_size: int
    version: str = "1"
    train_seed: int = 0
    heldout_seed: int = 1_000_003
    description: str = ""
    #: For generators that cannot rule out collisions themselves (e.g. small-domain procedural
    #: sources): held-out tasks that share a content hash or a near-duplicate instruction with
    #: train are dropped and replaced by later held-out indices.
    drop_heldout_leaks: bool = False
    #: For suites that are not generated but loaded (e.g. mined from real projects): builds the
    #: whole suite; `generator`, sizes and seeds are then unused.
    loader: Callable[[], TaskSuite] | None = None
    #: The environment the suite belongs to (`register_env(..., tasks=...)` sets it): generated
    #: tasks that leave `env_id` empty get this one.
    env_id: str = ""


_SUITES: dict[str, SuiteSpec] = {}


def register_suite(spec: SuiteSpec) -> SuiteSpec:
    """Register a generated suite under `spec.name` (re-registering the same name replaces it)."""
    _SUITES[spec.name] = spec
    builtin_suite.cache_clear()
    return spec


def suite_specs() -> dict[str, SuiteSpec]:
    """All registered suite specs by name."""
    return dict(_SUITES)


def generate(name: str, split: str, start: int, count: int) -> list[Task]:
    """`count` tasks of suite `name`'s `split`, from generator index `start`."""
    spec = _get(name)
    seed = spec.train_seed if split == TRAIN else spec.heldout_seed
    return [_checked(spec, spec.generator(seed, i, split), split, i) for i in range(start, start + count)]


class GeneratorError(ValueError):
    """A suite's generator returned something the suite cannot use; the message names it and the fix."""


def _checked(spec: SuiteSpec, task: Task, split: str, index: int) -> Task:
    """`task` as the suite keeps it: in the split it was asked for (a generator that drops
    `split=split` would otherwise empty the held-out split silently), with the suite's env id."""
    where = f"suite {spec.name!r}: generator {getattr(spec.generator, '__qualname__', spec.generator)!r}"
    if not isinstance(task, Task):
        raise GeneratorError(f"{where} returned {type(task).__name__} for index {index}, not a Task")
    if task.split != split:
        raise GeneratorError(
            f"{where} returned a task of split {task.split!r} when asked for {split!r} "
            f"(index {index}): pass the split it is called with on, as Task(..., split=split)"
        )
    if not task.env_id:
        if not spec.env_id:
            raise GeneratorError(
                f"{where} returned a task with no env_id: set Task(env_id=...), or register the "
                "generator with its environment (register_env(ENV_ID, tasks=generator))"
            )
        task = Task.model_validate({**task.model_dump(exclude={"id"}), "env_id": spec.env_id})
    return task


def _get(name: str) -> SuiteSpec:
    if name not in _SUITES:
        known = ", ".join(sorted(_SUITES)) or "(none)"
        raise KeyError(f"unknown suite {name!r}; registered suites: {known}")
    return _SUITES[name]


@lru_cache(maxsize=16)
def builtin_suite(name: str, train_size: int | None = None, heldout_size: int | None = None) -> TaskSuite:
    """Build a registered suite: train then held-out tasks (cached per process)."""
    spec = _get(name)
    if spec.loader is not None:
        return spec.loader()
    n_train = spec.train_size if train_size is None else train_size
    n_held = spec.heldout_size if heldout_size is None else heldout_size
    train = generate(name, TRAIN, 0, n_train)
    held = generate(name, HELDOUT, 0, n_held)
    if spec.drop_heldout_leaks:
        held = _without_leaks(name, train, held, n_held)
    return TaskSuite(name, train + held, spec.version)


def _without_leaks(name: str, train: list[Task], held: list[Task], wanted: int) -> list[Task]:
    """Held-out tasks with leaks to train dropped, topped up from later indices (deterministic)."""
    from toolgym.tasks.dedup import find_leaks

    kept: list[Task] = []
    candidates, next_index = held, len(held)
    for _ in range(20):  # each round replaces what the last one dropped
        report = find_leaks(train, candidates)
        bad = set(report.shared_ids) | {h for _, h, _ in report.near_duplicates}
        seen = {t.id for t in kept}
        for task in candidates:
            if task.id not in bad and task.id not in seen and len(kept) < wanted:
                kept.append(task)
                seen.add(task.id)
        if len(kept) >= wanted:
            return kept
        missing = wanted - len(kept)
        candidates = generate(name, HELDOUT, next_index, missing)
        next_index += missing
    raise ValueError(
        f"suite {name!r}: cannot find {wanted} held-out tasks disjoint from train "
        f"({len(kept)} found); the generator's held-out range overlaps train too much"
    )
