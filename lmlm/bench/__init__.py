"""Benchmarks: ``lmlm bench NAME`` runs one and prints a JSON object as its last line.

Each benchmark lives in its own module here and registers a command on ``bench_app``; targets are
compared as ratios measured side by side in one run, never as absolute seconds.
"""

from __future__ import annotations

import typer

bench_app = typer.Typer(no_args_is_help=True, help="Benchmarks; each prints one JSON object as its last line.")

__all__ = ["bench_app"]
