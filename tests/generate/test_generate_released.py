"""A checkpoint in the layout of the authors' released ones (a plain Hugging Face folder whose tokenizer
carries ``<|db_entity|> <|db_relationship|> <|db_return|> <|db_end|>``) and their JSON database:
running them needs one flag, ``--tokens released``."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM
from typer.testing import CliRunner

from lmlm.cli import app
from lmlm.generate import LookupGenerator
from lmlm.generate.loading import load_model, open_kb
from lmlm.kb.formats import read_authors_json
from lmlm.kb.build import open_authors_json
from lmlm.lookup import RELEASED_TOKENS, Lookup, render_lookup
from lmlm.tokens import train_bpe

runner = CliRunner()
PEOPLE = {"Ada Lind": ("Paris", "baker"), "Bram Moss": ("Oslo", "pilot"), "Cleo O'Hara": ("Lima", "nurse")}


@pytest.fixture(scope="module")
def released(tmp_path_factory):
    """A random 1-layer LLaMA with a BPE holding the released lookup tokens, and an authors' database."""
    folder = tmp_path_factory.mktemp("released")
    texts = [f"{n} was born in {c}. {n} works as a {j}." for n, (c, j) in PEOPLE.items()] * 3
    hf = train_bpe(texts, vocab_size=400, tokens=RELEASED_TOKENS, min_frequency=1)
    hf.save_pretrained(folder / "model")
    config = LlamaConfig(vocab_size=len(hf), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=128,
                         bos_token_id=hf.bos_token_id, eos_token_id=hf.eos_token_id)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(folder / "model")
    triplets = [[n.replace("'", "\\'"), "Birth City", c] for n, (c, _) in PEOPLE.items()]
    triplets += [[n.replace("'", "\\'"), "Occupation", j] for n, (_, j) in PEOPLE.items()] + [["Ada Lind", "Pet"]]
    db = {"entities": list(PEOPLE), "relationships": ["Birth City", "Occupation"],
          "return_values": [v for pair in PEOPLE.values() for v in pair], "triplets": triplets}
    (folder / "database.json").write_text(json.dumps(db, indent=4))
    return folder


def test_read_authors_json(released, tmp_path):
    triples, skipped = read_authors_json(released / "database.json")
    assert skipped == 1 and len(triples) == 6
    assert ("Cleo O'Hara", "Birth City", "Lima") in {(t.entity, t.relation, t.value) for t in triples}
    (tmp_path / "bad.json").write_text(json.dumps({"triplets": []}))
    with pytest.raises(ValueError, match="return_values"):
        read_authors_json(tmp_path / "bad.json")


def test_authors_database_is_imported_once(released, tmp_path):
    db = tmp_path / "db.json"
    db.write_text((released / "database.json").read_text())
    kb = open_authors_json(db)
    assert len(kb) == 6 and kb.lookup("Cleo O'Hara", "Occupation").value == "nurse"
    assert (tmp_path / "db.kb").is_dir() and open_authors_json(db).version == kb.version  # reused
    data = json.loads(db.read_text())
    data["triplets"].append(["Dario Lind", "Birth City", "Cairo"])
    db.write_text(json.dumps(data))
    assert len(open_authors_json(db)) == 7  # the file changed: rebuilt
    (tmp_path / "other.kb").mkdir()
    (tmp_path / "other.kb" / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError):
        open_authors_json(db, tmp_path / "other.kb")


def test_load_model_needs_the_right_tokens(released):
    with pytest.raises(ValueError, match="released"):
        load_model(released / "model", tokens="paper")
    assert load_model(released / "model")[1].tokens == RELEASED_TOKENS  # found in its tokenizer
    model, tok, meta = load_model(released / "model", tokens="released")
    assert meta == {} and tok.tokens == RELEASED_TOKENS
    assert tok.start_id == tok.hf.convert_tokens_to_ids("<|db_entity|>")
    db = open_kb(released / "database.json")
    r = LookupGenerator(model, tok, db, constrained=True, matching="key").generate(
        ["Cleo O'Hara was born in"], force_lookup=True, max_new_tokens=20)[0]
    t = r.trace[0]  # the query is a key of the database, so the paper's key match gives its value exactly
    assert t.status == "exact" and t.value == dict(PEOPLE)[t.query_entity][t.query_relation == "Occupation"]
    if t.query_entity != "Cleo O'Hara":  # a key about someone the text does not name: entity matching refuses it
        again = LookupGenerator(model, tok, db, constrained=True).generate(
            ["Cleo O'Hara was born in"], force_lookup=True, max_new_tokens=20)[0].trace[0]
        assert (again.query_entity, again.found, again.triple_id) == (t.query_entity, False, None)
    assert r.token_ids[0] == tok.start_id and tok.retrieve_id == tok.hf.convert_tokens_to_ids("<|db_return|>")


def test_cli_runs_the_released_layout_with_one_flag(released):
    args = ["generate", "Ada Lind was born in", "--model", str(released / "model"),
            "--kb", str(released / "database.json"), "--force-lookup", "--constrained", "--max-new-tokens", "20"]
    res = runner.invoke(app, args + ["--tokens", "paper"])
    assert res.exit_code == 2 and "released" in res.output
    res = runner.invoke(app, args + ["--json"])  # the vocabulary found in its tokenizer
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, args + ["--tokens", "released", "--json", "--device", "cpu"])
    assert res.exit_code == 0, res.output
    (r,) = json.loads(res.stdout)
    t = r["trace"][0]
    assert t["found"] and t["status"] == "exact" and t["sources"] == ["database.json"]
    assert t["value"] == dict(PEOPLE)[t["query_entity"]][t["query_relation"] == "Occupation"]
    call = render_lookup(Lookup(t["query_entity"], t["query_relation"], t["value"]))
    assert r["text"].startswith(call) and r["token_ids"][0] == load_model(released / "model", "released")[1].start_id
    res = runner.invoke(app, args + ["--tokens", "released", "--stream"])  # highlighted text, as it comes
    assert res.exit_code == 0, res.output
    assert "Ada Lind was born in" in res.stdout and "→" in res.stdout and "exact" in res.stdout


def test_eval_and_serve_open_the_released_layout(released, tmp_path):
    """One opener: ``lmlm eval`` and ``lmlm serve`` take what ``lmlm generate`` takes."""
    from fastapi.testclient import TestClient

    from lmlm.serve.app import create_app

    records = [{"uuid": str(k), "obj_label": c, "sub_label": n, "predicate_id": "P19",
                "masked_sentence": f"{n} was born in [MASK]."} for k, (n, (c, _)) in enumerate(PEOPLE.items())]
    (tmp_path / "P19.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    res = runner.invoke(app, ["eval", "trex", "--model", str(released / "model"), "--kb", str(released / "database.json"),
                              "--data", str(tmp_path / "P19.jsonl"), "--out", str(tmp_path / "trex.json")])
    assert res.exit_code == 0, res.output
    out = json.loads((tmp_path / "trex.json").read_text())
    assert out["metrics"]["trex_n"] == 3
    with TestClient(create_app(released / "model", released / "database.json", device="cpu")) as client:
        r = client.post("/api/generate", json={"prompt": "Bram Moss was born in", "max_new_tokens": 12,
                                                "force_lookup": True})
        assert r.status_code == 200, r.text
        assert r.json()["trace"][0]["query_entity"]


def test_a_mistyped_or_broken_model_fails_at_once_in_one_line(released, tmp_path):
    import shutil
    import time

    t0 = time.perf_counter()
    res = runner.invoke(app, ["generate", "x", "--model", str(tmp_path / "no-such-run" / "checkpoint"), "--no-db"])
    assert res.exit_code == 2 and "no such model folder" in res.output and time.perf_counter() - t0 < 10
    broken = tmp_path / "broken"
    shutil.copytree(released / "model", broken)
    data = (broken / "model.safetensors").read_bytes()
    (broken / "model.safetensors").write_bytes(data[: len(data) // 2])  # truncated
    res = runner.invoke(app, ["generate", "x", "--model", str(broken), "--no-db"])
    assert res.exit_code == 2 and "cannot read the model weights" in res.output
    (broken / "model.safetensors").write_bytes(b"\xff" * 64)  # not a header at all
    res = runner.invoke(app, ["generate", "x", "--model", str(broken), "--no-db"])
    assert res.exit_code == 2 and "cannot read the model weights" in res.output
