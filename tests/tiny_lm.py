"""A tiny GPT-2 (2 layers): randomly initialised, or trained in seconds by the package's own trainer
(:func:`lmlm.train.train`, preset ``tiny-test``) on annotated documents with the masked loss."""

from __future__ import annotations

import random
import tempfile
from typing import Sequence

import torch
from transformers import GPT2Config, GPT2LMHeadModel

from lmlm.lookup import Lookup, Text
from lmlm.tokens import LookupTokenizer
from lmlm.train import TrainConfig, train


def bio_doc(name: str, city: str, job: str, rng: random.Random) -> list:
    """A two-sentence annotated biography (birth city and occupation, each with its lookup call),
    the sentences in a random order."""
    born = [Text(f"{name} was born in "), Lookup(name, "Birth City", city), Text(f" {city}.")]
    works = [Text(f"{name} works as a "), Lookup(name, "Occupation", job), Text(f" {job}.")]
    first, second = (born, works) if rng.random() < 0.5 else (works, born)
    return first + [Text(" ")] + second


def tiny_gpt2(tok: LookupTokenizer, n_embd: int = 64, n_positions: int = 256) -> GPT2LMHeadModel:
    """A randomly initialised 2-layer, 2-head GPT-2 over ``tok``'s vocabulary."""
    config = GPT2Config(n_layer=2, n_embd=n_embd, n_head=2, vocab_size=len(tok), n_positions=n_positions,
                        bos_token_id=tok.doc_id, eos_token_id=tok.eos_id)
    return GPT2LMHeadModel(config)


def fit_tiny_gpt2(tok: LookupTokenizer, docs: Sequence, *, n_embd: int, n_positions: int, steps: int,
                  lr: float) -> tuple[GPT2LMHeadModel, float]:
    """:func:`lmlm.train.train` with the ``tiny-test`` preset (a 2-layer GPT-2, seed 0, one thread) on
    ``docs`` (segment lists), values masked out of the loss; returns the model and its final loss."""
    before = torch.get_num_threads()
    with tempfile.TemporaryDirectory() as out:
        config = TrainConfig.from_name("tiny-test", out_dir=out, max_steps=steps, lr=lr, seq_len=min(128, n_positions),
                                       model_overrides=dict(hidden_size=n_embd, context_length=n_positions))
        result = train(config, docs, tok)
    torch.set_num_threads(before)
    return result.model, result.stats["final_loss"]
