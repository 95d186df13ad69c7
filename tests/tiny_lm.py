"""A tiny GPT-2 (2 layers) trained in seconds on annotated documents with the masked loss, for tests."""

from __future__ import annotations

from typing import Sequence

import torch
from transformers import GPT2Config, GPT2LMHeadModel

from lmlm.tokens import LookupTokenizer, labels_from_roles


def tiny_gpt2(tok: LookupTokenizer, n_embd: int = 64, n_positions: int = 256) -> GPT2LMHeadModel:
    """A randomly initialised 2-layer, 2-head GPT-2 over ``tok``'s vocabulary."""
    config = GPT2Config(n_layer=2, n_embd=n_embd, n_head=2, vocab_size=len(tok), n_positions=n_positions,
                        bos_token_id=tok.doc_id, eos_token_id=tok.eos_id)
    return GPT2LMHeadModel(config)


def fit_tiny_gpt2(tok: LookupTokenizer, docs: Sequence, *, n_embd: int, n_positions: int, steps: int,
                  lr: float) -> tuple[GPT2LMHeadModel, float]:
    """Train :func:`tiny_gpt2` (seed 0, one thread) on ``docs`` (segment lists), values masked out of
    the loss; returns the model and its last batch loss."""
    encs = [tok.encode(d) for d in docs]
    width = max(map(len, encs))
    ids = torch.full((len(encs), width), tok.eos_id)
    labels = torch.full((len(encs), width), -100)
    for i, e in enumerate(encs):
        ids[i, :len(e)] = torch.tensor(e.input_ids)
        labels[i, :len(e)] = torch.tensor(labels_from_roles(e.input_ids, e.roles, tok.end_id))
    torch.manual_seed(0)
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # a model this small trains fastest on one thread
    model = tiny_gpt2(tok, n_embd, n_positions)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    for _ in range(steps):
        b = torch.randint(0, len(encs), (16,))
        loss = model(input_ids=ids[b], labels=labels[b]).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    torch.set_num_threads(before)
    return model, loss.item()
