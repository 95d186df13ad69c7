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
            progress: bool = typer.Option(True, help="show a progress bar")):
    """Tokenize documents (with their lookup calls and a role per token) into memory-mapped shards."""
    from ..cli_errors import user_errors
    from ..train.inputs import _tokenizer_from_spec
    from .shards import prepare_shards

    from ..corpus import CorpusError, iter_documents

    with user_errors():
        if corpus.is_file() and corpus.suffix.lower() not in (".parquet",):
            if next(iter(iter_documents(corpus)), None) is None:  # a bad corpus is named before any other work
                raise CorpusError(f"{corpus}: no documents")
        elif not corpus.exists():
            raise CorpusError(f"{corpus}: no such file or folder")
        tok = _tokenizer_from_spec(tokenizer)
        manifest = prepare_shards(corpus, tok, out, workers=workers, shard_tokens=shard_tokens, split=split,
                                  progress=progress)
    keys = ("documents", "tokens", "lookup_calls", "role_counts", "dtype", "vocab_size", "tokenizer_hash", "seconds")
    print(json.dumps({**{k: manifest.get(k) for k in keys}, "shards": len(manifest["shards"]), "out": str(out)}))
