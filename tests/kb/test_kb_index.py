"""The key index: exact below a size, HNSW or IVF above, exact re-scoring, immediate removal, files."""

import json
import os
import struct
import subprocess
import sys

import faiss
import numpy as np
import pytest

from lmlm.kb.index import AnnConfig, VectorKeyIndex, load_index, read_header, save_index
from lmlm.kb.index import RowCodec, add_rows, block_lists, ivf_search, scan_codes

SMALL = AnnConfig(flat_max=200, ivf_min=1000, rescore=32)


def _unit(n, dim=8, seed=0):
    v = np.random.default_rng(seed).normal(size=(n, dim)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def _near(v, scale=0.15, seed=1):
    q = v + np.random.default_rng(seed).normal(size=v.shape).astype(np.float32) * scale / np.sqrt(v.shape[1])
    return q / np.linalg.norm(q, axis=1, keepdims=True)


def test_add_search_remove():
    index = VectorKeyIndex(8, ann="flat")
    vectors = _unit(5)
    index.add(np.array([10, 11, 12, 13, 14]), vectors)
    index.add(np.array([10]), vectors[:1])  # already present: skipped
    assert len(index) == 5 and 12 in index
    scores, ids = index.search(vectors[2:3], 2)
    assert ids[0, 0] == 12 and abs(scores[0, 0] - 1.0) < 1e-5
    assert index.remove([12, 99]) == 1 and 12 not in index
    _, ids = index.search(vectors[2:3], 5)
    assert 12 not in ids[0].tolist() and len(index) == 4


def test_search_empty_index_returns_no_ids():
    scores, ids = VectorKeyIndex(8, ann="flat").search(_unit(2), 3)
    assert ids.shape == (2, 3) and (ids == -1).all()


def test_save_load_roundtrip(tmp_path):
    index = VectorKeyIndex(8, ann="flat")
    index.add(np.array([3, 4]), _unit(2))
    (tmp_path / ".index.faiss.999999999.tmp").write_bytes(b"half a file from a killed save")
    save_index(index, tmp_path / "index.faiss", {"version": 7, "encoder": "m"})
    assert [p.name for p in tmp_path.iterdir()] == ["index.faiss"]
    assert read_header(tmp_path / "index.faiss")["version"] == 7
    loaded, header = load_index(tmp_path / "index.faiss")
    assert header["size"] == 2 and loaded.ids() == [3, 4]
    (tmp_path / "junk.faiss").write_bytes(b"not an index")
    assert load_index(tmp_path / "junk.faiss") is None and read_header(tmp_path / "missing") is None


def test_structure_is_chosen_by_size():
    index = VectorKeyIndex(16, SMALL)
    vectors = _unit(1300, 16)
    index.add(np.arange(150), vectors[:150])
    assert index.ann_kind == "flat"
    index.add(np.arange(150, 400), vectors[150:400])
    assert index.ann_kind == "hnsw"
    index.add(np.arange(400, 1300), vectors[400:])
    assert index.ann_kind == "ivf" and len(index) == 1300


@pytest.mark.parametrize("ann", ["hnsw", "ivf"])
def test_candidates_are_rescored_exactly_and_agree_with_flat(ann):
    vectors = _unit(3000, 32, seed=2)
    index = VectorKeyIndex(32, SMALL, ann=ann)
    index.add(np.arange(1000, 4000), vectors)
    assert index.ann_kind == ann
    queries = _near(vectors[:500], scale=0.5)
    scores, ids = index.search(queries, 3)
    exact = np.einsum("nkd,nd->nk", vectors[ids - 1000], queries)
    # true cosines, not code distances: float32's own for flat and HNSW, from the float16 copy for IVF
    assert index.header()["vectors"] == ("float16" if ann == "ivf" else "float32")
    np.testing.assert_allclose(scores, exact, atol=1e-3 if ann == "ivf" else 1e-5)
    flat_top1 = np.argmax(queries @ vectors.T, axis=1) + 1000
    assert (ids[:, 0] == flat_top1).mean() >= 0.99
    assert (np.diff(scores, axis=1) <= 1e-6).all()  # best first


@pytest.mark.parametrize("ann", ["flat", "hnsw", "ivf"])
def test_removed_keys_are_never_returned_and_stay_removed_on_disk(ann, tmp_path):
    vectors = _unit(1500, 16, seed=3)
    index = VectorKeyIndex(16, SMALL, ann=ann)
    index.add(np.arange(1500), vectors)
    gone = list(range(0, 1500, 3))
    assert index.remove(gone) == 500 and index.remove(gone) == 0
    _, ids = index.search(vectors[gone], 10)  # each query is the removed key's own vector
    assert not np.isin(ids, gone).any() and (ids >= 0).all()
    save_index(index, tmp_path / "i", {"version": 1})
    loaded, header = load_index(tmp_path / "i")
    assert header["ann"] == ann and len(loaded) == 1000 and loaded.rows == 1500
    _, ids = loaded.search(vectors[gone], 10)
    assert not np.isin(ids, gone).any()
    assert loaded.restore([0, 3, 9999]) == [9999]  # stored vectors come back without re-embedding
    _, ids = loaded.search(vectors[[0, 3]], 1)
    assert ids[:, 0].tolist() == [0, 3]


def test_selection_searches_a_fixed_key_set_including_removed_keys():
    vectors = _unit(1200, 16, seed=4)
    index = VectorKeyIndex(16, SMALL)
    index.add(np.arange(1200), vectors)
    index.remove([5, 6])
    within = index.select([5, 6, 7, 4242])  # 4242 has no vector: ignored
    _, ids = index.search(vectors[[5, 6, 100]], 3, within=within)
    assert set(ids.ravel().tolist()) <= {5, 6, 7, -1} and ids[0, 0] == 5 and ids[1, 0] == 6
    assert 5 not in set(index.search(vectors[[5]], 20)[1].ravel().tolist())  # the live search still skips it


def test_deferred_adds_settle_and_rebuild_drops_dead_rows():
    vectors = _unit(1000, 16, seed=5)
    index = VectorKeyIndex(16, SMALL, ann="hnsw")
    index.add(np.arange(600), vectors[:600], build=False)
    assert index.ann_kind == "flat"  # nothing built yet
    index.settle()
    assert index.ann_kind == "hnsw"
    index.remove(range(550))
    index.add(np.arange(600, 1000), vectors[600:])  # growth keeps the dead rows (a past version may need them)
    assert index.rows == 1000 and len(index) == 450 and index.has_vector(3)
    generation = index.generation
    index.rebuild()
    assert index.rows == 450 and not index.has_vector(3) and index.generation == generation + 1
    _, ids = index.search(vectors[[700]], 1)
    assert ids[0, 0] == 700


def test_reads_index_files_of_the_first_format(tmp_path):
    import faiss

    old = faiss.IndexIDMap2(faiss.IndexFlatIP(8))
    old.add_with_ids(_unit(3), np.array([7, 8, 9], dtype=np.int64))
    head = json.dumps({"version": 2, "kind": "faiss-flat", "dim": 8, "encoder": "m", "size": 3}).encode()
    (tmp_path / "index.faiss").write_bytes(b"LMLMIDX1" + struct.pack("<I", len(head)) + head +
                                           faiss.serialize_index(old).tobytes())
    loaded, header = load_index(tmp_path / "index.faiss")
    assert header["version"] == 2 and loaded.ids() == [7, 8, 9]
    assert loaded.search(_unit(3)[1:2], 1)[1][0, 0] == 8


def test_bad_arguments_name_the_problem():
    with pytest.raises(ValueError, match="AnnConfig.flat_max must be an int >= 1"):
        AnnConfig(flat_max=0)
    with pytest.raises(ValueError, match="AnnConfig.ivf_probe_gap must be an int >= 0"):
        AnnConfig(ivf_probe_gap=-1)
    assert AnnConfig(ivf_probe_gap=0).ivf_probe_gap == 0  # 0: every one of ivf_nprobe lists scanned
    with pytest.raises(ValueError, match="ivf_min .* must be >= flat_max"):
        AnnConfig(flat_max=10, ivf_min=5)
    with pytest.raises(ValueError, match="ann must be one of"):
        VectorKeyIndex(8, ann="lsh")
    with pytest.raises(ValueError, match=r"vectors must have shape \(2, 8\)"):
        VectorKeyIndex(8).add(np.array([1, 2]), _unit(3))
    with pytest.raises(KeyError, match="no vector stored for key id 5"):
        VectorKeyIndex(8).vectors([5])


def test_many_queries_are_searched_in_blocks_with_the_same_answers():
    vectors = _unit(1500, 16, seed=6)
    index = VectorKeyIndex(16, SMALL, ann="ivf")
    index.add(np.arange(1500), vectors)
    queries = _near(np.concatenate([vectors, vectors[:200]]), scale=0.3)  # 1700 queries: 7 blocks
    scores, ids = index.search(queries, 2)
    one_scores, one_ids = zip(*(index.search(queries[i:i + 1], 2) for i in range(0, 1700, 97)))
    np.testing.assert_array_equal(np.concatenate(one_ids), ids[::97])
    np.testing.assert_allclose(np.concatenate(one_scores), scores[::97], atol=1e-6)


def test_an_index_growing_into_ivf_stores_float16_and_finds_what_it_held(tmp_path):
    vectors = _unit(3000, 32, seed=4)
    index = VectorKeyIndex(32, SMALL)
    kinds = []
    for start, end in zip([0, 150, 500, 1000, 2000], [150, 500, 1000, 2000, 3000]):  # flat, HNSW, IVF (from 1000)
        index.add(np.arange(start, end), vectors[start:end], build=False)
        index.settle()
        kinds.append((index.ann_kind, index.header()["vectors"]))
    assert kinds[0] == ("flat", "float32") and ("hnsw", "float32") in kinds and kinds[-1] == ("ivf", "float16")
    index.remove(range(0, 3000, 2))
    scores, ids = index.search(_near(vectors[1::2][:300], scale=0.3), 1)
    assert (ids[:, 0] == np.arange(1, 600, 2)).mean() >= 0.99
    np.testing.assert_allclose(index.vectors([1, 2999]), vectors[[1, 2999]], atol=1e-3)
    save_index(index, tmp_path / "i.idx", {"version": 1})
    loaded, header = load_index(tmp_path / "i.idx")
    assert header["vectors"] == "float16" and loaded.search(vectors[[1]], 1)[1][0, 0] == 1


def test_sparse_key_ids_are_found_and_ids_out_of_range_refused(tmp_path):
    index = VectorKeyIndex(8, ann="flat")
    ids, vectors = np.array([5, 3_000_000, 5, 70]), _unit(4)
    index.add(ids, vectors)  # the repeated 5 keeps its first vector
    assert len(index) == 3 and 3_000_000 in index and 4 not in index and -1 not in index
    np.testing.assert_allclose(index.vectors([70, 5]), vectors[[3, 0]])
    assert index.search(vectors[1:2], 1)[1][0, 0] == 3_000_000
    assert index.remove([5, 5, 8]) == 1 and index.restore([5, 8]) == [8] and 5 in index
    save_index(index, tmp_path / "i.faiss", {"version": 1})
    assert load_index(tmp_path / "i.faiss")[0].ids() == [5, 70, 3_000_000]
    for bad in (-3, 2**31):
        with pytest.raises(ValueError, match=f"key id {bad} is out of range"):
            index.add(np.array([bad]), _unit(1))
    with pytest.raises(KeyError, match="no vector stored for key id 9"):
        index.vectors([5, 9])


PQ = AnnConfig(flat_max=200, ivf_min=1000, pq_min=2000, pq_bytes=8, rescore=32, pq_scan_bytes=2, pq_rescore=64)


def test_the_scanned_codes_are_as_many_4_bit_codes_as_asked_where_they_divide_the_dimension():
    assert [scan_codes(384, 48), scan_codes(384, 96), scan_codes(32, 48), scan_codes(30, 48)] == [
        "PQ48x4fs", "PQ96x4fs", "PQ8x4fs", "SQ8"]


def test_an_index_growing_past_pq_min_keeps_pq_codes_and_finds_what_it_held(tmp_path):
    vectors = _unit(4000, 32, seed=7)
    index = VectorKeyIndex(32, PQ)
    for start in range(0, 4000, 500):
        index.add(np.arange(start, start + 500), vectors[start:start + 500], build=False)
        index.settle()
    assert index.ann_kind == "ivfpq" and index.row_codec == "pq8x8"
    assert index._vecs.dtype == np.uint8 and index._vecs.shape[1] == 8  # 8 bytes a row, not 64 of float16
    assert faiss.downcast_index(faiss.extract_index_ivf(index._ann)).pq.M == 4  # 2 bytes of 4-bit codes a key
    queries = _near(vectors[:400], scale=0.3)
    scores, ids = index.search(queries, 1)
    assert (ids[:, 0] == np.arange(400)).mean() >= 0.95
    # a score is the query's cosine with the decoded row: close to the true one, not equal to it
    true = np.einsum("nd,nd->n", vectors[ids[:, 0]], queries)
    assert np.abs(scores[:, 0] - true).max() < 0.15
    gone = list(range(0, 4000, 4))
    index.remove(gone)
    _, ids = index.search(vectors[gone], 5)
    assert not np.isin(ids, gone).any() and (ids >= 0).all()
    save_index(index, tmp_path / "i.faiss", {"version": 3})
    loaded, header = load_index(tmp_path / "i.faiss")
    assert header["vectors"] == "pq8x8" and header["ann"] == "ivfpq" and len(loaded) == 3000
    assert (loaded.config.pq_scan_bytes, loaded.config.pq_rescore) == (2, 64)
    np.testing.assert_array_equal(loaded.search(queries, 1)[1], index.search(queries, 1)[1])
    np.testing.assert_allclose(loaded.vectors([1, 2]), index.vectors([1, 2]))
    loaded.add(np.arange(4000, 4100), _unit(100, 32, seed=8))  # new rows are coded with the saved quantiser
    assert loaded.search(_unit(100, 32, seed=8)[:5], 1)[1][:, 0].tolist() == list(range(4000, 4005))


@pytest.mark.parametrize("rows", [3000, 300])  # sub-quantiser by sub-quantiser, and FAISS's own loop for a few
def test_pq_rows_are_coded_with_each_sub_vectors_nearest_centroid(rows):
    codec = RowCodec.train_pq(_unit(4000, 384, seed=11), 128)  # MiniLM's shape: 3-dim sub-vectors
    x = _unit(rows, 384, seed=12)
    codes = codec.encode(x)
    assert codes.shape == (rows, 128) and codes.dtype == np.uint8
    subs = x.reshape(rows, 128, 1, 3).astype(np.float64)
    dist = ((subs - codec.table[None].astype(np.float64)) ** 2).sum(-1)  # (rows, 128 sub-vectors, 256 centroids)
    chosen = np.take_along_axis(dist, codes[..., None].astype(np.int64), axis=2)[..., 0]
    assert (chosen <= dist.min(axis=2) + 1e-6).all()  # the nearest, or tied with it
    assert (codes == dist.argmin(axis=2)).mean() > 0.999
    assert (codes == codec.pq.compute_codes(x)).all(axis=1).mean() >= 0.995  # FAISS's own codes, ties aside


@pytest.mark.parametrize("factory, metric, chunks", [
    ("IVF16,PQ8x4fs", faiss.METRIC_INNER_PRODUCT, (2500, 100, 3400)),  # lists end mid-block between adds
    ("IVF16,PQ8x4fs", faiss.METRIC_L2, (2500, 100, 3400)),
    ("IVF1,PQ8x4fs", faiss.METRIC_INNER_PRODUCT, (1024, 1030, 1100, 1050)),  # at a block's end (1,024), in one (2,054)
    ("IVF16,SQ8", faiss.METRIC_INNER_PRODUCT, (2500, 100, 3400))])
def test_rows_added_by_add_rows_land_where_faiss_add_puts_them(factory, metric, chunks):
    vectors = _unit(sum(chunks), 32, seed=21)
    ours = faiss.index_factory(32, factory, metric)
    ours.train(vectors[:2000])
    theirs = faiss.clone_index(ours)
    assert (block_lists(ours) is not None) == factory.endswith("fs")  # fast-scan lists: appended to here
    for at, n in zip(np.cumsum((0,) + chunks[:-1]), chunks):
        add_rows(ours, vectors[at:at + n])
        theirs.add(vectors[at:at + n])
    assert ours.ntotal == theirs.ntotal == len(vectors)
    ivfs = [faiss.extract_index_ivf(i) for i in (ours, theirs)]
    for no in range(ivfs[0].nlist):
        n = ivfs[0].invlists.list_size(no)
        assert n == ivfs[1].invlists.list_size(no)
        got, want = (np.sort(faiss.rev_swig_ptr(ivf.invlists.get_ids(no), n)) for ivf in ivfs)
        np.testing.assert_array_equal(got, want)
    ivfs[0].nprobe = ivfs[1].nprobe = 4
    queries = _near(vectors[::20], scale=0.3)
    (d_ours, i_ours), (d_theirs, i_theirs) = ours.search(queries, 5), theirs.search(queries, 5)
    np.testing.assert_array_equal(i_ours, i_theirs)
    np.testing.assert_allclose(d_ours, d_theirs, atol=1e-6)
    assert (i_ours[:, 0] == np.arange(0, len(vectors), 20)).mean() > 0.8


def test_add_rows_never_writes_past_a_list(tmp_path):
    """Many adds into one list, each at a size that is a whole number of blocks: the case where
    BlockInvertedLists.add_entries writes past the list's end. Run apart, with glibc's heap checks."""
    script = tmp_path / "adds.py"
    script.write_text(
        "import faiss, numpy as np\n"
        "from lmlm.kb.index import add_rows\n"
        "v = np.random.default_rng(0).normal(size=(40960, 32)).astype(np.float32)\n"
        "ours, theirs = (faiss.index_factory(32, 'IVF1,PQ8x4fs', faiss.METRIC_INNER_PRODUCT) for _ in range(2))\n"
        "ours.train(v[:2000]); theirs.train(v[:2000])\n"
        "for i in range(0, len(v), 1024):\n"
        "    add_rows(ours, v[i:i + 1024]); theirs.add(v[i:i + 1024])\n"
        "    scratch = [np.ones(100_000, dtype=np.uint8) for _ in range(5)]\n"
        "assert (ours.search(v[:100], 3)[1] == theirs.search(v[:100], 3)[1]).all()\n"
        "del ours, theirs, scratch\n"
        "print('clean')\n")
    env = {**os.environ, "MALLOC_CHECK_": "3", "GLIBC_TUNABLES": "glibc.malloc.check=3"}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "clean", done.stderr[-2000:]


def test_pq_candidates_are_scored_as_their_decoded_rows_would_be():
    vectors = _unit(3000, 32, seed=3)
    index = VectorKeyIndex(32, PQ)
    index.add(np.arange(3000), vectors)
    assert index.ann_kind == "ivfpq"
    queries = _near(vectors[:50], scale=0.3)
    scores, ids = index.search(queries, 5)
    decoded = index.vectors(ids.ravel()).reshape(50, 5, 32)  # the stored rows read back, unit length
    np.testing.assert_allclose(scores, np.einsum("nkd,nd->nk", decoded, queries), atol=1e-5)
    assert (np.diff(scores, axis=1) <= 1e-6).all()  # best first
    rows = np.array([[0, -1, 2], [-1, -1, -1]])  # no row: -inf
    got = index._codec.score(queries[:2], index._vecs, rows)
    assert np.isneginf(got[rows < 0]).all() and np.isfinite(got[rows >= 0]).all()
    one = index._codec.score(queries[:2], index._vecs, rows, keep=1)  # the best inner product only, as a cosine
    assert np.isfinite(one).sum(axis=1).tolist() == [1, 0] and np.isfinite(one[0, [0, 2]]).any()
    assert one[0].max() == pytest.approx(got[0, [0, 2]][np.isfinite(one[0, [0, 2]])][0], abs=1e-6)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_pq_candidates_of_a_batch_are_ranked_alike_on_any_number_of_threads(threads):
    vectors = _unit(2000, 384, seed=12)
    codec = RowCodec.train_pq(vectors, 128)
    stored = codec.encode(vectors)
    queries = _near(vectors[:100], scale=0.5, seed=13)
    rng = np.random.default_rng(14)
    rows = np.stack([np.r_[i, rng.choice(np.delete(np.arange(2000), i), 299, replace=False)] for i in range(100)])
    rows[7, 150:] = -1
    before = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(threads)  # the batch is ranked in this many parts (at least 16 queries each)
    try:
        got = codec.score(queries, stored, rows, keep=8)
    finally:
        faiss.omp_set_num_threads(before)
    decoded = codec.decode(stored).astype(np.float64)
    table = codec.table.astype(np.float64)
    for i in range(100):
        ok = np.flatnonzero(rows[i] >= 0)
        raw = table[np.arange(128), stored[rows[i, ok]]].reshape(len(ok), 384)  # rows decoded, not made unit
        inner = raw @ queries[i].astype(np.float64)
        kept = np.flatnonzero(np.isfinite(got[i]))
        assert len(kept) == 8 and np.isneginf(got[i, rows[i] < 0]).all()
        eighth = np.sort(inner)[-8]  # the 8 best inner products are kept (FAISS ranks them in float32)
        assert inner[np.searchsorted(ok, kept)].min() >= eighth - 1e-5
        np.testing.assert_allclose(got[i, kept], decoded[rows[i, kept]] @ queries[i], atol=1e-5)


def test_prepare_builds_for_the_final_size_so_chunks_are_coded_as_they_come():
    vectors = _unit(3000, 32, seed=9)
    index = VectorKeyIndex(32, PQ)
    index.prepare(vectors[:1000], expected=3000)
    assert index.ann_kind == "ivfpq" and index.rows == 0
    rows = index._vecs  # room for every row from the start: the array is never copied to grow
    for start in range(0, 3000, 600):
        index.add(np.arange(start, start + 600), vectors[start:start + 600], build=False)
        assert index._vecs.dtype == np.uint8  # never a float copy of the rows
        index.settle()
        assert index.ann_kind == "ivfpq" and index._ann.ntotal == start + 600 and index._vecs is rows
    _, ids = index.search(_near(vectors[::10], scale=0.3), 1)
    assert (ids[:, 0] == np.arange(0, 3000, 10)).mean() >= 0.95
    generation = index.generation
    index.prepare(vectors[:1000], expected=3000)  # already built for that size: nothing to do
    assert index.generation == generation and index._ann.ntotal == 3000


def test_a_truncated_index_file_is_not_read(tmp_path):
    index = VectorKeyIndex(8, ann="flat")
    index.add(np.arange(50), _unit(50))
    save_index(index, tmp_path / "i.faiss", {"version": 1})
    data = (tmp_path / "i.faiss").read_bytes()
    (tmp_path / "i.faiss").write_bytes(data[:-100])
    assert load_index(tmp_path / "i.faiss") is None


@pytest.mark.parametrize("ann", ["hnsw", "ivf"])
def test_keys_added_after_a_delete_are_found(ann):
    vectors = _unit(1600, 16, seed=10)
    index = VectorKeyIndex(16, SMALL, ann=ann)
    index.add(np.arange(1500), vectors[:1500])
    index.remove([1, 2])
    index.search(vectors[:1], 1)  # builds the bitmap of live rows
    index.add(np.arange(1500, 1600), vectors[1500:])
    _, ids = index.search(vectors[1500:1510], 1)
    assert ids[:, 0].tolist() == list(range(1500, 1510))


def test_reads_index_files_with_int64_key_ids_and_an_alive_byte_a_row(tmp_path):
    vectors = _unit(3)
    head = json.dumps({"version": 4, "kind": "faiss-keys", "dim": 8, "encoder": "m", "size": 2, "rows": 3,
                       "ann": "flat", "forced": None, "vectors": "float32"}).encode()
    body = np.array([7, 8, 9], dtype=np.int64).tobytes() + bytes([1, 0, 1]) + vectors.tobytes()
    (tmp_path / "index.faiss").write_bytes(b"LMLMIDX1" + struct.pack("<I", len(head)) + head + body)
    loaded, header = load_index(tmp_path / "index.faiss")
    assert loaded.ids() == [7, 9] and loaded.has_vector(8) and 8 not in loaded
    assert loaded.search(vectors[2:3], 1)[1][0, 0] == 9
    save_index(loaded, tmp_path / "again.faiss", {"version": 4})  # written in the compact layout, read back alike
    again, header = load_index(tmp_path / "again.faiss")
    assert header["layout"] == 3 and again.ids() == [7, 9] and again.has_vector(8)
    np.testing.assert_array_equal(again.vectors([7, 8, 9]), vectors)


def test_rising_key_ids_are_stored_as_a_bitmap_and_read_back_with_files_of_int32_ids(tmp_path):
    """A KB indexed from its store in one go numbers its rows by rising key id: the file keeps one
    bit for each id in their range instead of four bytes a key (at 5.5 x 10^7 keys, 4 bytes a triple)."""
    n = 3000
    ids = np.arange(100, 100 + 2 * n, 2)  # rising, with holes
    index = VectorKeyIndex(8, ann="flat")
    index.add(ids, _unit(n))
    index.remove(ids[:10].tolist())
    save_index(index, tmp_path / "bits.faiss", {"version": 1})
    loaded, header = load_index(tmp_path / "bits.faiss")
    assert header["key_ids"] == {"as": "bitmap", "first": 100, "last": 100 + 2 * (n - 1)}
    assert loaded.ids() == ids[10:].tolist() and loaded.has_vector(int(ids[0]))
    assert ids[5] not in loaded.search(_unit(n)[5:6], 3)[1][0].tolist()
    shuffled = VectorKeyIndex(8, ann="flat")
    shuffled.add(ids[::-1].copy(), _unit(n))
    save_index(shuffled, tmp_path / "int32.faiss", {"version": 1})
    loaded32, header32 = load_index(tmp_path / "int32.faiss")
    assert header32["key_ids"] == {"as": "int32"} and loaded32.ids() == sorted(ids.tolist())
    size = lambda name: (tmp_path / name).stat().st_size  # noqa: E731
    assert size("int32.faiss") - size("bits.faiss") > 4 * n - (2 * n) // 8 - 64
    # a file of the previous layout (int32 key ids, no "key_ids" in its header) is still read
    head = json.dumps({"version": 4, "kind": "faiss-keys", "dim": 8, "encoder": "m", "size": 2, "rows": 2,
                       "layout": 2, "ann": "flat", "forced": None, "vectors": "float32"}).encode()
    body = np.array([9, 4], dtype=np.int32).tobytes() + bytes([0b11]) + _unit(2).tobytes()
    (tmp_path / "v2.faiss").write_bytes(b"LMLMIDX1" + struct.pack("<I", len(head)) + head + body)
    assert load_index(tmp_path / "v2.faiss")[0].search(_unit(2)[:1], 1)[1][0, 0] == 9


@pytest.mark.parametrize("chunk", [1, 3, 1 << 20])
def test_sorted_minus_is_the_set_difference_of_two_ascending_id_arrays(chunk):
    from lmlm.kb.knowledge_base import sorted_minus

    rng = np.random.default_rng(7)
    for _ in range(200):
        a = np.unique(rng.integers(0, 60, size=rng.integers(0, 40)))
        b = np.unique(rng.integers(0, 60, size=rng.integers(0, 40)))
        got = sorted_minus(a, b, chunk=chunk)
        assert got.tolist() == sorted(set(a.tolist()) - set(b.tolist()))
        assert got.dtype == a.dtype


def test_an_ivf_scans_only_the_lists_near_a_querys_nearest_yet_finds_its_key():
    dim, axis = 16, np.eye(16, dtype=np.float32)[0]
    groups = [_unit(800, dim, seed=s) * 0.4 + sign * axis for s, sign in ((5, 1), (6, -1))]  # around +e0 and -e0
    vectors = np.concatenate([g / np.linalg.norm(g, axis=1, keepdims=True) for g in groups])
    index = VectorKeyIndex(dim, AnnConfig(flat_max=200, ivf_min=1000, ivf_rescore=400), ann="ivf")
    index.add(np.arange(1600), vectors)
    ann, queries = index._ann, _near(vectors[:100], scale=0.3)  # near keys of the first group
    home = ann.quantizer.search(index._codec.decode(index._vecs[:1600]), 1)[1][:, 0]  # each row's list, by FAISS
    nearest = ann.quantizer.search(queries, 1)[1][:, 0]

    def scanned(gap, least):
        rows = ivf_search(ann, queries, 1600, faiss.SearchParametersIVF(nprobe=64), gap, least)
        return [set(r[r >= 0].tolist()) for r in rows]

    for everything in (scanned(0, 8), scanned(1e-6, 40)):  # no gap, or at least 40 lists: all 40 lists scanned
        assert all(len(r) >= 1590 and max(r) >= 800 for r in everything)  # (fast scan's k=n drops a tie or two)
    one = scanned(1e-6, 1)  # only the nearest list
    assert all(r and {int(home[i]) for i in r} == {int(nearest[j])} for j, r in enumerate(one))
    near = scanned(0.2, 1)  # the lists of the far group score about 1.6 lower: never scanned
    assert all(r and max(r) < 800 for r in near) and sum(map(len, near)) > sum(map(len, one))
    exact = np.argmax(queries @ vectors.T, axis=1)
    assert (index.search(queries, 1)[1][:, 0] == exact).all()  # the default gap, through search
    index.remove(exact[:10])  # the selector of live rows still applies to the lists scanned
    assert not np.isin(index.search(queries[:10], 5)[1], exact[:10]).any()


def test_a_batch_scans_the_lists_each_of_its_queries_would_alone():
    # a batch's nearest lists come from numpy's product with the centroids, a single query's from FAISS
    vectors = _unit(3000, 32, seed=11)
    index = VectorKeyIndex(32, AnnConfig(flat_max=200, ivf_min=1000, ivf_rescore=200), ann="ivf")
    index.add(np.arange(3000), vectors)
    queries = _near(vectors[:64], scale=0.4, seed=12)
    params = lambda: faiss.SearchParametersIVF(nprobe=16)  # noqa: E731
    batch = ivf_search(index._ann, queries, 200, params(), 0.05, 2)
    alone = np.concatenate([ivf_search(index._ann, queries[i:i + 1], 200, params(), 0.05, 2) for i in range(64)])
    assert [set(r.tolist()) for r in batch] == [set(r.tolist()) for r in alone]
    assert sum(i in set(r.tolist()) for i, r in enumerate(batch)) >= 60  # each query's own key among its candidates


_MAPPED_AFTER_IVF = """
import ctypes, sys
import numpy as np
from lmlm.kb.index import AnnConfig, VectorKeyIndex, load_index, save_index

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                     "fsmblks", "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = MallInfo2

def mapped_by_a_1mb_array():
    before = libc.mallinfo2().hblks
    a = np.ones(1 << 18, dtype=np.float32)  # 1 MB
    return libc.mallinfo2().hblks - before

warm = [np.ones(1 << 18, dtype=np.float32) for _ in range(2)]; del warm  # glibc's own threshold rises past 1 MB
fresh = mapped_by_a_1mb_array()
v = np.random.default_rng(0).normal(size=(1500, 16)).astype(np.float32)
index = VectorKeyIndex(16, AnnConfig(flat_max=200, ivf_min=1000), ann="ivf")
index.add(np.arange(1, 1501), v / np.linalg.norm(v, axis=1, keepdims=True))
built = mapped_by_a_1mb_array()
save_index(index, sys.argv[1], {})
loaded_index = load_index(sys.argv[1])
loaded = mapped_by_a_1mb_array()
print(fresh, built, loaded)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc thresholds")
def test_a_process_holding_an_ivf_allocates_its_arrays_from_the_heap(tmp_path):
    # The IVF's lists are built and read with large blocks mapped from the system; after that, a
    # 1 MB array must come from the heap again, as it does in a fresh process: mapped (and zeroed by
    # the system) at every allocation, the encoder ran at half its speed in a process holding an IVF.
    out = subprocess.run([sys.executable, "-c", _MAPPED_AFTER_IVF, str(tmp_path / "index.bin")],
                         capture_output=True, text=True, check=True).stdout.split()
    assert out == ["0", "0", "0"], out
