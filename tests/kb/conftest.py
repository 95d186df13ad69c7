"""Fixtures for the knowledge-base tests: the real MiniLM encoder, loaded once per session."""

from __future__ import annotations

import pytest

from lmlm.kb import KnowledgeBase, Triple, get_encoder

FACTS = [
    Triple("Ada Lovelace", "Birth City", "London", source="bio-ada", position=10),
    Triple("Charles Babbage", "Death Year", "1871", source="bio-babbage", position=42),
    Triple("Alan Turing", "Occupation", "mathematician", source="bio-turing", position=0),
]


@pytest.fixture(scope="session")
def encoder():
    """The process-wide encoder; every KnowledgeBase in the session reuses it."""
    enc = get_encoder()
    yield enc
    enc.clear_cache()


@pytest.fixture
def facts() -> list[Triple]:
    return list(FACTS)


@pytest.fixture
def kb(encoder, tmp_path):
    """A fresh KB at version 1 holding :data:`FACTS`."""
    kb = KnowledgeBase.create(tmp_path / "kb", encoder=encoder)
    kb.add(FACTS, who="tester", why="fixture")
    yield kb
    kb.close()
