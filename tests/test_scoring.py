"""The one scorer against Hugging Face's own loss: per-token log-probabilities, padding, bans, gradients."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from lmlm.scoring import target_logprobs, token_logprobs


def _model(vocab: int = 50) -> GPT2LMHeadModel:
    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=vocab, n_positions=64)).eval()


def test_token_logprobs_match_the_models_own_loss_whatever_the_batch():
    model = _model()
    rng = np.random.default_rng(0)
    seqs = [rng.integers(0, 50, n).tolist() for n in (5, 17, 9, 30, 2)]
    for batch_size in (1, 2, 5):  # longest first and right padded: every row's scores are its own
        scores = token_logprobs(model, seqs, batch_size=batch_size)
        for s, lp in zip(seqs, scores):
            assert lp.shape == (len(s) - 1,)
            with torch.no_grad():
                hf = model(input_ids=torch.tensor([s]), labels=torch.tensor([s])).loss.item()
            assert -lp.mean() == pytest.approx(hf, abs=1e-5)


def test_sequences_past_the_context_are_scored_in_windows():
    """80 tokens, context 64: the first window scores 63 tokens, the next (half a context on) the other 16,
    each after at least 31 tokens of the text before it; every token once, as a direct forward gives it."""
    model = _model()
    long = list(range(40)) * 2
    lp, = token_logprobs(model, [long])
    assert lp.shape == (79,)
    first, = token_logprobs(model, [long[:64]])
    window, = token_logprobs(model, [long[32:]])
    np.testing.assert_allclose(lp[:63], first, atol=1e-5)
    np.testing.assert_allclose(lp[63:], window[31:], atol=1e-5)


def test_banned_tokens_leave_the_distribution_and_greedy_flags_the_argmax():
    model = _model()
    seq = [3, 7, 7, 1, 4, 9]
    (lp, hit), = token_logprobs(model, [seq], banned=[7], greedy=True)
    assert math.isinf(lp[0]) and math.isinf(lp[1])  # 7 is banned: log 0
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([seq])).logits[0, :-1]
    logits[:, 7] = -torch.inf
    expected = torch.softmax(logits, -1)[torch.arange(5), torch.tensor(seq[1:])]
    assert np.allclose(np.exp(lp), expected.numpy(), atol=1e-6)
    assert hit.tolist() == (logits.argmax(-1) == torch.tensor(seq[1:])).tolist()


def test_target_logprobs_gives_the_gradient_of_the_models_loss():
    model = _model()
    ids = torch.tensor([[1, 5, 8, 2, 9, 4]])
    labels = ids.clone()
    labels[0, :3] = -100  # only the last three tokens are trained
    model(input_ids=ids, labels=labels).loss.backward()
    want = model.transformer.wte.weight.grad.clone()
    model.zero_grad()
    lp = target_logprobs(model(input_ids=ids).logits[:, :-1], labels[:, 1:])
    assert lp[0, :2].tolist() == [0.0, 0.0]  # ignored targets score 0
    (-lp.sum() / (labels[:, 1:] != -100).sum()).backward()
    assert torch.allclose(model.transformer.wte.weight.grad, want, atol=1e-6)
