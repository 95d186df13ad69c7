"""Fixtures for the generation tests (the world itself in ``gen_support``)."""

from __future__ import annotations

import pytest
from gen_support import make_kb, trained_world


@pytest.fixture(scope="session")
def world():
    return trained_world()


@pytest.fixture(scope="module")
def kb(world, tmp_path_factory):
    return make_kb(world, str(tmp_path_factory.mktemp("kb") / "kb"))


@pytest.fixture(scope="module", autouse=True)
def _one_thread(one_torch_thread):
    """A tiny model runs fastest on one thread, and leaves the other cores to other jobs."""
    yield
