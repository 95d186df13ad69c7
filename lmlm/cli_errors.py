"""One error path for every command: bad input prints one line, ``error: <what>: <where>``, and exits 2.

Bad input is an :class:`~lmlm.errors.LmlmError` (every lmlm error derives from it) or a path the OS refused."""

from __future__ import annotations

import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, NoReturn

import typer

from .errors import LmlmError

__all__ = ["fail", "user_errors", "check_device", "out_folder", "USER_ERRORS"]


def _user_error_types() -> tuple[type[BaseException], ...]:
    return (LmlmError, FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError)


USER_ERRORS = _user_error_types


def fail(msg: str) -> NoReturn:
    """Print ``error: msg`` as one line on stderr and exit with code 2."""
    msg = " ".join(str(msg).split())  # one line, whatever the message held
    print(f"error: {msg}", file=sys.stderr, flush=True)
    raise typer.Exit(2)


@contextmanager
def user_errors(*extra: type[BaseException]) -> Iterator[None]:
    """Turn the errors a user's input can cause into :func:`fail`; anything else is a bug and propagates."""
    try:
        yield
    except (*_user_error_types(), *extra) as e:
        fail(str(e) if not isinstance(e, OSError) or not e.filename else f"{e.strerror}: {e.filename}")


def check_device(device: str | None, option: str = "--device") -> None:
    """Refuse a device string torch cannot parse, or one this machine lacks, before any work is done."""
    if device is None or device == "auto":
        return
    import torch

    try:
        d = torch.device(device)
    except (RuntimeError, ValueError):
        fail(f"{option} {device!r} is not a device: use cpu, cuda or cuda:N")
    if d.type == "cuda":
        if not torch.cuda.is_available():
            fail(f"{option} {device}: no CUDA device is visible here; use cpu")
        if d.index is not None and d.index >= torch.cuda.device_count():
            fail(f"{option} {device}: only {torch.cuda.device_count()} CUDA device(s) here")
    elif d.type not in ("cpu", "mps"):
        fail(f"{option} {device!r}: lmlm runs on cpu or cuda")


def out_folder(out: Path, option: str = "--out") -> Path:
    """Refuse, before any work, an output folder that is a file or under a file (its outputs are a folder)."""
    if out.exists() and not out.is_dir():
        fail(f"{option} {out}: is a file, not a folder")
    above = next((p for p in Path(out).absolute().parents if p.exists()), None)
    if above is not None and not above.is_dir():
        fail(f"{option} {out}: {above} is a file, not a folder")
    return out
