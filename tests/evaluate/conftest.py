"""Fixtures for the evaluation protocols (helpers in ``eval_support``)."""

from __future__ import annotations

import pytest
from eval_support import tiny_world


@pytest.fixture(scope="session")
def world():
    return tiny_world()


@pytest.fixture(scope="module", autouse=True)
def _one_thread(one_torch_thread):
    """A tiny model runs fastest on one thread, and leaves the other cores to other jobs."""
    yield
