"""Helpers of ``lmlm bench kb`` that stand outside its phases: the deleted-facts check from a second
process, the encoder's thread probe, batched lookup rates, a KB folder's file sizes. Exercised by ``lmlm bench kb``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

__all__ = ["MAP_LIMITS", "ann_config", "batched_rates", "check_other_process", "draw_in_few_blocks", "encode_rates",
           "folder_bytes", "pick_threads"]


def folder_bytes(path: Path) -> dict[str, int]:
    return {f.name: f.stat().st_size for f in path.iterdir() if f.is_file()}


MAP_LIMITS = {"memory": 2**62, "store": 0}  # KnowledgeBase.map_limit per --map (auto: the default)


def check_other_process(kb_dir: Path, deleted: list, some: np.ndarray, vectors: np.ndarray | None,
                         map_kind: str = "auto") -> int:
    """Open the KB in a fresh process; count deleted facts it can still retrieve: every one by its
    exact key, those at ``some`` entity-aware too, and ``vectors`` (theirs) by vector."""
    with tempfile.TemporaryDirectory() as tmp:
        if vectors is not None:
            np.save(Path(tmp) / "v.npy", vectors)
        Path(tmp, "d.json").write_text(json.dumps({"deleted": deleted, "some": some.tolist()}))
        code = ("import json, os, sys, numpy as np\nfrom lmlm.kb import KnowledgeBase\n"
                "kb = KnowledgeBase.open(sys.argv[1])\nd = json.load(open(sys.argv[2]))\n"
                "gone = {tuple(x) for x in d['deleted']}\nkeys = [(e, r) for e, r, v in d['deleted']]\n"
                "hits = lambda ms: sum(m is not None and (m.entity, m.relation, m.value) in gone for m in ms)\n"
                "bad = sum(hits(kb.lookup_batch(keys[i:i + 100000], fuzzy=False, matching='key'))\n"
                "          for i in range(0, len(keys), 100000))\n"
                "bad += hits(kb.lookup_batch([keys[i] for i in d['some']], fuzzy=False))\n"
                "if os.path.exists(sys.argv[3]):\n"
                "    bad += hits(kb.lookup_vectors(np.load(sys.argv[3]), threshold=0.0))\n"
                "print(bad)\n")
        env = dict(os.environ)
        if map_kind in MAP_LIMITS:
            env["LMLM_KB_MAP_LIMIT"] = str(MAP_LIMITS[map_kind])
        out = subprocess.run([sys.executable, "-c", code, str(kb_dir), str(Path(tmp) / "d.json"),
                              str(Path(tmp) / "v.npy")], capture_output=True, text=True, check=True, env=env)
    return int(out.stdout.strip().splitlines()[-1])


def pick_threads(enc, texts: list[str], rounds: int = 3) -> dict[int, float]:
    """Encoder keys/s with 1 and 2 torch threads on the same texts, the best of ``rounds`` runs each,
    taken in turn (a single run is at the mercy of whatever else the machine does at that moment: at
    5.46 x 10^7 triples one probe read 1,350 keys/s with 1 thread and 1,320 with 2, where two threads
    usually encode 1.6-1.8x faster). The encoder keeps 2 unless 1 is faster by 10% or more."""
    rates: dict[int, float] = {1: 0.0, 2: 0.0}
    for _ in range(rounds):
        for n in (1, 2):
            enc.threads = n
            t = time.perf_counter()
            enc.encode(texts, cache=False)
            rates[n] = max(rates[n], round(len(texts) / (time.perf_counter() - t), 1))
    enc.threads = 1 if rates[1] >= 1.1 * rates[2] else 2
    return rates


def batched_rates(kb, queries: list[tuple[str, str]], matching: str, clear=None, passes: int = 3,
                  batch: int = 256) -> list[float]:
    """Lookups per second of ``kb.lookup_batch`` over ``queries``, ``batch`` at a time, in each of
    ``passes`` passes (one pass is at the mercy of whatever else the machine does at that moment);
    ``clear``: an encoder whose query cache is emptied before each pass (None: the cache is kept)."""
    rates = []
    for _ in range(passes):
        if clear is not None:
            clear.clear_cache()
        t = time.perf_counter()
        for i in range(0, len(queries), batch):
            kb.lookup_batch(queries[i:i + batch], matching=matching)
        rates.append(round(len(queries) / (time.perf_counter() - t), 1))
    return rates


def encode_rates(enc, texts: list[str], passes: int = 3, batch: int = 256) -> list[float]:
    """Texts per second of ``enc`` alone over ``texts``, ``batch`` at a time, uncached, in each of ``passes``."""
    rates = []
    for _ in range(passes):
        t = time.perf_counter()
        for i in range(0, len(texts), batch):
            enc.encode(texts[i:i + batch], cache=False)
        rates.append(round(len(texts) / (time.perf_counter() - t), 1))
    return rates


def draw_in_few_blocks(rng: np.random.Generator, facts: np.ndarray, count: int, block: int | None) -> np.ndarray:
    """Positions (ascending) of ``count`` of ``facts`` (fact indices), drawn from as few blocks of
    ``block`` facts as hold that many, in random blocks: the synthetic vectors are made a block at a
    time, and those of facts scattered over all blocks took a pass over every vector (13 min at
    5.46 x 10^7). ``block`` None: drawn from all facts."""
    count = min(count, len(facts))
    if block is None:
        return np.sort(rng.choice(len(facts), size=count, replace=False))
    of = np.asarray(facts) // block
    picked, total = [], 0
    for b in rng.permutation(np.unique(of)).tolist():
        at = np.flatnonzero(of == b)
        picked.append(at)
        total += len(at)
        if total >= count:
            break
    pos = np.concatenate(picked) if picked else np.zeros(0, dtype=np.int64)
    return np.sort(rng.choice(pos, size=count, replace=False))


def ann_config(spec: str):
    """The key index's :class:`lmlm.kb.index.AnnConfig` from ``--ann`` ``NAME=INT,...`` (its fields;
    empty: the defaults), so another index layout is measured on the same draws; ValueError names
    the part that is wrong."""
    from dataclasses import fields

    from ..kb.index import AnnConfig

    known, values = {f.name for f in fields(AnnConfig)}, {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        name, eq, value = (x.strip() for x in part.partition("="))
        if not eq or name not in known:
            raise ValueError(f"--ann: expected NAME=INT, NAME one of {', '.join(sorted(known))}; got {part!r}")
        try:
            values[name] = int(value.replace("_", ""))
        except ValueError:
            raise ValueError(f"--ann: {name} must be an integer, got {value!r}") from None
    return AnnConfig(**values)  # its own checks (positive, ivf_min >= flat_max, ...) raise ValueError too
