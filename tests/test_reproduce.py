"""``lmlm reproduce --preset tiny``: every stage for real on tiny models, the report, and resuming."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest
from typer.testing import CliRunner

from lmlm.cli import app
from lmlm.evaluate.popqa import read_popqa
from lmlm.evaluate.tofu import read_tofu
from lmlm.evaluate.trex import read_trex
from lmlm.reproduce import STAGES, reproduce



def _same(a, b) -> bool:
    """Equal as JSON (NaN included)."""
    return json.dumps(a, sort_keys=True, default=str) == json.dumps(b, sort_keys=True, default=str)


def _stamps(folder):
    return {p.relative_to(folder).as_posix(): p.stat().st_mtime_ns for p in folder.rglob("*") if p.is_file()}


def _markers(out):
    """Each finished stage's ``OUT/<stage>/done.json``, by its time of last change."""
    return {p.parent.name: p.stat().st_mtime_ns for p in out.glob("*/done.json")}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("reproduce")
    partial = reproduce(out, preset="tiny", stop_after="factual")  # as if stopped after the third stage
    before = _markers(out)
    report = reproduce(out, preset="tiny")
    return out, partial, before, report


@pytest.mark.slow  # the smoke reproduction end to end
def test_interrupted_run_continues_where_it_stopped(run):
    out, partial, before, report = run
    assert list(partial["stages"]) == ["bios", "data", "factual"] and "claims" not in partial
    after = _markers(out)
    assert all(after[k] == v for k, v in before.items())              # finished stages were not redone
    assert set(report["stages"]) == set(STAGES)
    assert _same(report["stages"]["factual"], partial["stages"]["factual"])


@pytest.mark.slow  # the smoke reproduction end to end
def test_report_has_every_protocol_beside_the_paper(run):
    out, _, _, report = run
    assert json.loads((out / "report.json").read_text())["claims"] == report["claims"]
    for c in report["claims"]:
        assert set(c) == {"claim", "paper", "ours", "holds", "margin", "n", "seeds"} and c["holds"] in (True, False, None)
    md = (out / "report.md").read_text()
    for text in ("Factual precision", "Database ablation", "Prefix-tree", "RAG baseline", "TOFU", "offloading",
                 "Closing note", "30.6", "75.8", "54.1",                 # the paper's own numbers are shown
                 "KB only", "calls unanswered and stripped", "RAG reader (trained with passages)", "Verdict",
                 "added people", "perplexity (dynamic)"):
        assert text in md, text
    for fig in ("perplexity", "factual_precision", "prefix_tree", "rag", "tofu", "offloading"):
        assert (out / "figures" / f"{fig}.png").stat().st_size > 1000, fig
    s = report["stages"]
    for system in ("lmlm", "lmlm_prefix_tree", "lmlm_no_db", "lmlm_calls_stripped", "standard"):
        m = s["factual"]["systems"][system]["metrics"]
        assert set(m) == {"trex", "popqa", "factscore"} and 0 <= m["trex"]["trex_exact_match"] <= 1
        b = s["factual"]["systems"][system]["by_stated"]
        # every item is about a stated or a KB-only fact
        assert b["trex"]["n_stated"] + b["trex"]["n_kb_only"] == report["config"]["n_trex"]
    assert s["factual"]["n"]["trex_kb_only"] > 0  # the world has facts no training document states
    p = s["bios"]["perplexity"]
    assert p["lmlm"]["dynamic"] > 1 and p["standard"] > 1 and set(p["by_group"]) == {"trained", "added"}
    for m in s["factual"]["nlu"]["bios_continuation"].values():
        assert 0 <= m["above_chance"]["p_value"] <= 1


@pytest.mark.slow  # the smoke reproduction end to end
def test_seeds_give_every_margin_a_spread(run):
    _, _, _, report = run
    s = report["stages"]["seeds"]
    assert [r["seed"] for r in s["rows"]] == list(report["config"]["seeds"]) == [0, 1]
    first = s["rows"][0]
    assert first["ppl_static"] == pytest.approx(report["stages"]["bios"]["perplexity"]["lmlm"]["static"])
    assert s["rows"][1]["ppl_static"] != first["ppl_static"]          # another seed, another model
    m = s["summary"]["margin_dynamic"]
    assert m["n"] == 2 and m["min"] <= m["mean"] <= m["max"] and m["sd"] >= 0
    perplexity = next(c for c in report["claims"] if c["claim"].startswith("LMLM has lower perplexity"))
    assert perplexity["seeds"] == 2


@pytest.mark.slow  # the smoke reproduction end to end
def test_rag_has_both_readers_and_its_controls(run):
    out, _, _, report = run
    r = report["stages"]["rag"]
    assert set(r["readers"]) == {"standard", "reader"}
    assert 0 <= r["retrieval_subject_answer_trex"] <= r["retrieval_recall_trex"] <= 1
    for res in r["readers"].values():
        assert 0 <= res["oracle_passage_trex"] <= 1 and set(res["metrics"]) == {"trex", "popqa", "factscore"}
    assert (out / "rag" / "reader" / "checkpoint" / "config.json").exists()
    given = r["reader_training"]  # what the reader was trained with, as the report says it (not the share asked)
    assert 0 <= given["with_passages"] <= given["documents"]
    md = (out / "report.md").read_text()
    assert f"passages before {given['with_passages']} of its {given['documents']} training documents" in md
    assert sum("(reader: Standard trained with passages)" in c["claim"] for c in report["claims"]) == 3


@pytest.mark.slow  # the smoke reproduction end to end
def test_benchmark_files_in_official_formats(run):
    out, _, _, report = run
    assert len(read_trex(out / "data" / "trex.jsonl")) == report["config"]["n_trex"]
    assert len(read_popqa(out / "data" / "popqa.tsv")) == report["config"]["n_popqa"]
    forget = read_tofu(out / "tofu" / "world" / "forget05_perturbed.json")
    assert forget and all(it.paraphrased_answer and it.perturbed_answers for it in forget)


@pytest.mark.slow  # the smoke reproduction end to end
def test_unlearning_and_offloading_stages(run):
    out, _, _, report = run
    t = report["stages"]["tofu"]
    assert t["deletion"]["deleted"] == 7 * t["world"]["forget"]["forget05"]  # every fact of the forget authors
    for name in ("npo-0", "ga-0"):
        traj = t["unlearning_runs"][name]["trajectory"]
        assert [r["step"] for r in traj] == [0, 2, 4]
        assert all(0 <= r["model_utility"] <= 1 and r["forget_quality"] is not None for r in traj)
    ga = t["unlearning_runs"]["ga-0"]["trajectory"]
    assert ga[-1]["tofu_forget_prob"] < ga[0]["tofu_forget_prob"]      # gradient ascent did push the answers down
    seeds = t["seeds"]
    assert set(seeds["per_seed"]) == {"0", "1"} and set(seeds["null"]) == {"0-1"}
    assert 0 <= seeds["null"]["0-1"]["forget_quality"] <= 1 and 0 <= seeds["null"]["0-1"]["forget_quality_values"] <= 1
    assert seeds["per_seed"]["0"]["unlearned"] == t["models"]["lmlm_unlearned"]
    assert (out / "tofu" / "train-lmlm-retain95-seed1" / "checkpoint" / "config.json").exists()
    assert t["verdict"]["label"] in ("forgets", "noise", "the metric", "memorisation", "undecided")
    o = report["stages"]["offloading"]
    assert [r["ratio"] for r in o["ratios"]] == [0.0, 0.5, 1.0]
    assert o["ratios"][0]["perplexity_dynamic"] == o["ratios"][0]["perplexity_static"]  # no calls at 0%
    assert all(r["perplexity_dynamic"] > 1 for r in o["ratios"])
    assert [r["facts_offloaded"] for r in o["ratios"]] == [0, round(o["facts"] / 2), o["facts"]]
    assert (out / "offloading" / "ratio-050" / "checkpoint" / "config.json").exists()


@pytest.mark.slow  # the smoke reproduction end to end
def test_a_stage_cut_short_resumes_from_its_pieces(run):
    out, _, _, report = run
    ckpts = {p: _stamps(out / p) for p in ("offloading/ratio-050", "tofu/train-lmlm-full")}
    for path in ("offloading/done.json", "offloading/ratio-050.json", "tofu/done.json",
                 "tofu/eval/unlearn-npo-0.json", "report.json"):
        (out / path).unlink()
    again = reproduce(out, preset="tiny")
    assert {p: _stamps(out / p) for p in ckpts} == ckpts             # nothing retrained
    assert _same(again["stages"]["offloading"]["ratios"], report["stages"]["offloading"]["ratios"])
    assert _same(again["stages"]["tofu"]["unlearning_runs"]["npo-0"]["trajectory"],
                 report["stages"]["tofu"]["unlearning_runs"]["npo-0"]["trajectory"])
    with pytest.raises(ValueError, match="another config"):
        reproduce(out, preset="tiny", n_trex=5)


def test_cli_rejects_an_unknown_preset(tmp_path):
    res = CliRunner().invoke(app, ["reproduce", "--preset", "huge", "--out", str(tmp_path)])
    assert res.exit_code == 2 and "unknown preset" in res.output


@pytest.mark.slow
def test_a_killed_run_resumes(tmp_path):
    """SIGKILL in the middle of a stage, then run again: finished stages are kept, the rest completes."""
    out = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, "-c", "from lmlm.cli import app; app()", "reproduce", "--preset", "tiny",
                             "--out", str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 600
    while not (out / "factual" / "done.json").exists():
        assert proc.poll() is None, "the run ended before it could be killed"
        assert time.monotonic() < deadline, "the first stages took too long"
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (out / "report.json").exists()
    done = _markers(out)
    report = reproduce(out, preset="tiny")
    assert set(report["stages"]) == set(STAGES) and (out / "report.md").exists()
    assert all(_markers(out)[k] == v for k, v in done.items())  # kept, not redone
