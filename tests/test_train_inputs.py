"""What a run starts from, checked before it trains: shards made with the model's tokenizer (and a
shards folder whose tokenizer is the one its manifest names), lookup calls in LMLM shards, a run
folder that is not something else, and a KB that exists."""

from __future__ import annotations

import json
import random
import shutil

import pytest

from lmlm.corpus import Document, write_documents
from lmlm.data.shards import prepare_shards, read_manifest, tokenizer_hash
from lmlm.lookup import parse, strip
from lmlm.tokens import LookupTokenizer, load_tokenizer, train_bpe
from lmlm.train import TrainConfig, train
from lmlm.train.config import TrainConfigError

pytestmark = pytest.mark.usefixtures("one_torch_thread")

NAMES = ["Ada Albers", "Bruno Brandt", "Chiara Costa", "Dmitri Dubois", "Elena Eriksen"]
CITIES = ["London", "Paris", "Lisbon", "Oslo", "Vienna"]


def _texts(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [f"{name} was born in [dblookup('{name}', 'Birth City') -> {city}] {city}. Document {i} tells of "
            f"{rng.choice(CITIES)} and the family." for i in range(n)
            for name, city in [(rng.choice(NAMES), rng.choice(CITIES))]]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Documents, and shards of them made with two BPEs of the same size trained on different text."""
    folder = tmp_path_factory.mktemp("inputs")
    texts = _texts(80, 0)
    write_documents(folder / "docs.jsonl", (Document.from_annotated(f"d{i}", t) for i, t in enumerate(texts)))
    plain = [strip(parse(t).segments) for t in texts]
    write_documents(folder / "plain.jsonl", (Document(f"p{i}", t, t) for i, t in enumerate(plain)))
    for name, source in (("a", plain), ("b", [t.upper() for t in plain])):
        LookupTokenizer(train_bpe(source, vocab_size=300)).save(folder / f"tok_{name}")
        prepare_shards(folder / "docs.jsonl", load_tokenizer(folder / f"tok_{name}"), folder / f"shards_{name}",
                       workers=1, progress=False)
    prepare_shards(folder / "plain.jsonl", load_tokenizer(folder / "tok_a"), folder / "shards_plain", workers=1,
                   progress=False)
    return folder


def _config(tmp_path, name: str, **kw) -> TrainConfig:
    base = dict(model="gpt2-tiny", seq_len=32, micro_batch_size=4, batch_size=4, max_steps=2, warmup_steps=1,
                progress=False, threads=1, out_dir=str(tmp_path / name))
    return TrainConfig(**{**base, **kw})


def test_shards_of_another_tokenizer_are_refused(tmp_path, world):
    a, b = str(world / "shards_a"), str(world / "shards_b")
    assert len(load_tokenizer(world / "tok_a")) == len(load_tokenizer(world / "tok_b"))  # the same size, other ids
    train(_config(tmp_path, "A", data=a))
    ckpt = str(tmp_path / "A" / "checkpoint")
    train(_config(tmp_path, "again", data=a, init_from=ckpt))  # the checkpoint's own tokenizer: accepted
    with pytest.raises(TrainConfigError, match="another tokenizer"):  # a checkpoint on shards of another BPE
        train(_config(tmp_path, "x", data=b, init_from=ckpt))
    with pytest.raises(TrainConfigError, match="eval data .*another tokenizer"):
        train(_config(tmp_path, "y", data=a, eval_data=b))
    with pytest.raises(TrainConfigError, match="another tokenizer"):  # --tokenizer is checked, not ignored
        train(_config(tmp_path, "z", data=a, tokenizer=str(world / "tok_b")))
    train(_config(tmp_path, "same", data=a, tokenizer=str(world / "tok_a")))
    assert not (tmp_path / "x").exists() and not (tmp_path / "z").exists()


def test_a_shards_folder_is_read_with_the_tokenizer_its_manifest_names(tmp_path, world):
    shards = tmp_path / "s"
    shutil.copytree(world / "shards_a", shards)
    shutil.rmtree(shards / "tokenizer")
    shutil.copytree(world / "tok_b", shards / "tokenizer")  # another tokenizer of the same size
    with pytest.raises(TrainConfigError, match="not the one the shards were made with"):
        train(_config(tmp_path, "x", data=str(shards)))
    shutil.rmtree(shards / "tokenizer")
    with pytest.raises(TrainConfigError, match="tokenizer folder .* is missing"):
        train(_config(tmp_path, "y", data=str(shards)))


def test_a_run_does_not_write_into_a_shards_folder(tmp_path, world):
    shards = tmp_path / "s"
    shutil.copytree(world / "shards_a", shards)
    before = tokenizer_hash(load_tokenizer(shards / "tokenizer"))
    with pytest.raises(TrainConfigError, match="token shards folder"):
        train(_config(tmp_path, "s", data=str(world / "docs.jsonl"), tokenizer="bpe:280"))
    assert tokenizer_hash(load_tokenizer(shards / "tokenizer")) == before == read_manifest(shards)["tokenizer_hash"]
    assert not (shards / "train_config.json").exists()


def test_shards_without_a_lookup_call_are_refused_in_lmlm_mode(tmp_path, world):
    plain = str(world / "shards_plain")
    assert read_manifest(plain)["lookup_calls"] == 0
    with pytest.raises(TrainConfigError, match="not one of its 80 documents has a lookup call"):
        train(_config(tmp_path, "x", data=plain))
    assert train(_config(tmp_path, "std", data=plain, mode="standard")).stats["steps"] == 2
    assert train(_config(tmp_path, "allowed", data=plain, allow_no_calls=True)).stats["steps"] == 2


def test_the_kb_is_checked_before_training(tmp_path, world):
    with pytest.raises(TrainConfigError, match="kb .*nosuchkb: no such file or folder"):
        train(_config(tmp_path, "x", data=str(world / "shards_a"), kb=str(tmp_path / "nosuchkb")))
    (tmp_path / "notakb").mkdir()
    with pytest.raises(TrainConfigError, match="not a knowledge base"):
        train(_config(tmp_path, "y", data=str(world / "shards_a"), kb=str(tmp_path / "notakb")))
    assert not (tmp_path / "x").exists()
    (tmp_path / "db.json").write_text(json.dumps({}))  # an authors' JSON database, as lmlm generate --kb takes
    result = train(_config(tmp_path, "z", data=str(world / "shards_a"), kb=str(tmp_path / "db.json")))
    assert result.stats["steps"] == 2
