"""``lmlm generate``: lookup-interleaved generation from a checkpoint and its KB (:class:`lmlm.generate.LookupGenerator`)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console

from ..cli_errors import fail as _fail

console = Console(soft_wrap=True)  # piped output keeps one line per line (no wrap at 80)
err = Console(stderr=True, soft_wrap=True)


# -- training and generation -------------------------------------------------------------------------

def generate_command(prompt: List[str] = typer.Argument(..., help="one or more prompts"),
             model: Path = typer.Option(..., help="checkpoint: ours, or a Hugging Face folder (the authors': "
                                        "add --tokens released)"),
             kb: Optional[Path] = typer.Option(None, help="KB folder, or the authors' database JSON "
                                               "(default: the checkpoint's KB; a Standard checkpoint needs none)"),
             tokens: Optional[str] = typer.Option(None, help="lookup tokens: 'paper' or 'released' "
                                                  "(default: the checkpoint's)"),
             max_new_tokens: int = typer.Option(64, min=1),
             no_db: bool = typer.Option(False, "--no-db", help="ablation: no database, lookup tokens banned "
                                                                "(the server's use_db: false)"),
             force_lookup: bool = typer.Option(False, help="open a lookup at the end of the prompt"),
             constrained: bool = typer.Option(False, help="write only queries the KB holds (prefix tree of its keys)"),
             matching: str = typer.Option("entity", help="KB lookup: 'entity' (entity first, then relation) or "
                                                         "'key' (the paper's single-key cosine)"),
             fallback: str = typer.Option("unknown", help="value of a lookup without a match: 'nearest' (best key "
                                          "below the threshold; never for a deleted entity), 'skip' (none; the "
                                          "model goes on) or any text"),
             max_lookups: int = typer.Option(16, min=0, help="lookups per continuation"),
             logit_bias: str = typer.Option("5,2,2,2", help="added to the start, sep, retrieve and end scores"),
             copy_bias: float = typer.Option(5.0, min=0.0, help="added to the first token of an answered value right "
                                             "after its call; a text that begins the value then finishes it (0: the "
                                             "model's own choice, as in the paper's decoding)"),
             name_bias: float = typer.Option(10.0, min=0.0, help="added, inside a call's entity, to the next token "
                                             "of each KB name the text before it gives, so a query stays on the "
                                             "text's names (0: the model's own choice, as in the paper's decoding)"),
             sample: bool = typer.Option(False, help="sample instead of greedy decoding (the server's do_sample)"),
             temperature: float = typer.Option(1.0), top_p: float = typer.Option(1.0), top_k: int = typer.Option(0),
             repetition_penalty: float = typer.Option(1.0), num_beams: int = typer.Option(1, min=1, help="beam search"),
             stop: List[str] = typer.Option(None, help="stop at this text (repeatable)"),
             seed: Optional[int] = typer.Option(None),
             stream: bool = typer.Option(False, help="print the continuation as it is generated"),
             as_json: bool = typer.Option(False, "--json", help="print results with traces as JSON"),
             device: Optional[str] = typer.Option(None, help="where the engine runs: cpu, cuda, cuda:1, ... "
                                                  "(default: cuda when available)"),
             backend: str = typer.Option("hf", help="'hf': the engine (transformers, CPU or GPU); 'vllm': vLLM on a "
                                         "GPU (pip install 'lmlm\\[vllm]'; no --stream, --num-beams, --stop or "
                                         "--device)"),
             vllm_option: List[str] = typer.Option(None, help="with --backend vllm: KEY=VALUE passed to vllm.LLM, "
                                                   "VALUE read as JSON where it parses (e.g. "
                                                   "gpu_memory_utilization=0.5)")):
    """Generate with lookups; the looked-up facts are highlighted."""
    from ..generate import LookupGenerator
    from rich.markup import escape

    from ..checkpoint import kb_of
    from ..generate.loading import load_model, open_kb
    from ..cli_errors import check_device
    from ..device import default_device
    from ..kb import KBError
    from ..lookup import Lookup

    llm = _vllm_options(backend, vllm_option or [], stream=stream, num_beams=num_beams, stop=bool(stop),
                        device=device)
    check_device(device)
    if not all(prompt):
        _fail(f"prompt {prompt.index('') + 1} is empty: give the text to continue")
    if force_lookup and max_lookups == 0:
        _fail("--force-lookup opens a call: it needs --max-lookups >= 1")
    if stop and not all(stop):
        _fail("--stop takes a non-empty text (an empty one would stop at the first token)")
    if stream and num_beams > 1:
        _fail("--stream prints tokens as they come, beam search picks its beam at the end: not with --num-beams")
    try:
        bias = tuple(float(b) for b in logit_bias.split(","))
    except ValueError:
        _fail(f"--logit-bias takes four numbers (start, sep, retrieve, end), got {logit_bias!r}")
    try:  # the engine on the device asked for (default: cuda when available); vLLM places its own weights
        m, tok, meta = load_model(model, tokens=tokens, weights=llm is None,
                                  device=default_device(device) if llm is None else None)
        kb_path = kb or kb_of(meta, model)
        if kb is None and meta.get("mode") == "standard":  # a Standard model makes no lookups: no KB to open
            no_db = True
        if not no_db and kb_path is None:
            _fail("no knowledge base: pass --kb or --no-db")
        base = None if no_db else open_kb(kb_path)
        policy = fallback if fallback in ("nearest", "skip") else "text"
        lookups = dict(use_db=not no_db, constrained=constrained, logit_bias=bias, max_lookups=max_lookups,
                       on_miss=policy, matching=matching, fallback="unknown" if policy != "text" else fallback)
        if llm is None:
            gen = LookupGenerator(m, tok, base, copy_bias=copy_bias, name_bias=name_bias, **lookups)
        else:
            from .vllm import VLLMLookupGenerator
            gen = VLLMLookupGenerator(model, base, tokenizer=tok, copy_bias=copy_bias, name_bias=name_bias,
                                      **lookups, **llm)
    except (KBError, ValueError, OSError) as e:
        _fail(str(e))
    options = dict(max_new_tokens=max_new_tokens, force_lookup=force_lookup, top_p=top_p, top_k=top_k,
                   repetition_penalty=repetition_penalty, seed=seed)
    if llm is None:
        options.update(do_sample=sample, temperature=temperature, num_beams=num_beams, stop_strings=stop or None)
    else:  # vLLM samples at temperature > 0 and decodes greedily at 0
        options.update(temperature=temperature if sample else 0.0)

    def show_lookup(entity: str, relation: str, value: str) -> None:
        console.print(f"[reverse cyan]⟦{escape(entity)} · {escape(relation)} → {escape(value)}⟧[/]", end="")

    def show_trace(r) -> None:
        for t in r.trace:
            where = f"triple {t.triple_id}, KB v{t.kb_version}, sources {list(t.sources)[:3]}" if t.found \
                else f"no match: {t.miss_reason}: {t.miss_detail}" if t.miss_reason else "no match"
            score = f"{t.score:.2f}" if t.score is not None else "-"
            note = f"; [red]{escape(t.problem)}[/red]" if t.problem else ""
            query = escape(repr((t.query_entity, t.query_relation)))
            info = escape(f"[{t.status}, score {score}; {where}]")
            console.print(f"  [dim]lookup {query} -> {escape(repr(t.value))} {info}[/]{note}", highlight=False)

    try:
        if stream and not as_json:  # the hf backend only (checked above)
            for p in prompt:
                events = gen.stream(p, **options)
                first = next(events)  # options that do not go together fail here, before the prompt is printed
                console.print(f"[bold]{escape(p)}[/]", end="")
                for event in itertools.chain([first], events):
                    if event.lookup is not None:
                        show_lookup(event.lookup.query_entity, event.lookup.query_relation, event.lookup.value)
                    elif event.result is not None:
                        console.print()
                        show_trace(event.result)
                    else:
                        console.print(event.text, end="", markup=False, highlight=False)
            return
        results = gen.generate(prompt, **options)
    except ValueError as e:  # options that do not go together
        _fail(str(e))
    finally:
        if llm is not None:  # vLLM's engine process and its memory, before the results are printed
            gen.close()
    if as_json:
        print(json.dumps([r.to_dict() for r in results], indent=2, default=str))
        return
    for r in results:
        console.print(f"[bold]{escape(r.prompt)}[/]", end="")
        for seg in r.segments:
            if isinstance(seg, Lookup):
                show_lookup(seg.entity, seg.relation, seg.value)
            else:
                console.print(seg.text, end="", markup=False, highlight=False)
        console.print()
        show_trace(r)


def _vllm_options(backend: str, specs: list[str], *, stream: bool, num_beams: int, stop: bool,
                  device: str | None = None) -> dict | None:
    """``--backend`` and ``--vllm-option`` as ``vllm.LLM``'s keyword arguments (``None``: the engine)."""
    if backend not in ("hf", "vllm"):
        _fail(f"--backend must be 'hf' or 'vllm', got {backend!r}")
    if backend == "hf":
        if specs:
            _fail("--vllm-option needs --backend vllm")
        return None
    unsupported = [flag for flag, on in (("--stream", stream), ("--num-beams", num_beams > 1),
                                         ("--stop", stop),
                                         ("--device", device is not None)) if on]
    if unsupported:
        _fail(f"{', '.join(unsupported)} not with --backend vllm")
    from .vllm import llm_options, vllm_installed

    if not vllm_installed():
        _fail("--backend vllm needs vllm: pip install 'lmlm[vllm]'")
    try:
        return llm_options(specs)
    except ValueError as e:
        _fail(f"--vllm-option: {e}")
