"""Vector index over KB keys: one unit-norm embedding per distinct active ``(entity, relation)`` key.

The knowledge base talks to the index only through :class:`KeyIndex` (add, remove, search, save,
load), so an approximate index can replace the exact one later. :class:`FaissFlatIndex` is exact
inner-product search (cosine on unit vectors) with ``IndexIDMap2`` so key ids are the store's key
ids and a delete is one ``remove_ids``. Exercised by every fuzzy ``KnowledgeBase.lookup``.

An index file is one file, replaced atomically: an 8-byte magic, a 4-byte little-endian header
length, a JSON header (``version`` of the store it reflects, ``kind``, ``dim``, ``encoder``), then
the serialised FAISS index. Readers check the header alone (:func:`read_header`) to decide whether
the file is newer than what they hold.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Iterable, Protocol

import numpy as np

__all__ = ["KeyIndex", "FaissFlatIndex", "INDEXES", "read_header", "save_index", "load_index"]

_MAGIC = b"LMLMIDX1"


class KeyIndex(Protocol):
    """What the knowledge base needs from a vector index. Ids are int64 key ids."""

    kind: str
    dim: int

    def __len__(self) -> int: ...

    def __contains__(self, key_id: int) -> bool: ...

    def ids(self) -> list[int]:
        """The key ids held."""

    def add(self, ids: np.ndarray, vectors: np.ndarray) -> None:
        """Add ``vectors`` (n, dim) under ``ids`` (n,); ids already present are skipped."""

    def remove(self, ids: Iterable[int]) -> int:
        """Remove ``ids`` (absent ones ignored); returns how many were removed."""

    def search(self, vectors: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-``k`` per query: scores (n, k) float32 and ids (n, k) int64, id -1 where fewer exist."""

    def to_bytes(self) -> bytes: ...

    @classmethod
    def from_bytes(cls, data: bytes, dim: int) -> "KeyIndex": ...


class FaissFlatIndex:
    """Exact cosine search: ``faiss.IndexIDMap2(faiss.IndexFlatIP(dim))``."""

    kind = "faiss-flat"

    def __init__(self, dim: int, index=None):
        import faiss

        self.dim = dim
        self._faiss = faiss
        self.index = index if index is not None else faiss.IndexIDMap2(faiss.IndexFlatIP(dim))
        if self.index.d != dim:
            raise ValueError(f"index dimension {self.index.d} does not match dim={dim}")
        self._ids = set(faiss.vector_to_array(self.index.id_map).tolist())

    def __len__(self) -> int:
        return int(self.index.ntotal)

    def __contains__(self, key_id: int) -> bool:
        return int(key_id) in self._ids

    def ids(self) -> list[int]:
        return sorted(self._ids)

    def add(self, ids: np.ndarray, vectors: np.ndarray) -> None:
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        vectors = np.ascontiguousarray(vectors, dtype=np.float32).reshape(len(ids), self.dim)
        keep = np.array([i not in self._ids for i in ids.tolist()], dtype=bool)
        _, first = np.unique(ids, return_index=True)  # a repeated id in one call is added once
        once = np.zeros(len(ids), dtype=bool)
        once[first] = True
        keep &= once
        if keep.any():
            self.index.add_with_ids(vectors[keep], ids[keep])
            self._ids.update(ids[keep].tolist())

    def remove(self, ids: Iterable[int]) -> int:
        present = [int(i) for i in ids if int(i) in self._ids]
        if not present:
            return 0
        n = int(self.index.remove_ids(np.asarray(present, dtype=np.int64)))
        self._ids.difference_update(present)
        return n

    def search(self, vectors: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        vectors = np.ascontiguousarray(vectors, dtype=np.float32).reshape(-1, self.dim)
        if len(self) == 0 or k <= 0:
            n = len(vectors)
            return np.full((n, max(k, 0)), -np.inf, dtype=np.float32), np.full((n, max(k, 0)), -1, dtype=np.int64)
        scores, ids = self.index.search(vectors, min(k, len(self)))  # (n, k) each
        return scores, ids

    def to_bytes(self) -> bytes:
        return self._faiss.serialize_index(self.index).tobytes()

    @classmethod
    def from_bytes(cls, data: bytes, dim: int) -> "FaissFlatIndex":
        import faiss

        return cls(dim, faiss.deserialize_index(np.frombuffer(data, dtype=np.uint8)))


INDEXES: dict[str, type] = {FaissFlatIndex.kind: FaissFlatIndex}


def read_header(path: str | os.PathLike) -> dict | None:
    """The JSON header of an index file, or None when the file is missing or not an index file."""
    try:
        with open(path, "rb") as f:
            head = f.read(len(_MAGIC) + 4)
            if len(head) < len(_MAGIC) + 4 or head[:len(_MAGIC)] != _MAGIC:
                return None
            (n,) = struct.unpack("<I", head[len(_MAGIC):])
            return json.loads(f.read(n).decode("utf-8"))
    except (OSError, ValueError):
        return None


def save_index(index: KeyIndex, path: str | os.PathLike, header: dict) -> None:
    """Write ``index`` with ``header`` (plus kind and dim) to ``path`` atomically (temp file + rename)."""
    path = Path(path)
    head = json.dumps({**header, "kind": index.kind, "dim": index.dim, "size": len(index)}).encode("utf-8")
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        f.write(_MAGIC + struct.pack("<I", len(head)) + head)
        f.write(index.to_bytes())
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def load_index(path: str | os.PathLike) -> tuple[KeyIndex, dict] | None:
    """Read an index file written by :func:`save_index`; None if missing, unreadable or of unknown kind."""
    try:
        data = Path(path).read_bytes()  # one read: header and body come from the same file
        start = len(_MAGIC) + 4
        if data[:len(_MAGIC)] != _MAGIC:
            return None
        (n,) = struct.unpack("<I", data[len(_MAGIC):start])
        header = json.loads(data[start:start + n].decode("utf-8"))
        if header.get("kind") not in INDEXES:
            return None
        return INDEXES[header["kind"]].from_bytes(data[start + n:], int(header["dim"])), header
    except Exception:  # missing, torn or foreign file: the caller rebuilds from the store
        return None
