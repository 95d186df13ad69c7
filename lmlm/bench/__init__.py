"""Benchmarks: ``lmlm bench NAME`` runs one and prints a JSON object as its last line.

Each benchmark lives in its own module here and registers a command on ``bench_app``; targets are
compared as ratios measured side by side in one run, never as absolute seconds.
"""

from __future__ import annotations

import resource

import typer

bench_app = typer.Typer(no_args_is_help=True, help="Benchmarks; each prints one JSON object as its last line.")

__all__ = ["bench_app", "percentile_ms", "peak_rss_mb", "rss_mb"]


def percentile_ms(seconds, q: float, digits: int = 3) -> float | None:
    """The ``q``-th percentile of durations in seconds, in milliseconds (None for no durations)."""
    import numpy as np

    return None if len(seconds) == 0 else round(float(np.percentile(np.asarray(seconds) * 1e3, q)), digits)


def rss_mb() -> float:
    """This process' resident memory now, in MB (Linux; elsewhere the peak so far)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize() / 2**20
    except OSError:
        return peak_rss_mb()


def peak_rss_mb() -> float:
    """This process' peak resident memory so far, in MB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
