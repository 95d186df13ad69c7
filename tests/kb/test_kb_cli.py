"""The ``lmlm kb`` commands and ``lmlm bench kb`` end to end, through the real CLI."""

import json
import statistics

import pytest
from typer.testing import CliRunner

from lmlm.cli import app

runner = CliRunner()
KB_COMMANDS = ["build", "add", "edit", "delete", "lookup", "search", "stats", "log", "diff", "checkout",
               "export", "import"]


def _ok(args):
    res = runner.invoke(app, [str(a) for a in args])
    assert res.exit_code == 0, res.output
    return res.output


@pytest.mark.parametrize("cmd", KB_COMMANDS)
def test_help(cmd):
    assert "Usage" in _ok(["kb", cmd, "--help"])


def test_kb_commands_end_to_end(tmp_path, encoder):
    src = tmp_path / "t.jsonl"
    src.write_text("".join(json.dumps({"entity": e, "relation": r, "value": v, "source": s}) + "\n" for e, r, v, s in [
        ("Ada Lovelace", "Birth City", "London", "bio-ada"), ("Alan Turing", "Occupation", "mathematician", "bio-t"),
        ("Grace Hopper", "Employer", "US Navy", "bio-g")]))
    kb = tmp_path / "kb"
    assert json.loads(_ok(["kb", "build", kb, "--triples", src, "--chunk-size", 2]))["versions"] == 2
    _ok(["kb", "add", kb, "Ada Lovelace", "Birth City", "Paris", "--source", "rumour", "--who", "alice"])
    _ok(["kb", "edit", kb, "Grace Hopper", "Employer", "Yale", "--why", "fix"])
    found = json.loads(_ok(["kb", "lookup", kb, "Ada Lovelace", "birthplace", "--all"]))
    assert found["alternatives"] == 1 and {v["value"] for v in found["values"]} == {"London", "Paris"}
    hits = json.loads(_ok(["kb", "search", kb, "Alan Turing", "job", "-k", "2", "--json"]))
    assert hits[0]["entity"] == "Alan Turing" and hits[0]["score"] >= hits[1]["score"]
    assert "✓ Alan Turing · Occupation" in _ok(["kb", "search", kb, "Alan Turing", "job"])  # what a lookup answers
    near = _ok(["kb", "search", kb, "Alan Turin", "Birth City"])  # a key the KB lacks: no ✓, and why
    assert "✓" not in near and "a lookup misses: no_relation" in near
    forget = tmp_path / "forget.jsonl"
    forget.write_text('{"source": "bio-t"}\n{"entity": "Ada Lovelace", "relation": "Birth City", "value": "Paris"}\n')
    assert "deleted 2 facts; version 5" in _ok(["kb", "delete", kb, "--forget", forget, "--why", "request"])
    assert json.loads(_ok(["kb", "lookup", kb, "Alan Turing", "Occupation"]))["miss"]["reason"] == "no_entity"
    assert json.loads(_ok(["kb", "lookup", kb, "Alan Turing", "Occupation", "--matching", "key",
                           "--threshold", "1.0"]))["miss"]["reason"] == "below_threshold"
    assert json.loads(_ok(["kb", "lookup", kb, "Alan Turing", "Occupation", "--at", "4"]))["version"] == 4
    log = json.loads(_ok(["kb", "log", kb, "--json"]))
    assert [(v["version"], v["op"]) for v in log] == [(5, "delete"), (4, "edit"), (3, "add"), (2, "import"),
                                                      (1, "import")]
    assert "v5" in _ok(["kb", "log", kb])
    diff = json.loads(_ok(["kb", "diff", kb, 2, 5, "--json"]))
    assert sorted((d["op"], d["value"]) for d in diff) == [("added", "Yale"), ("removed", "US Navy"),
                                                           ("removed", "mathematician")]
    assert "1 added, 2 removed" in _ok(["kb", "diff", kb, 2, 5])
    out = _ok(["kb", "checkout", kb, 2, "--out", tmp_path / "v2.jsonl"])
    assert "3 triples of version 2 written" in out
    stats = json.loads(out[out.index("{"):])
    assert stats["version"] == 2 and stats["triples"] == 3
    assert len((tmp_path / "v2.jsonl").read_text().splitlines()) == 3
    assert json.loads(_ok(["kb", "stats", kb]))["triples"] == 2
    import pyarrow  # noqa: F401  (in the [test] extra)
    assert "2 triples written" in _ok(["kb", "export", kb, tmp_path / "kb.parquet"])
    copy = tmp_path / "copy"
    _ok(["kb", "build", copy, "--triples", tmp_path / "kb.parquet", "--no-embed"])
    assert "version 2" in _ok(["kb", "import", copy, tmp_path / "v2.jsonl"])


def test_kb_errors_are_one_line_and_exit_2(tmp_path):
    for args in (["kb", "lookup", tmp_path / "nope", "a", "b"], ["kb", "diff", tmp_path / "nope", 1, 2]):
        res = runner.invoke(app, [str(a) for a in args])
        assert res.exit_code == 2 and "does not exist" in res.output
    (tmp_path / "t.jsonl").write_text('{"entity": "A", "relation": "r", "value": "v"}\n')
    _ok(["kb", "build", tmp_path / "kb", "--triples", tmp_path / "t.jsonl", "--no-embed"])
    (tmp_path / "bad.jsonl").write_text('{"id": 1}\n{oops\n')
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("not a KB")
    for args, msg in ((["kb", "diff", tmp_path / "kb", 1, 7], "no version 7"),
                      (["kb", "edit", tmp_path / "kb", "B", "r", "v"], "no active fact"),
                      (["kb", "import", tmp_path / "kb", tmp_path / "t.jsonl", "--format", "xml"],
                       "unknown input format"),
                      (["kb", "delete", tmp_path / "kb"], "say what to delete"),
                      (["kb", "delete", tmp_path / "kb", "--forget", tmp_path / "bad.jsonl"],
                       "bad.jsonl:2: not a JSON"),
                      (["kb", "build", tmp_path / "busy", "--triples", tmp_path / "t.jsonl"], "not empty")):
        res = runner.invoke(app, [str(a) for a in args])
        assert res.exit_code == 2 and msg in " ".join(res.output.split()), res.output  # rich wraps long lines


def test_a_forget_set_deletes_a_whole_entity_and_a_delete_of_nothing_says_why(tmp_path):
    rows = [("Ada Lovelace", "Birth City", "London"), ("Ada Lovelace", "Employer", "none"),
            ("Alan Turing", "Birth City", "London")]
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(dict(zip(("entity", "relation", "value"), r))) + "\n"
                                              for r in rows))
    kb = tmp_path / "kb"
    _ok(["kb", "build", kb, "--triples", tmp_path / "t.jsonl", "--no-embed"])
    (tmp_path / "forget.jsonl").write_text('{"entity": "ada lovelace"}\n')
    assert "deleted 2 facts; version 2" in _ok(["kb", "delete", kb, "--forget", tmp_path / "forget.jsonl"])
    assert json.loads(_ok(["kb", "stats", kb]))["triples"] == 1
    # the same delete again: nothing left to delete, said, and not an error
    res = runner.invoke(app, [str(a) for a in ["kb", "delete", kb, "--entity", "Ada Lovelace"]])
    assert res.exit_code == 0 and "deleted 0 facts" in res.output and "deleted before" in res.output
    # a name the KB never held is a typo: exit 2, naming the closest entity it does hold
    for args, msg in ((["--entity", "Alan Turin"], "never held the entity 'Alan Turin' (closest: 'Alan Turing')"),
                      (["--entity", "Alan Turing", "--relation", "Death City"], "never held the relation 'Death City'"),
                      (["--source", "bio-x"], "never held the source 'bio-x'"),
                      (["--id", "99"], "no triple with id 99")):
        res = runner.invoke(app, [str(a) for a in ["kb", "delete", kb, *args]])
        assert res.exit_code == 2 and msg in " ".join(res.output.split()), res.output
    assert json.loads(_ok(["kb", "stats", kb]))["triples"] == 1
    # names each held, never together: not "deleted before"
    res = runner.invoke(app, [str(a) for a in ["kb", "delete", kb, "--id", "3", "--entity", "Ada Lovelace"]])
    assert res.exit_code == 2 and "no fact of" in res.output and "has all of" in res.output, res.output
    # a forget set with lines naming what the KB never held deletes nothing and names each line
    (tmp_path / "typos.jsonl").write_text('{"entity": "Alan Turing", "relation": "Birth City", "value": "Paris"}\n'
                                          '{"entity": "Alan Turin"}\n{"id": 99}\n{"source": "bio-x"}\n'
                                          '{"entity": "Alan Turing", "relation": "Birth City"}\n')
    res = runner.invoke(app, [str(a) for a in ["kb", "delete", kb, "--forget", tmp_path / "typos.jsonl"]])
    out = " ".join(res.output.split())
    assert res.exit_code == 2 and "4 of 5 forget items" in out, out
    for line, msg in ((1, "= 'Paris' (it held 'London')"), (2, "never held the entity 'Alan Turin' (closest: "
                                                               "'Alan Turing')"), (3, "no triple with id 99"),
                      (4, "never held the source 'bio-x'")):
        assert f"typos.jsonl:{line}: " in out and msg in out, (line, out)
    assert json.loads(_ok(["kb", "stats", kb]))["triples"] == 1  # nothing deleted, the good line included
    (tmp_path / "bad.jsonl").write_text('{"entity": "Alan Turing", "relation": "Birth City"}\n{"foo": 1}\n')
    res = runner.invoke(app, [str(a) for a in ["kb", "delete", kb, "--forget", tmp_path / "bad.jsonl"]])
    assert res.exit_code == 2 and "bad.jsonl:2: not a forget item" in " ".join(res.output.split()), res.output


def test_add_and_edit_again_change_nothing_and_every_string_is_stored_clean(tmp_path):
    """A command sent twice (a retry) counts once and says so; what enters the KB (values, sources,
    who and why) is stored as the README says, and a source is found in any Unicode form."""
    kb = tmp_path / "kb"
    (tmp_path / "t.jsonl").write_text(json.dumps({"entity": "Ada Lovelace", "relation": "Birth City",
                                                  "value": "London"}) + "\n")
    _ok(["kb", "build", kb, "--triples", tmp_path / "t.jsonl", "--no-embed"])
    assert _ok(["kb", "add", kb, "Alan Turing", "Occupation", "mathematician"]).strip() == "version 2"
    again = _ok(["kb", "add", kb, "Alan Turing", "Occupation", "mathematician"])
    assert "version 2: nothing changed" in again
    assert "nothing changed" in _ok(["kb", "edit", kb, "Ada Lovelace", "Birth City", "Lon\u200bdon\u202e"])
    assert _ok(["kb", "edit", kb, "Ada Lovelace", "Birth City", "Pa\u200bris"]).strip() == "version 3"
    assert "version 3: nothing changed" in _ok(["kb", "edit", kb, "Ada Lovelace", "Birth City", "Paris"])
    rows = [json.loads(x) for x in _ok(["kb", "export", kb, tmp_path / "out.jsonl"]) and
            (tmp_path / "out.jsonl").read_text().splitlines()]
    assert {(r["entity"], r["value"], r["count"]) for r in rows} == {("Ada Lovelace", "Paris", 1),
                                                                     ("Alan Turing", "mathematician", 1)}
    for args in (["kb", "edit", kb, "Ada Lovelace", "Birth City", "\u200b"],
                 ["kb", "add", kb, "Grace Hopper", "Employer", "\u200b"],
                 ["kb", "add", kb, "Grace Hopper", "Employer", "Navy", "--who", "me\x1b[31m"],
                 ["kb", "add", kb, "Grace Hopper", "Employer", "Navy", "--source", "d\x1b"],
                 ["kb", "add", kb, "Grace Hopper", "Employer", "Navy", "--source", "\u200b"]):
        res = runner.invoke(app, [str(a) for a in args])
        assert res.exit_code == 2 and len(res.output.strip().splitlines()) == 1, (args, res.output)
    _ok(["kb", "add", kb, "Grace Hopper", "Employer", "Navy", "--source", "doc-\u00e9t\u00e9", "--why", "a\nb"])
    assert json.loads(_ok(["kb", "log", kb, "--json"]))[0]["why"] == "a b"  # newest first
    assert "deleted 1 fact" in _ok(["kb", "delete", kb, "--source", "doc-e\u0301te\u0301"])  # the same id, NFD


def test_restore_brings_back_a_past_version_and_the_audit_trail_shows_aliases(tmp_path):
    rows = [("Ada Lovelace", "Birth City", "London", "bio-ada"), ("Ada Lovelace", "Employer", "none", "bio-ada"),
            ("Alan Turing", "Birth City", "London", "bio-t"), ("Alan Turing", "Birth City", "London", "bio-t2")]
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(dict(zip(("entity", "relation", "value", "source"), r)))
                                              + "\n" for r in rows))
    kb = tmp_path / "kb"
    _ok(["kb", "build", kb, "--triples", tmp_path / "t.jsonl", "--no-embed"])  # version 1
    _ok(["kb", "alias", "add", kb, "Lovelace, Ada", "Ada Lovelace"])  # 2
    _ok(["kb", "add", kb, "Grace Hopper", "Employer", "US Navy"])  # 3
    _ok(["kb", "edit", kb, "Alan Turing", "Birth City", "Paris"])  # 4
    _ok(["kb", "delete", kb, "--entity", "Ada Lovelace"])  # 5: her alias goes with her last fact
    diff = _ok(["kb", "diff", kb, 1, 2])
    assert "+ alias Lovelace, Ada → Ada Lovelace" in diff and "aliases 1 added, 0 removed" in diff, diff
    assert any(e.get("alias") == "Lovelace, Ada" and e["op"] == "removed"
               for e in json.loads(_ok(["kb", "diff", kb, 4, 5, "--json"])))
    assert "alias   " in _ok(["kb", "log", kb]) and "1 aliases" in _ok(["kb", "log", kb])

    def state():
        out = tmp_path / "now.jsonl"
        _ok(["kb", "export", kb, out])
        facts = {(r["entity"], r["relation"], r["value"], r["count"], tuple(map(tuple, r["sources"])))
                 for r in map(json.loads, out.read_text().splitlines())}
        return facts, json.loads(_ok(["kb", "alias", "list", kb, "--json"]))

    _ok(["kb", "checkout", kb, 2, "--out", tmp_path / "v2.jsonl"])
    want = {(r["entity"], r["relation"], r["value"], r["count"], tuple(map(tuple, r["sources"])))
            for r in map(json.loads, (tmp_path / "v2.jsonl").read_text().splitlines())}
    out = _ok(["kb", "restore", kb, 2, "--why", "undo"])
    assert "as at version 2: 2 facts deleted, 3 written back, aliases 1 added" in " ".join(out.split()), out
    facts, aliases = state()
    assert facts == want and ("Alan Turing", "Birth City", "London", 2, (("bio-t", None), ("bio-t2", None))) in facts
    assert [(a["alias"], a["entity"]) for a in aliases] == [("Lovelace, Ada", "Ada Lovelace")]
    assert "nothing to restore" in _ok(["kb", "restore", kb, 2])  # again: nothing twice
    assert json.loads(_ok(["kb", "lookup", kb, "Ada Lovelace", "Employer"]))["value"] == "none"
    assert "facts deleted, 0 written back" in _ok(["kb", "restore", kb, 0])  # the empty KB
    assert state() == (set(), [])
    res = runner.invoke(app, [str(a) for a in ["kb", "restore", kb, 99]])
    assert res.exit_code == 2 and "no version 99" in res.output


@pytest.mark.slow
def test_bench_kb_prints_its_json_last(tmp_path, encoder):
    res = runner.invoke(app, [str(a) for a in ["bench", "kb", "--triples", 400, "--embed-keys", 60, "--ann-queries",
                                                 100, "--fuzzy-queries", 5, "--batched-queries", 64,
                                                 "--work", tmp_path / "bench"]])
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout.strip().splitlines()[-1])
    for field in ("triples", "build_triples_per_s", "disk_bytes_per_triple", "exact_p50_ms", "fuzzy_p50_ms",
                  "fuzzy_p99_ms", "batched_fuzzy_qps", "ann_top1_agreement", "delete_forget_seconds",
                  "deleted_retrievable", "retained_lost", "method", "embedded_keys"):
        assert field in report
    assert report["triples"] == 400 and report["forgotten"] == 20
    assert report["deleted_retrievable"] == 0 and report["retained_lost"] == 0
    assert report["ann_top1_agreement"] == 1.0  # 400 keys: exact search
    for name in ("batched_fuzzy_qps", "batched_fuzzy_cached_qps", "batched_entity_fuzzy_qps"):
        passes = report[f"{name}_passes"]  # a rate per pass; the figure is their median
        assert len(passes) == 3 and min(passes) > 0 and report[name] == statistics.median(passes)
    assert report["batched_encode_qps"] > 0  # the encoder alone: a rate, compared in benchmarks, not here


def test_bench_kb_measures_the_key_index_settings_it_is_given(tmp_path, encoder):
    ann = "flat_max=100,ivf_min=200,pq_min=300,pq_bytes=96,pq_scan_bytes=24,pq_rescore=32"
    res = runner.invoke(app, [str(a) for a in ["bench", "kb", "--triples", 400, "--embed-keys", 60, "--ann-queries",
                                                 50, "--fuzzy-queries", 5, "--batched-queries", 32, "--ann", ann,
                                                 "--work", tmp_path / "bench"]])
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout.strip().splitlines()[-1])
    assert (report["index_kind"], report["index_rows"]) == ("ivfpq", "pq96x8")
    assert {k: report["ann_config"][k] for k in ("pq_min", "pq_scan_bytes", "pq_rescore")} == {
        "pq_min": 300, "pq_scan_bytes": 24, "pq_rescore": 32}
    assert report["deleted_retrievable"] == 0 and report["retained_lost"] == 0
    for bad, said in (("pq_bytes=x", "pq_bytes must be an integer"), ("nope=1", "expected NAME=INT"),
                      ("ivf_min=10", "ivf_min (10) must be >= flat_max")):
        res = runner.invoke(app, ["bench", "kb", "--triples", "300", "--ann", bad, "--work", str(tmp_path / "x")])
        assert res.exit_code == 2 and said in res.output, res.output
        assert not (tmp_path / "x" / "kb").exists()  # refused before anything was built


def test_the_bench_rows_read_at_random_are_the_rows_iterated():
    from lmlm.bench.kb import RELATIONS, SyntheticTriples

    rows = SyntheticTriples(1003, seed=2)
    listed = list(rows)
    assert len(listed) == len(rows) == 1003 and len({r[0] for r in listed}) == 101  # ten facts a person
    assert [rows[i] for i in (0, 9, 10, 500, 1002, -1)] == [listed[i] for i in (0, 9, 10, 500, 1002, -1)]
    assert rows[10:13] == listed[10:13] and list(rows.keys())[:10] == [r[:2] for r in listed[:10]]
    assert [r[1] for r in listed[:10]] == list(RELATIONS) and listed[1000][1] == next(iter(RELATIONS))
    with pytest.raises(IndexError):
        rows[1003]


def test_the_bench_trains_on_whole_blocks_of_the_vectors_it_indexes(monkeypatch):
    import numpy as np

    from lmlm.bench.kb_rows import SyntheticVectors

    monkeypatch.setattr(SyntheticVectors, "BLOCK", 100)
    real = np.random.default_rng(0).normal(size=(40, 16)).astype(np.float32)
    vectors = SyntheticVectors(1050, real, np.arange(0, 1050, 27)[:40], seed=3)
    every = np.concatenate([v for _, v in vectors])
    sample = vectors.training_rows(250)  # three whole blocks of the eleven, cut to 250 rows
    assert sample.shape == (250, 16)
    at = [int(np.flatnonzero((every == row).all(axis=1))[0]) for row in sample]  # each row's place among all
    blocks = sorted({i // 100 for i in at})
    assert len(blocks) == 3 and at == [i for b in blocks for i in range(b * 100, min(b * 100 + 100, 1050))][:250]
    np.testing.assert_array_equal(vectors.training_rows(250), sample)  # the same draw each time


def test_bench_kb_store_only(tmp_path):
    res = runner.invoke(app, ["bench", "kb", "--triples", "300", "--store-only", "--work", str(tmp_path / "b")])
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout.strip().splitlines()[-1])
    assert report["method"].startswith("store only") and "fuzzy_p50_ms" not in report
    assert (report["forgotten"], report["deleted_retrievable"], report["retained_lost"]) == (15, 0, 0)
    assert set(report["targets_met"]) == {"exact_p50_ms<=0.2", "deleted_retrievable==0", "retained_lost==0"}


def test_bench_kb_keeps_each_phase_it_measured_and_checks_deletes_after_letting_go_of_its_kb(tmp_path):
    from lmlm.bench.kb import run_kb_bench

    seen = []
    report = run_kb_bench(300, tmp_path / "b", store_only=True, log=lambda s: None,
                          on_phase=lambda phase, r: seen.append((phase, r)))
    assert [p for p, _ in seen] == ["build", "exact", "forget"]
    assert all(r["finished"] is False and r["phase"] == p for p, r in seen)
    assert "store_triples_per_s" in seen[0][1] and "exact_p50_ms" in seen[1][1] and "forgotten" not in seen[1][1]
    assert "forgotten" in seen[2][1] and list(report["rss_mb_after"]) == ["build", "exact", "forget"]
    assert report["finished"] is True
    # the second process looked the 15 deleted facts up with the first one's KB closed
    assert (report["forgotten"], report["deleted_retrievable_other_process"], report["retained_lost"]) == (15, 0, 0)

    out = tmp_path / "r.json"
    res = runner.invoke(app, ["bench", "kb", "--triples", "300", "--store-only", "--work", str(tmp_path / "c"),
                              "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert json.loads(out.read_text()) == json.loads(res.stdout.strip().splitlines()[-1])
    assert not out.with_name("r.json.tmp").exists()


@pytest.mark.slow
def test_bench_kb_reuses_a_kb_kept_as_built_and_measures_it_alike(tmp_path):
    """--keep --no-forget leaves the KB as built; --reuse opens it instead of building it again (a
    run of hours at the paper's size measures its lookups again in minutes) and, with the same
    draws, asks the same queries of the same vectors."""
    work = tmp_path / "b"
    common = ["bench", "kb", "--triples", "3000", "--embed-keys", "300", "--ann-queries", "200", "--work", str(work)]
    first = runner.invoke(app, [*common, "--keep", "--no-forget"])
    assert first.exit_code == 0, first.output
    built = json.loads(first.stdout.strip().splitlines()[-1])
    assert "forgotten" not in built and (work / "kb" / "kb.sqlite").exists()
    again = runner.invoke(app, [*common, "--reuse"])
    assert again.exit_code == 0, again.output
    reused = json.loads(again.stdout.strip().splitlines()[-1])
    assert reused["reused"] is True and "store_triples_per_s" not in reused and "index_build_s" not in reused
    assert reused["ann_top1_agreement"] == built["ann_top1_agreement"] and reused["index_kind"] == built["index_kind"]
    assert (reused["forgotten"], reused["deleted_retrievable"], reused["retained_lost"]) == (150, 0, 0)
    assert (work / "kb" / "kb.sqlite").exists()  # a reused KB is never removed
    # the forget set changed it: reusing it now would measure another KB
    stale = runner.invoke(app, [*common, "--reuse"])
    assert stale.exit_code == 2 and "at version 2" in stale.output and "--no-forget" in stale.output
    other = runner.invoke(app, ["bench", "kb", "--triples", "3000", "--reuse", "--work", str(tmp_path / "none")])
    assert other.exit_code == 2 and "no KB in" in other.output


def test_a_build_that_fails_on_its_input_leaves_no_kb(tmp_path):
    """An empty file or an unknown format stops ``kb build`` in one line, and no empty KB is left behind
    for ``kb stats`` to report as built; a KB that was there before is kept."""
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "t.jsonl").write_text('{"entity": "Ada Lovelace", "relation": "Birth City", "value": "London"}\n')
    (tmp_path / "novalue.csv").write_text("entity,relation\nAda Lovelace,Birth City\n")
    (tmp_path / "broken.parquet").write_text("not parquet")
    for args, msg in (((tmp_path / "empty.jsonl",), "no facts in it"), ((tmp_path / "t.jsonl", "--format", "xml"),
                                                                          "unknown input format 'xml'"),
                      ((tmp_path / "novalue.csv",), "novalue.csv:2: not a triple: no 'value' field"),
                      ((tmp_path / "broken.parquet",), "broken.parquet: not a Parquet file")):
        res = runner.invoke(app, ["kb", "build", str(tmp_path / "kb"), "--triples", *map(str, args)])
        out = " ".join(res.output.split())
        assert res.exit_code == 2 and msg in out and not (tmp_path / "kb").exists(), res.output
    _ok(["kb", "build", tmp_path / "kb", "--triples", tmp_path / "t.jsonl", "--no-embed"])
    res = runner.invoke(app, ["kb", "build", str(tmp_path / "kb"), "--triples", str(tmp_path / "empty.jsonl")])
    assert res.exit_code == 2 and json.loads(_ok(["kb", "stats", tmp_path / "kb"]))["triples"] == 1


def test_export_then_build_keeps_the_aliases(tmp_path):
    (tmp_path / "t.jsonl").write_text('{"entity": "Ada Lovelace", "relation": "Birth City", "value": "London"}\n')
    _ok(["kb", "build", tmp_path / "kb", "--triples", tmp_path / "t.jsonl", "--no-embed"])
    _ok(["kb", "alias", "add", tmp_path / "kb", "Lovelace, Ada", "Ada Lovelace"])
    out = _ok(["kb", "export", tmp_path / "kb", tmp_path / "out.jsonl"])
    assert "1 aliases written to" in out and (tmp_path / "out.aliases.jsonl").exists()
    _ok(["kb", "build", tmp_path / "kb2", "--triples", tmp_path / "out.jsonl",
         "--aliases", tmp_path / "out.aliases.jsonl", "--no-embed"])
    found = json.loads(_ok(["kb", "lookup", tmp_path / "kb2", "Lovelace, Ada", "Birth City"]))
    assert found["value"] == "London" and found["via"] == "alias"


def test_export_at_a_past_version_writes_the_aliases_of_then(tmp_path):
    (tmp_path / "t.jsonl").write_text('{"entity": "Ada Lovelace", "relation": "Birth City", "value": "London"}\n')
    _ok(["kb", "build", tmp_path / "kb", "--triples", tmp_path / "t.jsonl", "--no-embed"])
    _ok(["kb", "alias", "add", tmp_path / "kb", "Lovelace, Ada", "Ada Lovelace"])  # version 2
    _ok(["kb", "alias", "add", tmp_path / "kb", "Countess of Lovelace", "Ada Lovelace"])  # version 3
    out = _ok(["kb", "export", tmp_path / "kb", tmp_path / "at2.jsonl", "--at", "2"])
    assert "1 aliases written to" in out
    rows = [json.loads(x) for x in (tmp_path / "at2.aliases.jsonl").read_text().splitlines()]
    assert rows == [{"alias": "Lovelace, Ada", "entity": "Ada Lovelace"}]


def test_authors_triplets_skipped_are_said_and_piped_lines_are_not_wrapped(tmp_path):
    """The authors' release skips triplets that are not three non-empty fields, and says how many;
    text output piped to a file keeps each line whole (rich wrapped it at 80 columns)."""
    db = tmp_path / "auth.json"
    db.write_text(json.dumps({"entities": ["Ada Lovelace"], "relationships": ["Birth City"],
                              "return_values": ["London"],
                              "triplets": [["Ada Lovelace", "Birth City", "London"], ["Broken", "Only two"],
                                           ["X", "Y", ""]]}))
    r = CliRunner().invoke(app, ["kb", "build", str(tmp_path / "kb"), "--triples", str(db), "--no-embed"])
    assert r.exit_code == 0 and "2 triplet(s) of auth.json skipped" in r.output, r.output
    why = "a reason long enough to pass the eighty columns a terminal-less console wraps its lines at, and more"
    _ok(["kb", "add", tmp_path / "kb", "Alan Turing", "Occupation", "mathematician", "--why", why])
    log = _ok(["kb", "log", tmp_path / "kb"])
    assert any(line.endswith(why) for line in log.splitlines()), log


def test_a_kb_whose_creation_was_cut_short_is_made_again(tmp_path):
    """The database is made under a temporary name and moved into place whole: a creation killed midway
    leaves that file alone, never a kb.sqlite that is not a KB, and the next build starts again."""
    import sqlite3

    (tmp_path / "kb").mkdir()
    with sqlite3.connect(tmp_path / "kb" / "kb.sqlite.new") as c:  # as a kill after the first tables leaves it
        c.execute("CREATE TABLE meta (name TEXT PRIMARY KEY, value TEXT NOT NULL)")
    (tmp_path / "t.jsonl").write_text('{"entity": "Ada Lovelace", "relation": "Birth City", "value": "London"}\n')
    _ok(["kb", "build", tmp_path / "kb", "--triples", tmp_path / "t.jsonl", "--no-embed"])
    assert json.loads(_ok(["kb", "stats", tmp_path / "kb"]))["triples"] == 1
    assert sorted(p.name for p in (tmp_path / "kb").iterdir() if p.name.startswith("kb.sqlite")) in (
        ["kb.sqlite"], ["kb.sqlite", "kb.sqlite-shm", "kb.sqlite-wal"])
