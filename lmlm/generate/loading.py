"""Opening what generation needs: a model with its lookup tokens, and a knowledge base.

A model is one of our checkpoints (``lmlm.json`` names its lookup tokens) or any Hugging Face
causal-LM folder or hub name, such as the authors' released checkpoints, whose tokenizers carry
``<|db_entity|> <|db_relationship|> <|db_return|> <|db_end|>``: ``tokens="released"`` is all they
need. A KB is a folder, or the authors' released JSON database (imported once, beside the file).
Exercised by ``lmlm generate --tokens released --kb DATABASE.json``.

Examples:
    >>> model, tok, meta = load_model("LMLM-llama2-382M", tokens="released")
    >>> kb = open_kb("dwiki-eval100-annotator_database.json")
"""

from __future__ import annotations

from pathlib import Path

from ..lookup import LookupTokens

__all__ = ["load_model", "open_kb"]


def load_model(path: str | Path, tokens: str | LookupTokens | None = None, device: str | None = None, dtype=None,
               weights: bool = True):
    """Load a model and its :class:`LookupTokenizer` for generation (:func:`lmlm.checkpoint.open_model`)."""
    from ..checkpoint import open_model

    return open_model(path, tokens=tokens, device=device, dtype=dtype, weights=weights)


def open_kb(path: str | Path):
    """A KB folder, or an authors' JSON database (imported on first use into ``NAME.kb`` beside it)."""
    from ..kb import KnowledgeBase
    from ..kb.build import open_authors_json

    path = Path(path)
    if path.is_file() and path.suffix == ".json":
        return open_authors_json(path)
    return KnowledgeBase.open(path)
