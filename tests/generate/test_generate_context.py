"""The text before a call goes with its query to the KB: a short name resolves to the person the
document names, answers that depend on it are cached per context, and a miss says why."""

from __future__ import annotations

import pytest

from lmlm.generate import Answerer, LookupGenerator
from lmlm.generate.answers import call_context
from lmlm.kb import KnowledgeBase, Triple


@pytest.fixture
def cousins(tmp_path):
    kb = KnowledgeBase.create(tmp_path / "kb")
    kb.add([Triple("Jasmine Mejia-Morris", "Birth City", "Lima"), Triple("Jasmine Mejia-Lopez", "Birth City", "Quito"),
            Triple("Timothy Frazier", "Birth City", "Denver")])
    yield kb
    kb.close()


def _key(tok, entity: str, relation: str):
    return tuple(tok.encode_field(entity)), tuple(tok.encode_field(relation))


def test_a_short_name_is_answered_for_the_person_the_text_names(world, cousins):
    tok = world.tok
    answers = Answerer(tok, cousins)
    key = _key(tok, "Jasmine Mejia", "Birth City")
    ctx_a = (tok.doc_id, *tok.encode_text("Jasmine Mejia-Morris was born in"))
    ctx_b = (tok.doc_id, *tok.encode_text("Jasmine Mejia-Lopez grew up by the sea. She was born in"))
    answers.resolve([key, key], [ctx_a, ctx_b])
    assert answers.get(key, ctx_a).value == "Lima" and answers.get(key, ctx_b).value == "Quito"
    assert answers.get(key, ctx_a).match.via == "context"
    assert key not in answers.cache  # the answer depends on the text, so it is cached with it
    # an exact name is answered when the text names that person, or no one of the KB; in a text about
    # someone else only, it is the model copying a name it has seen, and a miss that says so
    exact = _key(tok, "Timothy Frazier", "Birth City")
    ctx_t = (tok.doc_id, *tok.encode_text("Timothy Frazier was born in"))
    ctx_n = (tok.doc_id, *tok.encode_text("The new mayor was born in"))
    answers.resolve([exact, exact, exact], [ctx_t, ctx_a, ctx_n])
    assert answers.get(exact, ctx_t).value == "Denver" and answers.get(exact, ctx_n).value == "Denver"
    assert answers.get(exact, ctx_n).match.via == "exact"
    other = answers.get(exact, ctx_a).miss
    assert other.reason == "no_entity" and "never names 'Timothy Frazier'" in other.detail
    # a garbled name the text never wrote is not answered for the person it resembles
    garbled = _key(tok, "Timothy Frazer", "Birth City")
    answers.resolve([garbled, garbled], [ctx_t, ctx_a])
    assert answers.get(garbled, ctx_t).value == "Denver"
    assert answers.get(garbled, ctx_a).miss.reason == "no_entity"
    answers.resolve([exact])
    assert answers.get(exact).value == "Denver"  # asked with no text, as the KB API does
    # no context: the short name names no one, and the miss says so (the fallback value is written)
    answers.resolve([key])
    miss = answers.get(key)
    assert (miss.value, miss.status, miss.miss.reason) == ("unknown", "fallback", "no_entity")


def test_call_context_is_the_document_so_far(world):
    tok = world.tok
    row = [tok.eos_id, tok.eos_id, tok.doc_id, *tok.encode_text("Ada Lind was born in"), tok.start_id]
    text = tuple(tok.encode_text("Ada Lind was born in"))
    assert call_context(row, len(row) - 1, tok) == tuple(t for t in (tok.doc_id, *text) if t != tok.eos_id)
    assert Answerer(tok, None).context_text(call_context(row, len(row) - 1, tok)).strip() == "Ada Lind was born in"


def test_generation_trace_says_why_a_deleted_person_missed(world, tmp_path):
    kb = KnowledgeBase.create(tmp_path / "kb")
    kb.add([Triple(e, r, v) for (e, r), v in world.facts.items()])
    gone, other = world.people[0][0], world.people[1][0]
    kb.delete(entity=gone, who="t", why="forget")
    prompts = [f"{gone} was born in", f"{other} was born in"]
    for matching in ("entity", "key"):
        gen = LookupGenerator(world.model, world.tok, kb, matching=matching)
        r = gen.generate(prompts[:1], max_new_tokens=24, force_lookup=True)[0]
        t = r.trace[0]
        if matching == "entity":  # no namesake's fact: the miss value, and why
            assert not t.found and t.value == "unknown" and t.miss_reason == "no_entity"
            assert "deleted" in t.miss_detail
        else:  # the paper's single-key match answers with someone else's fact
            assert t.found and t.matched_entity != gone and t.via == "key"
    ok = LookupGenerator(world.model, world.tok, kb).generate(prompts[1:], max_new_tokens=24, force_lookup=True)[0]
    assert ok.trace[0].found and ok.trace[0].via in ("exact", "context", "fuzzy", "alias")


def test_a_name_the_model_only_queried_does_not_ground_the_next_call(world):
    tok = world.tok
    ids = [tok.doc_id, *tok.encode_text("Chad Lee was born in"), tok.start_id, *tok.encode_field("Chad Peterson"),
           tok.sep_id, *tok.encode_field("Birth City"), tok.retrieve_id, *tok.encode_field("Lima"), tok.end_id,
           *tok.encode_text(". He works as a")]
    text = Answerer(tok, None).context_text(ids)
    assert "Chad Lee" in text and "Lima" in text  # the text, and the value the KB gave (a next hop may name it)
    assert "Peterson" not in text and "Birth City" not in text  # not what the model wrote into the call


def test_a_prompt_ends_at_a_calls_retrieve_not_inside_its_value(world, kb):
    """The KB writes a call's value: a prompt ending after ``<|db_retrieve|>`` gets the KB's, one ending
    inside a value of its own is refused (the text held the prompt's value and the trace the KB's row)."""
    (name, relation), value = next(iter(world.facts.items()))
    gen = LookupGenerator(world.model, world.tok, kb)
    t = world.tok.tokens
    query = f"{name} was born in {t.start} {name} {t.sep} {relation} {t.retrieve}"
    r = gen.generate([query], max_new_tokens=12)[0]
    assert r.trace[0].value == value and r.text.startswith(f"[dblookup('{name}', '{relation}') -> {value}]")
    for prompt in (f"{query} Atlantis", f"{query} {value}"):
        with pytest.raises(ValueError, match="the prompt ends inside"):
            gen.generate([prompt], max_new_tokens=4)
        with pytest.raises(ValueError, match="the prompt ends inside"):
            list(gen.stream(prompt, max_new_tokens=4))


def test_a_name_refused_for_the_text_stays_refused_after_the_model_writes_it(world, cousins):
    """In a text about someone not in the KB, a call naming Timothy Frazier is refused (the text never
    names him); the model writing his name into the text afterwards does not make the next call his."""
    tok = world.tok
    answers = Answerer(tok, cousins)
    call = [tok.start_id, *tok.encode_field("Timothy Frazier"), tok.sep_id, *tok.encode_field("Birth City"),
            tok.retrieve_id]
    first = [tok.doc_id, *tok.encode_text("Paul Gates was born in")]
    key = _key(tok, "Timothy Frazier", "Birth City")

    def ctx(ids):  # the context the generator sends with a call opened after ``ids``
        return call_context([*ids, tok.start_id], len(ids), tok)

    answers.resolve([key], [ctx(first)])
    refused = answers.get(key, ctx(first))
    assert refused.miss.reason == "no_entity" and refused.value == "unknown"
    later = first + call + [*tok.encode_field("unknown"), tok.end_id, *tok.encode_text(" Port Timothy Frazier. He")]
    assert "Timothy Frazier" not in answers.context_text(ctx(later))
    answers.resolve([key], [ctx(later)])
    assert answers.get(key, ctx(later)).miss.reason == "no_entity"
    # a name the text itself gave stays named, whatever the model wrote between
    named = [tok.doc_id, *tok.encode_text("Timothy Frazier was born in")]
    answers.resolve([key], [ctx(named)])
    assert answers.get(key, ctx(named)).value == "Denver"
    again = named + call + [*tok.encode_field("Denver"), tok.end_id, *tok.encode_text(". He")]
    assert "Timothy Frazier" in answers.context_text(ctx(again))
    # a name the KB does not hold at all is the text's own: refused as a query, it still names the person
    own = _key(tok, "Paul Gates", "Employer")
    answers.resolve([own], [ctx(first)])
    assert answers.get(own, ctx(first)).miss.reason == "no_entity"
    own_call = [tok.start_id, *own[0], tok.sep_id, *own[1], tok.retrieve_id, *tok.encode_field("unknown"), tok.end_id]
    after = first + own_call + [*tok.encode_text(" Jones")]
    assert "Paul Gates" in answers.context_text(ctx(after))
    answers.resolve([key], [ctx(after)])  # so another KB person's exact name is still refused after it
    assert answers.get(key, ctx(after)).miss.reason == "no_entity"


def test_a_namesake_the_model_writes_after_a_refused_call_stays_unnamed(world, cousins):
    """Jasmine Hale is not in the KB: her call is refused, and the model writing a KB name that shares a
    word with hers ("Jasmine Mejia-Morris") into the text afterwards is it renaming her, so the next call
    on that name is refused too; a name sharing no word with hers, or written before the refusal, stays."""
    tok = world.tok
    answers = Answerer(tok, cousins)

    def ctx(ids):
        return call_context([*ids, tok.start_id], len(ids), tok)

    def call(entity, value):
        return [tok.start_id, *tok.encode_field(entity), tok.sep_id, *tok.encode_field("Birth City"), tok.retrieve_id,
                *tok.encode_field(value), tok.end_id]

    first = [tok.doc_id, *tok.encode_text("Jasmine Hale was born in")]
    hale, cousin, frazier = (_key(tok, e, "Birth City") for e in ("Jasmine Hale", "Jasmine Mejia-Morris",
                                                                  "Timothy Frazier"))
    answers.resolve([hale], [ctx(first)])
    assert answers.get(hale, ctx(first)).miss.reason == "no_entity"
    later = first + call("Jasmine Hale", "unknown") + [*tok.encode_text(" Lima. Jasmine Mejia-Morris studied in")]
    assert "Jasmine Mejia-Morris" not in answers.context_text(ctx(later))
    answers.resolve([cousin], [ctx(later)])
    assert answers.get(cousin, ctx(later)).miss.reason == "no_entity"
    # the same name in the text before the refused call is the text's own, and stays named
    both = [tok.doc_id, *tok.encode_text("Jasmine Mejia-Morris met Jasmine Hale. Jasmine Hale was born in")]
    again = both + call("Jasmine Hale", "unknown") + [*tok.encode_text(" Lima. Jasmine Mejia-Morris studied in")]
    assert "Jasmine Mejia-Morris" in answers.context_text(ctx(again))
    # a name that shares no word with the refused one is not taken for her
    met = first + call("Jasmine Hale", "unknown") + [*tok.encode_text(" Lima. She met Timothy Frazier, born in")]
    answers.resolve([frazier], [ctx(met)])
    assert answers.get(frazier, ctx(met)).value == "Denver"
