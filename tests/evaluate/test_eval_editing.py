"""``lmlm eval editing``: CounterFact and zsRE sets read and written, an LMLM's KB edits scored through its
lookups, ROME's rank-one update and FT-L's constrained fine-tuning on the tiny trained world."""

from __future__ import annotations

import copy
import json
import math
import random
from types import SimpleNamespace

import pytest
import torch
from tiny_lm import bio_doc
from typer.testing import CliRunner

from lmlm.checkpoint import save_checkpoint
from lmlm.corpus import Document, write_documents
from lmlm.evaluate.cli import eval_app
from lmlm.evaluate.editing import (counterfact_records, n_gram_entropy, parse_counts, read_counterfact,
                                   read_edit_set, read_zsre, write_records, zsre_records)
from lmlm.evaluate.weight_editing import (FineTuneL, Memit, Rome, WeightEdit, _at_subject, decoder_block,
                                          memit_layers, mlp_projection)
from lmlm.kb import KnowledgeBase, Triple
from lmlm.lookup import strip
from lmlm.scoring import token_logprobs
from lmlm.tokens import DOC_SEPARATOR

runner = CliRunner()
# the tiny world's own phrasings (tests/tiny_lm.py's biographies) first, then paraphrases
SAY = {"Birth City": ["{} was born in", "{}'s birth city is", "{} is a native of"],
       "Occupation": ["{} works as a", "{}'s job is", "{} is employed as a"]}
PHRASES = SimpleNamespace(phrasings=lambda e, r: [t.format(e) for t in SAY[r]])


def test_counterfact_and_zsre_files_round_trip_through_the_readers(world, tmp_path):
    cf = counterfact_records(world.facts, 30, world=PHRASES, seed=1)
    assert cf == counterfact_records(world.facts, 30, world=PHRASES, seed=1)  # seeded
    cases = read_counterfact(write_records(tmp_path / "counterfact.json", cf))
    assert [c.case_id for c in cases] == list(range(30))
    first, rw = cases[0], cf[0]["requested_rewrite"]
    assert first.prompt == rw["prompt"].format(rw["subject"]) and first.relation == rw["relation_id"]
    assert first.paraphrases == tuple(cf[0]["paraphrase_prompts"]) and len(first.paraphrases) == 2
    for c in cases:
        assert c.target_new != c.target_true == world.facts[(c.subject, c.relation)]
        assert c.target_new in {v for (_, r), v in world.facts.items() if r == c.relation}  # the same relation's value
        for p in c.neighborhood:  # another subject, the same relation and true object, never an edited one
            other = p.removesuffix(SAY[c.relation][0][2:]).strip()
            assert other != c.subject and world.facts[(other, c.relation)] == c.target_true
            assert all(o.subject != other for o in cases)
    # 30 rewrites over half the 24 people's 48 facts: the later ones edit a fact again, to yet another value
    assert len({c.key for c in cases}) == 24
    z = zsre_records(world.facts, 5, world=PHRASES)
    cases = read_zsre(write_records(tmp_path / "zsre.json", z))
    assert [c.format for c in cases] == ["zsre"] * 5 and cases[0].target_new == z[0]["alt"]
    assert cases[0].prompt == z[0]["src"] and cases[0].paraphrases == (z[0]["rephrase"],)
    assert cases[0].locality == ((z[0]["loc"], z[0]["loc_ans"]),) and read_edit_set(tmp_path / "zsre.json") == cases


def test_a_set_from_a_kb_alone_takes_the_generic_phrasings(world):
    rec = counterfact_records(world.facts, 1, seed=0)[0]
    assert rec["requested_rewrite"]["prompt"].startswith("The ") and rec["requested_rewrite"]["prompt"].endswith(" of {} is")
    assert len(rec["paraphrase_prompts"]) >= 1


def test_counts_and_fluency_follow_their_definitions():
    assert parse_counts("1, 100,1k,10_000") == [1, 100, 1000, 10000]
    with pytest.raises(ValueError, match="--edits"):
        parse_counts("1,many")
    # ROME's n_gram_entropy: mean(2/3 H2, 4/3 H3) per text, averaged; a repeated text has less of it
    words = "the cat sat on the mat".split()
    h2, h3 = _h([tuple(words[i:i + 2]) for i in range(5)]), _h([tuple(words[i:i + 3]) for i in range(4)])
    assert n_gram_entropy(["the cat sat on the mat"]) == pytest.approx((2 / 3 * h2 + 4 / 3 * h3) / 2)
    assert n_gram_entropy(["a a a a a a"]) < n_gram_entropy(["a b c d e f"])


def test_fluency_texts_run_their_full_length_past_the_end_of_a_document(world):
    """ROME's ``generate_fast`` writes every text to its full length: a model that ends its document early
    (as an edited value can make it) does not get a shorter text, and so no lower entropy for it; the end
    of a document is never drawn, so no text is a few words between end tokens."""
    from lmlm.evaluate.editing import PlainScorer
    from lmlm.generate import LookupGenerator

    model = copy.deepcopy(world.model)  # its output row for the document's end made larger: some texts end early
    model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())
    with torch.no_grad():
        model.lm_head.weight[world.tok.eos_id] *= 4
    gen = LookupGenerator(model, world.tok, None, use_db=False)
    prompts = [SAY["Birth City"][0].format(e) for e in sorted({e for e, _ in world.facts})[:8]]
    ended = gen.generate(prompts, max_new_tokens=80, do_sample=True, top_k=5, seed=0)
    early = [i for i, r in enumerate(ended) if len(r.token_ids) < 80]
    assert early
    texts = PlainScorer(gen).generate(prompts, max_new_tokens=80, seed=0)
    for text in texts:
        assert len(world.tok.encode_text(text)) >= 75  # 80 tokens of text (decoded and read again)
        assert DOC_SEPARATOR not in text
    assert all(len(texts[i]) > len(ended[i].clean_text) for i in early)


def _h(grams):
    from collections import Counter
    counts = Counter(grams)
    total = sum(counts.values())
    return -sum(c / total * math.log2(c / total) for c in counts.values())


@pytest.fixture(scope="module")
def run_dir(world, tmp_path_factory):
    """The tiny LMLM, its KB, and a CounterFact set of its facts in its own phrasings."""
    root = tmp_path_factory.mktemp("eval-editing")
    save_checkpoint(root / "lmlm", world.model, world.tok, {"mode": "lmlm", "kb": str(root / "kb")})
    save_checkpoint(root / "standard", world.model, world.tok, {"mode": "standard"})
    kb = KnowledgeBase.create(root / "kb")
    kb.add([Triple(e, r, v) for (e, r), v in world.facts.items()], embed=False)
    kb.close()
    write_records(root / "counterfact.json", counterfact_records(world.facts, 24, world=PHRASES, seed=0))
    rng = random.Random(0)
    write_documents(root / "docs.jsonl", [Document.from_segments(f"bio-{i}", bio_doc(*p, rng))
                                          for i, p in enumerate(world.people)])
    return root


def _run(args):
    res = runner.invoke(eval_app, args)
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout.strip().splitlines()[-1])["metrics"]


def test_lmlm_kb_edits_cost_only_the_lookups_accuracy(world, run_dir, tmp_path):
    out = tmp_path / "editing.json"
    m = _run(["editing", "--model", str(run_dir / "lmlm"), "--data", str(run_dir / "counterfact.json"),
              "--method", "lmlm", "--edits", "1,24", "--fluency-n", "4", "--fluency-tokens", "24", "--out", str(out)])
    assert m["editing_24_edits"] == 24 and m["editing_24_n_efficacy_accuracy"] == 24
    assert m["editing_24_unedited_precision"] >= 0.6  # the model's lookups find most facts
    # an edit moves the answer exactly where the lookup reaches the key: efficacy is that precision
    assert m["editing_24_efficacy_accuracy"] == m["editing_24_unedited_precision"]
    # by probability (the model's own, no copy bias), the returned value mostly outweighs what the text after
    # the call taught the weights about the old one
    assert m["editing_24_efficacy_score"] >= 0.7 and m["editing_24_unedited_score"] >= 0.9
    assert m["editing_24_neighborhood_unchanged"] == 1.0 and m["editing_24_n_neighborhood_unchanged"] > 0
    assert m["editing_24_neighborhood_accuracy"] == m["editing_24_unedited_neighborhood_accuracy"]
    assert m["editing_efficacy_score"] == m["editing_24_efficacy_score"] and m["editing_24_edit_seconds"] >= 0
    assert m["editing_24_fluency"] > 0 and m["editing_n_fluency"] == 4
    result = json.loads(out.read_text())
    assert result["protocol"]["name"] == "editing" and [r["edits"] for r in result["records"]] == [1, 24]
    kb = KnowledgeBase.open(run_dir / "kb")  # the KB given is left as it was: the edits go to a copy
    assert {(e, r): kb.lookup(e, r).value for (e, r) in world.facts} == world.facts
    kb.close()


def test_bad_input_is_refused_in_one_line(run_dir, tmp_path):
    bad = tmp_path / "counterfact.json"
    records = json.loads((run_dir / "counterfact.json").read_text())
    records[1]["requested_rewrite"]["target_new"] = "Paris"  # not {"str": ...}
    bad.write_text(json.dumps(records))
    base = ["editing", "--model", str(run_dir / "lmlm")]
    for args, words in ((base + ["--data", str(bad)], "counterfact.json: record 2: requested_rewrite.target_new"),
                        (base, "--data FILE"),
                        (base + ["--data", str(run_dir / "counterfact.json"), "--edits", "100"], "holds 24 rewrites"),
                        (base + ["--data", str(run_dir / "counterfact.json"), "--method", "memo"], "--method must be"),
                        (["editing", "--model", str(run_dir / "standard"), "--data", str(run_dir / "counterfact.json"),
                          "--edits", "1"],
                         "Standard checkpoint")):
        res = runner.invoke(eval_app, args)
        assert res.exit_code == 2 and words in res.output, res.output
        assert len([line for line in res.output.splitlines() if line.startswith("error:")]) == 1


def _texts(world):
    rng = random.Random(0)
    return [strip(bio_doc(n, c, j, rng)) for n, c, j in world.people]


def _logp(model, tok, prompt: str, target: str) -> float:
    """Mean log-probability of ``" " + target``'s tokens after ``prompt``, lookup tokens banned."""
    p = [tok.doc_id, *tok.encode_text(prompt)]
    full = [tok.doc_id, *tok.encode_text(prompt + " " + target)]
    lp = token_logprobs(model, [full], banned=tok.call_ids)[0]
    return float(lp[len(p) - 1:].mean())


def test_rome_maps_the_subjects_key_to_the_new_value(world):
    model = copy.deepcopy(world.model)
    rome = Rome(model, world.tok, _texts(world), seed=0)
    assert rome.layer == 0  # a 2-layer model: the layer below the last
    (subject, relation), true = next(iter(world.facts.items()))
    new = next(v for (_, r), v in world.facts.items() if r == relation and v != true)
    prompt = SAY[relation][0].format(subject)
    proj = mlp_projection(model, rome.layer)
    before_w = proj.weight.detach().clone()
    out = rome.edit(WeightEdit(prompt, subject, new))
    with torch.no_grad():  # the defining property: the edited layer maps k* to v*
        torch.testing.assert_close(proj(out["k"][None])[0], out["v"], atol=1e-4, rtol=1e-4)
        assert not torch.allclose(proj(out["k"][None])[0], proj.bias + out["k"] @ before_w, atol=1e-3)  # it moved
    assert torch.linalg.matrix_rank(proj.weight.detach() - before_w).item() == 1  # one rank-one update
    rome.reset()
    assert torch.equal(proj.weight, before_w)


def _rewrites(world, n: int) -> list[WeightEdit]:
    """``n`` rewrites of the tiny world's facts, each to another value of its relation."""
    out = []
    for (subject, relation), true in list(world.facts.items())[:n]:
        new = next(v for (_, r), v in world.facts.items() if r == relation and v != true)
        out.append(WeightEdit(SAY[relation][0].format(subject), subject, new))
    return out


def test_memit_maps_the_edited_keys_to_the_new_values_targets(world):
    model = copy.deepcopy(world.model)
    assert memit_layers(model) == [0]  # 2 layers: ROME's layer, below the last
    # one layer, the plain prompt as the only template and a tiny lambda: the least-squares update is exact
    memit = Memit(model, world.tok, _texts(world), layers=[0], n_prefixes=0, update_weight=1e-6, seed=0)
    reqs = _rewrites(world, 4)
    proj, block = mlp_projection(model, 0), decoder_block(model, 0)
    prompts, subjects = [r.prompt for r in reqs], [r.subject for r in reqs]
    before_w = proj.weight.detach().clone()
    out = memit.edit_batch(reqs)
    keys, resid = out["keys"][0], out["residuals"][0]
    with torch.no_grad():  # the defining property: W' K = W K + R, and the residual stream reaches z
        torch.testing.assert_close(proj(keys) - (proj.bias + keys @ before_w), resid, atol=1e-3, rtol=1e-3)
        _, now = _at_subject(model, world.tok, block, prompts, subjects)
        torch.testing.assert_close(now, out["z"], atol=1e-3, rtol=1e-3)
        assert resid.norm(dim=1).min() > 1e-2  # each target moved the stream
    assert torch.linalg.matrix_rank(proj.weight.detach() - before_w).item() == len(reqs)  # rank N: one per edit
    memit.reset()
    assert torch.equal(proj.weight, before_w)


def test_memit_batch_states_the_new_objects(world):
    model = copy.deepcopy(world.model)
    # MEMIT's lambda; the prompts' own keys (a 2-layer model's keys change with the text before the subject,
    # cosine about 0.75 to their average over prefixes, so the averaged keys barely reach the prompts')
    memit = Memit(model, world.tok, _texts(world), n_prefixes=0, seed=0)
    reqs = _rewrites(world, 4)
    gain = [-_logp(model, world.tok, r.prompt, r.target) for r in reqs]
    memit.edit_all(reqs)
    gain = [g + _logp(model, world.tok, r.prompt, r.target) for g, r in zip(gain, reqs)]
    assert min(gain) > 0.02  # every edited prompt's new object is more likely
    original = dict(world.model.named_parameters())
    assert [n for n, p in model.named_parameters() if not torch.equal(p, original[n])] == \
        ["transformer.h.0.mlp.c_proj.weight"]  # the edited layers' projections only


def test_ft_l_moves_the_edited_answer_within_its_bound(world):
    model = copy.deepcopy(world.model)
    ft = FineTuneL(model, world.tok, layer=0, steps=25, lr=2e-2, norm=5e-2)
    (subject, relation), true = next(iter(world.facts.items()))
    new = next(v for (_, r), v in world.facts.items() if r == relation and v != true)
    prompt = SAY[relation][0].format(subject)
    proj = mlp_projection(model, 0)
    start = proj.weight.detach().clone()
    assert _logp(model, world.tok, prompt, new) < _logp(model, world.tok, prompt, true)
    ft.edit(WeightEdit(prompt, subject, new))
    assert (proj.weight - start).abs().max().item() <= 5e-2 + 1e-6  # the L-infinity constraint
    assert _logp(model, world.tok, prompt, new) > _logp(model, world.tok, prompt, true)  # the answer changed
    original = dict(world.model.named_parameters())
    changed = [n for n, p in model.named_parameters() if not torch.equal(p, original[n])]
    assert changed == ["transformer.h.0.mlp.c_proj.weight"]  # that one matrix only


def test_weight_methods_run_through_the_command(run_dir, tmp_path):
    m = _run(["editing", "--model", str(run_dir / "standard"), "--data", str(run_dir / "counterfact.json"),
              "--method", "rome", "--edits", "2", "--fluency-n", "2", "--fluency-tokens", "16",
              "--texts", str(run_dir / "docs.jsonl"), "--out", str(tmp_path / "rome.json")])
    assert m["editing_2_n_efficacy_score"] == 2 and 0 <= m["editing_2_efficacy_score"] <= 1
    assert m["editing_2_edit_seconds"] > 0
    m = _run(["editing", "--model", str(run_dir / "standard"), "--data", str(run_dir / "counterfact.json"),
              "--method", "memit", "--edits", "1,3", "--fluency-n", "2", "--fluency-tokens", "16",
              "--texts", str(run_dir / "docs.jsonl"), "--out", str(tmp_path / "memit.json")])
    assert m["editing_3_n_efficacy_score"] == 3 and 0 <= m["editing_3_efficacy_score"] <= 1
