"""Bulk builds survive SIGKILL and resume; two processes writing at once lose no edit."""

import json
import multiprocessing as mp
import sqlite3

import pytest
from kb_kill import kill_after_versions

from lmlm.kb import KnowledgeBase, Triple, build
from lmlm.kb.store import KBError

N, CHUNK = 6000, 500


def _triples_file(path, n=N):
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"entity": f"Person {i // 4}", "relation": ("Birth City", "Employer", "Spouse",
                                "Award")[i % 4], "value": f"Value {i}", "source": f"doc-{i // 4}",
                                "position": 7 * (i % 4)}) + "\n")
    return path


def _facts(kb):
    return [(r.entity, r.relation, r.value, r.count, r.sources) for r in kb.triples()]


def test_build_goes_in_by_chunks_and_a_rerun_adds_nothing(tmp_path, encoder):
    src = _triples_file(tmp_path / "t.jsonl", 1200)
    kb = build(tmp_path / "kb", src, chunk_size=500, embed=False, encoder=encoder)
    assert [(v.version, v.op, v.n_changed) for v in kb.log()][::-1] == [(1, "import", 500), (2, "import", 500),
                                                                      (3, "import", 200)]
    assert "t.jsonl facts 1001-1200" in kb.log(1)[0].why
    kb.close()
    again = build(tmp_path / "kb", src, chunk_size=500, embed=False, encoder=encoder)
    assert again.version == 3 and len(again) == 1200
    assert again.lookup("Person 3", "Employer").value == "Value 13"
    again.close()


def test_import_is_chunked_resumable_and_idempotent(tmp_path, encoder):
    # facts without sources: a second import of them used to double every count
    src = tmp_path / "t.jsonl"
    src.write_text("".join(json.dumps({"entity": f"P {i}", "relation": "Birth City", "value": f"C {i}"}) + "\n"
                           for i in range(1200)))
    kb = KnowledgeBase.create(tmp_path / "kb", encoder=encoder)
    assert kb.import_file(src, chunk_size=500, embed=False) == 3  # other writers get in between chunks
    assert kb.last_import["chunks"] == 3 and 0 < kb.last_import["longest_lock_seconds"] < 60
    assert kb.import_file(src, chunk_size=500, embed=False) == 3
    copy = tmp_path / "renamed.jsonl"
    copy.write_bytes(src.read_bytes())
    assert kb.import_file(copy, embed=False) == 3  # the same content under another name
    assert len(kb) == 1200 and {t.count for t in kb.triples()} == {1}
    src.write_text(src.read_text() + json.dumps({"entity": "P 0", "relation": "Birth City", "value": "C 0"}) + "\n")
    assert kb.import_file(src, embed=False) == 4  # a line added at the end: only it is new
    assert kb.last_import["facts"] == 1201 and kb.last_import["chunks"] == 1
    assert kb.lookup("P 0", "Birth City", fuzzy=False).support == 2 and kb.lookup("P 1", "Birth City").support == 1
    src.write_text(src.read_text().replace('"C 5"', '"C 5b"'))  # an edit inside: the file is read again...
    assert kb.import_file(src, embed=False) == 5
    assert kb.lookup("P 1", "Birth City", fuzzy=False).support == 1  # ...and its unchanged facts are not counted
    assert kb.lookup("P 5", "Birth City", fuzzy=False).value == "C 5b"  # the edit: newer, as well supported
    # edits of other lines, then of P 7's: P 7's new value answers, not the old one counted at every re-read
    for k, (old, new) in enumerate([('"C 8"', '"C 8b"'), ('"C 9"', '"C 9b"'), ('"C 7"', '"C 7b"')]):
        src.write_text(src.read_text().replace(old, new))
        kb.import_file(src, embed=False)
    assert kb.lookup("P 7", "Birth City", fuzzy=False).value == "C 7b"
    assert {t.count for t in kb.triples() if t.entity != "P 0"} == {1}
    other = tmp_path / "other.jsonl"  # another file stating a fact: support from elsewhere
    other.write_text(json.dumps({"entity": "P 1", "relation": "Birth City", "value": "C 1"}) + "\n")
    kb.import_file(other, embed=False)
    assert kb.lookup("P 1", "Birth City", fuzzy=False).support == 2
    kb.close()


def test_a_file_edited_in_its_middle_to_the_same_size_is_read_again(tmp_path, encoder):
    """Over 2 MB, an edit that keeps the size and lies past the first and last megabyte is another file:
    its changed fact goes in, and the unchanged ones, with their sources, are not counted twice."""
    src = tmp_path / "big.csv"
    rows = [f"Person {i:06d},Birth City,City {i % 997:04d},doc{i}\n" for i in range(60_000)]
    src.write_text("entity,relation,value,source\n" + "".join(rows))
    assert src.stat().st_size > 2 << 20
    kb = KnowledgeBase.create(tmp_path / "kb", encoder=encoder)
    kb.import_file(src, embed=False)
    rows[31_000] = rows[31_000].replace("City 0093", "Oslo_0093")
    src.write_text("entity,relation,value,source\n" + "".join(rows))
    kb.import_file(src, embed=False)
    values = {t.value for t in kb.triples() if t.entity == "Person 031000" and t.active}
    assert values == {"City 0093", "Oslo_0093"}  # the new value beside the old: a file adds, never deletes
    assert kb.lookup("Person 000007", "Birth City", fuzzy=False).support == 1 and len(kb) == 60_001
    kb.close()


def test_build_never_merges_another_file_silently(tmp_path, encoder):
    src, other = _triples_file(tmp_path / "t.jsonl", 40), tmp_path / "other.jsonl"
    other.write_text(json.dumps({"entity": "Eve", "relation": "Birth City", "value": "Oslo"}) + "\n")
    build(tmp_path / "kb", src, embed=False, encoder=encoder).close()
    with pytest.raises(KBError, match="already holds a KB .*40 facts.* other data than other.jsonl"):
        build(tmp_path / "kb", other, embed=False, encoder=encoder)
    kb = build(tmp_path / "kb", other, embed=False, encoder=encoder, append=True)
    assert len(kb) == 41 and kb.version == 2
    kb.close()


def test_a_catch_up_embedding_is_saved_by_the_lookup_that_made_it(tmp_path, encoder):
    from lmlm.kb.knowledge_base import INDEX_FILENAME

    kb = build(tmp_path / "kb", _triples_file(tmp_path / "t.jsonl", 400), embed=False, encoder=encoder)
    assert not (tmp_path / "kb" / INDEX_FILENAME).exists()  # as a killed import leaves it: no vectors yet
    assert kb.lookup("Person 3", "Employr", matching="key").value == "Value 13"  # embeds every key...
    assert (tmp_path / "kb" / INDEX_FILENAME).exists()  # ...and saves them, with no close() to rely on
    again = KnowledgeBase.open(tmp_path / "kb", encoder=encoder)
    again.key_index()
    assert again.index.unsaved == 0 and len(again.key_index()) == 400  # the next process embeds nothing
    again.close()
    kb.close()


def _build_in_child(kb_dir: str, src: str) -> None:
    build(kb_dir, src, chunk_size=CHUNK, embed=False, progress=False)


@pytest.mark.slow
def test_sigkill_mid_build_leaves_the_last_good_version_and_resume_completes(tmp_path, encoder):
    src = _triples_file(tmp_path / "t.jsonl")
    kb_dir = tmp_path / "kb"
    child = mp.get_context("spawn").Process(target=_build_in_child, args=(str(kb_dir), str(src)))
    child.start()
    kill_after_versions(child, kb_dir)  # two chunks in, then kill inside a later one

    kb = KnowledgeBase.open(kb_dir, encoder=encoder)
    v = kb.version
    assert 2 <= v < N // CHUNK, "the kill should land mid-build"
    with sqlite3.connect(kb_dir / "kb.sqlite") as c:  # nothing half-written: every version is whole
        assert c.execute("SELECT count(*) FROM triples").fetchone()[0] == v * CHUNK == len(kb)
        assert c.execute("SELECT count(*) FROM sources").fetchone()[0] == v * CHUNK
        assert c.execute("SELECT count(*) FROM changes").fetchone()[0] == v * CHUNK
        assert c.execute("SELECT sum(n_changed) FROM versions").fetchone()[0] == v * CHUNK
    assert kb.store.meta()[next(k for k in kb.store.meta() if k.startswith("build:"))] == str(v * CHUNK)
    kb.close()

    resumed = build(kb_dir, src, chunk_size=CHUNK, embed=False, encoder=encoder)
    clean = build(tmp_path / "clean", src, chunk_size=CHUNK, embed=False, encoder=encoder)
    assert resumed.version == clean.version == N // CHUNK
    assert _facts(resumed) == _facts(clean)
    resumed.close()
    clean.close()


def _writer(kb_dir: str, name: str, n: int, start) -> None:
    kb = KnowledgeBase.open(kb_dir)
    start.wait(30)
    for i in range(n):
        kb.add([Triple(f"{name} {i}", "Employer", f"Org {i}", source=f"{name}-doc")], who=name, embed=False)
        kb.add([Triple("Shared Person", "Seen By", name, source=f"{name}-{i}")], who=name,  # same key, both writers
               embed=False)
        kb.edit(f"{name} {i}", "Employer", f"Org {i} edited", who=name, why="edit")
    kb.close()


@pytest.mark.slow
def test_two_processes_writing_at_once_lose_no_edit(tmp_path):
    KnowledgeBase.create(tmp_path / "kb").close()
    ctx, n = mp.get_context("spawn"), 15
    start = ctx.Event()
    writers = [ctx.Process(target=_writer, args=(str(tmp_path / "kb"), name, n, start)) for name in ("alice", "bob")]
    for w in writers:
        w.start()
    start.set()
    for w in writers:
        w.join(120)
    assert [w.exitcode for w in writers] == [0, 0]
    kb = KnowledgeBase.open(tmp_path / "kb")
    log = kb.log(None)
    assert [v.version for v in log] == list(range(6 * n, 0, -1))  # every write got its own version
    assert sorted(v.who for v in log) == sorted(["alice"] * 3 * n + ["bob"] * 3 * n)
    for name in ("alice", "bob"):
        for i in range(n):
            assert kb.lookup(f"{name} {i}", "Employer").value == f"Org {i} edited"
            assert [r.value for r in kb.history(f"{name} {i}", "Employer")] == [f"Org {i}", f"Org {i} edited"]
    shared = {r.value: r.count for r in kb.values("Shared Person", "Seen By")}
    assert shared == {"alice": n, "bob": n}
    kb.close()
