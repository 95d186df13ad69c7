"""Decoding options around lookups: stop strings, streaming, penalties, beams and sampling under the
prefix-tree constraint, calls forced at given positions."""

from __future__ import annotations

import pytest
from gen_support import FIRST, make_kb

from lmlm.generate import LookupGenerator, call_spans

RANDOM_SEED = 2  # the random_model fixture's weights


def test_stop_strings_count_only_outside_calls(world, kb):
    gen = LookupGenerator(world.model, world.tok, kb)
    people = world.people[:6]
    stops = [c for _, c, _ in people] + ["."]
    results = gen.generate([f"{n} was born in" for n, _, _ in people], max_new_tokens=40, stop_strings=stops)
    stopped = 0
    for r, (name, city, _) in zip(results, people):
        # the city inside the call does not stop the row (the call is finished) ...
        assert r.trace[0].value == city and r.trace[0].problem is None
        if len(r.token_ids) < 40:  # ... the text after a call does
            stopped += 1
            assert r.clean_text.endswith(tuple(stops)) and r.clean_text.count(".") <= 1 and not r.problems
    assert stopped >= 3
    with pytest.raises(ValueError, match="ignore_eos"):
        gen.generate(["Ada"], stop_strings=["."], ignore_eos=True)


def test_stream_matches_generate(world, kb):
    gen = LookupGenerator(world.model, world.tok, kb)
    prompt = f"{world.people[3][0]} works as a {world.people[3][2]}. {world.people[3][0]} was born in"
    expected = gen.generate([prompt], max_new_tokens=40)[0]
    events = list(gen.stream(prompt, max_new_tokens=40))
    result = events[-1].result
    assert result is not None and result.token_ids == expected.token_ids and result.text == expected.text
    lookups = [e.lookup for e in events if e.lookup is not None]
    assert [(t.value, t.status, t.token_start) for t in lookups] == \
        [(t.value, t.status, t.token_start) for t in expected.trace]
    spans, _ = call_spans(expected.token_ids, world.tok)
    inside = {i for sp in spans for i in range(sp.start, (sp.end if sp.end is not None else 10 ** 6) + 1)}
    org = [t for i, t in enumerate(expected.token_ids) if i not in inside]
    # the pieces add up to the clean text, which is the text outside the calls (the prompt ends in a word:
    # the space before the value's word stays)
    assert "".join(e.text for e in events) == expected.clean_text == world.tok.hf.decode(org)
    # the first text piece comes before the lookup event that follows it in the ids
    assert events.index(next(e for e in events if e.lookup)) > 0 or expected.token_ids[0] == world.tok.start_id
    # a forced call at the prompt's end is streamed as a lookup too; stopping early ends the thread
    forced = gen.stream(prompt, max_new_tokens=40, force_lookup=True)
    first = next(e for e in forced if e.lookup is not None)
    forced.close()
    assert first.lookup.token_start == 0 and first.lookup.found
    with pytest.raises(ValueError, match="beam"):
        list(gen.stream(prompt, num_beams=2))


def test_repetition_penalty_keeps_values(world, kb):
    gen = LookupGenerator(world.model, world.tok, kb)
    prompts = [f"{n} was born in" for n, _, _ in world.people[:8]]
    plain = gen.generate(prompts, max_new_tokens=40)
    penalised = gen.generate(prompts, max_new_tokens=40, repetition_penalty=3.0)
    assert [r.token_ids for r in plain] != [r.token_ids for r in penalised]
    for r in penalised:  # the value and <|db_end|> are forced whatever the penalty says
        for t in r.trace:
            if t.found:
                assert t.value == world.facts[(t.matched_entity, t.matched_relation)]


@pytest.mark.parametrize("mode", ["greedy", "beams", "sampling"])
def test_constrained_queries_are_kb_keys(world, kb, random_model, mode):
    """A random model pushed to look things up writes only queries the KB holds."""
    # the paper's key match: entity matching would refuse a random key about someone the text does not name
    gen = LookupGenerator(random_model, world.tok, kb, constrained=True, logit_bias=(30, 30, 30, 30),
                          max_field_tokens=3, matching="key")
    kw = {"greedy": {}, "beams": dict(num_beams=3), "sampling": dict(do_sample=True, seed=0, top_k=20)}[mode]
    results = gen.generate([f"{w} {w}" for w in FIRST[:8]], max_new_tokens=60, batch_size=4, **kw)
    finished = [t for r in results for t in r.trace if t.status != "unfinished"]
    assert len(finished) >= 8
    for t in finished:  # exact keys, not cut at max_field_tokens (the tree ends every query)
        assert (t.query_entity, t.query_relation) in world.facts and t.status == "exact", t
        assert t.value == world.facts[(t.query_entity, t.query_relation)] and t.problem is None


def test_constraint_follows_deletes(world, tmp_path, random_model):
    kb = make_kb(world, str(tmp_path / "kb"))
    gen = LookupGenerator(random_model, world.tok, kb, constrained=True, logit_bias=(30, 30, 30, 30))
    prompts = [f"{w} {w}" for w in FIRST[:6]]
    before = {t.query_entity for r in gen.generate(prompts, max_new_tokens=60) for t in r.trace}
    gone = sorted(before)[0]
    kb.delete(entity=gone, why="test")
    after = [t for r in gen.generate(prompts, max_new_tokens=60) for t in r.trace if t.status != "unfinished"]
    assert after and all(t.query_entity != gone and (t.query_entity, t.query_relation) in world.facts for t in after)
    with pytest.raises(ValueError, match="constrained"):
        LookupGenerator(random_model, world.tok, None, constrained=True)


def test_force_lookup_at_offsets(world, kb):
    """With the start marker pushed far down, calls begin exactly where they are forced."""
    gen = LookupGenerator(world.model, world.tok, kb, logit_bias=(-30.0, 0.0, 0.0, 0.0))
    prompts = [f"{n} works as a" for n, _, _ in world.people[:4]]
    assert not any(r.trace for r in gen.generate(prompts, max_new_tokens=30))
    for kw in (dict(), dict(num_beams=2)):
        for r in gen.generate(prompts, max_new_tokens=80, force_lookup_at=[0, 3, 30], **kw):
            spans, _ = call_spans(r.token_ids, world.tok)
            assert [sp.start for sp in spans][:1] == [0] and len(spans) == 3
            # a call owed while another is open begins right after that one ends
            assert spans[1].start == spans[0].end + 1 and spans[2].start == max(30, spans[1].end + 1)
            assert all(t.query_entity for t in r.trace)
    per_prompt = gen.generate(prompts[:2], max_new_tokens=30, force_lookup_at=[[5], []])
    assert call_spans(per_prompt[0].token_ids, world.tok)[0][0].start == 5 and per_prompt[1].trace == []
    with pytest.raises(ValueError, match="one list of offsets per prompt"):
        gen.generate(prompts, force_lookup_at=[[1], [2]])


def test_ignore_eos_runs_to_the_limit(world, kb):
    """Document separators become ordinary tokens; other Hugging Face options pass through."""
    gen = LookupGenerator(world.model, world.tok, kb)
    prompts = [f"{n} was born in" for n, _, _ in world.people[:4]]
    eos_first = {(world.tok.eos_id,): 30.0}  # Hugging Face's sequence_bias, passed through
    assert all(r.token_ids == [] for r in gen.generate(prompts, max_new_tokens=30, sequence_bias=eos_first))
    full = gen.generate(prompts, max_new_tokens=30, ignore_eos=True, sequence_bias=eos_first)
    assert all(len(r.token_ids) == 30 and world.tok.eos_id in r.token_ids for r in full)
    assert gen.generate(prompts[:1], max_new_tokens=0)[0].token_ids == []
    # an id suppressed is never drawn, however favoured: the text runs its length in words
    held = gen.generate(prompts, max_new_tokens=30, ignore_eos=True, sequence_bias=eos_first,
                        suppress_ids=[world.tok.eos_id])
    assert all(len(r.token_ids) == 30 and world.tok.eos_id not in r.token_ids for r in held)
    with pytest.raises(ValueError, match="call markers"):
        gen.generate(prompts, suppress_ids=[world.tok.start_id])


@pytest.mark.parametrize("batch_size", [1, 4])
def test_own_loop_matches_model_generate(world, kb, batch_size):
    """The engine's loop (values fed in one forward at batch 1) and Hugging Face's generate agree."""
    ours = LookupGenerator(world.model, world.tok, kb)
    hf = LookupGenerator(world.model, world.tok, kb, loop=False)
    prompts = [f"{n} was born in" for n, _, _ in world.people[:8]] + ["The", f"{world.people[9][0]} works"]
    kwargs = dict(max_new_tokens=48, batch_size=batch_size, ignore_eos=True)
    a, b = ours.generate(prompts, **kwargs), hf.generate(prompts, **kwargs)
    assert [r.token_ids for r in a] == [r.token_ids for r in b]
    assert sum(len(r.trace) for r in a) >= 8 and all(len(r.token_ids) == 48 for r in a)
    # a value cut by the token limit: the forced tail stops at max_new_tokens
    first = a[0].trace[0]
    cut = ours.generate(prompts[:1], max_new_tokens=first.token_end - 1, batch_size=1, ignore_eos=True)[0]
    assert cut.token_ids == a[0].token_ids[:first.token_end - 1]
    # sampling through the loop is reproducible with a seed
    s1 = ours.generate(prompts[:2], do_sample=True, seed=5, max_new_tokens=32, batch_size=1)
    s2 = ours.generate(prompts[:2], do_sample=True, seed=5, max_new_tokens=32, batch_size=1)
    assert [r.token_ids for r in s1] == [r.token_ids for r in s2]


def test_vanishing_temperature_samples_the_argmax(world, kb):
    """A temperature so small that the logits overflow is greedy decoding, not a crash."""
    gen = LookupGenerator(world.model, world.tok, kb)
    prompts = [f"{n} was born in" for n, _, _ in world.people[:3]]
    greedy = gen.generate(prompts, max_new_tokens=24, batch_size=3, ignore_eos=True)
    tiny = gen.generate(prompts, max_new_tokens=24, batch_size=3, ignore_eos=True, do_sample=True,
                        temperature=7.8e-41, seed=0)
    assert [r.token_ids for r in tiny] == [r.token_ids for r in greedy]


def test_forced_tokens_join_the_chosen_one_at_batch_one(world, kb, random_model):
    """At batch 1 the tokens the grammar forces (a call due at an offset, the only way on in the
    prefix tree, the value) go through the model together with the token chosen before them: the
    same tokens as Hugging Face's generate, in fewer forwards."""
    kw = dict(constrained=True, logit_bias=None, matching="key")  # a random model's keys, on no text's person
    ours = LookupGenerator(random_model, world.tok, kb, **kw)
    hf = LookupGenerator(random_model, world.tok, kb, loop=False, **kw)
    prompts = [f"{w} {w}" for w in FIRST[:4]]
    run = dict(max_new_tokens=64, batch_size=1, ignore_eos=True, force_lookup_at=[0, 22, 44])
    forwards = []
    hook = random_model.register_forward_hook(lambda module, args, out: forwards.append(1))
    try:
        a = ours.generate(prompts, **run)
    finally:
        hook.remove()
    b = hf.generate(prompts, **run)
    assert [r.token_ids for r in a] == [r.token_ids for r in b]
    calls = [t for r in a for t in r.trace if t.status != "unfinished"]
    assert len(calls) >= 8 and all(t.status == "exact" for t in calls)
    assert len(forwards) < 0.6 * sum(len(r.token_ids) for r in a)
    cut = ours.generate(prompts[:1], **{**run, "max_new_tokens": 5})[0]  # a jump stops at the token limit
    assert cut.token_ids == a[0].token_ids[:5]
