"""The web page in headless Chromium: generate, edit the looked-up fact, delete it, and see the
regenerated output change and then lose it. Screenshots go to ``runs/test-artifacts/`` (or
``$LMLM_TEST_ARTIFACTS``)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

import fastapi  # noqa: F401  (fastapi and uvicorn are in the [test] extra)
import uvicorn  # noqa: F401
from playwright import sync_api  # in the [test] extra; without Chromium the test skips

TOKEN = "test-token-1234"  # as in conftest.py
ARTIFACTS = Path(os.environ.get("LMLM_TEST_ARTIFACTS", Path(__file__).resolve().parents[2] / "runs" / "test-artifacts"))


def _chromium() -> str:
    """The system Chromium (Debian: apt-get install chromium), or $LMLM_CHROMIUM."""
    for name in (os.environ.get("LMLM_CHROMIUM"), "chromium", "chromium-browser", "google-chrome"):
        path = name and (shutil.which(name) or (name if Path(name).is_file() else None))
        if path:
            return path
    pytest.skip("no Chromium found: apt-get install chromium, or set LMLM_CHROMIUM to its path")


def test_edit_then_delete_the_looked_up_fact(live_server, demo):
    chromium = _chromium()
    url = live_server(threshold=0.95)  # a deleted fact gets no fuzzy stand-in
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    expect = sync_api.expect
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, headless=True, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 860})
            errors = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(url)
            page.fill("#token", TOKEN)
            page.dispatch_event("#token", "change")
            page.fill("#prompt", demo.prompts[0])
            page.click("#generate")

            fact = page.locator("#output .fact").first
            expect(fact).to_have_attribute("data-found", "true", timeout=30_000)
            triple_id = fact.get_attribute("data-triple-id")
            entity, relation, value = next(f for f in demo.facts if f[:2] == (demo.people[0][0], "Birth City"))
            expect(fact).to_contain_text(value)
            fact.hover()  # the matched triple, its score, sources and the KB version
            tip = page.locator("#tip")
            expect(tip).to_be_visible()
            for text in (f"#{triple_id}", f"{entity} · {relation}", "1.000 (exact)", "bio-ada-lind", "v1"):
                expect(tip).to_contain_text(text)
            page.screenshot(path=str(ARTIFACTS / "serve-page-1-generated.png"))

            fact.click()
            page.fill("#edit-value", "Atlantis")
            page.click("#edit-fact")
            expect(page.locator("#meta")).to_contain_text("KB v2", timeout=30_000)
            fact = page.locator("#output .fact").first
            expect(fact).to_contain_text("Atlantis")
            expect(fact).to_have_attribute("data-found", "true")
            page.screenshot(path=str(ARTIFACTS / "serve-page-2-edited.png"))

            fact.click()
            expect(page.locator("#fact-details")).to_contain_text("Atlantis")
            page.click("#delete-fact")
            expect(page.locator("#meta")).to_contain_text("KB v3", timeout=30_000)
            fact = page.locator("#output .fact").first
            expect(fact).to_have_attribute("data-found", "false")  # the model asked; the KB no longer knows
            expect(fact).to_contain_text("unknown")
            expect(fact).not_to_contain_text("Atlantis")
            expect(fact).not_to_contain_text(value)
            fact.click()
            expect(page.locator("#fact-details")).to_contain_text("no fact in the KB matched")
            rows = page.locator("#log tbody tr")
            expect(rows.nth(0)).to_contain_text("delete")
            expect(rows.nth(1)).to_contain_text("edit")
            rows.nth(0).click()
            expect(page.locator("#changes")).to_contain_text("delete: Atlantis")
            page.screenshot(path=str(ARTIFACTS / "serve-page-3-deleted.png"), full_page=True)
            assert not errors, errors
        finally:
            browser.close()
    assert (ARTIFACTS / "serve-page-3-deleted.png").stat().st_size > 10_000
