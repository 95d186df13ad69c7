"""Property-based requests generated from the app's own OpenAPI schema (Schemathesis), sent in
process over ASGI, valid ones and invalid ones, with and without the write token: none may get a
5xx, and none may change the KB without the token."""

from __future__ import annotations

import os
import shutil

import pytest

import fastapi  # noqa: F401  (fastapi and schemathesis are in the [test] extra)
import schemathesis

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis.errors import Unsatisfiable  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402
from schemathesis.generation import GenerationMode  # noqa: E402

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


def test_no_server_errors(served):
    """Every operation of the schema, positive and negative generation: with the token, as
    generated; then without it, a write must be refused and change nothing. (Operations are driven
    here with Hypothesis directly rather than through Schemathesis's pytest plugin, which follows
    pytest's private API.)"""
    kb = served.state.lmlm.kb
    api = schemathesis.openapi.from_asgi("/openapi.json", served)
    operations = [result.ok() for result in api.get_all_operations()]
    assert len(operations) >= 10, [op.label for op in operations]

    def check(case):
        response = case.call_and_validate(headers={"Authorization": f"Bearer {TOKEN}"},
                                          checks=[not_a_server_error])
        assert response.status_code < 500, (case.method, case.path, response.status_code)
        if case.method.upper() == case.operation.method.upper() == "POST" and case.path.startswith("/api/kb/"):
            before = kb.version
            refused = case.call(headers={"Authorization": "Bearer not-the-token"})
            assert refused.status_code == 401 and kb.version == before, (case.path, refused.status_code)

    failures = []
    for operation in operations:
        for mode in GenerationMode:
            run = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck),
                           database=None)(given(case=operation.as_strategy(generation_mode=mode))(check))
            try:
                run()
            except Unsatisfiable:  # nothing to make invalid: an operation without parameters or body
                if mode is not GenerationMode.NEGATIVE:
                    failures.append(f"{operation.label} ({mode.value}): no request could be generated")
            except Exception as error:  # noqa: BLE001 -- collected, all reported below
                failures.append(f"{operation.label} ({mode.value}): {type(error).__name__}: {error}")
    assert not failures, "\n".join(failures)
