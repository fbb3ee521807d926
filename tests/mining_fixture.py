"""A small pure-Python project built as a real sdist, for mining tests that need no network."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

SOURCE = '''"""Small text and number helpers."""


def clamp(x, lo=0, hi=10):
    """Limit x to [lo, hi]."""
    if x < lo:
        return lo
    if x > hi:
        return hi
    return x


def chunks(items, size):
    """Split items into lists of `size` (the last may be shorter)."""
    out = []
    for start in range(0, len(items), size):
        out.append(items[start:start + size])
    return out


def mean(xs):
    """Arithmetic mean; 0.0 for an empty list."""
    if not xs:
        return 0.0
    return sum(xs) / len(xs)


def title_words(text, small=("a", "of", "the")):
    """Title-case every word except the small ones (unless first)."""
    words = text.split()
    out = []
    for i, word in enumerate(words):
        if i > 0 and word in small:
            out.append(word)
        else:
            out.append(word[:1].upper() + word[1:])
    return " ".join(out)
'''

TESTS = """import unittest

from {name} import chunks, clamp, mean, title_words


def test_clamp_inside():
    assert clamp(5, 0, 10) == 5


def test_clamp_low():
    assert clamp(-3, 0, 10) == 0


def test_clamp_high():
    assert clamp(12, 0, 10) == 10


def test_chunks_even():
    assert chunks([1, 2, 3, 4], 2) == [[1, 2], [3, 4]]


def test_chunks_ragged():
    assert chunks([1, 2, 3], 2) == [[1, 2], [3]]


def test_mean():
    assert mean([1, 2, 3, 6]) == 3.0


def test_mean_empty():
    assert mean([]) == 0.0


class TitleTests(unittest.TestCase):
    def test_title(self):
        self.assertEqual(title_words("the lord of the rings"), "The Lord of the Rings")

    def test_title_single(self):
        self.assertEqual(title_words("hello"), "Hello")
"""


def build_sdist(dest: Path, name: str = "tinytext", version: str = "1.0") -> Path:
    """Write `name-version.tar.gz` (PKG-INFO, the module, its tests) into `dest`."""
    files = {
        "PKG-INFO": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\nLicense: MIT\n",
        f"{name}.py": SOURCE,
        "tests/test_tinytext.py": TESTS.replace("{name}", name),
        "pyproject.toml": f'[project]\nname = "{name}"\nversion = "{version}"\n',
    }
    dest.mkdir(parents=True, exist_ok=True)
    path = dest / f"{name}-{version}.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for rel, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"{name}-{version}/{rel}")
            info.size = len(data)
            info.mtime = 0
            tar.addfile(info, io.BytesIO(data))
    return path
