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

from ..lookup import PAPER_TOKENS, LookupTokens
from ..tokens import LookupTokenizer

__all__ = ["load_model", "open_kb"]


def load_model(path: str | Path, tokens: str | LookupTokens | None = None, device: str | None = None, dtype=None):
    """Load a model and its :class:`LookupTokenizer` for generation.

    Args:
        path: a checkpoint folder (ours or a plain Hugging Face one) or a hub name.
        tokens: the lookup token vocabulary, by name (``paper``, ``released``) or as
            :class:`LookupTokens`; default: the checkpoint's ``lmlm.json``, else ``paper``.
        device, dtype: where and in which dtype to load the weights (default: CPU, as saved).

    Returns:
        ``(model, tokenizer, meta)``; ``meta`` is the ``lmlm.json`` dict (empty for other folders).

    Raises:
        ValueError: the tokenizer lacks the lookup tokens (the model never saw them: wrong ``tokens``),
            or has more tokens than the model's embedding.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ..checkpoint import is_checkpoint, read_meta

    meta = read_meta(path) if is_checkpoint(path) else {}
    if isinstance(tokens, str):
        tokens = LookupTokens.from_name(tokens)
    if tokens is None:
        tokens = LookupTokens(**meta["lookup_tokens"]) if meta.get("lookup_tokens") else PAPER_TOKENS
    hf = AutoTokenizer.from_pretrained(str(path))
    missing = [t for t in tokens.as_list() if t not in hf.get_vocab()]
    if missing:
        raise ValueError(f"the tokenizer of {path} has no {', '.join(missing)}: the model was trained with other "
                         "lookup tokens (tokens='released' for the authors' checkpoints, 'paper' for ours)")
    kwargs = {"dtype": dtype} if dtype is not None else {}
    model = AutoModelForCausalLM.from_pretrained(str(path), **kwargs)
    if device is not None:
        model = model.to(device)
    tok = LookupTokenizer(hf, tokens)
    rows = model.get_input_embeddings().num_embeddings
    if len(tok) > rows:
        raise ValueError(f"the tokenizer of {path} has {len(tok)} tokens but the model embeds only {rows}")
    return model.eval(), tok, meta


def open_kb(path: str | Path):
    """A KB folder, or an authors' JSON database (imported on first use into ``NAME.kb`` beside it)."""
    from ..kb import KnowledgeBase
    from ..kb.authors import open_authors_json

    path = Path(path)
    if path.is_file() and path.suffix == ".json":
        return open_authors_json(path)
    return KnowledgeBase.open(path)
