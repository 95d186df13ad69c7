"""``lmlm bench authors --triples N``: streaming import of a database in the authors' released format.

Writes (once, kept in ``--out``) an N-triplet file in the authors' layout: one JSON object with
``entities``, ``relationships``, ``return_values`` and ``triplets``, one triplet per line, names with
the release's escaped quotes (``O\\'Hara``). N/10 synthetic people with ten relations each; about
60 bytes of file per triplet. Then imports it into a fresh KB with
:func:`lmlm.kb.build.import_authors_json` (store only; embedding is ``lmlm bench kb``'s subject)
and reports triplets/s (per second of wall time and of this process's CPU time: the first is what
a user waits, the second what other work on a shared machine changes least), peak memory and the
store's size. Peak memory is the process's maximum resident set: run the bench at two sizes to see
that it does not grow with the file.

Examples:
    lmlm bench authors --triples 1000000
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Iterator

import typer

from . import bench_app, peak_rss_mb

__all__ = ["write_authors_file", "run_authors_bench"]

_FIRST = ("Ada", "Bram", "Cleo", "Dario", "Edith", "Farid", "Greta", "Hugo", "Ines", "Jonas", "Kira", "Lars",
          "Mira", "Nils", "Olga", "Pavel", "Rosa", "Sven", "Tara", "Umar", "Vera", "Wim", "Yara", "Zeno")
_LAST = ("Lind", "Moss", "O\\'Hara", "Okafor", "Brandt", "D\\'Souza", "Novak", "Haddad", "Sato", "Ferreira",
         "Kowalski", "Nguyen", "Larsen", "Rossi", "Mendes", "Ivanova", "Schmidt", "Byrne", "Costa", "Weber")
_RELATIONS = ("Birth Date", "Birth Place", "Death Place", "Occupation", "Employer", "Alma Mater", "Spouse",
              "Nationality", "Known For", "Award")
_VALUE_KINDS = 5003  # values per relation


def _entity(i: int) -> str:
    """The i-th synthetic person: first and last name from the pools, then a number."""
    first, rest = _FIRST[i % len(_FIRST)], i // len(_FIRST)
    return f"{first} {_LAST[rest % len(_LAST)]} {rest // len(_LAST)}"


def _value(person: int, j: int) -> str:
    return f"{_RELATIONS[j].split()[-1]} value {(person * 7919 + j * 104729) % _VALUE_KINDS}"


def _triplets(n: int) -> Iterator[list[str]]:
    for k in range(n):
        person, j = divmod(k, len(_RELATIONS))
        yield [_entity(person), _RELATIONS[j], _value(person, j)]


def write_authors_file(path: str | Path, n: int) -> Path:
    """Write ``n`` triplets in the authors' layout to ``path`` (streamed; written to a temporary name first)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    people = -(-n // len(_RELATIONS))
    values = sorted({f"{r.split()[-1]} value {v}" for r in _RELATIONS for v in range(_VALUE_KINDS)})

    def items(f, name: str, it) -> None:
        f.write(f' "{name}": [\n')
        first = True
        for x in it:
            f.write(("" if first else ",\n") + "  " + json.dumps(x, ensure_ascii=False))
            first = False
        f.write("\n ]")

    with open(tmp, "w", encoding="utf-8") as f:
        f.write("{\n")
        items(f, "entities", (_entity(p) for p in range(people)))
        f.write(",\n")
        items(f, "relationships", _RELATIONS)
        f.write(",\n")
        items(f, "return_values", values)
        f.write(",\n")
        items(f, "triplets", _triplets(n))
        f.write("\n}\n")
    tmp.replace(path)
    return path


def run_authors_bench(n: int, out: Path, chunk_size: int = 100_000, progress: bool = True) -> dict:
    """Write (once) and import an ``n``-triplet authors' file under ``out``; returns the JSON-ready report."""
    from ..kb.formats import scan_authors_json
    from ..kb.build import import_authors_json

    src = out / f"authors-{n}.json"
    if not src.exists():
        t0 = time.perf_counter()
        write_authors_file(src, n)
        write_s = time.perf_counter() - t0
    else:
        write_s = None
    kb_dir = out / f"kb-{n}"
    if kb_dir.exists():
        shutil.rmtree(kb_dir)
    rss_before = peak_rss_mb()
    t0, c0 = time.perf_counter(), time.process_time()
    scan_authors_json(src)
    scan_s = time.perf_counter() - t0
    kb = import_authors_json(src, kb_dir, chunk_size=chunk_size, progress=progress)
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    counts = kb.store.counts()
    kb.close()  # the write-ahead log merged into the database: the size a KB keeps on disk
    db_bytes = sum(p.stat().st_size for p in kb_dir.iterdir() if p.name.startswith("kb.sqlite"))
    return {"triples": n, "imported": counts["triples"], "keys": counts["keys"], "versions": counts["versions"],
            "file_bytes": src.stat().st_size, "file_bytes_per_triple": round(src.stat().st_size / n, 1),
            "import_seconds": round(seconds, 1), "triples_per_s": round(n / seconds),
            "import_cpu_seconds": round(cpu, 1), "triples_per_cpu_s": round(n / cpu),
            "scan_seconds": round(scan_s, 1), "peak_rss_mb": round(peak_rss_mb()),
            "peak_rss_before_import_mb": round(rss_before), "store_bytes_per_triple": round(db_bytes / n),
            "write_file_seconds": None if write_s is None else round(write_s, 1), "chunk_size": chunk_size,
            "file": str(src), "kb": str(kb_dir)}



@bench_app.command("authors")
def bench_authors(triples: int = typer.Option(1_000_000, help="triplets in the generated file"),
                  out: Path = typer.Option(Path("runs/bench-authors"), help="where the file and the KB go"),
                  chunk_size: int = typer.Option(100_000, min=1, help="triplets per version"),
                  progress: bool = typer.Option(True, help="progress bar")):
    """Import an N-triplet file in the authors' format by streaming: triplets/s and peak memory."""
    if triples < 10:
        from ..cli_errors import fail

        fail(f"at least 10 triplets needed, got {triples}: --triples")
    print(json.dumps(run_authors_bench(triples, out, chunk_size=chunk_size, progress=progress)))
