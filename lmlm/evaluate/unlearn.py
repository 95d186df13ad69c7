"""Unlearning on TOFU: the LMLM deletes facts from its KB; the Standard model needs training runs.

The paper (section 4.2, appendix B "TOFU") compares unlearning an LMLM, by removing the forget
set's entries from its database, with NPO on a Standard model, following open-unlearning. Here:

* :func:`kb_unlearn`: delete every fact that the forget set's annotated answers look up, as one KB
  version; no training, no retain data.
* :func:`unlearn`: a real fine-tuning run on the forget set (answer tokens only, as TOFU trains),
  one of open-unlearning's losses:

  - ``ga`` (gradient ascent): ``-NLL(forget)``;
  - ``grad_diff``: ``-NLL(forget) + alpha * NLL(retain)``;
  - ``npo`` (Zhang et al., 2024): ``-(2 / beta) * mean log sigmoid(-beta * (log p(y|x) - log p_ref(y|x)))``
    over forget answers, ``p_ref`` the model before unlearning, plus ``alpha * NLL(retain)``
    (open-unlearning's NPO; ``alpha=0`` gives the original NPO). ``beta=0.1`` as open-unlearning.

  With an ``evaluate`` callback, the run records a trajectory: the metrics at step 0, every
  ``eval_every`` steps and at the end (forget quality and model utility for the paper's plot).
* :func:`tofu_summary`: one model's TOFU metrics on the forget, retain, real-authors and
  world-facts sets, its forget quality against a retain model's truth ratios, and its model utility.

Exercised by ``lmlm eval tofu`` and ``lmlm reproduce``.

Examples:
    >>> sets = read_tofu_sets("runs/tofu", "forget05")
    >>> before = tofu_summary(model, tok, sets, retain_ratios=retain_model_ratios)
    >>> result = unlearn(model, tok, sets["forget"], sets["retain"], UnlearnConfig(method="npo", steps=30))
    >>> result.trajectory[-1]["forget_quality"], result.trajectory[-1]["model_utility"]
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from ..scoring import target_logprobs
from ..tokens import IGNORE_INDEX
from .base import Protocol
from .tofu import QA_TEMPLATE, TofuItem, forget_quality, model_utility, read_tofu, tofu_eval, value_truth_ratios

__all__ = ["TOFU", "METHODS", "UTILITY_SETS", "UnlearnConfig", "UnlearnResult", "kb_unlearn", "forget_keys",
           "npo_loss", "qa_batch", "sequence_logprobs", "unlearn", "read_tofu_sets", "tofu_summary"]

TOFU = Protocol("tofu", "tofu_forget_quality", paper="LMLM section 4.2 and appendix B, TOFU (open-unlearning metrics)")
METHODS = ("ga", "grad_diff", "npo")
UTILITY_SETS = ("retain", "real_authors", "world_facts")
_FILES = {"retain": "retain_perturbed.json", "real_authors": "real_authors_perturbed.json",
          "world_facts": "world_facts_perturbed.json"}


@dataclass
class UnlearnConfig:
    """One unlearning run.

    Args:
        method: ``"ga"``, ``"grad_diff"`` or ``"npo"``.
        steps: optimizer steps.
        lr: AdamW learning rate (constant; no weight decay).
        batch_size: forget (and retain) items per step.
        beta: NPO's inverse temperature.
        alpha: weight of the retain NLL (``grad_diff`` and ``npo``; ignored by ``ga``).
        eval_every: steps between two evaluations of the trajectory (0: start and end only).
        grad_clip: gradient-norm clipping.
        seed: the order of the items.
    """

    method: str = "npo"
    steps: int = 30
    lr: float = 1e-4
    batch_size: int = 8
    beta: float = 0.1
    alpha: float = 1.0
    eval_every: int = 5
    grad_clip: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {self.method!r}")
        for name in ("steps", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.lr <= 0 or self.beta <= 0 or self.alpha < 0 or self.eval_every < 0:
            raise ValueError(f"need lr > 0, beta > 0, alpha >= 0, eval_every >= 0; got {self}")


@dataclass
class UnlearnResult:
    """The unlearned model (a copy; the input model is left as it was), its trajectory and losses."""

    model: object
    trajectory: list[dict] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    seconds: float = 0.0


# -- the LMLM: delete from the KB -----------------------------------------------------------------

def forget_keys(items: Sequence[TofuItem]) -> list[tuple[str, str]]:
    """The ``(entity, relation)`` keys that the forget set's annotated answers look up."""
    from ..lookup import Lookup, parse

    keys: dict[tuple[str, str], None] = {}
    for it in items:
        if it.annotated_answer is None:
            raise ValueError(f"question {it.question!r} has no annotated answer: cannot tell which facts to delete")
        for seg in parse(it.annotated_answer, form="dblookup").segments:
            if isinstance(seg, Lookup):
                keys.setdefault(seg.key)
    return list(keys)


def kb_unlearn(kb, items: Sequence[TofuItem], who: str = "lmlm", why: str = "TOFU forget set") -> dict:
    """Delete the facts of the forget set from ``kb`` (one version); returns ``{"deleted", "keys", "seconds"}``."""
    keys = forget_keys(items)
    t0 = time.perf_counter()
    deleted = kb.forget(keys, who=who, why=why) if keys else 0
    return {"deleted": deleted, "keys": len(keys), "seconds": time.perf_counter() - t0, "version": kb.version}


# -- Standard models: training runs ---------------------------------------------------------------

def qa_batch(tok, items: Sequence[TofuItem], template: str = QA_TEMPLATE) -> tuple[torch.Tensor, ...]:
    """``(input_ids, labels, attention_mask)``, each ``(batch, T)``, right padded; labels are the
    answer tokens (question and padding -100), not shifted."""
    from .nlu import split_pair

    pairs = [split_pair(tok, template.format(question=it.question), " " + it.answer.strip()) for it in items]
    width = max(len(c) + len(a) for c, a in pairs)
    ids = torch.full((len(pairs), width), tok.eos_id)
    labels = torch.full((len(pairs), width), IGNORE_INDEX)
    mask = torch.zeros((len(pairs), width), dtype=torch.long)
    for r, (c, a) in enumerate(pairs):
        n = len(c) + len(a)
        ids[r, :n] = torch.tensor(c + a)
        labels[r, len(c):n] = torch.tensor(a)
        mask[r, :n] = 1
    return ids, labels, mask


def sequence_logprobs(model, ids: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row: summed log-probability of the labelled tokens ``(batch,)`` and their count ``(batch,)``."""
    logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1]  # (B, T-1, V)
    target = labels[:, 1:]
    return target_logprobs(logits, target).sum(1), (target != IGNORE_INDEX).sum(1)


def npo_loss(logp: torch.Tensor, ref_logp: torch.Tensor, beta: float) -> torch.Tensor:
    """NPO: ``-(2 / beta) * mean(log sigmoid(-beta * (logp - ref_logp)))``; ``(2 / beta) log 2`` at the start.

    Examples:
        >>> float(npo_loss(torch.tensor([-3.0]), torch.tensor([-3.0]), beta=0.1))  # 20 * log 2
        13.862943649291992
    """
    return -(2.0 / beta) * F.logsigmoid(-beta * (logp - ref_logp)).mean()


def _nll(model, batch) -> torch.Tensor:
    logp, n = sequence_logprobs(model, *batch)
    return -logp.sum() / n.sum().clamp(min=1)


def unlearn(model, tok, forget: Sequence[TofuItem], retain: Sequence[TofuItem] = (),
            config: UnlearnConfig | None = None, evaluate: Callable[[object], Mapping[str, float]] | None = None,
            template: str = QA_TEMPLATE) -> UnlearnResult:
    """Unlearn ``forget`` from a copy of ``model`` with ``config.method``; see the module docstring.

    Args:
        model: a Hugging Face causal LM (left unchanged).
        tok: its :class:`lmlm.tokens.LookupTokenizer`.
        forget, retain: TOFU items (``retain`` is needed by ``grad_diff`` and by ``npo`` with ``alpha > 0``).
        config: the run (default :class:`UnlearnConfig`).
        evaluate: called with the model (in eval mode) along the way; its dicts, with ``step``,
            make the trajectory.
        template: how a question is shown (TOFU's ``Question: ...\\nAnswer:``).
    """
    config = config or UnlearnConfig()
    if not forget:
        raise ValueError("the forget set is empty")
    use_retain = config.method != "ga" and config.alpha > 0
    if use_retain and not retain:
        raise ValueError(f"{config.method} with alpha={config.alpha} needs retain items")
    student = copy.deepcopy(model)
    ref = copy.deepcopy(model).eval() if config.method == "npo" else None
    opt = torch.optim.AdamW([p for p in student.parameters() if p.requires_grad], lr=config.lr, weight_decay=0.0)
    g = torch.Generator().manual_seed(config.seed)
    result = UnlearnResult(student)

    def record(step: int) -> None:
        if evaluate is not None:
            student.eval()
            result.trajectory.append({"step": step, **evaluate(student)})

    record(0)
    t0 = time.perf_counter()
    for step in range(1, config.steps + 1):
        student.train()
        fb = qa_batch(tok, _sample(forget, config.batch_size, g), template)
        if config.method == "npo":
            logp, _ = sequence_logprobs(student, *fb)
            with torch.no_grad():
                ref_logp, _ = sequence_logprobs(ref, *fb)
            loss = npo_loss(logp, ref_logp, config.beta)
        else:
            loss = -_nll(student, fb)
        if use_retain:
            loss = loss + config.alpha * _nll(student, qa_batch(tok, _sample(retain, config.batch_size, g), template))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(student.parameters(), config.grad_clip)
        opt.step()
        result.losses.append(loss.item())
        if (config.eval_every and step % config.eval_every == 0) or step == config.steps:
            result.seconds += time.perf_counter() - t0
            record(step)
            t0 = time.perf_counter()
    result.seconds += time.perf_counter() - t0
    student.eval()
    return result


def _sample(items: Sequence[TofuItem], n: int, g: torch.Generator) -> list[TofuItem]:
    idx = torch.randperm(len(items), generator=g)[:n].tolist()
    return [items[i] for i in idx]


# -- TOFU's summary of one model ------------------------------------------------------------------

def read_tofu_sets(folder: str | Path, forget_split: str = "forget05", limit: int | None = None) -> dict[str, list[TofuItem]]:
    """The evaluation sets of a TOFU folder: ``forget`` (``<forget_split>_perturbed.json``) and those of
    ``retain``, ``real_authors`` and ``world_facts`` whose file is there."""
    folder = Path(folder)
    path = folder / f"{forget_split}_perturbed.json"
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: is {folder} a TOFU folder?")
    sets = {"forget": read_tofu(path, limit=limit)}
    for name, file in _FILES.items():
        if (folder / file).exists():
            sets[name] = read_tofu(folder / file, limit=limit)
    return sets


def tofu_summary(model, tok, sets: Mapping[str, Sequence[TofuItem]], *, kb=None, generator=None,
                 retain_ratios: Sequence[float] | None = None, retain_value_ratios: Sequence[float] | None = None,
                 max_new_tokens: int = 48, batch_size: int = 16) -> dict:
    """TOFU metrics of one model on ``sets`` (from :func:`read_tofu_sets`).

    Args:
        model, tok: the model; ``kb``: its knowledge base when it is an LMLM (annotated scoring).
        generator: a :class:`lmlm.generate.LookupGenerator` for ROUGE-L (none: no ROUGE).
        retain_ratios: the retain model's forget-set truth ratios (``forget_truth_ratios`` of its
            summary); with them, ``forget_quality`` is the KS-test p-value against them.
        retain_value_ratios: the same over value tokens only (``forget_value_truth_ratios``); with
            them, ``forget_quality_values`` is the KS-test p-value against them.

    Returns:
        ``tofu_<set>_{prob,rouge_l_recall,truth_ratio,n}``, ``model_utility`` (harmonic mean over the
        retain / real-authors / world-facts values present), ``forget_quality`` (or None),
        ``forget_quality_values`` (or None), and ``forget_truth_ratios`` and
        ``forget_value_truth_ratios`` (raw, for other models' forget quality).
    """
    out: dict = {}
    utility = {}
    for name, items in sets.items():
        if not items:
            continue
        records: list = []
        m = tofu_eval(model, tok, items, split=name, generator=generator, kb=kb, max_new_tokens=max_new_tokens,
                      batch_size=batch_size, records=records)
        out.update(m)
        if name == "forget":
            out["forget_truth_ratios"] = [r["truth_ratio"] for r in records if "truth_ratio" in r]
        elif name in UTILITY_SETS:
            utility.update({k: v for k, v in m.items() if not k.endswith("_n") and not math.isnan(v)})
    out["model_utility"] = model_utility(utility) if utility else math.nan
    ratios = out.get("forget_truth_ratios")
    out["forget_quality"] = forget_quality(ratios, retain_ratios) if ratios and retain_ratios else None
    if sets.get("forget"):
        values = value_truth_ratios(model, tok, sets["forget"], kb=kb, batch_size=batch_size)
        out["forget_value_truth_ratios"] = values
        out["forget_quality_values"] = (forget_quality(values, retain_value_ratios)
                                        if values and retain_value_ratios else None)
    return out
