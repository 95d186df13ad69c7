"""The vLLM backend: its per-row grammar against the engine's processor (always), and the backend
against the Hugging Face engine where vLLM is installed (a GPU machine, or vLLM's CPU build: see
`.ci/run`)."""

from __future__ import annotations

import importlib.util
import random

import pytest
import torch
from gen_support import bio_prompts, make_kb, trained_world

from lmlm.checkpoint import save_checkpoint
from lmlm.generate import LookupGenerator
from lmlm.generate.processor import PAPER_LOGIT_BIAS, LookupLogitsProcessor
from lmlm.generate.rows import RowGrammar
from lmlm.generate.trie import KeyTrie, TokenTrie
from lmlm.kb import Triple

HAS_VLLM = importlib.util.find_spec("vllm") is not None


@pytest.mark.skipif(HAS_VLLM, reason="vLLM is installed")
def test_missing_vllm_names_the_extra():
    from lmlm.generate.vllm import VLLMLookupGenerator

    with pytest.raises(ImportError, match=r"lmlm\[vllm\]"):
        VLLMLookupGenerator("some-model")


def test_the_row_grammar_scores_as_the_engine_processor_does():
    """Random rows with markers anywhere, read a token at a time: wherever the engine does not force a
    value, the per-row grammar vLLM runs leaves the same scores (bias, bans, over-long fields closed)."""
    tok = trained_world().tok
    rng = random.Random(0)
    compared = {"outside": 0, "field": 0, "cut": 0, "spent": 0}
    for _ in range(40):
        width = rng.randint(1, 6)
        row = [rng.choice(tok.call_ids) if rng.random() < 0.3 else rng.randrange(len(tok)) for _ in range(40)]
        engine = LookupLogitsProcessor(tok, None, logit_bias=PAPER_LOGIT_BIAS, max_lookups=2, max_field_tokens=3,
                                       count_from=width)
        grammar = RowGrammar(tok.call_ids, sorted({tok.eos_id, tok.doc_id}), list(PAPER_LOGIT_BIAS), max_lookups=2,
                             max_field_tokens=3)
        for t in range(width, len(row)):
            scores = torch.randn(1, len(tok))
            got = grammar(row[:width], row[width:t], scores[0].clone())
            markers = [i for i, x in enumerate(row[:t]) if x in tok.call_ids]
            last = row[markers[-1]] if markers else None
            if last == tok.retrieve_id:  # the engine forces the value here; vLLM stops the row instead
                continue
            want = engine(torch.tensor([row[:t]]), scores.clone())[0]
            assert torch.equal(got, want), (row[:t], t)
            spent = row[width:t].count(tok.start_id) >= 2
            kind = ("cut" if t - 1 - markers[-1] >= 3 else "field") if last in (tok.start_id, tok.sep_id) else \
                ("spent" if spent else "outside")
            compared[kind] += 1
    assert min(compared.values()) >= 10, compared  # every state was met


def test_the_row_grammar_forces_calls_and_keeps_queries_on_keys_as_the_engine_does(tmp_path):
    """Decoding random scores a token at a time with calls forced at offsets and the KB's prefix tree: the
    per-row grammar (fed the tree's paths, as vLLM's process reads them) leaves the engine processor's
    scores at every step the engine does not force a value, and the rows make whole calls on real keys."""
    world = trained_world()
    tok, kb = world.tok, make_kb(world, str(tmp_path / "kb"))
    trie = KeyTrie(kb, tok)
    rng = torch.Generator().manual_seed(0)
    compared = {"forced start": 0, "in tree": 0, "free": 0}
    for seed in range(6):
        prompt = [tok.doc_id, *tok.encode_text(f"Person {seed} was born in")]
        offsets = [2, 9 + seed, 30]
        engine = LookupLogitsProcessor(tok, kb, logit_bias=None, max_lookups=8, constraint=trie,
                                       force_at=[offsets], count_from=len(prompt))
        grammar = RowGrammar(tok.call_ids, sorted({tok.eos_id, tok.doc_id}), None, max_lookups=8,
                             force_at=offsets, origin=len(prompt), trie=TokenTrie(trie.paths()))
        out: list[int] = []
        while len(out) < 60:
            scores = torch.randn(1, len(tok), generator=rng)
            want = engine(torch.tensor([prompt + out]), scores.clone())[0]
            last = [t for t in prompt + out if t in tok.call_ids][-1:]
            # the engine forces the value after <|db_retrieve|>, where vLLM stops the row instead; right after a
            # call's end, whether a call may open at once is the driver's word (``missed``, from its lookup's trace)
            if last != [tok.retrieve_id] and not (out and out[-1] == tok.end_id):
                got = grammar(prompt, list(out), scores[0].clone())
                assert torch.equal(got, want), (seed, out)
                allowed = int(torch.isfinite(want).sum())
                kind = "forced start" if allowed == 1 and int(want.argmax()) == tok.start_id else \
                    "in tree" if last == [tok.start_id] or last == [tok.sep_id] else "free"
                compared[kind] += 1
            out.append(int(want.argmax()))
        calls = [i for i, t in enumerate(out) if t == tok.start_id]
        assert calls[:1] == [2]  # the first call opens at its offset
        for c in calls:
            body = out[c + 1:]
            if tok.retrieve_id in body:
                query = body[:body.index(tok.retrieve_id) + 1]
                assert tuple(query) in set(trie.paths())  # a real key, whole
    assert compared["forced start"] >= 6 and min(compared.values()) >= 6, compared


def test_the_row_grammar_biases_a_round_as_the_engine_does(tmp_path):
    """The copy and name biases where the vLLM backend starts a round: after an answered call (the value
    favoured while the text states it) and right after ``<|db_start|>`` (the names the text gives). The
    per-row grammar, given the value and the names as the backend gives them, leaves the engine's scores
    at every step, and the biases changed the scores at some of them."""
    world = trained_world()
    tok, kb = world.tok, make_kb(world, str(tmp_path / "kb"))
    sep_ids = sorted({tok.eos_id, tok.doc_id})
    rng = torch.Generator().manual_seed(0)
    biased_steps = 0
    for name, city, _ in world.people[:6]:
        text = [tok.doc_id, *tok.encode_text(f"{name} met Hugo Moss. {name} was born in")]
        call = [tok.start_id, *tok.encode_field(name), tok.sep_id, *tok.encode_field("Birth City"), tok.retrieve_id]
        engine = LookupLogitsProcessor(tok, kb, logit_bias=None, copy_bias=5.0, name_bias=10.0)
        plain = LookupLogitsProcessor(tok, kb, logit_bias=None)
        ids = text + call
        while ids[-1] != tok.end_id:  # the engine forces the value; vLLM appends it between rounds
            ids.append(int(engine(torch.tensor([ids]), torch.zeros(1, len(tok)))[0].argmax()))
        value = ids[len(text) + len(call):-1]
        assert tok.decode_field(value) == city
        names = engine.answers.names_before(text + [tok.start_id], len(text))
        assert {tok.decode_field(n) for n in names} == {name, "Hugo Moss"}
        for prompt, spec in ((ids, dict(copy_bias=5.0, copy=value)),
                             (text + [tok.start_id], dict(name_bias=10.0, names=names))):
            grammar = RowGrammar(tok.call_ids, sep_ids, None, **spec)
            out: list[int] = []
            while len(out) < 8 and (not out or out[-1] not in (tok.sep_id, tok.start_id)):
                scores = torch.randn(1, len(tok), generator=rng)
                want = engine(torch.tensor([prompt + out]), scores.clone())[0]
                assert torch.equal(grammar(prompt, list(out), scores[0].clone()), want), (name, out)
                biased_steps += not torch.equal(want, plain(torch.tensor([prompt + out]), scores.clone())[0])
                out.append(int(want.argmax()))
            if "copy" in spec:
                assert out[:len(value)] == value  # the text states the value
            else:
                assert tok.decode_field(out[:-1]) in (name, "Hugo Moss") and out[-1] == tok.sep_id
    assert biased_steps >= 20, biased_steps
    kb.close()


@pytest.mark.skipif(not HAS_VLLM, reason="vLLM is not installed (pip install 'lmlm[vllm]')")
def test_vllm_decodes_with_the_biases_as_the_engine_does(tmp_path):
    """``copy_bias`` and ``name_bias`` on vLLM, on people added to the KB after training: without them the
    model's query slips to a trained name; with biases no score can beat, every query names the person
    the prompt gives and the text states the value after the call, as the engine's rows do."""
    from lmlm.generate.vllm import VLLMLookupGenerator

    world = trained_world()
    folder = save_checkpoint(tmp_path / "ckpt", world.model, world.tok)
    kb = make_kb(world, str(tmp_path / "kb"))
    kb.add([Triple("Zed Quorra", "Birth City", "Reykjavik"), Triple("Una Vell", "Birth City", "Tbilisi")], who="t")
    prompts = ["Zed Quorra was born in", "Una Vell was born in"]
    options = dict(copy_bias=1e4, name_bias=1e4)
    plain = LookupGenerator(world.model, world.tok, kb).generate(prompts, max_new_tokens=48, force_lookup=True)
    assert not any(r.trace[0].found for r in plain)  # a trained name, refused
    engine = LookupGenerator(world.model, world.tok, kb, **options).generate(prompts, max_new_tokens=48,
                                                                             force_lookup=True)
    with VLLMLookupGenerator(folder, kb, tokenizer=world.tok, gpu_memory_utilization=0.2, enforce_eager=True,
                             dtype="float32", **options) as gen:
        served = gen.generate(prompts, max_new_tokens=48, force_lookup=True)
    for prompt, value, r, e in zip(prompts, ["Reykjavik", "Tbilisi"], served, engine):
        t = r.trace[0]
        assert t.found and t.query_entity == prompt.rsplit(" ", 3)[0] and t.value == value, r.text
        assert r.clean_text.lstrip().startswith(value), r.text  # stated after the call, not drifted off
        assert r.token_ids == e.token_ids
    kb.close()


@pytest.mark.skipif(not HAS_VLLM, reason="vLLM is not installed (pip install 'lmlm[vllm]')")
def test_vllm_matches_the_engine(tmp_path):
    from lmlm.generate.vllm import VLLMLookupGenerator

    world = trained_world()
    folder = save_checkpoint(tmp_path / "ckpt", world.model, world.tok)
    kb = make_kb(world, str(tmp_path / "kb"))
    prompts = bio_prompts(world, 12)
    engine = LookupGenerator(world.model, world.tok, kb).generate(prompts, max_new_tokens=40)
    with VLLMLookupGenerator(folder, kb, tokenizer=world.tok, gpu_memory_utilization=0.2, enforce_eager=True,
                             dtype="float32") as gen:  # closed after: no engine process left behind
        served = gen.generate(prompts, max_new_tokens=40)
    assert gen.llm is None
    assert sum(a.token_ids == b.token_ids for a, b in zip(engine, served)) >= 10  # kernels round differently
    start, sep, ret, end = world.tok.call_ids
    for r in served:
        assert len(r.token_ids) <= 40
        order = [t for t in r.token_ids if t in world.tok.call_ids]  # every call whole, markers in order
        assert order[:len(order) // 4 * 4] == [start, sep, ret, end] * (len(order) // 4) and len(r.trace) >= 1
        for t in r.trace:
            if t.found:
                assert t.value == world.facts[(t.matched_entity, t.matched_relation)]


@pytest.mark.skipif(not HAS_VLLM, reason="vLLM is not installed (pip install 'lmlm[vllm]')")
def test_vllm_forces_calls_on_keys_as_the_engine_does(tmp_path):
    """``force_lookup_at`` with the KB's prefix tree (the paper bench's setting) on vLLM: calls open at
    the offsets, every query is a key of the KB answered with its value, and the rows are the engine's."""
    from lmlm.generate.vllm import VLLMLookupGenerator

    world = trained_world()
    folder = save_checkpoint(tmp_path / "ckpt", world.model, world.tok)
    kb = make_kb(world, str(tmp_path / "kb"))
    prompts = bio_prompts(world, 8)
    # the paper's key match, as its bench runs: a call forced mid-sentence may write a key about someone the
    # text does not name, which entity matching refuses (a miss on both backends alike)
    options = dict(logit_bias=None, max_lookups=8, constrained=True, matching="key")
    offsets = [1, 14, 27]
    engine = LookupGenerator(world.model, world.tok, kb, **options).generate(
        prompts, max_new_tokens=40, ignore_eos=True, force_lookup_at=offsets)
    gen = VLLMLookupGenerator(folder, kb, tokenizer=world.tok, gpu_memory_utilization=0.2, enforce_eager=True,
                              dtype="float32", **options)
    served = gen.generate(prompts, max_new_tokens=40, ignore_eos=True, force_lookup_at=offsets)
    gen.close()
    assert sum(a.token_ids == b.token_ids for a, b in zip(engine, served)) >= 6  # kernels round differently
    start = world.tok.start_id
    for r in served:
        assert len(r.token_ids) == 40
        assert start in r.token_ids[:2] and len(r.trace) >= 3  # a call open at offset 1 moves it to its end
        for t in r.trace:
            if t.status not in ("unfinished", "unanswered"):
                assert t.found and t.value == world.facts[(t.query_entity, t.query_relation)]


@pytest.mark.skipif(not HAS_VLLM, reason="vLLM is not installed (pip install 'lmlm[vllm]')")
def test_the_paper_bench_runs_vllm_beside_the_engine(tmp_path):
    """``lmlm bench generate --preset paper --vllm`` on tiny shapes: the vLLM rows are timed on the
    engine's prompts and forced calls, and their tokens are compared with the engine's."""
    from test_generate_bench_paper import SIZES, TINY, _texts

    from lmlm.bench.generate_paper import run_paper_bench

    world = trained_world()
    kb = make_kb(world, str(tmp_path / "kb"))
    shape = {**TINY, "hidden_size": 128}  # vLLM's CPU attention needs heads of 32 dimensions or more
    report = run_paper_bench({"gpt2": world.tok}, kb, _texts(world), models=["gpt2-124m"], model_overrides=shape,
                             sizes=SIZES, log=lambda msg: None,
                             vllm=dict(gpu_memory_utilization=0.2, enforce_eager=True))
    r = report["models"]["gpt2-124m"]
    assert r["vllm_tps_b1"] > 0 and r["vllm_tps_b16"] > 0 and r["engine_vs_vllm_b1"] > 0
    assert r["vllm_options"]["enforce_eager"] == "True"
    assert r["vllm_lookups_per_256_tokens"] == r["lookups_per_256_tokens"]
    # float32 on both; a random model's near-ties may still round apart
    assert r["mismatches_vllm_vs_engine_b16"] <= 1 and r["mismatches_vllm_vs_engine_b1"] <= 1


def test_generate_backend_options_fail_in_one_line(tmp_path):
    """``lmlm generate --backend``: a bad value, options the vLLM backend does not take, and a missing vLLM
    each end the command with one error line, before any model is opened."""
    from typer.testing import CliRunner

    from lmlm.cli import app

    runner = CliRunner()
    base = ["generate", "x", "--model", str(tmp_path / "none"), "--no-db"]
    for extra, message in ((["--backend", "tgi"], "--backend must be 'hf' or 'vllm', got 'tgi'"),
                           (["--vllm-option", "dtype=float32"], "--vllm-option needs --backend vllm"),
                           (["--backend", "vllm", "--stream", "--num-beams", "2"],
                            "--stream, --num-beams not with --backend vllm"),
                           (["--backend", "vllm", "--device", "cpu"], "--device not with --backend vllm"),
                           (["--device", "tpu"], "--device 'tpu' is not a device: use cpu, cuda or cuda:N"),
                           (["--logit-bias", "a,b,c,d"], "--logit-bias takes four numbers"),
                           *([(["--device", "cuda"], "--device cuda: no CUDA device is visible here")]
                             if not torch.cuda.is_available() else [])):
        res = runner.invoke(app, base + extra)
        assert res.exit_code == 2 and f"error: {message}" in res.output, res.output
    res = runner.invoke(app, base + ["--backend", "vllm", "--vllm-option", "=1"])
    want = "--vllm-option: expected KEY=VALUE, got '=1'" if HAS_VLLM else "pip install 'lmlm[vllm]'"
    assert res.exit_code == 2 and want in res.output, res.output


@pytest.mark.skipif(not HAS_VLLM, reason="vLLM is not installed (pip install 'lmlm[vllm]')")
def test_lmlm_generate_on_vllm_writes_what_the_engine_writes(tmp_path):
    """``lmlm generate --backend vllm --json``, run as a user runs it: stdout is the JSON alone (vLLM's
    logs on stderr), with the engine's continuations and lookups."""
    import json
    import subprocess
    import sys

    world = trained_world()
    folder = save_checkpoint(tmp_path / "ckpt", world.model, world.tok)
    make_kb(world, str(tmp_path / "kb")).close()
    prompts = bio_prompts(world, 3)
    args = [sys.executable, "-m", "lmlm.cli", "generate", *prompts, "--model", str(folder), "--kb", str(tmp_path / "kb"),
            "--max-new-tokens", "30", "--json", "--constrained"]
    res = subprocess.run(args, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-2000:]
    engine = json.loads(res.stdout)
    res = subprocess.run(args + ["--backend", "vllm", "--vllm-option", "gpu_memory_utilization=0.2",
                                 "--vllm-option", "enforce_eager=true", "--vllm-option", "dtype=float32"],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "INFO" in res.stderr  # vLLM did log, and not into the JSON
    served = json.loads(res.stdout)
    assert sum(a["text"] == b["text"] for a, b in zip(engine, served)) >= 2  # kernels round differently
    for r in served:
        assert r["trace"] and all(t["found"] for t in r["trace"] if t["status"] not in ("unfinished", "unanswered"))
