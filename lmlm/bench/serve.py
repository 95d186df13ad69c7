"""Load test of ``lmlm serve`` on loopback: ``lmlm bench serve``.

Generation clients (32 by default) send requests back to back, a mix of ``/api/generate``, its
streaming form and ``/v1/completions``, while KB editors (4 by default) edit facts and read each
edit back at once. Afterwards every acknowledged edit is checked in the KB log (its version, op,
author and new value) and each edited key is looked up for its last acknowledged value. The last
line printed is one JSON object: latency p50/p99, tokens/s, errors and lost edits.

Without ``--url`` the benchmark starts its own server (``lmlm serve`` in a subprocess) on a free
loopback port, on the demo model (:mod:`lmlm.serve.demo`) unless ``--model`` is given, with a fresh
copy of the KB so repeated runs start from the same facts.

Examples:
    $ lmlm bench serve --duration 60
    {"duration_s": 60.0, "clients": 32, "editors": 4, "requests": ..., "latency_ms": {"p50": ..., "p99": ...},
     "tokens_per_s": ..., "errors": 0, "edits": ..., "lost_edits": 0, ...}
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional

import typer

from ..jsonio import write_json
from . import bench_app, percentile_ms

__all__ = ["run_load", "LoadConfig", "start_server"]


@dataclass
class LoadConfig:
    """One load test.

    Args:
        duration: seconds during which clients start new requests (requests then in flight finish).
        clients: concurrent generation clients, each sending one request after another.
        editors: concurrent KB editors, each editing its own keys and reading every edit back.
        prompts: cycled through by the clients.
        edit_keys: ``(entity, relation)`` pairs with an active value, shared out among the editors;
            empty: each editor first adds keys of its own.
        max_new_tokens: per generation request.
        timeout: seconds before one HTTP request counts as an error.
    """

    duration: float = 60.0
    clients: int = 32
    editors: int = 4
    prompts: list[str] = field(default_factory=lambda: ["The"])
    edit_keys: list[tuple[str, str]] = field(default_factory=list)
    max_new_tokens: int = 32
    timeout: float = 120.0


class _Tally:
    def __init__(self):
        self.latency: list[float] = []
        self.run_s: list[float] = []  # the server's time in generate, and in its queue before
        self.queued_s: list[float] = []
        self.tokens = 0
        self.by_kind: dict[str, int] = {}
        self.errors: list[str] = []
        self.acks: list[tuple[str, int, tuple[str, str], str]] = []  # (who, version, key, value)
        self.edit_latency: list[float] = []
        self.unseen: list[str] = []  # acknowledged edits a lookup right after did not return

    def error(self, what: str) -> None:
        self.errors.append(what[:300])


async def _generate(client, i: int, prompt: str, cfg: LoadConfig, t: _Tally) -> None:
    """One request of kind i % 4: 0 streaming, 1 OpenAI completions, else plain /api/generate."""
    kind = ("stream", "completions", "generate", "generate")[i % 4]
    start = time.perf_counter()
    if kind == "stream":
        result = None
        async with client.stream("POST", "/api/generate", json={"prompt": prompt, "max_new_tokens": cfg.max_new_tokens,
                                                                 "stream": True}) as r:
            if r.status_code != 200:
                return t.error(f"stream {r.status_code}: {(await r.aread())[:200]!r}")
            event = None
            async for line in r.aiter_lines():
                if line.startswith("event: "):
                    event = line[7:]
                elif line.startswith("data: ") and event in ("result", "error"):
                    result = (event, json.loads(line[6:]))
        if result is None or result[0] != "result":
            return t.error(f"stream ended without a result: {result!r}")
        n = result[1]["tokens"]
    elif kind == "completions":
        r = await client.post("/v1/completions", json={"prompt": prompt, "max_tokens": cfg.max_new_tokens,
                                                       "temperature": 0})
        if r.status_code != 200:
            return t.error(f"completions {r.status_code}: {r.text[:200]}")
        n = r.json()["usage"]["completion_tokens"]
    else:
        r = await client.post("/api/generate", json={"prompt": prompt, "max_new_tokens": cfg.max_new_tokens})
        if r.status_code != 200:
            return t.error(f"generate {r.status_code}: {r.text[:200]}")
        n = r.json()["tokens"]
        t.run_s.append(r.json()["run_s"])
        t.queued_s.append(r.json()["queued_s"])
    t.latency.append(time.perf_counter() - start)
    t.tokens += n
    t.by_kind[kind] = t.by_kind.get(kind, 0) + 1


async def _client(client, c: int, cfg: LoadConfig, deadline: float, t: _Tally) -> None:
    i = c
    while time.perf_counter() < deadline:
        try:
            await _generate(client, i, cfg.prompts[i % len(cfg.prompts)], cfg, t)
        except Exception as e:  # a transport error is an error like any other
            t.error(f"client {c}: {type(e).__name__}: {e}")
        i += 1


async def _editor(client, e: int, keys: list[tuple[str, str]], deadline: float, t: _Tally, token: str) -> None:
    who, auth = f"bench-editor-{e}", {"Authorization": f"Bearer {token}"}
    if not keys:  # keys of its own
        keys = [(f"Bench Editor {e}", f"Item {k}") for k in range(8)]
        r = await client.post("/api/kb/triples", headers=auth, json={
            "triples": [{"entity": en, "relation": rel, "value": "start"} for en, rel in keys], "who": who})
        if r.status_code != 200:
            return t.error(f"editor {e} add {r.status_code}: {r.text[:200]}")
    n = 0
    while time.perf_counter() < deadline:
        key, value = keys[n % len(keys)], f"value {e}-{n}"
        n += 1
        start = time.perf_counter()
        try:
            r = await client.post("/api/kb/edit", headers=auth, json={"entity": key[0], "relation": key[1],
                                                                      "value": value, "who": who, "why": "load test"})
            if r.status_code != 200:
                t.error(f"editor {e} edit {r.status_code}: {r.text[:200]}")
                continue
            version = r.json()["version"]
            t.edit_latency.append(time.perf_counter() - start)
            t.acks.append((who, version, key, value))
            m = (await client.get("/api/kb/lookup", params={"entity": key[0], "relation": key[1]})).json()["match"]
            if m is None or m["value"] != value or m["version"] < version:
                t.unseen.append(f"v{version} {key} -> {value!r}: lookup gave {m and m['value']!r}")
        except Exception as ex:
            t.error(f"editor {e}: {type(ex).__name__}: {ex}")


async def _verify(client, t: _Tally) -> list[str]:
    """Acknowledged edits missing from the log, or not the last value of their key."""
    lost: list[str] = []
    sem = asyncio.Semaphore(16)

    async def check(who, version, key, value):
        async with sem:
            r = await client.get(f"/api/kb/log/{version}")
        if r.status_code != 200:
            return lost.append(f"v{version}: not in the log ({r.status_code})")
        d = r.json()
        if d["record"]["op"] != "edit" or d["record"]["who"] != who or \
                not any(c["new_value"] == value for c in d["changes"]):
            lost.append(f"v{version}: the log does not record {key} -> {value!r} by {who}")

    await asyncio.gather(*(check(*a) for a in t.acks))
    last: dict[tuple[str, str], tuple[int, str]] = {}
    for _, version, key, value in t.acks:
        if key not in last or version > last[key][0]:
            last[key] = (version, value)
    for key, (version, value) in last.items():
        m = (await client.get("/api/kb/lookup", params={"entity": key[0], "relation": key[1]})).json()["match"]
        if m is None or m["value"] != value:
            lost.append(f"{key}: last acknowledged value {value!r} (v{version}), lookup now gives {m and m['value']!r}")
    return lost


async def run_load(url: str, token: str, cfg: LoadConfig) -> dict:
    """Run the load against a server at ``url`` and return the summary (see the module docstring)."""
    import httpx

    t = _Tally()
    limits = httpx.Limits(max_connections=cfg.clients + cfg.editors + 8)
    async with httpx.AsyncClient(base_url=url, timeout=cfg.timeout, limits=limits) as client:
        info0 = (await client.get("/api/info")).json()
        keys = [list(cfg.edit_keys[e::cfg.editors]) for e in range(cfg.editors)]
        start = time.perf_counter()
        deadline = start + cfg.duration
        await asyncio.gather(*(_client(client, c, cfg, deadline, t) for c in range(cfg.clients)),
                             *(_editor(client, e, keys[e], deadline, t, token) for e in range(cfg.editors)))
        wall = time.perf_counter() - start
        lost = t.unseen + await _verify(client, t)
        verify_s = time.perf_counter() - start - wall
        info = (await client.get("/api/info")).json()
    b0, b1 = info0["batching"], info["batching"]
    batches = b1["batches"] - b0["batches"]
    ms = lambda x: None if x is None else round(1000 * x, 1)  # noqa: E731
    pct = lambda xs, q: percentile_ms(xs, q, 1)  # noqa: E731
    return {
        "duration_s": round(wall, 2), "clients": cfg.clients, "editors": cfg.editors,
        "max_new_tokens": cfg.max_new_tokens, "requests": len(t.latency), "requests_by_kind": t.by_kind,
        "requests_per_s": round(len(t.latency) / wall, 2),
        "latency_ms": {"p50": pct(t.latency, 50), "p99": pct(t.latency, 99),
                       "max": ms(max(t.latency, default=None))},
        "server_ms": {"queued_p50": pct(t.queued_s, 50), "run_p50": pct(t.run_s, 50)},
        "tokens": t.tokens, "tokens_per_s": round(t.tokens / wall, 1),
        "mean_batch_rows": round((b1["rows"] - b0["rows"]) / batches, 2) if batches else None,
        "max_batch_rows": b1["max_rows"],
        "edits": len(t.acks), "edit_latency_ms": {"p50": pct(t.edit_latency, 50),
                                                  "p99": pct(t.edit_latency, 99)},
        "errors": len(t.errors), "error_samples": t.errors[:5],
        "lost_edits": len(lost), "lost_samples": lost[:5], "verify_s": round(verify_s, 1),
        "model": info["model"]["name"], "device": info["model"]["device"], "kb_version": info["kb"]["version"],
    }


# -- a server of its own ----------------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(model: Path, kb: Path, token: str, log: Path, max_concurrent: int = 64,
                 timeout: float = 180.0) -> tuple[subprocess.Popen, str]:
    """``lmlm serve`` in a subprocess on a free loopback port; returns it and its URL once it answers."""
    import httpx

    port = _free_port()
    cmd = [sys.executable, "-m", "lmlm.cli", "serve", "--model", str(model), "--kb", str(kb), "--port", str(port),
           "--max-concurrent", str(max_concurrent), "--log-level", "warning"]
    env = {**os.environ, "LMLM_SERVE_TOKEN": token}
    proc = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    end = time.time() + timeout
    while time.time() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with code {proc.returncode}; see {log}")
        try:
            if httpx.get(url + "/api/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.terminate()
    raise RuntimeError(f"the server did not answer within {timeout} s; see {log}")


@bench_app.command("serve")
def serve_bench(duration: float = typer.Option(60.0, min=0.1, help="seconds of load"),
                clients: int = typer.Option(32, min=1, help="concurrent generation clients"),
                editors: int = typer.Option(4, min=0, help="concurrent KB editors"),
                max_new_tokens: int = typer.Option(32, min=1),
                url: Optional[str] = typer.Option(None, help="a running server (default: start one); the editors' "
                                                 "writes go to its KB (--editors 0 leaves it as it is)"),
                token: Optional[str] = typer.Option(None, envvar="LMLM_SERVE_TOKEN", help="its write token"),
                model: Optional[Path] = typer.Option(None, help="checkpoint to serve (default: the demo model)"),
                kb: Optional[Path] = typer.Option(None, help="KB to copy and serve (default: the checkpoint's)"),
                prompt: List[str] = typer.Option(None, help="prompts to cycle through (default: the demo's)"),
                work: Path = typer.Option(Path("runs/bench-serve"), help="demo model, KB copy and server log"),
                out: Optional[Path] = typer.Option(None, help="also write the JSON summary here")):
    """Load-test lmlm serve: generation clients and KB editors at once; p50/p99, tokens/s, errors, lost edits."""
    from ..cli_errors import fail
    from ..serve.demo import build_demo

    for option, path in (("--model", model), ("--kb", kb)):
        if url is None and path is not None and not path.is_dir():
            fail(f"{option} {path}: no such folder")
    work.mkdir(parents=True, exist_ok=True)
    cfg = LoadConfig(duration=duration, clients=clients, editors=editors, max_new_tokens=max_new_tokens)
    proc = None
    if url is None:
        if model is None:
            print(f"building the demo model and KB in {work / 'demo'}", file=sys.stderr, flush=True)
            demo = build_demo(work / "demo")
            model, kb = demo.model_dir, kb or demo.kb_dir
            cfg.prompts, cfg.edit_keys = demo.prompts, [(e, r) for e, r, _ in demo.facts]
        elif kb is None:
            from ..checkpoint import read_meta
            kb = Path(read_meta(model)["kb"])
        run_kb = work / "kb-run"  # the edits go to a copy
        shutil.rmtree(run_kb, ignore_errors=True)
        shutil.copytree(kb, run_kb)
        token = secrets.token_urlsafe(18)
        print(f"starting lmlm serve on a copy of the KB (log: {work / 'server.log'})", file=sys.stderr, flush=True)
        proc, url = start_server(model, run_kb, token, work / "server.log", max_concurrent=max(64, 2 * clients))
    else:
        _check_server(url, token, editors)
    if prompt:
        cfg.prompts = list(prompt)
    print(f"{duration:g} s of load on {url}: {clients} clients, {editors} editors", file=sys.stderr, flush=True)
    try:
        result = asyncio.run(run_load(url, token, cfg))
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(30)
    if out is not None:
        write_json(out, result)
    print(json.dumps(result))


def _check_server(url: str, token: str | None, editors: int) -> None:
    """A server given by ``--url`` answers, and takes the token when there are editors: one line if not."""
    import httpx

    from ..cli_errors import fail
    from ..serve.schemas import MAX_ID

    if editors and token is None:
        fail("--url with editors needs --token (or LMLM_SERVE_TOKEN); --editors 0 needs none")
    try:
        httpx.get(f"{url.rstrip('/')}/api/health", timeout=10).raise_for_status()
        if editors:  # a delete of an id no KB holds: a 404 with the right token, 401 without; nothing changes
            r = httpx.post(f"{url.rstrip('/')}/api/kb/delete", json={"triple_ids": [MAX_ID], "why": "token check"},
                           headers={"Authorization": f"Bearer {token}"}, timeout=10)
            if r.status_code in (401, 403):
                fail(f"{url} refused the token ({r.status_code}: {r.text[:200]})")
    except httpx.HTTPError as e:
        fail(f"--url {url}: no lmlm server answers there ({type(e).__name__}: {e})")
