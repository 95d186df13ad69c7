"""The key index's file: one file, replaced atomically, read front to back.

Layout: an 8-byte magic, a 4-byte little-endian header length, a JSON header (``version`` of the
store it reflects, ``kind``, ``dim``, ``encoder``, ``rows``, ...), then the body that
:class:`lmlm.kb.index.VectorKeyIndex` writes (key ids, alive mask, stored rows, the row codec, the
FAISS structure). Readers check the header alone (:func:`read_header`) to decide whether the file is
newer than what they hold. The body is written and read through a file object, so saving or loading
an index of 5 x 10^7 keys holds no second copy of it in memory. Exercised by every KB that saves
its key index (``lmlm kb build``, ``lmlm bench kb``).
"""

from __future__ import annotations

import json
import os
import struct
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Callable, Iterator

import numpy as np

__all__ = ["MAGIC", "read_header", "write_atomically", "open_body", "read_array", "write_array"]

MAGIC = b"LMLMIDX1"


def read_header(path: str | os.PathLike) -> dict | None:
    """The JSON header of an index file, or None when the file is missing or not an index file."""
    try:
        with open(path, "rb") as f:
            return _header(f)
    except (OSError, ValueError):
        return None


def _header(f: IO[bytes]) -> dict | None:
    head = f.read(len(MAGIC) + 4)
    if len(head) < len(MAGIC) + 4 or head[:len(MAGIC)] != MAGIC:
        return None
    (n,) = struct.unpack("<I", head[len(MAGIC):])
    return json.loads(f.read(n).decode("utf-8"))


@contextmanager
def open_body(path: str | os.PathLike) -> Iterator[tuple[dict, IO[bytes]] | None]:
    """``(header, file at the start of the body)``, or None for a missing or foreign file."""
    try:
        f = open(path, "rb")
    except OSError:
        yield None
        return
    with f:
        try:
            header = _header(f)
        except ValueError:
            header = None
        yield None if header is None else (header, f)


def _remove_stale_temps(path: Path) -> None:
    """Delete temp files of saves whose process died mid-write (SIGKILL skips their cleanup)."""
    for tmp in path.parent.glob(f".{path.name}.*.tmp"):
        try:
            pid = int(tmp.name.rsplit(".", 2)[-2])
            os.kill(pid, 0)  # raises when no such process
        except (ValueError, ProcessLookupError):
            tmp.unlink(missing_ok=True)
        except OSError:
            pass  # a live process of another user: leave it


def write_atomically(path: str | os.PathLike, header: dict, write_body: Callable[[IO[bytes]], None]) -> None:
    """Write ``header`` and the body ``write_body(f)`` writes to ``path`` (temp file, fsync, rename)."""
    path = Path(path)
    head = json.dumps(header).encode("utf-8")
    _remove_stale_temps(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(MAGIC + struct.pack("<I", len(head)) + head)
            write_body(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def write_array(f: IO[bytes], a: np.ndarray) -> None:
    f.write(memoryview(np.ascontiguousarray(a)).cast("B"))


def read_array(f: IO[bytes], dtype, shape: tuple[int, ...]) -> np.ndarray:
    """An array of ``shape`` read straight into its own memory; ValueError if the file ends first."""
    out = np.empty(shape, dtype=dtype)
    view = memoryview(out.reshape(-1)).cast("B")
    got = f.readinto(view) if view.nbytes else 0
    if got != view.nbytes:
        raise ValueError(f"index file ends after {got} of {view.nbytes} bytes of a {dtype} array")
    return out


def key_ids_layout(keys: np.ndarray) -> dict:
    """How an index file stores the key id of each row: ``{"as": "bitmap", "first": a, "last": b}``
    when the ids rise row by row (a KB indexed from its store in one go: one bit for each id from
    ``a`` to ``b``, an eighth of a byte a key where int32 takes 4), else ``{"as": "int32"}``."""
    n = len(keys)
    if n == 0:
        return {"as": "int32"}
    for i in range(0, n - 1, 1 << 22):  # a chunk at a time: no int64 difference of 10^7 ids
        part = keys[i:min(i + (1 << 22) + 1, n)]
        if (part[1:] <= part[:-1]).any():
            return {"as": "int32"}
    first, last = int(keys[0]), int(keys[-1])
    return {"as": "bitmap", "first": first, "last": last} if (last - first + 1) // 8 < 4 * n else {"as": "int32"}


def write_key_ids(f: IO[bytes], keys: np.ndarray, layout: dict) -> None:
    if layout["as"] == "int32":
        write_array(f, np.asarray(keys, dtype=np.int32))
        return
    first, span = layout["first"], layout["last"] - layout["first"] + 1
    mask = np.zeros(span, dtype=bool)  # a byte a key id for a moment (55 MB at 5.5 x 10^7)
    for i in range(0, len(keys), 1 << 22):
        mask[keys[i:i + (1 << 22)] - first] = True
    write_array(f, np.packbits(mask, bitorder="little"))


def read_key_ids(f: IO[bytes], layout: dict, n: int) -> np.ndarray:
    """The ``(n,)`` int32 key ids :func:`write_key_ids` wrote; ValueError if they are not ``n``."""
    if layout.get("as", "int32") == "int32":
        return read_array(f, np.int32, (n,))
    first, span = int(layout["first"]), int(layout["last"]) - int(layout["first"]) + 1
    bits = np.unpackbits(read_array(f, np.uint8, ((span + 7) // 8,)), count=span, bitorder="little")
    keys = np.flatnonzero(bits).astype(np.int32)
    if len(keys) != n:
        raise ValueError(f"index file's key id bitmap holds {len(keys)} ids for {n} rows")
    return keys + np.int32(first)
