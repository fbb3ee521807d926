"""Answer matching as pure functions, shared by environments (step reward) and verifiers."""

from __future__ import annotations

import math
import re
import unicodedata

_PUNCT = re.compile(r"[^\w\s.\-@]")
_SPACE = re.compile(r"\s+")


def normalize_answer(text: str) -> str:
    """Lower-case, NFKC, strip surrounding punctuation/quotes, collapse white space."""
    text = unicodedata.normalize("NFKC", str(text)).strip().lower()
    text = _PUNCT.sub(" ", text)
    text = _SPACE.sub(" ", text).strip()
    return text.strip(".")


def _as_number(text: str) -> float | None:
    try:
        value = float(str(text).strip().replace(",", ""))
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def answers_match(submitted: str | None, expected: str, mode: str = "normalized", tolerance: float = 1e-6) -> bool:
    """True when `submitted` matches `expected` under `mode` (exact | normalized | numeric)."""
    if submitted is None:
        return False
    if mode == "exact":
        return str(submitted) == expected
    if mode == "numeric":
        a, b = _as_number(submitted), _as_number(expected)
        if a is None or b is None:
            return False
        return abs(a - b) <= tolerance * max(1.0, abs(b))
    if mode == "normalized":
        a, b = _as_number(submitted), _as_number(expected)
        if a is not None and b is not None:
            return a == b
        return normalize_answer(submitted) == normalize_answer(expected)
    raise ValueError(f"unknown answer match mode {mode!r}; use exact, normalized or numeric")
