"""Perplexity of LMLM and Standard models: static (oracle), dynamic and normalized (paper, appendix A.3).

* static: the annotated reference with its oracle lookups; mean NLL over ``org`` tokens.
* dynamic: lookups at the reference positions, but the model writes entity and relation itself
  and the knowledge base answers; mean NLL over the same ``org`` tokens.
* normalized: NLL summed over every trained token (all but values and ``<|db_end|>``), divided by
  the number of ``org`` tokens (the length of the original text).
* standard: a model trained without lookups, on the stripped text; mean NLL over its tokens,
  which are the same ``org`` tokens (see :mod:`lmlm.tokens`).

Each returns perplexities plus the mean loss per token role; with ``groups`` (one label per
document, e.g. whether its person was trained on or added to the KB later) each also returns the
perplexities of every group (``by_group``). Dynamic perplexity counts a lookup as found only when
the KB answered with a fact of the entity the reference call names: a namesake's fact is no answer.
Exercised by ``lmlm eval perplexity`` and ``lmlm quickstart``.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from ..lookup import Lookup, Segment
from ..models import max_positions
from ..scoring import token_logprobs
from ..tokens import CALL, ORG, ROLE_NAMES, VALUE, Encoded, LookupTokenizer
from .base import same_entity

__all__ = ["static_perplexity", "dynamic_perplexity", "standard_perplexity", "role_losses",
           "same_entity"]


def _ppl(nll_sum: float, count: int) -> float:
    return math.exp(nll_sum / count) if count else float("nan")


def role_losses(logps: Sequence[np.ndarray], roles: Sequence[Sequence[int]]) -> dict[str, float]:
    """Mean NLL per token role (the role of the predicted token)."""
    sums = np.zeros(len(ROLE_NAMES))
    counts = np.zeros(len(ROLE_NAMES))
    for lp, rl in zip(logps, roles):
        r = np.asarray(rl[1:len(lp) + 1], dtype=np.int64)  # an empty document's: no index, not a float array
        np.add.at(sums, r, -lp)
        np.add.at(counts, r, 1)
    return {name: float(sums[k] / counts[k]) for k, name in enumerate(ROLE_NAMES) if counts[k]}


def _org_and_train(logps, encs: Sequence[Encoded], end_id: int, groups: Sequence[str] | None = None) -> dict:
    """NLL sums over ``org`` and trained tokens, for all documents and (with ``groups``) per group."""
    per = []
    for lp, enc in zip(logps, encs):
        r = np.asarray(enc.roles[1:len(lp) + 1])
        t = np.asarray(enc.input_ids[1:len(lp) + 1])
        org = r == ORG
        trained = (r != VALUE) & (t != end_id)
        per.append((float(-lp[org].sum()), float(-lp[trained].sum()), int(org.sum())))

    def total(rows) -> dict:
        return {"org_nll": sum(x[0] for x in rows), "train_nll": sum(x[1] for x in rows),
                "org_tokens": sum(x[2] for x in rows), "documents": len(rows)}

    out = total(per)
    if groups is not None:
        if len(groups) != len(per):
            raise ValueError(f"{len(groups)} group labels for {len(per)} documents")
        out["groups"] = {g: total([x for x, h in zip(per, groups) if h == g]) for g in dict.fromkeys(groups)}
    return out


def _by_group(agg: dict, **keys: str) -> dict:
    """``{group: {name: perplexity, "org_tokens", "documents"}}``; ``keys`` maps a name to ``org_nll`` or ``train_nll``."""
    return {g: {**{name: _ppl(a[src], a["org_tokens"]) for name, src in keys.items()},
                "org_tokens": a["org_tokens"], "documents": a["documents"]}
            for g, a in agg.get("groups", {}).items()}


def static_perplexity(model, tok: LookupTokenizer, documents: Sequence[Sequence[Segment]],
                      batch_size: int = 16, groups: Sequence[str] | None = None, progress: bool = False) -> dict:
    """Static (oracle) and normalized perplexity of an LMLM on annotated documents (``progress``: a bar on stderr)."""
    encs = [tok.encode(d) for d in documents]
    logps = token_logprobs(model, [e.input_ids for e in encs], batch_size, progress="static" if progress else None)
    agg = _org_and_train(logps, encs, tok.end_id, groups)
    out = {
        "static": _ppl(agg["org_nll"], agg["org_tokens"]),
        "normalized": _ppl(agg["train_nll"], agg["org_tokens"]),
        "org_tokens": agg["org_tokens"],
        "role_loss": role_losses(logps, [e.roles for e in encs]),
    }
    if groups is not None:
        out["by_group"] = _by_group(agg, static="org_nll", normalized="train_nll")
    return out


def standard_perplexity(model, tok: LookupTokenizer, texts: Sequence[str], batch_size: int = 16,
                        groups: Sequence[str] | None = None, progress: bool = False) -> dict:
    """Perplexity of a Standard model on plain text (all tokens are ``org``; ``progress``: a bar on stderr)."""
    encs = [tok.encode_plain(t) for t in texts]
    logps = token_logprobs(model, [e.input_ids for e in encs], batch_size, progress="perplexity" if progress else None)
    agg = _org_and_train(logps, encs, tok.end_id, groups)
    out = {"perplexity": _ppl(agg["org_nll"], agg["org_tokens"]), "org_tokens": agg["org_tokens"]}
    if groups is not None:
        out["by_group"] = _by_group(agg, perplexity="org_nll")
    return out


def dynamic_perplexity(generator, documents: Sequence[Sequence[Segment]], batch_size: int = 16,
                       groups: Sequence[str] | None = None, progress: bool = False) -> dict:
    """Dynamic perplexity: at each reference call position the model writes its own query.

    ``generator`` is a :class:`lmlm.generate.LookupGenerator` (its model, tokenizer and KB are
    used). Calls are completed in rounds, the k-th call of every document in one batch. A lookup
    counts as found (``lookup_found_rate``) when the KB's fact is about the reference call's entity;
    ``lookup_matched_rate`` counts any answer, ``lookup_wrong_entity`` the answers about someone else;
    ``queries`` lists each query the model wrote (its document's index, the reference call, the value
    written, whether the KB answered and whether for the reference's entity), to read the misses by.
    ``progress``: bars on stderr over the calls written, then the tokens scored.
    """
    tok: LookupTokenizer = generator.tok
    oracle = [tok.encode(d) for d in documents]
    # split each oracle encoding into org runs separated by calls
    pieces: list[list[Encoded]] = []
    refs = [[seg for seg in d if isinstance(seg, Lookup)] for d in documents]  # the k-th call's reference
    for enc in oracle:
        runs, ids, roles = [], [], []  # each run's lists grown in place: a long document is no square cost
        i = 0
        while i < len(enc):
            if enc.input_ids[i] == tok.start_id and enc.roles[i] == CALL:
                runs.append(Encoded(ids, roles))
                ids, roles = [], []
                while enc.input_ids[i] != tok.end_id:
                    i += 1
                i += 1
                continue
            ids.append(enc.input_ids[i])
            roles.append(enc.roles[i])
            i += 1
        runs.append(Encoded(ids, roles))
        pieces.append(runs)
    built = [p[0] for p in pieces]
    n_calls = [len(p) - 1 for p in pieces]
    queries_made: list[dict] = []
    from ..generate.answers import Answerer, call_context

    answers = Answerer(tok, generator.kb, matching=generator.options.get("matching"))  # as generation asks the KB
    seen = max_positions(generator.model)
    bar = None
    if progress:
        from tqdm.auto import tqdm
        bar = tqdm(total=sum(n_calls), desc="dynamic: calls", unit="call")
    for k in range(max(n_calls, default=0)):
        rows = [d for d in range(len(documents)) if n_calls[d] > k]
        prefixes = [built[d].input_ids + [tok.start_id] for d in rows]
        calls = generator.complete_call(prefixes, batch_size=batch_size)
        # the text the model wrote its query from (complete_call's window of a long document), read by the KB
        contexts = [answers.context_text(call_context(p[-seen:], len(p[-seen:]) - 1, tok)) for p in prefixes]
        matches = answers.lookup([(e, r) for e, r in calls], contexts) if generator.kb is not None \
            else [None] * len(rows)
        for d, (e, r), m in zip(rows, calls, matches):
            m = m or None  # a miss that says why counts as not found
            value = m.value if m is not None else (generator.options.get("fallback") or "unknown")
            call = tok.encode_call(Lookup(e or "?", r or "?", value))
            built[d] = built[d] + call + pieces[d][k + 1]
            ref = refs[d][k] if k < len(refs[d]) else None
            right = m is not None and same_entity(m.entity, ref.entity if ref is not None else None)
            queries_made.append({"document": d, "reference": [ref.entity, ref.relation] if ref is not None else None,
                                 "entity": e, "relation": r, "value": value, "matched": m is not None, "found": right,
                                 "group": None if groups is None else groups[d]})
        if bar is not None:
            bar.update(len(rows))
    if bar is not None:
        bar.close()
    logps = token_logprobs(generator.model, [b.input_ids for b in built], batch_size,
                           progress="dynamic: score" if progress else None)
    agg = _org_and_train(logps, built, tok.end_id, groups)
    ref_orgs = sum(sum(1 for r in e.roles[1:] if r == ORG) for e in oracle)
    if agg["org_tokens"] != ref_orgs:
        raise ValueError(f"dynamic perplexity scored {agg['org_tokens']} text tokens but the references have "
                         f"{ref_orgs}: a document with its generated lookups exceeds the model context")
    out = {"dynamic": _ppl(agg["org_nll"], agg["org_tokens"]), "org_tokens": agg["org_tokens"],
           **_lookup_rates(queries_made), "queries": queries_made}
    if groups is not None:
        out["by_group"] = _by_group(agg, dynamic="org_nll")
        for g, row in out["by_group"].items():
            row.update(_lookup_rates([q for q in queries_made if q["group"] == g]))
    return out


def _lookup_rates(queries: Sequence[dict]) -> dict:
    n = len(queries)
    rate = (lambda k: sum(q[k] for q in queries) / n) if n else (lambda k: float("nan"))
    return {"lookups": n, "lookup_found_rate": rate("found"), "lookup_matched_rate": rate("matched"),
            "lookup_wrong_entity": sum(q["matched"] and not q["found"] for q in queries)}
