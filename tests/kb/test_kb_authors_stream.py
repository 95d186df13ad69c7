"""The authors' database JSON read as a stream: checked and counted in one pass, imported by chunks,
and an import killed part way finished by the next call without adding anything twice."""

import json
import multiprocessing as mp
import sqlite3

import pytest
from kb_kill import kill_after_versions

from lmlm.bench.authors import write_authors_file
from lmlm.kb.formats import iter_authors_json, scan_authors_json
from lmlm.kb.build import open_authors_json

N, CHUNK = 6000, 500


def _facts(kb):
    return sorted((r.entity, r.relation, r.value, r.count) for r in kb.triples())


def test_scan_counts_and_checks_the_four_lists(tmp_path):
    db = tmp_path / "db.json"
    db.write_text(json.dumps({"entities": ["A"], "relationships": ["r"], "return_values": ["v"], "triplets": [
        ["Cleo O\\'Hara", "Birth City", "Lima"], ["A", "r"], ["A", ["r"], "v"], "A r v", {"e": "A"},
        ["Year", "Value", 1852], ["B", "r", "v"]]}))
    assert scan_authors_json(db) == (3, 4)
    assert [(t.entity, t.relation, t.value) for t in iter_authors_json(db)] == [
        ("Cleo O'Hara", "Birth City", "Lima"), ("Year", "Value", "1852"), ("B", "r", "v")]
    (tmp_path / "three.json").write_text(json.dumps({"entities": [], "relationships": [], "triplets": []}))
    with pytest.raises(ValueError, match="return_values"):
        scan_authors_json(tmp_path / "three.json")
    (tmp_path / "list.json").write_text(json.dumps([["A", "r", "v"]]))
    with pytest.raises(ValueError, match="not an authors' database"):
        scan_authors_json(tmp_path / "list.json")
    (tmp_path / "cut.json").write_text(db.read_text()[:-20])
    with pytest.raises(ValueError, match="not valid JSON"):
        scan_authors_json(tmp_path / "cut.json")


def test_generated_file_imports_by_chunks(tmp_path):
    src = write_authors_file(tmp_path / "db.json", 1234)
    assert scan_authors_json(src) == (1234, 0)
    kb = open_authors_json(src, chunk_size=500)
    assert len(kb) == 1234 and [v.n_changed for v in kb.log()][::-1] == [500, 500, 234]
    assert "1234 triplets, 0 malformed skipped" in kb.log(1)[0].why
    assert kb.lookup("Cleo O'Hara 0", "Birth Place", fuzzy=False) is not None  # the escaped quote is undone
    assert open_authors_json(src, chunk_size=500).version == kb.version == 3  # imported once
    kb.close()


def _import_in_child(src: str, kb_dir: str) -> None:
    open_authors_json(src, kb_dir, progress=False, chunk_size=CHUNK)


@pytest.mark.slow
def test_killed_import_is_finished_by_the_next_call_without_duplicates(tmp_path):
    src = write_authors_file(tmp_path / "db.json", N)
    kb_dir = tmp_path / "db.kb"
    child = mp.get_context("spawn").Process(target=_import_in_child, args=(str(src), str(kb_dir)))
    child.start()
    kill_after_versions(child, kb_dir)  # two chunks in, then kill inside a later one
    with sqlite3.connect(kb_dir / "kb.sqlite") as c:
        cut = c.execute("SELECT count(*) FROM triples").fetchone()[0]
    assert CHUNK <= cut < N and cut % CHUNK == 0, "the kill should land mid-import, between whole chunks"
    assert json.loads((kb_dir / "authors_source.json").read_text())["partial"] is True

    resumed = open_authors_json(src, kb_dir, progress=False, chunk_size=CHUNK)
    clean = open_authors_json(src, tmp_path / "clean.kb", progress=False, chunk_size=CHUNK)
    assert len(resumed) == N and resumed.version == clean.version == N // CHUNK
    assert _facts(resumed) == _facts(clean) and {f[3] for f in _facts(resumed)} == {1}  # nothing twice
    assert "partial" not in json.loads((kb_dir / "authors_source.json").read_text())
    assert open_authors_json(src, kb_dir).version == resumed.version  # finished: reused as it is
    resumed.close()
    clean.close()
