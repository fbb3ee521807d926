"""A gymnasium space of free text (any Unicode string up to a length)."""

from __future__ import annotations

import string
from typing import Any

import numpy as np
from gymnasium import spaces


class TextSpace(spaces.Space[str]):
    """Any `str` of at most `max_length` characters.

    gymnasium's `spaces.Text` restricts the alphabet; tool observations and model outputs contain
    arbitrary characters (JSON, newlines, Unicode), so membership here only checks type and length.
    `sample()` draws printable ASCII (useful for fuzzing a parser).
    """

    def __init__(self, max_length: int = 1_000_000, seed: int | np.random.Generator | None = None) -> None:
        self.max_length = max_length
        super().__init__(shape=None, dtype=None, seed=seed)

    @property
    def is_np_flattenable(self) -> bool:
        """Text is not flattenable to a fixed-size array."""
        return False

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        """A random printable string (length 0..64)."""
        n = int(self.np_random.integers(0, 65))
        alphabet = np.array(list(string.printable))
        return "".join(self.np_random.choice(alphabet, size=n))

    def contains(self, x: Any) -> bool:
        """True for a `str` no longer than `max_length`."""
        return isinstance(x, str) and len(x) <= self.max_length

    def __repr__(self) -> str:
        return f"TextSpace(max_length={self.max_length})"

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, TextSpace) and other.max_length == self.max_length
