"""How the key index keeps each key's vector for re-scoring: float32, float16 or 8-bit PQ codes.

The approximate structure of :class:`lmlm.kb.index.VectorKeyIndex` only proposes candidates; their
scores come from the stored rows. A :class:`RowCodec` says what a stored row is and turns rows back
into vectors:

* ``float32``: the vector itself (4 bytes a dimension): exact search and HNSW;
* ``float16``: half the memory, cosines within 1e-3 of float32's: IVF;
* ``pq``: a FAISS product quantiser of ``m`` sub-vectors with 256 centroids each (``m`` bytes a row,
  128 by default for MiniLM's 384 dimensions instead of 768 for float16): IVF at the sizes where
  float16 rows no longer fit in memory (``AnnConfig.pq_min``, 4M keys by default: 54.6M keys would
  take 42 GB as float16, 7.0 GB as 128-byte codes). Scores are the cosine of the query with the decoded row,
  made unit length again (the stored vectors were): not exact, but far finer than the 4-bit codes
  the candidates come from (measured by ``lmlm bench kb``'s top-1 agreement with an exact search).
  :meth:`RowCodec.score` computes them from the codes by table lookups, without decoding.

Exercised by every search of the key index and by ``lmlm bench kb``.

Examples:
    >>> codec = RowCodec(4, "float16")
    >>> codec.decode(codec.encode(np.eye(4, dtype=np.float32)[:1])).tolist()
    [[1.0, 0.0, 0.0, 0.0]]
"""

from __future__ import annotations

import numpy as np

from .index_rows import top_k_rows

__all__ = ["KINDS", "RowCodec", "add_rows", "ivf_search", "scan_codes"]

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
