"""Lookup-interleaved decoding with a tiny GPT-2 trained here on an annotated biography corpus."""

from __future__ import annotations

import random

import pytest
import torch
from gen_support import FIRST, bio_prompts, make_kb

from lmlm.generate import LookupGenerator, LookupLogitsProcessor, call_spans
from lmlm.kb import KnowledgeBase, Triple
from lmlm.lookup import Lookup

RANDOM_SEED = 1  # the random_model fixture's weights


class CountingKB:
    """Wraps a KB and records each ``lookup_batch`` call."""

    def __init__(self, kb):
        self.kb, self.calls = kb, []

    def lookup_batch(self, queries):
        self.calls.append(list(queries))
        return self.kb.lookup_batch(queries)


def test_lookup_value_comes_from_the_kb(world):
    prompts = [f"{name} was born in" for name, _, _ in world.people[:10]]
    kb = make_kb(world)
    counting = CountingKB(kb)
    gen = LookupGenerator(world.model, world.tok, counting)
    for r, (name, city, _) in zip(gen.generate(prompts, max_new_tokens=40), world.people):
        assert r.trace and r.trace[0].found and r.trace[0].query_entity == name
        assert r.trace[0].value == city
        assert r.text.startswith(f"[dblookup('{name}', 'Birth City') -> {city}]")
    assert counting.calls[0] == [(n, "Birth City") for n, _, _ in world.people[:10]]  # one call for all rows
    # edit the KB: the same model, unchanged, now writes the new answers
    moved = {name: "Cairo" if city != "Cairo" else "Oslo" for name, city, _ in world.people[:10]}
    for name, new in moved.items():
        version = kb.edit(name, "Birth City", new)
    for r, name in zip(gen.generate(prompts, max_new_tokens=40), moved):
        new = moved[name]
        assert r.trace[0].value == new and r.trace[0].kb_version == version
        assert r.text.startswith(f"[dblookup('{name}', 'Birth City') -> {new}]")
    # whether the model then copies the new value into its text is a property of a trained model,
    # measured at scale by the quickstart's ``edits`` metric; this 2-layer model often does not


def test_batched_equals_single_row(world):
    gen = LookupGenerator(world.model, world.tok, make_kb(world))
    prompts = bio_prompts(world) + ["Ada", "Hugo Moss works", "The"]
    batched = gen.generate(prompts, max_new_tokens=40, batch_size=16)
    single = [gen.generate([p], max_new_tokens=40)[0] for p in prompts]
    assert [r.token_ids for r in batched] == [r.token_ids for r in single]
    assert [r.text for r in batched] == [r.text for r in single]
    assert sum(bool(r.trace) for r in batched) >= 25


def test_without_db_no_lookup_tokens(world):
    gen = LookupGenerator(world.model, world.tok, None, use_db=False, logit_bias=(30, 30, 30, 30))
    for r in gen.generate(bio_prompts(world, 12), max_new_tokens=30):
        assert not set(r.token_ids) & set(world.tok.call_ids)
        assert r.trace == [] and r.text == r.clean_text
    with pytest.raises(ValueError, match="force_lookup"):
        gen.generate(["Ada"], force_lookup=True)


def test_force_lookup(world):
    gen = LookupGenerator(world.model, world.tok, make_kb(world))
    names = [name for name, _, _ in world.people[:6]]
    for name, r in zip(names, gen.generate([f"{n} works as a" for n in names], force_lookup=True, max_new_tokens=30)):
        assert r.token_ids[0] == world.tok.start_id and r.trace[0].token_start == 0
        assert r.trace[0].query_entity == name and r.trace[0].found
    # a prompt the model would not look up after still gets a call
    r = gen.generate(["The"], force_lookup=True, max_new_tokens=60)[0]
    assert r.token_ids[0] == world.tok.start_id and len(r.trace) >= 1


def test_complete_call(world):
    gen = LookupGenerator(world.model, world.tok, None)
    people = world.people[:8]
    prefixes = [gen.prompt_ids(f"{n} was born in", force_lookup=True) for n, _, _ in people]
    queries = gen.complete_call(prefixes, batch_size=3)
    assert queries == [(n, "Birth City") for n, _, _ in people]
    with pytest.raises(ValueError, match="must end with"):
        gen.complete_call([[world.tok.doc_id]])


def test_trace_fields(world):
    tok = world.tok
    kb = make_kb(world)
    (gone, _, _), (kept, city, _) = world.people[2], world.people[4]
    kb.delete(entity=gone, relation="Birth City")
    prompts = [f"{gone} was born in", f"{kept} was born in"]
    missing, found = LookupGenerator(world.model, tok, kb).generate(prompts, max_new_tokens=40)
    for r in (missing, found):  # the positions slice the call out of token_ids
        t = r.trace[0]
        ids = r.token_ids
        assert ids[t.token_start] == tok.start_id and ids[t.token_end - 1] == tok.end_id
        retrieve = ids.index(tok.retrieve_id, t.token_start)
        assert tok.decode_field(ids[retrieve + 1:t.token_end - 1]) == t.value
        assert tok.decode_field(ids[t.token_start + 1:ids.index(tok.sep_id)]) == t.query_entity
    t = found.trace[0]
    record = kb.get(t.triple_id)
    assert (t.matched_entity, t.matched_relation, t.value, t.score) == (kept, "Birth City", city, 1.0)
    assert t.status == "exact" and t.problem is None
    assert (record.entity, record.value) == (kept, city)
    assert t.sources == (f"bio-{kept}",) and t.kb_version == kb.version == 2
    t = missing.trace[0]  # entity-aware: the person is there, the relation is not; a miss that says so
    assert t.query_entity == gone and not t.found and t.value == "unknown" and t.status == "fallback"
    assert t.miss_reason == "no_relation" and t.matched_entity is None and "Birth City" in t.miss_detail
    paper = LookupGenerator(world.model, tok, kb, matching="key").generate(prompts[:1], max_new_tokens=40)[0]
    t = paper.trace[0]  # the paper's single-key match: the nearest key stands in (fuzzy match) ...
    assert t.query_entity == gone and t.found and (t.matched_entity, t.matched_relation) != (gone, "Birth City")
    assert t.score < 1.0 and t.value == world.facts[(t.matched_entity, t.matched_relation)]
    assert t.status == "fuzzy" and t.via == "key"
    kb.threshold = 1.01  # ... unless nothing is close enough
    r = LookupGenerator(world.model, tok, kb, matching="key").generate(prompts[:1], max_new_tokens=40)[0]
    t = r.trace[0]
    assert (t.found, t.value, t.matched_entity, t.triple_id, t.kb_version) == (False, "unknown", None, None, 2)
    assert t.status == "fallback" and t.miss_reason == "below_threshold"
    # the nearest key anyway (the authors' top1_anyway), marked as below the threshold
    r = LookupGenerator(world.model, tok, kb, on_miss="nearest").generate(prompts[:1], max_new_tokens=40)[0]
    t = r.trace[0]
    assert t.status == "nearest" and t.found and t.score < 1.01
    assert (t.matched_entity, t.matched_relation) != (gone, "Birth City")
    assert t.value == world.facts[(t.matched_entity, t.matched_relation)]
    # ... but never for a deleted entity: its nearest key is someone else's
    kb.delete(entity=gone)
    r = LookupGenerator(world.model, tok, kb, on_miss="nearest").generate(prompts[:1], max_new_tokens=40)[0]
    t = r.trace[0]
    assert t.query_entity == gone and (t.status, t.found, t.value) == ("fallback", False, "unknown")
    assert t.miss_reason == "no_entity" and "deleted" in t.miss_detail and t.matched_entity is None
    r = LookupGenerator(world.model, tok, kb, fallback="n/a").generate(prompts[:1], max_new_tokens=40)[0]
    assert (r.trace[0].value, r.trace[0].status) == ("n/a", "fallback")
    # fallback=None closes an unanswered call at once
    r = LookupGenerator(world.model, tok, kb, fallback=None).generate(prompts[:1], max_new_tokens=40)[0]
    t = r.trace[0]
    assert t.value == "" and r.token_ids[t.token_end - 2] == tok.retrieve_id and t.status == "skipped"
    skip = LookupGenerator(world.model, tok, kb, on_miss="skip").generate(prompts[:1], max_new_tokens=40)[0]
    assert skip.token_ids == r.token_ids  # the same policy by name


def test_sampling_is_reproducible(world):
    kb = make_kb(world)
    gen = LookupGenerator(world.model, world.tok, kb)
    prompts = bio_prompts(world, 8)
    kw = dict(max_new_tokens=30, do_sample=True, temperature=1.5, top_k=50, top_p=0.95)
    a = gen.generate(prompts, seed=3, **kw)
    b = gen.generate(prompts, seed=3, **kw)
    c = gen.generate(prompts, seed=4, **kw)
    assert [r.token_ids for r in a] == [r.token_ids for r in b]
    assert [r.token_ids for r in a] != [r.token_ids for r in c]
    for r in a + c:  # values are forced whatever is sampled
        for t in r.trace:
            if t.status in ("unfinished", "unanswered"):  # cut by max_new_tokens before or at <|db_retrieve|>
                assert t.value == "" and "unfinished" in t.problem
                continue
            assert t.value == (world.facts[(t.matched_entity, t.matched_relation)] if t.found else "unknown")


def test_beam_search_runs(world):
    gen = LookupGenerator(world.model, world.tok, make_kb(world))
    r = gen.generate(["Ada Lind was born in"], max_new_tokens=30, num_beams=3)[0]
    assert r.trace[0].value == world.facts[("Ada Lind", "Birth City")]


# -- a random model pushed hard towards the lookup tokens -------------------------------------

def test_random_model_terminates_within_limits(world, random_model):
    tok = world.tok
    gen = LookupGenerator(random_model, tok, make_kb(world), logit_bias=(30, 30, 30, 30), max_field_tokens=3)
    for force in (False, True):
        for r in gen.generate([f"{w} {w}" for w in FIRST], max_new_tokens=50, force_lookup=force):
            assert len(r.token_ids) <= 50 + force
            spans, stray = call_spans(r.token_ids, tok)
            assert stray == [] and spans
            assert all(sp.end is not None for sp in spans[:-1])  # only the last call may be cut off
            for sp in spans:  # fields are non-empty and within max_field_tokens
                if sp.sep is not None:
                    assert 1 <= sp.sep - sp.start - 1 <= 3
                if sp.retrieve is not None:
                    assert 1 <= sp.retrieve - sp.sep - 1 <= 3
            if spans[-1].end is None:
                assert any("unfinished" in p for p in r.problems)
            assert len(r.trace) == len(spans)  # every call is traced, finished or not
            for sp, t in zip(spans, r.trace):
                assert t.token_start == sp.start
                if sp.retrieve is None:
                    assert t.status == "unfinished" and t.value == "" and "unfinished" in t.problem
                elif not t.found:
                    assert t.value == "unknown" and t.status == "fallback"
                if sp.sep is not None and sp.sep - sp.start - 1 == 3:
                    assert "cut at max_field_tokens=3" in t.problem
    # prompts holding half a call: the call is finished, its markers reported as out of place
    for r in gen.generate(["<|sep|> Ada", "Ada <|db_retrieve|>", "<|db_end|>"], max_new_tokens=50):
        assert len(r.token_ids) <= 50
    assert all("outside a call" in r.problems[0] for r in gen.generate(["<|sep|> Ada", "Ada <|db_retrieve|>"]))
    cut = gen.generate(FIRST[:4], max_new_tokens=2, force_lookup=True)
    assert all(len(r.token_ids) == 3 and "unfinished" in r.problems[0] for r in cut)


def test_max_lookups(world, random_model):
    tok = world.tok
    for limit in (0, 2):
        gen = LookupGenerator(random_model, tok, None, logit_bias=(30, 30, 30, 30), max_lookups=limit)
        for r in gen.generate([f"{w} was" for w in FIRST[:6]], max_new_tokens=60):
            assert r.token_ids.count(tok.start_id) == limit and len(r.trace) == limit


def test_processor_grammar_and_arguments(world):
    tok = world.tok
    proc = LookupLogitsProcessor(tok, logit_bias=None)
    vocab = len(tok)
    rows = torch.tensor([[tok.doc_id, tok.start_id], [tok.start_id, 5], [tok.doc_id, 5]])
    scores = proc(rows, torch.zeros(3, vocab))
    banned = torch.isinf(scores)
    assert banned[0, tok.sep_id] and banned[0, tok.eos_id] and not banned[1, tok.sep_id]
    assert banned[2, tok.sep_id] and banned[2, tok.end_id] and not banned[2, tok.start_id]
    biased = LookupLogitsProcessor(tok)(rows[2:], torch.zeros(1, vocab))
    assert biased[0, tok.start_id] == 5.0 and biased[0, 5] == 0.0
    for bad in (dict(logit_bias=(1.0, 2.0)), dict(max_lookups=-1), dict(max_field_tokens=0), dict(fallback=3),
                dict(on_miss="guess"), dict(force_at=[[-1]])):
        with pytest.raises(ValueError, match=next(iter(bad))):
            LookupLogitsProcessor(tok, **bad)


def test_processor_tracking_matches_a_full_scan(world):
    """Reading only each step's new column plans the same as scanning all the ids, rows reordered or not."""
    tok = world.tok
    gen = LookupGenerator(world.model, tok, None, max_lookups=2, max_field_tokens=3)
    proc = gen.processor(count_from=2, force_at=[[4, 40]] * 3)
    rng = random.Random(0)
    ids = torch.tensor([[tok.doc_id, 5], [tok.doc_id, tok.start_id], [5, 6]])
    pool = [5, 6, 7, 8, *tok.call_ids]
    for step in range(80):
        fresh = gen.processor(count_from=2, force_at=[[4, 40]] * 3, cache=proc.cache)
        assert proc.plan(ids) == fresh.plan(ids), step
        ids = torch.cat([ids, torch.tensor([[rng.choice(pool)] for _ in range(3)])], dim=1)
        if step in (30, 31, 60):
            ids = ids[[2, 0, 1]]  # rows reordered, as beam search does


def test_a_prompt_beyond_the_context_is_refused_and_generation_stops_at_its_end(world):
    kb = make_kb(world)
    gen = LookupGenerator(world.model, world.tok, kb)
    name = world.people[0][0]
    long_prompt = " ".join([f"{name} was born in"] * 200)  # far more than the 256 positions
    with pytest.raises(ValueError, match=r"prompt 2 is \d+ tokens, the model's context is 256 positions"):
        gen.generate([f"{name} was born in", long_prompt], max_new_tokens=8)
    k = 1
    while len(gen.prompt_ids(" ".join([f"{name} works as a"] * (k + 1)))) < 240:
        k += 1
    near = " ".join([f"{name} works as a"] * k)
    n = len(gen.prompt_ids(near))
    assert 200 < n < 240
    with pytest.warns(UserWarning, match="context of 256 positions"):  # GPT-2's positions end at 256
        (r,) = gen.generate([near], max_new_tokens=200, ignore_eos=True)
    assert 0 < len(r.token_ids) <= 256 - n


def test_generation_past_a_rotary_models_trained_context_warns(world):
    """LLaMA's rotary positions run on past ``max_position_embeddings`` (128 for llama-tiny); generating
    there is said once, not done silently, and the rows still get every token asked for."""
    import warnings

    from lmlm.models import build_model

    model = build_model("llama-tiny", len(world.tok), world.tok, seed=0).eval()
    gen = LookupGenerator(model, world.tok, make_kb(world))
    with pytest.warns(UserWarning, match="trained context of 128 positions"):
        (r,) = gen.generate(["Ada was born in"], max_new_tokens=130, ignore_eos=True)
    assert len(r.token_ids) == 130
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        LookupGenerator(model, world.tok, gen.kb).generate(["Ada was born in"], max_new_tokens=8,
                                                           ignore_eos=True)  # within it: nothing said


def test_copy_bias_favours_the_answered_value_and_a_value_begun_is_finished(world, tmp_path):
    from lmlm.kb import get_encoder

    tok = world.tok
    kb = KnowledgeBase.create(tmp_path / "kb", encoder=get_encoder())
    kb.add([Triple("Ada Lovelace", "Birth City", "Port Jamesville")], who="t")
    with pytest.raises(ValueError, match="copy_bias"):
        LookupLogitsProcessor(tok, kb, copy_bias=-1.0)

    def after_call(entity: str) -> tuple[LookupLogitsProcessor, torch.Tensor, list[int]]:
        """A processor that has decoded a call about ``entity`` up to its <|db_end|>, step by step."""
        proc = LookupLogitsProcessor(tok, kb, logit_bias=None, copy_bias=4.0)
        ids = [tok.doc_id, *tok.encode_text(f"{entity} was born in"), tok.start_id, *tok.encode_field(entity),
               tok.sep_id, *tok.encode_field("Birth City"), tok.retrieve_id]
        while True:  # the grammar forces the value and <|db_end|>
            scores = proc(torch.tensor([ids]), torch.zeros(1, len(tok)))
            ids.append(int(scores[0].argmax()))
            if ids[-1] == tok.end_id:
                return proc, torch.tensor([ids]), ids

    proc, ids, row = after_call("Ada Lovelace")
    value = tok.encode_field("Port Jamesville")
    assert row[-1 - len(value):-1] == value
    assert len(value) > 2
    scores = proc(ids, torch.zeros(1, len(tok)))  # right after the call: the value's first token, and only it, gains
    assert scores[0, value[0]] == 4.0 and int((scores[0] == 4.0).sum()) == 1
    for k in range(1, len(value)):  # the text has begun the value: each next token of it is the only choice
        ids = torch.cat([ids, torch.tensor([[value[k - 1]]])], dim=1)
        scores = proc(ids, torch.randn(1, len(tok)))
        assert scores[0, value[k]] == 0.0 and int(torch.isfinite(scores[0]).sum()) == 1
    ids = torch.cat([ids, torch.tensor([[value[-1]]])], dim=1)
    assert torch.isfinite(proc(ids, torch.zeros(1, len(tok)))).sum() > 1  # the value is stated: the model goes on
    # a row that wrote something else has left the value
    proc, ids, _ = after_call("Ada Lovelace")
    other = next(t for t in range(len(tok)) if t != value[0] and t not in tok.call_ids)
    assert not (proc(torch.cat([ids, torch.tensor([[other]])], dim=1), torch.zeros(1, len(tok))) == 4.0).any()
    # a miss forces the fallback text, which is never copied
    proc, ids, _ = after_call("Nobody Known")
    assert not (proc(ids, torch.zeros(1, len(tok))) == 4.0).any()
    kb.close()


def test_name_bias_keeps_a_query_on_the_names_the_text_gives(world, tmp_path):
    from lmlm.kb import get_encoder

    tok = world.tok
    kb = KnowledgeBase.create(tmp_path / "names", encoder=get_encoder())
    kb.add([Triple("Heather Thomas", "Birth City", "Oslo"), Triple("Heather Hartman", "Birth City", "Lima")], who="t")
    with pytest.raises(ValueError, match="name_bias"):
        LookupLogitsProcessor(tok, kb, name_bias=float("inf"))

    def biased(text: str, written: list[int]) -> set[int]:
        """The tokens a fresh processor favours after ``text`` and a call's entity so far."""
        proc = LookupLogitsProcessor(tok, kb, logit_bias=None, name_bias=3.0)
        scores = proc(torch.tensor([[tok.doc_id, *tok.encode_text(text), tok.start_id, *written]]),
                      torch.zeros(1, len(tok)))
        return set((scores[0] == 3.0).nonzero()[:, 0].tolist())

    thomas, hartman = tok.encode_field("Heather Thomas"), tok.encode_field("Heather Hartman")
    k = next(i for i, (a, b) in enumerate(zip(thomas, hartman)) if a != b)  # where the two names part
    for n in range(len(thomas)):  # the text names Heather Thomas alone: her name, token by token
        assert biased("Heather Thomas was born in", thomas[:n]) == {thomas[n]}
    assert biased("Heather Thomas was born in", thomas) == {tok.sep_id}  # the name is whole: close it
    assert biased("Heather Thomas was born in", hartman[:k + 1]) == set()  # off every name: left alone
    assert biased("She was born in", []) == set()  # a text that names no KB entity: nothing
    assert biased("Heather Thomas met Heather Hartman. She was born in", hartman[:k]) == {thomas[k], hartman[k]}
    # through the generator: someone the model never read about, added to the KB after training; the
    # model's own query slips to a name it was trained on, one with a bias no score can beat does not
    kb.add([Triple("Zed Quorra", "Occupation", "glazier")], who="t")
    prompts = ["Zed Quorra works as a", "Heather Hartman works as a"]
    plain = LookupGenerator(world.model, tok, kb).generate(prompts, max_new_tokens=12, force_lookup=True)
    assert plain[0].trace[0].query_entity != "Zed Quorra" and not plain[0].trace[0].found
    biased_gen = LookupGenerator(world.model, tok, kb, name_bias=1e4)
    for prompt, r in zip(prompts, biased_gen.generate(prompts, max_new_tokens=12, force_lookup=True)):
        assert r.trace[0].query_entity == prompt[:-len(" works as a")], r.text
    kb.close()


def test_a_call_cut_by_the_token_limit_leaves_no_marker_in_the_clean_text(world):
    gen = LookupGenerator(world.model, world.tok, make_kb(world))
    for n in (1, 3, 6):  # the forced call is still being written when the tokens run out
        r = gen.generate(["Ada Lind works as a"], max_new_tokens=n, force_lookup=True)[0]
        assert r.trace and r.trace[-1].status in ("unfinished", "unanswered")
        assert "<|db" not in r.clean_text and "Ada" not in r.clean_text, r.clean_text  # the query is no text
        assert "<|db_start|>" in r.text  # the annotated text keeps the call, marked unfinished in the trace


def test_the_clean_text_continues_the_prompt_with_the_space_before_a_looked_up_word(world):
    gen = LookupGenerator(world.model, world.tok, make_kb(world))
    prompts = [f"{name} works as a" for name, _, _ in world.people[:6]]
    opened = [r for r in gen.generate(prompts, max_new_tokens=24) if r.segments and isinstance(r.segments[0], Lookup)]
    assert opened  # the model opens a call right after "works as a"
    for r in opened:  # "... works as a" + " painter." reads as text; "painter." would glue the words
        assert r.clean_text.startswith(" ") and not r.clean_text.startswith("  "), r.clean_text


def test_after_a_lookup_that_found_nothing_the_text_goes_on_before_another_call(world, tmp_path):
    """A model that wrote [dblookup('Deepavali', 'Capital') -> unknown] wrote it again and again: after
    a miss the next token is text, in the Hugging Face processor and in the vLLM row grammar alike."""
    from lmlm.generate.rows import RowGrammar

    tok = world.tok
    kb = make_kb(world, str(tmp_path / "kb"))
    start = tok.start_id

    def closed(entity: str) -> tuple[LookupLogitsProcessor, list[int]]:
        proc = LookupLogitsProcessor(tok, kb, logit_bias=None)
        ids = [tok.doc_id, *tok.encode_text(f"{entity} was born in"), start, *tok.encode_field(entity),
               tok.sep_id, *tok.encode_field("Birth City"), tok.retrieve_id]
        while ids[-1] != tok.end_id:  # the grammar forces the value and <|db_end|>
            ids.append(int(proc(torch.tensor([ids]), torch.zeros(1, len(tok)))[0].argmax()))
        return proc, ids

    name = world.people[0][0]
    proc, hit = closed(name)
    assert not torch.isinf(proc(torch.tensor([hit]), torch.zeros(1, len(tok)))[0, start])  # answered: may call on
    proc, miss = closed("Nobody Known")
    assert torch.isinf(proc(torch.tensor([miss]), torch.zeros(1, len(tok)))[0, start])
    text = tok.encode_text(" and")
    assert not torch.isinf(proc(torch.tensor([miss + text]), torch.zeros(1, len(tok)))[0, start])  # text came first
    stops = [tok.eos_id, tok.doc_id]
    for missed, banned in ((True, True), (False, False)):
        row = RowGrammar(tok.call_ids, stops, missed=missed)
        assert bool(torch.isinf(row(miss, [], torch.zeros(len(tok)))[start])) is banned
        assert not torch.isinf(row(miss, text, torch.zeros(len(tok)))[start])
    kb.close()
