"""Fixtures for the evaluation protocols (helpers in ``eval_support``)."""

from __future__ import annotations

import functools

import pytest
from eval_support import tiny_world


@pytest.fixture(scope="session")
def world():
    return tiny_world()


@pytest.fixture(scope="module", autouse=True)
def _one_thread(one_torch_thread):
    """A tiny model runs fastest on one thread, and leaves the other cores to other jobs."""
    yield


@pytest.fixture
def exact_lookups(monkeypatch):
    """Exact keys only: the fuzzy fallback would load the sentence encoder, seconds these tests need not spend."""
    from lmlm.kb import KnowledgeBase

    monkeypatch.setattr(KnowledgeBase, "lookup_batch",
                        functools.partialmethod(KnowledgeBase.lookup_batch, fuzzy=False))
