"""``lmlm generate`` from the command line with our own checkpoints."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

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


def test_options_that_do_not_go_together_are_one_line_before_anything_is_printed(tmp_path):
    """A forced call with no lookups allowed, an empty stop text, streaming with beam search, an empty
    prompt: exit 2 with one line naming them, the prompt never printed (each ran, or printed it first)."""
    from typer.testing import CliRunner

    from lmlm.cli import app
    from lmlm.generate import LookupGenerator
    from lmlm.kb import KnowledgeBase, get_encoder
    from lmlm.checkpoint import load_checkpoint
    from lmlm.serve.demo import build_demo

    demo = build_demo(tmp_path / "demo", encoder=get_encoder())
    prompt = demo.prompts[0]
    for extra, named in ((["--force-lookup", "--max-lookups", "0"], "--max-lookups"), (["--stop", ""], "--stop"),
                         (["--stream", "--num-beams", "2"], "--num-beams")):
        res = CliRunner().invoke(app, ["generate", prompt, "--model", str(demo.model_dir), "--kb", str(demo.kb_dir),
                                       "--max-new-tokens", "8", "--device", "cpu", *extra])
        lines = [x for x in res.output.splitlines() if x.strip() and not x.startswith("Loading weights")]
        assert res.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and named in lines[0], \
            res.output
    res = CliRunner().invoke(app, ["generate", prompt, "", "--model", str(demo.model_dir), "--kb", str(demo.kb_dir)])
    assert res.exit_code == 2 and "error: prompt 2 is empty" in res.output, res.output  # as the server's 422
    model, tok, _ = load_checkpoint(demo.model_dir)
    gen = LookupGenerator(model, tok, KnowledgeBase.open(demo.kb_dir), max_lookups=0)
    for kwargs in (dict(force_lookup=True), dict(force_lookup_at=[0]), dict(stop_strings=[""])):
        with pytest.raises(ValueError):
            gen.generate([prompt], max_new_tokens=4, **kwargs)
