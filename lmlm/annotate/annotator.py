"""The distilled annotator: a causal LM that inserts lookup calls into text it copies unchanged.

The model is trained on annotated documents in the token form (``... born in <|db_start|> Ada
Lovelace <|sep|> Birth City <|db_retrieve|> London <|db_end|> London``) with the loss on every
token. Decoding is *insert-only*: the input's own tokens are forced one by one, and at each token
boundary the model may only choose between copying the next token and opening a call
(``<|db_start|>``). Inside a call it writes the entity (by default copied from a span of the text
to its left, so it cannot name what it has not read), the relation (by default one of the labels
seen in training, through a prefix tree) and the value, which is forced to be a copy of the tokens
that follow in the text; the model only decides where the value ends. The text therefore comes out
unchanged by construction, and :meth:`Annotator.annotate` checks that it did.

Two prompt styles: ``none`` (the document alone, for small models trained from scratch) and
``chat`` (a pretrained instruction model sees our instructions and the passage in its chat
template, then writes the annotated passage; LoRA-tuned by :mod:`lmlm.annotate.distill`).

Exercised by ``lmlm annotate distill`` and ``lmlm annotate run``.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

import torch

from ..generate.trie import TokenTrie
from ..jsonio import write_json
from ..lookup import Segment, render, strip
from ..tokens import IGNORE_INDEX, LookupTokenizer
from .lm import cpu_threads
from .passages import cover_passages
from .validate import Validated, validate

__all__ = ["AnnotatorOptions", "Annotator", "fingerprint", "ANNOTATOR_FILE", "ANNOTATOR_INSTRUCTIONS", "PASSAGE_CHARS"]

PASSAGE_CHARS = 1200  # about 300 tokens: what the annotator sees at once (its training documents are bios)

ANNOTATOR_FILE = "annotator.json"
ANNOTATOR_INSTRUCTIONS = (
    "Copy the passage unchanged and insert a lookup call right before each entity fact it states, as "
    "<|db_start|> Entity <|sep|> Relation <|db_retrieve|> Value <|db_end|>. Use full entity names, short "
    "reusable relation labels and concise values; one fact per call; a call only once its entity and "
    "relation have appeared.")
_TEXT, _ENTITY, _RELATION, _VALUE = range(4)
CALL_ROOM = 192  # tokens a passage's calls may take in all (about 15 calls of usual size): a call opens only
                 # where the longest call still fits, so each row's length is bounded before decoding


@dataclass
class AnnotatorOptions:
    """How an annotator reads and writes.

    Args:
        prompt: ``"none"`` (document separator, then the document) or ``"chat"`` (chat template with
            instructions and the passage).
        entity: ``"copy"`` (a span of the text left of the call) or ``"free"``.
        relations: the relation labels it may write (``None``: any).
        max_field_tokens: longest entity, relation or value.
        max_calls_per_position: calls in a row before the next word.
        call_bias: added to the score of opening a call (negative: fewer calls).
        call_threshold: open a call only where the model gives ``<|db_start|>`` at least this
            probability (``None``: wherever it scores above the next text token). A small model
            that predicts ordinary words poorly would otherwise open calls before most rare words.
        base: the pretrained model a LoRA adapter applies to (``None``: the folder holds the full model).
    """

    prompt: str = "none"
    entity: str = "copy"
    relations: list[str] | None = None
    max_field_tokens: int = 24
    max_calls_per_position: int = 2
    call_bias: float = 0.0
    call_threshold: float | None = None
    base: str | None = None

    def __post_init__(self) -> None:
        if self.prompt not in ("none", "chat"):
            raise ValueError(f"prompt must be 'none' or 'chat', got {self.prompt!r}")
        if self.entity not in ("copy", "free"):
            raise ValueError(f"entity must be 'copy' or 'free', got {self.entity!r}")


class Annotator:
    """A trained annotator: ``annotate(texts)`` returns validated annotations of ``texts``.

    Args:
        model: a Hugging Face causal LM (or a PEFT model around one).
        tokenizer: the :class:`LookupTokenizer` it was trained with.
        options: :class:`AnnotatorOptions`.
    """

    def __init__(self, model, tokenizer: LookupTokenizer, options: AnnotatorOptions | None = None):
        self.model, self.tok = model.eval(), tokenizer
        self.options = options or AnnotatorOptions()
        self.fingerprint: str | None = None  # of the folder it was saved to or loaded from (see :func:`fingerprint`)
        self.generated_tokens = 0  # answer tokens written so far (forced text tokens included)
        self.threads: int | None = None  # torch CPU threads while decoding (see lm.cpu_threads)
        # decode over a static KV cache, each one-token step replayed from a CUDA graph
        # (lmlm.generate.graphs); None: where the model is on a CUDA device
        self.graphs: bool | None = None
        self._relations = TokenTrie(tokenizer.encode_field(r) for r in (self.options.relations or []))
        specials = set(tokenizer.call_ids) | {tokenizer.doc_id, tokenizer.eos_id} | set(tokenizer.hf.all_special_ids)
        vocab = max(len(tokenizer), model.get_output_embeddings().weight.shape[0])
        self._banned = torch.zeros(vocab, dtype=torch.bool)
        self._banned[list(specials)] = True

    # -- training data ----------------------------------------------------------------------------
    def prompt_ids(self, text: str) -> list[int]:
        if self.options.prompt == "none":
            return [self.tok.doc_id]
        messages = [{"role": "system", "content": ANNOTATOR_INSTRUCTIONS}, {"role": "user", "content": text}]
        return list(self.tok.hf.apply_chat_template(messages, tokenize=True, add_generation_prompt=True,
                                                    return_dict=False))

    def training_example(self, segments: Sequence[Segment]) -> tuple[list[int], list[int]]:
        """(ids, labels) for one annotated document: the prompt is not trained, the answer is, whole."""
        prompt = self.prompt_ids(strip(segments))
        answer = self.tok.encode(list(segments), add_doc_separator=False).input_ids
        if self.options.prompt == "none":  # packed documents: the separator marks the previous one's end
            return prompt + answer, prompt + answer
        answer = answer + [self.tok.eos_id]
        return prompt + answer, [IGNORE_INDEX] * len(prompt) + answer

    # -- annotation -------------------------------------------------------------------------------
    def annotate(self, texts: Sequence[str], batch_size: int = 16, progress: bool = False,
                 max_chars: int = PASSAGE_CHARS) -> list[Validated]:
        """Annotate ``texts``; each result is validated against its input (``text_changed`` is False
        unless the tokenizer cannot reproduce the text). A text longer than ``max_chars`` is
        annotated passage by passage (:func:`lmlm.annotate.passages.cover_passages`), so a document
        of any size is worked through at the speed of its passages, with progress counted in passages."""
        owners, pieces = [], []
        for i, t in enumerate(texts):
            for p in cover_passages(t, max_chars):
                owners.append(i)
                pieces.append(p)
        joined = [""] * len(texts)
        for i, a in zip(owners, self.generate(pieces, batch_size, progress)):
            joined[i] += a
        return [validate(t, a) for t, a in zip(texts, joined)]

    def generate(self, texts: Sequence[str], batch_size: int = 16, progress: bool = False) -> list[str]:
        """Raw annotated texts (``[dblookup(...)]`` form), decoded from the generated tokens."""
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        out: list[str | None] = [None] * len(texts)
        bar = _bar(progress, len(texts))
        with cpu_threads(self.model, self.threads):
            for k in range(0, len(order), batch_size):
                chunk = order[k:k + batch_size]
                for i, ids in zip(chunk, self._decode([texts[i] for i in chunk])):
                    out[i] = render(self._segments(ids))
                if bar is not None:
                    bar.update(len(chunk))
        if bar is not None:
            bar.close()
        return out  # type: ignore[return-value]

    def _segments(self, ids: list[int]) -> list[Segment]:
        lead = [self.tok.doc_id] if self.options.prompt == "none" else []
        return self.tok.decode_segments(lead + ids)

    def _decode(self, texts: list[str]) -> list[list[int]]:
        """Insert-only decoding of a batch through the package's KV-cached loop
        (:func:`lmlm.generate.loop.decode`), over a static cache with CUDA graphs on a GPU (every
        row's length is bounded: :data:`CALL_ROOM`); returns each row's answer ids."""
        from transformers import LogitsProcessorList

        from ..generate.loop import decode

        device = next(self.model.parameters()).device
        rows = [_Row(self, *_text_tokens(self.tok, t)) for t in texts]
        prompts = [self.prompt_ids(t) for t in texts]
        width = max(map(len, prompts))
        pad = self.tok.eos_id
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
        graphs = device.type == "cuda" if self.graphs is None else self.graphs
        decode(self.model, ids, mask, LogitsProcessorList([_RowChoices(rows)]), max(r.room for r in rows), [pad],
               pad, graphs=graphs)
        if graphs:
            from ..generate.graphs import release

            release(self.model, keep=1)  # one static cache held at a time (batches of a run share it)
        self.generated_tokens += sum(len(r.out) for r in rows)
        return [r.out for r in rows]

    # -- storage ----------------------------------------------------------------------------------
    def save(self, folder: str | Path, stats: dict | None = None) -> Path:
        """Write the model (or LoRA adapter), tokenizer and ``annotator.json`` into ``folder``."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(str(folder))
        self.tok.save(folder)
        meta = {"options": asdict(self.options), "stats": stats or {}}
        write_json(folder / ANNOTATOR_FILE, meta)
        self.fingerprint = fingerprint(folder)
        return folder

    @classmethod
    def load(cls, folder: str | Path, device: str | None = None) -> "Annotator":
        """Open an annotator written by :meth:`save` (a LoRA one loads its base model first)."""
        from transformers import AutoModelForCausalLM

        from ..tokens import load_tokenizer
        from ..device import default_device
        from .lm import load_base

        folder = Path(folder)
        if not (folder / ANNOTATOR_FILE).is_file():
            raise FileNotFoundError(f"{folder} is not an annotator folder (no {ANNOTATOR_FILE})")
        options = AnnotatorOptions(**json.loads((folder / ANNOTATOR_FILE).read_text())["options"])
        if options.base:
            from peft import PeftModel

            base, tok = load_base(options.base, device)
            # merged for decoding: the adapter's extra matrices would cost two products and a sum in
            # every adapted layer at every step (kernel launches, where a GPU step is launch-bound)
            model = PeftModel.from_pretrained(base, str(folder)).merge_and_unload()
        else:
            tok = load_tokenizer(folder)
            model = AutoModelForCausalLM.from_pretrained(str(folder)).to(default_device(device))
        annotator = cls(model, tok, options)
        annotator.fingerprint = fingerprint(folder)
        return annotator


def fingerprint(folder: str | Path) -> str:
    """A digest of an annotator folder: its weights (model or adapter) and its options, not its statistics,
    so that the same annotator has the same fingerprint in memory after :meth:`Annotator.save` and on load."""
    folder = Path(folder)
    h = hashlib.sha256(json.dumps(json.loads((folder / ANNOTATOR_FILE).read_text())["options"],
                                  sort_keys=True).encode())
    for path in sorted(p for p in folder.iterdir() if p.suffix in (".safetensors", ".bin") and p.is_file()):
        h.update(path.name.encode())
        with path.open("rb") as f:
            while chunk := f.read(1 << 22):
                h.update(chunk)
    return h.hexdigest()[:16]


class _RowChoices:
    """The rows' state machines as a logits processor: each unfinished row's scores keep only the
    token its :class:`_Row` chooses (the text's next token, a call's opening, a field or value token).

    Rows copying text (most rows at most steps) are decided together where the scores are, from two
    scores a row (the next text token's and ``<|db_start|>``'s); only rows inside a call, which read
    many candidates, are copied to the host and stepped one by one."""

    def __init__(self, rows: list["_Row"]):
        self.rows = rows

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        rows, device = self.rows, scores.device
        copying = [b for b, r in enumerate(rows) if r.copying]
        chosen = dict(zip(copying, _text_choices([rows[b] for b in copying], scores, copying)))
        others = [b for b, r in enumerate(rows) if not r.done and b not in chosen]
        if others:
            logits = scores[torch.tensor(others, device=device)].float().cpu()  # (k, vocab)
            chosen.update((b, rows[b].step(logits[k])) for k, b in enumerate(others))
        out = torch.full_like(scores, float("-inf"))
        if chosen:
            out[torch.tensor(list(chosen), device=device), torch.tensor(list(chosen.values()), device=device)] = 0.0
        return out


def _text_choices(rows: list["_Row"], scores: torch.Tensor, index: list[int]) -> list[int]:
    """For rows copying text: open a call where the row may (:meth:`_Row.may_call`) and the model
    scores ``<|db_start|>`` (plus ``call_bias``) above the text's next token (and, with
    ``call_threshold``, gives it at least that probability); else copy that token. Advances the rows."""
    if not rows:
        return []
    ann = rows[0].ann
    start, opts, device = ann.tok.start_id, ann.options, scores.device
    nxt = torch.tensor([r.org[r.i] for r in rows], device=device)
    at = torch.tensor(index, device=device)
    # two scores a row, compared in float64 as Python compares two float32 scores and a float bias
    call = scores[at, start].double() + opts.call_bias > scores[at, nxt].double()
    if opts.call_threshold is not None:
        call &= torch.softmax(scores[at].float(), -1)[:, start] >= opts.call_threshold
    call &= torch.tensor([r.may_call() for r in rows], device=device)
    out = []
    for r, c, t in zip(rows, call.tolist(), nxt.tolist()):
        t = start if c else t
        r._advance(t)
        out.append(t)
    return out


def _text_tokens(tok: LookupTokenizer, text: str) -> tuple[list[int], list[bool], list[bool]]:
    """The text's token ids; for each, whether a word starts there; for each boundary k (before token
    k, the last one at the end), whether a word ends there. Calls open only at word starts, and
    values and copied entities end only at word ends: a hyphen or a letter continues a word."""
    if not text:
        return [], [], [True]
    enc = tok.hf(text, add_special_tokens=False, return_offsets_mapping=True)
    ids, spans = list(enc["input_ids"]), enc["offset_mapping"]
    starts, ends = [], []
    for s, e in spans:
        c = s
        while c < e and text[c].isspace():
            c += 1
        starts.append(c < e and (c == 0 or not (text[c - 1].isalnum() or text[c - 1] == "-")))
        ends.append(s == 0 or not (text[s].isalnum() or text[s] == "-") or text[s - 1].isspace())
    return ids, starts, ends + [True]


@dataclass
class _Row:
    """One document's decoding state: forced text tokens, and the call being written."""

    ann: Annotator
    org: list[int]
    starts: list[bool]  # (len(org),) a word starts at this token
    ends: list[bool]  # (len(org) + 1,) a word ends before this token
    i: int = 0  # next text token to copy
    mode: int = _TEXT
    field_ids: list[int] = field(default_factory=list)
    calls_here: int = 0
    out: list[int] = field(default_factory=list)
    done: bool = False

    @property
    def room(self) -> int:
        """The most tokens this row may write: its text, its calls, its end."""
        return len(self.org) + CALL_ROOM + 1

    @property
    def copying(self) -> bool:
        """Copying the text, with a text token left to copy (the choice :func:`_text_choices` makes)."""
        return not self.done and self.mode == _TEXT and self.i < len(self.org)

    def may_call(self) -> bool:
        """Whether a call may open before the next text token: at a word start, after some text to
        copy an entity from (unless entities are free), not too many calls here already, and room
        left for the longest call and the rest of the text."""
        opts = self.ann.options
        longest = 3 * opts.max_field_tokens + 4  # its markers and three fields of the longest
        return (self.calls_here < opts.max_calls_per_position and self.starts[self.i]
                and (self.i > 0 or opts.entity == "free")
                and len(self.out) + longest + len(self.org) - self.i + 1 <= self.room)

    def step(self, logits: torch.Tensor) -> int:
        """Choose the next token from ``logits`` (vocab,) under the constraints, and advance (rows
        copying text are decided by :func:`_text_choices`)."""
        tok, opts = self.ann.tok, self.ann.options
        if self.mode == _TEXT:
            if self.i < len(self.org):
                return _text_choices([self], logits[None], [0])[0]
            self.done = True
            return tok.eos_id
        elif self.mode == _VALUE:
            j = self.i + len(self.field_ids)
            cands = ([self.org[j]] if j < len(self.org) and len(self.field_ids) < opts.max_field_tokens else []) \
                + ([tok.end_id] if self.field_ids and (self.ends[j] or j >= len(self.org)) else [])
            t = _best(logits, cands) if cands else tok.end_id  # longest value reached mid-word: close it
        else:
            t = self._field_token(logits)
        self._advance(t)
        return t

    def _field_token(self, logits: torch.Tensor) -> int:
        tok, opts = self.ann.tok, self.ann.options
        marker = tok.sep_id if self.mode == _ENTITY else tok.retrieve_id
        f = tuple(self.field_ids)
        if len(f) >= opts.max_field_tokens:
            return marker
        if self.mode == _ENTITY and opts.entity == "copy":
            cands, can_end = _continuations(self.org[:self.i], f, self.starts, self.ends)
            if not cands:  # nothing left to copy: close the entity (an empty one fails validation)
                return marker
            return _best(logits, cands + ([marker] if can_end else []))
        elif self.mode == _RELATION and self.ann._relations:
            cands = self.ann._relations.children(f)
            if self.ann._relations.is_whole(f):
                return _best(logits, cands + [marker])
            return _best(logits, cands) if cands else marker
        else:
            masked = logits.masked_fill(self.ann._banned[:len(logits)], float("-inf"))
            t = int(masked.argmax())
            return marker if f and float(logits[marker]) >= float(masked[t]) else t

    def _advance(self, t: int) -> None:
        tok = self.ann.tok
        self.out.append(t)
        if self.mode == _TEXT:
            if t == tok.start_id:
                self.mode, self.field_ids = _ENTITY, []
                self.calls_here += 1
            else:
                self.i, self.calls_here = self.i + 1, 0
        elif t in (tok.sep_id, tok.retrieve_id, tok.end_id):
            self.mode = {tok.sep_id: _RELATION, tok.retrieve_id: _VALUE, tok.end_id: _TEXT}[t]
            self.field_ids = []
        else:
            self.field_ids.append(t)


def _best(logits: torch.Tensor, cands: list[int]) -> int:
    return cands[int(logits[cands].argmax())]


def _continuations(left: list[int], prefix: tuple, starts: list[bool], ends: list[bool]) -> tuple[list[int], bool]:
    """Copying an entity from ``left``: the tokens that may follow ``prefix`` (a span of ``left``
    starting at a word start), and whether ``prefix`` may end here (some occurrence ends at a word end)."""
    n = len(prefix)
    if not n:
        return sorted({t for t, s in zip(left, starts) if s}), False
    hits = [j for j in range(len(left) - n + 1) if starts[j] and tuple(left[j:j + n]) == prefix]
    return sorted({left[j + n] for j in hits if j + n < len(left)}), any(ends[j + n] for j in hits)


def _bar(enabled: bool, total: int):
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="annotate", unit="doc", dynamic_ncols=True)
