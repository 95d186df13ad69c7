"""Key vectors given to a KB in blocks: the index built for the final size, kept across a reopen."""

import numpy as np
import pytest

from lmlm.kb import AnnConfig, KBError, KnowledgeBase

ANN = AnnConfig(flat_max=200, ivf_min=1000, pq_min=2000, pq_bytes=48)  # PQ rows from 2,000 keys


def _unit(n, dim, seed=0):
    v = np.random.default_rng(seed).normal(size=(n, dim)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def test_vectors_given_in_blocks_build_the_index_for_the_final_size_and_survive_a_reopen(encoder, tmp_path):
    kb = KnowledgeBase.create(tmp_path / "kb", encoder=encoder, ann=ANN)
    kb.add([(f"Person {i}", "Birth City", f"City {i % 50}") for i in range(3000)], who="t", why="t", embed=False)
    ids = kb.key_ids()
    key_ids = np.array([ids[(f"Person {i}", "Birth City")] for i in range(3000)])
    vectors = _unit(3000, encoder.dim)
    blocks = ((key_ids[i:i + 700], vectors[i:i + 700]) for i in range(0, 3000, 700))
    assert kb.put_vector_chunks(blocks, expected=3000) == 3000
    index = kb.key_index()
    assert (index.ann_kind, index.row_codec, index.rows) == ("ivfpq", "pq48x8", 3000)
    found = [m.entity for m in kb.lookup_vectors(vectors[::30], threshold=0.0)]
    assert np.mean([f == f"Person {i}" for f, i in zip(found, range(0, 3000, 30))]) >= 0.95
    kb.close()
    again = KnowledgeBase.open(tmp_path / "kb", encoder=encoder, ann=ANN)
    # the saved index is read back: keys re-embedded from their text would not match these random vectors
    assert [m.entity for m in again.lookup_vectors(vectors[::30], threshold=0.0)] == found
    with pytest.raises(KBError, match="key ids \\[99999\\] are not active keys"):
        again.put_vector_chunks([(np.array([99999]), vectors[:1])], expected=1)
    again.close()


@pytest.mark.slow
def test_embedding_a_large_kb_trains_its_index_on_the_first_vectors_and_codes_the_rest(encoder, tmp_path):
    ann = AnnConfig(flat_max=200, ivf_min=1000, pq_min=2000, pq_bytes=48)
    kb = KnowledgeBase.create(tmp_path / "kb", encoder=encoder, ann=ann)
    kb.add([(f"Person {i}", "Birth City", f"City {i % 50}") for i in range(9000)], who="t", why="t", embed=False)
    assert kb.embed(progress=False) == 9000  # two encoder chunks: the first trains, the second is coded on arrival
    index = kb.key_index()
    assert (index.ann_kind, index.row_codec, index.rows) == ("ivfpq", "pq48x8", 9000)
    hit = kb.lookup("Person 8765", "birth city", matching="key", fuzzy=False)
    assert hit is not None and hit.value == "City 15"
    asked = list(range(0, 9000, 180))  # each key's own embedding finds it among 9,000 near-identical keys
    found = kb.lookup_vectors(encoder.encode([f"Person {i} Birth City" for i in asked]), threshold=0.0)
    assert np.mean([m.entity == f"Person {i}" for m, i in zip(found, asked)]) >= 0.9
    kb.close()
