"""Vector index over KB keys: one unit-norm embedding per distinct ``(entity, relation)`` key.

:class:`VectorKeyIndex` keeps every key's vector as a stored row (:class:`lmlm.kb.index_codes.RowCodec`: float32;
float16 for IVF, cosines within 1e-3 of float32's; 8-bit PQ codes for the largest KBs) and, once there are enough
keys, an approximate FAISS structure chosen by size (:class:`AnnConfig`): exact search below ``flat_max`` keys, HNSW
(8-bit scalar-quantised codes) up to ``ivf_min``, IVF from there (4-bit product-quantised codes scanned with SIMD
"fast scan", ten times faster than 8-bit codes at 10^6 keys), and from ``pq_min`` the same IVF with rows kept as
``pq_bytes``-byte PQ codes (``ivfpq``: 128 bytes a key instead of float16's 768, so 5 x 10^7 keys fit in a few GB).
The approximate structure only proposes candidates; each query's top ones (``rescore``, ``ivf_rescore``,
``pq_rescore``) are re-scored against the stored rows, so the scores a lookup compares with its threshold are
cosines (of the decoded row for ``ivfpq``); an IVF scans only a query's lists near its nearest (``ivf_probe_gap``).
Deleting a key clears its bit in an alive mask that every search filters on (FAISS ``IDSelectorBitmap``), so a
delete is immediate and costs no rebuild; a dead row keeps its vector (a past version may need it) until
:meth:`rebuild`. A KB given its vectors in chunks (``KnowledgeBase.put_vectors`` with ``expected``) builds the
structure for the final size first (:meth:`VectorKeyIndex.prepare`) and encodes each chunk as it comes, so no float
copy of all rows is ever held. Exercised by every fuzzy ``KnowledgeBase.lookup`` and by ``lmlm bench kb``.

The file (:mod:`lmlm.kb.index_file`) is one file, replaced atomically: a JSON header, then key ids,
alive mask, stored rows, the row codec and the FAISS structure, written and read as a stream.

Examples:
    >>> index = VectorKeyIndex(4)
    >>> index.add(np.array([7, 9]), np.eye(4, dtype=np.float32)[:2])
    >>> index.search(np.eye(4, dtype=np.float32)[1:2], 1)[1].tolist()
    [[9]]
    >>> index.remove([9]), 9 in index, index.has_vector(9)
    (1, False, True)
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import IO, Iterable

import numpy as np

from .index_codes import RowCodec, add_rows, ivf_search, scan_codes
from .index_file import (key_ids_layout, open_body, read_array, read_header, read_key_ids, write_array,
                         write_atomically, write_key_ids)
from ..memory import allocations_from_os
from .index_rows import RowOf, Selection, no_hits, top_k_rows

__all__ = ["AnnConfig", "VectorKeyIndex", "Selection", "read_header", "save_index", "load_index"]

_QUERY_BLOCK = 256  # queries searched together: (256, 128 candidates, 384) float32 is 50 MB of scratch
_RANK = {"flat": 0, "hnsw": 1, "ivf": 2, "ivfpq": 3}
_ROWS = {"flat": "float32", "hnsw": "float32", "ivf": "float16", "ivfpq": "pq"}  # stored rows per structure
_RESCORE = {"hnsw": "rescore", "ivf": "ivf_rescore", "ivfpq": "pq_rescore"}  # candidates re-scored per query
_KEEP = 32  # PQ candidates made cosines after the inner product's ranking (RowCodec.score)
_ADD_CHUNK = 50_000  # rows added to the FAISS structure at a time (decoded rows are float32 scratch)


@dataclass
class AnnConfig:
    """How the index chooses and tunes its approximate structure.

    Args:
        flat_max (int, default 50_000): below this many live keys, search is exact (no ANN).
        ivf_min (int, default 300_000): from this many live keys, IVF; between the two, HNSW.
        pq_min (int, default 4_000_000), pq_bytes (int, default 128): from this many live keys, IVF
            with rows stored as PQ codes of this many bytes (it must divide the dimension).
        pq_scan_bytes (int, default 24), pq_rescore (int, default 1024): bytes of a key's 4-bit IVF
            code there (24: PQ48x4 for 384 dimensions) and candidates re-scored with the PQ rows (by
            table lookups, :meth:`RowCodec.score`). At 5 x 10^6 keys top-1 agreement 0.9675 with 256
            (the exact top-1 among them for 98.6% of queries), 0.9725 with 1,024 (99.4%), searched faster.
            ``lmlm bench kb --triples 1000000 --ann pq_min=500000``: top-1 agreement with exact search
            0.967, batched key match 548 q/s with 256; with ``pq_bytes=96,pq_scan_bytes=48,pq_rescore=128`` 0.9595, 781.
        ivf_max_lists (int, default 4096): at most this many IVF lists (about ``2 sqrt(n)`` below
            it): assigning each added key to its list compares it with every list's centroid, which at
            5 x 10^7 keys and 14,000 lists would cost a 2-core CPU over an hour.
        hnsw_m (int, default 32), hnsw_ef_construction (int, default 40), hnsw_ef_search (int,
            default 128): HNSW neighbours per node and beam widths; ivf_nprobe (int, default 64):
            IVF lists scanned per query at most; rescore (int, default 32), ivf_rescore (int, default
            128): HNSW's and IVF's candidates per query re-scored with the stored rows.
        ivf_probe_gap (int, default 220), ivf_min_probe (int, default 8): a query's lists whose centroid
            scores over this many thousandths below its nearest list's are not scanned, at least
            ``ivf_min_probe`` are (0: all ``ivf_nprobe``; :func:`lmlm.kb.index_codes.ivf_search`).
    """

    flat_max: int = 50_000
    ivf_min: int = 300_000
    hnsw_m: int = 32
    hnsw_ef_construction: int = 40
    hnsw_ef_search: int = 128
    ivf_nprobe: int = 64
    rescore: int = 32
    ivf_rescore: int = 128
    pq_min: int = 4_000_000
    pq_bytes: int = 128
    pq_scan_bytes: int = 24
    pq_rescore: int = 1024
    ivf_max_lists: int = 4096
    ivf_probe_gap: int = 220
    ivf_min_probe: int = 8

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if not isinstance(value, int) or value < (name != "ivf_probe_gap"):
                raise ValueError(f"AnnConfig.{name} must be an int >= {int(name != 'ivf_probe_gap')}, got {value!r}")
        if self.ivf_min < self.flat_max:
            raise ValueError(f"AnnConfig.ivf_min ({self.ivf_min}) must be >= flat_max ({self.flat_max})")
        if self.pq_min < self.ivf_min:
            raise ValueError(f"AnnConfig.pq_min ({self.pq_min}) must be >= ivf_min ({self.ivf_min})")

    def choose(self, n: int) -> str:
        """The structure for ``n`` live keys: ``"flat"``, ``"hnsw"``, ``"ivf"`` or ``"ivfpq"``."""
        return "flat" if n < self.flat_max else "hnsw" if n < self.ivf_min else "ivf" if n < self.pq_min else "ivfpq"

    def lists(self, n: int) -> int:
        """IVF lists for ``n`` keys."""
        return max(1, min(int(2 * np.sqrt(n)), n // 40, self.ivf_max_lists))


class VectorKeyIndex:
    """Stored key vectors plus an approximate FAISS structure chosen by size.

    Args:
        dim (int): vector dimension.
        config (AnnConfig, optional): thresholds and tuning (defaults: :class:`AnnConfig`).
        ann (str, optional): force ``"flat"``, ``"hnsw"``, ``"ivf"`` or ``"ivfpq"`` instead of choosing by size.
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
        self._codec = RowCodec(dim)  # what a stored row is: float32, float16 or a PQ code
        self._vecs = np.zeros((0, dim), dtype=np.float32)  # (capacity, codec.width); rows [0, n) used
        self._keys = np.zeros(0, dtype=np.int32)  # (capacity,) row -> key id (ids are at most MAX_KEY_ID)
        self._alive = np.zeros(0, dtype=bool)  # (capacity,)
        self._n = self._n_alive = 0
        self._row = RowOf()  # key id -> row
        self._ann = None  # FAISS index over rows [0, ann_rows), or None for exact search
        self._ann_rows = 0
        self.ann_kind = "flat"
        self._trained_on = 0  # live keys the structure was built for
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
        return self.live_ids().tolist()

    def live_ids(self) -> np.ndarray:
        """Key ids of the live keys, ascending (int64)."""
        return np.sort(self._keys[:self._n][self._alive[:self._n]]).astype(np.int64)

    @property
    def rows(self) -> int:
        """Stored vectors, live and dead."""
        return self._n

    @property
    def row_codec(self) -> str:
        """What a stored row is: ``float32``, ``float16`` or ``pq128x8``."""
        return self._codec.name

    def vectors(self, ids: Iterable[int]) -> np.ndarray:
        """The stored vectors of ``ids`` (n, dim), decoded; KeyError names the first id with none."""
        ids = np.fromiter(ids, dtype=np.int64)
        rows = self._row.of(ids)
        if (rows < 0).any():
            raise KeyError(f"no vector stored for key id {ids[rows < 0][0]}")
        return self._codec.decode(self._vecs[rows])

    def live_vectors(self) -> tuple[np.ndarray, np.ndarray]:
        """(key ids (m,), vectors (m, dim)) of every live key, decoded (a float32 copy of them all)."""
        alive = self._alive[:self._n]
        return self._keys[:self._n][alive].astype(np.int64), self._codec.decode(self._vecs[:self._n][alive])

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
        self._row.assign(ids[fresh], np.arange(start, start + m))  # first: it refuses ids out of range
        self._vecs[start:start + m] = self._codec.encode(vectors[fresh])
        self._keys[start:start + m] = ids[fresh]
        self._alive[start:start + m] = alive
        self._n += m
        self._n_alive += m if alive else 0
        self._dead_sel = None  # the bitmap of live rows must cover the new rows too
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
        if len(rows):
            self._n_alive -= len(rows)
            self._dead_sel = None
        return len(rows)

    def _reserve(self, n: int) -> None:
        cap = len(self._keys)
        if n <= cap:
            return
        cap = max(n, int(cap * 1.5), 1024)
        # float rows move to float16 once the size calls for IVF: no float32 copy of an IVF's rows
        if self._codec.kind == "float32" and _ROWS[self.forced or self.config.choose(n)] != "float32":
            self._codec = RowCodec(self.dim, "float16")
        vecs = np.empty((cap, self._codec.width), dtype=self._codec.dtype)
        vecs[:self._n] = self._vecs[:self._n]
        keys, alive = np.empty(cap, dtype=np.int32), np.zeros(cap, dtype=bool)
        keys[:self._n], alive[:self._n] = self._keys[:self._n], self._alive[:self._n]
        self._vecs, self._keys, self._alive = vecs, keys, alive

    def _recode(self, codec: RowCodec) -> None:
        """Store every row as ``codec`` stores it, a chunk at a time."""
        if codec.name == self._codec.name and codec.pq is self._codec.pq:
            return
        out = np.empty((len(self._vecs), codec.width), dtype=codec.dtype)
        for i in range(0, self._n, _ADD_CHUNK):
            out[i:i + _ADD_CHUNK] = codec.encode(self._codec.decode(self._vecs[i:i + _ADD_CHUNK]))
        self._vecs, self._codec = out, codec

    # -- the approximate structure ---------------------------------------------------------------
    def prepare(self, sample: np.ndarray, expected: int, progress: bool | None = None) -> None:
        """Build the structure ``expected`` live keys call for, trained on ``sample`` ``(m, dim)``,
        before the rows arrive: each later :meth:`add` stores its rows as that structure keeps them
        (PQ codes for ``ivfpq``) and :meth:`settle` adds them to it, so a KB given 5 x 10^7 vectors
        in chunks never holds them all as floats, nor copies its rows to grow. Rows already stored
        are kept and added too."""
        kind = self.forced or self.config.choose(max(expected, self._n_alive))
        outgrown = kind in ("ivf", "ivfpq") and expected > 4 * self._trained_on
        if _RANK[kind] < _RANK[self.ann_kind] or (kind == self.ann_kind and not outgrown):
            return  # built for this size already (HNSW grows as rows come; IVF until four times its training)
        self._build(kind, np.asarray(sample, dtype=np.float32), max(expected, self._n_alive), progress)
        self._reserve(self._n + max(expected - self._n_alive, 0))  # room for them all: no copy as they come

    def settle(self, progress: bool | None = None) -> None:
        """Bring the approximate structure up to the stored rows: extend it with rows added since,
        or rebuild it when the live keys call for a bigger kind or outgrew an IVF's training four
        times. Removing keys never rebuilds (deletes stay cheap, and a removed key keeps its vector
        for reading past versions); :meth:`rebuild` drops dead rows when asked."""
        want = self.forced or self.config.choose(self._n_alive)
        outgrown = self.ann_kind in ("ivf", "ivfpq") and self._n_alive > 4 * self._trained_on
        if _RANK[want] > _RANK[self.ann_kind] or outgrown:
            self.rebuild(max(want, self.ann_kind, key=_RANK.get), progress)
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
        kind = ann or self.forced or self.config.choose(self._n)
        picked = np.random.default_rng(0).permutation(self._n)[:max(self._n // 4, 65_536)]
        self._build(kind, self._codec.decode(self._vecs[np.sort(picked)]), self._n, progress)

    def _build(self, kind: str, sample: np.ndarray, expected: int, progress: bool | None) -> None:
        """Train the structure ``kind`` on ``sample`` and add every stored row to it."""
        self._ann, self._ann_rows, self._trained_on = None, 0, 0
        self._dead_sel = None
        if kind == "flat" or len(sample) == 0:
            self.ann_kind, self._trained_on = "flat", expected
            self._recode(RowCodec(self.dim, "float32"))
            return
        self.ann_kind = kind
        rows = _ROWS[kind]
        if rows == "pq":
            codec = self._codec if self._codec.kind == "pq" else RowCodec.train_pq(sample, self.config.pq_bytes)
        else:
            codec = RowCodec(self.dim, rows)
        self._recode(codec)
        import faiss

        if kind == "hnsw":
            index = faiss.IndexHNSWSQ(self.dim, faiss.ScalarQuantizer.QT_8bit, self.config.hnsw_m,
                                      faiss.METRIC_INNER_PRODUCT)
            index.hnsw.efConstruction = self.config.hnsw_ef_construction
            index.train(sample)
        else:
            nlist = self.config.lists(expected)
            codes = scan_codes(self.dim, 2 * self.config.pq_scan_bytes if kind == "ivfpq" else self.dim // 4)
            index = faiss.index_factory(self.dim, f"IVF{nlist},{codes}", faiss.METRIC_INNER_PRODUCT)
            ivf = faiss.extract_index_ivf(index)
            ivf.cp.niter, ivf.cp.spherical = 10, True
            index.train(sample[np.random.default_rng(0).permutation(len(sample))[:max(40 * nlist, 65_536)]])
        self._ann, self._trained_on = index, expected
        self._add_to_ann(0, self._n, progress)

    def _add_to_ann(self, start: int, end: int, progress: bool | None = None) -> None:
        from tqdm.auto import tqdm

        show = (end - start) >= 100_000 if progress is None else progress
        with allocations_from_os(), tqdm(total=end - start, desc=f"building {self.ann_kind} index", unit="key",
                                         disable=not show) as bar:  # the structure's growth leaves no heap holes
            for i in range(start, end, _ADD_CHUNK):
                j = min(i + _ADD_CHUNK, end)
                add_rows(self._ann, self._codec.decode(self._vecs[i:j]))
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
            return no_hits(len(q), k)
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
            scores = q @ (self._vecs[:self._n] if self._codec.kind != "pq" else self._codec.decode(self._vecs[:self._n])).T
            if self._n_alive < self._n:
                scores[:, ~self._alive[:self._n]] = -np.inf
            cols, vals = top_k_rows(scores, k)
            return self._pad(vals, self._keys[cols], k)
        scores = q @ self._codec.decode(self._vecs[rows]).T  # (n, m)
        cols, vals = top_k_rows(scores, k)
        return self._pad(vals, self._keys[rows[cols]], k)

    def _approximate(self, q: np.ndarray, k: int, within: Selection | None) -> tuple[np.ndarray, np.ndarray]:
        import faiss

        c = self.config
        cand = max(k, getattr(c, _RESCORE[self.ann_kind]))
        sel = None
        if within is not None:
            bitmap = within.bitmap
            sel = faiss.IDSelectorBitmap(len(bitmap), faiss.swig_ptr(bitmap))
        elif self._n_alive < self._n:
            if self._dead_sel is None:
                bitmap = np.packbits(self._alive[:self._n], bitorder="little")
                self._dead_sel = (bitmap, faiss.IDSelectorBitmap(len(bitmap), faiss.swig_ptr(bitmap)))
            bitmap, sel = self._dead_sel  # keep the bitmap referenced while FAISS reads it
        params = (faiss.SearchParametersHNSW(efSearch=max(c.hnsw_ef_search, cand)) if self.ann_kind == "hnsw"
                  else faiss.SearchParametersIVF(nprobe=c.ivf_nprobe))
        params.sel = sel  # None: every row
        rows = (self._ann.search(q, cand, params=params)[1] if self.ann_kind == "hnsw"  # (n, cand) rows, -1 where none
                else ivf_search(self._ann, q, cand, params, c.ivf_probe_gap / 1000, c.ivf_min_probe))
        cols, vals = top_k_rows(self._codec.score(q, self._vecs, rows, keep=max(k, _KEEP)), k)  # (n, cand) from the stored rows
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
        return {"layout": 3, "rows": self._n, "ann": self.ann_kind if self._ann_saved() else "flat", "forced": self.forced,
                "key_ids": key_ids_layout(self._keys[:self._n]),
                "vectors": self._codec.name, "codec_bytes": len(self._codec.to_bytes()),
                "trained_on": self._trained_on,
                "config": asdict(self.config)}

    def write_body(self, f: IO[bytes], key_ids: dict | None = None) -> None:
        """Key ids (as header ``key_ids`` says; given, it is not worked out again), alive mask (one bit
        a row), stored rows (header ``vectors``), the row codec's quantiser (header ``codec_bytes``),
        then the FAISS structure."""
        n = self._n
        write_key_ids(f, self._keys[:n], key_ids or key_ids_layout(self._keys[:n]))
        write_array(f, np.packbits(self._alive[:n], bitorder="little"))
        for i in range(0, n, 1 << 20):  # a contiguous copy of a slice at a time, never of all rows
            write_array(f, self._vecs[i:min(i + (1 << 20), n)])
        f.write(self._codec.to_bytes())
        if self._ann_saved():  # a structure that lags the rows is rebuilt by the reader instead
            import faiss

            faiss.write_index(self._ann, faiss.PyCallbackIOWriter(f.write))

    @classmethod
    def read_body(cls, f: IO[bytes], header: dict) -> "VectorKeyIndex":
        dim, n = int(header["dim"]), int(header["rows"])
        index = cls(dim, AnnConfig(**header.get("config", {})), header.get("forced"))
        if header.get("layout", 1) >= 2:  # key ids (int32 or, from layout 3, a bitmap) and a bitmap
            keys = read_key_ids(f, header.get("key_ids", {"as": "int32"}), n)
            alive = np.unpackbits(read_array(f, np.uint8, ((n + 7) // 8,)), count=n, bitorder="little").astype(bool)
        else:  # files of earlier versions: int64 key ids, a byte a row
            keys = read_array(f, np.int64, (n,)).astype(np.int32)
            alive = read_array(f, np.uint8, (n,)).astype(bool)
        name = header.get("vectors", "float32")
        width = dim if not name.startswith("pq") else int(name[2:].split("x")[0])
        vecs = read_array(f, np.uint8 if name.startswith("pq") else np.dtype(name), (n, width))
        index._codec = RowCodec.from_header(dim, name, f.read(int(header.get("codec_bytes", 0))))
        index._keys, index._alive, index._vecs = keys, alive, vecs
        index._n, index._n_alive = n, int(alive.sum())
        index._row = RowOf(keys)
        index.ann_kind, index._trained_on = header.get("ann", "flat"), int(header.get("trained_on", 0))
        if _ROWS[index.ann_kind] == "float32" and index._codec.kind == "float16":
            index._recode(RowCodec(dim, "float32"))  # float16 rows of an IVF saved before its structure caught up
        if index.ann_kind != "flat":
            import faiss
            with allocations_from_os():  # the lists' blocks, rounded up to powers of two, count only where written
                index._ann = faiss.read_index(faiss.PyCallbackIOReader(f.read))
            index._ann_rows = n
            if index._ann.ntotal != n:
                raise ValueError(f"index body holds {index._ann.ntotal} coded vectors for {n} rows")
        return index


def _legacy_flat(f: IO[bytes], header: dict) -> VectorKeyIndex:
    """Read an index file of the first format (``faiss-flat``: a serialised ``IndexIDMap2``)."""
    import faiss
    old = faiss.deserialize_index(np.frombuffer(f.read(), dtype=np.uint8))
    ids, index = faiss.vector_to_array(old.id_map).astype(np.int64), VectorKeyIndex(int(header["dim"]))
    if len(ids):
        index.add(ids, old.index.reconstruct_n(0, len(ids)))
    return index


def save_index(index: VectorKeyIndex, path: str | os.PathLike, header: dict) -> None:
    """Write ``index`` with ``header`` (plus kind, dim, size) to ``path`` atomically (temp file + rename)."""
    head = {**header, **index.header(), "kind": index.kind, "dim": index.dim, "size": len(index)}
    write_atomically(path, head, lambda f: index.write_body(f, head["key_ids"]))  # the layout the header names


def load_index(path: str | os.PathLike) -> tuple[VectorKeyIndex, dict] | None:
    """Read an index file written by :func:`save_index`; None if missing, unreadable or of unknown kind."""
    try:
        with open_body(path) as opened:
            if opened is None:
                return None
            header, f = opened
            if header.get("kind") == "faiss-flat":
                return _legacy_flat(f, header), header
            if header.get("kind") != VectorKeyIndex.kind:
                return None
            return VectorKeyIndex.read_body(f, header), header
    except Exception:  # torn or foreign file: the caller rebuilds from the store
        return None
