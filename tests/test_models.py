"""Model presets: parity with Hugging Face's own classes and the paper's parameter table."""

from __future__ import annotations

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from lmlm.models import MODEL_PRESETS, ModelConfig, build_model, count_parameters, preset_table
from lmlm.tokens import load_tokenizer

VOCAB = 300


def _meta_count(model_cls, hf_config) -> int:
    with torch.device("meta"):
        model = model_cls(hf_config)
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name", sorted(MODEL_PRESETS))
def test_every_preset_resolves_and_round_trips(name):
    cfg = ModelConfig.from_name(name)
    assert ModelConfig.from_dict(cfg.to_dict()) == cfg
    counts = count_parameters(cfg, VOCAB)
    assert 0 < counts["non_embedding"] < counts["total"]


def test_config_validation_names_the_argument():
    with pytest.raises(ValueError, match="unknown model preset 'gpt5'"):
        ModelConfig.from_name("gpt5")
    with pytest.raises(ValueError, match="n_head"):
        ModelConfig.from_name("gpt2-tiny", n_head=3)
    with pytest.raises(ValueError, match="intermediate_size"):
        ModelConfig(name="x", family="llama", hidden_size=64, n_layer=1, n_head=2)
    with pytest.raises(ValueError, match="unknown ModelConfig fields"):
        ModelConfig.from_dict({"name": "x", "family": "gpt2", "hidden_size": 64, "n_layer": 1, "n_head": 2,
                               "width": 3})


def test_paper_presets_match_hugging_face_defaults():
    """GPT2-124M is GPT2Config()'s default shape; the others differ only in the fields we set."""
    v_gpt, v_llama = 50261, 32004
    assert count_parameters("gpt2-124m", v_gpt)["total"] == _meta_count(GPT2LMHeadModel, GPT2Config(vocab_size=v_gpt))
    assert count_parameters("gpt2-355m", v_gpt)["total"] == _meta_count(
        GPT2LMHeadModel, GPT2Config(vocab_size=v_gpt, n_embd=1024, n_layer=24, n_head=16))
    for name, (h, layers, heads) in {"llama2-176m": (512, 8, 8), "llama2-382m": (768, 12, 12)}.items():
        ref = LlamaConfig(vocab_size=v_llama, hidden_size=h, num_hidden_layers=layers, num_attention_heads=heads,
                          intermediate_size=11008, max_position_embeddings=1024, tie_word_embeddings=False)
        assert count_parameters(name, v_llama)["total"] == _meta_count(LlamaForCausalLM, ref)


def _assert_same_forward(ours, theirs):
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in theirs.parameters())
    theirs.load_state_dict(ours.state_dict(), strict=True)
    ours.eval(), theirs.eval()
    x = torch.randint(0, VOCAB, (2, 17), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(ours(input_ids=x).logits, theirs(input_ids=x).logits)


def test_gpt2_preset_against_hf():
    ours = build_model("gpt2-tiny", VOCAB, seed=0)
    theirs = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_positions=128, n_embd=64, n_layer=2, n_head=2,
                                        activation_function="gelu_pytorch_tanh", resid_pdrop=0.0,
                                        embd_pdrop=0.0, attn_pdrop=0.0))
    _assert_same_forward(ours, theirs)
    assert ours.lm_head.weight is ours.transformer.wte.weight


def test_gpt2_paper_activation_against_hf():
    """The paper presets' fused tanh GELU computes GPT-2's own gelu_new (HF's default): the same
    logits to float rounding; checked on a shrunken gpt2-124m."""
    ours = build_model(ModelConfig.from_name("gpt2-124m", hidden_size=64, n_layer=2, n_head=2), VOCAB, seed=0)
    theirs = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=2))
    _assert_same_forward(ours, theirs)


def test_llama_preset_against_hf():
    ours = build_model("llama-tiny", VOCAB, seed=0)
    theirs = LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=176,
                                          num_hidden_layers=2, num_attention_heads=2, max_position_embeddings=128,
                                          rms_norm_eps=1e-5, tie_word_embeddings=False))
    _assert_same_forward(ours, theirs)
    assert ours.lm_head.weight is not ours.model.embed_tokens.weight


def test_build_model_is_seeded_and_takes_token_ids():
    class Tok:
        doc_id, eos_id = 7, 8

    a = build_model("gpt2-tiny", VOCAB, Tok(), seed=3)
    b = build_model("gpt2-tiny", VOCAB, seed=3)
    torch.testing.assert_close(a.state_dict(), b.state_dict())
    assert (a.config.bos_token_id, a.config.eos_token_id, a.config.pad_token_id) == (7, 8, None)


def test_cpu_preset_sizes():
    counts = count_parameters("gpt2-small-cpu", 8192)
    assert 3e6 <= counts["non_embedding"] <= 4e6
    assert count_parameters("gpt2-tiny", 512)["non_embedding"] < 2e5


def test_preset_table_pairs_presets_with_their_tokenizer():
    rows = preset_table({"bpe": 1000})
    assert [r["preset"] for r in rows] == ["gpt2-tiny", "gpt2-small-cpu", "llama-tiny", "llama-small-cpu"]
    assert all(r["vocab_size"] == 1000 and r["paper_total"] is None for r in rows)
    assert len(preset_table({"a": 100, "b": 200}, presets=["gpt2-tiny"], all_pairs=True)) == 2


# (preset, tokenizer, paper total, paper non-embedding) from the paper's Table (appendix A.2)
PAPER = [("gpt2-124m", "gpt2", 124.4e6, 85.5e6), ("gpt2-355m", "gpt2", 354.8e6, 303.4e6),
         ("llama2-176m", "llama2", 176.4e6, 160.0e6), ("llama2-382m", "llama2", 381.8e6, 357.3e6)]


def test_paper_parameter_table(shared_data):
    tokenizers = {"gpt2": load_tokenizer(shared_data / "tokenizers" / "gpt2"),
                  "llama2": load_tokenizer(shared_data / "tokenizers" / "llama2" / "tokenizer.json")}
    rows = {r["preset"]: r for r in preset_table(tokenizers, presets=[p for p, *_ in PAPER])}
    assert rows["gpt2-124m"]["vocab_size"] == 50261 and rows["llama2-176m"]["vocab_size"] == 32004
    for preset, _, total, non_embedding in PAPER:
        row = rows[preset]
        assert row["total"] == pytest.approx(total, rel=2e-3), preset
        assert row["paper_total"] == total
        if preset == "gpt2-124m":
            # total minus the token embedding is 85.84M; the paper prints 85.5M (0.4% lower)
            assert row["non_embedding"] == row["total"] - 50261 * 768 == 85_842_432
        else:
            assert row["non_embedding"] == pytest.approx(non_embedding, rel=2e-3), preset
