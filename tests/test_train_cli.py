"""``lmlm train`` from the command line: flags over a config file, the run summary, data without calls,
and a pretrained Hugging Face model turned into an LMLM."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from lmlm.corpus import Document, write_documents
from lmlm.lookup import parse, strip

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).parent))
from test_train import biographies  # noqa: E402


def lmlm(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "lmlm.cli", *args], capture_output=True, text=True, env=env,
                          timeout=timeout)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    folder = tmp_path_factory.mktemp("corpus")
    texts = biographies(120)
    write_documents(folder / "docs.jsonl", (Document.from_annotated(f"d{i}", t) for i, t in enumerate(texts)))
    write_documents(folder / "plain.jsonl", (Document(f"p{i}", strip(parse(t).segments), strip(parse(t).segments))
                                             for i, t in enumerate(texts)))
    return folder


def test_flags_train_and_the_summary_counts_calls(tmp_path, corpus):
    proc = lmlm("train", "--data", str(corpus / "docs.jsonl"), "--model", "gpt2-tiny", "--max-steps", "3",
                "--out", str(tmp_path / "T"), "--no-progress", "--tokenizer", "bpe:300")
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads((tmp_path / "T" / "summary.json").read_text())
    assert summary["documents"] == 120 and summary["lookup_calls"] == 360
    assert summary["trained_tokens_seen"] > 0 and summary["steps"] == 3
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "T" / "checkpoint")
    assert model.config.n_layer == 2  # gpt2-tiny


def test_packing_by_document_gives_each_document_its_own_sequences(tmp_path, corpus):
    proc = lmlm("train", "--data", str(corpus / "docs.jsonl"), "--model", "gpt2-tiny", "--max-steps", "2",
                "--seq-len", "128", "--packing", "document", "--out", str(tmp_path / "D"), "--no-progress",
                "--tokenizer", "bpe:300")
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads((tmp_path / "D" / "summary.json").read_text())
    assert summary["blocks"] >= summary["documents"] == 120  # a stream of these would fill far fewer blocks
    assert summary["blocks"] > summary["data_tokens"] // 128 + 1
    stats = json.loads((tmp_path / "D" / "train_stats.json").read_text())  # tokens seen: data, not padding
    config = json.loads((tmp_path / "D" / "train_config.json").read_text())["train"]
    assert stats["block_tokens"] == 2 * config["batch_size"] * 128
    assert 0 < summary["tokens_seen"] == stats["tokens"] < stats["block_tokens"] * 0.8
    proc = lmlm("train", "--data", str(corpus / "docs.jsonl"), "--packing", "pages", "--out", str(tmp_path / "E"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr


@pytest.mark.slow
def test_flags_override_the_config_file_and_a_run_config_is_accepted(tmp_path, corpus):
    cfg = {"model": "gpt2-tiny", "data": str(corpus / "docs.jsonl"), "max_steps": 5, "seq_len": 64,
           "micro_batch_size": 4, "tokenizer": "bpe:300", "progress": False, "out_dir": str(tmp_path / "A")}
    (tmp_path / "cfg.json").write_text(json.dumps(cfg))
    proc = lmlm("train", "--config", str(tmp_path / "cfg.json"), "--max-steps", "2", "--lr", "0.002")
    assert proc.returncode == 0, proc.stderr[-2000:]
    written = json.loads((tmp_path / "A" / "train_config.json").read_text())
    assert written["train"]["max_steps"] == 2 and written["train"]["lr"] == 0.002 and written["train"]["seq_len"] == 64
    # the train_config.json a run wrote is a valid --config for the next run
    proc = lmlm("train", "--config", str(tmp_path / "A" / "train_config.json"), "--out", str(tmp_path / "B"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads((tmp_path / "B" / "train_stats.json").read_text())["steps"] == 2
    # a flag replaces its counterpart in the file: --epochs its max_steps, --max-tokens-per-step its batch_size
    proc = lmlm("train", "--config", str(tmp_path / "A" / "train_config.json"), "--epochs", "0.5",
                "--max-tokens-per-step", "512", "--out", str(tmp_path / "C"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    written = json.loads((tmp_path / "C" / "train_config.json").read_text())["train"]
    assert written["batch_size"] == 8  # 512 tokens of 64-token sequences
    steps_per_epoch = json.loads((tmp_path / "C" / "train_config.json").read_text())["steps_per_epoch"]
    assert written["max_steps"] == -(-steps_per_epoch // 2)  # half an epoch
    proc = lmlm("train", "--config", str(tmp_path / "C" / "train_config.json"), "--max-steps", "1",
                "--batch-size", "4", "--out", str(tmp_path / "D"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    written = json.loads((tmp_path / "D" / "train_config.json").read_text())["train"]
    assert (written["max_steps"], written["batch_size"]) == (1, 4)


def test_lmlm_mode_on_text_without_calls_is_refused_unless_allowed(tmp_path, corpus):
    proc = lmlm("train", "--data", str(corpus / "plain.jsonl"), "--model", "gpt2-tiny", "--max-steps", "1",
                "--out", str(tmp_path / "T"), "--no-progress")
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and "lookup call" in lines[0] and "plain.jsonl" in lines[0]
    proc = lmlm("train", "--data", str(corpus / "plain.jsonl"), "--model", "gpt2-tiny", "--max-steps", "1",
                "--out", str(tmp_path / "T"), "--no-progress", "--allow-no-calls", "--tokenizer", "bpe:300")
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_a_missing_local_model_fails_at_once(tmp_path, corpus):
    proc = lmlm("train", "--data", str(corpus / "docs.jsonl"), "--init-from", str(tmp_path / "nope"),
                "--max-steps", "1", "--out", str(tmp_path / "T"), timeout=120)
    assert proc.returncode == 2 and "no such file or folder" in proc.stderr and "Traceback" not in proc.stderr


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory, corpus):
    """A small pretrained-style Hugging Face folder: a GPT-2 model and a BPE tokenizer without lookup tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    folder = tmp_path_factory.mktemp("pretrained")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([strip(parse(t).segments) for t in biographies(120)], trainer=trainer)
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", bos_token="<|endoftext|>")
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=len(hf), n_embd=32, n_layer=2, n_head=2, n_positions=128,
                                       bos_token_id=hf.bos_token_id, eos_token_id=hf.eos_token_id))
    model.save_pretrained(folder)
    hf.save_pretrained(folder)
    return folder


@pytest.mark.parametrize("mode", ["lmlm", "standard"])
def test_a_pretrained_model_becomes_an_lmlm(tmp_path, corpus, pretrained, mode):
    before = AutoModelForCausalLM.from_pretrained(pretrained).get_input_embeddings().weight.detach().clone()
    proc = lmlm("train", "--data", str(corpus / "docs.jsonl"), "--init-from", str(pretrained), "--mode", mode,
                "--max-steps", "2", "--lr", "1e-9", "--warmup-steps", "0", "--seq-len", "64", "--out",
                str(tmp_path / "T"), "--no-progress")
    assert proc.returncode == 0, proc.stderr[-2000:]
    ckpt = tmp_path / "T" / "checkpoint"
    model = AutoModelForCausalLM.from_pretrained(ckpt)
    tok = AutoTokenizer.from_pretrained(ckpt)
    for name in ("<|db_start|>", "<|sep|>", "<|db_retrieve|>", "<|db_end|>"):
        assert name in tok.get_vocab()
    emb = model.get_input_embeddings().weight.detach()
    assert emb.shape[0] == before.shape[0] + 4 == len(tok)
    torch.testing.assert_close(emb[:before.shape[0]], before, atol=1e-6, rtol=0)  # old rows kept (lr ~ 0)
    # new rows: drawn around the mean of the old rows, not zeros and not copies of one row
    new = emb[before.shape[0]:]
    assert new.norm(dim=1).min() > 0 and torch.cdist(new, new).triu(1).max() > 0
    assert (new.mean(0) - before.mean(0)).norm() < before.norm(dim=1).mean()
    meta = json.loads((ckpt / "lmlm.json").read_text())
    assert meta["mode"] == mode and meta["init_from"]["kind"] == "folder"
    summary = json.loads((tmp_path / "T" / "summary.json").read_text())
    if mode == "lmlm":
        assert summary["lookup_calls"] == 360
    else:  # the Standard model trains on none: the corpus's calls were stripped
        assert summary["lookup_calls"] == 0 and summary["lookup_calls_stripped"] == 360


def test_shipped_accelerate_configs_load():
    from accelerate.commands.config.config_args import load_config_from_file

    kinds = {p.stem: load_config_from_file(str(p)).distributed_type.value
             for p in (ROOT / "configs" / "accelerate").glob("*.yaml")}
    assert kinds == {"ddp": "MULTI_GPU", "fsdp": "FSDP"}


BROKEN = ["Ada was born in [dblookup('Ada', 'Birth City') -> London London.",
          "Bob lives in <|db_start|> Bob <|sep|> City <|db_end|> Paris.",
          "Cy <|db_start|> Cy <|db_retrieve|> x <|db_end|> works <|db_start|>"]


@pytest.fixture(scope="module")
def mixed(corpus):
    """The 120 good documents and three with malformed calls (lines 121-123)."""
    path = corpus / "mixed.jsonl"
    lines = (corpus / "docs.jsonl").read_text().splitlines()
    lines += [json.dumps({"id": f"bad{k}", "annotated": t}) for k, t in enumerate(BROKEN)]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_documents_with_malformed_calls_are_refused_or_left_out(tmp_path, mixed):
    args = ("train", "--model", "gpt2-tiny", "--max-steps", "1", "--no-progress", "--tokenizer", "bpe:300")
    proc = lmlm(*args, "--data", str(mixed), "--out", str(tmp_path / "T"))
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-2000:]
    assert "mixed.jsonl:121: malformed lookup call" in lines[0] and "unterminated" in lines[0]
    assert "3 of 123 documents" in lines[0] and "--skip-malformed" in lines[0]
    # only the bad lines: the malformed call is named, not "no lookup call"
    (tmp_path / "bad.jsonl").write_text("".join(json.dumps({"annotated": t}) + "\n" for t in BROKEN))
    proc = lmlm(*args, "--data", str(tmp_path / "bad.jsonl"), "--out", str(tmp_path / "T"))
    assert proc.returncode == 2 and "bad.jsonl:1: malformed lookup call" in proc.stderr
    for mode in ("lmlm", "standard"):
        proc = lmlm(*args, "--data", str(mixed), "--out", str(tmp_path / mode), "--skip-malformed", "--mode", mode)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert "left out 3 of 123 documents" in proc.stderr and "mixed.jsonl:121" in proc.stderr
        summary = json.loads((tmp_path / mode / "summary.json").read_text())
        assert summary["documents"] == 120 and summary["documents_left_out_malformed"] == 3
        assert summary["lookup_calls"] == (360 if mode == "lmlm" else 0)
    assert json.loads((tmp_path / "standard" / "summary.json").read_text())["lookup_calls_stripped"] == 360


def test_no_lookup_token_comes_from_text_outside_a_call():
    from lmlm.lookup import Text
    from lmlm.tokens import ORG, LookupTokenizer, train_bpe
    from lmlm.train.data import MalformedCallError, encode_documents, screen_documents

    tok = LookupTokenizer(train_bpe([strip(parse(t).segments) for t in biographies(20)], vocab_size=300))
    for bad in (BROKEN[1], [Text("Bob lives in <|sep|> Paris.")]):
        for mode in ("lmlm", "standard"):
            with pytest.raises(MalformedCallError, match="outside a lookup call|not closed in order"):
                encode_documents([bad], tok, mode)
    kept, malformed = screen_documents(enumerate([*biographies(3), *BROKEN]), skip_malformed=True)
    assert len(kept) == 3 and (malformed.documents, malformed.total, malformed.first[0]) == (3, 6, 3)
    for mode in ("lmlm", "standard"):
        for enc in encode_documents(kept, tok, mode):
            assert not any(i in tok.call_ids and r == ORG for i, r in zip(enc.input_ids, enc.roles))


@pytest.mark.slow
def test_a_pretrained_model_trains_only_on_shards_of_its_own_tokenizer(tmp_path, corpus, pretrained):
    """Shards of the pretrained model's tokenizer (plus the lookup tokens): its embedding grows by the four
    lookup rows. Shards of another tokenizer: refused, one line, nothing resized or saved."""
    prep = lmlm("data", "prepare", str(corpus / "docs.jsonl"), "--tokenizer", str(pretrained), "--out",
                str(tmp_path / "S"), "--workers", "1", "--no-progress")
    assert prep.returncode == 0, prep.stderr[-2000:]
    train = ["train", "--init-from", str(pretrained), "--max-steps", "1", "--seq-len", "64", "--no-progress"]
    proc = lmlm(*train, "--data", str(tmp_path / "S"), "--out", str(tmp_path / "T"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    meta = json.loads((tmp_path / "T" / "checkpoint" / "lmlm.json").read_text())
    assert meta["init_from"]["rows_added"] == 4
    other = tmp_path / "other"
    AutoTokenizer.from_pretrained(pretrained).save_pretrained(other)
    tok = json.loads((other / "tokenizer.json").read_text())
    tok["model"]["vocab"] = {k[::-1] if len(k) > 2 else k: v for k, v in tok["model"]["vocab"].items()}
    tok["model"]["merges"] = []  # the same size, other tokens
    (other / "tokenizer.json").write_text(json.dumps(tok))
    prep = lmlm("data", "prepare", str(corpus / "docs.jsonl"), "--tokenizer", str(other), "--out",
                str(tmp_path / "S2"), "--workers", "1", "--no-progress")
    assert prep.returncode == 0, prep.stderr[-2000:]
    proc = lmlm(*train, "--data", str(tmp_path / "S2"), "--out", str(tmp_path / "U"))
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "another tokenizer" in lines[0], proc.stderr[-2000:]
    assert not (tmp_path / "U" / "checkpoint").exists()


def test_a_model_folder_without_a_tokenizer_needs_the_tokenizer_option(tmp_path, corpus, pretrained):
    bare = tmp_path / "bare"
    bare.mkdir()
    for f in pretrained.iterdir():
        if f.name in ("config.json", "model.safetensors", "generation_config.json"):
            shutil.copy(f, bare / f.name)
    args = ["train", "--data", str(corpus / "docs.jsonl"), "--max-steps", "1", "--seq-len", "64", "--no-progress"]
    proc = lmlm(*args, "--init-from", str(bare), "--out", str(tmp_path / "T"))
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and str(bare) in lines[0] and "--tokenizer" in lines[0], \
        proc.stderr[-2000:]
    proc = lmlm(*args, "--init-from", str(bare), "--tokenizer", str(pretrained), "--out", str(tmp_path / "T"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    (tmp_path / "world").mkdir()
    (tmp_path / "world" / "config.json").write_text(json.dumps({"preset": "smoke", "seed": 0}))
    proc = lmlm(*args, "--init-from", str(tmp_path / "world"), "--out", str(tmp_path / "W"))
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "world" in lines[0], proc.stderr[-2000:]


def test_held_out_and_test_documents_are_left_out_of_training(tmp_path):
    texts = biographies(60)
    splits = ["train"] * 30 + [None] * 14 + ["heldout"] * 10 + ["test"] * 6
    write_documents(tmp_path / "docs.jsonl", (Document.from_annotated(f"d{i}", t, split=s)
                                               for i, (t, s) in enumerate(zip(texts, splits))))
    args = ["train", "--data", str(tmp_path / "docs.jsonl"), "--model", "gpt2-tiny", "--max-steps", "1",
            "--tokenizer", "bpe:300", "--batch-size", "4", "--seq-len", "64", "--no-progress"]
    proc = lmlm(*args, "--out", str(tmp_path / "T"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads((tmp_path / "T" / "summary.json").read_text())
    assert summary["documents"] == 44 and summary["left_out"] == {"heldout": 10, "test": 6}
    assert summary["lookup_calls"] == 44 * 3
    proc = lmlm(*args, "--split", "heldout", "--out", str(tmp_path / "H"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads((tmp_path / "H" / "summary.json").read_text())
    assert summary["documents"] == 10 and summary["left_out"] == {"train": 30, "(no split)": 14, "test": 6}
    proc = lmlm(*args, "--split", "nosuch", "--out", str(tmp_path / "N"))
    assert proc.returncode == 2 and "no documents of split 'nosuch'" in proc.stderr, proc.stderr[-2000:]


def test_a_dataset_dict_trains_on_its_train_split(tmp_path):
    import datasets
    texts = biographies(30)
    dd = datasets.DatasetDict({"train": datasets.Dataset.from_dict({"annotated": texts[:20]}),
                               "test": datasets.Dataset.from_dict({"annotated": texts[20:]})})
    dd.save_to_disk(str(tmp_path / "dd"))
    proc = lmlm("train", "--data", str(tmp_path / "dd"), "--model", "gpt2-tiny", "--max-steps", "1",
                "--tokenizer", "bpe:300", "--batch-size", "4", "--seq-len", "64", "--no-progress", "--out",
                str(tmp_path / "T"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads((tmp_path / "T" / "summary.json").read_text())
    assert summary["documents"] == 20 and summary["left_out"] == {"test": 10}
