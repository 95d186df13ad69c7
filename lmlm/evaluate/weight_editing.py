"""The knowledge-editing field's own methods, which change a model's weights: FT-L, ROME and MEMIT.

They are the baselines ``lmlm eval editing --method ft-l|rome|memit`` sets beside an LMLM's KB edit, run
on a Standard model (the same architecture trained without calls). FT-L and ROME change one matrix, the
output projection of one layer's MLP (GPT-2's ``mlp.c_proj``, LLaMA's ``mlp.down_proj``), edit after edit
(sequential editing: each edit starts from the weights the previous one left); MEMIT changes that
projection in a few consecutive layers, for a batch of edits at once:

* **FT-L**, constrained fine-tuning (Zhu et al., 2020; ROME's ``FT-L`` baseline, hyper-parameters of
  its GPT-2 XL run: layer 0, 25 Adam steps at lr 5e-4, no weight decay, every weight kept within
  ``5e-4`` of its value before the edit, the L-infinity constraint). The loss is the new object's
  negative log-likelihood after the edit prompt, each of its tokens teacher-forced.
* **ROME** (Meng et al., 2022, "Locating and Editing Factual Associations in GPT"): a rank-one update
  ``W' = W + (v* - W k*) (C^-1 k)^T / ((C^-1 k)^T k*)`` where ``k*`` is the MLP projection's input at
  the subject's last token of the edit prompt, ``k`` that key averaged over the prompt behind a few
  prefixes the model wrote, ``C = E[k k^T]`` the keys' second moment over a sample of text (the
  world's documents), and ``v*`` the projection's output there that makes the new object likely,
  found by gradient descent on an added vector (20 Adam steps at lr 0.5; a KL term keeping
  ``"{subject} is a"``'s next-token distribution, weight 0.0625; decay 0.5; norm at most 4 times the
  output's), as ROME's ``compute_v`` does. So ``W' k* = v*``: the edited layer maps the subject's key
  to the value that states the new object (:meth:`Rome.edit` returns both to check it). The default
  layer is ROME's 17 of GPT-2 XL's 48 scaled to the model's depth.
* **MEMIT** (Meng et al., 2023, "Mass-Editing Memory in a Transformer"): for each edit a target ``z``
  for the residual stream at the top edited layer ``L`` (the subject's last token), found as v* is but
  added to the block's output (norm at most 0.75 times it, MEMIT's GPT-2 XL setting); then layer by
  layer, lowest first, the keys ``K`` (the projection's inputs at the subject, averaged over the
  prefixes) and the residual ``R = (Z - Z_now) / (layers left)`` give the update
  ``W' = W + R K^T (lambda C + K K^T)^-1`` (``C = E[k k^T]`` as ROME's), the least
  squares solution that keeps ``W' k = W k`` on the text's keys while ``W' K = W K + R``. ``lambda`` is
  GPT-2 XL's 20,000 per its 6,400 key dimensions, times the model's key dimensions: ``C``'s eigenvalues
  shrink as the keys' dimension grows, and a fixed 20,000 would drown a small model's edits. The layers are
  GPT-2 XL's 13-17 of 48 scaled to the model's depth (at least two where the model has them), ending
  at ROME's layer. A count's edits go in as one batch, MEMIT's mass edit.

No maintained ROME or MEMIT package installs from PyPI (``rome`` there is a Roman-numerals library;
``easyedit``/``easyeditor`` are placeholders), so these are the project's own implementations of the
papers' methods, each tested on its defining property (:meth:`Rome.edit`, :meth:`Memit.edit_batch`).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

__all__ = ["WeightEdit", "FineTuneL", "Rome", "Memit", "mlp_projection", "decoder_block", "subject_last_index",
           "rome_layer", "memit_layers"]


@dataclass(frozen=True)
class WeightEdit:
    """One requested rewrite: ``prompt`` (the subject filled in) should continue with ``target``."""

    prompt: str
    subject: str
    target: str


def mlp_projection(model, layer: int) -> torch.nn.Module:
    """The output projection of ``layer``'s MLP: GPT-2's ``Conv1D`` ``mlp.c_proj`` or LLaMA's ``mlp.down_proj``."""
    blocks = getattr(getattr(model, "transformer", None), "h", None)
    if blocks is not None:
        return blocks[layer].mlp.c_proj
    blocks = getattr(getattr(model, "model", None), "layers", None)
    if blocks is not None:
        return blocks[layer].mlp.down_proj
    raise ValueError(f"{type(model).__name__}: weight editing knows GPT-2 and LLaMA layouts only")


def decoder_block(model, layer: int) -> torch.nn.Module:
    """``layer``'s decoder block (its output is the residual stream after the layer)."""
    blocks = getattr(getattr(model, "transformer", None), "h", None)
    if blocks is None:
        blocks = getattr(getattr(model, "model", None), "layers", None)
    if blocks is None:
        raise ValueError(f"{type(model).__name__}: weight editing knows GPT-2 and LLaMA layouts only")
    return blocks[layer]


def _layers(model) -> int:
    return int(model.config.num_hidden_layers)


def rome_layer(model) -> int:
    """ROME's layer 17 of GPT-2 XL's 48, at the same relative depth of ``model``, and below the last layer: an
    MLP's output at the subject reaches the prompt's last token only through a later layer's attention."""
    return max(0, min(_layers(model) - 2, round(17 / 48 * _layers(model))))


def memit_layers(model) -> list[int]:
    """MEMIT's layers 13-17 of GPT-2 XL's 48 at the same relative depth: ``round(5/48 * depth)`` of them
    (at least two, where there are layers below ROME's), ending at :func:`rome_layer`."""
    top = rome_layer(model)
    n = min(top + 1, max(2, round(5 / 48 * _layers(model))))
    return list(range(top - n + 1, top + 1))


def _matrix(module) -> torch.Tensor:
    """The projection's weight as ``(out, in)``: ``nn.Linear``'s own, a view of ``Conv1D``'s ``(in, out)``."""
    return module.weight if isinstance(module, torch.nn.Linear) else module.weight.T


def _encode(tok, text: str) -> list[int]:
    return [tok.doc_id, *tok.encode_text(text)]  # as every prompt row starts (lmlm.generate.trace.prompt_row)


def subject_last_index(tok, text: str, subject: str) -> int:
    """Position in ``_encode(tok, text)`` of the last token of ``subject``'s first occurrence (ROME's
    ``subject_last`` fact token); the prompt's last token when the subject is not in it."""
    at = text.find(subject)
    n = len(_encode(tok, text))
    if at < 0:
        return n - 1
    end = at + len(subject)
    offsets = tok.hf(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    inside = [i for i, (s, _) in enumerate(offsets) if s < end]
    return 1 + inside[-1] if inside else n - 1


def _target_ids(tok, prompt: str, target: str) -> tuple[list[int], list[int]]:
    """The prompt's ids and the target's as the text goes on (``" " + target``, tokenized with the prompt)."""
    p = _encode(tok, prompt)
    full = _encode(tok, prompt + " " + target)
    if full[:len(p)] != p:  # a merge across the boundary: the target tokenized alone
        return p, tok.encode_text(" " + target)
    return p, full[len(p):]


def _frozen(model):
    for p in model.parameters():
        p.requires_grad_(False)


class _Editor:
    """What both methods share: the edited matrix, a copy to start again from, and the model's device."""

    name = ""

    def __init__(self, model, tok, layer: int):
        if not 0 <= layer < _layers(model):
            raise ValueError(f"layer must be in [0, {_layers(model) - 1}], got {layer}")
        self.model, self.tok, self.layer = model.eval(), tok, layer
        self.module = mlp_projection(model, layer)
        self.device = self.module.weight.device
        self._original = self.module.weight.detach().clone()

    def reset(self) -> None:
        """The matrix as it was before the first edit (each ``--edits`` count starts from the same weights)."""
        with torch.no_grad():
            self.module.weight.copy_(self._original)

    def edit_all(self, requests: Sequence[WeightEdit], progress=None) -> None:
        for r in requests:
            self.edit(r)
            if progress is not None:
                progress()


class FineTuneL(_Editor):
    """FT-L: Adam on one MLP projection's weights, each kept within ``norm`` of its value before the edit.

    Args:
        layer (int, default 0): the layer whose MLP projection is tuned (ROME's FT-L run: 0).
        steps (int, default 25), lr (float, default 5e-4): Adam steps and learning rate per edit.
        norm (float, default 5e-4): the L-infinity bound on each weight's change in one edit.
    """

    name = "ft-l"

    def __init__(self, model, tok, layer: int = 0, steps: int = 25, lr: float = 5e-4, norm: float = 5e-4):
        super().__init__(model, tok, layer)
        if steps < 1 or lr <= 0 or norm <= 0:
            raise ValueError(f"steps, lr and norm must be positive, got {steps}, {lr}, {norm}")
        self.steps, self.lr, self.norm = steps, lr, norm

    def edit(self, req: WeightEdit) -> float:
        """Fine-tune on ``req``; returns the last loss (mean NLL per target token)."""
        prompt_ids, target = _target_ids(self.tok, req.prompt, req.target)
        ids = torch.tensor([prompt_ids + target], device=self.device)
        labels = torch.full_like(ids, -100)
        labels[0, len(prompt_ids):] = torch.tensor(target)
        w = self.module.weight
        start = w.detach().clone()
        _frozen(self.model)
        w.requires_grad_(True)
        opt = torch.optim.Adam([w], lr=self.lr)
        loss = torch.tensor(float("nan"))
        for _ in range(self.steps):
            opt.zero_grad()
            loss = self.model(input_ids=ids, labels=labels).loss
            if loss.item() < 1e-2:  # ROME's early stop
                break
            loss.backward()
            opt.step()
            with torch.no_grad():
                w.copy_(torch.maximum(torch.minimum(w, start + self.norm), start - self.norm))
        w.requires_grad_(False)
        return float(loss.item())


class _Capture:
    """A forward hook on a module (an MLP projection, a decoder block) that records its input and output,
    and can add ``delta`` to its output at given positions (the v* and z searches)."""

    def __init__(self, module):
        self.inputs = self.outputs = None
        self.delta, self.at = None, None
        self.handle = module.register_forward_hook(self)

    def __call__(self, module, args, output):
        hidden = output[0] if isinstance(output, tuple) else output  # a block may return (hidden, ...)
        self.inputs, self.outputs = (args[0] if args else None), hidden
        if self.delta is None:
            return None
        out = hidden.clone()
        rows = torch.arange(out.shape[0], device=out.device)
        out[rows, self.at] = out[rows, self.at] + self.delta
        return (out, *output[1:]) if isinstance(output, tuple) else out

    def close(self):
        self.handle.remove()


def _padded(rows: Sequence[Sequence[int]], pad: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ``(B, T)`` ids and attention mask."""
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), pad, dtype=torch.long, device=device)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(rows):
        ids[i, :len(r)] = torch.tensor(r)
        mask[i, :len(r)] = 1
    return ids, mask


@torch.no_grad()
def _second_moments(model, tok, modules, texts: Sequence[str], max_tokens: int, ridge: float) -> list[torch.Tensor]:
    """``E[k k^T]`` over each module's inputs at every token of ``texts`` (up to ``max_tokens``), ``(in, in)`` in
    float64, plus ``ridge`` times its mean diagonal so it inverts."""
    config = model.config
    context = int(getattr(config, "max_position_embeddings", 0) or getattr(config, "n_positions", 256))
    device = modules[0].weight.device
    caps, totals, n = [_Capture(m) for m in modules], [None] * len(modules), 0
    try:
        for text in texts:
            ids = _encode(tok, text)[:context]
            model(input_ids=torch.tensor([ids], device=device))
            for j, cap in enumerate(caps):
                k = cap.inputs[0].double()  # (T, in)
                totals[j] = k.T @ k if totals[j] is None else totals[j] + k.T @ k
            n += len(ids)
            if n >= max_tokens:
                break
    finally:
        for cap in caps:
            cap.close()
    out = []
    for total in totals:
        c = total / n
        out.append(c + ridge * c.diagonal().mean() * torch.eye(c.shape[0], dtype=c.dtype, device=c.device))
    return out


@torch.no_grad()
def _context_templates(model, tok, n: int, seed: int, device) -> list[list[str]]:
    """``["{}"]`` and ``n`` texts the model writes from a document start (half 5 tokens, half 10), each followed
    by ``". {}"``, grouped by length: ROME's and MEMIT's context templates."""
    torch.manual_seed(seed)
    random.seed(seed)
    out = [["{}"]]
    for length in (5, 10):
        k = n // 2 if length == 5 else n - n // 2
        if k < 1:
            continue
        start = torch.tensor([[tok.doc_id]] * k, device=device)
        gen = model.generate(start, attention_mask=torch.ones_like(start), max_new_tokens=length, do_sample=True,
                             top_k=5, pad_token_id=tok.eos_id, bad_words_ids=[[i] for i in tok.call_ids])
        out.append([tok.hf.decode([i for i in row if i not in (tok.eos_id, tok.doc_id)])
                    .replace("{", "").replace("}", "").strip() + ". {}" for row in gen[:, 1:].tolist()])
    return out


@torch.no_grad()
def _at_subject(model, tok, module, texts: Sequence[str], subjects: Sequence[str],
                batch_size: int = 32) -> tuple[torch.Tensor | None, torch.Tensor]:
    """``module``'s input ``(N, in)`` and output ``(N, out)`` at the subject's last token of each text, batched
    (right-padded: a row's tokens see only the tokens before them)."""
    device = next(model.parameters()).device
    ins, outs, cap = [], [], _Capture(module)
    try:
        for s in range(0, len(texts), batch_size):
            chunk = list(zip(texts[s:s + batch_size], subjects[s:s + batch_size]))
            ids, mask = _padded([_encode(tok, t) for t, _ in chunk], tok.eos_id, device)
            model(input_ids=ids, attention_mask=mask)
            rows = torch.arange(len(chunk), device=device)
            at = torch.tensor([subject_last_index(tok, t, subj) for t, subj in chunk], device=device)
            if cap.inputs is not None:
                ins.append(cap.inputs[rows, at].clone())
            outs.append(cap.outputs[rows, at].clone())
    finally:
        cap.close()
    return (torch.cat(ins) if ins else None), torch.cat(outs)


@dataclass(frozen=True)
class _Search:
    """The output search's settings (ROME's and MEMIT's ``compute_v`` / ``compute_z``)."""

    steps: int
    lr: float
    kl_factor: float
    weight_decay: float
    clamp: float  # the added vector's norm at most this times the output's


def _optimise_output(model, tok, module, req: WeightEdit, templates: Sequence[str], v_init: torch.Tensor,
                     search: _Search) -> tuple[torch.Tensor, float]:
    """The output of ``module`` at the subject's last token that makes ``req.target`` likely after the prompt
    behind each template, the subject's ``"{} is a"`` next-token distribution kept; returns it and the last NLL."""
    device = v_init.device
    rows, at, labels = [], [], []
    for p in templates:
        text = p.format(req.prompt)
        prompt_ids, target = _target_ids(tok, text, req.target)
        rows.append(prompt_ids + target)
        at.append(subject_last_index(tok, text, req.subject))
        labels.append([-100] * len(prompt_ids) + target)
    kl_text = f"{req.subject} is a"
    rows.append(_encode(tok, kl_text))
    at.append(subject_last_index(tok, kl_text, req.subject))
    labels.append([-100] * len(rows[-1]))
    ids, mask = _padded(rows, tok.eos_id, device)
    lab, _ = _padded(labels, -100, device)
    _frozen(model)
    delta = torch.zeros_like(v_init, requires_grad=True)
    opt = torch.optim.Adam([delta], lr=search.lr)
    cap, kl_init, nll = _Capture(module), None, torch.tensor(float("nan"))
    cap.at = torch.tensor(at, device=device)
    try:
        for step in range(search.steps):
            cap.delta = delta
            logits = model(input_ids=ids, attention_mask=mask).logits  # (B, T, vocab)
            kl_logp = F.log_softmax(logits[-1, at[-1]].float(), -1)
            if kl_init is None:
                kl_init = kl_logp.detach()
            nll = F.cross_entropy(logits[:-1, :-1].flatten(0, 1).float(), lab[:-1, 1:].flatten(), ignore_index=-100)
            kl = F.kl_div(kl_init, kl_logp, log_target=True, reduction="sum")  # KL(now || before), as ROME
            loss = nll + search.kl_factor * kl + search.weight_decay * delta.norm() / v_init.norm() ** 2
            if loss.item() < 5e-2 or step == search.steps - 1:
                break
            opt.zero_grad()
            loss.backward()
            opt.step()
            with torch.no_grad():
                bound = search.clamp * v_init.norm()
                if delta.norm() > bound:
                    delta.mul_(bound / delta.norm())
    finally:
        cap.close()
    return (v_init + delta).detach(), float(nll.item())


class Rome(_Editor):
    """ROME: one rank-one update of one MLP projection per edit (see the module docstring).

    Args:
        texts: a sample of text the keys' second moment ``C`` is estimated from (the world's documents).
        layer (int, optional): the edited layer (default :func:`rome_layer`).
        steps (int, default 20), lr (float, default 0.5): the v* search's Adam steps and learning rate.
        kl_factor (float, default 0.0625), weight_decay (float, default 0.5), clamp (float, default 4.0):
            ROME's KL weight, decay of the added vector and bound on its norm (times the output's).
        max_tokens (int, default 100_000): tokens of ``texts`` read for ``C`` (ROME: 100,000 samples).
        n_prefixes (int, default 10): prefixes the model writes (half 5, half 10 tokens) behind which the
            edit prompt is read too, for the averaged key and the v* search (ROME: 20).
        seed (int, default 0): the prefixes' sampling.
        ridge (float, default 1e-6): added to ``C``'s diagonal, times its mean: a second moment estimated from
            fewer tokens than ROME's 100,000 is ill-conditioned, and its inverse then sends the update
            along directions the subject's key barely has.
    """

    name = "rome"

    def __init__(self, model, tok, texts: Sequence[str], layer: int | None = None, steps: int = 20, lr: float = 0.5,
                 kl_factor: float = 0.0625, weight_decay: float = 0.5, clamp: float = 4.0, max_tokens: int = 100_000,
                 n_prefixes: int = 10, seed: int = 0, ridge: float = 1e-6):
        super().__init__(model, tok, rome_layer(model) if layer is None else layer)
        if not texts:
            raise ValueError("ROME needs a sample of text for the keys' second moment")
        self.search = _Search(steps, lr, kl_factor, weight_decay, clamp)
        self.ridge = ridge
        self.inv_cov = torch.linalg.inv(self.second_moment(texts, max_tokens))
        self.prefixes = [t for group in _context_templates(model, tok, n_prefixes, seed, self.device) for t in group]

    def second_moment(self, texts: Sequence[str], max_tokens: int) -> torch.Tensor:
        """``E[k k^T]`` over the projection's inputs at every token of ``texts`` (up to ``max_tokens``),
        ``(in, in)`` in float64, plus ``ridge`` times its mean diagonal so it inverts."""
        return _second_moments(self.model, self.tok, [self.module], texts, max_tokens, self.ridge)[0]

    @torch.no_grad()
    def key(self, text: str, subject: str) -> tuple[torch.Tensor, torch.Tensor]:
        """The projection's input and output ``(in,)``, ``(out,)`` at the subject's last token of ``text``."""
        k, v = _at_subject(self.model, self.tok, self.module, [text], [subject])
        return k[0], v[0]

    def edit(self, req: WeightEdit) -> dict:
        """Insert ``req``; returns ``{"k": k*, "v": v*, "loss": the v* search's last NLL}``: after the
        update the projection maps ``k*`` to ``v*``."""
        keys, _ = _at_subject(self.model, self.tok, self.module, [p.format(req.prompt) for p in self.prefixes],
                              [req.subject] * len(self.prefixes))
        u = (self.inv_cov @ keys.mean(0).double()).float()
        u = u / u.norm()
        k_star, v_init = self.key(req.prompt, req.subject)
        v_star, loss = _optimise_output(self.model, self.tok, self.module, req, self.prefixes, v_init, self.search)
        with torch.no_grad():  # W' k* = W k* + (v* - W k*) (u . k*) / (u . k*) = v*
            _matrix(self.module).add_(torch.outer((v_star - v_init) / torch.dot(k_star, u), u))  # (out, in)
        return {"k": k_star, "v": v_star, "loss": loss}


class Memit(_Editor):
    """MEMIT: a batch of edits spread over the MLP projections of a few consecutive layers (see the module
    docstring); :meth:`edit_all` puts a count's edits in as one batch.

    Args:
        texts: a sample of text the keys' second moment ``C`` is estimated from (the world's documents).
        layers (list of int, optional): the edited layers (default :func:`memit_layers`); the top one is
            where the targets ``z`` are set.
        steps (int, default 20), lr (float, default 0.5), kl_factor (float, default 0.0625),
            weight_decay (float, default 0.5), clamp (float, default 0.75): the z search (MEMIT's GPT-2 XL
            settings; ``clamp`` bounds the added vector's norm, times the residual stream's).
        update_weight (float, optional): ``lambda``, the weight of the text's keys against the edits' (default
            ``20,000 / 6,400`` times the key dimensions: GPT-2 XL's 20,000 at the model's size).
        max_tokens (int, default 100_000), n_prefixes (int, default 10), seed (int, default 0),
            ridge (float, default 1e-6): as :class:`Rome`'s.
    """

    name = "memit"

    def __init__(self, model, tok, texts: Sequence[str], layers: Sequence[int] | None = None, steps: int = 20,
                 lr: float = 0.5, kl_factor: float = 0.0625, weight_decay: float = 0.5, clamp: float = 0.75,
                 update_weight: float | None = None, max_tokens: int = 100_000, n_prefixes: int = 10, seed: int = 0,
                 ridge: float = 1e-6):
        layers = sorted(set(memit_layers(model) if layers is None else layers))
        if not layers or not all(0 <= x < _layers(model) for x in layers):
            raise ValueError(f"layers must be in [0, {_layers(model) - 1}], got {layers}")
        super().__init__(model, tok, layers[-1])
        if not texts:
            raise ValueError("MEMIT needs a sample of text for the keys' second moment")
        if update_weight is not None and update_weight <= 0:
            raise ValueError(f"update_weight must be positive, got {update_weight}")
        self.layers = layers
        self.search = _Search(steps, lr, kl_factor, weight_decay, clamp)
        self.modules = [mlp_projection(model, x) for x in layers]
        keys_dim = _matrix(self.modules[0]).shape[1]
        self.update_weight = 20_000 / 6_400 * keys_dim if update_weight is None else update_weight
        self._originals = [m.weight.detach().clone() for m in self.modules]
        self.block = decoder_block(model, layers[-1])
        self.covs = _second_moments(model, tok, self.modules, texts, max_tokens, ridge)
        self.groups = _context_templates(model, tok, n_prefixes, seed, self.device)

    def reset(self) -> None:
        with torch.no_grad():
            for module, w in zip(self.modules, self._originals):
                module.weight.copy_(w)

    def edit(self, req: WeightEdit) -> dict:
        return self.edit_batch([req])

    def edit_all(self, requests: Sequence[WeightEdit], progress=None) -> None:
        self.edit_batch(requests, progress)

    def _keys(self, module, requests: Sequence[WeightEdit]) -> torch.Tensor:
        """``(N, in)``: the projection's input at the subject, averaged over each group of templates, then
        over the groups (MEMIT's ``compute_ks``)."""
        means = []
        for group in self.groups:
            texts = [t.format(r.prompt) for r in requests for t in group]
            k, _ = _at_subject(self.model, self.tok, module, texts, [r.subject for r in requests for _ in group])
            means.append(k.view(len(requests), len(group), -1).mean(1))
        return torch.stack(means).mean(0)

    def edit_batch(self, requests: Sequence[WeightEdit], progress=None) -> dict:
        """Insert ``requests`` at once; returns ``{"z": the targets (N, hidden), "keys": {layer: K (N, in)},
        "residuals": {layer: R (N, out)}}``: each layer's update maps its keys ``K`` to ``W K + R`` (up to the
        weight ``lambda C`` keeps on the text's keys), and after the top layer's the residual stream there
        reaches ``z``."""
        prompts, subjects = [r.prompt for r in requests], [r.subject for r in requests]
        templates = [t for group in self.groups for t in group]
        _, z_init = _at_subject(self.model, self.tok, self.block, prompts, subjects)  # (N, hidden)
        zs = []
        for r, v in zip(requests, z_init):
            zs.append(_optimise_output(self.model, self.tok, self.block, r, templates, v, self.search)[0])
            if progress is not None:
                progress()
        z = torch.stack(zs)
        out = {"z": z, "keys": {}, "residuals": {}}
        for i, (layer, module, cov) in enumerate(zip(self.layers, self.modules, self.covs)):
            keys = self._keys(module, requests).double()  # (N, in)
            _, now = _at_subject(self.model, self.tok, self.block, prompts, subjects)
            resid = (z - now).double() / (len(self.layers) - i)  # (N, out): the rest spread over the layers left
            adj = torch.linalg.solve(self.update_weight * cov + keys.T @ keys, keys.T)  # (in, N)
            with torch.no_grad():
                _matrix(module).add_((resid.T @ adj.T).to(module.weight.dtype))  # (out, in)
            out["keys"][layer], out["residuals"][layer] = keys.float(), resid.float()
        return out
