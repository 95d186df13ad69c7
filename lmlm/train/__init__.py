"""Pretraining on annotated text: one loop for the LMLM and for the Standard baseline.

The LMLM trains on documents with their lookup calls, the Standard baseline on the same documents
stripped of them; everything else (model, order of documents, block shuffle, schedule) is shared.
The labels are the ids with value tokens and ``<|db_end|>`` set to -100: the model learns to ask
the database, never to memorise its answers.

* :mod:`lmlm.train.config`: :class:`TrainConfig`, the recipe, checked field by field;
* :mod:`lmlm.train.data`: documents to blocks (:func:`pack`), :class:`Batches`;
* :mod:`lmlm.train.inputs`: the data, tokenizer and starting model (a preset, a checkpoint, or a
  pretrained LM grown by the lookup tokens, :mod:`lmlm.pretrained`);
* :mod:`lmlm.train.loop`: :func:`train`, the loop on Accelerate;
* :mod:`lmlm.train.speed`: FLOPs per token and MFU;
* :mod:`lmlm.train.cli`: ``lmlm train`` / ``python -m lmlm.train``.

Exercised by ``lmlm train --data DOCS --model PRESET --max-steps N --out DIR``.
"""

from .config import TRAIN_PRESETS, TrainConfig, TrainConfigError

_LAZY = {"Batches": "data", "Packed": "data", "encode_documents": "data", "pack": "data", "TrainResult": "loop",
         "evaluate_loss": "loop", "learning_rate": "loop", "resolve_precision": "loop", "train": "loop"}


def __getattr__(name):  # torch loads when training does, not when the CLI starts
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    if name == "_Batches":  # the name older code imports
        return __getattr__("Batches")
    raise AttributeError(name)


def main(argv=None):
    """``python -m lmlm.train [flags]`` (see ``lmlm train --help``)."""
    from .cli import main as _main

    return _main(argv)


__all__ = ["TRAIN_PRESETS", "TrainConfig", "TrainConfigError", "TrainResult", "Packed", "Batches", "train", "pack",
           "encode_documents", "evaluate_loss", "learning_rate", "resolve_precision", "main"]
