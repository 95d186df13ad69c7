"""``lmlm bench generate`` on a tiny checkpoint: the report's fields and its parity checks."""

from __future__ import annotations

import json

import torch
from gen_support import make_kb, trained_world
from typer.testing import CliRunner

from lmlm.bench.generate import bench_prompts, run_generate_bench
from lmlm.checkpoint import save_checkpoint
from lmlm.cli import app

KEYS = ["plain_tps_b1", "engine_tps_b1", "reencode_tps_b1", "plain_tps_b16", "engine_tps_b16",
        "lookups_per_sequence", "identical_batch_vs_single", "identical_engine_vs_reencode"]


def test_bench_report(tmp_path):
    world = trained_world()
    folder = save_checkpoint(tmp_path / "ckpt", world.model, world.tok)
    kb = make_kb(world, str(tmp_path / "kb"))
    assert len(set(bench_prompts(50, kb))) == 50
    before = torch.get_num_threads()
    report = run_generate_bench(folder, tmp_path / "kb", new_tokens=24, n_single=2, n_batch=4, n_check=8,
                                check_tokens=16, repeats=1, log=lambda msg: None)
    torch.set_num_threads(before)
    assert all(k in report for k in KEYS) and json.loads(json.dumps(report)) == report
    assert report["identical_batch_vs_single"] and report["identical_engine_vs_reencode"]
    assert report["lookups_per_sequence"] > 0 and min(report[k] for k in KEYS[:5]) > 0


def test_bench_command_help():
    res = CliRunner().invoke(app, ["bench", "generate", "--help"])
    assert res.exit_code == 0 and "--model" in res.output
