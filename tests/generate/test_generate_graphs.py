"""The engine's static-cache decoding (:mod:`lmlm.generate.graphs`): on a CPU the static cache and
its slot mask run eagerly and must give the dynamic cache's tokens; on a CUDA device the one-token
step is a CUDA graph replay and must give them too (skipped without one)."""

from __future__ import annotations

import pytest
import torch

from lmlm.generate import LookupGenerator
from lmlm.generate.graphs import SLOT_ROUNDING, StaticDecoder, static_decoder


def _prompts(world) -> list[str]:  # different lengths: left padding in every batch
    out = []
    for i, (name, _, job) in enumerate(world.people[:12]):
        out.append([f"{name} was born in", f"{name} works as a {job}. {name} was born in", name][i % 3])
    return out


def _compare(world, kb, device: str, model=None) -> None:
    model = (model if model is not None else world.model).to(device)
    try:
        eager = LookupGenerator(model, world.tok, kb, cuda_graphs=False)
        static = LookupGenerator(model, world.tok, kb, cuda_graphs=True)
        prompts = _prompts(world)
        for batch in (1, 5, 12):
            a = eager.generate(prompts, max_new_tokens=40, batch_size=batch, ignore_eos=True)
            b = static.generate(prompts, max_new_tokens=40, batch_size=batch, ignore_eos=True)
            assert [r.token_ids for r in a] == [r.token_ids for r in b], batch
            assert [[t.value for t in r.trace] for r in a] == [[t.value for t in r.trace] for r in b]
        if model is world.model:
            assert sum(len(r.trace) for r in b) >= 12  # the comparison went through lookups
        sampled = [static.generate(prompts[:4], max_new_tokens=30, do_sample=True, seed=7, batch_size=4)
                   for _ in range(2)]
        assert [r.token_ids for r in sampled[0]] == [r.token_ids for r in sampled[1]]
    finally:
        model.to("cpu")


def _llama(world):
    """A LLaMA-style model (rotary positions) with random weights: its calls are the grammar's."""
    from lmlm.models import build_model

    return build_model("llama-tiny", len(world.tok), world.tok, seed=3).eval()


def test_static_cache_gives_the_dynamic_caches_tokens(world, kb):
    _compare(world, kb, "cpu")


def test_static_cache_gives_the_dynamic_caches_tokens_llama(world, kb):
    _compare(world, kb, "cpu", _llama(world))


def test_static_decoder_logits_match_and_refuse_overflow(world):
    model, tok = world.model, world.tok
    rows = [[tok.doc_id, *tok.encode_text(t)] for t in ("Ada was born in", "Ada")]
    width = max(map(len, rows))
    ids = torch.tensor([[tok.eos_id] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    decoder = static_decoder(model, 2, width + 3)
    assert decoder is not None and decoder.length == SLOT_ROUNDING and decoder.graph is None
    assert static_decoder(model, 2, width + 5) is decoder  # same rounded length: reused
    with torch.inference_mode():
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        full = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits
        torch.testing.assert_close(decoder.prefill(ids, mask), full[:, -1], rtol=1e-4, atol=1e-4)
        more = torch.tensor([[5, 6, 7], [8, 9, 10]])
        ext = torch.cat([ids, more], 1)
        ext_mask = torch.cat([mask, torch.ones_like(more)], 1)
        full = model(input_ids=ext, attention_mask=ext_mask, position_ids=(ext_mask.cumsum(-1) - 1).clamp(min=0)).logits
        torch.testing.assert_close(decoder.forward(more[:, :1]), full[:, width], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(decoder.forward(more[:, 1:]), full[:, -1], rtol=1e-4, atol=1e-4)
        small = StaticDecoder(model, 2, width + 1, record=False)
        small.prefill(ids, mask)
        small.forward(more[:, :1])
        with pytest.raises(ValueError, match="cache holds"):
            small.forward(more[:, 1:2])
        with pytest.raises(ValueError, match="does not fit"):
            small.prefill(ids[:1], mask[:1])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_graph_replay_gives_the_same_tokens(world, kb):
    _compare(world, kb, "cuda")
    _compare(world, kb, "cuda", _llama(world))
    decoder = static_decoder(world.model.to("cuda"), 1, 10)
    world.model.to("cpu")
    assert decoder is not None and decoder.graph is not None
