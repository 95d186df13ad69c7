"""Property-based requests generated from the app's own OpenAPI schema (Schemathesis), sent in
process over ASGI, valid ones and invalid ones, with and without the write token: none may get a
5xx, and none may change the KB without the token."""

from __future__ import annotations

import os
import shutil

import pytest

pytest.importorskip("fastapi", reason="the serve extra is not installed: pip install -e '.[serve]'")
schemathesis = pytest.importorskip("schemathesis", reason="schemathesis is not installed: pip install schemathesis")

from hypothesis import HealthCheck, settings  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402

TOKEN = "test-token-1234"  # as in conftest.py
EXAMPLES = int(os.environ.get("LMLM_FUZZ_EXAMPLES", "15"))  # more for a longer hunt


@pytest.fixture(scope="module")
def served(demo, tmp_path_factory):
    """One app for the whole module, small limits so that every generated request is quick."""
    from lmlm.serve import ServeLimits, create_app

    kb = tmp_path_factory.mktemp("schemathesis") / "kb"
    shutil.copytree(demo.kb_dir, kb)
    limits = ServeLimits(max_prompt_chars=200, max_new_tokens=8, max_prompts=2, max_write_items=5, max_log=50,
                         max_search_k=5, batch_wait_ms=0)
    app = create_app(demo.model_dir, kb, token=TOKEN, limits=limits)
    yield app
    app.state.lmlm.close()


@pytest.fixture(scope="module")
def api_schema(served):
    return schemathesis.openapi.from_asgi("/openapi.json", served)


schema = schemathesis.pytest.from_fixture("api_schema")


@schema.parametrize()
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)
def test_no_server_errors(case, served):
    """With the token, as generated; then without it, a write must be refused and change nothing."""
    kb = served.state.lmlm.kb
    response = case.call_and_validate(headers={"Authorization": f"Bearer {TOKEN}"}, checks=[not_a_server_error])
    assert response.status_code < 500
    if case.method.upper() == case.operation.method.upper() == "POST" and case.path.startswith("/api/kb/"):
        before = kb.version
        refused = case.call(headers={"Authorization": "Bearer not-the-token"})
        assert refused.status_code == 401 and kb.version == before
