"""Token shards: a corpus tokenized once, in parallel, into memory-mapped ids and roles.

``lmlm data prepare CORPUS --tokenizer T --out SHARDS`` reads the documents of any format of
:mod:`lmlm.corpus` as a stream, tokenizes them in worker processes (all cores by default) with
their lookup calls, and writes, per shard of about ``shard_tokens`` tokens:

* ``shard-00000.ids.bin``: the token ids, ``uint16`` when the vocabulary fits, else ``uint32``
  (nanoGPT's ``train.bin``);
* ``shard-00000.roles.bin``: one ``uint8`` role per token (org, call, entity, relation, value);
* ``shard-00000.docs.npy``: where each document starts in the shard.

``manifest.json`` records the tokenizer (saved in ``SHARDS/tokenizer``) and its hash, the counts
per role, lookup calls and documents. Writing is resumable: a shard is written under a temporary
name and renamed when complete, and the manifest, updated after each shard, says how many
documents are done; running the same command again skips them and finishes the job.

Training streams blocks from the shards (:class:`ShardBlocks`): memory stays flat as the corpus
grows, the block order is a pure function of the step (resuming lands on the exact next batch), and
several processes read disjoint slices of each global batch. The LMLM and the Standard baseline
read the same shards: Standard is the ``org`` view (every call removed, cached in
``SHARDS/standard/``), whose tokens are exactly the stripped text's.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from collections import deque
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch

from ..corpus import CorpusError, iter_located
from ..errors import LmlmError
from ..jsonio import write_json
from ..tokens import IGNORE_INDEX, ORG, ROLE_NAMES, VALUE, LookupTokenizer

__all__ = ["prepare_shards", "ShardBlocks", "read_manifest", "is_shards", "tokenizer_hash", "MANIFEST", "ShardError"]

MANIFEST = "manifest.json"
FORMAT = 1


class ShardError(LmlmError, ValueError):
    """Shards that cannot be written or read as asked; the message names the folder and the problem."""


def is_shards(path: str | Path) -> bool:
    return (Path(path) / MANIFEST).is_file()


def read_manifest(folder: str | Path) -> dict[str, Any]:
    path = Path(folder) / MANIFEST
    if not path.is_file():
        raise ShardError(f"{folder}: not a shards folder (no {MANIFEST}); make one with lmlm data prepare")
    return json.loads(path.read_text())


def tokenizer_hash(tokenizer: LookupTokenizer) -> str:
    """A hash of the tokenizer's full definition (vocabulary, merges, specials) and lookup tokens."""
    h = hashlib.sha256(tokenizer.hf.backend_tokenizer.to_str().encode())
    h.update(json.dumps(tokenizer.tokens.as_list()).encode())
    return h.hexdigest()[:16]


# -- workers -------------------------------------------------------------------------------------------

_TOK: LookupTokenizer | None = None


def _init_worker(tok_dir: str, tokens: list[str]) -> None:
    global _TOK
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle: no traceback per worker
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    torch.set_num_threads(1)
    from ..lookup import LookupTokens
    from ..tokens import load_tokenizer

    _TOK = load_tokenizer(tok_dir, LookupTokens(*tokens))


def _encode_chunk(located: list[tuple[str, str]], skip_malformed: bool = False):
    """(ids, roles, document lengths, lookup calls, malformed) of a chunk of ``(where, annotated)`` documents.

    A document with a malformed lookup call is left out and counted in ``malformed``
    (:class:`lmlm.train.data.Malformed`); without ``skip_malformed`` the chunk stops there.
    """
    from ..lookup import Lookup, parse
    from ..train.data import Malformed, call_problems

    tok = _TOK
    ids: list[int] = []
    roles: list[int] = []
    lengths: list[int] = []
    calls = 0
    malformed = Malformed()
    for where, text in located:
        malformed.total += 1
        if problems := call_problems(text, tok.tokens):
            malformed.add(where, problems[0])
            if not skip_malformed:
                break
            continue
        segments = parse(text).segments
        calls += sum(isinstance(s, Lookup) for s in segments)
        enc = tok.encode(segments)
        ids += enc.input_ids
        roles += enc.roles
        lengths.append(len(enc.input_ids))
    return (np.asarray(ids, dtype=np.int64), np.asarray(roles, dtype=np.uint8), np.asarray(lengths, dtype=np.int64),
            calls, malformed)


# -- writing -------------------------------------------------------------------------------------------

class _ShardWriter:
    """Appends encoded chunks to the open shard; a shard becomes visible (renamed) once complete."""

    def __init__(self, folder: Path, manifest: dict[str, Any], dtype: np.dtype, end_id: int):
        self.folder, self.manifest, self.dtype, self.end_id = folder, manifest, dtype, end_id
        self.skipped = 0  # documents left out for malformed calls since the last shard written
        self._open()

    def _open(self) -> None:
        self.name = f"shard-{len(self.manifest['shards']):05d}"
        self.ids_f = open(self.folder / f"{self.name}.ids.bin.tmp", "wb")
        self.roles_f = open(self.folder / f"{self.name}.roles.bin.tmp", "wb")
        self.starts: list[int] = []
        self.tokens = 0
        self.counts = np.zeros(len(ROLE_NAMES), dtype=np.int64)
        self.calls = self.end_tokens = 0

    def add(self, ids: np.ndarray, roles: np.ndarray, lengths: np.ndarray, calls: int, skipped: int = 0) -> None:
        self.skipped += skipped  # documents left out, kept with the shard so a resumed job starts after them
        if not len(lengths):
            return
        starts = self.tokens + np.concatenate([[0], np.cumsum(lengths)[:-1]])
        self.starts += starts.tolist()
        self.ids_f.write(ids.astype(self.dtype).tobytes())
        self.roles_f.write(roles.tobytes())
        self.tokens += len(ids)
        self.counts += np.bincount(roles, minlength=len(ROLE_NAMES))
        self.calls += calls
        self.end_tokens += int((ids == self.end_id).sum())

    def close(self) -> None:
        """Finish the open shard (if it holds anything) and record it in the manifest."""
        self.ids_f.close()
        self.roles_f.close()
        if not self.starts:
            for suffix in ("ids", "roles"):
                (self.folder / f"{self.name}.{suffix}.bin.tmp").unlink()
            if self.skipped and self.manifest["shards"]:  # documents left out after the last shard's
                last = self.manifest["shards"][-1]
                last["skipped_malformed"] = last.get("skipped_malformed", 0) + self.skipped
                self.skipped = 0
                _totals(self.manifest)
                write_json(self.folder / MANIFEST, self.manifest, indent=1)
            return
        np.save(self.folder / f"{self.name}.docs.npy", np.asarray(self.starts, dtype=np.int64))
        for suffix in ("ids", "roles"):
            os.replace(self.folder / f"{self.name}.{suffix}.bin.tmp", self.folder / f"{self.name}.{suffix}.bin")
        m = self.manifest
        roles = dict(zip(ROLE_NAMES, self.counts.tolist()))
        m["shards"].append({"name": self.name, "tokens": self.tokens, "documents": len(self.starts),
                            "lookup_calls": self.calls, "end_tokens": self.end_tokens, "role_counts": roles,
                            "skipped_malformed": self.skipped})
        self.skipped = 0
        _totals(m)
        write_json(self.folder / MANIFEST, m, indent=1)

    def roll(self) -> None:
        self.close()
        self._open()


def _totals(m: dict[str, Any]) -> None:
    """The manifest's totals, summed over its shards."""
    shards = m["shards"]
    for key in ("documents", "tokens", "lookup_calls", "end_tokens", "skipped_malformed"):
        m[key] = sum(s.get(key, 0) for s in shards)
    m["role_counts"] = {name: sum(s["role_counts"][name] for s in shards) for name in ROLE_NAMES}


def _chunks(docs: Iterator, size: int) -> Iterator[list[tuple[str, str]]]:
    chunk: list[tuple[str, str]] = []
    for where, d in docs:
        chunk.append((where, d.annotated))
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def prepare_shards(corpus: str | Path, tokenizer: LookupTokenizer, out: str | Path, *, workers: int | None = None,
                   shard_tokens: int = 1 << 26, chunk_documents: int = 256, split: str | None = None,
                   progress: bool = True, skip_malformed: bool = False) -> dict[str, Any]:
    """Tokenize ``corpus`` into shards in ``out`` (see the module docstring); returns the manifest.

    Args:
        corpus: a document file or ``datasets`` folder (:mod:`lmlm.corpus`).
        tokenizer: the :class:`LookupTokenizer` (saved into ``out/tokenizer``).
        out: the shards folder; if it holds an unfinished job for the same corpus and tokenizer, the job
            continues; a finished one is returned as is.
        workers: tokenizer processes (default: the cores this process may use).
        shard_tokens: start a new shard after this many tokens.
        chunk_documents: documents per task sent to a worker.
        split: only documents of this split.
        skip_malformed: leave out the documents with a malformed lookup call (counted as
            ``skipped_malformed``); by default the first one stops the job with a
            :class:`lmlm.train.data.MalformedCallError` naming ``FILE:LINE`` (the shards finished
            before it stay, and the job resumes with ``skip_malformed``).
    """
    out = Path(out)
    corpus = Path(corpus)
    if not corpus.exists():
        raise CorpusError(f"{corpus}: no such file or folder")
    if shard_tokens <= 0 or chunk_documents <= 0:
        raise ShardError("shard_tokens and chunk_documents must be positive")
    thash = tokenizer_hash(tokenizer)
    source = {"corpus": str(corpus.resolve()), "corpus_bytes": _size(corpus), "split": split}
    out.mkdir(parents=True, exist_ok=True)
    manifest = _start_or_resume(out, source, tokenizer, thash)
    if manifest["complete"]:
        return manifest
    for stale in out.glob("*.tmp"):
        stale.unlink()
    dtype = np.dtype(manifest["dtype"])
    skip = manifest["documents"] + manifest.get("skipped_malformed", 0)
    docs = iter_located(corpus, split=split)
    for _ in range(skip):  # resume: the documents of finished shards
        next(docs, None)
    if workers is None:
        workers = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    writer = _ShardWriter(out, manifest, dtype, tokenizer.end_id)
    bar = _bar(progress, corpus, skip)
    t0 = time.perf_counter()
    tokens_before = manifest["tokens"]
    import multiprocessing as mp

    with ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn"), initializer=_init_worker,
                             initargs=(str(out / "tokenizer"), tokenizer.tokens.as_list())) as pool:
        pending: deque = deque()
        chunks = _chunks(docs, chunk_documents)
        for chunk in chunks:
            pending.append(pool.submit(_encode_chunk, chunk, skip_malformed))
            if len(pending) >= 4 * workers:  # a bounded window: memory does not grow with the corpus
                _take(pending.popleft().result(), writer, shard_tokens, bar, skip_malformed)
        while pending:
            _take(pending.popleft().result(), writer, shard_tokens, bar, skip_malformed)
    writer.close()
    if bar is not None:
        bar.close()
    if manifest["documents"] == 0:  # nothing to train on: no shards folder is left behind, complete or not
        (out / MANIFEST).unlink()
        shutil.rmtree(out / "tokenizer", ignore_errors=True)
        raise CorpusError(f"{corpus}: no documents" + (f" of split {split!r}" if split else "") + (
            f" without a malformed lookup call ({writer.skipped} left out)" if writer.skipped else ""))
    manifest["complete"] = True
    manifest["seconds"] = manifest.get("seconds", 0.0) + time.perf_counter() - t0
    manifest["tokens_per_second_last_run"] = (manifest["tokens"] - tokens_before) / max(time.perf_counter() - t0, 1e-9)
    write_json(out / MANIFEST, manifest, indent=1)
    return manifest


def _take(result, writer: _ShardWriter, shard_tokens: int, bar, skip_malformed: bool = False) -> None:
    ids, roles, lengths, calls, malformed = result
    if malformed.documents and not skip_malformed:
        writer.add(ids, roles, lengths, calls)  # the documents before it are done
        writer.close()
        raise malformed.error(counted=False)
    writer.add(ids, roles, lengths, calls, malformed.documents)
    if bar is not None:
        bar.update(len(lengths))
        bar.set_postfix(tokens=f"{writer.manifest['tokens'] + writer.tokens:,}", refresh=False)
    if writer.tokens >= shard_tokens:
        writer.roll()


def _bar(enabled: bool, corpus: Path, initial: int):
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(desc=f"prepare {corpus.name}", unit="doc", initial=initial, dynamic_ncols=True)


def _size(path: Path) -> int:
    if path.is_dir():
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return path.stat().st_size


def _start_or_resume(out: Path, source: dict, tokenizer: LookupTokenizer, thash: str) -> dict[str, Any]:
    if (out / MANIFEST).exists():
        m = read_manifest(out)
        if m.get("format") != FORMAT:
            raise ShardError(f"{out}: shards of format {m.get('format')}, this lmlm writes format {FORMAT}")
        diffs = [f"{k}: {m['source'].get(k)!r} -> {v!r}" for k, v in source.items() if m["source"].get(k) != v]
        if m["tokenizer_hash"] != thash:
            diffs.append(f"tokenizer: {m['tokenizer_hash']} -> {thash}")
        if diffs:
            raise ShardError(f"{out} holds shards of another corpus or tokenizer ({'; '.join(diffs)}); "
                             "choose another --out or delete the folder")
        _totals(m)  # the shards listed are the truth; totals follow from them
        return m
    tokenizer.save(out / "tokenizer")
    vocab = len(tokenizer)
    m = {"format": FORMAT, "source": source, "tokenizer_hash": thash, "vocab_size": vocab,
         "dtype": "uint16" if vocab <= 1 << 16 else "uint32", "lookup_tokens": tokenizer.tokens.as_list(),
         "doc_id": tokenizer.doc_id, "eos_id": tokenizer.eos_id, "end_id": tokenizer.end_id,
         "shards": [], "documents": 0, "tokens": 0, "lookup_calls": 0, "end_tokens": 0,
         "role_counts": {name: 0 for name in ROLE_NAMES}, "complete": False}
    write_json(out / MANIFEST, m, indent=1)
    return m


# -- reading -------------------------------------------------------------------------------------------

class ShardBlocks:
    """Blocks of ``seq_len`` tokens read from shards: the same blocks :func:`lmlm.train.pack` makes.

    Args:
        folder: a finished shards folder.
        seq_len: block length.
        mode: ``"lmlm"`` (ids with calls, values and ``<|db_end|>`` untrained) or ``"standard"``
            (the ``org`` view: the stripped text's tokens).
    """

    def __init__(self, folder: str | Path, seq_len: int, mode: str = "lmlm"):
        self.folder = Path(folder)
        self.manifest = m = read_manifest(folder)
        if not m["complete"]:
            raise ShardError(f"{folder}: unfinished shards (run lmlm data prepare again to finish them)")
        if mode not in ("lmlm", "standard"):
            raise ValueError(f"mode must be 'lmlm' or 'standard', got {mode!r}")
        self.seq_len, self.mode = seq_len, mode
        self.dtype = np.dtype(m["dtype"])
        self.end_id, self.pad_id = m["end_id"], m["eos_id"]
        names = [s["name"] for s in m["shards"]]
        if mode == "standard":
            self._ids = [np.memmap(self._org_view(n), dtype=self.dtype, mode="r") for n in names]
            self._roles = None
        else:
            self._ids = [np.memmap(self.folder / f"{n}.ids.bin", dtype=self.dtype, mode="r") for n in names]
            self._roles = [np.memmap(self.folder / f"{n}.roles.bin", dtype=np.uint8, mode="r") for n in names]
        sizes = [len(a) for a in self._ids]
        self._offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        self.num_tokens = int(self._offsets[-1])
        self._num_blocks = -(-self.num_tokens // seq_len)

    def _org_view(self, name: str) -> Path:
        """The shard's ``org`` tokens (calls removed), written once under ``standard/``."""
        path = self.folder / "standard" / f"{name}.ids.bin"
        if not path.exists():
            path.parent.mkdir(exist_ok=True)
            ids = np.memmap(self.folder / f"{name}.ids.bin", dtype=self.dtype, mode="r")
            roles = np.memmap(self.folder / f"{name}.roles.bin", dtype=np.uint8, mode="r")
            tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
            np.asarray(ids[roles == ORG]).tofile(tmp)
            os.replace(tmp, path)
        return path

    def __len__(self) -> int:
        return self._num_blocks

    def _span(self, arrays, start: int, stop: int) -> np.ndarray:
        """Tokens ``start:stop`` of the concatenated shards."""
        first = int(np.searchsorted(self._offsets, start, side="right")) - 1
        parts, pos = [], start
        k = first
        while pos < stop and k < len(arrays):
            lo = pos - self._offsets[k]
            hi = min(stop, self._offsets[k + 1]) - self._offsets[k]
            parts.append(np.asarray(arrays[k][lo:hi]))
            pos = self._offsets[k] + hi
            k += 1
        return np.concatenate(parts) if len(parts) > 1 else parts[0]

    def _raw(self, idx: torch.Tensor) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Ids, roles (both ``(len(idx), seq_len)``, padded with eos/org) and real length of blocks ``idx``."""
        L = self.seq_len
        ids = np.full((len(idx), L), self.pad_id, dtype=np.int64)
        roles = np.full((len(idx), L), ORG, dtype=np.int64)
        real = np.empty(len(idx), dtype=np.int64)
        for row, b in enumerate(idx.tolist()):
            start = b * L
            stop = min(start + L, self.num_tokens)
            real[row] = stop - start
            ids[row, :real[row]] = self._span(self._ids, start, stop)
            if self._roles is not None:
                roles[row, :real[row]] = self._span(self._roles, start, stop)
        return ids, roles, real

    def _labels(self, ids: np.ndarray, roles: np.ndarray, real: np.ndarray) -> np.ndarray:
        labels = np.where((roles == VALUE) | (ids == self.end_id), IGNORE_INDEX, ids)
        labels[np.arange(self.seq_len)[None, :] >= real[:, None]] = IGNORE_INDEX  # padding: untrained
        return labels

    def blocks(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(input_ids, targets, target_roles)`` of blocks ``idx``, each ``(len(idx), seq_len)`` int64."""
        ids, roles, real = self._raw(idx)
        labels = self._labels(ids, roles, real)
        n = len(idx)
        targets = np.concatenate([labels[:, 1:], np.full((n, 1), IGNORE_INDEX)], axis=1)
        target_roles = np.concatenate([roles[:, 1:], np.full((n, 1), ORG)], axis=1)
        return torch.from_numpy(ids), torch.from_numpy(targets), torch.from_numpy(target_roles)

    def positions(self, idx: torch.Tensor) -> None:
        """None: a stream's blocks count their positions from 0 (see :class:`lmlm.train.data.Packed`)."""
        return None

    def real_tokens(self, idx: torch.Tensor) -> int:
        """How many of the tokens of blocks ``idx`` are data (the last block is padded)."""
        starts = idx.to(torch.long) * self.seq_len
        return int((self.num_tokens - starts).clamp(0, self.seq_len).sum())

    def trained_tokens(self) -> int:
        """Tokens with a label (values and ``<|db_end|>`` excluded in ``lmlm`` mode)."""
        m = self.manifest
        if self.mode == "standard":
            return m["role_counts"]["org"]
        return m["tokens"] - m["role_counts"]["value"] - m["end_tokens"]

    def to_packed(self):
        """All blocks in memory as :class:`lmlm.train.Packed` (for small evaluation sets)."""
        from ..train.data import Packed

        ids, roles, real = self._raw(torch.arange(len(self)))
        labels = self._labels(ids, roles, real)
        return Packed(torch.from_numpy(ids), torch.from_numpy(roles), torch.from_numpy(labels),
                      num_tokens=self.num_tokens)
