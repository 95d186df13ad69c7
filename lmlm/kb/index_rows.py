"""Key id -> row of the key index, as an array indexed by key id; selections of rows; top-k of scores.

Key ids are the store's row ids: small, dense integers. An ``int32`` array indexed by key id takes
4 bytes a key where a dict of Python ints takes about 100 (5 GB at 5 x 10^7 keys). Exercised by
every :class:`lmlm.kb.index.VectorKeyIndex`.

Examples:
    >>> rows = RowOf(np.array([7, 3]))
    >>> rows.get(3), rows.get(5), rows.of(np.array([7, 9, 3])).tolist()
    (1, -1, [0, -1, 1])
"""

from __future__ import annotations

import contextlib
import ctypes
from dataclasses import dataclass
from typing import Iterator

import numpy as np

__all__ = ["RowOf", "MAX_KEY_ID", "Selection", "allocations_from_os", "trim_heap"]

MAX_KEY_ID = 2**31 - 2  # rows are int32; a store makes key ids one by one from 1


class RowOf:
    """The row of each key id, -1 where the key has none."""

    def __init__(self, keys: np.ndarray | None = None):
        self._a = np.full(0, -1, dtype=np.int32)
        if keys is not None and len(keys):
            self.assign(np.asarray(keys), np.arange(len(keys), dtype=np.int32))  # no int64 copies of 10^7 ids

    def get(self, key_id: int) -> int:
        return int(self._a[key_id]) if 0 <= key_id < len(self._a) else -1

    def of(self, key_ids: np.ndarray) -> np.ndarray:
        """The rows of ``key_ids`` (int64), -1 for ids with none."""
        key_ids = np.asarray(key_ids, dtype=np.int64)
        inside = (key_ids >= 0) & (key_ids < len(self._a))
        out = np.full(len(key_ids), -1, dtype=np.int64)
        out[inside] = self._a[key_ids[inside]]
        return out

    def assign(self, key_ids: np.ndarray, rows: np.ndarray) -> None:
        if not len(key_ids):
            return
        top = int(key_ids.max())
        if key_ids.min() < 0 or top > MAX_KEY_ID:
            bad = key_ids[(key_ids < 0) | (key_ids > MAX_KEY_ID)][0]
            raise ValueError(f"key id {bad} is out of range: key ids are 0 to {MAX_KEY_ID}")
        if top >= len(self._a):
            grown = np.full(max(top + 1, int(len(self._a) * 1.5)), -1, dtype=np.int32)
            grown[:len(self._a)] = self._a
            self._a = grown
        self._a[key_ids] = rows


_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt's parameters
# What glibc's own thresholds rise to on a 64-bit system: the largest block it maps itself, and twice
# that for the heap's free top it keeps
_HEAP_MMAP_THRESHOLD, _HEAP_TRIM_THRESHOLD = 32 << 20, 64 << 20


def _mallopt(param: int, value: int) -> bool:
    try:
        return bool(ctypes.CDLL("libc.so.6").mallopt(param, value))
    except (OSError, AttributeError):  # not glibc
        return False


@contextlib.contextmanager
def allocations_from_os(threshold: int = 128 * 1024) -> Iterator[bool]:
    """Inside the block, glibc's malloc serves every allocation of ``threshold`` bytes or more with
    its own pages from the system, returned when freed (``mallopt(M_MMAP_THRESHOLD)``). An IVF
    grows each of its thousands of lists by reallocating to the next power of two: from the heap,
    the freed blocks stay as holes and the unwritten halves are counted as used, 1.5 times the
    codes' size in all; from the system, only the pages written count (measured 1.1 times at
    1.5 x 10^6 keys), and a list once mapped stays mapped as it grows (``mremap``), after the block too.

    On leaving, the thresholds are set where glibc's own would have risen to (32 MB, and 64 MB of
    free heap kept): once set, they no longer move by themselves, and at 128 kB every tensor and
    array of more than that was mapped and zeroed by the system again at each allocation, which
    halved the encoder's speed in a process holding an IVF (MiniLM on 256 queries, 2 cores: 700
    a second, 1,465 with the thresholds raised). Yields False where the C library is not glibc."""
    done = _mallopt(_M_MMAP_THRESHOLD, threshold)
    try:
        yield done
    finally:
        if done:
            _mallopt(_M_MMAP_THRESHOLD, _HEAP_MMAP_THRESHOLD)
            _mallopt(_M_TRIM_THRESHOLD, _HEAP_TRIM_THRESHOLD)


def trim_heap() -> None:
    """Give the heap's free pages back to the system (glibc keeps them otherwise; elsewhere nothing)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


@dataclass
class Selection:
    """A fixed set of keys to search within (for reading a past version); see :meth:`VectorKeyIndex.select`."""

    key_ids: np.ndarray  # (m,) int64
    rows: np.ndarray  # (m',) int64: rows of the keys that have a vector, as of ``generation``
    bitmap: np.ndarray  # packed little-endian bits over rows
    generation: int


def no_hits(n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    k = max(k, 0)
    return np.full((n, k), -np.inf, dtype=np.float32), np.full((n, k), -1, dtype=np.int64)


def top_k_rows(scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Column positions and values of the ``k`` largest scores per row, best first. scores: (n, m)."""
    k = min(k, scores.shape[1])
    part = np.argpartition(-scores, k - 1, axis=1)[:, :k] if k < scores.shape[1] else \
        np.broadcast_to(np.arange(scores.shape[1]), scores.shape).copy()
    vals = np.take_along_axis(scores, part, axis=1)
    order = np.argsort(-vals, axis=1, kind="stable")
    return np.take_along_axis(part, order, axis=1), np.take_along_axis(vals, order, axis=1)
