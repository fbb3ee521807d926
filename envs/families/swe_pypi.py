"""`swe-pypi`: fix a real bug-like mutation in a real open-source package, graded by its own tests.

Tasks are mined offline from the package index (`toolgym tasks mine`, see `toolgym.mining`): a
pinned sdist, one AST mutation that breaks some of the package's passing tests, and hidden
grading copies of those tests with sentinels (`verifiers/package_tests.py`). Train and held-out
are different packages. The suite lives where the miner wrote it: `$TOOLGYM_SWE_PYPI` or
`<toolgym cache>/suites/swe-pypi-v0`; the default set is mined with `toolgym tasks mine --default`.
"""

from __future__ import annotations

import os
from pathlib import Path

from toolgym.envs.registry import register_env
from toolgym.envs.sandbox_env import SandboxEnv
from toolgym.tasks import HELDOUT, TRAIN, SuiteSpec, TaskLoadError, TaskSuite, register_suite
from toolgym.tasks.mined import load_mined_suite

SUITE = "swe-pypi"
VERSION = "0"
#: The default set: pinned pure-Python packages whose sdists ship pytest-runnable test suites.
#: (spec, split, licence). Held-out packages never appear in train.
DEFAULT_PACKAGES: tuple[tuple[str, str, str], ...] = (
    ("more-itertools==11.2.1", TRAIN, "MIT"),
    ("boltons==26.2.0", TRAIN, "BSD-3-Clause"),
    ("cachetools==8.0.2", TRAIN, "MIT"),
    ("toolz==1.2.0", TRAIN, "BSD-3-Clause"),
    ("semver==3.1.2", TRAIN, "BSD-3-Clause"),
    ("parse==1.22.4", TRAIN, "MIT"),
    ("inflection==0.5.1", HELDOUT, "MIT"),
    ("tabulate==0.10.0", HELDOUT, "MIT"),
    ("schema==0.7.8", HELDOUT, "MIT"),
    ("tinydb==4.9.0", HELDOUT, "MIT"),
)


def default_suite_dir() -> Path:
    """Where the default `swe-pypi` suite is (or will be) mined."""
    if os.environ.get("TOOLGYM_SWE_PYPI"):
        return Path(os.environ["TOOLGYM_SWE_PYPI"])
    from toolgym.sandbox.base import cache_dir

    return cache_dir() / "suites" / f"{SUITE}-v{VERSION}"


def load_swe_pypi() -> TaskSuite:
    """The mined default suite; a `TaskLoadError` with the command to run when it is not mined yet."""
    root = default_suite_dir()
    if not (root / "suite.yaml").exists():
        raise TaskLoadError(
            f"the {SUITE} suite is not mined on this machine ({root}): run `toolgym tasks mine "
            "--default` first (it fetches 10 packages from PyPI and takes about 30 minutes "
            "on 2 cores), or point $TOOLGYM_SWE_PYPI at a mined suite directory"
        )
    return load_mined_suite(root)


def _not_generated(seed: int, index: int, split: str = TRAIN):
    raise TaskLoadError(f"{SUITE} is mined, not generated: load it with builtin_suite({SUITE!r})")


register_suite(
    SuiteSpec(
        name=SUITE,
        generator=_not_generated,
        train_size=0,
        heldout_size=0,
        version=VERSION,
        loader=load_swe_pypi,
        description="fix a mutation in a real PyPI package; graded by its own tests (mined)",
    )
)


@register_env("swe-pypi-v0", suite=SUITE)
class SwePypiEnv(SandboxEnv):
    """Fix a bug in a real package (its tests show the failure); graded by the package's own tests."""

    default_suite = SUITE
    max_turns = 30
