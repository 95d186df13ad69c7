"""``lmlm bench generate --preset paper`` on tiny shapes: its plumbing, parity checks and errors (the
paper's sizes are measured by the command itself, not here)."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch
from gen_support import make_kb
from typer.testing import CliRunner

from lmlm.bench.generate_paper import LOOKUP_PERIOD, lookup_offsets, paper_prompts, run_paper_bench
from lmlm.cli import app
from lmlm.generate.packed import packing_available

TINY = dict(hidden_size=32, n_layer=1, n_head=2, intermediate_size=64)
SIZES = dict(prompt_tokens=40, new_tokens=48, n_single=1, n_batch=3)


def _texts(world) -> list[str]:
    """Texts longer than a prompt: eight people's sentences each."""
    return [" ".join(f"{n} was born in {c}. {n} works as a {j}." for n, c, j in world.people[i:i + 8])
            for i in range(0, 40, 8)]


def _run(world, tmp_path, **kwargs) -> dict:
    before = torch.get_num_threads()
    try:
        return run_paper_bench({"gpt2": world.tok, "llama2": world.tok}, make_kb(world, str(tmp_path / "kb")),
                               _texts(world), model_overrides=TINY, sizes=SIZES, log=lambda msg: None, **kwargs)
    finally:
        torch.set_num_threads(before)


def test_prompts_and_offsets(world):
    prompts = paper_prompts(world.tok, _texts(world), 3, 40)
    assert len(set(prompts)) == 3 and all(len(world.tok.encode_text(p)) == 39 for p in prompts)  # + doc_id
    offsets = lookup_offsets(512)
    assert len(offsets) == 20 and {b - a for a, b in zip(offsets, offsets[1:])} == {LOOKUP_PERIOD}
    with pytest.raises(ValueError, match="prompt of 500 tokens"):
        paper_prompts(world.tok, _texts(world), 3, 500)


def test_paper_preset_report(world, tmp_path):
    report = _run(world, tmp_path)
    assert json.loads(json.dumps(report)) == report and set(report["models"]) == {"gpt2-124m", "llama2-176m"}
    for r in report["models"].values():
        assert min(r[k] for k in ("plain_tps_b1", "engine_tps_b1", "reencode_tps_b1", "engine_tps_b16")) > 0
        assert r["mismatches_engine_vs_reencode"] == r["mismatches_batch_vs_single"] == 0
        assert r["mismatches_engine_vs_plain_before_first_call"] == 0
        assert r["lookups_per_256_tokens"] > 8 and r["lookups_found"] == 1.0  # forced calls on the KB's keys
        assert r["cuda_graphs"] is False and "engine_eager_tps_b1" not in r
        # on a CPU, the engine without packed weights beside it: in float32 the same rows
        assert r["packed_weights"] is True and r["engine_unpacked_tps_b16"] > 0 and r["packed_vs_unpacked_b1"] > 0
        assert r["mismatches_packed_vs_unpacked"] == 0
        # the decode steps beside their memory floor: batch 16 takes one forward a token, batch 1 fewer
        # (a call's forced tokens go in one forward); float32 keys and values of one 32-wide layer: 256 bytes
        assert r["forwards_per_token_b16"] == 1.0 and r["forwards_per_token_b1"] < 1.0
        assert r["kv_bytes_per_token"] == 256 and r["mean_context"] == 40 + 47 / 2
        assert r["stream_gb_per_s"] > 0.1 and 0 < r["decode_floor_ms_b1"] < r["decode_floor_ms_b16"]
        assert r["decode_step_ms_b16"] > 0 and r["prefill_s_b16"] > 0
        assert min(r["b16_at_floor_vs_b1"], r["b16_vs_b1_at_floors"]) > 0
    assert report["models"]["llama2-176m"]["parameters"] != report["models"]["gpt2-124m"]["parameters"]


def test_paper_preset_static_cache_path(world, tmp_path):
    """The decoding path of a GPU run (static cache; CUDA graphs need a GPU) gives the eager tokens."""
    r = _run(world, tmp_path, models=["gpt2-124m"], cuda_graphs=True)["models"]["gpt2-124m"]
    assert r["cuda_graphs"] is True and r["engine_eager_tps_b16"] > 0
    assert r["mismatches_graphs_vs_eager"] == r["mismatches_engine_vs_reencode"] == 0
    # forwards counted at the static decoder (a CUDA graph replay never calls the model's forward)
    assert r["forwards_per_token_b16"] == 1.0 and r["forwards_per_token_b1"] < 1.0


def test_paper_preset_in_bfloat16(world, tmp_path):
    """``dtype``: the models run in bfloat16 (greedy rows may then part where rounding differs)."""
    report = _run(world, tmp_path, models=["llama2-176m"], dtype="bfloat16")
    r = report["models"]["llama2-176m"]
    assert report["dtype"] == r["dtype"] == "bfloat16" and r["engine_tps_b16"] > 0
    # the packed path where oneDNN has bfloat16 kernels for this CPU, the layers' own forward elsewhere
    assert r["packed_weights"] is packing_available(torch.bfloat16)
    assert r["lookups_per_256_tokens"] > 8 and r["lookups_found"] == 1.0


def test_paper_preset_bad_options_are_one_error_line(tmp_path):
    runner = CliRunner()
    res = runner.invoke(app, ["bench", "generate", "--preset", "paper", "--tokenizer", f"gpt2={tmp_path / 'none'}",
                              "--models", "gpt2-124m"])
    assert res.exit_code == 2 and "error: no gpt2 tokenizer at" in res.output
    res = runner.invoke(app, ["bench", "generate", "--preset", "paper", "--models", "gpt9"])
    assert res.exit_code == 2 and "error: unknown model preset(s) gpt9: --models" in res.output
    res = runner.invoke(app, ["bench", "generate", "--preset", "huge"])
    assert res.exit_code == 2 and "error: unknown preset 'huge'" in res.output
    res = runner.invoke(app, ["bench", "generate", "--preset", "paper", "--dtype", "float64"])
    assert res.exit_code == 2 and "error: unknown dtype 'float64': --dtype (float32, bfloat16, float16)" in res.output
    res = runner.invoke(app, ["bench", "generate", "--dtype", "bfloat16"])
    assert res.exit_code == 2 and "error: the tiny preset runs in float32: --dtype (with --preset paper)" in res.output
    res = runner.invoke(app, ["bench", "generate", "--vllm"])
    assert res.exit_code == 2 and "error: the vLLM backend is measured by the paper preset: --preset paper" in res.output
    res = runner.invoke(app, ["bench", "generate", "--preset", "paper", "--vllm-option", "dtype=float16"])
    assert res.exit_code == 2 and "error: --vllm-option is for the vLLM run: --vllm" in res.output
    if importlib.util.find_spec("vllm") is None:
        res = runner.invoke(app, ["bench", "generate", "--preset", "paper", "--vllm"])
        assert res.exit_code == 2 and "pip install 'lmlm[vllm]'" in res.output
    else:
        res = runner.invoke(app, ["bench", "generate", "--preset", "paper", "--vllm", "--vllm-option", "=1"])
        assert res.exit_code == 2 and "error: expected KEY=VALUE, got '=1': --vllm-option" in res.output


def test_the_paper_inputs_are_the_dumps_plain_texts_and_infobox_kb(tmp_path):
    """The prompts' texts and KB come from a Wikipedia dump read by ``annotate wikipedia``'s own output
    (the document schema), built once and reused."""
    import bz2

    from lmlm.bench.generate_paper import paper_inputs
    from lmlm.kb import KnowledgeBase

    article = ("{{Infobox scientist\n| name = Ada Lovelace\n| birth_place = [[London]], England\n}}\n"
               "'''Ada Lovelace''' was an English mathematician born in [[London]].")
    dump = tmp_path / "dump.xml.bz2"
    dump.write_bytes(bz2.compress(('<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.10/"><page>'
                                   "<title>Ada Lovelace</title><ns>0</ns><id>1</id><revision><id>9</id>"
                                   f"<text>{article}</text></revision></page></mediawiki>").encode()))
    kb_dir, texts = paper_inputs(tmp_path / "cache", dump, log=lambda msg: None)
    assert texts == ["Ada Lovelace was an English mathematician born in London."]
    with KnowledgeBase.open(kb_dir) as kb:
        assert kb.lookup("Ada Lovelace", "Birth Place", fuzzy=False).value == "London, England"
    stamp = (kb_dir / "kb.sqlite").stat().st_mtime_ns
    assert paper_inputs(tmp_path / "cache", dump, log=lambda msg: None) == (kb_dir, texts)
    assert (kb_dir / "kb.sqlite").stat().st_mtime_ns == stamp  # built once
