"""Corpus annotation: turning raw text into text with lookup calls and a knowledge base.

The paper's pipeline (appendix A.1), one module per stage:

* ``backends``: LLMs behind one interface, by URL (OpenAI-compatible HTTP, local Hugging Face, vLLM),
  with retries, rate limits and a response cache; ``serve_gguf`` serves a GGUF model on llama.cpp;
* ``prompts``: the seed-annotation instructions and few-shot examples from the corpus;
* ``validate``: every call kept or rejected with a reason; the text is never changed;
* ``corrector``: an under-fitted LM scores each call's entity and relation loss; the worst are dropped;
* ``annotator`` and ``distill``: the distilled annotator (insert-only decoding), its training
  (fresh small model, or LoRA on a pretrained one) and sharded, resumable corpus annotation;
* ``corrupt``: damaged gold calls with labels, for ``lmlm bench annotate``;
* ``wikipedia``: distant supervision from infoboxes (no LLM).

``lmlm annotate seed|validate|correct|distill|run|serve-gguf|wikipedia``; from Python,
``annotate(texts, backend=...)``.
"""

from .backends import Backend, BackendError, get_backend, register_backend
from .pipeline import annotate
from .validate import Validated, ValidationReport, validate

__all__ = ["annotate", "validate", "Validated", "ValidationReport", "get_backend", "register_backend", "Backend",
           "BackendError", "Annotator"]


def __getattr__(name: str):
    if name == "Annotator":  # imports torch
        from .annotator import Annotator

        return Annotator
    raise AttributeError(f"module 'lmlm.annotate' has no attribute {name!r}")
