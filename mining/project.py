"""A project to mine: a source distribution fetched from the package index and laid out.

`fetch_sdist` runs `pip download --no-binary :all:` (the only step that needs the network),
`load_project` unpacks it and finds the import root (`src/` or the top level), the package's
source files, its test files and their data; `build_site_layer` installs the project's test
requirements (never the project itself: that is the agent's workspace) into a directory that
sandboxes mount read-only, so episodes and grading run offline.
"""

from __future__ import annotations

import email.parser
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tomllib
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from toolgym.sandbox.fs import publish, staging_name

#: Files never copied into a workspace: build output, VCS data, caches, editor and CI config.
SKIP_DIRS = {
    ".git",
    ".github",
    ".hg",
    "__pycache__",
    "build",
    "dist",
    ".tox",
    ".nox",
    ".venv",
    "docs",
    "doc",
    "documentation",
    "benchmarks",
    "benchmark",
    ".pytest_cache",
    "ci_tools",
    "changelog.d",
    "tools",
    "bin",
    "code_templates",
}
MAX_FILE_BYTES = 400_000
TEST_DIR_NAMES = ("tests", "test", "testing")
#: Test requirements the sandbox image already has, or that only make reports: never installed.
SKIP_REQUIREMENTS = re.compile(r"^(pytest|pytest-cov|coverage|tox|nox|flake8|mypy|black|ruff|pre-commit|sphinx)\b", re.I)


class MiningError(RuntimeError):
    """A project cannot be mined; the message says why and what to try."""


@dataclass
class Project:
    """An unpacked source distribution: what the workspace and the grader need to know."""

    name: str
    version: str
    license: str
    #: Workspace-relative text files: the package source, its tests and their data, the config.
    files: dict[str, str]
    #: Directory (workspace-relative) the package imports from: "." or "src".
    import_root: str
    #: The package's own source files (what the miner mutates and the agent fixes).
    source_files: list[str]
    #: Test modules (what the grader runs).
    test_files: list[str]
    test_requirements: list[str] = field(default_factory=list)

    @property
    def key(self) -> str:
        """`name-version`, the project's name in suites and caches."""
        return f"{self.name}-{self.version}"

    def is_test_path(self, rel: str) -> bool:
        """True for tests, conftest files and anything under a test directory."""
        parts = rel.split("/")
        base = parts[-1]
        return (
            base.startswith("test_") or base.endswith("_test.py") or base == "conftest.py" or any(p in TEST_DIR_NAMES for p in parts[:-1])
        )


def fetch_sdist(spec: str, dest: Path) -> Path:
    """Download the source distribution of `spec` (`name` or `name==version`) into `dest`."""
    dest.mkdir(parents=True, exist_ok=True)
    name = re.split(r"[=<>!~ ]", spec, maxsplit=1)[0]
    cached = _cached_sdist(dest, spec)
    if cached is not None:
        return cached
    # each download lands in its own directory first: downloads may run side by side
    with tempfile.TemporaryDirectory(dir=dest, prefix=".download-") as tmp:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--no-binary",
                ":all:",
                "--disable-pip-version-check",
                "-q",
                "-d",
                tmp,
                spec,
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
        got = sorted(Path(tmp).iterdir())
        new = [dest / got[0].name] if proc.returncode == 0 and got else []
        if new:
            os.replace(got[0], new[0])
    if proc.returncode != 0 or not new:
        found = _cached_sdist(dest, spec)
        if found is not None:
            return found
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no file downloaded"]
        raise MiningError(
            f"{spec}: pip could not download its source distribution ({tail[0]}); check the name and "
            f"version on PyPI (`pip download --no-binary :all: {name}`)"
        )
    return new[0]


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def _cached_sdist(dest: Path, spec: str) -> Path | None:
    """An sdist of `spec` already in `dest` (only for pinned specs: an unpinned one may be stale)."""
    if "==" not in spec:
        return None
    name, version = (s.strip() for s in spec.split("==", 1))
    for path in sorted(dest.iterdir()):
        stem = path.name.removesuffix(".tar.gz").removesuffix(".zip")
        if "-" in stem:
            n, v = stem.rsplit("-", 1)
            if _norm(n) == _norm(name) and v == version:
                return path
    return None


def _unpack(archive: Path, dest: Path) -> Path:
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    if archive.name.endswith(".zip"):
        with zipfile.ZipFile(archive) as z:
            z.extractall(dest)
    else:
        with tarfile.open(archive) as t:
            t.extractall(dest, filter="data")
    roots = [p for p in dest.iterdir() if p.is_dir()]
    if len(roots) != 1:
        raise MiningError(f"{archive.name}: expected one top-level directory in the sdist, found {len(roots)}")
    return roots[0]


def _metadata(root: Path) -> tuple[str, str, str]:
    pkg_info = root / "PKG-INFO"
    if not pkg_info.exists():
        raise MiningError(f"{root.name}: the sdist has no PKG-INFO")
    msg = email.parser.Parser().parsestr(pkg_info.read_text(errors="replace"))
    licence = msg.get("License-Expression") or msg.get("License") or ""
    if not licence or len(licence) > 60:
        classifiers = [c.split("::")[-1].strip() for c in msg.get_all("Classifier") or [] if c.startswith("License")]
        licence = classifiers[0] if classifiers else (licence.splitlines()[0][:60] if licence else "unknown")
    return msg["Name"], msg["Version"], licence


def _test_requirements(root: Path) -> list[str]:
    reqs: list[str] = []
    pyproject = root / "pyproject.toml"
    if pyproject.exists():
        try:
            data = tomllib.loads(pyproject.read_text())
        except tomllib.TOMLDecodeError:
            data = {}
        extras = data.get("project", {}).get("optional-dependencies", {})
        groups = data.get("dependency-groups", {})
        for key in ("test", "tests", "testing"):
            reqs += [r for r in extras.get(key, []) + groups.get(key, []) if isinstance(r, str)]
    return sorted({r for r in reqs if not SKIP_REQUIREMENTS.match(r.strip())})


def load_project(archive: Path, work: Path) -> Project:
    """Unpack `archive` under `work` and lay the project out (see the module docstring)."""
    root = _unpack(archive, work / archive.name.split(".tar")[0].removesuffix(".zip"))
    name, version, licence = _metadata(root)
    import_root = "src" if (root / "src").is_dir() else "."
    files: dict[str, str] = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if not path.is_file() or any(part in SKIP_DIRS or part.endswith(".egg-info") for part in rel.split("/")[:-1]):
            continue
        if path.stat().st_size > MAX_FILE_BYTES or path.name in ("setup.py", "PKG-INFO", "noxfile.py"):
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # binary files cannot be workspace text
        if "\x00" in text:
            continue
        files[rel] = text
    probe = Project(name, version, licence, files, import_root, [], [])
    prefix = "" if import_root == "." else import_root + "/"
    tests = [rel for rel in files if rel.endswith(".py") and (rel.split("/")[-1].startswith("test_") or rel.endswith("_test.py"))]
    source = [rel for rel in files if rel.endswith(".py") and rel.startswith(prefix) and not probe.is_test_path(rel)]
    source = [rel for rel in source if rel not in tests]
    if not source:
        raise MiningError(f"{name}: no Python source files found under {import_root}/")
    if not tests:
        raise MiningError(f"{name} {version}: the sdist carries no test files (test_*.py); choose a package whose sdist ships its tests")
    return Project(name, version, licence, files, import_root, sorted(source), sorted(tests), _test_requirements(root))


def build_site_layer(project: Project, layers: Path) -> Path:
    """Install the project's test requirements into `layers/<hash>` (cached) and return it.

    Built once on the host with pip; sandboxes mount it read-only as their site directory."""
    digest = hashlib.sha256("\n".join(project.test_requirements).encode()).hexdigest()[:12]
    dest = layers / f"{_norm(project.name)}-{digest}"
    if (dest / ".complete").exists():
        return dest
    # built under a staging name: two processes mining at once (two test workers, two miners)
    # each build their copy, and the first to publish wins
    tmp = staging_name(dest)
    tmp.mkdir(parents=True)
    if project.test_requirements:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "-q",
                "--disable-pip-version-check",
                "--no-compile",
                "--only-binary",
                ":all:",
                "--python-version",
                "3.11",
                "--target",
                str(tmp),
                *project.test_requirements,
            ],
            capture_output=True,
            text=True,
            timeout=600,
        )
        if proc.returncode != 0:
            shutil.rmtree(tmp, ignore_errors=True)  # no half-built copy left in the cache
            raise MiningError(
                f"{project.key}: cannot install its test requirements {project.test_requirements}: "
                f"{(proc.stderr or proc.stdout).strip()[-300:]}"
            )
        for shadow in list(tmp.glob("pytest*")) + list(tmp.glob("_pytest*")) + list(tmp.glob("pluggy*")):
            shutil.rmtree(shadow, ignore_errors=True) if shadow.is_dir() else shadow.unlink()  # the image's pytest wins
    (tmp / ".complete").write_text("\n".join(project.test_requirements) + "\n")
    for path in [tmp, *tmp.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)  # readable by the sandbox's unowned uid
    if not (dest / ".complete").exists():
        shutil.rmtree(dest, ignore_errors=True)  # an incomplete layer of an older, interrupted build
    publish(tmp, dest)
    return dest
