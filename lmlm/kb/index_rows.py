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

from dataclasses import dataclass

import numpy as np

__all__ = ["RowOf", "MAX_KEY_ID", "Selection"]

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
