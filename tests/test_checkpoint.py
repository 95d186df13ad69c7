"""Checkpoints: a Hugging Face folder plus lmlm.json, loadable by AutoModelForCausalLM."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from lmlm.checkpoint import is_checkpoint, load_checkpoint, read_meta, save_checkpoint
from lmlm.lookup import RELEASED_TOKENS, parse
from lmlm.models import build_model
from lmlm.tokens import LookupTokenizer, load_tokenizer, train_bpe

TEXT = "Ada Lovelace was born in [dblookup('Ada Lovelace', 'Birth City') -> London] London in 1815."


@pytest.fixture(scope="module")
def tokenizer():
    return LookupTokenizer(train_bpe([parse(TEXT).strip()] * 10, vocab_size=300))


@pytest.mark.parametrize("preset", ["gpt2-tiny", "llama-tiny"])
def test_round_trip(tmp_path, tokenizer, preset):
    model = build_model(preset, len(tokenizer), tokenizer, seed=0).eval()
    meta = {"mode": "standard", "kb": "kb/", "stats": {"steps": 3}}
    folder = save_checkpoint(tmp_path / "ck", model, tokenizer, meta)
    assert is_checkpoint(folder)
    assert {"config.json", "model.safetensors", "tokenizer.json", "lmlm.json"} <= {p.name for p in folder.iterdir()}

    loaded, tok, meta = load_checkpoint(folder)
    assert not loaded.training
    assert meta["mode"] == "standard" and meta["kb"] == "kb/" and meta["stats"] == {"steps": 3}
    assert meta["lookup_tokens"]["start"] == "<|db_start|>"
    segs = parse(TEXT).segments
    assert tok.encode(segs) == tokenizer.encode(segs)
    x = torch.tensor([tokenizer.encode(segs).input_ids])
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=x).logits, model(input_ids=x).logits)
        plain = AutoModelForCausalLM.from_pretrained(str(folder)).eval()
        torch.testing.assert_close(plain(input_ids=x).logits, model(input_ids=x).logits)


def test_other_lookup_vocabulary_and_shared_tokenizer(tmp_path, shared_data):
    tok = load_tokenizer(shared_data / "tokenizers" / "llama2" / "tokenizer.json", RELEASED_TOKENS)
    model = build_model("llama-tiny", len(tok), tok, seed=0)
    save_checkpoint(tmp_path, model, tok, {})
    _, loaded, meta = load_checkpoint(tmp_path)
    assert loaded.tokens == RELEASED_TOKENS and len(loaded) == 32004
    assert (loaded.doc_id, loaded.eos_id, loaded.start_id) == (tok.doc_id, tok.eos_id, tok.start_id)
    assert meta["mode"] == "lmlm"


def test_missing_meta_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="not an lmlm checkpoint"):
        read_meta(tmp_path)
    (tmp_path / "lmlm.json").write_text(json.dumps({}))
    assert not is_checkpoint(tmp_path)


def test_a_missing_folder_beside_real_ones_fails_at_once(tmp_path, monkeypatch):
    """``runs/checkpont`` (a typo) in a folder that exists is a local path, never a hub name to ask for
    (with no network, a minute of retries before a message about the hub)."""
    import time

    from lmlm.checkpoint import ModelOpenError, open_model

    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    start = time.monotonic()
    with pytest.raises(ModelOpenError, match="no such model folder"):
        open_model("runs/checkpont")
    assert time.monotonic() - start < 5
