import numpy as np


def test_encode_shape_dtype_unit_norm(encoder):
    vectors = encoder.encode(["Ada Lovelace Birth City", "Charles Babbage Death Year", "x"])
    assert vectors.shape == (3, 384) and vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert encoder.encode([]).shape == (0, 384)


def test_cache_returns_the_computed_vectors(encoder):
    encoder.clear_cache()
    texts = ["Grace Hopper Employer", "Grace Hopper Employer", "Alan Turing Occupation"]
    first = encoder.encode(texts)
    np.testing.assert_array_equal(first[0], first[1])
    again = encoder.encode(texts[::-1])  # all from the cache
    np.testing.assert_array_equal(again, first[::-1])
    fresh = encoder.encode(texts, cache=False)
    np.testing.assert_allclose(fresh, first, atol=1e-5)


def test_paraphrase_is_closer_than_unrelated(encoder):
    key, para, other = encoder.encode(["Ada Lovelace Birth City", "Ada Lovelace birthplace", "Marie Curie Spouse"])
    assert key @ para > 0.6 > key @ other


def test_bfloat16_vectors_stay_close_to_float32(encoder):
    import pytest

    from lmlm.kb.encoder import SMALL_BATCH, Encoder, resolve_dtype

    texts = ["Ada Lovelace Birth City", "Ada Lovelace birthplace", "Srinivasa Ramanujan Alma Mater", "x"]
    fp32, bf16 = Encoder(dtype="float32", cache_size=0), Encoder(dtype="bfloat16", cache_size=0)
    a, b = fp32.encode(texts), bf16.encode(texts)
    assert b.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(b, axis=1), 1.0, atol=1e-5)
    assert (a * b).sum(axis=1).min() >= 0.995
    # a batch of mixed lengths (padding masked in the bfloat16 encoder's eager attention)
    many = [f"{'Sir ' * (i % 5)}Ada Lovelace {i} {rel}" for i in range(24) for rel in ("Birth City", "x")]
    assert len(many) > SMALL_BATCH and bf16.model[0].auto_model.config._attn_implementation == "eager"
    assert (fp32.encode(many) * bf16.encode(many)).sum(axis=1).min() >= 0.995
    assert resolve_dtype("float32", "cpu") == "float32" and resolve_dtype("auto", "cuda") == "float32"
    with pytest.raises(ValueError, match="dtype must be one of"):
        Encoder(dtype="int4")


def test_single_queries_match_batched_encoding(encoder):
    """Small calls take the direct forward, large ones sentence-transformers' encode: same vectors."""
    texts = [f"Person {i} Okafor <|sep|> {rel}" for i in range(20) for rel in ("birth city", "employer")]
    batched = encoder.encode(texts, cache=False)                              # 40 texts: encode
    single = np.concatenate([encoder.encode([t], cache=False) for t in texts])  # one at a time: direct
    assert single.shape == batched.shape == (40, encoder.dim)
    assert np.allclose(np.linalg.norm(single, axis=1), 1.0, atol=1e-5)
    assert float((single * batched).sum(axis=1).min()) > 0.999


def test_query_threads_follow_the_idle_cores():
    """'auto' gives one thread plus each core the load average leaves idle; other strings are refused."""
    import os

    import pytest

    from lmlm.kb.encoder import Encoder, auto_query_threads

    cores = len(os.sched_getaffinity(0))
    expected = max(1, min(cores, 1 + round(cores - os.getloadavg()[0])))
    assert 1 <= auto_query_threads() <= cores
    assert abs(auto_query_threads() - expected) <= 1  # the load may move between the two reads
    with pytest.raises(ValueError, match="query_threads"):
        Encoder(query_threads="many")
