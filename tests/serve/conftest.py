"""Fixtures for the serve tests: the demo model and KB built once per session, a fresh copy of the
KB per test, in-process clients and a live server on a loopback port."""

from __future__ import annotations

import shutil
import threading
import time

import pytest
import torch

TOKEN = "test-token-1234"


@pytest.fixture(scope="module", autouse=True)
def _one_thread(one_torch_thread):
    """A 64-wide model runs fastest on one thread, and is not slowed by other jobs on a shared CPU."""
    yield


@pytest.fixture(scope="session")
def demo(tmp_path_factory):
    """The tiny demo model (2 layers, 64 wide) and its KB of 80 facts, trained here in seconds."""
    from lmlm.kb import get_encoder
    from lmlm.serve.demo import build_demo

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return build_demo(tmp_path_factory.mktemp("serve-demo"), encoder=get_encoder())
    finally:
        torch.set_num_threads(before)


@pytest.fixture
def kb_dir(demo, tmp_path):
    """A copy of the demo KB that this test may change."""
    dst = tmp_path / "kb"
    shutil.copytree(demo.kb_dir, dst)
    return dst


@pytest.fixture
def make_app(demo, kb_dir):
    """``make_app(**create_app kwargs)``: an app on the demo model and this test's KB copy."""
    from lmlm.serve import create_app

    def make(token=TOKEN, **kwargs):
        return create_app(demo.model_dir, kb_dir, token=token, **kwargs)

    return make


@pytest.fixture
def make_client(make_app):
    """``make_client(**create_app kwargs)``: a started in-process client (closed after the test)."""
    from fastapi.testclient import TestClient

    clients = []

    def make(**kwargs):
        client = TestClient(make_app(**kwargs))
        client.__enter__()
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.__exit__(None, None, None)


@pytest.fixture
def client(make_client):
    return make_client()


@pytest.fixture
def auth():
    return {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def live_server(make_app):
    """``live_server(**create_app kwargs) -> base URL``: uvicorn on a free loopback port, in a thread."""
    import uvicorn

    servers = []

    def start(**kwargs):
        config = uvicorn.Config(make_app(**kwargs), host="127.0.0.1", port=0, log_level="warning", lifespan="on")
        server = uvicorn.Server(config)
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        end = time.time() + 60
        while not server.started:
            if time.time() > end or not thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.05)
        servers.append((server, thread))
        port = server.servers[0].sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    yield start
    for server, thread in servers:
        server.should_exit = True
        thread.join(30)
