import numpy as np

from lmlm.kb.index import FaissFlatIndex, load_index, read_header, save_index


def _unit(n, dim=8, seed=0):
    v = np.random.default_rng(seed).normal(size=(n, dim)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def test_add_search_remove():
    index = FaissFlatIndex(8)
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
    scores, ids = FaissFlatIndex(8).search(_unit(2), 3)
    assert ids.shape == (2, 3) and (ids == -1).all()


def test_save_load_roundtrip(tmp_path):
    index = FaissFlatIndex(8)
    index.add(np.array([3, 4]), _unit(2))
    save_index(index, tmp_path / "index.faiss", {"version": 7, "encoder": "m"})
    assert read_header(tmp_path / "index.faiss")["version"] == 7
    loaded, header = load_index(tmp_path / "index.faiss")
    assert header["size"] == 2 and loaded.ids() == [3, 4]
    (tmp_path / "junk.faiss").write_bytes(b"not an index")
    assert load_index(tmp_path / "junk.faiss") is None and read_header(tmp_path / "missing") is None
