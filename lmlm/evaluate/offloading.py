"""Selective knowledge offloading: which facts are worth a lookup, by the paper's loss-difference rule.

The paper (section 5, appendix B "Selective Knowledge Offloading") trains an LMLM and a Standard
model on the same corpus, then, for every lookup, measures the language-modeling loss of the 5
tokens that follow the call in the LMLM's document and of the same tokens in the clean document
for the Standard model. Their difference (Standard minus LMLM), averaged over the occurrences of a
fact, ranks the facts: a large gap marks a fact the Standard model struggles to learn (long-tail,
specific), the best candidate for the database. An offloading ratio keeps the calls of the top
``ratio`` of the facts and reverts the others to plain text; one model is trained per ratio (0%:
the Standard model, 100%: the LMLM). The paper's thresholds for 10/25/50/75/90% were 3.51, 2.24,
1.25, 0.64 and 0.13 nats.

* :func:`fact_loss_differences`: the per-fact mean loss difference;
* :func:`offloaded_keys` / :func:`offload_thresholds`: the top share of facts and its threshold;
* :func:`offload_documents`: the corpus with only those facts' calls.

Exercised by ``lmlm eval offloading`` and ``lmlm reproduce``.

Examples:
    >>> deltas = fact_loss_differences(lmlm_model, standard_model, tok, docs)
    >>> keys = offloaded_keys(deltas, 0.5)
    >>> corpus = offload_documents(docs, keys)   # train one LMLM on it
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from ..lookup import Lookup, Segment, Text
from ..tokens import CALL, ORG, LookupTokenizer
from .base import Protocol

__all__ = ["OFFLOADING", "PAPER_RATIOS", "PAPER_THRESHOLDS", "fact_loss_differences", "keep_lookups",
           "offload_documents", "offload_thresholds", "offloaded_keys", "ranked_facts"]

OFFLOADING = Protocol("offloading", "offloading_perplexity", greater_is_better=False,
                      paper="LMLM section 5 and appendix B, selective knowledge offloading")
PAPER_RATIOS = (0.0, 0.25, 0.5, 0.75, 0.9, 1.0)
PAPER_THRESHOLDS = {0.1: 3.51, 0.25: 2.24, 0.5: 1.25, 0.75: 0.64, 0.9: 0.13}
Key = tuple[str, str]


def _after_calls(roles: Sequence[int], ids: Sequence[int], end_id: int, n_tokens: int) -> list[tuple[int, list[int]]]:
    """For each call of an LMLM encoding: ``(call index, org indices of the n tokens after it)``.

    An org index counts ``org`` tokens from the start (the document separator is index 0); the
    clean document's token at that position is the same token.
    """
    org_index = np.cumsum([r == ORG for r in roles]) - 1  # org index of each org position
    out, k = [], 0
    for t, (r, i) in enumerate(zip(roles, ids)):
        if r == CALL and i == end_id:
            follow = [int(org_index[u]) for u in range(t + 1, len(roles)) if roles[u] == ORG][:n_tokens]
            out.append((k, follow))
            k += 1
    return out


def fact_loss_differences(lmlm_model, standard_model, tok: LookupTokenizer, documents: Sequence[Sequence[Segment]],
                          n_tokens: int = 5, batch_size: int = 16) -> dict[Key, float]:
    """Mean over each fact's occurrences of ``loss_standard - loss_lmlm`` on the ``n_tokens`` after its call.

    Args:
        lmlm_model, standard_model: the two models trained on the annotated and the clean corpus.
        tok: their shared tokenizer.
        documents: annotated documents (lists of segments); calls without following text are skipped.
        n_tokens (int, default 5): the paper's 5 tokens.

    Returns:
        ``{(entity, relation): mean loss difference in nats}``.
    """
    from ..lookup import lookups, strip
    from ..scoring import token_logprobs

    encs = [tok.encode(d) for d in documents]
    plains = [tok.encode_plain(strip(d)) for d in documents]
    lp_l = token_logprobs(lmlm_model, [e.input_ids for e in encs], batch_size)
    lp_s = token_logprobs(standard_model, [p.input_ids for p in plains], batch_size)
    sums: dict[Key, list[float]] = {}
    for doc, enc, ll, ls in zip(documents, encs, lp_l, lp_s):
        org_positions = [t for t, r in enumerate(enc.roles) if r == ORG]
        calls = lookups(doc)
        for k, follow in _after_calls(enc.roles, enc.input_ids, tok.end_id, n_tokens):
            follow = [j for j in follow if org_positions[j] - 1 < len(ll) and j - 1 < len(ls)]
            if not follow:
                continue
            loss_l = -np.mean([ll[org_positions[j] - 1] for j in follow])  # lp[t] scores token t + 1
            loss_s = -np.mean([ls[j - 1] for j in follow])
            sums.setdefault(calls[k].key, []).append(float(loss_s - loss_l))
    return {key: float(np.mean(v)) for key, v in sums.items()}


def ranked_facts(deltas: Mapping[Key, float]) -> list[Key]:
    """Facts by decreasing loss difference (ties by key, so the order is deterministic)."""
    return sorted(deltas, key=lambda k: (-deltas[k], k))


def offloaded_keys(deltas: Mapping[Key, float], ratio: float) -> set[Key]:
    """The top ``ratio`` of facts by loss difference (rounded to whole facts)."""
    if not 0.0 <= ratio <= 1.0:
        raise ValueError(f"ratio must be in [0, 1], got {ratio}")
    ranked = ranked_facts(deltas)
    return set(ranked[:round(ratio * len(ranked))])


def offload_thresholds(deltas: Mapping[Key, float], ratios: Iterable[float]) -> dict[float, float | None]:
    """The loss difference of the last offloaded fact at each ratio (None when no fact is offloaded)."""
    ranked = ranked_facts(deltas)
    out = {}
    for r in ratios:
        n = round(r * len(ranked))
        out[r] = deltas[ranked[n - 1]] if n else None
    return out


def keep_lookups(segments: Sequence[Segment], keep) -> list[Segment]:
    """The document with the calls for which ``keep(lookup)`` is false reverted to plain text.

    The space after a call belongs to it (see :func:`lmlm.lookup.plain_text`) and goes with it.
    """
    out: list[Segment] = []
    dropped = False
    for seg in segments:
        if isinstance(seg, Lookup):
            if keep(seg):
                out.append(seg)
                dropped = False
            else:
                dropped = True
            continue
        text = seg.text
        if dropped and text.startswith(" ") and (not out or (isinstance(out[-1], Text) and out[-1].text[-1:].isspace())):
            text = text[1:]
        dropped = False
        if out and isinstance(out[-1], Text):
            out[-1] = Text(out[-1].text + text)
        elif text:
            out.append(Text(text))
    return out


def offload_documents(documents: Iterable[Sequence[Segment]], keys: set[Key]) -> list[list[Segment]]:
    """Each document keeping only the calls whose ``(entity, relation)`` is in ``keys``."""
    return [keep_lookups(d, lambda lk: lk.key in keys) for d in documents]
