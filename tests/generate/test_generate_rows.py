"""``RowState``, the lookup grammar of one row, on the trained world's tokenizer: its states read off
real ids, and both backends' adapters (the Hugging Face processor over a batch, vLLM's per-request
``RowGrammar``) editing a row's logits as the row's own ``RowState`` does."""

from __future__ import annotations

import torch
from gen_support import make_kb, trained_world

from lmlm.generate.answers import Answerer, call_context, call_start, query_key
from lmlm.generate.processor import PAPER_LOGIT_BIAS, LookupLogitsProcessor
from lmlm.generate.rows import (ENTITY, ENTITY0, OUTSIDE, OUTSIDE_FULL, RELATION0, VALUE, Grammar, RowGrammar,
                                RowState)
from lmlm.generate.trie import KeyTrie, TokenTrie


def test_a_row_state_reads_its_call_off_real_ids():
    """Through one call, token by token: each state, the over-long field closed, the value forced once
    known, a miss keeping the next token text, and a call forced at an offset."""
    tok = trained_world().tok
    start, sep, ret, end = tok.call_ids
    grammar = Grammar(tok.call_ids, (tok.eos_id, tok.doc_id), max_lookups=2, max_field_tokens=10)
    text = [tok.doc_id, *tok.encode_text("Ada Lind was born in")]
    entity, relation = tok.encode_field("Ada Lind"), tok.encode_field("Birth City")
    assert len(entity) <= 10 and len(relation) <= 10
    value = tok.value_continuation(" Paris")
    ids = text + [start, *entity, sep, *relation, ret, *value]
    row, seen = RowState(grammar, count_from=len(text)), []
    for t in ids:
        seen.append(t)
        row.read([t], len(seen) - 1)
        step = row.plan(len(seen), lambda p: seen[p:])
        if t == start:
            assert (step.state, step.forced) == (ENTITY0, None)  # an empty entity cannot be closed
        elif t == sep:
            assert step.state == RELATION0
        elif t == ret:
            assert (step.state, step.forced) == (VALUE, None)  # nothing known to force yet
            row.value = value
            assert row.plan(len(seen), lambda p: seen[p:]).forced == value[0]
        elif len(seen) == len(text) + 2:
            assert step.state == ENTITY
    assert seen[-1] == end and row.plan(len(seen), seen.__getitem__).state == OUTSIDE and row.calls == 1
    row.missed = True  # the KB found nothing: the next token is text
    assert row.plan(len(seen), seen.__getitem__).state == OUTSIDE_FULL
    seen.append(tok.encode_text(" and")[0])
    assert row.plan(len(seen), seen.__getitem__).state == OUTSIDE
    # an entity written to its limit is closed; a call due at an offset is opened
    long = RowState(grammar)
    field = (tok.encode_text(" and then some more of it") * 10)[:10]
    long.read(text + [start] + field[:9])
    assert long.plan(len(text) + 10, lambda p: []).forced is None
    long.read(field[9:], len(text) + 10)
    assert long.plan(len(text) + 11, lambda p: []).forced == sep
    due = RowState(grammar, force_at=(2,), origin=len(text))
    due.read(text)
    assert due.plan(len(text) + 1, lambda p: []).forced is None
    assert due.plan(len(text) + 2, lambda p: []).forced == start


def _batch(world, kb):
    """Four rows of one prompt, each as far into its continuation as the others and in another state:
    an entity begun after ``<|db_start|>`` (names to favour, the prefix tree), an answered value being
    stated after its call (the copy), text with a call due (opened at its offset), and just after a
    call the KB found nothing for. Each row's continuation starts with filler text to make them even."""
    tok = world.tok
    start, sep, ret, end = tok.call_ids
    name = world.people[0][0]
    text = [tok.doc_id, *tok.encode_text(f"{name} met Hugo Moss. {name} was born in")]
    answers = Answerer(tok, kb)

    def answered(row: list[int]) -> list[int]:  # the ids forced after the <|db_retrieve|> ``row`` ends with
        key, ctx = query_key(row, len(row) - 1, tok, 50), call_context(row, call_start(row, len(row) - 1, tok), tok)
        answers.resolve([key], [ctx])
        return list(answers.get(key, ctx).continuation)

    def query(who: str) -> list[int]:
        return [start, *tok.encode_field(who), sep, *tok.encode_field("Birth City"), ret]

    value = answered(text + query(name))[:-1]
    missed = answered(text + query("Zed Quorra"))
    cores = {"name": [start, *tok.encode_field(name)[:1]], "copy": query(name) + value + [end],
             "due": [], "missed": query("Zed Quorra") + missed}
    width = max(map(len, cores.values())) + 1
    filler = tok.encode_text(" and")[:1]
    rows = {k: text + filler * (width - len(c)) + c for k, c in cores.items()}
    for k in ("copy", "missed"):  # the same answers in the rows' own contexts
        ret_at = rows[k].index(ret, len(text))
        assert answered(rows[k][:ret_at + 1])[:len(value) if k == "copy" else None] == \
            (value if k == "copy" else missed)
    return text, width, rows, value, answers


def test_both_backends_edit_a_row_as_its_row_state_does(tmp_path):
    """The same rows, decoded a token at a time from random scores: the Hugging Face processor (all
    four rows in one batch, its bans applied to all at once), vLLM's ``RowGrammar`` (one request a
    row, told what the vLLM backend tells it) and each row's own ``RowState`` leave the same scores
    at every step of the vLLM round (until the row writes ``<|db_start|>`` or ``<|db_retrieve|>``,
    where vLLM stops it), and every edit was met: names favoured, the prefix tree, the copy, a call
    opened at its offset, no call right after a miss."""
    world = trained_world()
    tok, kb = world.tok, make_kb(world, str(tmp_path / "kb"))
    start, sep, ret, end = tok.call_ids
    text, width, rows, value, answers = _batch(world, kb)
    trie = KeyTrie(kb, tok)
    options = dict(max_lookups=4, copy_bias=3.0, name_bias=4.0)
    force_at = {"due": [width]}
    engine = LookupLogitsProcessor(tok, kb, logit_bias=PAPER_LOGIT_BIAS, constraint=trie, cache=answers.cache,
                                   count_from=len(text), force_at=[force_at.get(k, []) for k in rows], **options)
    stops = (tok.eos_id, tok.doc_id)
    grammar = Grammar(tok.call_ids, stops, PAPER_LOGIT_BIAS, trie=TokenTrie(trie.paths()), **options)
    requests, states = {}, {}
    for k, row in rows.items():
        # vLLM's round starts after the marker it stopped at (or its prompt): what it knows is about that call
        n = len(text) if k == "due" else max(i for i, t in enumerate(row) if t in tok.call_ids) + 1
        facts = dict(missed=k == "missed")
        if k == "copy":
            facts["copy"] = value
        if k == "name":
            facts["names"] = answers.names_before(row[:n], n - 1)
            assert {tok.decode_field(i) for i in facts["names"]} == {world.people[0][0], "Hugo Moss"}
        requests[k] = (RowGrammar(tok.call_ids, stops, PAPER_LOGIT_BIAS, calls=row[len(text):n].count(start),
                                  force_at=force_at.get(k), origin=len(text), trie=TokenTrie(trie.paths()),
                                  **options, **facts), row[:n])
        states[k] = RowState(grammar, force_at.get(k, ()), origin=len(text), count_from=len(text))
        states[k].read(row[:n])
        states[k].missed, states[k].copy, states[k].names = facts["missed"], facts.get("copy"), facts.get("names")
        states[k].read(row[n:], n)
    rng = torch.Generator().manual_seed(0)
    ids = torch.tensor(list(rows.values()))
    bias = grammar.tables(len(tok), "cpu")[2]
    met = dict.fromkeys(["names", "tree", "copy", "due", "missed"], 0)
    for _ in range(10):
        scores = torch.randn(len(rows), len(tok), generator=rng)
        want = engine(ids, scores.clone())
        for b, k in enumerate(rows):
            row = ids[b].tolist()
            request, prompt = requests[k]
            if start in row[len(prompt):] or ret in row[len(prompt):]:
                continue  # vLLM's round for this row is over
            got = request(prompt, row[len(prompt):], scores[b].clone())
            assert torch.equal(got, want[b]), (k, row[len(text):])
            row_state = states[k]
            step = row_state.plan(len(row), lambda p: row[p:])
            direct = row_state.edit(row_state.mask(scores[b].clone(), step), step, len(row), lambda p: row[p:])
            assert torch.equal(direct, want[b]), (k, row[len(text):])
            biased = bool((torch.isfinite(want[b]) & (want[b] != scores[b] + bias)).any())
            met["names"] += k == "name" and biased
            met["tree"] += step.allowed is not None
            met["copy"] += k == "copy" and biased
            met["due"] += k == "due" and step.forced == start
            met["missed"] += k == "missed" and bool(torch.isinf(want[b, start]))
        nxt = want.argmax(dim=1)
        ids = torch.cat([ids, nxt[:, None]], dim=1)
        for b, k in enumerate(rows):
            states[k].read([int(nxt[b])], ids.shape[1] - 1)
    assert all(met.values()), met
    kb.close()
