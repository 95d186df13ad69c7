"""Registers every benchmark command on ``bench_app``; one import per benchmark module."""

from __future__ import annotations
from . import serve  # noqa: F401  (lmlm bench serve)
from . import generate  # noqa: F401  (lmlm bench generate)
from . import kb  # noqa: F401  (lmlm bench kb)
from . import annotate  # noqa: F401  (lmlm bench annotate)
from . import train  # noqa: F401  (lmlm bench train)
from . import authors  # noqa: F401  (lmlm bench authors)
