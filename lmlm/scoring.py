"""The one log-probability scorer: what every loss, perplexity and choice score is computed from.

* :func:`target_logprobs`: ``(B, T)`` log-probability of each target token under ``(B, T, V)``
  logits, 0 where the target is ignored; differentiable, so training losses (the LM loss, NPO,
  gradient ascent) use it as well as evaluation;
* :func:`token_logprobs`: batched, no-grad scores of whole token sequences, right padded; entry
  ``t`` scores ``ids[t + 1]``.

Training (:mod:`lmlm.train`, the annotator's and corrector's :func:`lmlm.annotate.lm.fit`),
perplexity, offloading, TOFU, unlearning, NLU multiple choice, the lm-eval adapter and the
corrector all score through these two, exercised by ``lmlm eval`` and ``lmlm reproduce``.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F

from .models import max_positions
from .tokens import IGNORE_INDEX

__all__ = ["target_logprobs", "token_logprobs"]


def target_logprobs(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int = IGNORE_INDEX) -> torch.Tensor:
    """Log-probability of ``targets`` ``(B, T)`` under ``logits`` ``(B, T, V)`` (aligned: position
    ``t`` of ``logits`` predicts ``targets[:, t]``); 0 where the target is ``ignore_index``.

    Computed in float32 through ``cross_entropy`` (no ``(B, T, V)`` log-softmax kept).

    Examples:
        >>> logits = torch.tensor([[[0.0, 0.0], [2.0, 0.0]]])
        >>> target_logprobs(logits, torch.tensor([[1, -100]])).exp().tolist()  # p = 1/2; ignored: log 1
        [[0.5, 1.0]]
    """
    nll = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=ignore_index, reduction="none")
    return -nll.view(targets.shape)


@torch.no_grad()
def token_logprobs(model, sequences: Sequence[Sequence[int]], batch_size: int = 16, max_length: int | None = None,
                   banned: Sequence[int] = (), greedy: bool = False, progress: str | None = None) -> list:
    """Log-probability of every token given its prefix; entry ``t`` scores ``ids[t + 1]``.

    Args:
        sequences: token ids; one longer than ``max_length`` (default: the model's context) is scored
            in windows of that length, each half a window after the last, so every token is scored
            once, after at least half a window of the text before it.
        batch_size: rows per forward pass (longest first, right padded with an attention mask, so
            every real token's score is exact).
        banned: token ids removed from the distribution first (their logits set to -inf), e.g. the
            lookup tokens when an LMLM is scored as a plain language model.
        greedy: also return, per sequence, whether each token is the model's argmax.
        progress: a progress bar on stderr over the tokens scored, with this label (``None``: none).

    Returns:
        One ``float32`` array of ``len(ids) - 1`` scores per sequence, in input order; with
        ``greedy``, ``(scores, is_argmax)`` pairs.
    """
    import numpy as np

    model.eval()
    ctx = max_length or max_positions(model)
    device = next(model.parameters()).device
    ban = torch.tensor(sorted(set(banned)), dtype=torch.long, device=device)
    windows = []  # (sequence, first score of the window's own, window start, ids)
    for i, seq in enumerate(sequences):
        seq, done, start = list(seq), 0, 0
        while True:
            w = seq[start:start + ctx]
            windows.append((i, done - start, start, w))
            done = start + len(w) - 1
            if start + ctx >= len(seq):
                break
            start += max(ctx // 2, 1)
    parts: list[list] = [[] for _ in sequences]
    order = sorted(range(len(windows)), key=lambda k: -len(windows[k][3]))
    bar = None
    if progress is not None:
        from tqdm.auto import tqdm
        bar = tqdm(total=sum(len(w[3]) for w in windows), desc=progress, unit="tok", unit_scale=True)
    for b in range(0, len(order), batch_size):
        idx = order[b:b + batch_size]
        seqs = [windows[k][3] for k in idx]
        width = max(len(s) for s in seqs)
        ids = torch.zeros(len(seqs), width, dtype=torch.long)
        mask = torch.zeros(len(seqs), width, dtype=torch.long)
        for r, s in enumerate(seqs):
            ids[r, :len(s)] = torch.tensor(s)
            mask[r, :len(s)] = 1
        ids, mask = ids.to(device), mask.to(device)
        logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()  # (B, T-1, V)
        if len(ban):
            logits[..., ban] = -torch.inf
        lp = target_logprobs(logits, ids[:, 1:]).cpu().numpy()
        hit = (logits.argmax(-1) == ids[:, 1:]).cpu().numpy() if greedy else None
        for r, (k, s) in enumerate(zip(idx, seqs)):
            i, own, start, _ = windows[k]
            n = len(s) - 1
            parts[i].append((start, lp[r, own:n], hit[r, own:n] if greedy else None))
        if bar is not None:
            bar.update(sum(len(s) for s in seqs))
    if bar is not None:
        bar.close()
    out: list = []
    for ps in parts:
        ps.sort(key=lambda x: x[0])
        scores = np.concatenate([p[1] for p in ps]) if ps else np.zeros(0, np.float32)
        out.append((scores, np.concatenate([p[2] for p in ps])) if greedy else scores)
    return out
