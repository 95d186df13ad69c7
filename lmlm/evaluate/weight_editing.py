"""The knowledge-editing field's own methods, which change a model's weights: FT-L and ROME.

They are the baselines ``lmlm eval editing --method ft-l|rome`` sets beside an LMLM's KB edit, run on a
Standard model (the same architecture trained without calls). Both change one matrix, the output
projection of one layer's MLP (GPT-2's ``mlp.c_proj``, LLaMA's ``mlp.down_proj``), edit after edit
(sequential editing: each edit starts from the weights the previous one left):

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
  layer is ROME's 17 of GPT-2 XL's 48 scaled to the model's depth. No maintained ROME package
  installs from PyPI (``rome`` there is a Roman-numerals library; ``easyedit`` a placeholder), so this
  is the project's own implementation of the paper's method, tested on that property.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

__all__ = ["WeightEdit", "FineTuneL", "Rome", "mlp_projection", "subject_last_index", "rome_layer"]


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


def _layers(model) -> int:
    return int(model.config.num_hidden_layers)


def rome_layer(model) -> int:
    """ROME's layer 17 of GPT-2 XL's 48, at the same relative depth of ``model``, and below the last layer: an
    MLP's output at the subject reaches the prompt's last token only through a later layer's attention."""
    return max(0, min(_layers(model) - 2, round(17 / 48 * _layers(model))))


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
    """A forward hook on the projection that records its input and output, and can add ``delta`` to its
    output at given positions (the v* search)."""

    def __init__(self, module):
        self.inputs = self.outputs = None
        self.delta, self.at = None, None
        self.handle = module.register_forward_hook(self)

    def __call__(self, module, args, output):
        self.inputs, self.outputs = args[0], output
        if self.delta is None:
            return None
        out = output.clone()
        rows = torch.arange(out.shape[0], device=out.device)
        out[rows, self.at] = out[rows, self.at] + self.delta
        return out

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
        self.steps, self.lr, self.kl_factor, self.weight_decay, self.clamp = steps, lr, kl_factor, weight_decay, clamp
        self.ridge = ridge
        self.inv_cov = torch.linalg.inv(self.second_moment(texts, max_tokens))
        self.prefixes = self._prefixes(n_prefixes, seed)

    @torch.no_grad()
    def second_moment(self, texts: Sequence[str], max_tokens: int) -> torch.Tensor:
        """``E[k k^T]`` over the projection's inputs at every token of ``texts`` (up to ``max_tokens``),
        ``(in, in)`` in float64, plus ``ridge`` times its mean diagonal so it inverts."""
        context = int(getattr(self.model.config, "max_position_embeddings", 0) or getattr(self.model.config, "n_positions", 256))
        cap, total, n = _Capture(self.module), None, 0
        try:
            for text in texts:
                ids = _encode(self.tok, text)[:context]
                self.model(input_ids=torch.tensor([ids], device=self.device))
                k = cap.inputs[0].double()  # (T, in)
                total = k.T @ k if total is None else total + k.T @ k
                n += len(ids)
                if n >= max_tokens:
                    break
        finally:
            cap.close()
        c = total / n
        return c + self.ridge * c.diagonal().mean() * torch.eye(c.shape[0], dtype=c.dtype, device=c.device)

    @torch.no_grad()
    def _prefixes(self, n: int, seed: int) -> list[str]:
        """``"{}"`` and ``n`` texts the model writes from a document start (half 5 tokens, half 10), each
        followed by ``". {}"``: ROME's context templates."""
        torch.manual_seed(seed)
        random.seed(seed)
        out = ["{}"]
        for length in (5, 10):
            k = n // 2 if length == 5 else n - n // 2
            if k < 1:
                continue
            start = torch.tensor([[self.tok.doc_id]] * k, device=self.device)
            gen = self.model.generate(start, attention_mask=torch.ones_like(start), max_new_tokens=length,
                                      do_sample=True, top_k=5,
                                      pad_token_id=self.tok.eos_id, bad_words_ids=[[i] for i in self.tok.call_ids])
            for row in gen[:, 1:].tolist():
                text = self.tok.hf.decode([i for i in row if i not in (self.tok.eos_id, self.tok.doc_id)])
                out.append(text.replace("{", "").replace("}", "").strip() + ". {}")
        return out

    @torch.no_grad()
    def key(self, text: str, subject: str) -> tuple[torch.Tensor, torch.Tensor]:
        """The projection's input and output ``(in,)``, ``(out,)`` at the subject's last token of ``text``."""
        cap = _Capture(self.module)
        try:
            at = subject_last_index(self.tok, text, subject)
            self.model(input_ids=torch.tensor([_encode(self.tok, text)], device=self.device))
            return cap.inputs[0, at].detach().clone(), cap.outputs[0, at].detach().clone()
        finally:
            cap.close()

    def edit(self, req: WeightEdit) -> dict:
        """Insert ``req``; returns ``{"k": k*, "v": v*, "loss": the v* search's last NLL}``: after the
        update the projection maps ``k*`` to ``v*``."""
        k_mean = torch.stack([self.key(p.format(req.prompt), req.subject)[0] for p in self.prefixes]).mean(0)
        u = (self.inv_cov @ k_mean.double()).float()
        u = u / u.norm()
        k_star, v_init = self.key(req.prompt, req.subject)
        v_star, loss = self._target_value(req, v_init)
        with torch.no_grad():  # W' k* = W k* + (v* - W k*) (u . k*) / (u . k*) = v*
            _matrix(self.module).add_(torch.outer((v_star - v_init) / torch.dot(k_star, u), u))  # (out, in)
        return {"k": k_star, "v": v_star, "loss": loss}

    def _target_value(self, req: WeightEdit, v_init: torch.Tensor) -> tuple[torch.Tensor, float]:
        """v*: the projection's output at the subject's last token that makes ``req.target`` likely after
        the prompt behind each prefix, the subject's ``"{} is a"`` distribution kept (ROME's compute_v)."""
        rows, at, labels = [], [], []
        for p in self.prefixes:
            text = p.format(req.prompt)
            prompt_ids, target = _target_ids(self.tok, text, req.target)
            rows.append(prompt_ids + target)
            at.append(subject_last_index(self.tok, text, req.subject))
            labels.append([-100] * len(prompt_ids) + target)
        kl_text = f"{req.subject} is a"
        rows.append(_encode(self.tok, kl_text))
        at.append(subject_last_index(self.tok, kl_text, req.subject))
        labels.append([-100] * len(rows[-1]))
        ids, mask = _padded(rows, self.tok.eos_id, self.device)
        lab, _ = _padded(labels, -100, self.device)
        at_t = torch.tensor(at, device=self.device)
        _frozen(self.model)
        delta = torch.zeros_like(v_init, requires_grad=True)
        opt = torch.optim.Adam([delta], lr=self.lr)
        cap, kl_init, nll = _Capture(self.module), None, torch.tensor(float("nan"))
        cap.at = at_t
        try:
            for step in range(self.steps):
                cap.delta = delta
                logits = self.model(input_ids=ids, attention_mask=mask).logits  # (B, T, vocab)
                kl_logp = F.log_softmax(logits[-1, at[-1]].float(), -1)
                if kl_init is None:
                    kl_init = kl_logp.detach()
                nll = F.cross_entropy(logits[:-1, :-1].flatten(0, 1).float(), lab[:-1, 1:].flatten(), ignore_index=-100)
                kl = F.kl_div(kl_init, kl_logp, log_target=True, reduction="sum")  # KL(now || before), as ROME
                loss = nll + self.kl_factor * kl + self.weight_decay * delta.norm() / v_init.norm() ** 2
                if loss.item() < 5e-2 or step == self.steps - 1:
                    break
                opt.zero_grad()
                loss.backward()
                opt.step()
                with torch.no_grad():
                    bound = self.clamp * v_init.norm()
                    if delta.norm() > bound:
                        delta.mul_(bound / delta.norm())
        finally:
            cap.close()
        return (v_init + delta).detach(), float(nll.item())
