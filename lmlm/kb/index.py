"""Vector index over KB keys: one unit-norm embedding per distinct ``(entity, relation)`` key.

:class:`VectorKeyIndex` keeps every key's vector as a stored row (:class:`RowCodec`: float32;
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

The module's sections, in order: key id -> row (:class:`RowOf`: an ``int32`` array indexed by key id, 4 bytes a
key where a dict of Python ints takes about 100), selections and top-k of scores; the file (one file, replaced
atomically: an 8-byte magic, a 4-byte header length, a JSON header with the store ``version`` it reflects, then key
ids, alive mask, stored rows, the row codec and the FAISS structure, written and read as a stream, so saving or
loading 5 x 10^7 keys holds no second copy; :func:`read_header` reads the header alone); the stored rows
(:class:`RowCodec`: ``float32`` for exact search and HNSW, ``float16`` for IVF, ``pq``, a FAISS product quantiser of
``m`` bytes a row, scored from the codes by table lookups, for the sizes where float16 rows no longer fit: 54.6M
keys take 42 GB as float16, 7.0 GB as 128-byte codes) and the IVF scans; then the index itself.

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
import os
import struct
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Callable, Iterable, Iterator

import numpy as np

from ..memory import allocations_from_os

__all__ = ["AnnConfig", "VectorKeyIndex", "Selection", "RowOf", "MAX_KEY_ID", "RowCodec", "KINDS", "MAGIC",
           "read_header", "save_index", "load_index", "write_atomically", "open_body", "read_array", "write_array",
           "add_rows", "ivf_search", "scan_codes", "block_lists", "no_hits", "top_k_rows"]


# -- key id -> row; selections; top-k ------------------------------------------------------------------------

MAX_KEY_ID = 2**31 - 2  # rows are int32; a store makes key ids one by one from 1


class RowOf:
    """The row of each key id, -1 where the key has none.

    Examples:
        >>> rows = RowOf(np.array([7, 3]))
        >>> rows.get(3), rows.get(5), rows.of(np.array([7, 9, 3])).tolist()
        (1, -1, [0, -1, 1])
    """

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


# -- the file ------------------------------------------------------------------------------------------------

MAGIC = b"LMLMIDX1"


def read_header(path: str | os.PathLike) -> dict | None:
    """The JSON header of an index file, or None when the file is missing or not an index file."""
    try:
        with open(path, "rb") as f:
            return _header(f)
    except (OSError, ValueError):
        return None


def _header(f: IO[bytes]) -> dict | None:
    head = f.read(len(MAGIC) + 4)
    if len(head) < len(MAGIC) + 4 or head[:len(MAGIC)] != MAGIC:
        return None
    (n,) = struct.unpack("<I", head[len(MAGIC):])
    return json.loads(f.read(n).decode("utf-8"))


@contextmanager
def open_body(path: str | os.PathLike) -> Iterator[tuple[dict, IO[bytes]] | None]:
    """``(header, file at the start of the body)``, or None for a missing or foreign file."""
    try:
        f = open(path, "rb")
    except OSError:
        yield None
        return
    with f:
        try:
            header = _header(f)
        except ValueError:
            header = None
        yield None if header is None else (header, f)


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


def write_atomically(path: str | os.PathLike, header: dict, write_body: Callable[[IO[bytes]], None]) -> None:
    """Write ``header`` and the body ``write_body(f)`` writes to ``path`` (temp file, fsync, rename)."""
    path = Path(path)
    head = json.dumps(header).encode("utf-8")
    _remove_stale_temps(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(MAGIC + struct.pack("<I", len(head)) + head)
            write_body(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def write_array(f: IO[bytes], a: np.ndarray) -> None:
    f.write(memoryview(np.ascontiguousarray(a)).cast("B"))


def read_array(f: IO[bytes], dtype, shape: tuple[int, ...]) -> np.ndarray:
    """An array of ``shape`` read straight into its own memory; ValueError if the file ends first."""
    out = np.empty(shape, dtype=dtype)
    view = memoryview(out.reshape(-1)).cast("B")
    got = f.readinto(view) if view.nbytes else 0
    if got != view.nbytes:
        raise ValueError(f"index file ends after {got} of {view.nbytes} bytes of a {dtype} array")
    return out


def key_ids_layout(keys: np.ndarray) -> dict:
    """How an index file stores the key id of each row: ``{"as": "bitmap", "first": a, "last": b}``
    when the ids rise row by row (a KB indexed from its store in one go: one bit for each id from
    ``a`` to ``b``, an eighth of a byte a key where int32 takes 4), else ``{"as": "int32"}``."""
    n = len(keys)
    if n == 0:
        return {"as": "int32"}
    for i in range(0, n - 1, 1 << 22):  # a chunk at a time: no int64 difference of 10^7 ids
        part = keys[i:min(i + (1 << 22) + 1, n)]
        if (part[1:] <= part[:-1]).any():
            return {"as": "int32"}
    first, last = int(keys[0]), int(keys[-1])
    return {"as": "bitmap", "first": first, "last": last} if (last - first + 1) // 8 < 4 * n else {"as": "int32"}


def write_key_ids(f: IO[bytes], keys: np.ndarray, layout: dict) -> None:
    if layout["as"] == "int32":
        write_array(f, np.asarray(keys, dtype=np.int32))
        return
    first, span = layout["first"], layout["last"] - layout["first"] + 1
    mask = np.zeros(span, dtype=bool)  # a byte a key id for a moment (55 MB at 5.5 x 10^7)
    for i in range(0, len(keys), 1 << 22):
        mask[keys[i:i + (1 << 22)] - first] = True
    write_array(f, np.packbits(mask, bitorder="little"))


def read_key_ids(f: IO[bytes], layout: dict, n: int) -> np.ndarray:
    """The ``(n,)`` int32 key ids :func:`write_key_ids` wrote; ValueError if they are not ``n``."""
    if layout.get("as", "int32") == "int32":
        return read_array(f, np.int32, (n,))
    first, span = int(layout["first"]), int(layout["last"]) - int(layout["first"]) + 1
    bits = np.unpackbits(read_array(f, np.uint8, ((span + 7) // 8,)), count=span, bitorder="little")
    keys = np.flatnonzero(bits).astype(np.int32)
    if len(keys) != n:
        raise ValueError(f"index file's key id bitmap holds {len(keys)} ids for {n} rows")
    return keys + np.int32(first)


# -- stored rows and IVF scans -------------------------------------------------------------------------------

KINDS = ("float32", "float16", "pq")
_BLOCKED_FROM = 1024  # rows from which RowCodec._pq_codes and add_rows take their blocked paths; fewer: FAISS's own


class RowCodec:
    """What one stored row of the key index is, and how to read it back as a float32 vector.

    Args:
        dim (int): vector dimension.
        kind (str): ``"float32"``, ``"float16"`` or ``"pq"``.
        pq (faiss.ProductQuantizer, optional): the trained quantiser, for ``kind="pq"`` (see :meth:`train_pq`).
    """

    def __init__(self, dim: int, kind: str = "float32", pq=None):
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
        if (kind == "pq") != (pq is not None):
            raise ValueError("a pq codec needs its trained quantiser (RowCodec.train_pq), and only it")
        self.dim, self.kind, self.pq = dim, kind, pq
        if pq is not None:
            # the centroids also laid out sub-vector by sub-vector: a few rows are encoded by FAISS's
            # path for short sub-vectors (3 dims at 128 bytes), 1.8x faster than without it
            pq.sync_transposed_centroids()

    @classmethod
    def train_pq(cls, sample: np.ndarray, m: int) -> "RowCodec":
        """A ``pq`` codec of ``m`` bytes a row trained on ``sample`` ``(n, dim)`` float32 rows."""
        import faiss

        dim = sample.shape[1]
        if dim % m:
            raise ValueError(f"pq_bytes ({m}) must divide the vector dimension ({dim})")
        pq = faiss.ProductQuantizer(dim, m, 8)
        pq.cp.min_points_per_centroid = 1  # a small KB trains on what it has, without a warning per sub-vector
        pq.train(np.ascontiguousarray(sample, dtype=np.float32))
        return cls(dim, "pq", pq)

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(np.uint8 if self.kind == "pq" else self.kind)

    @property
    def width(self) -> int:
        """Array columns a row takes (bytes for ``pq``)."""
        return int(self.pq.code_size) if self.kind == "pq" else self.dim

    @property
    def name(self) -> str:
        """``float32``, ``float16`` or ``pq128x8``: what an index file's header records."""
        return f"pq{self.pq.M}x8" if self.kind == "pq" else self.kind

    def encode(self, vectors: np.ndarray) -> np.ndarray:
        """``(n, dim)`` float32 -> ``(n, width)`` stored rows."""
        if self.kind == "pq":
            return self._pq_codes(np.ascontiguousarray(vectors, dtype=np.float32))
        return np.asarray(vectors).astype(self.dtype, copy=False)

    def _pq_codes(self, x: np.ndarray) -> np.ndarray:
        """Each sub-vector's nearest centroid. ``ProductQuantizer.compute_codes`` takes a scalar
        loop for sub-vectors this short (3 dims at 128 bytes): 12k rows/s on 2 cores, over half of
        the index build at 5.46 x 10^7 keys. Many rows at a time go through FAISS's blocked
        exhaustive search instead, one sub-quantiser after another (distances by matrix product,
        SIMD arg-min): 6.5x faster, the same codes but for exact ties (4 sub-codes in 6.4 x 10^6)."""
        if len(x) < _BLOCKED_FROM:
            return self.pq.compute_codes(x)
        import faiss

        m, dsub = self.pq.M, self.pq.dsub
        codes = np.empty((len(x), m), dtype=np.uint8)
        for j in range(m):
            _, nearest = faiss.knn(np.ascontiguousarray(x[:, j * dsub:(j + 1) * dsub]), self.table[j], 1)
            codes[:, j] = nearest[:, 0]
        return codes

    def decode(self, rows: np.ndarray) -> np.ndarray:
        """Stored rows ``(..., width)`` -> float32 vectors ``(..., dim)``."""
        if self.kind != "pq":
            return rows.astype(np.float32, copy=False)
        codes = rows.reshape(-1, self.width)
        flat = self.table[np.arange(self.width), codes].reshape(len(codes), self.dim)  # (n, m, dim / m) gathered
        flat /= np.maximum(np.linalg.norm(flat, axis=1, keepdims=True), 1e-12)  # the rows were unit vectors
        return flat.reshape(*rows.shape[:-1], self.dim)

    def score(self, q: np.ndarray, stored: np.ndarray, rows: np.ndarray, keep: int | None = None) -> np.ndarray:
        """Cosines of queries ``q`` ``(n, dim)`` with the decoded stored rows ``stored[rows]``, ``rows``
        ``(n, c)`` (-inf where a row is -1), as :meth:`decode` then a dot product would give them.

        For ``pq`` rows, FAISS's table lookups (``ProductQuantizer.search_ip``) rank a query's
        candidates by their inner product with the decoded row, in C and without decoding them;
        only the ``keep`` best (all when None) are decoded and scored as cosines, the others get
        -inf. A decoded row's norm is within a few percent of 1, so the cosine's best is among the
        inner product's best few dozen: 1,024 candidates a query in 0.25 ms where decoding them all
        took 1.8 ms (``lmlm bench kb`` re-scores 1,024 per query). A batch's queries are scored in
        parts on FAISS's threads (:func:`_in_threads`): the bench's cached batched lookups 1.14-1.20x
        at 1M keys (float16 rows), 1.10-1.14x at 5.46 x 10^7 (PQ rows), on 2 cores."""
        out = np.full(rows.shape, -np.inf, dtype=np.float32)
        ranked = self.kind == "pq" and keep is not None and keep < rows.shape[1]

        def part(lo: int, hi: int) -> None:
            part_rows, part_q = rows[lo:hi], q[lo:hi]
            ok = part_rows >= 0
            if not ranked:
                kept = np.where(ok, np.arange(rows.shape[1]), -1)  # every column of rows
            else:
                kept = np.full((hi - lo, keep), -1, dtype=np.int64)  # columns of rows, best inner product first
                for i in range(hi - lo):
                    cols = np.flatnonzero(ok[i])
                    best = self._best_inner(np.ascontiguousarray(part_q[i], dtype=np.float32),
                                            stored[part_rows[i, cols]], keep)
                    kept[i, :len(best)] = cols[best]
            has = kept >= 0
            picked = np.take_along_axis(part_rows, np.maximum(kept, 0), axis=1)
            cos = np.einsum("nkd,nd->nk", self.decode(stored[np.where(has, picked, 0)]), part_q)
            at, j = np.nonzero(has)
            out[lo + at, kept[at, j]] = cos[at, j]

        _in_threads(part, len(q))
        return out

    def _best_inner(self, q: np.ndarray, codes: np.ndarray, keep: int) -> np.ndarray:
        """Indices of the ``keep`` codes (``(c, m)``) whose decoded rows have the largest inner
        product with ``q``, best first (FAISS table lookups)."""
        import faiss

        k = min(keep, len(codes))
        vals, at = np.empty(k, dtype=np.float32), np.full(k, -1, dtype=np.int64)
        heap = faiss.float_minheap_array_t()  # keeps the k largest
        heap.nh, heap.k, heap.ids, heap.val = 1, k, faiss.swig_ptr(at), faiss.swig_ptr(vals)
        if k:
            self.pq.search_ip(faiss.swig_ptr(q), 1, faiss.swig_ptr(codes), len(codes), heap, True)  # codes: a fresh gather
        return at[at >= 0]

    @property
    def table(self) -> np.ndarray:
        """The PQ centroids, ``(m, 256, dim / m)`` float32: a code decodes by gathering its ``m``
        sub-vectors, which numpy does in microseconds for the 128 candidates of a query, where
        ``ProductQuantizer.decode`` took 5 ms (its threads woken for a few rows)."""
        if getattr(self, "_table", None) is None:
            import faiss

            self._table = faiss.vector_to_array(self.pq.centroids).reshape(self.pq.M, self.pq.ksub, self.pq.dsub)
        return self._table

    def to_bytes(self) -> bytes:
        """The trained quantiser (empty for float rows), as an index file stores it."""
        if self.kind != "pq":
            return b""
        import faiss

        holder = faiss.IndexPQ(self.dim, self.pq.M, 8, faiss.METRIC_INNER_PRODUCT)
        holder.pq = self.pq
        holder.is_trained = True
        return faiss.serialize_index(holder).tobytes()

    @classmethod
    def from_header(cls, dim: int, name: str, data: bytes | memoryview = b"") -> "RowCodec":
        """The codec an index file's header names (``vectors``), with its quantiser bytes."""
        if not name.startswith("pq"):
            return cls(dim, name)
        import faiss

        holder = faiss.deserialize_index(np.frombuffer(data, dtype=np.uint8))
        codec = cls(dim, "pq", holder.pq)
        codec._holder = holder  # the quantiser lives inside it
        return codec


def _in_threads(work, n: int, least: int = 16) -> None:
    """``work(lo, hi)`` over ``range(n)`` in contiguous parts, one a thread of FAISS's count
    (``faiss.omp_get_max_threads``), at least ``least`` items a part; one part runs here. For loops
    of FAISS and numpy calls on a few rows each, which release the GIL: a batch's candidates are
    scored on every core where a single loop left all but one idle."""
    import faiss

    parts = max(1, min(faiss.omp_get_max_threads(), n // least))
    if parts == 1:
        work(0, n)
        return
    from concurrent.futures import ThreadPoolExecutor

    edges = np.linspace(0, n, parts + 1).astype(int).tolist()
    with ThreadPoolExecutor(parts - 1) as pool:
        futures = [pool.submit(work, lo, hi) for lo, hi in zip(edges[1:-1], edges[2:])]
        work(edges[0], edges[1])
        for f in futures:
            f.result()


def scan_codes(dim: int, m: int) -> str:
    """The FAISS code an IVF scans: ``m`` 4-bit sub-quantisers (SIMD fast scan) where ``m`` divides
    ``dim``, else one per 4 dimensions, else 8-bit scalar codes."""
    if m >= 1 and dim % m == 0:
        return f"PQ{m}x4fs"
    return f"PQ{dim // 4}x4fs" if dim % 4 == 0 else "SQ8"


def ivf_search(index, q: np.ndarray, k: int, params, gap: float, least: int) -> np.ndarray:
    """Rows ``(n, k)`` (-1 where none) of the ``k`` best codes of an inner-product IVF ``index`` for
    queries ``q``, scanning of each query's ``params.nprobe`` nearest lists only those whose centroid
    scores within ``gap`` of its nearest list's (at least ``least`` lists). A query close to one
    region of the key space then scans a few lists and a query between regions all of them: at
    5.46 x 10^7 keys (4,096 lists, 64 probed) a gap of 0.22 scans 28 lists a query on average, 1.5x
    the scans a second, and its top-1 after re-scoring agrees with 256 lists' for 99.7% of 2,048
    perturbed queries, as all 64 do; ``lmlm bench kb``: cached batched key match 1.59x, top-1
    agreement with an exact search 0.95 (0.9525 with all 64 lists).
    The lists are chosen by the index's own coarse quantiser and scanned by FAISS's
    ``search_preassigned`` (skipped lists are -1), with ``params`` (its selector) as ``search``
    would; ``gap`` <= 0 or another metric: FAISS's ``search``."""
    import faiss

    q = np.ascontiguousarray(q, dtype=np.float32)
    n, nprobe = len(q), min(params.nprobe, index.nlist)
    if gap <= 0 or index.metric_type != faiss.METRIC_INNER_PRODUCT or nprobe <= least:
        return index.search(q, k, params=params)[1]
    scores, lists = _nearest_lists(index, q, nprobe)  # best first
    far = scores < scores[:, :1] - gap
    far[:, :least] = False
    lists[far] = -1
    params.nprobe = nprobe
    dist, rows = np.empty((n, k), dtype=np.float32), np.empty((n, k), dtype=np.int64)
    index.search_preassigned_c(n, faiss.swig_ptr(q), k, faiss.swig_ptr(lists), faiss.swig_ptr(scores),
                               faiss.swig_ptr(dist), faiss.swig_ptr(rows), False, params)
    return rows


def _nearest_lists(index, q: np.ndarray, nprobe: int) -> tuple[np.ndarray, np.ndarray]:
    """Scores and numbers ``(n, nprobe)`` of each query's best lists, best first. For a batch and a
    flat inner-product quantiser, numpy's matrix product and partial sort: FAISS's search through the
    BLAS it bundles took 68 ms for 256 queries against 4,096 lists on 2 cores, numpy 22 ms (the
    same lists but for the order of a tie or two in 10^4)."""
    import faiss

    quantizer = faiss.downcast_index(index.quantizer)
    if len(q) < 16 or not isinstance(quantizer, faiss.IndexFlat) or quantizer.metric_type != faiss.METRIC_INNER_PRODUCT:
        return quantizer.search(q, nprobe)
    lists, scores = top_k_rows(q @ _centroids(quantizer).T, nprobe)  # (n, lists) scores, partly sorted
    return scores, lists.astype(np.int64)


def _centroids(quantizer) -> np.ndarray:
    """The ``(lists, dim)`` centroids of a flat coarse quantiser, a view of its own memory (no copy)."""
    import faiss

    return faiss.rev_swig_ptr(quantizer.get_xb(), quantizer.ntotal * quantizer.d).reshape(-1, quantizer.d)


def add_rows(index, x: np.ndarray) -> None:
    """``index.add(x)``: the same lists, codes and ids, faster for an IVF of fast-scan codes with a
    flat coarse quantiser. There FAISS spends most of an add assigning each row to its list with the
    BLAS it bundles (13k rows/s against 4,096 lists on 2 cores, where numpy's matrix product does
    58k); so numpy assigns them, the index codes them for those lists (``encode_vectors``), and they
    are packed into their lists' blocks as ``IndexIVFFastScan.add`` packs them. Any other index (see
    :func:`block_lists`), or fewer than ``_BLOCKED_FROM`` rows: ``index.add``."""
    import faiss

    x = np.ascontiguousarray(x, dtype=np.float32)
    appendable = block_lists(index)
    if appendable is None or len(x) < _BLOCKED_FROM:
        index.add(x)
        return
    lists, packer, quantizer = appendable
    centroids = _centroids(quantizer)
    shift = None if quantizer.metric_type == faiss.METRIC_INNER_PRODUCT else -0.5 * (centroids ** 2).sum(1)
    listno = np.empty(len(x), dtype=np.int64)
    for i in range(0, len(x), 8192):  # (8192, lists) float32 scores at a time
        scores = x[i:i + 8192] @ centroids.T
        listno[i:i + 8192] = (scores if shift is None else scores + shift).argmax(1)
    flat = np.empty((len(x), index.code_size), dtype=np.uint8)
    index.encode_vectors(len(x), faiss.swig_ptr(x), faiss.swig_ptr(listno), faiss.swig_ptr(flat), False)
    order = np.argsort(listno, kind="stable")
    ids = index.ntotal + order  # the ids add gives: the row's position after those already in
    cuts = np.flatnonzero(np.diff(listno[order])) + 1
    per, size = packer.nvec, packer.block_size
    pack_1 = getattr(packer, "pack_1_c", packer.pack_1)  # on pointers (FAISS wraps pack_1 for arrays of blocks)
    for start, end in zip(np.r_[0, cuts].tolist(), np.r_[cuts, len(x)].tolist()):
        no, rows = int(listno[order[start]]), flat[order[start:end]]
        old = lists.list_size(no)
        new = old + len(rows)
        # grown as IndexIVFFastScan.add grows a list (BlockInvertedLists.add_entries copies past the
        # list's end when its size is a multiple of the block's bytes), then filled in place
        lists.resize(no, new)
        faiss.rev_swig_ptr(lists.get_ids(no), new)[old:] = ids[start:end]
        codes = faiss.rev_swig_ptr(lists.get_codes(no), -(-new // per) * size)
        head = min(-old % per, len(rows))  # the rest of the list's part-filled last block, a row at a time
        for i in range(head):
            pack_1(faiss.swig_ptr(rows[i]), old + i, faiss.swig_ptr(codes))
        rest = np.zeros((-(-(len(rows) - head) // per) * per, index.code_size), dtype=np.uint8)
        rest[:len(rows) - head] = rows[head:]
        first = (old + head) // per * size
        for b in range(len(rest) // per):  # then whole new blocks, the last one padded
            packer.pack_all(faiss.swig_ptr(rest[b * per:]), faiss.swig_ptr(codes[first + b * size:]))
    index.ntotal += len(x)


def block_lists(index):
    """``(block lists, their code packer, flat coarse quantiser)`` of an IVF of fast-scan codes whose
    lists :func:`add_rows` can fill itself (no direct map to keep, a FAISS with code packers), else None."""
    import faiss

    if not isinstance(index, faiss.IndexIVFFastScan) or index.direct_map.type != faiss.DirectMap.NoMap:
        return None
    lists = faiss.downcast_InvertedLists(index.invlists)
    packer = getattr(lists, "packer", None) if isinstance(lists, faiss.BlockInvertedLists) else None
    quantizer = faiss.downcast_index(index.quantizer)
    return (lists, packer, quantizer) if packer is not None and isinstance(quantizer, faiss.IndexFlat) else None


# -- the index -----------------------------------------------------------------------------------------------

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
            ``ivf_min_probe`` are (0: all ``ivf_nprobe``; :func:`ivf_search`).
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
