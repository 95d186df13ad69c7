"""``lmlm data``: prepare token shards from a corpus."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

data_app = typer.Typer(no_args_is_help=True, help="Token shards: a corpus tokenized once for training at scale.")


@data_app.command("prepare")
def prepare(corpus: Path = typer.Argument(..., help="documents (.jsonl/.json/.parquet/.txt or a datasets folder)"),
            tokenizer: str = typer.Option(..., help="tokenizer folder/file/hub name, a .gguf model, or the "
                                          "tokenizer of a checkpoint folder"),
            out: Path = typer.Option(..., help="shards folder (rerun to resume an interrupted job)"),
            workers: Optional[int] = typer.Option(None, min=1, help="tokenizer processes (default: all cores)"),
            shard_tokens: int = typer.Option(1 << 26, min=1024, help="tokens per shard"),
            split: Optional[str] = typer.Option(None, help="only documents of this split"),
            skip_malformed: bool = typer.Option(False, "--skip-malformed", help="leave out documents with a malformed "
                                                "lookup call (counted as skipped_malformed); without it the first "
                                                "such document stops the job, named FILE:LINE"),
            progress: bool = typer.Option(True, help="show a progress bar")):
    """Tokenize documents (with their lookup calls and a role per token) into memory-mapped shards.

    A document with a malformed lookup call stops the job (named FILE:LINE, with the reason), since it
    would be trained as stray lookup tokens; --skip-malformed leaves such documents out instead.
    """
    from ..cli_errors import user_errors
    from ..train.inputs import tokenizer_from_spec
    from .shards import prepare_shards

    from ..corpus import CorpusError, iter_documents

    with user_errors():
        if corpus.is_file() and corpus.suffix.lower() not in (".parquet",):
            if next(iter(iter_documents(corpus)), None) is None:  # a bad corpus is named before any other work
                raise CorpusError(f"{corpus}: no documents")
        elif not corpus.exists():
            raise CorpusError(f"{corpus}: no such file or folder")
        tok = tokenizer_from_spec(tokenizer)
        try:
            manifest = prepare_shards(corpus, tok, out, workers=workers, shard_tokens=shard_tokens, split=split,
                                      progress=progress, skip_malformed=skip_malformed)
        except KeyboardInterrupt:
            import sys

            print(f"interrupted: the shards written so far are kept in {out}; run the same command again to go on",
                  file=sys.stderr)
            raise SystemExit(130) from None  # its own line said it all: not Typer's exit code 130 too
    if manifest.get("skipped_malformed"):
        import sys

        print(f"warning: left out {manifest['skipped_malformed']} documents of {corpus} with malformed lookup "
              "calls", file=sys.stderr)
    keys = ("documents", "skipped_malformed", "tokens", "lookup_calls", "role_counts", "dtype", "vocab_size",
            "tokenizer_hash", "seconds")
    print(json.dumps({**{k: manifest.get(k) for k in keys}, "shards": len(manifest["shards"]), "out": str(out)}))


@data_app.command("windows")
def windows(corpus: Path = typer.Argument(..., help="annotated documents (.jsonl/.json/.parquet/.txt or a datasets folder)"),
            out: Path = typer.Option(..., help="the windows, one document each (.jsonl)"),
            before: int = typer.Option(0, min=0, help="sentences before the one that holds the call"),
            after_words: int = typer.Option(8, min=0, help="words after the call at most (fewer where the sentence ends)"),
            head: bool = typer.Option(True, help="the entity's name first, on a line of its own"),
            swap: float = typer.Option(0.0, min=0.0, max=1.0, help="share of windows whose entity gets a made-up "
                                       "name, in the text and the call alike (the value is masked: this teaches "
                                       "the model to copy the name the text gives)"),
            copies: int = typer.Option(1, min=1, help="each window this many times, each copy renamed anew "
                                       "(with --swap)"),
            seed: int = typer.Option(0, min=0),
            split: Optional[str] = typer.Option(None, help="only documents of this split")):
    """Cut a short training document around every lookup call: its sentence, the call, a few words after.

    For continued training of a pretrained model: it reads English already and has to learn where
    to call, what to write in the call, and to copy the answer.
    """
    from ..cli_errors import user_errors
    from ..corpus import CorpusError, iter_documents, write_documents
    from .windows import windows_of

    with user_errors():
        if not corpus.exists():
            raise CorpusError(f"{corpus}: no such file or folder")
        docs = list(iter_documents(corpus, split=split))
        if not any(d.num_calls for d in docs):
            raise CorpusError(f"{corpus}: no lookup calls in its {len(docs)} documents: nothing to cut windows around")
        if out.suffix.lower() != ".jsonl":
            raise CorpusError(f"--out {out}: give a .jsonl file")
        n = write_documents(out, windows_of(docs, before=before, after_words=after_words, head=head, swap=swap,
                                            seed=seed, copies=copies))
    renamed = sum(1 for line in out.read_text(encoding="utf-8").splitlines() if '"renamed"' in line)
    print(json.dumps({"documents": len(docs), "windows": n, "renamed": renamed, "out": str(out)}))


@data_app.command("facts")
def facts(source: str = typer.Argument(..., help="a fact source (countryinfo) or a triples file (.jsonl/.csv/.tsv, "
                                       "lmlm kb build's formats)"),
          out: Path = typer.Option(..., help="one training document per fact of the training side (.jsonl)"),
          hold_out: float = typer.Option(0.0, min=0.0, max=1.0, help="share of the entities held out whole: their "
                                         "facts go to --held-out-triples and --cloze, never to --out"),
          unnamed_in: Optional[Path] = typer.Option(None, help="documents whose text must name no held-out entity "
                                                    "(an entity they name stays on the training side)"),
          held_out_triples: Optional[Path] = typer.Option(None, help="the held-out facts as triples (.jsonl), for "
                                                          "lmlm kb build"),
          cloze: Optional[Path] = typer.Option(None, help="the held-out facts as LAMA T-REx cloze prompts (.jsonl), "
                                               "for lmlm eval trex"),
          head: bool = typer.Option(True, help="the entity's name first, on a line of its own"),
          seed: int = typer.Option(0, min=0)):
    """Write real facts as short documents with their lookup calls, split by entity.

    Each fact becomes one sentence in one of its relation's phrasings ("The capital of Kenya is
    [Kenya, Capital -> Nairobi] Nairobi."). The values are masked in the LMLM loss, so these
    documents teach where to call and what to write in the call, for many more entities than a
    corpus names, and no fact. With --hold-out, a seeded share of the entities (never one that
    --unnamed-in's text names) is kept apart for evaluation on entities no training text names.
    """
    from ..cli_errors import user_errors
    from ..corpus import CorpusError, iter_documents, write_documents
    from .facts import cloze_records, fact_documents, read_facts, split_by_entity, write_jsonl

    with user_errors():
        for option, path in (("--out", out), ("--held-out-triples", held_out_triples), ("--cloze", cloze)):
            if path is not None and path.suffix.lower() != ".jsonl":
                raise CorpusError(f"{option} {path}: give a .jsonl file")
        if (held_out_triples or cloze) and not hold_out:
            raise CorpusError("--held-out-triples and --cloze write the held-out facts: give --hold-out too")
        named = ""
        if unnamed_in is not None:
            if not unnamed_in.exists():
                raise CorpusError(f"--unnamed-in {unnamed_in}: no such file or folder")
            named = "\n".join(d.text for d in iter_documents(unnamed_in))
        rows = read_facts(source)
        if not rows:
            raise CorpusError(f"{source}: no facts")
        train, held = split_by_entity(rows, hold_out, seed, named)
        n = write_documents(out, fact_documents(train, seed=seed, head=head, prefix=Path(str(source)).stem))
        if held_out_triples is not None:
            write_jsonl(held_out_triples, held)
        if cloze is not None:
            write_jsonl(cloze, cloze_records(held))
    entities = lambda fs: len({e for e, _, _ in fs})  # noqa: E731
    print(json.dumps({"facts": len(rows), "documents": n, "train_entities": entities(train),
                      "held_out_facts": len(held), "held_out_entities": entities(held), "out": str(out)}))
