"""The training recipe: one dataclass that checks itself and is written next to every run."""

from __future__ import annotations

import importlib.util

import json
import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from ..errors import LmlmError

__all__ = ["TrainConfig", "TrainConfigError", "CONFIG_FIELDS_HELP", "TRAIN_PRESETS"]


class TrainConfigError(LmlmError, ValueError):
    """A training recipe that cannot run; the message names the field and the value."""


@dataclass
class TrainConfig:
    """Everything that defines a pretraining run; the resolved copy is written to ``out_dir``.

    Args:
        mode: ``"lmlm"`` (text with lookup calls, values masked) or ``"standard"`` (stripped text).
        model: a preset name from ``MODEL_PRESETS`` (trained from scratch); ``model_overrides``
            changes single fields. Ignored when ``init_from`` names a pretrained model (its own
            architecture is used). ``None``: ``gpt2-small-cpu``.
        tokenizer: a tokenizer folder/file/hub name, or ``"bpe:N"`` to train an N-token byte-level
            BPE on the stripped training text. ``None``: the ``init_from`` model's own tokenizer,
            else ``bpe:8192``.
        data, eval_data: documents (any format of :mod:`lmlm.corpus`) or a token-shards folder
            (``lmlm data prepare``); used when :func:`lmlm.train.train` is given no documents.
        split: the documents of ``data`` trained on: ``None`` or ``"train"``, those of split ``train``
            and those without a split (held-out and test documents are left out, and counted in
            ``summary.json``); another name, the documents of that split. Shards hold the split
            they were prepared with (``lmlm data prepare --split``).
        kb: the knowledge base the corpus was annotated against, recorded in the checkpoint.
        init_from: weights to start from: an lmlm checkpoint folder, a Hugging Face model folder, a
            hub name (a local copy first) or a ``.gguf`` file. A pretrained model gets the four
            lookup tokens added to its tokenizer and embeddings (see :mod:`lmlm.pretrained`).
        seq_len: tokens per packed block (at most the model's context length); ``None``: 256 or the
            model's context length if shorter.
        batch_size: global batch in sequences per optimizer step (all processes together).
            ``None``: ``max_tokens_per_step // seq_len`` if that is set, else
            ``micro_batch_size * grad_accum * num_processes``.
        max_tokens_per_step: the global batch in tokens (``batch_size = max_tokens_per_step // seq_len``).
        micro_batch_size: sequences per forward pass on each process.
        grad_accum: micro-steps per optimizer step; ``None``: derived from ``batch_size``.
        lr, min_lr_ratio, warmup_steps, schedule: peak learning rate, floor as a fraction of it,
            linear warmup steps, and ``"cosine"``, ``"linear"`` or ``"constant"`` after warmup.
        weight_decay, betas, grad_clip: AdamW (decay on matrices only) and gradient-norm clipping.
        max_steps: optimizer steps; ``None``: ``epochs`` passes over the blocks (1 if both unset).
        max_seconds: stop (and save state) once this much time has passed in this invocation.
        stop_step: stop (and save state) at this step; the schedule still runs to ``max_steps``.
        seed: model initialisation and block shuffle.
        eval_every: evaluate on the eval documents every this many steps (0: only at the end).
        save_every: save the training state every this many steps (0: only at the end/stop).
        log_every: write a line (loss, lr, tokens/s, MFU) to ``train_log.jsonl`` every this many steps.
        out_dir: run folder (config, log, ``summary.json``, ``state/``, ``checkpoint/``).
        resume: continue from ``out_dir/state`` if it exists.
        precision: ``"no"``, ``"bf16"`` or ``"fp16"`` (autocast mixed precision), or ``"auto"``:
            bf16 on a GPU that has it and on a CPU with native bf16 (AVX512-BF16 or AMX), else ``"no"``.
        cpu: train on CPU even if a GPU is present.
        threads: torch intra-op threads per process (default: cores / processes on this machine).
        compile: ``torch.compile`` the model and loss. ``None`` (auto): on for CUDA, off on a CPU
            (20-50 s of compilation there for little gain).
        vocab_multiple: pad the embedding (and output head) to a multiple of this many rows while
            training, so the largest matrix product gets tensor-core friendly shapes (GPT-2's 50,261 ->
            50,304); the rows are never targets and are cut off again in the saved checkpoint.
            ``None`` (auto): 64 on CUDA, none on a CPU; 1: no padding.
        attention: the Hugging Face attention kernel: ``"sdpa"`` (PyTorch's fused attention, flash
            kernels on a GPU) or ``"eager"``.
        grad_checkpointing: recompute activations in the backward pass (less memory, ~30% slower).
        packing: ``"stream"`` (the paper's: documents concatenated and cut into blocks) or
            ``"document"`` (every document starts a block of its own, the rest padded: no other
            document before it, as a prompt at generation; for corpora of short documents, and
            only for documents, not shards), or ``"fit"`` (the same without the padding: short
            documents share blocks whole, each one's positions starting at 0 and attention kept
            within it; :func:`lmlm.train.data.pack`). With ``"fit"`` each document ends with the
            tokenizer's end token as a target, so that the model learns where a text may stop.
        lora: train a LoRA adapter of this rank (PEFT) on every linear layer of a pretrained
            ``init_from`` model instead of all its weights, the four lookup tokens' embedding rows
            trained as well; merged into the weights when the checkpoint is saved, so it loads as a
            plain model. 0: full fine-tuning.
        lora_alpha: the adapter's scale numerator (``None``: twice the rank).
        freeze_layers: leave the lowest this many transformer layers untouched (no adapter there
            with ``lora``, no weight updates without): their weight gradients are never computed.
        report_to: Accelerate trackers to log to as well (``tensorboard``, ``wandb``, ``all``); the
            JSONL log is always written.
        allow_no_calls: train in ``lmlm`` mode on documents without a single lookup call (an error
            otherwise: such a run learns no lookups at all).
        skip_malformed: leave out the documents holding a malformed lookup call (counted in
            ``summary.json`` and on stderr); by default such a document stops the run, named by
            ``FILE:LINE`` with the reason, since its broken call would be trained as stray lookup
            tokens (or, for the Standard baseline, as text).
        progress: show a progress bar.
    """

    mode: str = "lmlm"
    model: str | None = None
    model_overrides: dict[str, Any] = field(default_factory=dict)
    tokenizer: str | None = None
    data: str | None = None
    eval_data: str | None = None
    split: str | None = None
    kb: str | None = None
    init_from: str | None = None
    seq_len: int | None = None
    batch_size: int | None = None
    max_tokens_per_step: int | None = None
    micro_batch_size: int = 16
    grad_accum: int | None = None
    lr: float = 1e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 100
    schedule: str = "cosine"
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float = 1.0
    max_steps: int | None = None
    epochs: float | None = None
    max_seconds: float | None = None
    stop_step: int | None = None
    seed: int = 0
    eval_every: int = 0
    save_every: int = 0
    log_every: int = 10
    out_dir: str = "runs/train"
    resume: bool = False
    precision: str = "no"
    cpu: bool = False
    threads: int | None = None
    compile: bool | None = None
    vocab_multiple: int | None = None
    attention: str = "sdpa"
    grad_checkpointing: bool = False
    packing: str = "stream"
    lora: int = 0
    lora_alpha: int | None = None
    freeze_layers: int = 0
    report_to: list[str] = field(default_factory=list)
    allow_no_calls: bool = False
    skip_malformed: bool = False
    progress: bool = True

    def __post_init__(self) -> None:
        self.betas = tuple(self.betas) if isinstance(self.betas, (list, tuple)) else self.betas
        if isinstance(self.report_to, str):
            self.report_to = [self.report_to] if self.report_to else []
        self.report_to = list(self.report_to)
        self.validate()

    def validate(self) -> None:
        """Check every field; raise :class:`TrainConfigError` naming the first bad one."""
        def bad(name: str, why: str):
            raise TrainConfigError(f"train config field {name!r} = {getattr(self, name)!r}: {why}")

        choices = {"mode": ("lmlm", "standard"), "schedule": ("cosine", "linear", "constant"),
                   "precision": ("no", "bf16", "fp16", "auto"), "attention": ("sdpa", "eager"),
                   "packing": ("stream", "document", "fit")}
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                bad(name, f"must be one of {', '.join(allowed)}")
        for name in ("micro_batch_size", "log_every"):
            v = getattr(self, name)
            if not _is_int(v) or v <= 0:
                bad(name, "must be a positive integer")
        for name in ("seq_len", "batch_size", "grad_accum", "max_steps", "max_tokens_per_step", "stop_step",
                     "threads", "vocab_multiple", "lora_alpha"):
            v = getattr(self, name)
            if v is not None and (not _is_int(v) or v <= 0):
                bad(name, "must be a positive integer or null")
        for name in ("warmup_steps", "eval_every", "save_every", "seed", "lora", "freeze_layers"):
            v = getattr(self, name)
            if not _is_int(v) or v < 0:
                bad(name, "must be a non-negative integer")
        for name in ("lr", "epochs", "max_seconds"):
            v = getattr(self, name)
            if (v is not None or name == "lr") and (not _is_number(v) or not v > 0):
                bad(name, "must be a positive number" + ("" if name == "lr" else " or null"))
        for name in ("min_lr_ratio",):
            if not _is_number(self.min_lr_ratio) or not 0 <= self.min_lr_ratio <= 1:
                bad(name, "must be between 0 and 1")
        for name in ("weight_decay", "grad_clip"):
            v = getattr(self, name)
            if not _is_number(v) or v < 0:
                bad(name, "must be a non-negative number")
        if len(self.betas) != 2 or not all(_is_number(b) and 0 <= b < 1 for b in self.betas):
            bad("betas", "must be two numbers in [0, 1)")
        for name in ("resume", "cpu", "grad_checkpointing", "allow_no_calls", "skip_malformed", "progress"):
            if not isinstance(getattr(self, name), bool):
                bad(name, "must be true or false")
        if self.compile is not None and not isinstance(self.compile, bool):
            bad("compile", "must be true, false or null (auto)")
        if not isinstance(self.model_overrides, dict):
            bad("model_overrides", "must be an object of model fields")
        for name in ("model", "tokenizer", "data", "eval_data", "split", "kb", "init_from", "out_dir"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, str) or not v.strip()):
                bad(name, "must be a non-empty string" + ("" if name == "out_dir" else " or null"))
        if self.tokenizer and self.tokenizer.startswith("bpe:"):
            n = self.tokenizer[4:]
            if not n.isdigit() or not 16 <= int(n) <= 1_000_000:
                bad("tokenizer", "'bpe:N' needs a vocabulary size N between 16 and 1000000")
        known = {"tensorboard", "wandb", "all", "comet_ml", "mlflow", "aim", "clearml", "dvclive", "swanlab",
                 "trackio"}
        for t in self.report_to:
            if t not in known:
                raise TrainConfigError(f"train config field 'report_to' = {self.report_to!r}: unknown tracker "
                                       f"{t!r}; known: {', '.join(sorted(known))}")
            if t != "all" and importlib.util.find_spec(t) is None:  # Accelerate would only warn, and log nowhere
                raise TrainConfigError(f"report_to {t}: the {t} package is not installed: pip install {t}")
        if self.lora and not self.init_from:
            raise TrainConfigError(f"train config: lora {self.lora} adapts a pretrained model; give init_from "
                                   "(a fresh model trains all its weights)")
        if self.max_steps is not None and self.epochs is not None:
            raise TrainConfigError("train config: give max_steps or epochs, not both")
        if self.batch_size is not None and self.max_tokens_per_step is not None:
            raise TrainConfigError("train config: give batch_size or max_tokens_per_step, not both")

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str = "train config") -> "TrainConfig":
        if not isinstance(d, dict):
            raise TrainConfigError(f"{where}: expected a JSON object of TrainConfig fields")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise TrainConfigError(f"{where}: unknown field(s) {', '.join(map(repr, unknown))}; known: "
                                   f"{', '.join(sorted(known))}")
        try:
            return cls(**d)
        except TypeError as e:
            raise TrainConfigError(f"{where}: {e}") from None

    @classmethod
    def from_name(cls, name: str, **overrides: Any) -> "TrainConfig":
        """A preset of :data:`TRAIN_PRESETS` with ``overrides`` on top."""
        if name not in TRAIN_PRESETS:
            raise TrainConfigError(f"unknown train preset {name!r}; known: {', '.join(sorted(TRAIN_PRESETS))}")
        return cls.from_dict({**TRAIN_PRESETS[name], **overrides}, where=f"train preset {name!r}")

    @classmethod
    def from_file(cls, path: str | Path) -> "TrainConfig":
        """Read a config file: a TrainConfig JSON, or the ``train_config.json`` a run wrote (its ``train`` part)."""
        path = Path(path)
        if not path.exists():
            raise TrainConfigError(f"{path}: no such config file")
        if path.is_dir():
            raise TrainConfigError(f"{path}: is a folder, not a config file")
        try:
            d = json.loads(path.read_text(encoding="utf-8"))
        except UnicodeDecodeError:
            raise TrainConfigError(f"{path}: not UTF-8 text") from None
        except ValueError as e:
            raise TrainConfigError(f"{path}: not JSON: {e}") from None
        if isinstance(d, dict) and "train" in d and isinstance(d["train"], dict) and "model" in d:
            d = d["train"]  # a run folder's resolved train_config.json
        return cls.from_dict(d, where=str(path))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def replace(self, **changes: Any) -> "TrainConfig":
        return TrainConfig(**{**self.to_dict(), **changes})


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


CONFIG_FIELDS_HELP = TrainConfig.__doc__

_ONE_CORE_TINY = dict(model="gpt2-tiny", packing="document", micro_batch_size=16, batch_size=16, weight_decay=0.0,
                      precision="no", cpu=True, threads=1, compile=False, progress=False, log_every=50)
TRAIN_PRESETS: dict[str, dict[str, Any]] = {
    # lmlm serve --demo: a 2-layer GPT-2 on forty people's short biographies, seconds on one core
    "demo": dict(_ONE_CORE_TINY, model_overrides=dict(context_length=256), seq_len=64, lr=3e-3, warmup_steps=10,
                 max_steps=250),
    # the test suite's tiny models: the same, with the context and width each test asks for
    "tiny-test": dict(_ONE_CORE_TINY, seq_len=128, lr=3e-3, warmup_steps=10, max_steps=300),
}
"""Training runs as data: ``TrainConfig.from_name("demo", out_dir=...)``."""
