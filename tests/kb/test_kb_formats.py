"""Import and export: JSON lines, Parquet, annotated corpora and the authors' database JSON."""

import json

import pytest

from lmlm.kb import KnowledgeBase, Triple, detect_format

DOCS = [
    {"doc_id": "bio-ada", "annotated": "Ada was born in [dblookup('Ada Lovelace', 'Birth City') -> London] London "
                                       "and died in [dblookup('Ada Lovelace', 'Death Year') -> 1852] 1852."},
    {"doc_id": "bio-ada-2", "annotated": "Lovelace, from [dblookup('Ada Lovelace', 'Birth City') -> London] London."},
    {"id": "note-7", "text": "No facts here."},
]


def _records(kb):
    return [(r.entity, r.relation, r.value, r.count, r.sources) for r in kb.triples()]


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_parquet_roundtrip_keeps_counts_and_sources(kb, tmp_path, encoder):
    import pyarrow  # noqa: F401  (in the [test] extra)
    kb.add([Triple("Ada Lovelace", "Birth City", "London", source="bio-ada-2")])
    assert kb.export(tmp_path / "kb.parquet") == 3
    copy = KnowledgeBase.create(tmp_path / "copy", encoder=encoder)
    assert detect_format(tmp_path / "kb.parquet") == "parquet"
    assert copy.import_file(tmp_path / "kb.parquet", who="importer") == 1
    assert _records(copy) == _records(kb)
    assert copy.log(1)[0].op == "import" and copy.lookup("Ada Lovelace", "birthplace").value == "London"
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"entity": ["A"], "relation": ["r"]}), tmp_path / "bad.parquet")
    with pytest.raises(ValueError, match="bad.parquet has no column"):
        copy.import_file(tmp_path / "bad.parquet")


def test_annotated_corpus_in_and_out(tmp_path, encoder):
    corpus = _write_jsonl(tmp_path / "docs.jsonl", DOCS)
    assert detect_format(corpus) == "corpus"
    kb = KnowledgeBase.create(tmp_path / "kb", encoder=encoder)
    kb.import_file(corpus)
    london = kb.lookup("Ada Lovelace", "Birth City")
    assert (london.value, london.support) == ("London", 2)
    assert kb.get(london.triple_id).sources == (("bio-ada", 16), ("bio-ada-2", 15))  # offsets in the plain text
    plain = "Ada was born in London and died in 1852."
    assert plain[16:22] == "London"
    assert kb.export(tmp_path / "out.jsonl", "corpus") == 2
    again = KnowledgeBase.create(tmp_path / "again", encoder=encoder)
    again.import_file(tmp_path / "out.jsonl")
    assert [(e, r, v, c, tuple(d for d, _ in s)) for e, r, v, c, s in _records(again)] == \
           [(e, r, v, c, tuple(d for d, _ in s)) for e, r, v, c, s in _records(kb)]
    bad = _write_jsonl(tmp_path / "bad.jsonl", [{"doc_id": "x", "annotated": "[dblookup('A', 'B') -> ]"}])
    with pytest.raises(ValueError, match="bad.jsonl:1"):
        kb.import_file(bad, "corpus")


def test_plain_text_corpus(tmp_path, encoder):
    """A ``.txt`` file is documents, one a line, as every corpus reader takes it: its calls become facts,
    and one without a call is refused with the way out, not read as broken triples."""
    lines = [d.get("annotated", d.get("text")) for d in DOCS]
    (tmp_path / "docs.txt").write_text("".join(t + "\n" for t in lines), encoding="utf-8")
    assert detect_format(tmp_path / "docs.txt") == "corpus"
    kb = KnowledgeBase.create(tmp_path / "kb", encoder=encoder)
    kb.import_file(tmp_path / "docs.txt")
    london = kb.lookup("Ada Lovelace", "Birth City")
    assert (london.value, london.support) == ("London", 2) and kb.lookup("Ada Lovelace", "Death Year").value == "1852"
    (tmp_path / "plain.txt").write_text("Ada was born in London.\n\nShe died in 1852.\n", encoding="utf-8")
    with pytest.raises(ValueError, match="plain.txt: its documents hold no lookup call.*annotate"):
        kb.import_file(tmp_path / "plain.txt")


def test_csv_and_tsv_triples_and_corpora(tmp_path, encoder):
    """A spreadsheet export: a header naming entity, relation, value is triples; one naming text or
    annotated is a corpus. Quoted cells keep their commas and line breaks; a bad row names its line."""
    (tmp_path / "t.csv").write_text('entity,relation,value,source,position\n'
                                    '"Lovelace, Ada",Birth City,London,bio-ada,16\n'
                                    'Alan Turing,Occupation,"mathematician,\nlogician",,\n', encoding="utf-8")
    (tmp_path / "t.tsv").write_text("\ufeffentity\trelation\tvalue\nGrace Hopper\tEmployer\tUS Navy\n",
                                    encoding="utf-8")  # with the byte-order mark spreadsheets write
    assert (detect_format(tmp_path / "t.csv"), detect_format(tmp_path / "t.tsv")) == ("csv", "csv")
    kb = KnowledgeBase.create(tmp_path / "kb", encoder=encoder)
    kb.import_file(tmp_path / "t.csv")
    kb.import_file(tmp_path / "t.tsv")
    ada = kb.lookup("Lovelace, Ada", "Birth City")
    assert ada.value == "London" and kb.get(ada.triple_id).sources == (("bio-ada", 16),)
    assert kb.lookup("Alan Turing", "Occupation").value == "mathematician, logician"  # a line break is a space
    assert kb.lookup("Grace Hopper", "Employer").value == "US Navy" and len(kb) == 3
    docs = [d.get("annotated", d.get("text")) for d in DOCS]
    (tmp_path / "docs.csv").write_text("id,annotated\n" + "".join(f'd{i},"{t}"\n' for i, t in enumerate(docs)))
    assert detect_format(tmp_path / "docs.csv") == "corpus"
    corpus = KnowledgeBase.create(tmp_path / "corpus", encoder=encoder)
    corpus.import_file(tmp_path / "docs.csv")
    london = corpus.lookup("Ada Lovelace", "Birth City")
    assert (london.value, london.support) == ("London", 2)
    assert [d for d, _ in corpus.get(london.triple_id).sources] == ["d0", "d1"]
    (tmp_path / "bad.csv").write_text("entity,relation,value\nA,r,v\nB,r\n")
    with pytest.raises(ValueError, match="bad.csv:3: not a triple"):
        kb.import_file(tmp_path / "bad.csv")
    (tmp_path / "wide.csv").write_text("entity,relation,value\nA,r,v,extra\n")
    with pytest.raises(ValueError, match="wide.csv:2: more cells than the header"):
        kb.import_file(tmp_path / "wide.csv")
    assert len(kb) == 3


def test_gzipped_triples_and_corpora_through_the_cli(tmp_path):
    """``lmlm kb build --triples X.gz``: gzipped JSON lines of triples, of documents and CSV are read as
    their plain files are; a broken gzip file is one line, exit 2."""
    import gzip

    from typer.testing import CliRunner

    from lmlm.cli import app

    def gz(name, text):
        with gzip.open(tmp_path / name, "wt", encoding="utf-8") as f:
            f.write(text)
        return tmp_path / name

    facts = gz("facts.jsonl.gz", "\ufeff" + json.dumps({"entity": "Grace Hopper", "relation": "Employer",
                                                      "value": "US Navy"}) + "\n")
    docs = gz("docs.jsonl.gz", "".join(json.dumps(d) + "\n" for d in DOCS))
    table = gz("t.csv.gz", "entity,relation,value\nAlan Turing,Occupation,mathematician\n")
    assert [detect_format(p) for p in (facts, docs, table)] == ["jsonl", "corpus", "csv"]
    for i, (path, n) in enumerate(((facts, 1), (docs, 2), (table, 1))):
        r = CliRunner().invoke(app, ["kb", "build", str(tmp_path / f"kb{i}"), "--triples", str(path)])
        assert r.exit_code == 0, r.output
        assert len(KnowledgeBase.open(tmp_path / f"kb{i}")) == n
    (tmp_path / "cut.jsonl.gz").write_bytes(facts.read_bytes()[:-9])
    r = CliRunner().invoke(app, ["kb", "build", str(tmp_path / "kb9"), "--triples", str(tmp_path / "cut.jsonl.gz")])
    assert r.exit_code == 2 and "cut.jsonl.gz: broken gzip file" in r.output, r.output


def test_authors_database_json(tmp_path, encoder):
    db = tmp_path / "squad_database.json"
    db.write_text(json.dumps({"entities": ["Beyoncé"], "relationships": ["Spouse"], "return_values": ["Jay Z"],
                              "triplets": [["Beyoncé", "Spouse", "Jay Z"], ["Destiny\\'s Child", "Genre", "R&B"],
                                           ["broken"]]}))
    kb = KnowledgeBase.create(tmp_path / "kb", encoder=encoder)
    kb.import_file(db)  # .json: the authors' format
    assert kb.lookup("Beyoncé", "Spouse").value == "Jay Z" and kb.lookup("Destiny's Child", "Genre").value == "R&B"
    assert len(kb) == 2


def test_format_errors_name_the_file(kb, tmp_path):
    with pytest.raises(FileNotFoundError, match="no file to import at .*missing.jsonl"):
        kb.import_file(tmp_path / "missing.jsonl")
    _write_jsonl(tmp_path / "t.jsonl", [{"entity": "A", "relation": "r", "value": "v"}])
    with pytest.raises(ValueError, match="unknown input format 'xml'"):
        kb.import_file(tmp_path / "t.jsonl", "xml")
    for fmt in ("authors", "csv"):
        with pytest.raises(ValueError, match=f"unknown output format '{fmt}'"):
            kb.export(tmp_path / "kb.json", fmt)
    for name in ("kb.json", "kb.xml", "triples"):  # never JSON lines under a name that says otherwise
        with pytest.raises(ValueError, match=f"cannot tell the format to write .*{name}"):
            kb.export(tmp_path / name)
        assert not (tmp_path / name).exists()
    (tmp_path / "folder").mkdir()
    with pytest.raises(ValueError, match="folder is a folder"):
        kb.export(tmp_path / "folder")
    assert kb.version == 1
