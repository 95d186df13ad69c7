"""The memory floor under a decode step (in ``lmlm.bench.generate_paper``), on the paper's architectures at tiny sizes."""

from __future__ import annotations

import pytest
import torch

from lmlm.bench.generate_paper import decode_floor, kv_bytes_per_token, stream_rate, weight_bytes_per_step
from lmlm.models import ModelConfig, build_model

VOCAB = 300


def _model(name: str, dtype=torch.float32, **shape):
    cfg = ModelConfig.from_name(name, hidden_size=32, n_layer=3, n_head=4, intermediate_size=64, context_length=64,
                                **shape)
    return build_model(cfg, VOCAB, seed=0).to(dtype).eval()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_bytes_a_step_reads(dtype):
    size = torch.finfo(dtype).bits // 8
    gpt2, llama = _model("gpt2-124m", dtype), _model("llama2-176m", dtype)
    # keys and values: 2 x 3 layers x 32 dims a position
    assert kv_bytes_per_token(gpt2) == kv_bytes_per_token(llama) == 2 * 3 * 32 * size
    total = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    # GPT-2 ties its token table to the output layer (read whole); its 64 position rows are only indexed
    assert weight_bytes_per_step(gpt2) == (total(gpt2) - 64 * 32) * size
    # LLaMA's input table is its own: only indexed
    assert weight_bytes_per_step(llama) == (total(llama) - VOCAB * 32) * size


def test_the_floor_grows_with_rows_and_context():
    model = _model("gpt2-124m")
    step = (weight_bytes_per_step(model), kv_bytes_per_token(model))
    one = decode_floor(*step, rows=1, context=10, rate=1e9)
    assert decode_floor(*step, rows=16, context=10, rate=1e9) > one
    assert decode_floor(*step, rows=1, context=100, rate=1e9) > one
    assert decode_floor(*step, rows=1, context=10, rate=2e9) == pytest.approx(one / 2)
    with pytest.raises(ValueError, match="rate > 0"):
        decode_floor(*step, rows=0, context=10, rate=1e9)


def test_stream_rate_is_a_plausible_memory_rate():
    rate = stream_rate(mbytes=64)
    assert 1e8 < rate < 1e13  # 0.1 GB/s to 10 TB/s
