"""The distilled annotator: insert-only decoding, save/load, sharded resumable corpus annotation."""

import json

import pytest

from lmlm.annotate.annotator import CALL_ROOM, Annotator, _continuations, _text_tokens
from lmlm.annotate.corrupt import call_f1
from lmlm.annotate.distill import DistillConfig, distill, run_corpus
from lmlm.annotate.lm import FitConfig
from lmlm.annotate.validate import calls_with_offsets
from lmlm.lookup import parse, strip
from lmlm.tokens import LookupTokenizer, train_bpe
from lmlm.worlds.bios import BiosWorld


@pytest.fixture(scope="module")
def world():
    return BiosWorld.generate("smoke")


@pytest.fixture(scope="module")
def trained(world, tmp_path_factory):
    folder = tmp_path_factory.mktemp("annotator")
    # a short run: the F1 of a full one is measured by `lmlm bench annotate`
    config = DistillConfig(vocab_size=1024, fit=FitConfig(steps=120, batch_size=8, seq_len=128, lr=1e-2, warmup_steps=15))
    annotator, stats = distill([d.segments for d in world.train_documents], config, folder, progress=False)
    return annotator, stats, folder


def test_word_boundaries_and_entity_copies():
    tok = LookupTokenizer(train_bpe(["Mary Smith-Jones (born 1990) works."] * 5, vocab_size=300))
    text = "Mary Smith-Jones (born 1990) works."
    ids, starts, ends = _text_tokens(tok, text)
    words = [tok.hf.decode([i]) for i, s in zip(ids, starts) if s]
    assert [w.strip() for w in words] == ["Mary", "Smith", "(", "born", "1990", "works"]
    hyphen = [tok.hf.decode([i]) for i in ids].index("-")
    assert not ends[hyphen] and not starts[hyphen + 1]  # "Smith-Jones" is one word
    first, can_end = _continuations(ids, (), starts, ends)
    assert not can_end and set(first) == {i for i, s in zip(ids, starts) if s}
    smith = (ids[0], ids[1])
    nxt, can_end = _continuations(ids, smith, starts, ends)
    assert not can_end and nxt == [ids[2]]  # the name goes on past the hyphen


def test_annotator_learns_and_never_changes_the_text(world, trained):
    annotator, stats, folder = trained
    assert stats["final_loss"] < stats["first_loss"] / 3 and stats["tokens_per_second"] > 0
    held = world.heldout_documents
    results = annotator.annotate([d.plain for d in held], batch_size=20)
    assert all(not v.text_changed and strip(v.segments) == d.plain for v, d in zip(results, held))
    raw = annotator.generate([d.plain for d in held[:5]])
    assert all(strip(parse(r).segments) == d.plain for r, d in zip(raw, held))
    f1 = call_f1([list(zip(v.positions, v.kept)) for v in results], [calls_with_offsets(d.segments) for d in held])
    assert f1["f1"] > 0.25, f1
    assert set(annotator.options.relations) == {lk.relation for d in world.train_documents for lk in d.lookups}

    again = Annotator.load(folder)
    assert again.generate([d.plain for d in held[:5]]) == raw
    meta = json.loads((folder / "annotator.json").read_text())
    assert meta["options"]["prompt"] == "none" and meta["stats"]["steps"] == 120


def test_a_long_document_is_annotated_passage_by_passage(world, trained):
    annotator, _, _ = trained
    held = world.heldout_documents[:12]
    long_text = " ".join(d.plain for d in held)  # one document of twelve bios
    (whole,) = annotator.annotate([long_text], max_chars=len(held[0].plain) + 40)
    assert not whole.text_changed and strip(whole.segments) == long_text
    singles = annotator.annotate([d.plain for d in held])
    # passages cut where the bios meet: the long document gets about the calls of its parts
    assert abs(len(whole.kept) - sum(len(v.kept) for v in singles)) <= len(held)
    assert len(whole.kept) >= len(held)


def test_static_cache_decoding_writes_the_same_and_no_row_outgrows_its_room(world, trained):
    annotator, _, folder = trained
    texts = [d.plain for d in world.heldout_documents[:9]]
    eager = annotator.generate(texts, batch_size=4)
    static = Annotator.load(folder)
    static.graphs = True  # the static KV cache the GPU replays as CUDA graphs, here run eagerly
    assert static.generate(texts, batch_size=4) == eager
    # an annotator that would open a call at every word: its rows stop opening calls when only the
    # room for the longest call and the rest of the text is left, and every text is still copied whole
    eager_calls = Annotator.load(folder)
    eager_calls.options.call_bias = 1e9
    eager_calls.options.max_calls_per_position = 1
    for graphs in (False, True):
        eager_calls.graphs = graphs
        before = eager_calls.generated_tokens
        results = eager_calls.annotate(texts, batch_size=4)
        assert all(not v.text_changed and strip(v.segments) == t for v, t in zip(results, texts))
        lengths = [len(annotator.tok.encode_text(t)) for t in texts]
        assert eager_calls.generated_tokens - before <= sum(lengths) + len(texts) * CALL_ROOM
        assert sum(len(v.kept) for v in results) > 3 * len(texts)  # calls do open, until the room is spent


def test_run_corpus_in_shards_resumes_after_a_kill(world, trained, tmp_path):
    annotator, _, folder = trained
    docs = world.heldout_documents[:13]
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": d.doc_id, "text": d.plain}) + "\n" for d in docs))
    out = tmp_path / "run"
    report = run_corpus(corpus, out, annotator, shard_size=5, batch_size=4, worker=(1, 2), progress=False)
    assert report["shards_done"] == 1 and not (out / "annotated.jsonl").exists()
    # a worker killed in the middle of shard 0: two documents written, the third torn mid-line
    first = run_corpus(corpus, tmp_path / "ref", annotator, shard_size=5, batch_size=4, progress=False)
    ref = (tmp_path / "ref" / "shards" / "shard-00000.jsonl").read_text().splitlines()
    (out / "shards" / "shard-00000.jsonl.partial").write_text(ref[0] + "\n" + ref[1] + "\n" + ref[2][:30])
    report = run_corpus(corpus, out, folder, shard_size=5, batch_size=4, worker=(0, 2), progress=False)
    assert report["shards_done"] == 3 == report["shards"] and report["documents_this_run"] == 3 + 3
    rows = [json.loads(line) for line in (out / "annotated.jsonl").read_text().splitlines()]
    assert sorted(r["id"] for r in rows) == sorted(d.doc_id for d in docs)
    assert (out / "annotated.jsonl").read_text() == (tmp_path / "ref" / "annotated.jsonl").read_text()
    triples = [json.loads(line) for line in (out / "triples.jsonl").read_text().splitlines()]
    assert len(triples) == report["kept"] == first["kept"] and all(t["source"] for t in triples)
    assert report["documents_per_second"] > 0
    with pytest.raises(ValueError, match="worker"):
        run_corpus(corpus, out, annotator, worker=(2, 2))


def test_run_corpus_resumes_only_the_same_request(world, trained, tmp_path):
    annotator, _, folder = trained
    docs = world.heldout_documents[:13]
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": d.doc_id, "text": d.plain}) + "\n" for d in docs))
    ref = run_corpus(corpus, tmp_path / "ref", annotator, shard_size=5, batch_size=4, progress=False)
    out = tmp_path / "run"
    # a trial on the first 7 documents, then the whole corpus: the trial's last shard takes the rest
    trial = run_corpus(corpus, out, annotator, shard_size=5, batch_size=4, limit=7, progress=False)
    assert trial["documents"] == 7 and trial["shards_done"] == 2
    full = run_corpus(corpus, out, folder, shard_size=5, batch_size=4, progress=False)
    assert full["documents"] == 13 and full["documents_this_run"] == 6 and full["kept"] == ref["kept"]
    assert (out / "annotated.jsonl").read_text() == (tmp_path / "ref" / "annotated.jsonl").read_text()
    assert json.loads((out / "shards" / "manifest.json").read_text())["documents"] == 13
    # another shard size, fewer documents, another corpus: refused, the folder left as it was
    with pytest.raises(ValueError, match="--shard-size 5"):
        run_corpus(corpus, out, annotator, shard_size=4, progress=False)
    with pytest.raises(ValueError, match="--limit 13"):
        run_corpus(corpus, out, annotator, shard_size=5, limit=3, progress=False)
    other = tmp_path / "other.jsonl"
    other.write_text("".join(json.dumps({"id": d.doc_id, "text": d.plain}) + "\n"
                             for d in world.heldout_documents[13:20]))
    with pytest.raises(ValueError, match="another corpus"):
        run_corpus(other, out, annotator, shard_size=5, progress=False)
    # a partial shard of another corpus is never carried over by id
    (tmp_path / "p" / "shards").mkdir(parents=True)
    (tmp_path / "p" / "shards" / "shard-00000.jsonl.partial").write_text(
        (out / "shards" / "shard-00000.jsonl").read_text())
    with pytest.raises(ValueError, match="no manifest"):
        run_corpus(other, tmp_path / "p", annotator, shard_size=5, progress=False)
    assert (out / "annotated.jsonl").read_text() == (tmp_path / "ref" / "annotated.jsonl").read_text()
