"""What every evaluation protocol shares: its name, its primary metric, and how results are written.

A protocol returns ``dict[str, float]`` whose keys start with its name (``trex_exact_match``,
``popqa_accuracy`` ...), so the results of several protocols merge into one flat dict. Per-item
records (prompt, output, verdict, lookups) are collected on request and written beside the metrics
by :func:`write_results`. Exercised by every ``lmlm eval`` command.
"""

from __future__ import annotations

import json
import math
import unicodedata
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..jsonio import write_json
from ..lookup import PAPER_TOKENS, LookupTokens

__all__ = ["Protocol", "mean", "wilson_interval", "output_text", "outputs_of", "progress_option", "read_json_records",
           "trace_dicts", "write_results", "same_entity", "lookup_metrics", "scratch_kb"]


@dataclass(frozen=True)
class Protocol:
    """Describes one evaluation protocol.

    Args:
        name: the key prefix of its metrics (``"trex"``).
        primary: the metric that summarises it (``"trex_exact_match"``).
        greater_is_better: whether a larger primary metric is better.
        paper: where the protocol is described (for the results file).
    """

    name: str
    primary: str
    greater_is_better: bool = True
    paper: str = ""

    def __post_init__(self):
        if not self.primary.startswith(self.name + "_"):
            raise ValueError(f"primary metric {self.primary!r} must start with {self.name + '_'!r}")

    def key(self, metric: str) -> str:
        return f"{self.name}_{metric}"


def mean(values: Iterable[float]) -> float:
    """Arithmetic mean; NaN for no values."""
    values = list(values)
    return float(sum(values) / len(values)) if values else math.nan


def wilson_interval(hits: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """Wilson's score interval for a rate of ``hits`` in ``n`` (95% for the default ``z``); NaNs for ``n = 0``.

    What a precision on a few dozen prompts can and cannot tell apart: 8 of 17 and 11 of 16 overlap.

    Examples:
        >>> [round(x, 3) for x in wilson_interval(8, 17)]
        [0.262, 0.69]
        >>> wilson_interval(0, 0)
        (nan, nan)
    """
    if n <= 0:
        return math.nan, math.nan
    p, z2 = hits / n, z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z / (1 + z2 / n) * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    return (0.0 if hits <= 0 else centre - half), (1.0 if hits >= n else centre + half)  # no rounding past the rate


def output_text(result, tokens: LookupTokens | None = None) -> str:
    """A generation's text with lookups stripped, scored by every protocol.

    ``clean_text`` already leaves out a call cut by the token limit; a malformed call kept as text
    (a marker where none belongs) is not part of the answer either, so the text is cut where one
    opens, and stray markers go.
    """
    tokens = tokens or PAPER_TOKENS
    text = result.clean_text
    cut = text.find(tokens.start)
    if cut >= 0:
        text = text[:cut]
    for marker in tokens.as_list():
        text = text.replace(marker, "")
    return text


def _tokens_of(generator) -> LookupTokens | None:
    return getattr(getattr(generator, "tok", None), "tokens", None)


def outputs_of(generator, results, max_text_tokens: int | None = None) -> list[str]:
    """:func:`output_text` of each result, with the generator's lookup token names; with
    ``max_text_tokens``, an answer with calls is cut to that many tokens of text (see :func:`answer_budget`)."""
    tokens = _tokens_of(generator)
    outs = [output_text(r, tokens) for r in results]
    hf = getattr(getattr(generator, "tok", None), "hf", None)
    if max_text_tokens is None or hf is None:
        return outs
    cut = []
    for o, r in zip(outs, results):
        ids = hf.encode(o, add_special_tokens=False) if r.trace else ()
        cut.append(hf.decode(ids[:max_text_tokens]) if len(ids) > max_text_tokens else o)
    return cut


CALL_ROOM = 64  # tokens an answer's calls may take on top of its text (a call is 10-30 tokens)


def answer_budget(generator, max_new_tokens: int) -> int:
    """Tokens to generate for an answer of ``max_new_tokens`` tokens of text: a model that makes calls
    gets :data:`CALL_ROOM` more, since the protocols strip the calls from what they score, and its
    answer is then cut to ``max_new_tokens`` tokens of text (:func:`outputs_of`). So an LMLM and a
    Standard model answer in the same number of text tokens, the calls not taken from the LMLM's."""
    calls = getattr(generator, "options", {}).get("use_db", False) and getattr(generator, "kb", None) is not None
    return max_new_tokens + (CALL_ROOM if calls else 0)


def progress_option(progress: bool) -> dict:
    """``generate``'s keyword for a progress bar over its batches, only when one is asked for (a backend
    without the option, such as vLLM's, is then called as before)."""
    return {"progress": True} if progress else {}


def trace_dicts(result) -> list[dict]:
    """The lookups of a generation result as plain dicts (``GenerationResult.trace``)."""
    return [t.to_dict() if hasattr(t, "to_dict") else dict(vars(t)) for t in getattr(result, "trace", [])]


def same_entity(a: str | None, b: str | None) -> bool:
    """Whether two entity names are the same after case folding and whitespace (``"ada  Lind"`` = ``"Ada Lind"``)."""
    return a is not None and b is not None and " ".join(a.casefold().split()) == " ".join(b.casefold().split())


def lookup_metrics(protocol: Protocol, results, subjects) -> dict[str, float]:
    """How the lookups of ``results`` (one per item about ``subjects[i]``) were answered.

    ``lookup_found``: share of items with a lookup the KB answered with a fact about the item's
    subject (the matched entity, or the query's entity that the KB resolved by name, is the subject;
    any answer where an item names no subject); ``lookup_answered``: with any answer;
    ``lookup_wrong_entity``: items whose answers were all about someone else; ``lookup_names_subject``:
    share of items whose first lookup names the subject (found or not: what the model wrote). The paper's match of
    the whole key (``via == "key"``) resolves no name: a query naming the subject that it answers with
    a namesake's fact ("Darren Rios" -> Ian Rios's) is about someone else.
    """
    def about(t, subject: str) -> bool:
        matched = getattr(t, "matched_entity", None)
        return (not subject or same_entity(matched, subject)
                or (same_entity(t.query_entity, subject) and (matched is None or getattr(t, "via", None) != "key")))

    found, answered, names, wrong = [], [], [], 0
    for r, subject in zip(results, subjects):
        trace = getattr(r, "trace", [])
        names.append(bool(trace) and (not subject or same_entity(trace[0].query_entity, subject)
                                      or same_entity(getattr(trace[0], "matched_entity", None), subject)))
        got = [t for t in trace if getattr(t, "found", False)]
        right = any(about(t, subject) for t in got)
        found.append(right)
        answered.append(bool(got))
        wrong += bool(got) and not right
    return {protocol.key("lookup_found"): mean(found), protocol.key("lookup_answered"): mean(answered),
            protocol.key("lookup_wrong_entity"): float(wrong), protocol.key("lookup_names_subject"): mean(names)}


def scratch_kb(folder: str | Path, prefix: str = "lmlm-kb-"):
    """An open copy of the KB in ``folder``, in a new temporary folder, and that folder (the caller removes
    it): a measurement that edits or deletes facts leaves the KB itself as it was."""
    import shutil
    import tempfile

    from ..kb import KnowledgeBase

    tmp = Path(tempfile.mkdtemp(prefix=prefix))
    shutil.copytree(folder, tmp / "kb")
    return KnowledgeBase.open(tmp / "kb"), tmp


def write_results(path: str | Path, protocol: Protocol, metrics: Mapping[str, float],
                  records: list[dict] | None = None, config: Mapping[str, Any] | None = None) -> Path:
    """Write ``{"protocol", "metrics", "config", "records"}`` as JSON to ``path`` (folders created).

    ``protocol.primary`` is null when the metrics do not hold it (forget quality without a retain model,
    the offloading ranking, which trains no model): a reader of the file finds the metric it names."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    about = asdict(protocol)
    if protocol.primary not in metrics:
        about["primary"] = None
    doc = {"protocol": about, "metrics": dict(metrics), "config": dict(config or {}), "records": records or []}
    write_json(path, _no_nan(doc))  # NaN written as null: JSON has no NaN
    return path


_SPACES = {c: " " for c in ("\u00a0", "\u2007", "\u202f", "\u2009", "\u200a", "\u3000", "\u2002", "\u2003")}


def normal_text(s: str) -> str:
    """A benchmark string as the model and the KB read text: Unicode NFC (a name typed with combining
    accents is the same name) and every no-break or thin space a plain one."""
    s = unicodedata.normalize("NFC", s)
    return s.translate(str.maketrans(_SPACES)) if not s.isascii() else s


def normal_fields(item, names: Iterable[str]) -> None:
    """:func:`normal_text` on the string fields ``names`` of a frozen dataclass ``item``, in place."""
    for name in names:
        value = getattr(item, name)
        if isinstance(value, str):
            object.__setattr__(item, name, normal_text(value))
        elif isinstance(value, tuple):
            object.__setattr__(item, name, tuple(normal_text(v) if isinstance(v, str) else v for v in value))


def read_json_records(path: str | Path) -> list[dict]:
    """Records of a ``.json`` file (a list, or an object holding one list) or a JSON-lines file
    (a UTF-8 BOM allowed); a line that is not JSON is named by ``FILE:LINE``."""
    text = Path(path).read_text(encoding="utf-8-sig")
    stripped = text.lstrip()
    if stripped.startswith("["):
        try:
            return list(json.loads(text))
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{e.lineno}: not JSON ({e.msg})") from None
    if stripped.startswith("{"):
        try:
            doc = json.loads(text)
        except json.JSONDecodeError:  # JSON lines: one object per line
            out = []
            for n, line in enumerate(text.splitlines(), 1):
                if line.strip():
                    try:
                        out.append(json.loads(line))
                    except json.JSONDecodeError as e:
                        raise ValueError(f"{path}:{n}: not a JSON line ({e.msg})") from None
            return out
        lists = [v for v in doc.values() if isinstance(v, list) and v and all(isinstance(x, dict) for x in v)]
        if len(lists) == 1:  # {"data": [...]}-style wrappers
            return lists[0]
        return [doc]
    if not stripped:
        return []
    raise ValueError(f"{path}: neither JSON nor JSON lines")


def _no_nan(x):
    """``x`` with every float NaN or infinity as None: strict JSON, as the metrics line prints them."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _no_nan(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_no_nan(v) for v in x]
    return x
