"""The engine against the re-encode loop, and a random model pushed hard towards the lookup tokens:
generation ends within its limits, nothing escapes, every malformed call is reported in the trace."""

from __future__ import annotations

import pytest
import torch
from gen_support import FIRST, bio_prompts

from lmlm.generate import LookupGenerator, call_spans, open_call
from lmlm.generate.reencode import reencode_generate

RANDOM_SEED = 3  # the random_model fixture's weights


def test_engine_matches_the_reencode_loop(world, kb):
    """Forcing values into the KV-cached run gives the ids of encoding everything again after each lookup."""
    gen = LookupGenerator(world.model, world.tok, kb)
    prompts = bio_prompts(world, 16) + ["The", "Hugo Moss works"]
    engine = [gen.generate([p], max_new_tokens=48)[0] for p in prompts]
    loop = [reencode_generate(gen, p, max_new_tokens=48) for p in prompts]
    assert [r.token_ids for r in engine] == [r.token_ids for r in loop]
    assert [[t.value for t in r.trace] for r in engine] == [[t.value for t in r.trace] for r in loop]
    assert sum(len(r.trace) for r in engine) >= 16
    # the authors' text round trip runs too (its ids may differ: tokenizing text again is lossy)
    again = reencode_generate(gen, prompts[0], max_new_tokens=48, ignore_eos=True, retokenize=True)
    assert again.trace and again.trace[0].value == engine[0].trace[0].value


BROKEN_PROMPTS = ["", "<|db_start|>", "Ada <|db_start|> <|sep|>", "Ada Lind <|db_retrieve|>",
                  "<|db_start|> Ada Lind <|sep|> Birth City <|db_retrieve|>", "<|db_end|> <|db_end|> Bram",
                  "<|db_start|> Ada <|sep|> <|sep|> x"]

CONFIGS = {
    "greedy": ({}, {}),
    "short-fields": (dict(max_field_tokens=2, max_lookups=3), {}),
    "sampling": ({}, dict(do_sample=True, temperature=2.0, top_p=0.9, seed=1)),
    "beams": ({}, dict(num_beams=3)),
    "constrained-sampling": (dict(constrained=True), dict(do_sample=True, seed=2, top_k=10)),
    "forced": (dict(on_miss="skip"), dict(force_lookup=True, force_lookup_at=[0, 5, 9])),
    "nearest": (dict(on_miss="nearest", max_field_tokens=4), dict(repetition_penalty=2.0, stop_strings=["."])),
    "no-kb": (dict(kb=None), dict(ignore_eos=True)),
    # the static KV cache of CUDA-graph decoding, run eagerly on the CPU
    "static-cache": (dict(cuda_graphs=True, max_field_tokens=3), dict(ignore_eos=True)),
    "static-cache-forced": (dict(cuda_graphs=True, on_miss="skip"),
                            dict(force_lookup=True, force_lookup_at=[0, 5, 9], do_sample=True, seed=4)),
}
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])  # on CUDA: graph replay


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", list(CONFIGS))
def test_adversarial_model_is_contained(world, kb, random_model, name, device):
    try:
        _contained(world, kb, random_model.to(device), name)
    finally:
        random_model.to("cpu")


def _contained(world, kb, random_model, name):
    tok = world.tok
    gen_kw, run_kw = CONFIGS[name]
    gen_kw = {"kb": kb, **gen_kw}
    gen = LookupGenerator(random_model, tok, logit_bias=(30.0, 30.0, 30.0, 30.0), **gen_kw)
    limit, max_field = 40, gen.options["max_field_tokens"]
    prompts = [f"{w} {w}" for w in FIRST[:6]] + BROKEN_PROMPTS
    results = gen.generate(prompts, max_new_tokens=limit, batch_size=5, **run_kw)
    assert len(results) == len(prompts)
    for prompt, r in zip(prompts, results):
        head = open_call(gen.prompt_ids(prompt, run_kw.get("force_lookup", False)), tok)
        assert len(r.token_ids) <= limit + len(head)
        spans, stray = call_spans(r.token_ids, tok)
        assert len(r.trace) == len(spans), (prompt, r.token_ids)  # every call, well formed or not
        for sp, t in zip(spans, r.trace):
            assert t.token_start == sp.start and t.token_end <= len(r.token_ids)
            expected = _malformations(r.token_ids, sp, tok, max_field, gen.trie)
            for word in expected:
                assert t.problem and word in t.problem, (prompt, t)
            if not expected:
                assert t.problem is None, t
            if sp.retrieve is not None and t.status != "unanswered":
                assert t.status in ("exact", "fuzzy", "nearest", "fallback", "skipped")
        assert sum("outside a call" in p for p in r.problems) == len(stray)
    if "constrained" in name:
        for r in results[:6]:
            for t in r.trace:
                if t.status not in ("unfinished", "unanswered"):
                    assert (t.query_entity, t.query_relation) in world.facts


def test_adversarial_stream_ends(world, kb, random_model):
    gen = LookupGenerator(random_model, world.tok, kb, logit_bias=(30.0, 30.0, 30.0, 30.0), max_field_tokens=3)
    for prompt in ("Ada", "<|db_start|> Ada <|sep|>"):
        events = list(gen.stream(prompt, max_new_tokens=30, do_sample=True, seed=0))
        result = events[-1].result
        assert result is not None and len(result.token_ids) <= 30 + len(open_call(gen.prompt_ids(prompt), world.tok))
        streamed = [e.lookup for e in events if e.lookup is not None]
        assert [(t.token_start, t.status) for t in streamed] == [(t.token_start, t.status) for t in result.trace]


def _malformations(ids, sp, tok, max_field, tree) -> list[str]:
    """What is wrong with one call, read from the ids by the generator's contract rather than by the
    trace's code: a field whose text is blank (decoded by the Hugging Face tokenizer itself) is empty;
    a field that used up its ``max_field`` tokens was closed by force (cut), unless the KB's tree
    ends it there; a call without ``<|db_end|>`` is unfinished."""
    out = []
    for name, a, b in (("entity", sp.start, sp.sep), ("relation", sp.sep, sp.retrieve)):
        if a is None or b is None:
            continue
        field = ids[a + 1:b]
        if not tok.hf.decode(field).strip():  # the field's text, special tokens shown
            out.append(f"empty {name}")
        elif len(field) >= max_field and not (tree is not None and tuple(ids[sp.start + 1:b + 1]) in _tree_prefixes(tree)):
            out.append(f"{name} was cut")
    if sp.end is None:
        out.append("unfinished")
    return out


def _tree_prefixes(tree) -> set:
    """Every prefix of the token path of every KB key (from the keys, not from walking the tree)."""
    paths = [tree.path(e, r) for e, r in tree.kb.keys()]
    return {tuple(p[:k]) for p in paths for k in range(1, len(p) + 1)}
