"""Real facts as documents with their calls, split by entity (lmlm.data.facts, `lmlm data facts`)."""

import json

from typer.testing import CliRunner

from lmlm.cli import app
from lmlm.corpus import Document, read_documents, write_documents
from lmlm.data.facts import cloze_records, country_facts, fact_documents, split_by_entity
from lmlm.kb import build
from lmlm.lookup import Lookup

FACTS = [("Kenya", "Capital", "Nairobi"), ("Kenya", "Demonym", "Kenyan"), ("Peru", "Capital", "Lima"),
         ("Peru", "Continent", "Americas"), ("Fiji", "Capital", "Suva"), ("Chad", "Capital", "N'Djamena")]


def test_countryinfo_gives_real_facts_of_many_countries():
    facts = country_facts()
    assert len({e for e, _, _ in facts}) > 200
    assert ("Kenya", "Capital", "Nairobi") in facts and ("France", "Demonym", "French") in facts
    assert {r for _, r, _ in facts} == {"Capital", "Demonym", "Continent", "Region"}


def test_split_keeps_each_entity_whole_and_never_holds_out_one_the_text_names():
    facts = country_facts()
    train, held = split_by_entity(facts, 0.5, seed=1, named="a text about Kenya and Peru")
    assert {e for e, _, _ in train}.isdisjoint({e for e, _, _ in held})
    assert len(train) + len(held) == len(facts) and 0.3 < len(held) / len(facts) < 0.7
    assert not {"Kenya", "Peru"} & {e for e, _, _ in held}
    assert split_by_entity(facts, 0.5, seed=1, named="a text about Kenya and Peru")[1] == held  # seeded
    assert split_by_entity(facts, 0.5, seed=2)[1] != held


def test_a_fact_document_states_its_fact_with_the_call_before_the_value():
    docs = fact_documents(FACTS, seed=0)
    assert len(docs) == len(FACTS)
    for doc, (entity, relation, value) in zip(docs, FACTS):
        calls = [s for s in doc.segments if isinstance(s, Lookup)]
        assert [(c.entity, c.relation, c.value) for c in calls] == [(entity, relation, value)]
        before, _, after = doc.annotated.partition("[dblookup(")
        assert doc.text.startswith(f"{entity}\n") and after.split("] ", 1)[1].startswith(value)
    cloze = cloze_records(FACTS[:1])[0]
    assert cloze["masked_sentences"] == ["Kenya\nThe capital of Kenya is [MASK] ."] and cloze["obj_label"] == "Nairobi"


def test_an_infobox_field_is_stated_in_the_words_of_running_text_as_well_as_by_its_name():
    facts = [("Ada Lovelace", "Birth Place", "London")] * 40 + [("Ada Lovelace", "Latd", "51")] * 5
    texts = {d.text.split("\n", 1)[1] for d in fact_documents(facts, seed=0)}
    assert {"Ada Lovelace was born in London.", "The birth place of Ada Lovelace is London."} <= texts
    assert "The latd of Ada Lovelace is 51." in texts and len(texts) == 4  # a field text has no words for
    # the cloze prompt stays the field's name, so the held-out infobox split asks as it always did
    assert cloze_records(facts[:1])[0]["masked_sentences"] == ["Ada Lovelace\nThe birth place of Ada Lovelace is [MASK] ."]


def test_cli_writes_train_documents_and_held_out_triples_that_kb_build_reads(tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    write_documents(corpus, [Document("a", "Kenya lies in East Africa.", "Kenya lies in East Africa.")])
    out, triples, cloze = tmp_path / "facts.jsonl", tmp_path / "held.jsonl", tmp_path / "cloze.jsonl"
    result = CliRunner().invoke(app, ["data", "facts", "countryinfo", "--out", str(out), "--hold-out", "0.4",
                                      "--unnamed-in", str(corpus), "--held-out-triples", str(triples),
                                      "--cloze", str(cloze)])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output.strip().splitlines()[-1])
    docs = read_documents(out)
    held = [json.loads(line) for line in triples.read_text().splitlines()]
    assert summary["documents"] == len(docs) and summary["held_out_facts"] == len(held) > 0
    assert {d.source for d in docs}.isdisjoint({r["entity"] for r in held}) and "Kenya" in {d.source for d in docs}
    kb = build(tmp_path / "kb", triples)
    first = held[0]
    assert kb.lookup(first["entity"], first["relation"]).value == first["value"]
    kb.close()
    records = [json.loads(line) for line in cloze.read_text().splitlines()]
    assert len(records) == len(held) and all("[MASK]" in r["masked_sentences"][0] for r in records)


def test_cli_refuses_an_unknown_source_and_held_out_files_without_a_share(tmp_path):
    out = tmp_path / "f.jsonl"
    bad = CliRunner().invoke(app, ["data", "facts", "nowhere", "--out", str(out)])
    assert bad.exit_code == 2 and "neither a fact source" in bad.output and not out.exists()
    bad = CliRunner().invoke(app, ["data", "facts", "countryinfo", "--out", str(out), "--cloze", str(tmp_path / "c.jsonl")])
    assert bad.exit_code == 2 and "--hold-out" in bad.output
    triples = tmp_path / "t.jsonl"
    triples.write_text("".join(json.dumps({"entity": e, "relation": r, "value": v}) + "\n" for e, r, v in FACTS))
    ok = CliRunner().invoke(app, ["data", "facts", str(triples), "--out", str(out)])
    assert ok.exit_code == 0, ok.output
    assert [d.source for d in read_documents(out)] == [e for e, _, _ in FACTS]
