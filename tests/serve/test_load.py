"""A five-second version of ``lmlm bench serve``: generation clients and KB editors at once on a
loopback server; no request may fail and no acknowledged edit may be lost."""

from __future__ import annotations

import asyncio


import fastapi  # noqa: F401  (fastapi, httpx and uvicorn are in the [test] extra)
import httpx  # noqa: F401
import uvicorn  # noqa: F401

TOKEN = "test-token-1234"  # as in conftest.py


def test_short_load_run_loses_nothing(live_server, demo):
    from lmlm.bench.serve import LoadConfig, run_load

    url = live_server()
    cfg = LoadConfig(duration=5, clients=8, editors=2, prompts=demo.prompts, max_new_tokens=16,
                     edit_keys=[(e, r) for e, r, _ in demo.facts[:10]])
    result = asyncio.run(run_load(url, TOKEN, cfg))
    assert result["errors"] == 0, result["error_samples"]
    assert result["lost_edits"] == 0, result["lost_samples"]
    assert result["requests"] >= 8 and result["edits"] >= 2 and result["tokens_per_s"] > 0
    assert set(result["requests_by_kind"]) == {"stream", "completions", "generate"}
    assert result["latency_ms"]["p50"] <= result["latency_ms"]["p99"]
    assert result["mean_batch_rows"] > 1  # concurrent requests were decoded together
    assert result["kb_version"] == 1 + result["edits"]


def test_editors_without_given_keys_add_their_own(live_server, demo):
    from lmlm.bench.serve import LoadConfig, run_load

    result = asyncio.run(run_load(live_server(), TOKEN, LoadConfig(duration=1, clients=1, editors=1,
                                                                   prompts=demo.prompts[:1], max_new_tokens=4)))
    assert result["errors"] == 0 and result["lost_edits"] == 0 and result["edits"] >= 1
