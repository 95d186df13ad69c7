"""The one stage runner of ``lmlm quickstart``, ``lmlm reproduce`` and ``lmlm pipeline``.

A stage writes its outputs into its own folder and, once they are complete, ``done.json`` there:
the stage's summary, written atomically (:func:`lmlm.jsonio.write_json`), so a folder holds it only
when the stage finished. Rerunning the same command skips every stage whose folder holds it and
reads its summary instead; a stage cut short runs again, or resumes from its own pieces (training
from its last saved state). :class:`Stopped` ends a run after the stage it was asked to stop at,
and :func:`resumable` turns Ctrl-C into one line that says the same command goes on.

Ground floor beside :mod:`lmlm.jsonio`: imports nothing else from lmlm.

Examples:
    >>> run_stage(Path("runs/x/kb"), lambda: {"triples": 3}, "kb")["triples"]  # runs: runs/x/kb/done.json
    3
    >>> run_stage(Path("runs/x/kb"), lambda: {"triples": 4}, "kb")["triples"]  # done before: its summary
    3
"""

from __future__ import annotations

import shutil
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

from rich.console import Console

from .jsonio import read_json, write_json

__all__ = ["MARKER", "stage_done", "finish_stage", "run_stage", "copy_stage", "Stopped", "stop_after", "resumable"]

MARKER = "done.json"
console = Console(stderr=True)


def stage_done(folder: Path, legacy: Path | None = None) -> dict | None:
    """The summary in ``folder``'s ``done.json`` if the stage finished, else None.

    ``legacy``: the file that marked the stage done in folders written before ``done.json``
    (``kb/built.json``, ``results/<stage>.json``); its JSON is read as the summary."""
    marker = Path(folder) / MARKER
    if marker.exists():
        return read_json(marker)
    if legacy is not None and Path(legacy).exists():
        return read_json(legacy)
    return None


def finish_stage(folder: Path, info: dict) -> dict:
    """Mark the stage in ``folder`` done with summary ``info`` (returned)."""
    write_json(Path(folder) / MARKER, info)
    return info


def run_stage(folder: Path, fn: Callable[[], dict[str, Any]], name: str, *, title: str | None = None,
              legacy: Path | None = None) -> dict:
    """The summary of the stage in ``folder``: read when it is done, else ``fn()`` with its ``seconds``.

    Args:
        folder: the stage's folder (its outputs and ``done.json``).
        fn: runs the stage; returns its summary (a JSON-able dict).
        name: the stage, in the log.
        title: the rule printed before the stage runs (default ``name``).
        legacy: see :func:`stage_done`.
    """
    if (info := stage_done(folder, legacy)) is not None:
        console.print(f"[bold]{name}[/]: done before, reading {Path(folder) / MARKER}")
        return info
    console.rule(f"[bold]{title or name}")
    t = time.time()
    info = fn()
    info["seconds"] = time.time() - t
    return finish_stage(folder, info)


def copy_stage(src: Path, dst: Path) -> None:
    """Copy a finished stage's folder to ``dst`` (replacing it) as the start of another stage: without
    its marker (nor an older one), so the copy is done only once its own stage finishes."""
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(MARKER, "built.json"))


class Stopped(Exception):
    """A run stopped after the stage ``--until`` named (its outputs finished and kept)."""

    def __init__(self, stage: str):
        super().__init__(stage)
        self.stage = stage


def stop_after(stage: str, until: str | None) -> None:
    """Raise :class:`Stopped` once ``stage`` is finished if it is the one the run stops after."""
    if until == stage:
        raise Stopped(stage)


@contextmanager
def resumable(out: Path) -> Iterator[None]:
    """Ctrl-C inside: say what ``out`` keeps and that the same command goes on from there; exit 130."""
    try:
        yield
    except KeyboardInterrupt:
        print(f"interrupted: the finished stages and the last saved training state are kept in {out}; the same "
              "command goes on from there", file=sys.stderr)
        raise SystemExit(130) from None
