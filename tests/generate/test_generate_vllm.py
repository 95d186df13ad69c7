"""The vLLM backend: its per-row grammar against the engine's processor (always), and the backend
against the Hugging Face engine where vLLM is installed (a GPU machine, or vLLM's CPU build: see
`.ci/run`)."""

from __future__ import annotations

import importlib.util
import random

import pytest
import torch
from gen_support import bio_prompts, make_kb, trained_world

from lmlm.checkpoint import save_checkpoint
from lmlm.generate import LookupGenerator
from lmlm.generate.processor import PAPER_LOGIT_BIAS, LookupLogitsProcessor, RowGrammar

HAS_VLLM = importlib.util.find_spec("vllm") is not None


@pytest.mark.skipif(HAS_VLLM, reason="vLLM is installed")
def test_missing_vllm_names_the_extra():
    from lmlm.generate.vllm import VLLMLookupGenerator

    with pytest.raises(ImportError, match=r"lmlm\[vllm\]"):
        VLLMLookupGenerator("some-model")


def test_the_row_grammar_scores_as_the_engine_processor_does():
    """Random rows with markers anywhere, read a token at a time: wherever the engine does not force a
    value, the per-row grammar vLLM runs leaves the same scores (bias, bans, over-long fields closed)."""
    tok = trained_world().tok
    rng = random.Random(0)
    compared = {"outside": 0, "field": 0, "cut": 0, "spent": 0}
    for _ in range(40):
        width = rng.randint(1, 6)
        row = [rng.choice(tok.call_ids) if rng.random() < 0.3 else rng.randrange(len(tok)) for _ in range(40)]
        engine = LookupLogitsProcessor(tok, None, logit_bias=PAPER_LOGIT_BIAS, max_lookups=2, max_field_tokens=3,
                                       count_from=width)
        grammar = RowGrammar(tok.call_ids, sorted({tok.eos_id, tok.doc_id}), list(PAPER_LOGIT_BIAS), max_lookups=2,
                             max_field_tokens=3)
        for t in range(width, len(row)):
            scores = torch.randn(1, len(tok))
            got = grammar(row[:width], row[width:t], scores[0].clone())
            markers = [i for i, x in enumerate(row[:t]) if x in tok.call_ids]
            last = row[markers[-1]] if markers else None
            if last == tok.retrieve_id:  # the engine forces the value here; vLLM stops the row instead
                continue
            want = engine(torch.tensor([row[:t]]), scores.clone())[0]
            assert torch.equal(got, want), (row[:t], t)
            spent = row[width:t].count(tok.start_id) >= 2
            kind = ("cut" if t - 1 - markers[-1] >= 3 else "field") if last in (tok.start_id, tok.sep_id) else \
                ("spent" if spent else "outside")
            compared[kind] += 1
    assert min(compared.values()) >= 10, compared  # every state was met


@pytest.mark.skipif(not HAS_VLLM, reason="vLLM is not installed (pip install 'lmlm[vllm]')")
def test_vllm_matches_the_engine(tmp_path):
    from lmlm.generate.vllm import VLLMLookupGenerator

    world = trained_world()
    folder = save_checkpoint(tmp_path / "ckpt", world.model, world.tok)
    kb = make_kb(world, str(tmp_path / "kb"))
    prompts = bio_prompts(world, 12)
    engine = LookupGenerator(world.model, world.tok, kb).generate(prompts, max_new_tokens=40)
    served = VLLMLookupGenerator(folder, kb, tokenizer=world.tok, gpu_memory_utilization=0.2, enforce_eager=True,
                                 dtype="float32").generate(prompts, max_new_tokens=40)
    assert sum(a.token_ids == b.token_ids for a, b in zip(engine, served)) >= 10  # kernels round differently
    start, sep, ret, end = world.tok.call_ids
    for r in served:
        assert len(r.token_ids) <= 40
        order = [t for t in r.token_ids if t in world.tok.call_ids]  # every call whole, markers in order
        assert order[:len(order) // 4 * 4] == [start, sep, ret, end] * (len(order) // 4) and len(r.trace) >= 1
        for t in r.trace:
            if t.found:
                assert t.value == world.facts[(t.matched_entity, t.matched_relation)]
