"""The serve app in process: generation with traces, batching, streaming, the OpenAI route, KB reads
and writes, the token, the limits, and that requests reach no file outside the KB."""

from __future__ import annotations

import asyncio
import json

import pytest

import fastapi  # noqa: F401  (in the [test] extra: a broken install fails here)
import httpx

from lmlm.serve import ServeLimits

TOKEN = "test-token-1234"  # as in conftest.py

WRITES = {"/api/kb/triples": {"triples": [{"entity": "Zed Quill", "relation": "Birth City", "value": "Oslo"}]},
          "/api/kb/edit": {"entity": "Ada Lind", "relation": "Birth City", "value": "Oslo"},
          "/api/kb/delete": {"entity": "Ada Lind"},
          "/api/kb/forget": {"entities": ["Ada Lind"]},
          "/api/kb/restore": {"version": 0}}


def _generate(client, prompt: str, **kw) -> dict:
    r = client.post("/api/generate", json={"prompt": prompt, "max_new_tokens": 24, **kw})
    assert r.status_code == 200, r.text
    return r.json()


@pytest.fixture
def fact(client, demo):
    """A demo prompt whose first lookup the model writes as the KB's own key: (prompt, trace entry)."""
    for prompt in demo.prompts[:10]:
        t = _generate(client, prompt)["trace"]
        if t and t[0]["found"] and t[0]["score"] == 1.0:
            return prompt, t[0]
    pytest.fail("the demo model made no exact lookup in 10 prompts")


def test_generate_traces_each_lookup(client, fact, demo):
    prompt, first = fact
    r = _generate(client, prompt)
    entity, relation = first["matched_entity"], first["matched_relation"]
    value = dict(((e, rel), v) for e, rel, v in demo.facts)[(entity, relation)]
    t = r["trace"][0]
    assert t["value"] == value and t["triple_id"] >= 1 and t["sources"] and t["kb_version"] == 1
    looked = [s for s in r["segments"] if s["type"] == "lookup"]
    assert looked[0]["trace"] == 0 and looked[0]["value"] == value
    assert r["text"].startswith(f"[dblookup('{entity}', '{relation}') -> {value}]")
    assert r["kb_version"] == 1 and r["tokens"] == 24 and r["finish_reason"] == "length"
    triple = client.get(f"/api/kb/triples/{t['triple_id']}").json()
    assert (triple["entity"], triple["relation"], triple["value"], triple["active"]) == (entity, relation, value, True)


def test_delete_and_edit_change_the_next_generation(make_client, demo, auth):
    client = make_client(threshold=0.95)  # no fuzzy stand-in for a deleted fact
    prompt = demo.prompts[0]
    t = _generate(client, prompt)["trace"][0]
    assert t["found"]
    edited = client.post("/api/kb/edit", headers=auth, json={"entity": t["matched_entity"],
                                                             "relation": t["matched_relation"], "value": "Atlantis"})
    assert edited.status_code == 200 and edited.json() == {"version": 2, "changed": 2}
    t2 = _generate(client, prompt)["trace"][0]
    assert (t2["value"], t2["kb_version"], t2["found"]) == ("Atlantis", 2, True)
    gone = client.post("/api/kb/delete", headers=auth, json={"triple_ids": [t2["triple_id"]], "why": "forget"})
    assert gone.json() == {"version": 3, "changed": 1}
    t3 = _generate(client, prompt)["trace"][0]
    assert not t3["found"] and t3["value"] == "unknown" and t3["triple_id"] is None and t3["kb_version"] == 3
    assert client.get(f"/api/kb/triples/{t2['triple_id']}").json()["deleted_version"] == 3


def test_a_prompt_may_end_inside_a_call(client, demo):
    name, city, _ = demo.people[3]
    r = _generate(client, f"{name} was born in <|db_start|> {name} <|sep|> Birth City <|db_retrieve|>")
    assert r["trace"][0]["value"] == city and r["trace"][0]["found"]
    forced = _generate(client, f"{name} was born in", force_lookup=True)
    assert forced["trace"][0]["query_entity"] and forced["prompt_tokens"] > 0
    plain = client.post("/v1/completions", json={"prompt": f"{name} was born in", "max_tokens": 24, "temperature": 0,
                                                 "force_lookup": True}).json()["choices"][0]
    assert plain["lmlm"]["trace"][0]["query_entity"] == forced["trace"][0]["query_entity"]


def test_concurrent_requests_share_a_batch_and_match_single_runs(live_server, demo):
    url = live_server(limits=ServeLimits(batch_wait_ms=50))
    prompts = demo.prompts[:12]

    async def run():
        async with httpx.AsyncClient(base_url=url, timeout=60) as c:
            return await asyncio.gather(*(c.post("/api/generate", json={"prompt": p, "max_new_tokens": 24})
                                          for p in prompts))

    together = [r.json() for r in asyncio.run(run())]
    assert max(r["batch_rows"] for r in together) > 1
    alone = [httpx.post(url + "/api/generate", json={"prompt": p, "max_new_tokens": 24}, timeout=60).json()
             for p in prompts[:4]]
    assert [r["batch_rows"] for r in alone] == [1, 1, 1, 1]
    assert [r["text"] for r in alone] == [r["text"] for r in together[:4]]  # batching changes nothing
    info = httpx.get(url + "/api/info").json()
    assert info["batching"]["rows"] == 16 and info["batching"]["batches"] < 16


def _events(text: str) -> list[tuple[str | None, str]]:
    out = []
    for block in text.strip().split("\n\n"):
        name = next((ln[7:] for ln in block.split("\n") if ln.startswith("event: ")), None)
        data = "".join(ln[6:] for ln in block.split("\n") if ln.startswith("data: "))
        out.append((name, data))
    return out


def test_generate_streams_tokens_then_the_result(client, demo):
    r = client.post("/api/generate", json={"prompt": demo.prompts[1], "max_new_tokens": 40, "stream": True})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = _events(r.text)
    assert [e for e, _ in events[-2:]] == ["result", "done"]
    tokens = [json.loads(d) for e, d in events if e == "token"]
    result = json.loads(events[-2][1])
    assert len(tokens) == result["tokens"]
    assert "<|db_start|>" in "".join(t["token"] for t in tokens)
    texts = [json.loads(d)["text"] for e, d in events if e in ("token", "text")]
    assert "".join(texts) == result["clean_text"]  # the pieces add up to the clean text
    lookups = [json.loads(d) for e, d in events if e == "lookup"]
    assert lookups and [(x["query_entity"], x["query_relation"], x["value"], x["triple_id"]) for x in lookups] == [
        (t["query_entity"], t["query_relation"], t["value"], t["triple_id"]) for t in result["trace"]]
    first = next(k for k, (e, _) in enumerate(events) if e == "lookup")  # sent as the call closes, not at the end
    assert any(e == "token" for e, _ in events[first:])
    assert result == {**_generate(client, demo.prompts[1], max_new_tokens=40),
                      **{k: result[k] for k in ("queued_s", "run_s", "batch_rows")}}


def test_completions_are_openai_shaped_and_stream_the_same_text(client, demo):
    body = {"model": "lmlm", "prompt": [demo.prompts[0], demo.prompts[41]], "max_tokens": 40, "temperature": 0}
    r = client.post("/v1/completions", json=body).json()
    assert r["object"] == "text_completion" and r["id"].startswith("cmpl-") and r["model"] == "lmlm"
    assert [c["index"] for c in r["choices"]] == [0, 1]
    assert r["usage"]["completion_tokens"] == 80 and r["usage"]["total_tokens"] > 80
    for c in r["choices"]:
        assert "<|" not in c["text"] and c["finish_reason"] == "length"
        assert c["lmlm"]["trace"] and c["lmlm"]["text"].startswith("[dblookup(")
    s = client.post("/v1/completions", json={**body, "stream": True})
    events = _events(s.text)
    assert events[-1] == (None, "[DONE]")
    chunks = [json.loads(d) for _, d in events[:-1]]
    for i, c in enumerate(r["choices"]):
        mine = [ch["choices"][0] for ch in chunks if ch["choices"] and ch["choices"][0]["index"] == i]
        assert "".join(m["text"] for m in mine) == c["text"]
        assert mine[-1]["finish_reason"] == "length"
    assert chunks[-1]["usage"] == r["usage"]


def test_completions_stop_sequence_and_errors(client, demo):
    full = client.post("/v1/completions", json={"prompt": demo.prompts[0], "max_tokens": 40,
                                                "temperature": 0}).json()["choices"][0]["text"]
    stop = full.strip().split(" ")[1]
    cut = client.post("/v1/completions", json={"prompt": demo.prompts[0], "max_tokens": 40, "temperature": 0,
                                               "stop": [stop]}).json()["choices"][0]
    assert cut["text"] == full[:full.index(stop)] and cut["finish_reason"] == "stop"
    streamed = _events(client.post("/v1/completions", json={"prompt": demo.prompts[0], "max_tokens": 40,
                                                            "temperature": 0, "stop": stop, "stream": True}).text)
    texts = [c["choices"][0]["text"] for c in (json.loads(d) for _, d in streamed[:-1]) if c["choices"]]
    assert "".join(texts) == cut["text"]
    bad = client.post("/v1/completions", json={"prompt": "x", "max_tokens": 10**6})
    assert bad.status_code == 422 and "max_tokens" in bad.json()["error"]["message"]


def test_kb_read_endpoints(client, demo):
    entity, relation, value = demo.facts[0]
    m = client.get("/api/kb/lookup", params={"entity": entity.lower(), "relation": relation}).json()
    assert m["match"]["value"] == value and m["match"]["exact"] and m["version"] == 1
    s = client.get("/api/kb/search", params={"entity": entity, "relation": "birthplace", "k": 3}).json()
    assert len(s["matches"]) == 3 and s["matches"][0]["score"] >= s["matches"][1]["score"]
    assert client.get("/api/kb/version").json() == {"version": 1, "triples": 80}
    log = client.get("/api/kb/log", params={"limit": 5}).json()
    assert [v["op"] for v in log["versions"]] == ["add"] and log["versions"][0]["n_changed"] == 80
    detail = client.get("/api/kb/log/1").json()
    assert detail["record"]["who"] == "demo" and len(detail["changes"]) == 80
    assert client.get("/api/kb/log/2").status_code == 404
    assert client.get("/api/kb/triples/9999").status_code == 404
    assert client.get("/api/kb/triples/0").status_code == 422
    assert client.get("/api/kb/lookup", params={"entity": "", "relation": "x"}).status_code == 422


def test_writes_need_the_token(client, make_client, auth):
    for path, body in WRITES.items():
        assert client.post(path, json=body).status_code == 401, path
        assert client.post(path, json=body, headers={"Authorization": "Bearer wrong-token"}).status_code == 401
        assert client.post(path, json=body, headers={"Authorization": TOKEN}).status_code == 401  # no scheme
        assert client.post(path, content=b"not json", headers={"content-type": "application/json"}).status_code == 401
    assert client.get("/api/kb/version").json()["version"] == 1  # nothing changed
    r = client.post("/api/kb/triples", json=WRITES["/api/kb/triples"], headers=auth)
    assert r.json() == {"version": 2, "changed": 1}
    assert client.get("/api/kb/log", params={"limit": 1}).json()["versions"][0]["who"] == "api"
    read_only = make_client(token=None)
    r = read_only.post("/api/kb/edit", json=WRITES["/api/kb/edit"], headers=auth)
    assert r.status_code == 403 and "disabled" in r.json()["detail"]
    schema = client.get("/openapi.json").json()
    for path in WRITES:
        assert schema["paths"][path]["post"]["security"] == [{"HTTPBearer": []}]


def test_write_errors_are_4xx(client, auth):
    assert client.post("/api/kb/edit", headers=auth, json={"entity": "Nobody", "relation": "Birth City",
                                                           "value": "Oslo"}).status_code == 404
    assert client.post("/api/kb/delete", headers=auth, json={}).status_code == 422
    assert client.post("/api/kb/delete", headers=auth, json={"entity": "!!!"}).status_code == 422
    assert client.post("/api/kb/forget", headers=auth, json={}).status_code == 422
    lone_surrogate = json.dumps({"triples": [{"entity": "A", "relation": "B", "value": "\ud800"}]}).encode()
    assert client.post("/api/kb/triples", content=lone_surrogate,
                       headers={**auth, "content-type": "application/json"}).status_code == 422
    escape = client.post("/api/kb/triples", headers=auth,
                         json={"triples": [{"entity": "Eve\u001b[2J", "relation": "Birth City", "value": "Oslo"}]})
    assert escape.status_code == 422 and "control character U+001B" in escape.text  # refused at the door
    for path, body in (("/api/kb/delete", {"entity": "Nobody At All"}), ("/api/kb/delete", {"triple_ids": [99999]}),
                       ("/api/kb/forget", {"entities": ["Nobody At All"]}), ("/api/kb/forget", {"sources": ["zzz"]})):
        r = client.post(path, headers=auth, json=body)  # a name the KB never held: a typo, said, nothing deleted
        assert r.status_code == 404 and "never held" in r.json()["detail"], (path, body, r.text)
    assert client.get("/api/kb/version").json()["version"] == 1


def test_writes_store_clean_strings_and_a_retry_changes_nothing(client, demo, auth):
    name, city, _ = demo.people[2]
    edit = {"entity": name, "relation": "Birth City", "value": "Acme\u200b\u202e Town"}
    assert client.post("/api/kb/edit", headers=auth, json=edit).json() == {"version": 2, "changed": 2}  # old, new
    assert client.post("/api/kb/edit", headers=auth, json=edit).json() == {"version": 2, "changed": 0}
    m = client.get("/api/kb/lookup", params={"entity": name, "relation": "Birth City"}).json()["match"]
    assert m["value"] == "Acme Town"  # stored as an add would store it: no zero-width or bidi characters
    for value in ("\u200b", "  "):
        r = client.post("/api/kb/edit", headers=auth, json={**edit, "value": value})
        assert r.status_code == 422 and "blank" in r.json()["detail"], value
        r = client.post("/api/kb/triples", headers=auth, json={"triples": [{**edit, "value": value}]})
        assert r.status_code == 422 and "blank" in r.json()["detail"], value
    new = {"triples": [{"entity": "Retry Person", "relation": "Major", "value": "Physics"}]}
    assert client.post("/api/kb/triples", headers=auth, json=new).json() == {"version": 3, "changed": 1}
    assert client.post("/api/kb/triples", headers=auth, json=new).json() == {"version": 3, "changed": 0}
    tid = client.get("/api/kb/lookup", params={"entity": "Retry Person", "relation": "Major"}).json()["match"]
    assert client.get(f"/api/kb/triples/{tid['triple_id']}").json()["count"] == 1  # a retry counts once
    nfc = {"entity": "Nfd Person", "relation": "Major", "value": "Art", "source": "doc-\u00e9t\u00e9"}
    assert client.post("/api/kb/triples", headers=auth, json={"triples": [nfc]}).status_code == 200
    r = client.post("/api/kb/forget", headers=auth, json={"sources": ["doc-e\u0301te\u0301"]})  # the same id, NFD
    assert r.status_code == 200 and r.json()["changed"] == 1, r.text
    for bad in ({"who": "me\u001b[31m"}, {"why": "x\u0007"}):
        r = client.post("/api/kb/triples", headers=auth, json={**new, **bad})
        assert r.status_code == 422 and "control character" in r.json()["detail"], bad
    client.post("/api/kb/triples", headers=auth, json={"triples": [{**nfc, "source": "d2"}], "why": "one\ntwo"})
    assert client.get("/api/kb/log", params={"limit": 1}).json()["versions"][0]["why"] == "one two"
    # back to version 1, the demo KB as built: this test's facts deleted, the edited value written back
    r = client.post("/api/kb/restore", headers=auth, json={"version": 1, "why": "undo"})
    assert r.status_code == 200 and r.json()["changed"] == 4, r.text  # 3 facts deleted, 1 written back
    m = client.get("/api/kb/lookup", params={"entity": name, "relation": "Birth City"}).json()["match"]
    assert m["value"] == city and m["sources"]
    assert client.post("/api/kb/restore", headers=auth, json={"version": 1}).json()["changed"] == 0
    assert client.post("/api/kb/restore", headers=auth, json={"version": 99}).status_code == 404


def test_requests_are_typed_and_errors_speak_of_fields(client, auth):
    for body in ({"prompt": "Ada", "max_new_tokens": "5"}, {"prompt": "Ada", "max_new_tokens": True},
                 {"prompt": "Ada", "force_lookup": "yes"}):
        assert client.post("/api/generate", json=body).status_code == 422, body
    assert client.post("/api/kb/delete", headers=auth, json={"triple_ids": ["5"]}).status_code == 422
    bad = client.get("/api/kb/lookup?entity=%FF&relation=b")
    assert bad.status_code == 422 and "not valid UTF-8" in bad.json()["detail"], bad.text
    assert client.post("/api/generate", json={"prompt": "Ada", "temperature": 1}).status_code == 200
    r = client.post("/api/generate", content=json.dumps({"prompt": "Ada"}), headers={"content-type": "text/plain"})
    assert r.status_code == 422 and "application/json" in r.json()["detail"][0]["msg"], r.text
    for prompt in (5, []):
        r = client.post("/v1/completions", json={"prompt": prompt})
        msg = r.json()["error"]["message"]
        assert r.status_code == 422 and msg.startswith("prompt") and "function" not in msg and "0x" not in msg, msg


def test_a_request_sets_its_repetition_penalty(client, demo):
    gen = client.app.state.lmlm.worker.generators[True]
    penalised = gen.generate(demo.prompts[:8], max_new_tokens=24, repetition_penalty=3.0)
    plain = gen.generate(demo.prompts[:8], max_new_tokens=24)
    changed = [i for i in range(8) if penalised[i].clean_text != plain[i].clean_text]
    assert changed, "a penalty of 3 changed none of 8 continuations"
    for i in changed[:2]:  # the server's continuation is the penalised one
        assert _generate(client, demo.prompts[i], repetition_penalty=3.0)["clean_text"] == penalised[i].clean_text
    assert client.post("/api/generate", json={"prompt": "Ada", "repetition_penalty": 0}).status_code == 422


def test_a_request_sets_its_lookups_and_beams(client, demo):
    """``max_lookups`` and ``num_beams`` per request, as ``lmlm generate --max-lookups / --num-beams``."""
    prompt = demo.prompts[0]
    assert len(_generate(client, prompt)["trace"]) >= 2, "the demo model writes two calls in 24 tokens"
    none, one = _generate(client, prompt, max_lookups=0), _generate(client, prompt, max_lookups=1)
    assert none["trace"] == [] and "dblookup" not in none["text"] and "<|db_start|>" not in none["text"]
    assert len(one["trace"]) == 1 and one["text"].count("dblookup") == 1 and "<|db_start|>" not in one["text"]
    gen = client.app.state.lmlm.worker.generators[True]
    beams = gen.generate(demo.prompts[:2], max_new_tokens=24, num_beams=3)
    for p, want in zip(demo.prompts[:2], beams):
        assert _generate(client, p, num_beams=3)["text"] == want.text
    for bad in ({"num_beams": 2, "stream": True}, {"num_beams": 2, "do_sample": True}, {"num_beams": 5},
                {"force_lookup": True, "max_lookups": 0}, {"max_lookups": -1}):
        r = client.post("/api/generate", json={"prompt": prompt, **bad})
        assert r.status_code == 422, (bad, r.text)
    assert client.get("/api/info").json()["limits"]["max_beams"] == 4


def test_the_server_matches_and_constrains_as_it_was_started(make_client, demo, auth):
    """``lmlm serve --matching key`` answers /api/kb/lookup by the paper's key cosine (a namesake's
    fact); ``--constrained`` keeps queries on KB keys, and once a person is deleted the key the tree
    leads their prompt to, someone else's, is a miss, never answered."""
    name = demo.people[0][0]
    q = {"entity": name + "qvist", "relation": "Birth City"}
    key, constrained = make_client(matching="key"), make_client(constrained=True)
    info = key.get("/api/info").json()["kb"]
    assert {k: info[k] for k in ("matching", "threshold", "constrained", "max_lookups")} == \
        {"matching": "key", "threshold": 0.6, "constrained": False, "max_lookups": 16}
    assert key.get("/api/kb/lookup", params=q).json()["match"]["entity"] == name
    assert constrained.get("/api/kb/lookup", params=q).json()["match"] is None
    assert constrained.get("/api/info").json()["kb"]["constrained"] is True
    keys = {e for e, _, _ in demo.facts}
    for name, _, _ in demo.people[:3]:
        prompt = f"{name} was born in"
        ask = dict(max_new_tokens=30, force_lookup=True)
        assert _generate(constrained, prompt, **ask)["trace"][0]["matched_entity"] == name
        assert constrained.post("/api/kb/delete", headers=auth, json={"entity": name}).json()["changed"] == 2
        t = _generate(constrained, prompt, **ask)["trace"][0]
        assert t["query_entity"] in keys - {name}, t  # the tree allows no other name
        assert not t["found"] and t["value"] == "unknown" and t["triple_id"] is None, t


def test_segments_join_to_clean_text(client, demo):
    """The texts of a result's segments join to its clean_text, with a call the token limit cut too."""
    for prompt in demo.prompts[:6]:
        for n in (5, 9, 24):
            r = _generate(client, prompt, max_new_tokens=n)
            texts = [s["text"] for s in r["segments"] if s["type"] == "text"]
            assert "".join(texts) == r["clean_text"], (prompt, n, r["segments"], r["clean_text"])
            assert not any("<|db_" in t for t in texts)
    info = client.get("/api/info").json()
    assert info["limits"]["max_new_tokens"] <= info["model"]["context"] - 2  # what the model can take


def test_forget_set_is_one_version(client, demo, auth):
    a, b = demo.people[0][0], demo.people[1][0]
    r = client.post("/api/kb/forget", headers=auth,
                    json={"entities": [a.upper()], "sources": [f"bio-{b.replace(' ', '-').lower()}"], "why": "request"})
    assert r.json() == {"version": 2, "changed": 4}
    for name in (a, b):
        for rel in ("Birth City", "Occupation"):
            m = client.get("/api/kb/lookup", params={"entity": name, "relation": rel, "threshold": 1}).json()
            assert m["match"] is None
    assert client.get("/api/kb/version").json() == {"version": 2, "triples": 76}


def test_limits_give_clear_4xx(make_client, demo):
    client = make_client(limits=ServeLimits(max_body_bytes=2048, max_prompt_tokens=20, max_new_tokens=50,
                                            max_concurrent=2))
    big = client.post("/api/generate", content=b'{"prompt": "' + b"a" * 4000 + b'"}',
                      headers={"content-type": "application/json"})
    assert big.status_code == 413 and "2048" in big.json()["detail"]

    def chunked():
        yield b'{"prompt": "'
        for _ in range(10):
            yield b"a" * 500
        yield b'"}'

    assert client.post("/api/generate", content=chunked(), headers={"content-type": "application/json"}).status_code == 413
    long_prompt = client.post("/api/generate", json={"prompt": "Ada " * 40})
    assert long_prompt.status_code == 422 and "limit is 20" in long_prompt.json()["detail"]
    too_many = client.post("/api/generate", json={"prompt": "Ada", "max_new_tokens": 51})
    assert too_many.status_code == 422 and too_many.json()["detail"][0]["loc"] == ["body", "max_new_tokens"]
    assert client.post("/api/generate", json={"prompt": "Ada", "stream": True, "max_new_tokens": 0}).status_code == 422
    assert client.post("/api/generate", json={"prompt": "Ada", "unknown": 1}).status_code == 422
    assert client.post("/api/generate", json={"prompt": "Ada", "force_lookup": True, "use_db": False}).status_code == 422
    state = client.app.state.lmlm
    state.in_flight = state.limits.max_concurrent  # as if two requests were running
    busy = client.post("/api/generate", json={"prompt": "Ada"})
    assert busy.status_code == 429 and busy.headers["retry-after"] == "1"
    state.in_flight = 0
    assert client.post("/api/generate", json={"prompt": "Ada", "stream": True}).status_code == 200
    assert state.in_flight == 0
    long_stream = client.post("/api/generate", json={"prompt": "Ada " * 40, "stream": True})
    assert long_stream.status_code == 422  # refused before the stream begins


def test_requests_reach_no_file_outside_the_kb(client, auth, tmp_path, kb_dir):
    def snapshot():
        return {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*") if kb_dir not in p.parents and p != kb_dir}

    before = snapshot()
    for path in ["/static/../app.py", "/static/%2e%2e/app.py", "/static/..%2fapp.py", "/static//etc/passwd",
                 "/static/%2fetc%2fpasswd", "/..%2f..%2fetc/passwd", "/api/kb/triples/..%2f..%2fetc%2fpasswd"]:
        r = client.get(path)
        assert r.status_code in (404, 422), path
        assert "import" not in r.text and "root:" not in r.text
    tricky = "../../../../tmp/escape"
    r = client.post("/api/kb/triples", headers=auth, json={"triples": [
        {"entity": tricky, "relation": "/etc/passwd", "value": "file:///etc/passwd", "source": tricky}]})
    assert r.status_code == 200
    client.post("/api/kb/forget", headers=auth, json={"sources": [tricky]})
    client.post("/api/generate", json={"prompt": "../../etc/passwd"})
    assert snapshot() == before
    schema = client.get("/openapi.json").json()
    params = {p["name"] for ops in schema["paths"].values() for op in ops.values() for p in op.get("parameters", [])}
    assert not params & {"path", "file", "filename", "dir", "folder", "kb", "model"}


def test_page_and_docs_are_served(client):
    page = client.get("/")
    assert page.status_code == 200 and 'id="prompt"' in page.text and "/static/app.js" in page.text
    assert client.get("/static/app.js").status_code == 200
    docs = client.get("/docs")
    assert docs.status_code == 200 and "swagger" in docs.text.lower()
    schema = client.get("/openapi.json").json()
    assert {"/api/generate", "/v1/completions", "/api/kb/lookup", "/api/kb/search", "/api/kb/triples/{triple_id}",
            "/api/kb/log", "/api/kb/version", "/api/kb/edit", "/api/kb/delete", "/api/kb/forget"} <= set(schema["paths"])
    info = client.get("/api/info").json()
    assert info["writes_enabled"] and info["model"]["parameters"] > 0 and info["kb"]["version"] == 1


@pytest.mark.parametrize("cmd", [["serve"], ["bench", "serve"]])
def test_cli_help(cmd):
    from typer.testing import CliRunner

    from lmlm.cli import app

    result = CliRunner().invoke(app, cmd + ["--help"])
    assert result.exit_code == 0 and "Usage" in result.output


def test_the_server_decodes_with_the_biases_it_was_started_with(make_client, auth):
    """``lmlm serve --name-bias``: someone added through the API after training, whose name the demo
    model never read, is the query's entity when the text gives the name."""
    plain, named = make_client(), make_client(name_bias=1e4, copy_bias=5.0)
    added = plain.post("/api/kb/triples", headers=auth, json=WRITES["/api/kb/triples"])
    assert added.status_code == 200, added.text
    prompt = "Zed Quill was born in"
    before = _generate(plain, prompt, force_lookup=True)["trace"][0]
    after = _generate(named, prompt, force_lookup=True)["trace"][0]
    assert before["query_entity"] != "Zed Quill" and after["query_entity"] == "Zed Quill"


def test_the_threshold_is_the_one_of_the_matching_in_effect(make_client, demo):
    """``lmlm serve --threshold``: under entity-aware matching, the relation's similarity (it set the
    paper's key threshold, which entity matching never reads)."""
    name = demo.people[0][0]
    q = {"entity": name, "relation": "birthplace"}  # not the KB's spelling of the relation: a similar one
    loose, strict = make_client(), make_client(threshold=0.99)
    assert loose.get("/api/kb/lookup", params=q).json()["match"]["relation"] == "Birth City"
    miss = strict.get("/api/kb/lookup", params=q).json()
    assert miss["match"] is None and miss["miss"]["reason"] == "no_relation", miss
    info = strict.get("/api/info").json()["kb"]
    assert info["matching"] == "entity" and info["threshold"] == 0.99


def test_serve_refuses_bad_startup_options_in_one_line(demo, tmp_path):
    """A KB that is not there or not a KB, a model folder that is not one, a port taken, a log level
    uvicorn lacks: one line, exit 2, and nothing said to be served."""
    import socket

    from typer.testing import CliRunner

    from lmlm.cli import app

    (tmp_path / "facts.jsonl").write_text('{"entity": "A", "relation": "B", "value": "C"}\n')
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        for extra, message in ((["--kb", str(tmp_path / "none")], "no knowledge base at"),
                               (["--kb", str(tmp_path / "facts.jsonl")], "is not a knowledge base"),
                               (["--port", str(port)], f"cannot listen on 127.0.0.1:{port}"),
                               (["--model", str(demo.kb_dir)], "not a model folder"),
                               (["--log-level", "loud"], "--log-level must be")):
            res = CliRunner().invoke(app, ["serve", "--model", str(demo.model_dir), *extra])
            out = " ".join(res.output.split())
            assert res.exit_code == 2 and "error: " in out and message in out, res.output
            assert "Traceback" not in res.output and "serving on" not in out and "token" not in out
