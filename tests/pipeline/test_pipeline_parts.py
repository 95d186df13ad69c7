"""The pipeline's parts on small inputs: recipes, passages, merging methods, placing listed facts, cloze prompts."""

import json

import pytest
from typer.testing import CliRunner

from lmlm.annotate.prompts import DEFAULT_EXAMPLE, build_messages, fact_lines, parse_fact_lines
from lmlm.annotate.validate import place_facts
from lmlm.cli import app
from lmlm.corpus import Document
from lmlm.evaluate.trex import read_trex
from lmlm.lookup import Lookup, Text, strip
from lmlm.pipeline import RecipeError, load_recipe, recipe_names
from lmlm.pipeline.annotation import (CHECK_MIN, Reference, _infobox_passages, _seed_choice, call_layer, merge_layers,
                                     passages_of, run_llm, split_passages, vet_layer)
from lmlm.pipeline.recipe import LLMSpec, Recipe
from lmlm.pipeline.facts import ClozeFact, choose_edits, cloze_facts, write_trex
from lmlm.stages import finish_stage, stage_done

runner = CliRunner()

LINCOLN = ("Abraham Lincoln (February 12, 1809 – April 15, 1865) was an American lawyer.\n"
           "Early life\n"
           "He was born in Hodgenville, Kentucky. He married Mary Todd in 1842.")


def test_shipped_recipes_load_and_take_overrides():
    assert {"wiki-cpu", "wiki-cpu-scratch", "wiki-gpu"} <= set(recipe_names())
    scratch = load_recipe("wiki-cpu-scratch")
    assert scratch.train.init_from == "" and scratch.annotate.methods == ["infobox", "llm"]
    cpu = load_recipe("wiki-cpu")
    assert cpu.train.init_from == "SmolLM2-135M-Instruct" and cpu.train.windows and cpu.train.lora
    assert cpu.facts.source == "countryinfo" and cpu.evaluate.base and cpu.evaluate.free
    gpu = load_recipe("wiki-gpu", device="cuda")
    assert gpu.train.init_from == "SmolLM2-135M-Instruct" and gpu.device == "cuda" and gpu.evaluate.base
    r = load_recipe("wiki-cpu-scratch", ["train.max_steps=2", "evaluate.constrained=false", 'annotate.methods=["infobox"]',
                                 "corpus.heldout=0.5"], corpus="dump.xml.bz2")
    assert (r.train.max_steps, r.evaluate.constrained, r.annotate.methods, r.corpus.heldout, r.corpus.path) == \
        (2, False, ["infobox"], 0.5, "dump.xml.bz2")


@pytest.mark.parametrize("overrides, message", [
    (["train.maxsteps=2"], "unknown field 'maxsteps'"),
    (["train.max_steps=two"], "train.max_steps must be a int"),
    (['annotate.methods=["ocr"]'], "annotate.methods = 'ocr' is not one of"),
    (["corpus.heldout=1.5"], r"corpus.heldout = 1.5 must be in \[0, 1\)"),
    (["train.max_steps=0"], "train.max_steps = 0 must be at least 1"),
    (["annotate.llm.negatives=-1.0"], "annotate.llm.negatives = -1.0 must be at least 0"),
    (['annotate.llm.keep="some"'], "annotate.llm.keep = 'some' is not one of all, consistent, known"),
    (['annotate.methods=["llm"]', 'annotate.llm.keep="known"'], "has neither 'infobox' nor 'given'"),
    (["nonsense"], "expected section.key=value"),
    (["annotate.llm.distill_steps=-5"], "annotate.llm.distill_steps = -5 must be at least 1"),
    (["annotate.llm.correct_steps=0"], "annotate.llm.correct_steps = 0 must be at least 1"),
    (["annotate.llm.run_batch_size=0"], "annotate.llm.run_batch_size = 0 must be at least 1"),
    (["annotate.llm.correct_drop=1.5"], r"annotate.llm.correct_drop = 1.5 must be in \[0, 1\)"),
    (["annotate.llm.min_f1=2"], r"annotate.llm.min_f1 = 2.0 must be in \[0, 1\]"),
    (["annotate.llm.examples=-1"], "annotate.llm.examples = -1 must be at least 0"),
    (["annotate.llm.run_passages=-1"], "annotate.llm.run_passages = -1 must be at least 0"),
    # every field is checked before the first stage, not when the stage that reads it fails or runs on it
    (["evaluate.edits=-1"], "evaluate.edits = -1 must be at least 0"),
    (["evaluate.cloze_per_split=-5"], "evaluate.cloze_per_split = -5 must be at least 0"),
    (["evaluate.batch_size=0"], "evaluate.batch_size = 0 must be at least 1"),
    (["corpus.limit=-2"], "corpus.limit = -2 must be at least 0"),
    (["train.chunk_chars=-1"], "train.chunk_chars = -1 must be at least 0"),
    (["train.modes=[]"], "train.modes is empty"),
    (["annotate.methods=[]"], "annotate.methods is empty"),
    (["train.lr=-1"], "train.lr = -1.0: must be a positive number"),
    (["seed=-1"], "seed = -1: must be a non-negative integer"),
    (["train.tokenizer=bpe:abc"], "train.tokenizer = 'bpe:abc': 'bpe:N' needs a vocabulary size"),
    (['train.model="nope"'], "train.model = 'nope': unknown model preset 'nope'"),
    (["train.model_overrides={n_layer=0}"], "train.model_overrides: n_layer must be positive"),
])
def test_bad_recipe_fields_are_named(overrides, message):
    with pytest.raises(RecipeError, match=message):
        load_recipe("wiki-cpu-scratch", overrides)


def test_cli_errors_are_one_line(tmp_path):
    res = runner.invoke(app, ["pipeline", "wiki-nope", "--out", str(tmp_path / "p")])
    assert res.exit_code == 2 and "error: unknown recipe 'wiki-nope'" in res.output
    res = runner.invoke(app, ["pipeline", "wiki-cpu-scratch", "--out", str(tmp_path / "p")])
    assert res.exit_code == 2 and "names no corpus: pass --corpus" in res.output
    res = runner.invoke(app, ["pipeline", "wiki-cpu-scratch", "--corpus", str(tmp_path / "missing.xml.bz2"),
                              "--out", str(tmp_path / "p")])
    assert res.exit_code == 2 and "no corpus at" in res.output and "Traceback" not in res.output
    # a recipe's relative corpus path is read from the current folder, not the recipe's: the error says so
    res = runner.invoke(app, ["pipeline", "wiki-cpu-scratch", "--corpus", "no-such-dump.xml.bz2", "--out", str(tmp_path / "p")])
    assert res.exit_code == 2 and "a relative path is read from the current folder" in res.output
    docs = tmp_path / "docs.jsonl"
    docs.write_text(json.dumps({"id": "a", "text": "plain"}) + "\n")
    res = runner.invoke(app, ["pipeline", "wiki-cpu-scratch", "--corpus", str(docs), "--out", str(tmp_path / "q")])
    assert res.exit_code == 2 and "'infobox' needs a Wikipedia dump" in res.output
    res = runner.invoke(app, ["pipeline", "wiki-cpu-scratch", "--corpus", str(docs), "--out", str(tmp_path / "q"),
                              "--until", "evaluate"])
    assert res.exit_code == 2 and "'evaluate' is not one of" in res.output and "Traceback" not in res.output
    assert runner.invoke(app, ["pipeline", "--help"]).exit_code == 0


def test_passages_cover_paragraphs_and_sentences():
    spans = split_passages(LINCOLN, max_chars=60, min_chars=20)
    texts = [LINCOLN[a:b] for a, b in spans]
    assert texts == ["Abraham Lincoln (February 12, 1809 – April 15, 1865) was an American lawyer.",
                     "He was born in Hodgenville, Kentucky.", "He married Mary Todd in 1842."]
    doc = Document("d1", LINCOLN, LINCOLN, split="train")
    ps = passages_of([doc], 60)  # passages of at least 40 characters
    assert [p.text for p in ps] == texts[:1]
    assert [LINCOLN[p.meta["start"]:p.meta["start"] + len(p.text)] for p in ps] == texts[:1] and ps[0].meta["doc"] == "d1"


def test_infobox_passages_split_into_those_with_calls_and_those_without():
    born = LINCOLN.index("February 12, 1809")
    infobox = Document.from_annotated("d1", LINCOLN[:born] + "[dblookup('Abraham Lincoln', 'Birth Date') -> "
                                      "February 12, 1809] " + LINCOLN[born:])
    bare = Document("d2", LINCOLN, LINCOLN)  # an article without infobox calls gives neither kind
    with_calls = _infobox_passages([infobox, bare], 60)
    without = _infobox_passages([infobox, bare], 60, with_calls=False)
    assert [(p.id, p.num_calls) for p in with_calls] == [("d1@0", 1)]
    assert with_calls[0].lookups[0].value == "February 12, 1809"
    starts = [LINCOLN.index("He was born"), LINCOLN.index("He married")]
    assert [(p.id, p.num_calls, p.text) for p in without] == [
        (f"d1@{s}", 0, LINCOLN[s:e]) for s, e in split_passages(LINCOLN, 60) if s in starts]


def test_merging_methods_keeps_the_text_and_prefers_infobox():
    doc = Document("d1", LINCOLN, LINCOLN, split="train")
    born = LINCOLN.index("February 12, 1809")
    infobox = Document.from_annotated("d1", LINCOLN[:born] + "[dblookup('Abraham Lincoln', 'Birth Date') -> "
                                      "February 12, 1809] " + LINCOLN[born:])
    start = LINCOLN.index("He married")
    passage = Document(f"d1@{start}", LINCOLN[start:], LINCOLN[start:], meta={"doc": "d1", "start": start})
    seeded = Document.from_annotated(passage.id, place_facts(passage.text, [("Mary Todd", "Married In", "1842")]),
                                     meta=passage.meta)
    assert seeded.num_calls == 1
    # the distilled annotator also called at the infobox's position: the infobox call stays
    rival = Document.from_annotated("d1", LINCOLN[:born] + "[dblookup('Lincoln', 'Date') -> February] " + LINCOLN[born:])
    origin = (lambda p: (p.meta["doc"], p.meta["start"]))
    merged, = merge_layers([doc], {"llm_distilled": call_layer([rival]), "llm_seed": call_layer([seeded], origin),
                                   "infobox": call_layer([infobox])})
    assert merged.text == LINCOLN and merged.plain == LINCOLN
    assert [(c.entity, c.relation) for c in merged.lookups] == [("Abraham Lincoln", "Birth Date"),
                                                                ("Mary Todd", "Married In")]
    assert merged.meta["call_methods"] == ["infobox", "llm_seed"]
    assert merged.meta["calls_by_method"] == {"infobox": 1, "llm_seed": 1}
    # a user's own calls: two relations of one value at one position are both kept
    both = Document.from_annotated("d1", LINCOLN[:born] + "[dblookup('Abraham Lincoln', 'Birth Date') -> February 12, "
                                   "1809][dblookup('Abraham Lincoln', 'Date') -> February 12, 1809] " + LINCOLN[born:])
    merged, = merge_layers([doc], {"given": call_layer([both]), "llm_distilled": call_layer([rival])})
    assert [c.relation for c in merged.lookups] == ["Birth Date", "Date"] and merged.text == LINCOLN
    assert merged.meta["call_methods"] == ["given", "given"]


def test_llm_calls_are_vetted_against_the_reference_facts():
    reference = Reference([("Abraham Lincoln", "Birth Place", "Hodgenville, Kentucky"),
                           ("Abraham Lincoln", "Spouse", "Mary Todd"), ("Abraham Lincoln", "Spouse", "Mary Todd Lincoln")],
                          aliases=[("Honest Abe", "Abraham Lincoln")])
    calls = {"agrees": Lookup("honest abe", "birth place", "Hodgenville, Kentucky."),  # an alias, case, end punctuation
             "also agrees": Lookup("Abraham Lincoln", "Spouse", "mary todd lincoln"),  # one of two values
             "conflicts": Lookup("Abraham Lincoln", "Birth Place", "Springfield"),
             "unknown_relation": Lookup("Abraham Lincoln", "Occupation", "lawyer"),
             "unknown_entity": Lookup("Mary Todd", "Birth Place", "Lexington")}
    assert {k: reference.verdict(c) for k, c in calls.items()} == {
        "agrees": "agrees", "also agrees": "agrees", "conflicts": "conflicts",
        "unknown_relation": "unknown_relation", "unknown_entity": "unknown_entity"}
    layer = {"d1": [(i * 10, c) for i, c in enumerate(calls.values())], "d2": [(0, calls["conflicts"])]}
    kept = {keep: vet_layer(layer, reference, keep) for keep in ("all", "consistent", "known")}
    counts = {"calls": 6, "agrees": 2, "conflicts": 2, "unknown_entity": 1, "unknown_relation": 1}
    assert kept["all"] == (layer, {**counts, "kept": 6})
    assert kept["consistent"] == ({"d1": [(0, calls["agrees"]), (10, calls["also agrees"]), (30, calls["unknown_relation"]),
                                          (40, calls["unknown_entity"])]}, {**counts, "kept": 4})
    assert kept["known"] == ({"d1": [(0, calls["agrees"]), (10, calls["also agrees"])]}, {**counts, "kept": 2})
    # a date the text writes day first is the infobox's date; another day is not
    dated = Reference([("Abraham Lincoln", "Birth Date", "February 12, 1809")])
    assert dated.verdict(Lookup("Abraham Lincoln", "Birth Date", "12 February 1809")) == "agrees"
    assert dated.verdict(Lookup("Abraham Lincoln", "Birth Date", "13 February 1809")) == "conflicts"
    # without reference facts every call names an unknown entity: "known" keeps none
    assert vet_layer(layer, Reference([]), "known") == ({}, {"calls": 6, "agrees": 0, "conflicts": 0,
                                                             "unknown_entity": 6, "unknown_relation": 0, "kept": 0})


def test_listed_facts_become_calls_before_their_mention():
    text = "Marta Kowalska was born in Gdansk. Gdansk is a port; Marta studied in Warsaw."
    answer = "Marta Kowalska | Birth City | gdansk\nMarta Kowalska | Birth City | gdansk\nWarsaw | Country | Poland\nbad line"
    facts = parse_fact_lines(answer)
    assert facts == [("Marta Kowalska", "Birth City", "gdansk"), ("Warsaw", "Country", "Poland")]
    annotated = place_facts(text, facts)
    assert strip(Document.from_annotated("x", annotated).segments) == text
    assert annotated.count("[dblookup(") == 1  # Poland is never mentioned
    assert "born in [dblookup('Marta Kowalska', 'Birth City') -> Gdansk] Gdansk." in annotated
    # the entity must be named before the value: no call before its first mention
    assert place_facts("Gdansk is where Marta was born.", [("Marta", "Birth City", "Gdansk")]) == \
        "Gdansk is where Marta was born."
    messages = build_messages("A passage.", style="facts")
    assert messages[-1]["content"] == "A passage." and "Entity | Relation | Value" in messages[0]["content"]
    assert messages[2]["content"] == fact_lines(DEFAULT_EXAMPLE.annotated)  # the example answers in lines
    assert messages[2]["content"].splitlines()[0] == "Marta Kowalska | Birth Date | 3 May 1961"


def test_cloze_prompts_in_trex_format_per_split(tmp_path):
    born, married = LINCOLN.index("February 12, 1809"), LINCOLN.index("Mary Todd")
    calls = [(born, Lookup("Abraham Lincoln", "Birth Date", "February 12, 1809")),
             (married, Lookup("Abraham Lincoln", "Spouse", "Mary Todd"))]
    from lmlm.annotate.validate import insert_calls
    train = Document.from_segments("d1", insert_calls(LINCOLN, calls), split="train",
                                   meta={"call_methods": ["infobox", "infobox"]})
    other = "Ada Lovelace (December 10, 1815 – 1852) was a mathematician."
    at = other.index("December")
    held = Document.from_segments("d2", insert_calls(other, [(at, Lookup("Ada Lovelace", "Birth Date",
                                                                          "December 10, 1815"))]),
                                  split="heldout", meta={"call_methods": ["llm_distilled"]})
    facts = cloze_facts([train, held])
    assert list(facts) == ["train"]  # only reference (infobox) facts: the held-out call is an LLM's
    prompts = {f.relation: f.prompt for f in facts["train"]}
    assert prompts == {"Birth Date": "Abraham Lincoln (", "Spouse": "Abraham Lincoln\nHe married"}
    items = read_trex(write_trex(facts["train"], tmp_path / "train.jsonl"))
    assert [(it.prompt, it.gold, it.relation, it.subject) for it in items] == [
        ("Abraham Lincoln (", "February 12, 1809", "Birth Date", "Abraham Lincoln"),
        ("Abraham Lincoln\nHe married", "Mary Todd", "Spouse", "Abraham Lincoln")]
    edits = choose_edits(facts["train"] + [ClozeFact("Ada Lovelace", "Spouse", "William King", "Ada married", "train",
                                                     "d3", 0)], 5, seed=0)
    assert [(e["entity"], e["relation"]) for e in edits] in ([("Abraham Lincoln", "Spouse"), ("Ada Lovelace", "Spouse")],
                                                             [("Ada Lovelace", "Spouse"), ("Abraham Lincoln", "Spouse")])
    assert all(e["new_value"] != e["old_value"] for e in edits)
    # a relation whose values differ only in case has no other value to give
    cased = [ClozeFact("Aristotle", "Nationality", "Greek", "Aristotle was", "train", "d4", 0),
             ClozeFact("Plato", "Nationality", "greek", "Plato was", "train", "d5", 0)]
    assert choose_edits(cased, 5, seed=0) == []


def test_training_chunks_are_headed_by_their_title_and_keep_their_calls():
    from lmlm.pipeline.data import chunks as _chunks

    married = LINCOLN.index("Mary Todd")
    from lmlm.annotate.validate import insert_calls
    doc = Document.from_segments("d1", insert_calls(LINCOLN, [(married, Lookup("Abraham Lincoln", "Spouse", "Mary Todd"))]),
                                 source="Abraham Lincoln", split="heldout")
    chunks = _chunks([doc], 60)
    assert [c.text for c in chunks] == [
        "Abraham Lincoln\nAbraham Lincoln (February 12, 1809 – April 15, 1865) was an American lawyer.",
        "Abraham Lincoln\nEarly life", "Abraham Lincoln\nHe was born in Hodgenville, Kentucky.",
        "Abraham Lincoln\nHe married Mary Todd in 1842."]
    assert [c.num_calls for c in chunks] == [0, 0, 0, 1] and chunks[3].lookups[0].value == "Mary Todd"
    assert all(c.split == "heldout" for c in chunks) and _chunks([doc], 0) == [doc]


def test_short_documents_are_seeded_and_an_annotator_that_cannot_be_checked_is_not_distilled(tmp_path):
    """A corpus of one-sentence documents (under the 120 characters a seed passage is first chosen from)
    still gives the LLM its passages; with too few annotated passages to hold a check out, a recipe that
    asks for one (``min_f1 > 0``) distils no annotator rather than running an unchecked one."""
    people = [("Marie Dubois", "Lyon"), ("Akira Tanaka", "Osaka"), ("Lena Novak", "Prague"), ("Grace Okafor", "Lagos")]
    docs = [Document(f"d{i}", f"{n} was born in {c}. {n.split()[0]} studied law.",
                     f"{n} was born in {c}. {n.split()[0]} studied law.") for i, (n, c) in enumerate(people * 3)]
    passages = passages_of(docs, 400)
    seeds = _seed_choice(passages, 8)
    assert len(seeds) == 8 and all(len(p.text) < 120 for p in seeds)
    # the seed and the corrector as a resumed run finds them: the LLM's calls on the seed passages
    folder = tmp_path / "llm"
    annotated = [{"id": p.id, "doc": p.meta["doc"], "start": p.meta["start"],
                  "annotated": p.text.replace(f"in {c}.", f"in [dblookup('{n}', 'Birth City') -> {c}] {c}.")}
                 for p in seeds for n, c in people if p.text.startswith(n)]
    for stage, name in (("seed", "annotated.jsonl"), ("correct", "kept.jsonl")):
        (folder / stage).mkdir(parents=True)
        (folder / stage / name).write_text("".join(json.dumps(d) + "\n" for d in annotated))
        finish_stage(folder / stage, {"documents": len(annotated)})
    logs: list[str] = []
    layers, report = run_llm(folder, docs, None, LLMSpec(seed_passages=8, min_f1=0.2), device="cpu", seed=0,
                             progress=False, log=logs.append)
    assert len(annotated) < CHECK_MIN and "skipped" in report["distill"] and "skipped" in report["run"]
    assert layers["llm_distilled"] == {} and not (folder / "annotator" / "annotator.json").exists()
    assert sum(len(v) for v in layers["llm_seed"].values()) == 8 and any("too few" in m for m in logs)
    assert stage_done(folder / "annotator")["skipped"] == report["distill"]["skipped"]  # a rerun finds it decided


def test_a_users_corpus_splits_calls_and_edits_at_the_pipelines_joints(tmp_path):
    """``lmlm pipeline`` on a user's annotated file: only its ``train`` documents are trained on (their
    ``validation`` and ``test`` ones are held out); text without one call under ``methods = ["given"]``
    stops in one line; the corpus file edited in place after a run is refused, not silently reused."""
    people = [("Ada Lovelace", "London", "train"), ("Marta Kowalska", "Gdansk", "validation"),
              ("Bruno Keller", "Zurich", "test"), ("Chiara Russo", "Naples", "train")]
    corpus = tmp_path / "docs.jsonl"
    corpus.write_text("".join(json.dumps({"id": n, "split": s, "annotated": f"{n} was born in "
                                          f"[dblookup('{n}', 'Birth City') -> {c}] {c}. {n} liked it."}) + "\n"
                              for n, c, s in people))
    run = ["pipeline", "wiki-cpu-scratch", "--corpus", str(corpus), "--out", str(tmp_path / "P"), "--no-progress",
           "--set", 'annotate.methods=["given"]', "--set", "train.max_steps=1", "--set", "train.batch_size=1",
           "--set", "train.seq_len=32", "--set", "protocols.edits=[1]", "--set", "protocols.weight_edits=[1]",
           "--set", "protocols.sample=1", "--set", "protocols.fluency_n=1", "--set", "protocols.forget=1"]
    res = CliRunner().invoke(app, run)
    assert res.exit_code == 0, res.output
    splits = {f: sorted(json.loads(x)["split"] for x in (tmp_path / "P" / "data" / f).read_text().splitlines())
              for f in ("train.jsonl", "heldout.jsonl")}
    assert splits == {"train.jsonl": ["train", "train"], "heldout.jsonl": ["test", "validation"]}
    with corpus.open("a") as f:  # the user adds a document to the same file
        f.write(json.dumps({"annotated": "Isaac Newton was born in [dblookup('Isaac Newton', 'Birth City') -> "
                                         "Woolsthorpe] Woolsthorpe."}) + "\n")
    res = CliRunner().invoke(app, run)
    assert res.exit_code == 2 and "changed since" in res.output and "--fresh" in res.output, res.output
    (tmp_path / "plain.txt").write_text("Ada Lovelace was born in London.\nMarta Kowalska was born in Gdansk.\n")
    res = CliRunner().invoke(app, [*run[:2], "--corpus", str(tmp_path / "plain.txt"), "--out", str(tmp_path / "Q"),
                                   "--set", 'annotate.methods=["given"]'])
    assert res.exit_code == 2 and "none of the 2 documents" in " ".join(res.output.split()), res.output


def test_a_field_of_the_llm_path_may_change_until_the_step_that_reads_it_has_begun(tmp_path):
    from lmlm.pipeline.run import _check_folder

    out = tmp_path / "P"
    _check_folder(load_recipe("wiki-cpu-scratch", corpus="dump.xml.bz2"), out, fresh=False, until="correct")
    for step in ("seed", "correct"):  # a run stopped by --until correct
        finish_stage(out / "annotate" / "llm" / step, {})
    later = ["annotate.llm.distill_steps=50", "annotate.llm.min_f1=0.5", "annotate.llm.run_passages=9",
             'annotate.llm.keep="consistent"']
    _check_folder(load_recipe("wiki-cpu-scratch", later, corpus="dump.xml.bz2"), out, fresh=False, until="distill")
    assert json.loads((out / "recipe.json").read_text())["annotate"]["llm"]["distill_steps"] == 50
    for done in ("annotate.llm.correct_drop=0.2", "annotate.llm.seed_passages=8", "annotate.llm.style=\"inline\"",
                 'annotate.methods=["infobox"]'):
        with pytest.raises(RecipeError, match=f"holds a run of another recipe \\({done.split('=')[0]}"):
            _check_folder(load_recipe("wiki-cpu-scratch", later + [done], corpus="dump.xml.bz2"), out, fresh=False,
                          until="distill")
    # invalid is invalid, on a folder or not
    with pytest.raises(RecipeError, match="distill_steps = -5 must be at least 1"):
        load_recipe("wiki-cpu-scratch", ["annotate.llm.distill_steps=-5"], corpus="dump.xml.bz2")


def test_training_resumes_only_a_run_its_folder_holds(tmp_path):
    """A first training run of the pipeline is not a resume (which said there was no state to resume); a run
    cut short before its first saved state is, so that it says so."""
    from lmlm.pipeline.run import _train_config

    recipe = load_recipe("wiki-cpu-scratch", corpus="dump.xml.bz2")
    assert not _train_config(recipe, tmp_path, "lmlm", None).resume
    (tmp_path / "train-lmlm").mkdir()
    (tmp_path / "train-lmlm" / "train_config.json").write_text("{}")
    assert _train_config(recipe, tmp_path, "lmlm", None).resume
    assert not _train_config(recipe, tmp_path, "standard", None).resume


def test_a_run_refused_before_it_wrote_anything_is_no_part_of_the_run(tmp_path):
    """A corpus refused at its first stage (a duplicate id) leaves no record; the run that then reads the
    fixed file is the only one the report's "Run in parts" could name."""
    from lmlm.pipeline.run import run_pipeline

    docs = tmp_path / "docs.jsonl"
    rows = [{"id": "d1", "annotated": "[dblookup('Ada', 'Birth City') -> London] London."},
            {"id": "d1", "annotated": "Ada wrote notes."}]
    docs.write_text("".join(json.dumps(r) + "\n" for r in rows))
    recipe = load_recipe("wiki-cpu-scratch", ['annotate.methods=["given"]'], corpus=str(docs))
    with pytest.raises(Exception, match="duplicate document id 'd1'"):
        run_pipeline(recipe, tmp_path / "P", progress=False, until="corpus")
    assert (tmp_path / "P" / "runs.jsonl").read_text() == ""
    rows[1]["id"] = "d2"
    docs.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert run_pipeline(recipe, tmp_path / "P", progress=False, until="corpus") is None
    assert len((tmp_path / "P" / "runs.jsonl").read_text().splitlines()) == 1


def test_a_corpus_with_nothing_to_train_on_is_refused_at_its_first_stage(tmp_path):
    """A held-out share that takes every document, or a file whose splits name no 'train' document, stops the
    corpus stage with the reason, not the training stage after the KB with 'data/train.jsonl: no documents'."""
    from lmlm.pipeline.run import run_pipeline

    docs = tmp_path / "docs.jsonl"
    rows = [{"id": f"d{i}", "annotated": f"{n} was born in [dblookup('{n}', 'Birth City') -> London] London."}
            for i, n in enumerate(["Ada Lind", "Bo Moss", "Cy Roe"])]
    docs.write_text("".join(json.dumps(r) + "\n" for r in rows))
    recipe = load_recipe("wiki-cpu-scratch", ['annotate.methods=["given"]', "corpus.heldout=0.9"], corpus=str(docs))
    with pytest.raises(RecipeError, match="nothing to train on: corpus.heldout = 0.9 holds out all 3"):
        run_pipeline(recipe, tmp_path / "P", progress=False, until="corpus")
    docs.write_text("".join(json.dumps({**r, "split": "test"}) + "\n" for r in rows))
    recipe = load_recipe("wiki-cpu-scratch", ['annotate.methods=["given"]'], corpus=str(docs))
    with pytest.raises(RecipeError, match="split fields name no 'train' document"):
        run_pipeline(recipe, tmp_path / "Q", progress=False, until="corpus")


def test_a_kb_whose_creation_was_cut_short_is_made_again(tmp_path):
    """Ctrl-C while the KB stage creates its database leaves an SQLite file not yet marked as a KB; the rerun
    made it again (it stopped with 'is an SQLite file but not an lmlm knowledge base')."""
    import sqlite3

    from lmlm.pipeline.run import run_pipeline

    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps({"id": f"d{i}", "annotated": f"{n} was born in [dblookup('{n}', 'Birth City') "
                                        f"-> London] London."}) + "\n" for i, n in enumerate(["Ada Lind", "Bo Moss"])))
    recipe = load_recipe("wiki-cpu-scratch", ['annotate.methods=["given"]', "corpus.heldout=0.0"], corpus=str(docs))
    assert run_pipeline(recipe, tmp_path / "P", progress=False, until="annotate") is None
    (tmp_path / "P" / "kb").mkdir()
    with sqlite3.connect(tmp_path / "P" / "kb" / "kb.sqlite") as db:
        db.execute("CREATE TABLE meta (name TEXT PRIMARY KEY, value TEXT)")
    assert run_pipeline(recipe, tmp_path / "P", progress=False, until="kb") is None
    assert json.loads((tmp_path / "P" / "kb" / "done.json").read_text())["triples"] == 2


def test_corpus_relation_sentences_come_from_training_articles_only_one_relation_in_turn(tmp_path):
    """The training articles' infobox facts, spread over their relations; a held-out article's never."""
    from lmlm.corpus import write_documents
    from lmlm.pipeline.data import corpus_relation_facts

    (tmp_path / "corpus").mkdir()
    (tmp_path / "annotate").mkdir()
    write_documents(tmp_path / "corpus" / "documents.jsonl",
                    [Document.from_segments("a", [Text("Alaska is a state.")], split="train"),
                     Document.from_segments("b", [Text("Alabama is a state.")], split="heldout")])
    rows = [("Alaska", "Capital", "Juneau", "a"), ("Alaska", "Largest City", "Anchorage", "a"),
            ("Alaska", "Highest Point", "Denali", "a"), ("Alaska", "Population", "731,545", "a"),
            ("Alaska", "Capital", "Juneau City", "a"), ("Alaska", "Common Name", "alaska", "a"),
            ("Alabama", "Capital", "Montgomery", "b")]
    (tmp_path / "annotate" / "triples.jsonl").write_text("".join(
        json.dumps({"entity": e, "relation": r, "value": v, "source": s, "position": None}) + "\n" for e, r, v, s in rows))
    facts = corpus_relation_facts(tmp_path, 3)
    assert len(facts) == 3 and {r for _, r, _ in facts} == {"Capital", "Largest City", "Highest Point"}
    every = corpus_relation_facts(tmp_path, 100)
    assert all(e == "Alaska" for e, _, _ in every) and len(every) == 4  # a number with no word in it is left
    # out, and so is the entity's own name: "The common name of Alaska is Alaska" teaches no lookup
    assert corpus_relation_facts(tmp_path, 100, split="heldout") == [("Alabama", "Capital", "Montgomery")]


def test_the_heldout_infobox_split_asks_the_heldout_articles_facts_as_training_words_them(tmp_path):
    """The held-out articles' infobox facts as T-REx records in the infobox sentences' wording, which
    `lmlm eval trex` reads; a training article's fact never among them."""
    from lmlm.corpus import write_documents
    from lmlm.data.facts import fact_documents
    from lmlm.evaluate.trex import read_trex
    from lmlm.pipeline.data import infobox_split

    (tmp_path / "corpus").mkdir()
    (tmp_path / "annotate").mkdir()
    write_documents(tmp_path / "corpus" / "documents.jsonl",
                    [Document.from_segments("a", [Text("Alaska is a state.")], split="train"),
                     Document.from_segments("b", [Text("Alabama is a state.")], split="heldout")])
    rows = [("Alaska", "Capital", "Juneau", "a"), ("Alabama", "Capital", "Montgomery", "b"),
            ("Alabama", "Highest Point", "Mount Cheaha", "b"), ("Alabama", "Population", "4,779,736", "b"),
            ("American Football Conference", "Sport", "American football", "b")]  # the prompt names its value
    (tmp_path / "annotate" / "triples.jsonl").write_text("".join(
        json.dumps({"entity": e, "relation": r, "value": v, "source": s, "position": None}) + "\n" for e, r, v, s in rows))
    recipe = Recipe()
    path = infobox_split(recipe, tmp_path, tmp_path / "eval")
    facts = read_trex(path)
    assert sorted((f.subject, f.relation, f.gold) for f in facts) == [
        ("Alabama", "Capital", "Montgomery"), ("Alabama", "Highest Point", "Mount Cheaha")]
    trained = fact_documents([("Alabama", "Highest Point", "Mount Cheaha")])[0].text
    asked = next(f.prompt for f in facts if f.relation == "Highest Point")
    assert trained.startswith(asked.rstrip())  # "Alabama\nThe highest point of Alabama is"


def test_plain_paragraphs_hold_no_call_and_keep_their_title():
    from lmlm.pipeline.data import plain_chunks

    long = "Juneau is the capital of Alaska. " * 8
    doc = Document.from_segments("a", [Text("Alaska is a state in the west. " * 8 + "\n\nIts capital is "),
                                       Lookup("Alaska", "Capital", "Juneau"), Text(" Juneau.\n\n" + long)],
                                 source="Alaska", split="train")
    plain = plain_chunks([doc], 10, max_chars=400)
    assert plain and all(d.num_calls == 0 and d.text.startswith("Alaska\n") for d in plain)
    assert all("Its capital is" not in d.text for d in plain)  # the paragraph with the call stays out
    assert len(plain_chunks([doc], 1, max_chars=400)) == 1
