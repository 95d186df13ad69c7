"""Vector index over KB keys: one unit-norm embedding per distinct ``(entity, relation)`` key.

:class:`VectorKeyIndex` keeps every key's vector (float32; float16 for IVF: half the memory, cosines
within 1e-3 of float32's) and, once there are enough keys, an approximate FAISS structure chosen by
size (:class:`AnnConfig`): exact search below ``flat_max`` keys, HNSW (8-bit scalar-quantised codes)
up to ``ivf_min``, IVF from there (4-bit product-quantised codes scanned with SIMD "fast scan", ten
times faster than 8-bit codes at 10^6 keys). The approximate structure only proposes candidates;
each query's top candidates (``rescore`` for HNSW, ``ivf_rescore`` for IVF) are re-scored against
the stored vectors, so the scores a lookup compares with its threshold are cosines. Deleting a key
clears its bit in an alive mask that every search filters on (FAISS ``IDSelectorBitmap``), so a
delete is immediate and costs no rebuild; a dead row keeps its vector (a past version may need it)
until :meth:`rebuild`.
Exercised by every fuzzy ``KnowledgeBase.lookup`` and by ``lmlm bench kb``.

An index file is one file, replaced atomically: an 8-byte magic, a 4-byte little-endian header
length, a JSON header (``version`` of the store it reflects, ``kind``, ``dim``, ``encoder``,
``rows``, ...), then the body (key ids, alive mask, vectors, serialised FAISS structure). Readers
check the header alone (:func:`read_header`) to decide whether the file is newer than what they hold.

Examples:
    >>> index = VectorKeyIndex(4)
    >>> index.add(np.array([7, 9]), np.eye(4, dtype=np.float32)[:2])
    >>> index.search(np.eye(4, dtype=np.float32)[1:2], 1)[1].tolist()
    [[9]]
    >>> index.remove([9]), 9 in index, index.has_vector(9)
    (1, False, True)
"""

from __future__ import annotations

import json
import mmap
import os
import struct
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Iterable

import numpy as np

from .index_rows import RowOf

__all__ = ["AnnConfig", "VectorKeyIndex", "Selection", "read_header", "save_index", "load_index"]

_MAGIC = b"LMLMIDX1"
_QUERY_BLOCK = 256  # queries searched together: (256, 128 candidates, 384) float32 is 50 MB of scratch
_RANK = {"flat": 0, "hnsw": 1, "ivf": 2}


@dataclass
class AnnConfig:
    """How the index chooses and tunes its approximate structure.

    Args:
        flat_max (int, default 50_000): below this many live keys, search is exact (no ANN).
        ivf_min (int, default 300_000): from this many live keys, IVF; between the two, HNSW.
        hnsw_m (int, default 32): HNSW neighbours per node.
        hnsw_ef_construction (int, default 40), hnsw_ef_search (int, default 128): HNSW beam widths.
        ivf_nprobe (int, default 64): IVF lists scanned per query.
        rescore (int, default 32): HNSW candidates per query re-scored exactly with the float32 vectors.
        ivf_rescore (int, default 128): the same for IVF, whose 4-bit codes rank more coarsely.
    """

    flat_max: int = 50_000
    ivf_min: int = 300_000
    hnsw_m: int = 32
    hnsw_ef_construction: int = 40
    hnsw_ef_search: int = 128
    ivf_nprobe: int = 64
    rescore: int = 32
    ivf_rescore: int = 128

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"AnnConfig.{name} must be a positive int, got {value!r}")
        if self.ivf_min < self.flat_max:
            raise ValueError(f"AnnConfig.ivf_min ({self.ivf_min}) must be >= flat_max ({self.flat_max})")

    def choose(self, n: int) -> str:
        """The structure for ``n`` live keys: ``"flat"``, ``"hnsw"`` or ``"ivf"``."""
        return "flat" if n < self.flat_max else "hnsw" if n < self.ivf_min else "ivf"


@dataclass
class Selection:
    """A fixed set of keys to search within (for reading a past version); see :meth:`VectorKeyIndex.select`."""

    key_ids: np.ndarray  # (m,) int64
    rows: np.ndarray  # (m',) int64: rows of the keys that have a vector, as of ``generation``
    bitmap: np.ndarray  # packed little-endian bits over rows
    generation: int


def _no_hits(n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    k = max(k, 0)
    return np.full((n, k), -np.inf, dtype=np.float32), np.full((n, k), -1, dtype=np.int64)


def _top_k(scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Column positions and values of the ``k`` largest scores per row, best first. scores: (n, m)."""
    k = min(k, scores.shape[1])
    part = np.argpartition(-scores, k - 1, axis=1)[:, :k] if k < scores.shape[1] else \
        np.broadcast_to(np.arange(scores.shape[1]), scores.shape).copy()
    vals = np.take_along_axis(scores, part, axis=1)
    order = np.argsort(-vals, axis=1, kind="stable")
    return np.take_along_axis(part, order, axis=1), np.take_along_axis(vals, order, axis=1)


class VectorKeyIndex:
    """Exact float32 key vectors plus an approximate FAISS structure chosen by size.

    Args:
        dim (int): vector dimension.
        config (AnnConfig, optional): thresholds and tuning (defaults: :class:`AnnConfig`).
        ann (str, optional): force ``"flat"``, ``"hnsw"`` or ``"ivf"`` instead of choosing by size.
    """

    kind = "faiss-keys"

    def __init__(self, dim: int, config: AnnConfig | None = None, ann: str | None = None):
        if not isinstance(dim, int) or dim < 1:
            raise ValueError(f"dim must be a positive int, got {dim!r}")
        if ann is not None and ann not in _RANK:
            raise ValueError(f"ann must be one of {list(_RANK)} or None, got {ann!r}")
        self.dim = dim
        self.config = config or AnnConfig()
        self.forced = ann
        self._vecs = np.zeros((0, dim), dtype=np.float32)  # (capacity, dim); rows [0, n) used; float16 for IVF
        self._keys = np.zeros(0, dtype=np.int64)  # (capacity,) row -> key id
        self._alive = np.zeros(0, dtype=bool)  # (capacity,)
        self._n = 0
        self._n_alive = 0
        self._row = RowOf()  # key id -> row
        self._ann = None  # FAISS index over rows [0, ann_rows), or None for exact search
        self._ann_rows = 0
        self.ann_kind = "flat"
        self._trained_on = 0  # rows when the IVF structure was trained
        self._dead_sel = None  # (bitmap, selector) over live rows, rebuilt after removes
        self.generation = 0  # bumped whenever rows are renumbered

    # -- size and membership ---------------------------------------------------------------------
    def __len__(self) -> int:
        return self._n_alive

    def __contains__(self, key_id: int) -> bool:
        row = self._row.get(int(key_id))
        return row >= 0 and bool(self._alive[row])

    def has_vector(self, key_id: int) -> bool:
        return self._row.get(int(key_id)) >= 0

    def ids(self) -> list[int]:
        return sorted(self._keys[:self._n][self._alive[:self._n]].tolist())

    @property
    def rows(self) -> int:
        """Stored vectors, live and dead."""
        return self._n

    def vectors(self, ids: Iterable[int]) -> np.ndarray:
        """The stored vectors of ``ids`` (n, dim); KeyError names the first id with none."""
        ids = np.fromiter(ids, dtype=np.int64)
        rows = self._row.of(ids)
        if (rows < 0).any():
            raise KeyError(f"no vector stored for key id {ids[rows < 0][0]}")
        return self._vecs[rows].astype(np.float32)

    def live_vectors(self) -> tuple[np.ndarray, np.ndarray]:
        """(key ids (m,), vectors (m, dim)) of every live key, for exact reference searches."""
        alive = self._alive[:self._n]
        return self._keys[:self._n][alive], self._vecs[:self._n][alive].astype(np.float32, copy=False)

    # -- changes ---------------------------------------------------------------------------------
    def add(self, ids: np.ndarray, vectors: np.ndarray, alive: bool = True, build: bool = True) -> None:
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        vectors = np.asarray(vectors, dtype=np.float32)
        if vectors.shape != (len(ids), self.dim):
            raise ValueError(f"vectors must have shape ({len(ids)}, {self.dim}) for {len(ids)} ids, "
                             f"got {vectors.shape}")
        known = self._row.of(ids) >= 0
        if alive and known.any():
            self.restore(ids[known])
        _, first = np.unique(ids[~known], return_index=True)  # new ids, each at its first position
        fresh = np.flatnonzero(~known)[np.sort(first)]
        if not len(fresh):
            return
        start, m = self._n, len(fresh)
        self._reserve(start + m)
        self._vecs[start:start + m] = vectors[fresh]
        self._keys[start:start + m] = ids[fresh]
        self._alive[start:start + m] = alive
        self._row.assign(ids[fresh], np.arange(start, start + m))
        self._n += m
        if alive:
            self._n_alive += m
        else:
            self._dead_sel = None
        if build:
            self.settle()

    def restore(self, ids: Iterable[int]) -> list[int]:
        """Make the stored vectors of ``ids`` live again; returns the ids with no vector."""
        ids = np.fromiter(ids, dtype=np.int64)
        rows = self._row.of(ids)
        back = np.unique(rows[rows >= 0])
        back = back[~self._alive[back]]
        if len(back):
            self._alive[back] = True
            self._n_alive += len(back)
            self._dead_sel = None
        return ids[rows < 0].tolist()

    def remove(self, ids: Iterable[int]) -> int:
        rows = self._row.of(np.fromiter(ids, dtype=np.int64))
        rows = np.unique(rows[rows >= 0])
        rows = rows[self._alive[rows]]
        self._alive[rows] = False
        n = len(rows)
        if n:
            self._n_alive -= n
            self._dead_sel = None
        return n

    def _reserve(self, n: int) -> None:
        cap = len(self._keys)
        if n <= cap:
            return
        cap = max(n, int(cap * 1.5), 1024)
        # stored as the structure the size calls for will store them: no float32 copy of an IVF's rows
        dtype = np.float16 if (self.forced or self.config.choose(n)) == "ivf" else self._vecs.dtype
        vecs = np.empty((cap, self.dim), dtype=dtype)
        vecs[:self._n] = self._vecs[:self._n]
        keys, alive = np.empty(cap, dtype=np.int64), np.zeros(cap, dtype=bool)
        keys[:self._n], alive[:self._n] = self._keys[:self._n], self._alive[:self._n]
        self._vecs, self._keys, self._alive = vecs, keys, alive

    # -- the approximate structure ---------------------------------------------------------------
    def settle(self, progress: bool | None = None) -> None:
        """Bring the approximate structure up to the stored rows: extend it with rows added since,
        or rebuild it when the live keys call for a bigger kind or outgrew an IVF's training four
        times. Removing keys never rebuilds (deletes stay cheap, and a removed key keeps its vector
        for reading past versions); :meth:`rebuild` drops dead rows when asked."""
        want = self.forced or self.config.choose(self._n_alive)
        if _RANK[want] > _RANK[self.ann_kind] or (self.ann_kind == "ivf" and self._n_alive > 4 * self._trained_on):
            self.rebuild(want, progress)
        elif self._ann is not None and self._ann_rows < self._n:
            self._add_to_ann(self._ann_rows, self._n, progress)

    def rebuild(self, ann: str | None = None, progress: bool | None = None) -> None:
        """Drop dead rows and build the structure afresh (``ann`` or the one the size calls for)."""
        live = np.flatnonzero(self._alive[:self._n])
        keep = live if len(live) < self._n else slice(0, self._n)  # every row live: views, no copy
        self._vecs, self._keys = self._vecs[keep], self._keys[keep]
        self._alive = np.ones(len(live), dtype=bool)
        self._n = self._n_alive = len(live)
        self._row = RowOf(self._keys[:self._n])
        self._dead_sel = None
        self.generation += 1
        self.ann_kind = ann or self.forced or self.config.choose(self._n)
        self._ann, self._ann_rows, self._trained_on = None, 0, 0
        if self.ann_kind == "flat" or self._n == 0:
            self.ann_kind = "flat"
        self._vecs = self._vecs.astype(np.float16 if self.ann_kind == "ivf" else np.float32, copy=False)
        if self.ann_kind == "flat":
            return
        import faiss

        sample = self._vecs[np.random.default_rng(0).permutation(self._n)[:max(self._n // 4, 65_536)]]
        sample = sample.astype(np.float32, copy=False)
        if self.ann_kind == "hnsw":
            index = faiss.IndexHNSWSQ(self.dim, faiss.ScalarQuantizer.QT_8bit, self.config.hnsw_m,
                                      faiss.METRIC_INNER_PRODUCT)
            index.hnsw.efConstruction = self.config.hnsw_ef_construction
            index.train(sample)
        else:
            nlist = max(1, min(int(2 * np.sqrt(self._n)), self._n // 40))
            codes = f"PQ{self.dim // 4}x4fs" if self.dim % 4 == 0 else "SQ8"  # 4 dims per 4-bit code
            index = faiss.index_factory(self.dim, f"IVF{nlist},{codes}", faiss.METRIC_INNER_PRODUCT)
            ivf = faiss.extract_index_ivf(index)
            ivf.cp.niter, ivf.cp.spherical = 10, True
            index.train(sample[:max(40 * nlist, 65_536)])
            self._trained_on = self._n_alive
        self._ann = index
        self._add_to_ann(0, self._n, progress)

    def _add_to_ann(self, start: int, end: int, progress: bool | None = None) -> None:
        from tqdm.auto import tqdm

        show = (end - start) >= 100_000 if progress is None else progress
        step = 50_000
        with tqdm(total=end - start, desc=f"building {self.ann_kind} index", unit="key", disable=not show) as bar:
            for i in range(start, end, step):
                j = min(i + step, end)
                self._ann.add(self._vecs[i:j].astype(np.float32, copy=False))
                self._ann_rows = j
                bar.update(j - i)

    # -- search ----------------------------------------------------------------------------------
    def select(self, key_ids: Iterable[int]) -> Selection:
        """A :class:`Selection` of ``key_ids`` to pass as ``search(..., within=...)``."""
        key_ids = np.asarray(sorted({int(i) for i in key_ids}), dtype=np.int64)
        rows = np.sort(self._row.of(key_ids))
        rows = rows[rows >= 0]
        mask = np.zeros(self._n, dtype=bool)
        mask[rows] = True
        return Selection(key_ids, rows, np.packbits(mask, bitorder="little"), self.generation)

    def search(self, vectors: np.ndarray, k: int, within: Selection | None = None) -> tuple[np.ndarray, np.ndarray]:
        q = np.ascontiguousarray(vectors, dtype=np.float32).reshape(-1, self.dim)  # (n, dim)
        if self._ann is not None and self._ann_rows < self._n:
            self.settle()
        if within is not None and within.generation != self.generation:
            within = self.select(within.key_ids)
        if k <= 0 or (self._n_alive == 0 if within is None else len(within.rows) == 0):
            return _no_hits(len(q), k)
        if within is not None and (self._ann is None or len(within.rows) <= self.config.flat_max):
            run = lambda block: self._exact(block, k, within.rows)  # noqa: E731
        elif self._ann is None:
            run = lambda block: self._exact(block, k, None)  # noqa: E731
        else:
            run = lambda block: self._approximate(block, k, within)  # noqa: E731
        if len(q) <= _QUERY_BLOCK:
            return run(q)
        parts = [run(q[i:i + _QUERY_BLOCK]) for i in range(0, len(q), _QUERY_BLOCK)]  # bounded scratch memory
        return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])

    def _exact(self, q: np.ndarray, k: int, rows: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        if rows is None:  # every row: a view of the matrix (no copy), deleted rows scored -inf
            scores = q @ self._vecs[:self._n].T  # (n, rows)
            if self._n_alive < self._n:
                scores[:, ~self._alive[:self._n]] = -np.inf
            cols, vals = _top_k(scores, k)
            return self._pad(vals, self._keys[cols], k)
        scores = q @ self._vecs[rows].astype(np.float32, copy=False).T  # (n, m)
        cols, vals = _top_k(scores, k)
        return self._pad(vals, self._keys[rows[cols]], k)

    def _approximate(self, q: np.ndarray, k: int, within: Selection | None) -> tuple[np.ndarray, np.ndarray]:
        import faiss

        cand = max(k, self.config.rescore if self.ann_kind == "hnsw" else self.config.ivf_rescore)
        sel = None
        if within is not None:
            bitmap = within.bitmap
            sel = faiss.IDSelectorBitmap(len(bitmap), faiss.swig_ptr(bitmap))
        elif self._n_alive < self._n:
            if self._dead_sel is None:
                bitmap = np.packbits(self._alive[:self._n], bitorder="little")
                self._dead_sel = (bitmap, faiss.IDSelectorBitmap(len(bitmap), faiss.swig_ptr(bitmap)))
            bitmap, sel = self._dead_sel  # keep the bitmap referenced while FAISS reads it
        if self.ann_kind == "hnsw":
            params = faiss.SearchParametersHNSW(efSearch=max(self.config.hnsw_ef_search, cand))
        else:
            params = faiss.SearchParametersIVF(nprobe=self.config.ivf_nprobe)
        if sel is not None:
            params.sel = sel
        _, rows = self._ann.search(q, cand, params=params)  # (n, cand) rows, -1 where none
        ok = rows >= 0
        exact = np.einsum("ncd,nd->nc", self._vecs[np.where(ok, rows, 0)].astype(np.float32), q)  # (n, cand)
        exact[~ok] = -np.inf
        cols, vals = _top_k(exact, k)
        picked = np.take_along_axis(rows, cols, axis=1)
        ids = np.where(picked >= 0, self._keys[np.maximum(picked, 0)], -1)
        return self._pad(vals, ids, k)

    @staticmethod
    def _pad(scores: np.ndarray, ids: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        ids = np.where(np.isfinite(scores), ids, -1)
        if scores.shape[1] < k:
            extra = k - scores.shape[1]
            scores = np.pad(scores, ((0, 0), (0, extra)), constant_values=-np.inf)
            ids = np.pad(ids, ((0, 0), (0, extra)), constant_values=-1)
        return scores.astype(np.float32), ids.astype(np.int64)

    # -- persistence -----------------------------------------------------------------------------
    def _ann_saved(self) -> bool:
        return self._ann is not None and self._ann_rows == self._n

    def header(self) -> dict:
        return {"rows": self._n, "ann": self.ann_kind if self._ann_saved() else "flat", "forced": self.forced,
                "vectors": self._vecs.dtype.name,
                "trained_on": self._trained_on,
                "config": asdict(self.config)}

    def write_body(self, f: IO[bytes]) -> None:
        """Key ids (int64), alive mask (uint8), vectors (float32 or float16: header ``vectors``), then
        the FAISS structure."""
        n = self._n
        f.write(memoryview(np.ascontiguousarray(self._keys[:n])).cast("B"))
        f.write(memoryview(np.ascontiguousarray(self._alive[:n]).view(np.uint8)).cast("B"))
        f.write(memoryview(np.ascontiguousarray(self._vecs[:n])).cast("B"))
        if self._ann_saved():  # a structure that lags the rows is rebuilt by the reader instead
            import faiss

            f.write(memoryview(faiss.serialize_index(self._ann)))

    @classmethod
    def from_body(cls, body: memoryview, header: dict) -> "VectorKeyIndex":
        dim, n = int(header["dim"]), int(header["rows"])
        index = cls(dim, AnnConfig(**header.get("config", {})), header.get("forced"))
        dtype = np.dtype(header.get("vectors", "float32"))
        o1, o2, o3 = 8 * n, 9 * n, 9 * n + dtype.itemsize * dim * n
        index._keys = np.frombuffer(body[:o1], dtype=np.int64).copy()
        index._alive = np.frombuffer(body[o1:o2], dtype=np.uint8).astype(bool)
        index._vecs = np.frombuffer(body[o2:o3], dtype=dtype).reshape(n, dim).copy()
        index._n, index._n_alive = n, int(index._alive.sum())
        index._row = RowOf(index._keys)
        index.ann_kind, index._trained_on = header.get("ann", "flat"), int(header.get("trained_on", 0))
        if index.ann_kind != "ivf":  # the float16 copy of an IVF saved before its structure caught up
            index._vecs = index._vecs.astype(np.float32, copy=False)
        if index.ann_kind != "flat":
            import faiss

            index._ann = faiss.deserialize_index(np.frombuffer(body[o3:], dtype=np.uint8))
            index._ann_rows = n
            if index._ann.ntotal != n:
                raise ValueError(f"index body holds {index._ann.ntotal} coded vectors for {n} rows")
        return index


def _legacy_flat(body: memoryview, header: dict) -> VectorKeyIndex:
    """Read an index file of the first format (``faiss-flat``: a serialised ``IndexIDMap2``)."""
    import faiss

    old = faiss.deserialize_index(np.frombuffer(body, dtype=np.uint8))
    ids = faiss.vector_to_array(old.id_map).astype(np.int64)
    index = VectorKeyIndex(int(header["dim"]))
    if len(ids):
        index.add(ids, old.index.reconstruct_n(0, len(ids)))
    return index


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


def _remove_stale_temps(path: Path) -> None:
    """Delete temp files of saves whose process died mid-write (SIGKILL skips their cleanup)."""
    for tmp in path.parent.glob(f".{path.name}.*.tmp"):
        try:
            pid = int(tmp.name.rsplit(".", 2)[-2])
            os.kill(pid, 0)  # raises when no such process
        except (ValueError, ProcessLookupError):
            tmp.unlink(missing_ok=True)
        except OSError:
            pass  # a live process of another user: leave it


def save_index(index: VectorKeyIndex, path: str | os.PathLike, header: dict) -> None:
    """Write ``index`` with ``header`` (plus kind, dim, size) to ``path`` atomically (temp file + rename)."""
    path = Path(path)
    head = json.dumps({**header, **index.header(), "kind": index.kind, "dim": index.dim,
                       "size": len(index)}).encode("utf-8")
    _remove_stale_temps(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(_MAGIC + struct.pack("<I", len(head)) + head)
            index.write_body(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def load_index(path: str | os.PathLike) -> tuple[VectorKeyIndex, dict] | None:
    """Read an index file written by :func:`save_index`; None if missing, unreadable or of unknown kind."""
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            start = len(_MAGIC) + 4
            if data[:len(_MAGIC)] != _MAGIC:
                return None
            (n,) = struct.unpack("<I", data[len(_MAGIC):start])
            header = json.loads(data[start:start + n].decode("utf-8"))
            body = memoryview(data)[start + n:]
            try:
                if header.get("kind") == "faiss-flat":
                    return _legacy_flat(body, header), header
                if header.get("kind") != VectorKeyIndex.kind:
                    return None
                return VectorKeyIndex.from_body(body, header), header
            finally:
                body.release()
    except Exception:  # missing, torn or foreign file: the caller rebuilds from the store
        return None
