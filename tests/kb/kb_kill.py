"""Killing a writer process in the middle of a chunked write, for the crash-safety tests."""

from __future__ import annotations

import os
import signal
import sqlite3
import time
from pathlib import Path


def kill_after_versions(child, kb_dir: Path, versions: int = 2, timeout: float = 120) -> None:
    """SIGKILL the started process ``child`` once the KB at ``kb_dir`` holds ``versions`` versions
    (so the kill lands inside a later chunk), and wait for it to end."""
    try:
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                with sqlite3.connect(f"file:{kb_dir / 'kb.sqlite'}?mode=ro", uri=True, timeout=1) as c:
                    if (c.execute("SELECT max(version) FROM versions").fetchone()[0] or 0) >= versions:
                        break
            except sqlite3.Error:
                pass
            time.sleep(0.02)
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.join(30)
    assert child.exitcode == -signal.SIGKILL
