"""``lmlm bench train``: bad input refused in one line before any work; a --work folder's shards reused only
for the same corpus request and tokenizer."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOKENIZERS = Path("/work/shared/data/tokenizers")


def lmlm(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "lmlm.cli", *args], capture_output=True, text=True, env=env,
                          timeout=600)


def test_bad_input_is_one_line_before_any_work(tmp_path):
    cases = [((), "--seq-len 256 exceeds the context length 128"),
             (("--seq-len", "64", "--override", "foo=1"), "foo"),
             (("--seq-len", "64", "--tokenizer", str(tmp_path / "nope")), "no such file or folder")]
    for args, says in cases:
        proc = lmlm("bench", "train", "--model", "gpt2-tiny", "--steps", "1", "--work", str(tmp_path / "w"), *args)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("error:") and says in lines[0], \
            proc.stderr[-2000:]
        assert not (tmp_path / "w" / "shards").exists()


def _tokenizer(name: str) -> str:
    path = TOKENIZERS / name
    if not path.exists():  # the tokenizer the test needs: two BPEs of different sizes serve as well
        import pytest

        pytest.skip(f"no tokenizer at {path}")
    return str(path)


@pytest.mark.slow
def test_work_shards_are_reused_only_for_the_same_request(tmp_path):
    def bench(tokenizer: str, corpus_tokens: int = 1000) -> dict:
        proc = lmlm("bench", "train", "--model", "gpt2-tiny", "--seq-len", "64", "--prepare-only", "--workers", "1",
                    "--corpus-tokens", str(corpus_tokens), "--work", str(tmp_path), "--tokenizer", tokenizer)
        assert proc.returncode == 0, proc.stderr[-2000:]
        return json.loads(proc.stdout.strip().splitlines()[-1])["prepare"]

    gpt2, llama = _tokenizer("gpt2"), _tokenizer("llama2/tokenizer.json")
    first = bench(gpt2)
    assert first["tokenizer"] == gpt2 and first["corpus_tokens_asked"] == 1000 and first["tokens"] > 1000
    assert bench(gpt2)["reused"]  # the same request: the same shards
    other = bench(llama)  # another tokenizer: made again with it
    assert "reused" not in other and other["tokenizer"] == llama and other["tokenizer_hash"] != first["tokenizer_hash"]
    manifest = json.loads((tmp_path / "shards" / "manifest.json").read_text())
    assert manifest["tokenizer_hash"] == other["tokenizer_hash"]
