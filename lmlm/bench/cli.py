"""``lmlm bench``: every benchmark command, registered on ``bench_app`` by importing its module."""

from __future__ import annotations

from . import annotate, authors, generate, kb, serve, train  # noqa: F401  (each registers its command)
from . import bench_app as app

__all__ = ["app"]
