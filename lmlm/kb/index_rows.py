"""Key id -> row of the key index, as an array indexed by key id.

Key ids are the store's row ids: small, dense integers. An ``int32`` array indexed by key id takes
4 bytes a key where a dict of Python ints takes about 100 (5 GB at 5 x 10^7 keys). Exercised by
every :class:`lmlm.kb.index.VectorKeyIndex`.

Examples:
    >>> rows = RowOf(np.array([7, 3]))
    >>> rows.get(3), rows.get(5), rows.of(np.array([7, 9, 3])).tolist()
    (1, -1, [0, -1, 1])
"""

from __future__ import annotations

import numpy as np

__all__ = ["RowOf", "MAX_KEY_ID"]

MAX_KEY_ID = 2**31 - 2  # rows are int32; a store makes key ids one by one from 1


class RowOf:
    """The row of each key id, -1 where the key has none."""

    def __init__(self, keys: np.ndarray | None = None):
        self._a = np.full(0, -1, dtype=np.int32)
        if keys is not None and len(keys):
            self.assign(np.asarray(keys, dtype=np.int64), np.arange(len(keys)))

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
