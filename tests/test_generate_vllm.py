"""The vLLM backend: checked against the Hugging Face engine where vLLM is installed (a GPU machine)."""

from __future__ import annotations

import importlib.util

import pytest
from test_generate import _prompts, make_kb, trained_world

from lmlm.checkpoint import save_checkpoint
from lmlm.generate import LookupGenerator

HAS_VLLM = importlib.util.find_spec("vllm") is not None


@pytest.mark.skipif(HAS_VLLM, reason="vLLM is installed")
def test_missing_vllm_names_the_extra():
    from lmlm.generate.vllm import VLLMLookupGenerator

    with pytest.raises(ImportError, match=r"lmlm\[vllm\]"):
        VLLMLookupGenerator("some-model")


@pytest.mark.skipif(not HAS_VLLM, reason="vLLM is not installed (pip install 'lmlm[vllm]')")
def test_vllm_matches_the_engine(tmp_path):
    from lmlm.generate.vllm import VLLMLookupGenerator

    world = trained_world()
    folder = save_checkpoint(tmp_path / "ckpt", world.model, world.tok)
    kb = make_kb(world, str(tmp_path / "kb"))
    prompts = _prompts(world, 12)
    engine = LookupGenerator(world.model, world.tok, kb).generate(prompts, max_new_tokens=40)
    served = VLLMLookupGenerator(folder, kb, tokenizer=world.tok, gpu_memory_utilization=0.2, enforce_eager=True,
                                 dtype="float32").generate(prompts, max_new_tokens=40)
    assert sum(a.token_ids == b.token_ids for a, b in zip(engine, served)) >= 10  # kernels round differently
    for r in served:
        assert len(r.token_ids) <= 40
        for t in r.trace:
            if t.found:
                assert t.value == world.facts[(t.matched_entity, t.matched_relation)]
