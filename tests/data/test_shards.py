"""Token shards: the same blocks as the in-memory path, resumable writing, training from shards."""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch

from lmlm.corpus import Document, write_documents
from lmlm.data.shards import MANIFEST, ShardBlocks, ShardError, prepare_shards, read_manifest
from lmlm.lookup import parse, strip
from lmlm.tokens import LookupTokenizer, load_tokenizer, train_bpe
from lmlm.train import TrainConfig, encode_documents, pack, train
from lmlm.train.config import TrainConfigError

pytestmark = pytest.mark.usefixtures("one_torch_thread")

NAMES = ["Ada Albers", "Bruno Brandt", "Chiara Costa", "Dmitri Dubois", "Elena Eriksen", "Farid Fischer"]
CITIES = ["London", "Paris", "Lisbon", "Oslo", "Vienna", "Prague"]


def _texts(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        name, city, year = rng.choice(NAMES), rng.choice(CITIES), rng.randint(1900, 1999)
        calls = rng.random() < 0.8
        born = f"[dblookup('{name}', 'Birth City') -> {city}] " if calls else ""
        when = f"[dblookup('{name}', 'Birth Year') -> {year}] " if calls else ""
        out.append(f"{name} was born in {born}{city} in {when}{year}. Document {i} says more about the "
                   f"family, which moved to {rng.choice(CITIES)} later.")
    return out


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    folder = tmp_path_factory.mktemp("corpus")
    texts = _texts(150)
    write_documents(folder / "docs.jsonl", (Document.from_annotated(f"d{i}", t) for i, t in enumerate(texts)))
    tok = LookupTokenizer(train_bpe([strip(parse(t).segments) for t in texts], vocab_size=300))
    tok.save(folder / "tok")
    return folder / "docs.jsonl", load_tokenizer(folder / "tok"), texts


def _prepare(corpus, out, **kw):
    path, tok, _ = corpus
    return prepare_shards(path, tok, out, workers=1, progress=False, chunk_documents=10, **kw)


@pytest.mark.parametrize("mode", ["lmlm", "standard"])
def test_shard_blocks_are_the_packed_blocks(tmp_path, corpus, mode):
    _, tok, texts = corpus
    m = _prepare(corpus, tmp_path / "s", shard_tokens=1500)  # several shards: blocks straddle shard ends
    assert len(m["shards"]) > 2 and m["documents"] == len(texts)
    packed = pack(encode_documents(texts, tok, mode), 48, tok.end_id, pad_id=tok.eos_id)
    blocks = ShardBlocks(tmp_path / "s", 48, mode)
    assert len(blocks) == len(packed) and blocks.num_tokens == packed.num_tokens
    idx = torch.randperm(len(packed), generator=torch.Generator().manual_seed(0))
    for got, want in zip(blocks.blocks(idx), packed.blocks(idx)):
        assert torch.equal(got, want)
    assert blocks.trained_tokens() == packed.trained_tokens()
    p2 = blocks.to_packed()
    assert torch.equal(p2.labels, packed.labels) and torch.equal(p2.roles, packed.roles)


def test_manifest_counts_roles_calls_and_picks_uint16(tmp_path, corpus):
    _, tok, texts = corpus
    m = _prepare(corpus, tmp_path / "s")
    calls = sum(t.count("[dblookup(") for t in texts)
    assert m["lookup_calls"] == calls == m["end_tokens"] and m["complete"]
    assert m["dtype"] == "uint16" and m["vocab_size"] == len(tok)
    enc = encode_documents(texts, tok, "lmlm")
    roles = np.concatenate([e.roles for e in enc])
    assert m["tokens"] == len(roles) and m["role_counts"]["value"] == int((roles == 4).sum())


def test_an_interrupted_job_resumes_to_the_same_shards(tmp_path, corpus):
    """The state a crash leaves (last shards missing from the manifest, a half-written .tmp) is finished
    by running the job again, with every file as a straight run writes it."""
    straight = _prepare(corpus, tmp_path / "straight", shard_tokens=1500)
    shutil.copytree(tmp_path / "straight", tmp_path / "crashed")
    m = read_manifest(tmp_path / "crashed")
    m["shards"] = m["shards"][:2]
    m["complete"] = False
    (tmp_path / "crashed" / MANIFEST).write_text(json.dumps(m))
    (tmp_path / "crashed" / "shard-00002.ids.bin.tmp").write_bytes(b"half")
    resumed = _prepare(corpus, tmp_path / "crashed", shard_tokens=1500)
    for key in ("documents", "tokens", "lookup_calls", "role_counts", "shards"):
        assert resumed[key] == straight[key]
    for f in (tmp_path / "straight").glob("shard-*"):
        assert f.read_bytes() == (tmp_path / "crashed" / f.name).read_bytes()
    assert not list((tmp_path / "crashed").glob("*.tmp"))
    again = _prepare(corpus, tmp_path / "crashed", shard_tokens=1500)  # finished: nothing counted twice
    assert again["tokens"] == straight["tokens"]


def test_another_tokenizer_is_refused(tmp_path, corpus):
    path, _, texts = corpus
    _prepare(corpus, tmp_path / "s")
    other = LookupTokenizer(train_bpe([strip(parse(t).segments) for t in texts], vocab_size=280))
    with pytest.raises(ShardError, match="another corpus or tokenizer"):
        prepare_shards(path, other, tmp_path / "s", workers=1, progress=False)


def test_training_from_shards_matches_the_in_memory_path(tmp_path, corpus):
    """30 steps, same data and seed: the same loss curve (the same blocks in the same order)."""
    path, tok, texts = corpus
    _prepare(corpus, tmp_path / "s", shard_tokens=2000)
    base = dict(model="gpt2-tiny", seq_len=48, micro_batch_size=4, batch_size=4, max_steps=30, warmup_steps=3,
                lr=3e-3, log_every=1, progress=False, threads=1)
    train(TrainConfig(**base, out_dir=str(tmp_path / "mem")), [parse(t).segments for t in texts], tok)
    train(TrainConfig(**base, data=str(tmp_path / "s"), out_dir=str(tmp_path / "shards")))

    def losses(run):
        return [json.loads(line)["loss"] for line in (tmp_path / run / "train_log.jsonl").read_text().splitlines()
                if '"loss"' in line]

    assert len(losses("mem")) == 30 and losses("mem")[-1] < losses("mem")[0]
    torch.testing.assert_close(torch.tensor(losses("shards")), torch.tensor(losses("mem")), rtol=1e-6, atol=0)
    summary = json.loads((tmp_path / "shards" / "summary.json").read_text())
    assert summary["lookup_calls"] > 0 and summary["documents"] == len(texts)
    # shards are tokenized once: a new BPE asked for beside them is refused, not silently ignored
    with pytest.raises(TrainConfigError, match="holds token shards"):
        train(TrainConfig(**base, data=str(tmp_path / "s"), tokenizer="bpe:400", out_dir=str(tmp_path / "bpe")))


def test_prepare_command_writes_shards_and_refuses_a_missing_corpus(tmp_path, corpus):
    path, _, _ = corpus
    tok_dir = path.parent / "tok"
    cmd = [sys.executable, "-m", "lmlm.cli", "data", "prepare", str(path), "--tokenizer", str(tok_dir), "--out",
           str(tmp_path / "s"), "--workers", "2", "--no-progress"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["documents"] == 150 and out["lookup_calls"] > 0
    cmd[5] = str(tmp_path / "missing.jsonl")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and proc.stderr.startswith("error:") and len(proc.stderr.strip().splitlines()) == 1


def test_malformed_calls_stop_the_job_or_are_left_out(tmp_path, corpus):
    from lmlm.train.data import MalformedCallError

    path, tok, texts = corpus
    bad = ["Bob lives in <|db_start|> Bob <|sep|> City <|db_end|> Paris.", "Ada in [dblookup('Ada', 'City') -> X"]
    docs = [Document.from_annotated(f"d{i}", t) for i, t in enumerate(texts[:30])]
    docs[12:12] = [Document(f"b{k}", t, t) for k, t in enumerate(bad)]
    write_documents(tmp_path / "mixed.jsonl", docs)
    with pytest.raises(MalformedCallError, match=r"mixed.jsonl:13: malformed lookup call .*--skip-malformed"):
        prepare_shards(tmp_path / "mixed.jsonl", tok, tmp_path / "s", workers=1, progress=False, chunk_documents=5)
    # the same command with skip_malformed goes on from there, the two documents left out
    m = prepare_shards(tmp_path / "mixed.jsonl", tok, tmp_path / "s", workers=1, progress=False, chunk_documents=5,
                       skip_malformed=True)
    assert (m["documents"], m["skipped_malformed"]) == (30, 2) and m["complete"]
    good = prepare_shards(tmp_path / "mixed.jsonl", tok, tmp_path / "s2", workers=1, progress=False,
                          skip_malformed=True)  # straight through: the same shards as the resumed job
    assert good["tokens"] == m["tokens"] and good["skipped_malformed"] == 2
    packed = ShardBlocks(tmp_path / "s2", 32).to_packed()
    calls = torch.tensor([tok.start_id, tok.sep_id, tok.retrieve_id, tok.end_id])
    assert not ((packed.roles == 0) & torch.isin(packed.input_ids, calls)).any()  # no lookup token from text


def test_a_split_without_documents_leaves_no_shards_folder(tmp_path, corpus):
    """Nothing to shard: an error, and no folder a rerun or a training run would take as finished shards."""
    from lmlm.corpus import CorpusError
    from lmlm.data.shards import is_shards

    for _ in range(2):  # the rerun fails the same way
        with pytest.raises(CorpusError, match="no documents of split 'nosuch'"):
            _prepare(corpus, tmp_path / "s", split="nosuch")
        assert not is_shards(tmp_path / "s") and not (tmp_path / "s" / "tokenizer").exists()
