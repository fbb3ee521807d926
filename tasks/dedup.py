"""Split hygiene: held-out tasks must share no content hash and no near-duplicate instruction with train.

Near-duplicates are found with MinHash over character 5-grams of the normalised instruction
(locality-sensitive bands give candidate pairs; the exact Jaccard similarity decides).
"""

from __future__ import annotations

import re
import zlib
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from toolgym.tasks.task import Task

_NUM_HASHES = 64
_BANDS = 16
_PRIME = (1 << 61) - 1
_RNG = np.random.default_rng(20261125)  # fixed seed: MinHash coefficients must not vary per run
_A = _RNG.integers(1, _PRIME - 1, size=_NUM_HASHES, dtype=np.uint64)
_B = _RNG.integers(0, _PRIME - 1, size=_NUM_HASHES, dtype=np.uint64)


def _shingles(text: str, k: int = 5) -> set[int]:
    norm = re.sub(r"\s+", " ", text.lower()).strip()
    if len(norm) < k:
        return {zlib.crc32(norm.encode())}
    return {zlib.crc32(norm[i : i + k].encode()) for i in range(len(norm) - k + 1)}


def _minhash(shingles: set[int]) -> np.ndarray:
    x = np.fromiter(shingles, dtype=np.uint64)
    # (a*x + b) mod p on uint64 wraps; that is still a fine hash family for candidate generation.
    values = (_A[:, None] * x[None, :] + _B[:, None]) % np.uint64(_PRIME)
    return values.min(axis=1)


def jaccard(a: set[int], b: set[int]) -> float:
    """Jaccard similarity of two shingle sets."""
    return len(a & b) / max(1, len(a | b))


@dataclass
class LeakReport:
    """Overlaps between two splits. Empty lists mean the splits are clean."""

    shared_ids: list[str] = field(default_factory=list)
    near_duplicates: list[tuple[str, str, float]] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        """True when nothing leaks."""
        return not self.shared_ids and not self.near_duplicates


def find_leaks(train: list[Task], heldout: list[Task], threshold: float = 0.9) -> LeakReport:
    """Content-hash overlaps and near-duplicate instructions between `train` and `heldout`."""
    report = LeakReport()
    train_ids = {t.id for t in train}
    report.shared_ids = sorted({t.id for t in heldout if t.id in train_ids})

    rows = _BANDS and _NUM_HASHES // _BANDS
    buckets: dict[tuple[int, bytes], list[int]] = defaultdict(list)
    train_sh = [_shingles(t.instruction) for t in train]
    for i, sh in enumerate(train_sh):
        sig = _minhash(sh)
        for band in range(_BANDS):
            buckets[(band, sig[band * rows : (band + 1) * rows].tobytes())].append(i)
    for t in heldout:
        sh = _shingles(t.instruction)
        sig = _minhash(sh)
        candidates: set[int] = set()
        for band in range(_BANDS):
            candidates.update(buckets.get((band, sig[band * rows : (band + 1) * rows].tobytes()), ()))
        for i in sorted(candidates):
            sim = jaccard(sh, train_sh[i])
            if sim >= threshold:
                report.near_duplicates.append((train[i].id, t.id, round(sim, 3)))
                break
    return report
