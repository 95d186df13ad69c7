"""``lmlm bench generate``: lookup decoding against plain generation and the re-encode loop.

Three ways to continue the same prompts with the same model, greedy, every row run to the same
number of new tokens (document separators are ordinary tokens, so a row goes on to the next
biography), measured side by side in one run:

* ``plain``: Hugging Face ``generate`` with the four lookup tokens suppressed (no lookup happens);
* ``engine``: :meth:`lmlm.generate.LookupGenerator.generate` (one logits processor, KV cache kept);
* ``reencode``: the authors' loop (:func:`lmlm.generate.reencode.reencode_generate`), batch 1 only.

Tokens/s counts every generated token (forced value tokens included) and is the best of
``repeats`` interleaved rounds, so a burst of other work on the machine hurts no method alone.
Greedy outputs are compared token for token on ``n_check`` prompts: batch against single rows,
engine against the re-encode loop (ids carried between calls), and, for information, against the
authors' text round trip (``mismatches_engine_vs_retokenizing_loop``: tokenizing the text again
changes the ids the model sees).

The engine decodes greedy and sampled rows with its own KV-cached loop (:mod:`lmlm.generate.loop`),
which skips ``generate``'s per-step bookkeeping, keeps its KV cache in place and, at batch 1, feeds
the tokens the grammar forces (a lookup's value) with the token before them in one forward. The re-encode loop pays ``generate``'s per-step cost, one prompt encoding of
the text so far per lookup and one ``generate`` call per lookup. At batch 1 on a CPU a decode step
of even a tiny model is mostly the model's own forward, which both pay for every token, so the
engine's lead there is bounded by how much of a step is bookkeeping; the re-encode loop's cost
grows with the context (quadratic in the number of lookups) and it cannot batch.

On a CUDA device (``--device cuda``) the engine decodes over a static KV cache and replays each
one-token step from a CUDA graph (:mod:`lmlm.generate.graphs`); the report then also carries the
engine without graphs (``engine_eager_tps_b1``, ``engine_eager_tps_b16``) and
``mismatches_graphs_vs_eager`` (greedy, 200 prompts).

``--preset paper`` measures the paper's GPT2-124M and LLaMA2-176M instead, with 512-token prompts
and 512 new tokens (:mod:`lmlm.bench.generate_paper`). The default (``--preset tiny``) model is a
64-wide, 2-layer GPT-2 trained here on a synthetic biography world whose documents
state five or six facts each (about ten lookups per 256 tokens): small enough that a decode step
is mostly fixed overhead, where batching pays. It is cached in ``--cache`` so reruns start at once.
``--model DIR --kb DIR`` measures an existing checkpoint instead.
"""

from __future__ import annotations

import json
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, List, NoReturn, Optional

import typer

from . import bench_app
from .generate_paper import PAPER_DTYPES, PAPER_MODELS, device_name, plain_generate

__all__ = ["BENCH_WORLD", "BENCH_TRAIN", "build_bench_model", "bench_prompts", "run_generate_bench"]

# The world and model trained when no --model is given: five or six facts per biography.
BENCH_WORLD = dict(preset="smoke", facts_per_doc=(5, 6), filler_per_doc=(0, 1))
BENCH_TRAIN = dict(model="gpt2-tiny", model_overrides=dict(hidden_size=64, n_head=2, n_layer=2, context_length=320),
                   vocab_size=1024, seq_len=320, batch_size=8, max_steps=600, lr=3e-3, warmup_steps=30)
_OPENERS = ("", " was born", " studied", " works")


def build_bench_model(cache: Path, seed: int = 0, log: Callable[[str], None] = print) -> tuple[Path, Path]:
    """Train (once) the bench model and build its KB under ``cache``; returns (checkpoint, kb) folders."""
    from ..checkpoint import is_checkpoint
    from ..kb import KnowledgeBase, Triple
    from ..stages import finish_stage, stage_done
    from ..tokens import LookupTokenizer, train_bpe
    from ..train import TrainConfig, train
    from ..worlds.bios import BiosConfig, BiosWorld

    ckpt, kb_dir = cache / "train" / "checkpoint", cache / "kb"
    stamp = json.dumps({"world": BENCH_WORLD, "train": BENCH_TRAIN, "seed": seed}, sort_keys=True)
    if is_checkpoint(ckpt) and stage_done(kb_dir) is not None and (cache / "bench.json").exists() \
            and (cache / "bench.json").read_text() == stamp:
        return ckpt, kb_dir
    for old in (cache / "train", cache / "world", kb_dir):  # built from another recipe, or cut short
        if old.exists():
            shutil.rmtree(old)
    w = dict(BENCH_WORLD)
    world = BiosWorld.generate(BiosConfig.from_name(w.pop("preset"), seed=seed, **w))
    world.save(cache / "world")
    t = dict(BENCH_TRAIN)
    tok = LookupTokenizer(train_bpe((d.plain for d in world.train_documents), vocab_size=t.pop("vocab_size")))
    kb = KnowledgeBase.create(kb_dir)
    kb.add([Triple(e, r, v, source=s) for e, r, v, s in world.triples()], who="bench", why="bench world")
    finish_stage(kb_dir, {"version": kb.version})
    log(f"training the bench model ({t['max_steps']} steps) into {cache}")
    cfg = TrainConfig(mode="lmlm", micro_batch_size=t["batch_size"], seed=seed, out_dir=str(cache / "train"),
                      kb=str(kb_dir), progress=True, **t)  # a bar on stderr: about 100 s on a CPU
    train(cfg, [d.segments for d in world.train_documents], tok)
    (cache / "bench.json").write_text(stamp)
    return ckpt, kb_dir


def bench_prompts(n: int, kb) -> list[str]:
    """``n`` biography openings: each KB entity alone, then with a verb."""
    names = list(dict.fromkeys(e for e, _ in sorted(kb.keys())))
    return [f"{names[i % len(names)]}{_OPENERS[(i // len(names)) % len(_OPENERS)]}" for i in range(n)]


def run_generate_bench(model_dir: Path, kb_dir: Path, *, new_tokens: int = 256, n_single: int = 6,
                       n_batch: int = 16, n_check: int = 200, check_tokens: int = 128, repeats: int = 5,
                       threads: int = 1, device: str = "cpu", log: Callable[[str], None] = print) -> dict:
    """Measure and compare; returns the JSON-ready report (see the module docstring)."""
    import torch

    from ..generate import LookupGenerator
    from ..generate.loading import load_model, open_kb
    from ..generate.reencode import reencode_generate

    torch.set_num_threads(threads)
    model, tok, _ = load_model(model_dir, device=device)
    sync = torch.cuda.synchronize if model.device.type == "cuda" else (lambda: None)
    kb = open_kb(kb_dir)
    gen = LookupGenerator(model, tok, kb)
    prompts = bench_prompts(max(n_check, n_single, n_batch), kb)
    single, batch16 = prompts[:n_single], prompts[:n_batch]

    def plain(ps: list[str], batch: int) -> int:
        return _plain(gen, ps, new_tokens, batch)

    def engine(ps: list[str], batch: int) -> int:
        return sum(len(r.token_ids) for r in gen.generate(ps, max_new_tokens=new_tokens, batch_size=batch,
                                                          ignore_eos=True))

    def reencode(ps: list[str], batch: int) -> int:
        return sum(len(reencode_generate(gen, p, max_new_tokens=new_tokens, ignore_eos=True).token_ids) for p in ps)

    runs = {"plain_b1": (plain, single, 1), "engine_b1": (engine, single, 1), "reencode_b1": (reencode, single, 1),
            "plain_b16": (plain, batch16, n_batch), "engine_b16": (engine, batch16, n_batch)}
    eager = LookupGenerator(model, tok, kb, cuda_graphs=False) if gen.static_decoding else None
    if eager is not None:  # on a GPU: the engine without CUDA graphs too, for comparison

        def engine_eager(ps: list[str], batch: int) -> int:
            return sum(len(r.token_ids) for r in eager.generate(ps, max_new_tokens=new_tokens, batch_size=batch,
                                                                ignore_eos=True))

        runs.update(engine_eager_b1=(engine_eager, single, 1), engine_eager_b16=(engine_eager, batch16, n_batch))
    for fn, ps, b in runs.values():  # warm up every path once
        fn(ps[:1], 1)
    best: dict[str, float] = {k: 0.0 for k in runs}
    for r in range(repeats):
        for name, (fn, ps, b) in runs.items():
            sync()
            t0 = time.perf_counter()
            n = fn(ps, b)
            sync()
            best[name] = max(best[name], n / (time.perf_counter() - t0))
        log(f"round {r + 1}/{repeats}: " + ", ".join(f"{k} {v:.0f}" for k, v in best.items()) + " tokens/s")

    lookups = [len(r.trace) for r in gen.generate(batch16, max_new_tokens=new_tokens, batch_size=n_batch,
                                                  ignore_eos=True)]
    check = prompts[:n_check]
    log(f"checking greedy outputs on {len(check)} prompts ({check_tokens} tokens each)")
    batched = gen.generate(check, max_new_tokens=check_tokens, batch_size=n_batch, ignore_eos=True)
    rows = [gen.generate([p], max_new_tokens=check_tokens, ignore_eos=True)[0] for p in check]
    loop = [reencode_generate(gen, p, max_new_tokens=check_tokens, ignore_eos=True) for p in check]
    text_loop = [reencode_generate(gen, p, max_new_tokens=check_tokens, ignore_eos=True, retokenize=True)
                 for p in check]
    extra = {}
    if eager is not None:
        eager_rows = eager.generate(check, max_new_tokens=check_tokens, batch_size=n_batch, ignore_eos=True)
        extra = {"engine_eager_tps_b1": round(best["engine_eager_b1"], 1),
                 "engine_eager_tps_b16": round(best["engine_eager_b16"], 1),
                 "mismatches_graphs_vs_eager": sum(a.token_ids != b.token_ids for a, b in zip(batched, eager_rows))}
    batch_diff = sum(a.token_ids != b.token_ids for a, b in zip(batched, rows))
    loop_diff = sum(a.token_ids != b.token_ids for a, b in zip(rows, loop))
    text_diff = sum(a.token_ids != b.token_ids for a, b in zip(rows, text_loop))
    report = {
        "plain_tps_b1": round(best["plain_b1"], 1), "engine_tps_b1": round(best["engine_b1"], 1),
        "reencode_tps_b1": round(best["reencode_b1"], 1), "plain_tps_b16": round(best["plain_b16"], 1),
        "engine_tps_b16": round(best["engine_b16"], 1),
        "lookups_per_sequence": round(statistics.mean(lookups), 2),
        "identical_batch_vs_single": batch_diff == 0, "identical_engine_vs_reencode": loop_diff == 0,
        "engine_vs_plain_b1": round(best["engine_b1"] / best["plain_b1"], 3),
        "engine_b16_vs_b1": round(best["engine_b16"] / best["engine_b1"], 2),
        "engine_vs_reencode_b1": round(best["engine_b1"] / best["reencode_b1"], 2),
        "mismatches_batch_vs_single": batch_diff, "mismatches_engine_vs_reencode": loop_diff,
        "mismatches_engine_vs_retokenizing_loop": text_diff,
        "lookups_per_check_sequence": round(statistics.mean(len(r.trace) for r in rows), 2),
        "new_tokens": new_tokens, "check_prompts": len(check), "check_tokens": check_tokens,
        "prompts_b1": len(single), "prompts_b16": len(batch16), "repeats": repeats, "threads": threads,
        "parameters": sum(p.numel() for p in model.parameters()), "model": str(model_dir), "kb": str(kb_dir),
        "device": device_name(model.device), "cuda_graphs": gen.static_decoding, **extra,
    }
    return report


def _plain(gen, prompts: list[str], new_tokens: int, batch: int) -> int:
    """Plain Hugging Face ``generate`` with the lookup tokens suppressed; returns the tokens generated."""
    return sum(map(len, plain_generate(gen, prompts, new_tokens, batch)))


@bench_app.command("generate")
def bench_generate(model: Optional[Path] = typer.Option(None, help="checkpoint (default: train the bench model)"),
                   kb: Optional[Path] = typer.Option(None, help="KB folder of --model"),
                   preset: str = typer.Option("tiny", help="'tiny': the trained 186k-parameter bench model; "
                                              "'paper': GPT2-124M and LLaMA2-176M, 512 + 512 tokens"),
                   quick: bool = typer.Option(False, help="paper preset: 256 + 256 tokens, one prompt at batch 1"),
                   tokenizer: List[str] = typer.Option(
                       None, help="paper preset: NAME=PATH of the gpt2 and llama2 tokenizers (default: the "
                                  "project's shared data folder, if found)"),
                   wiki: Optional[Path] = typer.Option(None, help="paper preset: a Wikipedia XML dump for the "
                                                       "prompts and the KB (default: the shared data's sample)"),
                   models: str = typer.Option(",".join(PAPER_MODELS), help="paper preset: model presets to run"),
                   cache: Path = typer.Option(Path("runs/bench-generate"), help="where the bench model is kept"),
                   new_tokens: int = typer.Option(256, min=1, help="tokens generated per prompt for the timings"),
                   n_single: int = typer.Option(6, min=1, help="prompts timed at batch 1"),
                   n_check: int = typer.Option(200, min=1, help="prompts whose greedy outputs are compared"),
                   check_tokens: int = typer.Option(128, min=1, help="tokens generated per compared prompt"),
                   repeats: Optional[int] = typer.Option(None, min=1, help="interleaved timing rounds, the best of "
                                                         "each counts (default: 5; 1 for the paper preset)"),
                   threads: int = typer.Option(1, min=1, help="torch threads"),
                   device: str = typer.Option("cpu", help="where the model runs: cpu, cuda, cuda:1, ..."),
                   dtype: str = typer.Option("float32", help="paper preset: the models' float32, bfloat16 or "
                                             "float16 (vLLM's too)"),
                   vllm: bool = typer.Option(False, "--vllm", help="paper preset: the vLLM backend beside the engine "
                                             "(pip install 'lmlm\\[vllm]')"),
                   vllm_option: List[str] = typer.Option(
                       None, help="with --vllm: KEY=VALUE passed to vllm.LLM, VALUE read as JSON where it parses "
                                  "(default: gpu_memory_utilization=0.3)")):
    """Tokens/s of lookup decoding vs plain generate and the re-encode loop; identical greedy outputs."""

    from ..cli_errors import check_device

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    check_device(device)  # before any model is trained
    served = _vllm_options(vllm, vllm_option or [], preset)
    if dtype not in PAPER_DTYPES:
        _fail(f"unknown dtype {dtype!r}", f"--dtype ({', '.join(PAPER_DTYPES)})")
    if preset == "paper":
        report = _paper(quick, tokenizer or [], wiki, models, cache, repeats or 1, threads, device, log, served,
                        dtype)
    elif preset != "tiny":
        _fail(f"unknown preset {preset!r}", "--preset (tiny or paper)")
    elif dtype != "float32":
        _fail("the tiny preset runs in float32", "--dtype (with --preset paper)")
    elif quick:
        _fail("--quick shortens the paper preset; the tiny preset's sizes are --new-tokens and --n-single",
              "--quick (with --preset paper)")
    else:
        if (model is None) != (kb is None):
            _fail("pass both --model and --kb, or neither", "--model/--kb")
        if model is None:
            model, kb = build_bench_model(cache, log=log)
        from ..cli_errors import user_errors

        with user_errors():  # a checkpoint or KB that is not there: one line
            report = run_generate_bench(model, kb, new_tokens=new_tokens, n_single=n_single, n_check=n_check,
                                        check_tokens=check_tokens, repeats=repeats or 5, threads=threads,
                                        device=device, log=log)
    print(json.dumps(report))


def _vllm_options(on: bool, specs: list[str], preset: str) -> dict | None:
    """``--vllm`` and ``--vllm-option`` as ``vllm.LLM``'s keyword arguments (``None``: no vLLM run)."""
    if not on:
        if specs:
            _fail("--vllm-option is for the vLLM run", "--vllm")
        return None
    if preset != "paper":
        _fail("the vLLM backend is measured by the paper preset", "--preset paper")
    from ..generate.vllm import llm_options, vllm_installed

    if not vllm_installed():
        _fail("the vLLM backend needs vllm: pip install 'lmlm[vllm]'", "--vllm")
    try:
        return llm_options(specs, {"gpu_memory_utilization": 0.3})
    except ValueError as e:
        _fail(str(e), "--vllm-option")


def _paper(quick: bool, tokenizer: list[str], wiki: Optional[Path], models: str, cache: Path, repeats: int,
           threads: int, device: str, log: Callable[[str], None], vllm: dict | None = None,
           dtype: str = "float32") -> dict:
    """The paper preset from the command's options; bad options end the command with one error line."""
    from ..generate.loading import open_kb
    from ..models import MODEL_PRESETS
    from ..tokens import load_tokenizer
    from .generate_paper import paper_inputs, run_paper_bench

    shared = Path(__file__).resolve().parents[3] / "shared" / "data"
    names = [m.strip() for m in models.split(",") if m.strip()]
    unknown = [m for m in names if m not in MODEL_PRESETS]
    if not names or unknown:
        _fail(f"unknown model preset(s) {', '.join(unknown) or '(none given)'}", "--models")
    specs = {name: shared / "tokenizers" / name for name in ("gpt2", "llama2")}
    for spec in tokenizer:
        if "=" not in spec:
            _fail(f"expected NAME=PATH, got {spec!r}", "--tokenizer")
        name, path = spec.split("=", 1)
        specs[name] = Path(path)
    needed = {MODEL_PRESETS[m]["tokenizer"] for m in names}
    toks = {}
    for name in sorted(needed):
        if name not in specs or not specs[name].exists():
            _fail(f"no {name} tokenizer at {specs.get(name)}", f"--tokenizer {name}=PATH")
        try:
            toks[name] = load_tokenizer(specs[name])
        except Exception as e:  # noqa: BLE001 -- any failure to load is the user's file
            _fail(f"cannot load the {name} tokenizer ({type(e).__name__}: {e})", str(specs[name]))
    wiki = wiki or shared / "wikipedia" / "enwiki-sample-106-articles.xml.bz2"
    if not wiki.is_file():
        _fail(f"no Wikipedia dump at {wiki}", "--wiki")
    kb_dir, texts = paper_inputs(cache / "paper", wiki, log=log)
    try:
        return run_paper_bench(toks, open_kb(kb_dir), texts, models=names, size="quick" if quick else "full",
                               repeats=repeats, threads=threads, device=device, dtype=dtype, vllm=vllm, log=log)
    except ValueError as e:  # too few long texts in the dump
        _fail(str(e), str(wiki))


def _fail(what: str, where: str) -> NoReturn:
    """``error: what: where`` on one line, exit code 2 (:func:`lmlm.cli_errors.fail`)."""
    from ..cli_errors import fail

    fail(f"{what}: {where}")
