"""Fixtures for the generation tests (the world itself in ``gen_support``)."""

from __future__ import annotations

import pytest
import torch
from gen_support import make_kb, trained_world
from tiny_lm import tiny_gpt2


@pytest.fixture(scope="session")
def world():
    return trained_world()


@pytest.fixture(scope="module")
def kb(world, tmp_path_factory):
    return make_kb(world, str(tmp_path_factory.mktemp("kb") / "kb"))


@pytest.fixture(scope="module")
def random_model(world, request):
    """An untrained GPT-2 of the trained one's shape, seeded by the module's ``RANDOM_SEED``."""
    torch.manual_seed(request.module.RANDOM_SEED)
    return tiny_gpt2(world.tok).eval()


@pytest.fixture(scope="module", autouse=True)
def _one_thread(one_torch_thread):
    """A tiny model runs fastest on one thread, and leaves the other cores to other jobs."""
    yield
