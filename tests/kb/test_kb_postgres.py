"""The knowledge base on a real PostgreSQL server, started here from Debian's ``postgresql`` package.

Skipped when the server binaries or psycopg are missing (``apt-get install -y postgresql``,
``pip install 'lmlm[postgres]'``).
"""

import glob
import json
import multiprocessing as mp
import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import pytest

import psycopg  # in the [test] extra; the tests skip only where no PostgreSQL server can be started

from lmlm.kb import KBError, KnowledgeBase, NotAKnowledgeBase, Triple  # noqa: E402
from lmlm.kb.store import KBNotFound  # noqa: E402
from wide_layout import WIDE_LAYOUT, check_wide_layout_migrated  # noqa: E402


def _pg_bin(name: str) -> str | None:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return found[-1] if found else shutil.which(name)


def _as_server_user(cmd: list[str]) -> list[str]:
    """initdb and postgres refuse to run as root: run them as the ``postgres`` account then."""
    if os.geteuid() != 0:
        return cmd
    runuser = shutil.which("runuser")
    if runuser is None:
        pytest.skip("running as root without runuser: cannot start PostgreSQL")
    return [runuser, "-u", "postgres", "--", *cmd]


@pytest.fixture(scope="module")
def server():
    initdb, pg_ctl = _pg_bin("initdb"), _pg_bin("pg_ctl")
    if not (initdb and pg_ctl):
        pytest.skip("PostgreSQL server binaries not found (apt-get install -y postgresql)")
    if os.geteuid() == 0:
        import pwd
        try:
            pw = pwd.getpwnam("postgres")
        except KeyError:
            pytest.skip("running as root and there is no postgres account")
    root = Path(tempfile.mkdtemp(prefix="lmlm-pg-"))
    os.chmod(root, 0o755)
    if os.geteuid() == 0:
        os.chown(root, pw.pw_uid, pw.pw_gid)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    data = root / "data"
    run = lambda cmd: subprocess.run(_as_server_user(cmd), check=True, capture_output=True, text=True)  # noqa: E731
    run([initdb, "-D", str(data), "-A", "trust", "-U", "lmlm", "--no-sync"])
    run([pg_ctl, "-D", str(data), "-l", str(root / "log"), "-w", "-t", "60", "-o",
         f"-k {root} -p {port} -c listen_addresses='' -c fsync=off -c full_page_writes=off", "start"])
    try:
        yield f"postgresql://lmlm@/postgres?host={root}&port={port}"
    finally:
        subprocess.run(_as_server_user([pg_ctl, "-D", str(data), "-m", "immediate", "stop"]), capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def url(server, request):
    """A fresh database on the server, one per test."""
    name = "t_" + request.node.name.lower().replace("[", "_").replace("]", "")[:40]
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')
    return server.replace("/postgres?", f"/{name}?")


@pytest.mark.parametrize("map_limit", [10**9, 0], ids=["map-in-memory", "map-read-from-store"])
def test_the_whole_api_on_postgres(url, encoder, tmp_path, monkeypatch, map_limit):
    kb = KnowledgeBase.create(url, encoder=encoder, index_dir=tmp_path / "idx")
    kb.map_limit = map_limit
    kb.add([Triple("Ada Lovelace", "Birth City", "London", source="bio-ada", position=10),
            Triple("Alan Turing", "Occupation", "mathematician", source="bio-turing"),
            Triple("Ada Lovelace", "Birth City", "London", source="bio-ada-2")], who="alice", why="seed")
    m = kb.lookup("ada lovelace", "BIRTH CITY")
    assert (m.value, m.exact, m.support, m.sources) == ("London", True, 2, ("bio-ada", "bio-ada-2"))
    assert kb.lookup("Alan Turing", "job").value == "mathematician"
    assert kb.stats()["map"] == ("store" if map_limit == 0 else "memory")
    assert kb.edit("Alan Turing", "Occupation", "computer scientist", who="bob") == 2
    assert kb.forget([("Ada Lovelace", "Birth City")], who="carol", why="request") == 1
    assert kb.lookup("Ada Lovelace", "Birth City") is None and len(kb) == 1
    assert [(v.version, v.op, v.who) for v in kb.log()] == [(3, "delete", "carol"), (2, "edit", "bob"),
                                                            (1, "add", "alice")]
    assert sorted((d.op, d.value) for d in kb.diff(1, 3)) == [
        ("added", "computer scientist"), ("removed", "London"), ("removed", "mathematician")]
    old = kb.checkout(1)
    assert old.lookup("Ada Lovelace", "birthplace").value == "London" and old.stats()["triples"] == 2
    assert [r.value for r in kb.history("Alan Turing", "Occupation")] == ["mathematician", "computer scientist"]
    assert kb.export(tmp_path / "kb.jsonl") == 1 and len(list(old.triples())) == 2
    with pytest.raises(KBError, match="no active fact"):
        kb.edit("Nobody", "x", "y")
    with pytest.raises(FileExistsError, match="already holds a knowledge base"):
        KnowledgeBase.create(url)
    kb.close()
    from typer.testing import CliRunner

    from lmlm.cli import app

    monkeypatch.setenv("LMLM_KB_CACHE", str(tmp_path / "cache"))
    res = CliRunner().invoke(app, ["kb", "diff", url, "1", "3", "--json"])  # the CLI takes the URL as its path
    assert res.exit_code == 0, res.output
    assert len(json.loads(res.stdout)) == 3


def test_two_servers_share_one_kb_and_a_delete_reaches_both_at_once(url, encoder, tmp_path):
    a = KnowledgeBase.create(url, encoder=encoder, index_dir=tmp_path / "a")
    a.add([Triple(f"Person {i}", "Employer", f"Org {i}") for i in range(20)])
    b = KnowledgeBase.open(url, encoder=encoder, index_dir=tmp_path / "b")  # another machine: its own index
    assert b.lookup("Person 7", "employers").value == "Org 7"
    assert a.delete(entity="Person 7", who="a") == 1
    for query in ("Employer", "employers"):  # exact, then fuzzy: a deleted person is a miss, never a namesake
        assert b.lookup("Person 7", query) is None
        hit = b.lookup("Person 7", query, threshold=0.0, matching="key")  # the paper's match answers for another
        assert hit is not None and hit.entity != "Person 7"
    b.add([Triple("Person 99", "Employer", "Org 99")], who="b")
    assert a.lookup("Person 99", "employers").value == "Org 99" and a.version == 3
    a.close()
    b.close()


def _writer(url: str, name: str, n: int) -> None:
    kb = KnowledgeBase.open(url, index_dir=tempfile.mkdtemp())
    for i in range(n):
        kb.add([Triple(f"{name} {i}", "Employer", f"Org {i}")], who=name, embed=False)
        kb.edit(f"{name} {i}", "Employer", f"Org {i} edited", who=name)
    kb.close()


def test_two_processes_writing_at_once_lose_no_edit(url, tmp_path):
    KnowledgeBase.create(url, index_dir=tmp_path / "i").close()
    ctx, n = mp.get_context("spawn"), 10
    writers = [ctx.Process(target=_writer, args=(url, name, n)) for name in ("alice", "bob")]
    for w in writers:
        w.start()
    for w in writers:
        w.join(120)
    assert [w.exitcode for w in writers] == [0, 0]
    kb = KnowledgeBase.open(url, index_dir=tmp_path / "i")
    assert [v.version for v in kb.log(None)] == list(range(4 * n, 0, -1))
    assert all(kb.lookup(f"{p} {i}", "Employer").value == f"Org {i} edited" for p in ("alice", "bob") for i in range(n))
    kb.close()


def test_errors_name_the_database(server, url):
    with pytest.raises(NotAKnowledgeBase, match="is not an lmlm knowledge base"):
        KnowledgeBase.open(url)
    with pytest.raises(KBNotFound, match="cannot reach the knowledge base at postgresql://lmlm:\\*\\*\\*@"):
        KnowledgeBase.open("postgresql://lmlm:secret@127.0.0.1:1/nowhere")


def test_a_kb_of_the_wide_layout_is_migrated_to_the_compact_one(url, tmp_path):
    from lmlm.kb.postgres import PG_MIGRATIONS

    with psycopg.connect(url, autocommit=True) as conn:
        wide = WIDE_LAYOUT.replace("char(9)", "chr(9)").replace("schema_version VALUES (3)", "schema_version VALUES (2)")
        for sql in (*PG_MIGRATIONS[:2], wide):  # PostgreSQL's migration 2 is SQLite's 3
            conn.execute(sql)
    kb = KnowledgeBase.open(url, index_dir=tmp_path / "idx")
    check_wide_layout_migrated(kb)
    kb.close()
