"""Token roles: tokenize annotated text into ids plus a role per token.

Every mask in lmlm derives from the roles produced here: the training labels (value tokens and
``<|db_end|>`` are not trained), the static/dynamic/normalized perplexities, the per-role loss
curves, and the value encoding the generator forces after a lookup.

Plain text is tokenized once, whole, and the lookup calls are inserted at token boundaries, so the
``org`` tokens of an annotated document are exactly the tokens of its stripped text: the LMLM and
the Standard baseline see identical text tokens.

Also here: the tokenizers. ``train_bpe`` trains a byte-level BPE on a corpus (small presets);
``load_tokenizer`` opens any Hugging Face tokenizer folder or hub name. Both add the four lookup
tokens as special tokens.

Exercised by ``lmlm train`` and ``lmlm presets``.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from .lookup import PAPER_TOKENS, Lookup, LookupTokens, Segment, Text, lookups, plain_text

__all__ = [
    "ORG", "CALL", "ENTITY", "RELATION", "VALUE", "ROLE_NAMES", "IGNORE_INDEX",
    "Encoded", "LookupTokenizer", "train_bpe", "load_tokenizer", "labels_from_roles",
]

ORG, CALL, ENTITY, RELATION, VALUE = 0, 1, 2, 3, 4
ROLE_NAMES = ("org", "call", "entity", "relation", "value")
IGNORE_INDEX = -100
DOC_SEPARATOR = "<|endoftext|>"


@dataclass
class Encoded:
    """Token ids and one role per token (same length). ``end`` marks ``<|db_end|>`` tokens."""

    input_ids: list[int]
    roles: list[int]

    def __len__(self) -> int:
        return len(self.input_ids)

    def __add__(self, other: "Encoded") -> "Encoded":
        return Encoded(self.input_ids + other.input_ids, self.roles + other.roles)


def labels_from_roles(input_ids: Sequence[int], roles: Sequence[int], end_id: int) -> list[int]:
    """Training labels: ids, with value tokens and ``<|db_end|>`` set to -100 (not trained).

    Values are masked so the model learns to look facts up instead of memorising them; the end
    marker is masked because the generator inserts it after the value.
    """
    return [IGNORE_INDEX if (r == VALUE or t == end_id) else t for t, r in zip(input_ids, roles)]


class LookupTokenizer:
    """A Hugging Face fast tokenizer plus the lookup token vocabulary and role-aware encoding.

    Args:
        tokenizer: a ``PreTrainedTokenizerFast``; the four lookup tokens are added if missing.
        tokens: the lookup token vocabulary (paper names by default).
    """

    def __init__(self, tokenizer, tokens: LookupTokens = PAPER_TOKENS):
        if not getattr(tokenizer, "is_fast", False):
            raise ValueError("LookupTokenizer needs a fast (Rust) tokenizer for offset mapping")
        missing = [t for t in tokens.as_list() if t not in tokenizer.get_vocab()]
        if missing:
            tokenizer.add_special_tokens({"additional_special_tokens": missing})
        self.hf = tokenizer
        self.tokens = tokens
        self._field_cache: dict[str, list[int]] = {}
        self._backend = _plain_backend(tokenizer)
        self.start_id, self.sep_id, self.retrieve_id, self.end_id = (
            tokenizer.convert_tokens_to_ids(t) for t in tokens.as_list())
        self.call_ids = (self.start_id, self.sep_id, self.retrieve_id, self.end_id)
        doc = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
        if doc is None:
            raise ValueError("tokenizer has neither a bos nor an eos token to separate documents")
        self.doc_id = doc
        self.eos_id = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else doc
        # Sentencepiece-style tokenizers (LLaMA) prepend the word-boundary marker themselves;
        # byte-level ones (GPT-2) need an explicit leading space for a word inside a call.
        first = tokenizer.convert_ids_to_tokens(tokenizer.encode("a", add_special_tokens=False))[0]
        self._field_prefix = "" if first.startswith("\u2581") else " "
        # byte-level tokenizers trained with add_prefix_space decode a document with a leading space
        self._prefix_space = (self._field_prefix == " " and tokenizer.encode("a", add_special_tokens=False)
                              == tokenizer.encode(" a", add_special_tokens=False))

    def __len__(self) -> int:
        return len(self.hf)

    # -- pieces -----------------------------------------------------------------------------
    def encode_text(self, text: str) -> list[int]:
        return self.hf.encode(text, add_special_tokens=False) if text else []

    def encode_field(self, text: str) -> list[int]:
        """Ids of an entity, relation or value as written inside a call (one word-initial piece).

        Cached: the same names and relations recur in every document of a corpus.
        """
        ids = self._field_cache.get(text)
        if ids is None:
            ids = self._backend_ids(self._field_prefix + text)
            if len(self._field_cache) >= 200_000:
                self._field_cache.clear()
            self._field_cache[text] = ids
        return list(ids)

    def _backend_ids(self, text: str) -> list[int]:
        """``hf.encode(text, add_special_tokens=False)`` through the Rust tokenizer directly (same ids, less overhead)."""
        if self._backend is not None:
            return self._backend.encode(text, add_special_tokens=False).ids
        return self.hf.encode(text, add_special_tokens=False)

    def _ids_and_ends(self, plain: str) -> tuple[list[int], list[int]]:
        """Token ids of ``plain`` and the end character offset of each token."""
        if self._backend is not None:
            enc = self._backend.encode(plain, add_special_tokens=False)
            return enc.ids, [e for _, e in enc.offsets]
        enc = self.hf(plain, add_special_tokens=False, return_offsets_mapping=True)
        return list(enc["input_ids"]), [e for _, e in enc["offset_mapping"]]

    def decode_field(self, ids: Sequence[int]) -> str:
        return self.hf.decode(list(ids), skip_special_tokens=False).strip()

    def encode_call(self, lk: Lookup) -> Encoded:
        e, r, v = (self.encode_field(x) for x in (lk.entity, lk.relation, lk.value))
        ids = [self.start_id, *e, self.sep_id, *r, self.retrieve_id, *v, self.end_id]
        roles = [CALL, *[ENTITY] * len(e), CALL, *[RELATION] * len(r), CALL, *[VALUE] * len(v), CALL]
        return Encoded(ids, roles)

    def value_continuation(self, value: str) -> list[int]:
        """What the generator forces after ``<|db_retrieve|>``: the value's ids (without call markers,
        end-of-text or document separators, which a value must not smuggle in) then ``<|db_end|>``."""
        bad = {*self.call_ids, self.eos_id, self.doc_id}
        return [i for i in self.encode_field(value) if i not in bad] + [self.end_id]

    # -- documents --------------------------------------------------------------------------
    def encode(self, segments: Sequence[Segment], add_doc_separator: bool = True) -> Encoded:
        """Tokenize a parsed document into ids and roles.

        The stripped text is tokenized whole; each call is inserted before the first token that
        ends after the call's position (whitespace before the call stays with the next word).
        """
        plain, positions = plain_text(segments)
        ids, ends = self._ids_and_ends(plain) if plain else ([], [])
        out = Encoded([self.doc_id], [ORG]) if add_doc_separator else Encoded([], [])
        tok_i = 0
        for seg, p in zip(lookups(segments), positions):
            while p > 0 and plain[p - 1].isspace():
                p -= 1
            cut = bisect.bisect_right(ends, p, lo=tok_i)
            out = out + Encoded(ids[tok_i:cut], [ORG] * (cut - tok_i)) + self.encode_call(seg)
            tok_i = cut
        return out + Encoded(ids[tok_i:], [ORG] * (len(ids) - tok_i))

    def encode_plain(self, text: str, add_doc_separator: bool = True) -> Encoded:
        """The Standard baseline's encoding: the same text tokens, every role ``org``."""
        return self.encode([Text(text)], add_doc_separator)

    def decode_segments(self, ids: Sequence[int]) -> list[Segment]:
        """Turn generated ids back into text and lookup segments.

        An unfinished or malformed call at the end is returned as text (its markers decoded).
        """
        from_doc_start = bool(ids) and ids[0] == self.doc_id
        ids = [i for i in ids if i not in (self.doc_id, self.eos_id)]
        segments: list[Segment] = []
        org: list[int] = []
        prev_text = ""
        i, n = 0, len(ids)
        while i < n:
            if ids[i] == self.start_id:
                j = i + 1
                parts: list[list[int]] = [[]]
                want = [self.sep_id, self.retrieve_id, self.end_id]
                while j < n and want:
                    if ids[j] == want[0]:
                        want.pop(0)
                        parts.append([])
                    elif ids[j] in self.call_ids:
                        break
                    else:
                        parts[-1].append(ids[j])
                    j += 1
                if not want:
                    e, r, v = (self.decode_field(p) for p in parts[:3])
                    if e and r:
                        text = self.hf.decode(org, skip_special_tokens=False)
                        segments.append(Text(text[len(prev_text):]))
                        prev_text = text
                        segments.append(Lookup(e, r, v))
                        i = j
                        continue
            org.append(ids[i])
            i += 1
        segments.append(Text(self.hf.decode(org, skip_special_tokens=False)[len(prev_text):]))
        if from_doc_start and self._prefix_space and segments and isinstance(segments[0], Text) \
                and segments[0].text.startswith(" "):
            segments[0] = Text(segments[0].text[1:])
        segments = [s for s in segments if not (isinstance(s, Text) and not s.text)]
        # annotation convention: "born " + call + " 1990" (the space after the call goes with it)
        for k, seg in enumerate(segments):
            if not isinstance(seg, Lookup) or k + 1 >= len(segments) or not isinstance(segments[k + 1], Text):
                continue
            prev = segments[k - 1] if k > 0 and isinstance(segments[k - 1], Text) else None
            nxt = segments[k + 1].text
            if not nxt.startswith(" ") and (prev is None or prev.text[-1:].isspace()):
                segments[k + 1] = Text(" " + nxt)
            elif nxt.startswith(" ") and prev is not None and not prev.text[-1:].isspace():
                segments[k - 1] = Text(prev.text + " ")
        return segments

    def save(self, folder: str | Path) -> None:
        self.hf.save_pretrained(str(folder))


def _plain_backend(hf):
    """The Rust tokenizer behind ``hf`` if calling it directly gives ``hf``'s own ids (checked), else None."""
    backend = getattr(hf, "backend_tokenizer", None)
    if backend is None:
        return None
    probe = "Ada Lovelace, born 10 December 1815 in London. <|db_start|>\u00e9t\u00e9  x"
    same = all(backend.encode(t, add_special_tokens=False).ids == hf.encode(t, add_special_tokens=False)
               for t in (probe, " " + probe, "a"))
    return backend if same else None


def train_bpe(texts: Iterable[str], vocab_size: int = 4096, tokens: LookupTokens = PAPER_TOKENS,
              min_frequency: int = 2):
    """Train a byte-level BPE on ``texts`` (plain text, lookups stripped) and wrap it for Hugging Face.

    Returns a ``PreTrainedTokenizerFast`` with ``<|endoftext|>`` as bos/eos/pad and the four lookup
    tokens as special tokens. Text is encoded with a leading space (``add_prefix_space``).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    # A word at the start of a document gets the same token as inside a sentence (and inside a
    # lookup call), as with sentencepiece: " Ada" not "Ada". Copying a name into a call is then a
    # copy of the same tokens.
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    tok.decoder = decoders.ByteLevel()
    special = [DOC_SEPARATOR, *tokens.as_list()]
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=special,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=DOC_SEPARATOR, eos_token=DOC_SEPARATOR,
                                 pad_token=DOC_SEPARATOR, additional_special_tokens=tokens.as_list())
    return hf


def load_tokenizer(name_or_path: str | Path, tokens: LookupTokens = PAPER_TOKENS) -> LookupTokenizer:
    """Open a tokenizer folder, a ``tokenizer.json`` file, or a hub name, and add the lookup tokens.

    Folders with only ``vocab.json`` + ``merges.txt`` (GPT-2 layout) and bare ``tokenizer.json``
    files (LLaMA-2 layout) are both accepted.
    """
    from transformers import AutoTokenizer, GPT2TokenizerFast, PreTrainedTokenizerFast

    p = Path(name_or_path)
    if p.is_file() and p.suffix == ".json":
        hf = PreTrainedTokenizerFast(tokenizer_file=str(p))
        _set_default_specials(hf)
    elif p.is_dir() and not (p / "tokenizer_config.json").exists() and (p / "vocab.json").exists():
        hf = GPT2TokenizerFast.from_pretrained(str(p))
    elif p.is_dir() and not (p / "tokenizer_config.json").exists() and (p / "tokenizer.json").exists():
        hf = PreTrainedTokenizerFast(tokenizer_file=str(p / "tokenizer.json"))
        _set_default_specials(hf)
    else:
        hf = AutoTokenizer.from_pretrained(str(name_or_path))
    return LookupTokenizer(hf, tokens)


def _set_default_specials(hf) -> None:
    """Name bos/eos for bare tokenizer.json files that carry the usual LLaMA or GPT-2 specials."""
    vocab = hf.get_vocab()
    for bos, eos in (("<s>", "</s>"), (DOC_SEPARATOR, DOC_SEPARATOR)):
        if bos in vocab and eos in vocab:
            if hf.bos_token is None:
                hf.bos_token = bos
            if hf.eos_token is None:
                hf.eos_token = eos
            return
