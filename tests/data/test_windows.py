"""Call windows and entity renaming (lmlm.data.windows, `lmlm data windows`)."""

import json

from typer.testing import CliRunner

from lmlm.cli import app
from lmlm.corpus import Document, read_documents, write_documents
from lmlm.data.windows import call_windows, swap_entity, windows_of
from lmlm.lookup import Lookup, parse, render, strip

ARTICLE = ("Alabama is a state in the Southeastern United States.\n\nIts capital is "
           "[dblookup('Alabama', 'Capital') -> Montgomery] Montgomery, and its largest city by population is "
           "[dblookup('Alabama', 'Largest City') -> Birmingham] Birmingham, which lies in the north. Alabama joined "
           "the Union in [dblookup('Alabama', 'Admission Date') -> 1819] 1819 as the 22nd state of the nation.")


def test_one_window_per_call_its_sentence_the_call_and_words_after():
    wins = call_windows(parse(ARTICLE).segments, after_words=3)
    assert [render(w) for w in wins] == [
        "Alabama\nIts capital is [dblookup('Alabama', 'Capital') -> Montgomery] Montgomery, and its",
        "Alabama\nIts capital is Montgomery, and its largest city by population is "
        "[dblookup('Alabama', 'Largest City') -> Birmingham] Birmingham, which lies",
        "Alabama\nAlabama joined the Union in [dblookup('Alabama', 'Admission Date') -> 1819] 1819 as the",
    ]
    before = call_windows(parse(ARTICLE).segments, before=1, after_words=1, head=False)
    assert strip(before[2]).startswith("Its capital is Montgomery") and len(before[2]) == 3
    # a sentence that ends before the words run out ends its window
    assert render(call_windows(parse(ARTICLE).segments, after_words=8)[1]).endswith(
        "-> Birmingham] Birmingham, which lies in the north.")


def test_a_renamed_window_names_the_new_entity_in_text_and_call_and_keeps_the_value():
    win = call_windows(parse(ARTICLE).segments, after_words=4)[2]
    renamed = swap_entity(win, "Norvania")
    call = next(s for s in renamed if isinstance(s, Lookup))
    assert (call.entity, call.relation, call.value) == ("Norvania", "Admission Date", "1819")
    assert "Alabama" not in render(renamed) and strip(renamed).startswith("Norvania\nNorvania joined the Union")


def test_windows_keep_split_and_source_and_rename_about_the_share_asked(tmp_path):
    docs = [Document.from_annotated(f"d{i}", ARTICLE, split="train" if i % 2 else "heldout", source="wiki")
            for i in range(40)]
    wins = list(windows_of(docs, swap=0.5, seed=3))
    assert len(wins) == 120 and {w.split for w in wins} == {"train", "heldout"}
    renamed = [w for w in wins if "renamed" in w.meta]
    assert 40 < len(renamed) < 80 and all(w.meta["renamed"] == "Alabama" for w in renamed)
    assert len({w.lookups[0].entity for w in renamed}) > 30  # many names, not one
    for w in renamed:  # the text gives the new name: the call copies it
        assert w.lookups[0].entity in w.plain.split("\n")[0] and "Alabama" not in w.annotated


def test_cli_writes_windows_as_documents_and_refuses_a_corpus_without_calls(tmp_path):
    src = tmp_path / "docs.jsonl"
    write_documents(src, [Document.from_annotated("a", ARTICLE)])
    out = tmp_path / "w.jsonl"
    result = CliRunner().invoke(app, ["data", "windows", str(src), "--out", str(out), "--swap", "1"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output.strip().splitlines()[-1])["windows"] == 3
    assert all(d.num_calls == 1 and d.meta["renamed"] == "Alabama" for d in read_documents(out))
    plain = tmp_path / "plain.jsonl"
    write_documents(plain, [Document("p", "no calls here", "no calls here")])
    bad = CliRunner().invoke(app, ["data", "windows", str(plain), "--out", str(out)])
    assert bad.exit_code == 2 and "no lookup calls" in bad.output


def test_copies_of_a_window_are_renamed_anew_and_keep_distinct_ids():
    docs = [Document.from_annotated("a", ARTICLE)]
    once = list(windows_of(docs, swap=1.0, seed=3))
    twice = list(windows_of(docs, swap=1.0, seed=3, copies=2))
    assert [d.id for d in twice] == ["a/w0", "a/w0.1", "a/w1", "a/w1.1", "a/w2", "a/w2.1"]
    first, second = twice[0], twice[1]
    assert first.meta["renamed"] == second.meta["renamed"] == "Alabama" and first.source == second.source
    names = [next(s.entity for s in d.segments if isinstance(s, Lookup)) for d in twice]
    assert len(set(names)) == len(names) and [d.id for d in once] == ["a/w0", "a/w1", "a/w2"]
