"""``lmlm eval``: run an evaluation protocol on a checkpoint and write its results as JSON.

Each command loads a checkpoint (:func:`lmlm.checkpoint.load_checkpoint`) and, for an LMLM, its
knowledge base, reads the benchmark file, runs the protocol, writes ``{"protocol", "metrics",
"config", "records"}`` to ``--out`` and prints the metrics as one JSON line.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import typer

eval_app = typer.Typer(no_args_is_help=True, help="Evaluate a checkpoint: T-REx, PopQA, NLU, FactScore.")

MODEL = typer.Option(..., "--model", help="checkpoint folder (written by lmlm train / quickstart)")
KB = typer.Option(None, "--kb", help="KB folder (default: the checkpoint's KB; ignored for Standard models)")
DATA = typer.Option(..., "--data", help="the benchmark file, in its official format")
OUT = typer.Option(None, "--out", help="results JSON (default: eval-<protocol>.json)")
LIMIT = typer.Option(None, "--limit", help="evaluate the first N items only")
BATCH = typer.Option(16, "--batch-size", help="rows per batch")
NO_DB = typer.Option(False, "--no-db", help="ablation: no database, lookup tokens banned")


def _fail(msg: str) -> None:
    typer.echo(f"error: {msg}", err=True)
    raise typer.Exit(2)


def _read(reader, *args, **kwargs):
    """Run a benchmark reader; a missing or malformed file is a usage error."""
    try:
        return reader(*args, **kwargs)
    except (ValueError, OSError) as e:
        _fail(f"cannot read the benchmark file: {e}")


def _load(model: Path, kb: Path | None, no_db: bool = False, need_generator: bool = True, **options):
    """``(model, tokenizer, meta, generator, uses_db)`` for a checkpoint; Standard checkpoints get no KB."""
    from ..checkpoint import is_checkpoint, load_checkpoint

    if not is_checkpoint(model):
        _fail(f"{model} is not an lmlm checkpoint (no lmlm.json and config.json)")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # the results JSON is the last line of the output
    m, tok, meta = load_checkpoint(model)
    uses_db = not no_db and meta.get("mode", "lmlm") != "standard"
    base = None
    if uses_db and need_generator:
        from ..kb import KBError, KnowledgeBase

        kb_path = kb or (Path(meta["kb"]) if meta.get("kb") else None)
        if kb_path is None:
            _fail("no knowledge base: pass --kb (or --no-db)")
        try:
            base = KnowledgeBase.open(kb_path)
        except (KBError, OSError) as e:
            _fail(str(e))
    gen = None
    if need_generator:
        from ..generate import LookupGenerator

        gen = LookupGenerator(m, tok, base, use_db=uses_db, **options)
    return m, tok, meta, gen, uses_db


def _finish(protocol, metrics: dict, records: list, out: Path | None, config: dict) -> None:
    from .base import write_results

    path = write_results(out or Path(f"eval-{protocol.name}.json"), protocol, metrics, records, config)
    clean = {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in metrics.items()}
    typer.echo(json.dumps({"metrics": clean, "out": str(path)}))


@eval_app.command()
def trex(model: Path = MODEL, kb: Path | None = KB, data: Path = DATA, out: Path | None = OUT,
         limit: int | None = LIMIT, batch_size: int = BATCH, no_db: bool = NO_DB,
         max_new_tokens: int = typer.Option(16, help="generated tokens per fact"),
         all_positions: bool = typer.Option(False, help="keep facts whose [MASK] is not the last word")):
    """T-REx (LAMA) cloze: exact match in the first 5 content words, and precision@1."""
    from .trex import TREX, read_trex, trex_eval

    items = _read(read_trex, data, left_to_right=not all_positions, limit=limit)
    if not items:
        _fail(f"no usable T-REx facts in {data}")
    _, _, _, gen, uses_db = _load(model, kb, no_db, on_miss="skip")  # a missed lookup goes on as text
    records: list = []
    metrics = trex_eval(gen, items, force_lookup=uses_db, max_new_tokens=max_new_tokens, batch_size=batch_size,
                        records=records)
    _finish(TREX, metrics, records, out, {"model": str(model), "data": str(data), "force_lookup": uses_db,
                                          "max_new_tokens": max_new_tokens})


@eval_app.command()
def popqa(model: Path = MODEL, kb: Path | None = KB, data: Path = DATA, out: Path | None = OUT,
          limit: int | None = LIMIT, batch_size: int = BATCH, no_db: bool = NO_DB,
          max_new_tokens: int = typer.Option(32, help="generated tokens per question"),
          max_popularity: float | None = typer.Option(None, help="keep subjects below this popularity "
                                                         "(100: the paper's long-tail subset)"),
          force_lookup: bool = typer.Option(False, help="open a lookup right after the prompt")):
    """PopQA (or FanOutQA's single-hop questions): any gold answer in the output."""
    from .popqa import POPQA, popqa_eval, read_qa

    items = _read(read_qa, data, max_popularity=max_popularity, limit=limit)
    if not items:
        _fail(f"no questions in {data}")
    _, _, _, gen, uses_db = _load(model, kb, no_db)
    records: list = []
    metrics = popqa_eval(gen, items, force_lookup=force_lookup and uses_db, max_new_tokens=max_new_tokens,
                         batch_size=batch_size, records=records)
    _finish(POPQA, metrics, records, out, {"model": str(model), "data": str(data), "max_new_tokens": max_new_tokens,
                                           "max_popularity": max_popularity})


@eval_app.command()
def nlu(model: Path = MODEL, data: Path = DATA, out: Path | None = OUT, limit: int | None = LIMIT,
        batch_size: int = BATCH, kb: Path | None = typer.Option(None, "--kb", help="unused (scoring needs no KB)"),
        template: str = typer.Option("Q: {input}\nA:", help="context template ({input}: the example's input)")):
    """Multiple choice (BIG-bench JSON, e.g. Social IQa): acc and acc_norm, lookup tokens banned."""
    from .nlu import NLU, nlu_eval, read_bigbench_mc

    items = _read(read_bigbench_mc, data, template=template, limit=limit)
    m, tok, _, _, _ = _load(model, None, no_db=True, need_generator=False)
    records: list = []
    metrics = nlu_eval(m, tok, items, batch_size=batch_size, records=records)
    _finish(NLU, metrics, records, out, {"model": str(model), "data": str(data), "template": template})


@eval_app.command()
def factscore(model: Path = MODEL, kb: Path | None = KB, data: Path = DATA, out: Path | None = OUT,
              limit: int | None = LIMIT, batch_size: int = BATCH, no_db: bool = NO_DB,
              world: Path | None = typer.Option(None, help="true facts: a KB folder (default: --kb)"),
              claims: str = typer.Option("lookups", help="'lookups' (the model's lookups about the topic) or "
                                         "'values' (world values named in the text; also for Standard models)"),
              max_new_tokens: int = typer.Option(256), repetition_penalty: float = typer.Option(1.2),
              gamma: int = typer.Option(10, help="FActScore's length penalty (0: none)")):
    """Biography precision against known facts, with FActScore's length penalty."""
    from ..kb import KBError, KnowledgeBase
    from .factscore import FACTSCORE, factscore_eval, read_topics, world_from_kb

    topics = _read(read_topics, data)[:limit]
    _, _, meta, gen, _ = _load(model, kb, no_db)
    truth = world or kb or (Path(meta["kb"]) if meta.get("kb") else None)
    if truth is None:
        _fail("no world to check claims against: pass --world or --kb")
    try:
        facts = world_from_kb(KnowledgeBase.open(truth))
    except (KBError, OSError) as e:
        _fail(str(e))
    records: list = []
    try:
        metrics = factscore_eval(gen, topics, facts, claims=claims, gamma=gamma, max_new_tokens=max_new_tokens,
                                 repetition_penalty=repetition_penalty, batch_size=batch_size, records=records)
    except ValueError as e:
        _fail(str(e))
    _finish(FACTSCORE, metrics, records, out, {"model": str(model), "data": str(data), "world": str(truth),
                                               "claims": claims, "gamma": gamma})
