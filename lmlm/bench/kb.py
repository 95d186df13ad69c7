"""``lmlm bench kb --triples N``: build, lookup latency, ANN quality and forgetting at N triples.

Everything runs in one process on a synthetic KB and prints one JSON object as its last line:

1. **Triples.** N/10 people (first name, middle initial, last name from fixed pools), ten relations
   each, one value and one source document (with a position) per fact.
2. **Build.** ``KnowledgeBase.add`` of all N triples as one version, store only: triples/s and
   peak memory. The rows are made as the store reads them (10^7 tuples would take gigabytes);
   ``rows_s``, included in ``store_s``, is what making them costs on its own. A handle that only
   writes never reads the store back; the map a reader keeps of it (key -> best value) is read at
   the first lookup, timed as ``reader_load_s`` (``reader_rss_mb``: the memory it holds). ``--map
   store`` serves lookups from the store instead (nothing held per key: what a KB above
   ``lmlm.kb.keymap.MAP_LIMIT`` keys does), ``--map memory`` holds every key, ``auto`` picks by size.
3. **Embeddings.** MiniLM runs at about 10^2-10^3 keys/s on two CPU cores, so a build of 10^6 keys
   would spend most of its time encoding. The bench encodes ``--embed-keys`` sampled keys with the
   real encoder (their rate is reported as ``encode_keys_per_s``) and gives every other key a
   synthetic unit vector: the real embedding of a random sampled key of the same relation plus
   Gaussian noise (cosine about 0.8 to it), made a block at a time from the seed
   (:class:`lmlm.bench.kb_rows.SyntheticVectors`), so no copy of all vectors is held. ``method`` in
   the JSON says this. The vectors go in block by block through
   ``KnowledgeBase.put_vector_chunks``, which builds the index for the final size first (exact,
   HNSW, IVF or, from 4M keys, IVF with 128-byte PQ rows: ``index_kind``, ``index_rows``; ``--ann``
   sets other sizes and layouts, reported as ``ann_config``); ``build_triples_per_s`` counts store
   and index, ``build_triples_per_s_with_encoding`` adds encoding every key at the measured rate.
4. **Lookups.** Exact: existing keys in other spellings. Fuzzy: the sampled keys with the relation
   paraphrased (never an exact hit) and often a typo in the name, encoder cache cleared, so the
   embedding is in the time. Batched: ``lookup_batch`` of 256 unseen fuzzy queries at a time, the
   median of three passes (``*_passes``: each pass's rate; the cache cleared before each).
   The ``*_cached`` figures repeat the same queries with their embeddings in the encoder's cache:
   the lookup without the encoder; ``batched_encode_qps``: the encoder alone on the same batches
   (median of three passes), in this process with the key index loaded. Both matchings run on the
   same queries: the paper's single-key cosine (``fuzzy_*``, ``batched_fuzzy_*``) and the
   entity-aware default (``entity_*``: the entity by name, then the relation among its keys), each
   with how many answers name another person (``*_wrong_entity``); ``entity_vs_key`` holds the ratios.
5. **ANN quality.** ``--ann-queries`` perturbed queries; top-1 of the index (candidates re-scored
   from the stored rows) against an exact search over every key's vector as made (float32, a block
   at a time); ``ann_score_error_p99``: how far a returned score is from the true cosine.
6. **Forgetting.** A random 5% of the facts deleted as one forget set (``KnowledgeBase.forget``).
   Then every deleted fact is looked up by its exact key, and ``--deleted-check`` of them (all at
   10^6 facts) also entity-aware and by their own key vector (the nearest possible query), here and
   in a second process that opens the KB; every retained fact (or ``--retain-exact`` of them) is
   looked up exactly, and ``--retain-check`` of them by vector. ``deleted_retrievable`` and
   ``retained_lost`` count failures. ``deleted_keys_answered`` counts, per matching, the deleted
   keys (their own spelling) that still got an answer: another fact, since theirs is gone.

A run of hours can keep its KB as built (``--keep --no-forget``) for later runs to open (``--reuse``):
the same seed draws the same queries and vectors. ``rss_mb_after``: memory held after each phase.

Examples:
    lmlm bench kb --triples 100000
    lmlm bench kb --triples 54600000 --keep --no-forget --out build.json   # then, as often as needed:
    lmlm bench kb --triples 54600000 --reuse --out lookups.json
"""

from __future__ import annotations

import dataclasses
import gc
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Optional

import numpy as np
import typer

from ..memory import trim_heap
from ..jsonio import write_json
from . import bench_app, peak_rss_mb, percentile_ms, rss_mb
from .kb_checks import (MAP_LIMITS, ann_config, batched_rates, check_other_process, draw_in_few_blocks, encode_rates,
                        folder_bytes, pick_threads)
from .kb_rows import RELATIONS, SyntheticTriples, SyntheticVectors, perturb

__all__ = ["RELATIONS", "SyntheticTriples", "perturb", "run_kb_bench"]

class _KBBench:
    """The steps of one run on ``n`` synthetic triples; each adds its numbers to ``report``."""

    def __init__(self, n: int, work: Path, encoder_threads: int | None, store_only: bool, seed: int, log,
                 map_kind: str = "auto", reuse: bool = False, ann=None):
        from ..kb import get_encoder, key_text

        self.n, self.log, self.t0, self.map_kind, self.seed = n, log, time.perf_counter(), map_kind, seed
        self.rng = np.random.default_rng(seed)
        self.report: dict = {"triples": n, "load_avg_start": round(os.getloadavg()[0], 2), "cpu_count": os.cpu_count()}
        self.kb_dir, self.reuse, self.ann_config = work / "kb", reuse, ann
        self.report["ann_config"] = None if ann is None else dataclasses.asdict(ann)  # None: the KB's default
        if reuse and not (self.kb_dir / "kb.sqlite").exists():
            raise ValueError(f"--reuse: no KB in {self.kb_dir} (keep one with --keep --no-forget)")
        if self.kb_dir.exists() and not reuse:
            shutil.rmtree(self.kb_dir)
        self.enc = None if store_only else get_encoder()
        if self.enc is not None:
            self.enc.encode(["warm up"], cache=False)
            self.threads_before = self.enc.threads
            if encoder_threads is None:
                probe = [key_text(f"Probe Person {i}", rel) for i in range(32) for rel in RELATIONS][:256]
                self.report["encoder_keys_per_s_by_threads"] = pick_threads(self.enc, probe)
            else:
                self.enc.threads = encoder_threads
            self.report["encoder_threads"] = self.enc.threads
        self.rows = SyntheticTriples(n, seed)  # made when read, not held
        self.keys = self.rows.keys()
        self.sample = np.zeros(0, dtype=np.int64)  # keys embedded for real
        self.vectors: SyntheticVectors | None = None

    def build(self) -> None:
        from ..kb import KnowledgeBase

        if self.reuse:
            return self._reopen()
        t = time.perf_counter()
        for _ in self.rows:  # what making the rows costs on its own (the build below makes them again)
            pass
        self.report["rows_s"] = round(time.perf_counter() - t, 2)
        self.log(f"building a KB of {self.n:,} triples in {self.kb_dir}")
        t = time.perf_counter()
        self.kb = KnowledgeBase.create(self.kb_dir, encoder=self.enc, ann=self.ann_config)
        self.kb.add(self.rows, who="bench", why="build", batch_size=5000,  # tuples made as the store takes them
                    progress=self.n >= 50_000, embed=False)
        self.store_s = time.perf_counter() - t
        self.report.update(store_s=round(self.store_s, 2), store_triples_per_s=round(self.n / self.store_s),
                           build_peak_rss_mb=round(peak_rss_mb()))
        self._read_map()

    def _read_map(self) -> None:
        """The reader's map of the store (``--map``), read now and timed: a write never reads it."""
        if self.map_kind in MAP_LIMITS:
            self.kb.map_limit = MAP_LIMITS[self.map_kind]
        gc.collect()
        before, t = rss_mb(), time.perf_counter()
        self.kb.refresh()
        load_s = time.perf_counter() - t
        gc.collect()
        self.report.update(map=self.kb.stats()["map"], reader_load_s=round(load_s, 2),
                           reader_rss_mb=round(rss_mb() - before), reader_loaded_rss_mb=round(peak_rss_mb()))

    def _reopen(self) -> None:
        """Open the KB an earlier run kept as built (its key ids are checked against this run's triples)."""
        from ..kb import KnowledgeBase

        self.log(f"reusing the KB of {self.n:,} triples in {self.kb_dir}")
        self.kb = KnowledgeBase.open(self.kb_dir, encoder=self.enc, ann=self.ann_config)
        version, size = self.kb.version, len(self.kb)
        if version != 1 or size != self.n:
            raise ValueError(f"--reuse: the KB in {self.kb_dir} is at version {version} with {size:,} triples; "
                             f"it must be as built by a run of --triples {self.n} (version 1): keep it with --no-forget")
        self.report["reused"] = True
        self._read_map()

    def index(self, embed_keys: int) -> None:
        """A real sample of keys embedded, synthetic vectors for the rest (made a block at a time,
        never all held), then the index, built for the final size and given the vectors in blocks."""
        from ..kb import key_text

        m = min(embed_keys, self.n)
        self.sample = np.sort(self.rng.choice(self.n, size=m, replace=False))
        self.log(f"encoding {m:,} sampled keys with {self.enc.name}")
        t = time.perf_counter()
        real = self.enc.encode([key_text(*self.keys[i]) for i in self.sample], cache=False, progress=m >= 5000)
        rate = m / (time.perf_counter() - t)
        self.vectors = SyntheticVectors(self.n, real, self.sample, seed=self.seed)
        ids = self._key_ids()
        if self.reuse:  # the same draws as the run that built it, so queries and vectors are the same
            t = time.perf_counter()
            index = self.kb.key_index()
            self.report.update(keys=len(ids), embedded_keys=m, encode_keys_per_s=round(rate, 1),
                               index_kind=index.ann_kind, index_rows=index.row_codec,
                               index_load_s=round(time.perf_counter() - t, 2), index_peak_rss_mb=round(peak_rss_mb()))
            return
        self.log("building the key index")
        t = time.perf_counter()
        self.kb.put_vector_chunks(((ids[i:i + len(v)], v) for i, v in self.vectors), expected=self.n,
                                  sample=self.vectors.training_rows(400_000))
        index_s = time.perf_counter() - t
        index = self.kb.key_index()
        self.report.update(
            keys=len(ids), embedded_keys=m, synthetic_keys=self.n - m, encode_keys_per_s=round(rate, 1),
            encoder_dtype=self.enc.dtype,
            method=(f"real MiniLM embeddings for {m} sampled keys; the other {self.n - m} keys get synthetic unit "
                    "vectors (a random real key of the same relation plus Gaussian noise, cosine ~0.8), made a "
                    "block at a time; ANN and fuzzy queries are perturbed texts of sampled keys, encoded for real"),
            index_kind=index.ann_kind, index_rows=index.row_codec, index_build_s=round(index_s, 2),
            build_triples_per_s=round(self.n / (self.store_s + index_s)),
            build_triples_per_s_with_encoding=round(self.n / (self.store_s + index_s + len(ids) / rate)),
            index_peak_rss_mb=round(peak_rss_mb()))

    def _key_ids(self) -> np.ndarray:
        """Key id of each fact: a fresh store numbers keys in the order it first sees them (checked on
        a sample), so the map of every key to its id (gigabytes at 10^7 keys) is never built."""
        ids = np.arange(1, self.n + 1, dtype=np.int64)
        probe = np.sort(self.rng.choice(self.n, size=min(self.n, 2000), replace=False))
        got = {b.key_id: (b.entity, b.relation) for b in self.kb.store.best(ids[probe].tolist())}
        wrong = [i for i in probe.tolist() if got.get(i + 1) != tuple(self.keys[i])]
        if wrong:
            raise RuntimeError(f"fact {wrong[0]} does not have key id {wrong[0] + 1}: keys were not numbered in order")
        return ids

    def exact(self, count: int) -> None:
        qi = self.rng.choice(self.n, size=min(count, self.n), replace=False)
        spell = [(e.upper(), r.lower() + ":") if j % 2 else (f"  {e}", r.replace(" ", "_"))
                 for j, (e, r) in enumerate(self.keys[i] for i in qi)]
        lat = []
        for e, r in spell:
            t = time.perf_counter()
            hit = self.kb.lookup(e, r)
            lat.append(time.perf_counter() - t)
            assert hit is not None and hit.exact, (e, r)
        self.report.update(exact_p50_ms=percentile_ms(lat, 50), exact_p99_ms=percentile_ms(lat, 99))
        # the same keys asked with the text before the call, as during generation: entity-aware
        # resolution, which builds the entity index at its first use
        gc.collect()
        before, lat = rss_mb(), []
        for e, r in spell[:1000]:
            t = time.perf_counter()
            hit = self.kb.explain(e, r, context=f"A biography of {e.strip().title()}. ")
            lat.append(time.perf_counter() - t)
            assert hit.value is not None, (e, r, hit)
        gc.collect()
        self.report.update(entity_index_s=round(lat[0], 2), entity_index_rss_mb=round(rss_mb() - before),
                           context_exact_p50_ms=percentile_ms(lat[1:], 50))

    def _queries(self, count: int, truth: list | None = None) -> list[tuple[str, str]]:
        picked = self.rng.choice(self.sample, size=count, replace=count > len(self.sample))
        if truth is not None:
            truth.extend(self.keys[i][0] for i in picked)
        return [perturb(self.rng, *self.keys[i]) for i in picked]

    def fuzzy(self, single: int, batched: int) -> None:
        from ..kb import key_text

        kb = self.kb

        def timed(qs: list[tuple[str, str]], truth: list[str], matching: str) -> tuple[list[float], int, int]:
            lat, accepted, wrong = [], 0, 0
            for (e, r), who in zip(qs, truth):
                t = time.perf_counter()
                m = kb.lookup(e, r, matching=matching)
                lat.append(time.perf_counter() - t)
                accepted += m is not None
                wrong += m is not None and m.entity != who
            return lat, accepted, wrong

        t = time.perf_counter()
        kb.resolver.entities(kb.keymap)  # built once per process, like the key index
        self.report["entity_index_build_s"] = round(time.perf_counter() - t, 2)
        truth: list[str] = []
        qs = self._queries(single, truth)
        bqs = self._queries(batched)
        self.report["batched_encode_qps"] = statistics.median(encode_rates(self.enc, [key_text(*q) for q in bqs]))
        for matching, pre in (("key", "fuzzy"), ("entity", "entity_fuzzy")):
            self.enc.clear_cache()
            lat, accepted, wrong = timed(qs, truth, matching)
            cached, _, _ = timed(qs, truth, matching)  # again: embeddings from the cache, the rest as before
            self.report.update({f"{pre}_p50_ms": percentile_ms(lat, 50), f"{pre}_p99_ms": percentile_ms(lat, 99),
                                f"{pre}_accepted": round(accepted / max(len(lat), 1), 3),
                                f"{pre}_wrong_entity": round(wrong / max(len(lat), 1), 3),
                                f"{pre}_cached_p50_ms": percentile_ms(cached, 50), f"{pre}_cached_p99_ms": percentile_ms(cached, 99)})
            for name, cached in ((f"batched_{pre}_qps", False), (f"batched_{pre}_cached_qps", True)):  # uncached first:
                rates = batched_rates(kb, bqs, matching, None if cached else self.enc)  # its last pass fills the cache
                self.report.update({name: statistics.median(rates), f"{name}_passes": rates})
        r = self.report
        self.report["entity_vs_key"] = {
            "p50_ratio": round(r["entity_fuzzy_p50_ms"] / max(r["fuzzy_p50_ms"], 1e-9), 3),
            "batched_qps_ratio": round(r["batched_entity_fuzzy_qps"] / max(r["batched_fuzzy_qps"], 1e-9), 3)}

    def ann(self, count: int) -> None:
        """Top-1 of the index against an exact search over every live vector as made (float32, not as
        stored), a block at a time."""
        import faiss

        from ..kb import key_text

        qs = self._queries(count)
        self.log(f"ANN quality on {len(qs):,} perturbed queries")
        qv = self.enc.encode([key_text(e, r) for e, r in qs], cache=False, progress=len(qs) >= 5000)
        t = time.perf_counter()
        got_s, got = self.kb.key_index().search(qv, 1)
        search_s = time.perf_counter() - t
        ref_s = np.full(len(qv), -np.inf, dtype=np.float32)
        ref = np.full(len(qv), -1, dtype=np.int64)
        for start, block in self.vectors:
            s, i = faiss.knn(qv, block, 1, metric=faiss.METRIC_INNER_PRODUCT)
            better = s[:, 0] > ref_s
            ref_s[better], ref[better] = s[better, 0], i[better, 0] + start + 1  # key id = fact + 1
        true = np.einsum("nd,nd->n", self.vectors.rows(np.maximum(got[:, 0], 1) - 1), qv)
        same = (got[:, 0] == ref) | (np.abs(true - ref_s) < 1e-5)
        self.report.update(ann_queries=len(qs), ann_top1_agreement=round(float(same.mean()), 4),
                           ann_search_qps=round(len(qs) / search_s, 1),
                           ann_score_error_p99=round(float(np.quantile(np.abs(got_s[:, 0] - true), 0.99)), 4))

    def forget(self, fraction: float, retain_check: int, retain_exact: int | None, deleted_check: int) -> None:
        """Delete a random ``fraction`` of the facts as one forget set, then try to get them back:
        every deleted fact by its exact key (a probe of the store), ``deleted_check`` of them also
        entity-aware and by their own key vector, here and in a second process."""
        n, kb, rows = self.n, self.kb, self.rows
        k = int(round(fraction * n))
        gone = np.sort(self.rng.choice(n, size=k, replace=False))
        forget = [rows[i][:3] for i in gone.tolist()]
        self.log(f"forgetting {k:,} facts")
        t = time.perf_counter()
        removed = kb.forget(forget, who="bench", why="forget set")
        self.report.update(forgotten=removed, delete_forget_seconds=round(time.perf_counter() - t, 3))
        gone_set = set(map(tuple, forget))
        hits = lambda ms: sum(m is not None and (m.entity, m.relation, m.value) in gone_set for m in ms)  # noqa: E731
        some = draw_in_few_blocks(self.rng, gone, deleted_check, None if self.vectors is None else SyntheticVectors.BLOCK)
        self.log(f"looking the forgotten facts up: {k:,} by key, {len(some):,} entity-aware and by vector")
        bad = sum(hits(kb.lookup_batch([f[:2] for f in forget[i:i + 100_000]], fuzzy=False, matching="key"))
                  for i in range(0, k, 100_000))
        bad += hits(kb.lookup_batch([forget[i][:2] for i in some.tolist()], fuzzy=False))
        checked = f"{k} by exact key + {len(some)} entity-aware"
        vectors = None
        if self.vectors is not None:  # the deleted keys in their own spelling: any answer is another fact
            asked = [f[:2] for f in forget][:5000]
            self.report["deleted_keys_answered"] = {
                m: sum(1 for x in kb.lookup_batch(asked, matching=m) if x is not None) for m in ("key", "entity")}
            self.report["deleted_keys_asked"] = len(asked)
            texts = [perturb(self.rng, *self.keys[i]) for i in np.intersect1d(gone, self.sample).tolist()]
            vectors = self.vectors.rows(gone[some])
            bad += hits(kb.lookup_vectors(vectors, threshold=0.0)) + hits(kb.lookup_batch(texts, 0.0))
            checked += f" + {len(some)} by own key vector + {len(texts)} fuzzy texts"
        is_gone = np.zeros(n, dtype=bool)
        is_gone[gone] = True
        if retain_exact is not None and retain_exact < n - k:  # drawn until enough, not from a list of all
            kept = np.zeros(0, dtype=np.int64)
            while len(kept) < retain_exact:
                more = self.rng.integers(0, n, size=2 * (retain_exact - len(kept)) + 100)
                kept = np.union1d(kept, more[~is_gone[more]])
            kept = np.sort(self.rng.choice(kept, size=retain_exact, replace=False))
        else:
            kept = np.flatnonzero(~is_gone)
        del is_gone
        lost = 0
        for i in range(0, len(kept), 20_000):
            part = kept[i:i + 20_000].tolist()
            lost += sum(m is None or m.value != rows[j][2]
                        for j, m in zip(part, kb.lookup_batch([self.keys[j] for j in part], fuzzy=False)))
        retained = f"{len(kept)} exact"
        if self.vectors is not None:
            check = kept[draw_in_few_blocks(self.rng, kept, retain_check, SyntheticVectors.BLOCK)]
            lost += sum(m is None or m.value != rows[j][2]
                        for j, m in zip(check.tolist(), kb.lookup_vectors(self.vectors.rows(check))))
            retained += f" + {len(check)} by own key vector"
        # the second process opens the KB while this one has let go of its own (at 5.46 x 10^7 keys
        # two handles with their key indexes loaded do not fit in 24 GB)
        del kb
        self.release()
        self.log("looking the forgotten facts up from a second process")
        other = check_other_process(self.kb_dir, forget, some, vectors, self.map_kind)
        second = f"{k} by exact key + {len(some)} entity-aware" + (f" + {len(some)} by vector" if vectors is not None else "")
        self.report.update(deleted_retrievable=bad + other, deleted_retrievable_other_process=other,
                           deleted_checked=f"{checked} here; {second} in a second process",
                           retained_lost=lost, retained_checked=retained)

    def release(self) -> None:
        """Close the KB and let go of its key index, maps and entity index (memory given back to the
        system where the C library allows)."""
        if self.kb is None:
            return
        self.kb.close()
        self.kb = None
        gc.collect()
        trim_heap()

    def finish(self) -> dict:
        self.release()
        sizes = folder_bytes(self.kb_dir)
        store = sum(v for name, v in sizes.items() if name.startswith("kb.sqlite"))
        r = self.report
        r.update(disk_bytes_per_triple=round(sum(sizes.values()) / self.n),
                 store_bytes_per_triple=round(store / self.n),
                 index_bytes_per_triple=round(sizes.get("index.faiss", 0) / self.n), peak_rss_mb=round(peak_rss_mb()),
                 load_avg_end=round(os.getloadavg()[0], 2), seconds=round(time.perf_counter() - self.t0, 1))
        targets = {"exact_p50_ms<=0.2": ("exact_p50_ms", lambda x: x <= 0.2),
                   "fuzzy_p50_ms<=10": ("fuzzy_p50_ms", lambda x: x <= 10),
                   "batched_fuzzy_qps>=500": ("batched_fuzzy_qps", lambda x: x >= 500),
                   "entity_p50<=1.5x_key": ("entity_vs_key", lambda x: x["p50_ratio"] <= 1.5),
                   "entity_batched_qps>=key/1.5": ("entity_vs_key", lambda x: x["batched_qps_ratio"] >= 1 / 1.5),
                   "ann_top1_agreement>=0.99": ("ann_top1_agreement", lambda x: x >= 0.99),
                   "deleted_retrievable==0": ("deleted_retrievable", lambda x: x == 0),
                   "retained_lost==0": ("retained_lost", lambda x: x == 0)}
        r["targets_met"] = {name: ok(r[field]) for name, (field, ok) in targets.items() if field in r}
        if self.enc is not None:
            self.enc.threads = self.threads_before
        return r


def run_kb_bench(n: int, work: Path, embed_keys: int = 10_000, ann_queries: int = 10_000,
                 fuzzy_queries: int = 300, exact_queries: int = 5000, batched_queries: int = 2048,
                 forget_fraction: float = 0.05, retain_check: int = 20_000, retain_exact: int | None = None,
                 store_only: bool = False, encoder_threads: int | None = None, seed: int = 0, log=print,
                 map_kind: str = "auto", deleted_check: int = 100_000, on_phase=None, reuse: bool = False,
                 forget: bool = True, ann=None) -> dict:
    """Run every step on ``n`` synthetic triples in folder ``work``; returns the report.

    Args:
        store_only (bool, default False): no key vectors at all (store build, exact lookups and
            forgetting only), for sizes whose vectors would not fit in memory.
        retain_exact (int, optional): check this many retained facts exactly (default: all).
        encoder_threads (int, optional): torch threads for bulk encoding; None tries 1 and 2 and
            keeps the faster (on a machine whose cores are shared, one thread is often faster).
        map_kind (str, default "auto"): the reader's map of the store: ``memory``, ``store`` or by size.
        deleted_check (int, default 100_000): deleted facts also looked up entity-aware and by their
            own vector (every deleted fact is looked up by its exact key).
        on_phase (callable, optional): given ``(phase, report so far)`` after each phase, so that a run
            of hours stopped part way keeps what it measured.
        reuse (bool, default False): open the KB an earlier run with the same ``n`` and ``seed`` left in
            ``work`` (as built: see ``forget``) instead of building it; no build or index figures.
        forget (bool, default True): False skips the forget phase, leaving the KB as built for ``reuse``.
        ann (AnnConfig, optional): the key index's sizes and layout (default: the KB's default).
    """
    run = _KBBench(n, work, encoder_threads, store_only, seed, log, map_kind, reuse, ann)
    def done(phase: str) -> None:
        run.report.setdefault("rss_mb_after", {})[phase] = round(rss_mb())  # memory held, phase by phase
        if on_phase:
            on_phase(phase, dict(run.report, finished=False, phase=phase))

    run.build()
    done("build")
    if store_only:
        run.report["method"] = ("store only: no key vectors (exact lookups and forgetting; fuzzy and ANN "
                                "numbers come from a run with vectors)")
    else:
        run.index(embed_keys)
        done("index")
    run.exact(exact_queries)
    done("exact")
    if not store_only:
        run.fuzzy(fuzzy_queries, batched_queries)
        done("fuzzy")
        run.ann(ann_queries)
        done("ann")
    if forget:
        run.forget(forget_fraction, retain_check, retain_exact, deleted_check)
        done("forget")
    return dict(run.finish(), finished=True)


@bench_app.command("kb")
def bench_kb(triples: int = typer.Option(100_000, help="synthetic triples in the KB"),
             embed_keys: int = typer.Option(10_000, min=1, help="keys embedded with the real encoder; the rest get "
                                                         "synthetic vectors near them"),
             ann_queries: int = typer.Option(10_000, min=1, help="perturbed queries for ANN top-1 agreement"),
             fuzzy_queries: int = typer.Option(300, min=1, help="single fuzzy lookups timed"),
             encoder_threads: int = typer.Option(0, min=0, help="torch threads for bulk encoding (0: try 1 and 2, keep "
                                                         "the faster)"),
             store_only: bool = typer.Option(False, help="no key vectors: store build, exact lookups and "
                                                         "forgetting only (for 10^7 triples)"),
             retain_exact: int = typer.Option(0, min=0, help="retained facts looked up exactly after forgetting "
                                                      "(0: all)"),
             deleted_check: int = typer.Option(100_000, help="deleted facts also looked up entity-aware and by "
                                                             "their own vector (all by exact key)"),
             batched_queries: int = typer.Option(2048, min=1, help="fuzzy lookups timed in batches of 256"),
             work: Path = typer.Option(Path("runs/bench-kb"), help="folder for the KB (replaced)"),
             keep: bool = typer.Option(False, help="keep the KB folder afterwards (a --reuse KB is always kept)"),
             out: Optional[Path] = typer.Option(None, help="also write the JSON here (after each phase too, "
                                                           "with finished false)"),
             seed: int = typer.Option(0),
             reuse: bool = typer.Option(False, help="open the KB an earlier run of the same --triples and --seed "
                                                    "kept in --work (with --keep --no-forget) instead of building it"),
             forget: bool = typer.Option(True, "--forget/--no-forget", help="run the forget phase (it changes the "
                                                                            "KB; --no-forget keeps it as built for --reuse)"),
             map_kind: str = typer.Option("auto", "--map", help="the reader's map of the store: memory (every key "
                                          "held), store (lookups read from the store) or auto (by size)"),
             ann: str = typer.Option("", help="key index: AnnConfig fields, NAME=INT,... (e.g. pq_min=500000)")):
    """Build, lookup latency, ANN quality and a 5% forget set at N triples; JSON last line."""
    if triples < 100:
        raise typer.BadParameter(f"--triples must be at least 100, got {triples}")
    if deleted_check < 1:
        raise typer.BadParameter(f"--deleted-check must be at least 1, got {deleted_check}")
    if map_kind not in ("auto", *MAP_LIMITS):
        raise typer.BadParameter(f"--map must be auto, memory or store, got {map_kind!r}")
    try:
        config = ann_config(ann)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None
    work.mkdir(parents=True, exist_ok=True)
    try:
        report = run_kb_bench(triples, work, embed_keys=embed_keys, ann_queries=ann_queries,
                              fuzzy_queries=fuzzy_queries, batched_queries=batched_queries,
                              encoder_threads=encoder_threads or None, store_only=store_only,
                              retain_exact=retain_exact or None, seed=seed, map_kind=map_kind,
                              deleted_check=deleted_check, log=lambda s: print(s, file=sys.stderr), reuse=reuse,
                              forget=forget, ann=config,
                              on_phase=(lambda phase, r: write_json(out, r)) if out is not None else None)
    except ValueError as e:
        if not reuse:
            raise
        typer.echo(f"Error: {e}", err=True)
        raise typer.Exit(2)
    if not keep and not reuse:  # a reused KB is the user's: never removed
        shutil.rmtree(work / "kb", ignore_errors=True)
    if out is not None:
        write_json(out, report)
    print(json.dumps(report))

