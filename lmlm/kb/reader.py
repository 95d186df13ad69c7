"""What every handle on a knowledge base reads with: the live KB (:class:`lmlm.kb.KnowledgeBase`)
and a read-only snapshot of a past version (:class:`lmlm.kb.view.KnowledgeBaseView`) share it.

Lookups (``lookup``, ``lookup_batch``, ``lookup_vectors``, ``search``; entity-aware resolution from
:class:`lmlm.kb.resolve.EntityLookup`) and records (``get``, ``values``, ``history``, ``log``,
``changes``, ``diff``, ``triples``, ``keys``, ``export``). A subclass holds ``store``, ``_map``
(key_norm -> best active triple: :mod:`lmlm.kb.keymap`), ``_n_active``, ``_version``, ``_lock``,
``encoder``, ``threshold`` and says how to ``refresh``, bring the key index up to date (``_sync_index``: the live KB's comes
from :class:`lmlm.kb.indexing.KeyIndexing`) and search it (``_search_index``); only the live KB
writes. Exercised by ``lmlm kb lookup`` (``--at`` for a snapshot) and ``lmlm generate``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from . import formats
from .keys import KEY_SEP, clean_field, key_text, normalize_key, normalize_text
from .records import AliasRow, Best, Change, DiffEntry, Match, TripleRecord, VersionRecord
from .resolve import EntityLookup

__all__ = ["KnowledgeBaseReader", "MAX_SOURCES"]

MAX_SOURCES = 32  # document ids returned per match; KnowledgeBase.get has them all
_CANDIDATES = 8  # index hits inspected per fuzzy query beyond k, in case some were just deleted


class KnowledgeBaseReader(EntityLookup):
    """Lookups and records of one version of a knowledge base (see the module docstring)."""

    threshold: float = 0.6

    def refresh(self) -> int:
        """The version this handle reads, after picking up what other processes wrote (if it follows them)."""
        raise NotImplementedError

    def _search_index(self, vectors: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-``k`` key ids and cosines per query vector among this version's keys."""
        raise NotImplementedError

    def close(self) -> None:
        """Release what this handle holds."""

    def __enter__(self) -> "KnowledgeBaseReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def key_ids(self) -> dict[tuple[str, str], int]:
        """Key id of every active key, by (entity, relation) as first written."""
        self.refresh()
        return {(b.entity, b.relation): b.key_id for b in self._map.values()}

    def lookup(self, entity: str, relation: str, threshold: float | None = None, fuzzy: bool = True,
               context: str | None = None, matching: str | None = None) -> Match | None:
        """The value of ``(entity, relation)``, or None (:meth:`explain` says why).

        Args:
            entity, relation: the query, as the model wrote it.
            threshold (float, optional): minimum similarity: of the relation under entity-aware
                matching (default ``self.relation_threshold``), of the whole key under ``"key"``
                (default ``self.threshold``).
            fuzzy (bool, default True): False answers from exact keys only (no encoder call).
            context (str, optional): the text before the call (prompt and document so far); an
                entity it names resolves a short or misspelt name.
            matching (str, optional): ``"entity"`` or ``"key"`` (default ``self.matching``).

        Returns:
            The best-supported active value of the matched key as a :class:`Match`, or None.
        """
        return self.lookup_batch([(entity, relation)], threshold, fuzzy, [context], matching)[0]

    def lookup_batch(self, queries: Sequence[tuple[str, str]], threshold: float | None = None,
                     fuzzy: bool = True, contexts: Sequence[str | None] | None = None,
                     matching: str | None = None) -> list[Match | None]:
        """:meth:`lookup` for many queries, batched (one encoder call for those that need one)."""
        return [m if isinstance(m, Match) else None
                for m in self.resolve_batch(queries, threshold, fuzzy, contexts, matching)]

    def _key_hits(self, queries: Sequence[tuple[str, str]], threshold: float, fuzzy: bool) -> list[tuple]:
        """The paper's match per query: (hit (best, score, exact) or None, nearest (best, score) or None)."""
        out: list[tuple] = [(None, None)] * len(queries)
        misses: list[int] = []
        for i, (entity, relation) in enumerate(queries):
            en, rn = normalize_text(entity), normalize_text(relation)
            if not en and not rn:
                continue  # a blank query matches nothing
            best = self._map.get(en + KEY_SEP + rn)
            if best is not None:
                out[i] = ((best, 1.0, True), None)
            else:
                misses.append(i)
        if fuzzy and misses and self._n_active:
            nearest = self._nearest([key_text(*queries[i]) for i in misses], k=1)
            for i, found in zip(misses, nearest):
                if found:
                    out[i] = ((found[0][0], found[0][1], False) if found[0][1] >= threshold else None, found[0])
        return out

    def lookup_vectors(self, vectors: np.ndarray, threshold: float | None = None) -> list[Match | None]:
        """Fuzzy lookup by query embeddings computed elsewhere, ``(n, dim)`` unit-norm rows."""
        threshold = self.threshold if threshold is None else float(threshold)
        with self._lock:
            self.refresh()
            if not self._n_active:
                return [None] * len(vectors)
            found = self._nearest_vectors(np.asarray(vectors, dtype=np.float32), k=1)
            return self._matches([(f[0][0], f[0][1], False) if f and f[0][1] >= threshold else None for f in found])

    def search(self, entity: str, relation: str, k: int = 5) -> list[Match]:
        """The ``k`` nearest keys with their scores, best first, ignoring the threshold (for debugging)."""
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        with self._lock:
            self.refresh()
            exact = self._map.get(normalize_key(entity, relation))
            hits: list[tuple[Best, float, bool]] = [(exact, 1.0, True)] if exact else []
            if self._n_active:
                hits += [(b, s, False) for b, s in self._nearest([key_text(entity, relation)], k)[0]
                         if not (exact and b.key_id == exact.key_id)]
            return self._matches(hits[:k])

    def _nearest(self, texts: list[str], k: int) -> list[list[tuple[Best, float]]]:
        """Top-``k`` active keys per text, as (best triple, cosine)."""
        self._sync_index()  # before encoding: a first use may load the encoder and index
        return self._nearest_vectors(self.encoder.encode(texts), k)  # (n, dim), cached per query string

    def _nearest_vectors(self, vectors: np.ndarray, k: int) -> list[list[tuple[Best, float]]]:
        scores, ids = self._search_index(vectors, k + _CANDIDATES)
        ids, scores = ids.tolist(), scores.tolist()
        # The first k hits of each row are read first: on a KB read from its store each read is a
        # row lookup, and the hits after them matter only where one of the first was not active.
        active = self._map.by_ids({kid for row in ids for kid in row[:k] if kid >= 0})

        def best(i: int, upto: int) -> list[tuple[Best, float]]:
            found = []
            for s, kid in zip(scores[i][:upto], ids[i][:upto]):
                b = active.get(kid)
                if b is not None:  # -1 (no hit) and keys not active in this version drop out
                    found.append((b, float(s)))
                    if len(found) == k:
                        break
            return found

        out = [best(i, k) for i in range(len(ids))]
        short = [i for i, found in enumerate(out) if len(found) < k and any(kid >= 0 for kid in ids[i][k:])]
        if short:
            active.update(self._map.by_ids({kid for i in short for kid in ids[i][k:] if kid >= 0}))
            for i in short:
                out[i] = best(i, len(ids[i]))
        return out

    def _sources(self, triple_ids: list[int]) -> dict[int, tuple[str, ...]]:
        return self.store.sources(triple_ids, limit=MAX_SOURCES)

    def _matches(self, hits: Sequence[tuple | None]) -> list[Match | None]:
        """Matches from (best, score, exact[, via, entity score, context free]) tuples; None stays None."""
        sources = self._sources([h[0].triple_id for h in hits if h])
        return [None if h is None else Match(
            entity=h[0].entity, relation=h[0].relation, value=h[0].value, score=h[1], triple_id=h[0].triple_id,
            exact=h[2], sources=sources.get(h[0].triple_id, ()), version=self._version,
            alternatives=h[0].n_active - 1, support=h[0].count, via=h[3] if len(h) > 3 else "key",
            entity_score=h[4] if len(h) > 4 else None, context_free=h[5] if len(h) > 5 else True) for h in hits]

    @property
    def version(self) -> int:
        """The current version of the KB (0 when nothing was ever added)."""
        return self.refresh()

    def __len__(self) -> int:
        """Number of active triples."""
        self.refresh()
        return self._n_active

    def get(self, triple_id: int) -> TripleRecord:
        """A triple by id, active or not, with its count, versions and sources."""
        with self._lock:
            record = self.store.get(triple_id)
        if record is None:
            raise KeyError(f"no triple with id {triple_id} in {self.path}")
        return record

    def values(self, entity: str, relation: str) -> list[TripleRecord]:
        """Every active value of the key, best supported first (the one :meth:`lookup` returns)."""
        with self._lock:
            active = [r for r in self.store.history(entity, relation) if r.active]
        return sorted(active, key=lambda r: (-r.count, -r.created_version, -r.id))

    def never_held(self, entity: str | None = None, relation: str | None = None,
                   source: str | None = None) -> list[str]:
        """Which of the given names this KB never held, in any version: ``"entity"``, ``"relation"``
        or ``"source"`` (a document id). A delete that matched nothing asks it: a typo, or done already?"""
        with self._lock:
            return self.store.never_held(None if entity is None else normalize_text(entity),
                                         None if relation is None else normalize_text(relation),
                                         None if source is None else clean_field(source, "source"))

    def history(self, entity: str, relation: str) -> list[TripleRecord]:
        """Every triple ever stored under the key, deleted ones included, oldest first."""
        with self._lock:
            return self.store.history(entity, relation)

    def log(self, limit: int | None = 20) -> list[VersionRecord]:
        """The latest ``limit`` versions (all when None), newest first."""
        with self._lock:
            return self.store.log(limit)

    def changes(self, version: int) -> list[Change]:
        """What ``version`` did to each triple it touched."""
        with self._lock:
            return self.store.changes(version)

    def diff(self, a: int, b: int) -> list[DiffEntry]:
        """The triples that differ between versions ``a`` and ``b`` (see :class:`DiffEntry`)."""
        with self._lock:
            return self.store.diff(a, b)

    def alias_diff(self, a: int, b: int) -> tuple[list[AliasRow], list[AliasRow]]:
        """The aliases active at version ``b`` and not at ``a`` (added), and the reverse (removed)."""
        with self._lock:
            a, b = self.store.check_version(a), self.store.check_version(b)
            at_a, at_b = self.store.aliases(at=a), self.store.aliases(at=b)
        in_a = {(r.alias_norm, r.entity_norm) for r in at_a}
        in_b = {(r.alias_norm, r.entity_norm) for r in at_b}
        return ([r for r in at_b if (r.alias_norm, r.entity_norm) not in in_a],
                [r for r in at_a if (r.alias_norm, r.entity_norm) not in in_b])

    def triples(self) -> Iterator[TripleRecord]:
        """The active triples in id order, streamed from a snapshot."""
        return self.store.records(active_only=True)

    def keys(self) -> list[tuple[str, str]]:
        """The (entity, relation) of every active key, as first written."""
        self.refresh()
        return [(b.entity, b.relation) for b in self._map.values()]

    def export(self, path: str | Path, format: str | None = None) -> int:
        """Write the active triples with counts and sources; returns how many.

        ``format``: ``jsonl`` (default), ``parquet`` or ``corpus`` (an annotated corpus, one
        document per source); by default told from the file suffix.
        """
        return formats.write(self.triples(), path, format)

    def export_jsonl(self, path: str | Path) -> int:
        """Write the active triples to a JSON-lines file (readable by :meth:`import_jsonl`); returns how many."""
        return self.export(path, "jsonl")
