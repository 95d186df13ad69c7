"""Atomic JSON and JSONL writes: a file holds the whole of what was written or its previous content.

Ground floor, imports nothing from lmlm. Every summary, manifest, ``done.json`` and ``report.json`` a
command writes goes through :func:`write_json` (a stage's result exists only once the stage is
complete; a killed run keeps its last report); line files of records through :func:`write_jsonl`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable

__all__ = ["write_json", "write_jsonl", "read_json"]


def _tmp(path: Path) -> Path:
    return path.with_name(path.name + ".tmp")


def write_json(path: str | Path, obj: Any, *, indent: int = 2, ensure_ascii: bool = True) -> None:
    """Write ``obj`` as indented JSON (values JSON cannot hold as ``str``), then move it into place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp(path)
    tmp.write_text(json.dumps(obj, indent=indent, default=str, allow_nan=True, ensure_ascii=ensure_ascii) + "\n",
                   encoding="utf-8")
    tmp.replace(path)


def write_jsonl(path: str | Path, rows: Iterable[Any]) -> int:
    """Write each row as one line of JSON (UTF-8, not escaped), then move the file into place; returns the rows."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp(path)
    n = 0
    try:
        with tmp.open("w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
                n += 1
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    tmp.replace(path)
    return n


def read_json(path: str | Path) -> Any:
    """The JSON value in ``path``."""
    return json.loads(Path(path).read_text())
