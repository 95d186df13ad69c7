"""``lmlm bench generate --preset paper``: lookup decoding at the paper's model sizes.

The paper's GPT2-124M and LLaMA2-176M (:mod:`lmlm.models`) with the paper's vocabularies (GPT-2's
and LLaMA-2's tokenizers plus the four lookup tokens) and random weights: speed does not depend on
what the weights know. Each prompt is 512 tokens of a real Wikipedia article and each continuation
512 tokens, so contexts reach the presets' 1,024 positions. Measured side by side in one run, greedy:

* ``plain``: Hugging Face ``generate`` with the lookup tokens suppressed (no lookup), batch 1;
* ``engine``: :meth:`lmlm.generate.LookupGenerator.generate` at batch 1 and at batch 16;
* ``reencode``: the authors' loop (:func:`lmlm.generate.reencode.reencode_generate`), batch 1:
  every lookup encodes the whole text so far again.

Lookups are forced: a call opens every ``LOOKUP_PERIOD`` tokens of the continuation
(``force_lookup_at``; a call still open delays the next), about ten per 256 tokens as in the paper's
annotated text. A random model writes no sensible query, so queries are kept on the KB's keys by its
prefix tree (``constrained=True``): every call names a real (entity, relation) of a KB built from
the infoboxes of a real Wikipedia dump, and its value is that fact's value, by the paper's key match
(``matching="key"``; entity-aware matching would refuse a key about someone the text does not name,
as a random model's keys are). The paper's logit bias is
off (``logit_bias=None``): with random logits a +5 on ``<|db_start|>`` would open a call at every
token, so calls happen only where forced.

Greedy outputs are compared token for token from the timed runs themselves: the engine at batch 1
against the re-encode loop and against its own rows at batch 16, and the engine against plain
``generate`` up to the first forced call (after it the two must differ: plain makes no lookups).
On a CUDA device the engine replays its decode steps from CUDA graphs; the report then adds the
eager engine (``engine_eager_*``), plain ``generate`` at batch 16 and ``mismatches_graphs_vs_eager``.
On a CPU every method runs the linear layers through weights laid out for oneDNN
(:mod:`lmlm.generate.packed`), and the report adds the engine without them (``engine_unpacked_*``,
``packed_vs_unpacked_*``, ``unpacked_b16_vs_b1``, ``mismatches_packed_vs_unpacked`` at batch 16).

Every run sets the engine's decode steps beside the floor of what they read (the memory floor, below):
the model's forwards per new token (``forwards_per_token_*``: batch 1 feeds a call's forced tokens in
one forward, a batch one token a row a step), the prompts' prefill timed alone (``prefill_s_*``), the
mean decode step (``decode_step_ms_*``) against the weights and keys/values it reads at the rate these
threads stream memory (``decode_floor_ms_*``, ``stream_gb_per_s``); ``b16_at_floor_vs_b1``: batch 16
over batch 1 had every batch-16 step taken only its floor; ``b16_vs_b1_at_floors``: had both batches'.

With ``vllm`` (``--vllm``) the vLLM backend (:class:`lmlm.generate.vllm.VLLMLookupGenerator`) runs
the same model, saved as a checkpoint, on the same prompts with the same forced calls and prefix
tree, at batch 1 and 16 (``vllm_*``), its outputs compared with the engine's token for token.

The memory floor: a step that feeds one token per row reads every weight once (an embedding table
only at the rows it looks up, unless it is also the output layer) and every row's keys and values
for its whole context. No step takes less than those bytes over the rate at which the same threads
stream memory (:func:`stream_rate`, measured as a matrix-vector product over a buffer larger than the
caches). Batch 1 can beat its floor: its weights may stay in a large cache between steps, and it
feeds a call's forced tokens in one forward (:mod:`lmlm.generate.loop`). A batch reads its rows' keys
and values every step, so a long context puts a floor under the batched step that no kernel removes;
:func:`decode_floor` turns that into the fastest a batch could run beside a measured batch 1.

``--quick`` halves prompts and continuations and times one prompt at batch 1 (a GPU run in about
three minutes). Exercised by ``lmlm bench generate --preset paper``.

Examples:
    >>> weight, kv = weight_bytes_per_step(model), kv_bytes_per_token(model)  # doctest: +SKIP
    >>> floor = decode_floor(weight, kv, rows=16, context=767.5, rate=stream_rate(model.device))  # doctest: +SKIP
"""

from __future__ import annotations

import json
import shutil
import statistics
import time
from pathlib import Path
from typing import Callable, Mapping, Sequence

__all__ = ["PAPER_MODELS", "PAPER_DTYPES", "PAPER_SIZES", "LOOKUP_PERIOD", "PAPER_OPTIONS", "paper_inputs",
           "paper_prompts", "lookup_offsets", "run_paper_bench", "kv_bytes_per_token", "weight_bytes_per_step",
           "stream_rate", "decode_floor"]

PAPER_MODELS = ("gpt2-124m", "llama2-176m")
PAPER_DTYPES = ("float32", "bfloat16", "float16")
PAPER_SIZES = {  # prompt and continuation lengths, prompts timed at batch 1, rows of the batched run
    "full": dict(prompt_tokens=512, new_tokens=512, n_single=2, n_batch=16),
    "quick": dict(prompt_tokens=256, new_tokens=256, n_single=1, n_batch=16),
}
LOOKUP_PERIOD = 26  # one call forced every 26 tokens: about 10 per 256
PAPER_OPTIONS = dict(logit_bias=None, max_lookups=64, constrained=True, matching="key")  # see the docstring


def plain_generate(gen, prompts: Sequence[str], new_tokens: int, batch: int) -> list[list[int]]:
    """Plain Hugging Face ``generate`` with the lookup tokens suppressed, greedy, ``batch`` prompts at a
    time (left-padded); returns each prompt's ``new_tokens`` new ids."""
    import torch

    tok, model, out_ids = gen.tok, gen.model, []
    with torch.inference_mode():
        for k in range(0, len(prompts), batch):
            rows = [gen.prompt_ids(p) for p in prompts[k:k + batch]]
            width = max(map(len, rows))
            x = torch.tensor([[tok.eos_id] * (width - len(r)) + r for r in rows], device=model.device)
            mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], device=model.device)
            out = model.generate(input_ids=x, attention_mask=mask, max_new_tokens=new_tokens, do_sample=False,
                                 suppress_tokens=list(tok.call_ids), eos_token_id=[], pad_token_id=tok.eos_id)
            out_ids += out[:, width:].tolist()
    return out_ids


def device_name(device) -> str:
    import platform

    import torch

    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def paper_inputs(cache: Path, wiki: Path, log: Callable[[str], None] = print) -> tuple[Path, list[str]]:
    """The KB (infobox facts of the dump ``wiki``) and the articles' plain texts, built once in ``cache``."""
    from ..annotate.wikipedia import annotate_dump
    from ..corpus import iter_documents
    from ..kb.build import build

    wiki_dir, kb_dir = cache / "wiki", cache / "kb"
    stamp = json.dumps({"wiki": str(Path(wiki).resolve()), "size": Path(wiki).stat().st_size})
    if not ((cache / "inputs.json").exists() and (cache / "inputs.json").read_text() == stamp):
        log(f"reading {wiki} into {cache}")
        annotate_dump(wiki, wiki_dir, progress=False)
        if kb_dir.exists():
            import shutil
            shutil.rmtree(kb_dir)
        build(kb_dir, wiki_dir / "triples.jsonl", progress=False).close()
        (cache / "inputs.json").write_text(stamp)
    return kb_dir, [doc.text for doc in iter_documents(wiki_dir / "documents.jsonl")]


def paper_prompts(tok, texts: Sequence[str], n: int, prompt_tokens: int) -> list[str]:
    """``n`` prompts of ``prompt_tokens`` ids each (the document separator included): the openings of
    the longest ``texts``, cut where decoding and encoding again gives that many tokens."""
    out = []
    for text in sorted(texts, key=len, reverse=True):
        ids = tok.encode_text(text)
        for width in range(prompt_tokens - 1, max(prompt_tokens - 9, 0), -1):
            prompt = tok.hf.decode(ids[:width], skip_special_tokens=False)
            if len(tok.encode_text(prompt)) == prompt_tokens - 1:
                out.append(prompt)
                break
        if len(out) == n:
            return out
    raise ValueError(f"only {len(out)} of the texts give a prompt of {prompt_tokens} tokens; {n} needed")


def lookup_offsets(new_tokens: int, period: int = LOOKUP_PERIOD) -> list[int]:
    """Offsets into the continuation where a call is forced: one every ``period`` tokens from ``period // 2``."""
    return list(range(period // 2, new_tokens, period))


def run_paper_bench(tokenizers: Mapping[str, object], kb, texts: Sequence[str], *,
                    models: Sequence[str] = PAPER_MODELS, model_overrides: dict | None = None,
                    size: str = "full", sizes: dict | None = None, repeats: int = 1, threads: int = 1,
                    device: str = "cpu", dtype: str = "float32", cuda_graphs: bool | None = None, seed: int = 0,
                    vllm: dict | None = None, log: Callable[[str], None] = print) -> dict:
    """Measure every model of ``models`` (presets; the tokenizer named by each preset's ``tokenizer``
    field); returns ``{"models": {preset: report}, ...}`` ready for JSON (see the module docstring).

    ``model_overrides`` changes the presets' shapes (tests use tiny ones); ``sizes`` replaces
    ``PAPER_SIZES[size]``; ``dtype``: the models' weights and activations (one of ``PAPER_DTYPES``), the
    vLLM backend's too. ``cuda_graphs`` is passed to the generators (``None``: on a CUDA device).
    ``vllm``: options of ``vllm.LLM`` to run the vLLM backend beside the engine (``None``: not run).
    """
    import torch

    from ..models import ModelConfig, build_model

    torch.set_num_threads(threads)
    shape = dict(PAPER_SIZES[size], **(sizes or {}))
    rate = stream_rate(device)  # bytes per second these threads read: the floor under a decode step
    reports = {}
    for name in models:
        cfg = ModelConfig.from_name(name, **(model_overrides or {}))
        if cfg.tokenizer not in tokenizers:
            raise ValueError(f"model {name} needs the {cfg.tokenizer!r} tokenizer; given: {', '.join(tokenizers)}")
        tok = tokenizers[cfg.tokenizer]
        model = build_model(cfg, len(tok), tok, seed=seed).to(device, getattr(torch, dtype)).eval()
        prompts = paper_prompts(tok, texts, shape["n_batch"], shape["prompt_tokens"])
        log(f"{name}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters, vocabulary {len(tok):,}")
        reports[name] = _bench_model(model, tok, kb, prompts, shape, repeats=repeats, cuda_graphs=cuda_graphs,
                                     vllm=vllm, rate=rate, log=lambda msg, name=name: log(f"{name}: {msg}"))
        del model
    first = next(iter(reports.values()))
    return {"preset": "paper", "size": size, "models": reports, "device": first["device"], "dtype": dtype,
            "threads": threads, "repeats": repeats,
            **{k: shape[k] for k in ("prompt_tokens", "new_tokens", "n_single", "n_batch")},
            "lookup_period": LOOKUP_PERIOD}


def _bench_model(model, tok, kb, prompts: list[str], shape: dict, *, repeats: int, cuda_graphs: bool | None,
                 vllm: dict | None, rate: float, log: Callable[[str], None]) -> dict:
    import torch

    from ..generate import LookupGenerator
    from ..generate.packed import packing_available
    from ..generate.reencode import reencode_generate

    gen = LookupGenerator(model, tok, kb, cuda_graphs=cuda_graphs, **PAPER_OPTIONS)
    new, n_batch = shape["new_tokens"], shape["n_batch"]
    offsets = lookup_offsets(new)
    single, batch = prompts[:shape["n_single"]], prompts[:n_batch]
    on_gpu = model.device.type == "cuda"
    sync = torch.cuda.synchronize if on_gpu else (lambda: None)

    def engine(g: LookupGenerator) -> Callable:  # results, traces included
        return lambda ps, b, n=new: g.generate(ps, max_new_tokens=n, batch_size=b, ignore_eos=True,
                                               force_lookup_at=offsets)

    def reencode(ps, b, n=new):
        return [reencode_generate(gen, p, max_new_tokens=n, ignore_eos=True, force_lookup_at=offsets).token_ids
                for p in ps]

    def plain(ps, b, n=new):
        return plain_generate(gen, ps, n, b)

    runs = {"plain_b1": (plain, single, 1), "engine_b1": (engine(gen), single, 1),
            "reencode_b1": (reencode, single, 1), "engine_b16": (engine(gen), batch, n_batch)}
    eager = None
    if gen.static_decoding:  # CUDA graphs (or their static cache on a CPU): the eager engine beside them
        eager = LookupGenerator(model, tok, kb, cuda_graphs=False, **PAPER_OPTIONS)
        runs.update(engine_eager_b1=(engine(eager), single, 1), engine_eager_b16=(engine(eager), batch, n_batch))
    if on_gpu:
        runs["plain_b16"] = (plain, batch, n_batch)
    packs = not on_gpu and packing_available(next(model.parameters()).dtype)
    if packs:  # the engine without its weights laid out for oneDNN (lmlm.generate.packed), beside it
        unpacked = LookupGenerator(model, tok, kb, cuda_graphs=cuda_graphs, packed_weights=False, **PAPER_OPTIONS)
        runs.update(engine_unpacked_b1=(engine(unpacked), single, 1),
                    engine_unpacked_b16=(engine(unpacked), batch, n_batch))
    served = _vllm_backend(model, tok, kb, vllm) if vllm is not None else None
    if served is not None:
        def on_vllm(ps, b, n=new):  # one request at a time at batch 1, all rows in one call at 16
            groups = [ps[i:i + b] for i in range(0, len(ps), b)]
            return [r for g in groups for r in served.generate(g, max_new_tokens=n, ignore_eos=True,
                                                              force_lookup_at=offsets)]
        runs.update(vllm_b1=(on_vllm, single, 1), vllm_b16=(on_vllm, batch, n_batch))
    for fn, ps, b in runs.values():  # warm up every path once
        fn(ps[:min(b, 2)], min(b, 2), 8)
    if gen.static_decoding:  # the prefill runs' shorter static caches: recorded here, not in their timing
        for ps, b in ((single, 1), (batch, n_batch)):
            engine(gen)(ps[:b], b, 1)
    best = {k: 0.0 for k in runs}
    cpu_best = dict(best)  # tokens per second of this process's CPU time: steadier on a shared machine
    results: dict[str, list] = {}
    forwards: dict[str, int] = {}  # the model's forward calls in a method's run
    prefill = {"b1": float("inf"), "b16": float("inf")}  # the engine's runs cut to one new token
    stop_counting = _count_forwards(model, forwards, static=gen.static_decoding)
    try:
        for r in range(repeats):
            for key, (fn, ps, b) in runs.items():
                sync()
                forwards["now"] = 0
                t0, c0 = time.perf_counter(), time.process_time()
                results[key] = fn(ps, b)
                sync()
                elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
                forwards[key] = forwards["now"]
                n = sum(len(getattr(x, "token_ids", x)) for x in results[key])
                best[key], cpu_best[key] = max(best[key], n / elapsed), max(cpu_best[key], n / cpu)
                log(f"round {r + 1}/{repeats}: {key} {n / elapsed:.2f} tokens/s ({n / cpu:.2f} per CPU second)")
            for which, ps, b in (("b1", single, 1), ("b16", batch, n_batch)):
                sync()
                t0 = time.perf_counter()
                engine(gen)(ps, b, 1)
                sync()
                prefill[which] = min(prefill[which], time.perf_counter() - t0)
    finally:
        stop_counting()
    outputs = {key: [getattr(x, "token_ids", x) for x in out] for key, out in results.items()}
    traces = [x.trace for x in results["engine_b16"]]
    cut = ("unfinished", "unanswered")  # calls the token budget ended before their value
    finished = [t.found for ts in traces for t in ts if t.status not in cut]
    e1, k = outputs["engine_b1"], len(single)
    first = offsets[0] if offsets else new
    report = {_tps(key): round(v, 2) for key, v in best.items()}
    ratios = {"engine_vs_plain_b1": ("engine_b1", "plain_b1"), "engine_vs_reencode_b1": ("engine_b1", "reencode_b1"),
              "engine_b16_vs_b1": ("engine_b16", "engine_b1")}
    if packs:
        ratios.update(packed_vs_unpacked_b1=("engine_b1", "engine_unpacked_b1"),
                      packed_vs_unpacked_b16=("engine_b16", "engine_unpacked_b16"),
                      unpacked_b16_vs_b1=("engine_unpacked_b16", "engine_unpacked_b1"))
    if served is not None:
        ratios.update(engine_vs_vllm_b1=("engine_b1", "vllm_b1"), engine_vs_vllm_b16=("engine_b16", "vllm_b16"))
    report.update({k: round(best[a] / best[b], 3) for k, (a, b) in ratios.items()})
    if not on_gpu:  # the same ratios in CPU time (one thread: wall time on an idle machine)
        report.update({f"cpu_{_tps(key)}": round(v, 2) for key, v in cpu_best.items()})
        report.update({f"cpu_{k}": round(cpu_best[a] / cpu_best[b], 3) for k, (a, b) in ratios.items()})
    report.update({
        "mismatches_engine_vs_reencode": sum(a != b for a, b in zip(e1, outputs["reencode_b1"])),
        "mismatches_batch_vs_single": sum(a != b for a, b in zip(e1, outputs["engine_b16"][:k])),
        "mismatches_engine_vs_plain_before_first_call": sum(a[:first] != b[:first]
                                                            for a, b in zip(e1, outputs["plain_b1"])),
        **({"mismatches_packed_vs_unpacked": sum(a != b for a, b in zip(outputs["engine_b16"],
                                                                         outputs["engine_unpacked_b16"]))}
           if packs else {}),
        "lookups_per_256_tokens": round(256 * statistics.mean(map(len, traces)) / new, 2),
        "lookups_found": round(statistics.mean(finished), 3) if finished else 0.0,  # answered from the KB
        "sample_calls": [f"{t.query_entity} | {t.query_relation} -> {t.value}" for t in traces[0][:3]],
        "parameters": sum(p.numel() for p in model.parameters()), "vocab_size": len(tok),
        "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
        "device": device_name(model.device), "cuda_graphs": gen.static_decoding, "packed_weights": packs,
    })
    report.update(_floor_report(model, shape, best, forwards, prefill, rate))
    if served is not None:
        v_traces = [x.trace for x in results["vllm_b16"]]
        report.update({
            "mismatches_vllm_vs_engine_b1": sum(a != b for a, b in zip(outputs["vllm_b1"], e1)),
            "mismatches_vllm_vs_engine_b16": sum(a != b for a, b in zip(outputs["vllm_b16"], outputs["engine_b16"])),
            "vllm_lookups_per_256_tokens": round(256 * statistics.mean(map(len, v_traces)) / new, 2),
            "vllm_options": {k: str(v) for k, v in vllm.items()},
        })
        served.close()
        shutil.rmtree(served.model_dir, ignore_errors=True)
    if eager is not None:
        report["mismatches_graphs_vs_eager"] = sum(a != b for a, b in zip(outputs["engine_b16"],
                                                                          outputs["engine_eager_b16"]))
    return report


def _count_forwards(model, forwards: dict, static: bool) -> Callable[[], None]:
    """Count ``model``'s forwards in ``forwards["now"]``; returns what stops counting. With a static
    decoder (``static``) its prefills and steps are counted instead: a CUDA graph replay never calls the
    model's ``forward``."""
    def count(*args, **kwargs) -> None:
        forwards["now"] += 1

    if not static:
        return model.register_forward_pre_hook(count).remove
    from ..generate.graphs import StaticDecoder

    originals = {name: getattr(StaticDecoder, name) for name in ("prefill", "forward")}

    def counted(method):
        def run(self, *args, **kwargs):
            count()
            return method(self, *args, **kwargs)
        return run

    def restore() -> None:
        for name, method in originals.items():
            setattr(StaticDecoder, name, method)

    for name, method in originals.items():
        setattr(StaticDecoder, name, counted(method))
    return restore


def _floor_report(model, shape: dict, best: dict, forwards: dict, prefill: dict, rate: float) -> dict:
    """The engine's decode steps beside the floor of what they read (:func:`decode_floor`), and
    batch 16 over batch 1 had every batch-16 step taken only its floor (batch 1 as measured), and had
    both batches' steps (prefills as measured)."""
    new, n_single, n_batch = shape["new_tokens"], shape["n_single"], shape["n_batch"]
    context = shape["prompt_tokens"] + (new - 1) / 2  # the mean position a decode step attends over
    weight, kv = weight_bytes_per_step(model), kv_bytes_per_token(model)
    floors = {b: decode_floor(weight, kv, rows=rows, context=context, rate=rate)
              for b, rows in (("b1", 1), ("b16", n_batch))}
    steps = {"b1": forwards["engine_b1"] - n_single, "b16": forwards["engine_b16"] - 1}  # less each prompt's prefill
    spent = {"b1": n_single * new / best["engine_b1"], "b16": n_batch * new / best["engine_b16"]}
    report = {"stream_gb_per_s": round(rate / 1e9, 2),
              "weight_mb_per_step": round(weight / 1e6, 1), "kv_bytes_per_token": kv, "mean_context": context,
              "prefill_s_b1": round(prefill["b1"] / n_single, 3), "prefill_s_b16": round(prefill["b16"], 3),
              "forwards_per_token_b1": round(forwards["engine_b1"] / (n_single * new), 3),
              "forwards_per_token_b16": round(forwards["engine_b16"] / new, 3)}
    for b in ("b1", "b16"):
        report[f"decode_step_ms_{b}"] = round(1e3 * max(spent[b] - prefill[b], 0.0) / max(steps[b], 1), 3)
        report[f"decode_floor_ms_{b}"] = round(1e3 * floors[b], 3)
    at_floor = {b: rows * new / (prefill[b] + steps[b] * floors[b]) for b, rows in (("b1", n_single), ("b16", n_batch))}
    report["b16_at_floor_vs_b1"] = round(at_floor["b16"] / best["engine_b1"], 3)  # batch 1 as measured
    report["b16_vs_b1_at_floors"] = round(at_floor["b16"] / at_floor["b1"], 3)
    return report


def _vllm_backend(model, tok, kb, options: dict):
    """The vLLM backend over ``model`` saved as a checkpoint, with the engine's paper options."""
    import tempfile

    from ..checkpoint import save_checkpoint
    from ..generate.vllm import VLLMLookupGenerator

    folder = Path(tempfile.mkdtemp(prefix="lmlm-vllm-bench-"))
    save_checkpoint(folder, model, tok)
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    return VLLMLookupGenerator(folder, kb, tokenizer=tok, **PAPER_OPTIONS, **{"dtype": dtype, **options})


def _tps(key: str) -> str:
    """``engine_b16`` -> ``engine_tps_b16``."""
    name, batch = key.rsplit("_", 1)
    return f"{name}_tps_{batch}"


# -- the memory floor under a decode step (module docstring) -----------------------------------------

def kv_bytes_per_token(model) -> int:
    """Bytes of keys and values one row's cache holds per position: measured from a real forward's cache."""
    import torch

    from ..models import output_cache

    with torch.inference_mode():
        out = model(input_ids=torch.zeros(1, 1, dtype=torch.long, device=model.device), use_cache=True)
    cache = output_cache(out)
    if hasattr(cache, "layers"):
        tensors = [t for layer in cache.layers for t in (layer.keys, layer.values)]
    elif hasattr(cache, "key_cache"):
        tensors = [*cache.key_cache, *cache.value_cache]
    else:  # the legacy tuple of (keys, values) per layer
        tensors = [t for layer in cache for t in layer]
    return sum(t.numel() * t.element_size() for t in tensors)


def weight_bytes_per_step(model) -> int:
    """Bytes of parameters a one-token step reads: all but the embedding tables it only indexes
    (an input embedding tied to the output layer is read whole)."""
    import torch

    out = model.get_output_embeddings()
    read_whole = {id(out.weight)} if out is not None else set()
    indexed = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)} - read_whole
    return sum(p.numel() * p.element_size() for p in model.parameters() if id(p) not in indexed)


def stream_rate(device="cpu", mbytes: int = 512, repeats: int = 3) -> float:
    """Bytes per second the current threads read from memory: the best of ``repeats`` matrix-vector
    products over a ``mbytes`` float32 matrix (more than a CPU's last-level cache holds)."""
    import torch

    device = torch.device(device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    width = 1024
    matrix = torch.ones(mbytes * 2**20 // (4 * width), width, device=device)
    vector = torch.ones(width, device=device)
    best = float("inf")
    for _ in range(repeats + 1):  # the first warms up
        sync()
        t0 = time.perf_counter()
        torch.mv(matrix, vector)
        sync()
        best = min(best, time.perf_counter() - t0)
    return matrix.numel() * matrix.element_size() / best


def decode_floor(weight_bytes: int, kv_bytes: int, *, rows: int, context: float, rate: float) -> float:
    """Seconds a one-token step of ``rows`` rows at a mean ``context`` positions cannot go under: the
    weights once (``weight_bytes``, :func:`weight_bytes_per_step`) and every row's keys and values
    (``kv_bytes`` a position, :func:`kv_bytes_per_token`), at ``rate`` bytes per second."""
    if rows < 1 or context < 0 or rate <= 0:
        raise ValueError(f"rows >= 1, context >= 0 and rate > 0 needed; got {rows}, {context}, {rate}")
    return (weight_bytes + rows * context * kv_bytes) / rate
