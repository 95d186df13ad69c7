"""``lmlm generate`` from the command line with our own checkpoints."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from lmlm.lookup import parse, strip
from lmlm.tokens import LookupTokenizer, train_bpe
from lmlm.train import TrainConfig, train

ROOT = Path(__file__).resolve().parents[2]


def test_a_standard_checkpoint_generates_without_a_kb(tmp_path):
    """A Standard model makes no lookups: it needs no KB (as --no-db), while an LMLM without one is refused."""
    texts = [f"Person {i} was born in [dblookup('Person {i}', 'Birth City') -> Oslo] Oslo." for i in range(40)]
    tok = LookupTokenizer(train_bpe([strip(parse(t).segments) for t in texts], vocab_size=300))
    for mode in ("standard", "lmlm"):
        config = TrainConfig.from_name("tiny-test", out_dir=str(tmp_path / mode), mode=mode, max_steps=2,
                                       seq_len=32, batch_size=4, micro_batch_size=4)
        train(config, [parse(t).segments for t in texts], tok)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}

    def generate(mode: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "lmlm.cli", "generate", "--model",
                               str(tmp_path / mode / "checkpoint"), "--max-new-tokens", "3", "--device", "cpu",
                               "Person 3 was born in"], capture_output=True, text=True, env=env, timeout=300)

    proc = generate("standard")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Person 3 was born in" in proc.stdout
    proc = generate("lmlm")
    assert proc.returncode == 2 and "no knowledge base" in proc.stderr
