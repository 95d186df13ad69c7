"""The one document schema: every file earlier versions wrote reads back the same, writers emit the schema,
and a record that contradicts itself is refused with its file, line and field."""

import json

import pytest

from lmlm.corpus import CorpusError, Document, corpus_stats, iter_documents, read_documents, write_documents

ANNOTATED = "Ada Lovelace was born in [dblookup('Ada Lovelace', 'Birth City') -> London] London."
PLAIN = "Ada Lovelace was born in London."
TOKEN_FORM = "Ada Lovelace was born in <|db_start|> Ada Lovelace <|sep|> Birth City <|db_retrieve|> London <|db_end|> London."


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


# files as earlier versions of lmlm wrote them, one per writer
OLD_FILES = {
    # lmlm world: doc_id, person, split, annotated, plain
    "world": {"doc_id": "bios-train-000001", "person": "Ada Lovelace", "split": "train", "annotated": ANNOTATED,
              "plain": PLAIN},
    # lmlm annotate wikipedia: doc_id, title, annotated, plain
    "wikipedia": {"doc_id": "enwiki-12", "title": "Ada Lovelace", "annotated": ANNOTATED, "plain": PLAIN},
    # lmlm annotate seed / validate: id, text (the plain input), annotated, text_changed, calls, rejected
    "validate": {"id": "7", "text": PLAIN, "annotated": ANNOTATED, "text_changed": False,
                 "calls": [{"entity": "Ada Lovelace", "relation": "Birth City", "value": "London", "at": 25}],
                 "rejected": []},
    # lmlm annotate run (merged): id, text holding the calls
    "run": {"id": "7", "text": ANNOTATED},
    # lmlm annotate correct (kept.jsonl): text (plain) and annotated, no id
    "correct": {"text": PLAIN, "annotated": ANNOTATED},
    # TOFU world and eval offloading corpora: text holding the calls, token form accepted too
    "tofu": {"text": TOKEN_FORM},
    # lmlm kb export --format corpus: doc_id and annotated
    "kb-export": {"doc_id": "enwiki-12", "annotated": ANNOTATED},
}


@pytest.mark.parametrize("writer", sorted(OLD_FILES))
def test_files_of_earlier_versions_read_as_the_schema(tmp_path, writer):
    doc, = read_documents(_jsonl(tmp_path / f"{writer}.jsonl", [OLD_FILES[writer]]))
    assert doc.text == PLAIN
    assert [(c.entity, c.relation, c.value) for c in doc.lookups] == [("Ada Lovelace", "Birth City", "London")]
    assert doc.id in ("bios-train-000001", "enwiki-12", "7", "1")
    assert "plain" not in doc.meta and "doc_id" not in doc.meta
    # written back, the record is in the schema and reads back identically
    write_documents(tmp_path / "again.jsonl", [doc])
    rec = json.loads((tmp_path / "again.jsonl").read_text())
    assert list(rec)[:3] == ["id", "annotated", "text"] and rec["text"] == PLAIN
    assert read_documents(tmp_path / "again.jsonl") == [doc]


def test_metadata_is_kept_and_split_filters(tmp_path):
    rows = [{**OLD_FILES["world"], "doc_id": f"d{i}", "split": s} for i, s in enumerate(["train", "heldout", "train"])]
    path = _jsonl(tmp_path / "w.jsonl", rows)
    docs = read_documents(path)
    assert [d.split for d in docs] == ["train", "heldout", "train"]
    assert docs[0].meta == {"person": "Ada Lovelace"}
    assert [d.id for d in iter_documents(path, split="heldout")] == ["d1"]
    with pytest.raises(CorpusError, match="no documents of split 'validation'"):
        read_documents(path, split="validation")


def test_text_lines_and_json_arrays(tmp_path):
    (tmp_path / "a.txt").write_text(f"{ANNOTATED}\n\n{PLAIN}\n", encoding="utf-8")
    docs = read_documents(tmp_path / "a.txt")
    assert [d.id for d in docs] == ["1", "2"] and [d.num_calls for d in docs] == [1, 0]
    assert docs[0].text == docs[1].text == PLAIN
    (tmp_path / "a.json").write_text(json.dumps([{"id": "x", "annotated": ANNOTATED}]))
    assert read_documents(tmp_path / "a.json")[0].text == PLAIN


def test_csv_and_tsv_rows_are_documents(tmp_path):
    """A spreadsheet export: a header row, one document a row; a quoted cell keeps its commas and line
    breaks, a row with cells past the header is named, and a spreadsheet itself is refused by suffix."""
    (tmp_path / "d.csv").write_text(f'id,annotated,title\nada,"{ANNOTATED}\nShe wrote, too.",Ada\nnote,"{PLAIN}",\n',
                                    encoding="utf-8")
    docs = read_documents(tmp_path / "d.csv")
    assert [d.id for d in docs] == ["ada", "note"] and [d.num_calls for d in docs] == [1, 0]
    assert docs[0].text == PLAIN + "\nShe wrote, too." and docs[0].meta == {"title": "Ada"}
    assert docs[1].text == PLAIN
    (tmp_path / "d.tsv").write_text(f"text\tsplit\n{PLAIN}\theldout\n", encoding="utf-8")
    (doc,) = read_documents(tmp_path / "d.tsv")
    assert (doc.id, doc.text, doc.split) == ("1", PLAIN, "heldout")  # no id: its row number
    (tmp_path / "EXPORT.CSV").write_text(f"text\n{PLAIN}\n", encoding="utf-8")  # a suffix in capitals
    assert [d.text for d in read_documents(tmp_path / "EXPORT.CSV")] == [PLAIN]
    for name, body in (("bom.csv", f"text,title\r\n{PLAIN},A\r\n"), ("bom.jsonl", json.dumps({"text": PLAIN})),
                       ("bom.txt", PLAIN + "\n")):  # Excel's "CSV UTF-8" and Notepad begin with a byte-order mark
        (tmp_path / name).write_text("\ufeff" + body, encoding="utf-8")
        assert [d.text for d in read_documents(tmp_path / name)] == [PLAIN], name
    (tmp_path / "wide.csv").write_text("id,text\na,one,two\n")
    with pytest.raises(CorpusError, match="wide.csv:2: 3 cells under a header of 2 columns"):
        read_documents(tmp_path / "wide.csv")
    (tmp_path / "no-text.csv").write_text("id,title\na,Ada\n")
    with pytest.raises(CorpusError, match="no-text.csv:2: no 'annotated' or 'text' field"):
        read_documents(tmp_path / "no-text.csv")
    (tmp_path / "d.xlsx").write_bytes(b"PK\x03\x04")
    with pytest.raises(CorpusError, match="d.xlsx: a .xlsx file is not a corpus"):
        read_documents(tmp_path / "d.xlsx")


def test_parquet_and_datasets_folders(tmp_path):
    import datasets  # in the [test] extra
    docs = [Document.from_annotated(f"d{i}", ANNOTATED, source="test", split="train") for i in range(3)]
    assert write_documents(tmp_path / "docs.parquet", docs) == 3
    assert read_documents(tmp_path / "docs.parquet") == docs
    records = [d.to_record() for d in docs]
    datasets.Dataset.from_list(records).save_to_disk(str(tmp_path / "ds"))
    assert read_documents(tmp_path / "ds") == docs
    split = datasets.DatasetDict({"train": datasets.Dataset.from_list([{"id": "a", "text": PLAIN}]),
                                  "heldout": datasets.Dataset.from_list([{"id": "b", "annotated": ANNOTATED}])})
    split.save_to_disk(str(tmp_path / "dd"))
    got = {d.id: d for d in read_documents(tmp_path / "dd")}
    assert got["a"].split == "train" and got["b"].split == "heldout" and got["b"].num_calls == 1


@pytest.mark.parametrize("row, message", [
    ({"id": "a", "text": ANNOTATED, "annotated": ANNOTATED}, "'text' holds lookup calls while 'annotated'"),
    ({"id": "a", "plain": ANNOTATED}, "'plain' holds lookup calls"),
    ({"id": "a", "text": "x", "plain": "y"}, "'text' and 'plain' differ"),
    ({"id": "a", "title": "no text"}, "no 'annotated' or 'text' field"),
    ({"id": "a", "annotated": 3}, "field 'annotated' must be a string"),
    ({"id": ["a"], "text": "x"}, "field 'id'"),
])
def test_contradictory_records_name_file_line_and_field(tmp_path, row, message):
    path = _jsonl(tmp_path / "bad.jsonl", [{"id": "ok", "text": PLAIN}, row])
    with pytest.raises(CorpusError, match=message) as e:
        read_documents(path)
    assert f"{path}:2" in str(e.value)


def test_broken_files_are_named(tmp_path):
    (tmp_path / "broken.jsonl").write_text('{"text": "fine"}\n{oops\n')
    with pytest.raises(CorpusError, match=r"broken.jsonl:2: not a JSON line"):
        read_documents(tmp_path / "broken.jsonl")
    _jsonl(tmp_path / "dup.jsonl", [{"id": "a", "text": "x"}, {"id": "a", "text": "y"}])
    with pytest.raises(CorpusError, match=r"dup.jsonl:2: duplicate document id 'a'"):
        read_documents(tmp_path / "dup.jsonl")
    with pytest.raises(CorpusError, match="no such file"):
        read_documents(tmp_path / "missing.jsonl")
    (tmp_path / "folder").mkdir()
    with pytest.raises(CorpusError, match="datasets folder"):
        read_documents(tmp_path / "folder")


def test_write_is_atomic(tmp_path):
    path = tmp_path / "docs.jsonl"
    write_documents(path, [Document.from_annotated("a", ANNOTATED)])
    before = path.read_text()

    def failing():
        yield Document.from_annotated("b", ANNOTATED)
        raise RuntimeError("crash mid-write")

    with pytest.raises(RuntimeError):
        write_documents(path, failing())
    assert path.read_text() == before and [p.name for p in tmp_path.iterdir()] == ["docs.jsonl"]


def test_corpus_stats_counts_calls_and_unchanged_text():
    docs = [Document.from_annotated("a", ANNOTATED, split="train"), Document("b", "changed", "original")]
    stats = corpus_stats(docs)
    assert stats["documents"] == 2 and stats["lookup_calls"] == 1 and stats["documents_with_calls"] == 1
    assert stats["text_unchanged"] == 0.5 and stats["splits"] == {"train": 1}
