"""Reproduction presets, as data: how big each stage of ``lmlm reproduce`` is.

``cpu`` fits a 2-core CPU in under two hours; ``tiny`` (a few minutes) is what the tests run.
A preset is a recipe of :mod:`lmlm.recipe` (a row here or a TOML file, ``--set key=value`` on top);
a run writes its resolved config to ``OUT/config.json``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Iterable

from ..recipe import from_preset

__all__ = ["ReproduceConfig", "REPRODUCE_PRESETS"]


@dataclass
class ReproduceConfig:
    """One reproduction run.

    Args:
        bios: the quickstart preset of the biography world and its LMLM / Standard pair;
            ``bios_overrides`` changes single fields (``lmlm.quickstart.QuickstartConfig``).
        n_trex, n_popqa, n_factscore, n_nlu: items of each protocol written from the world.
        nlu_data: an extra BIG-bench multiple-choice file (e.g. Social IQa), scored for both models.
        max_new_tokens, factscore_tokens: generated tokens for T-REx / PopQA and for biographies.
        batch_size: generation and scoring batch.
        rag_k, rag_passage_words: BM25 passages per prompt and their length in words.
        rag_reader_fraction: share of the training documents the RAG reader (a Standard model trained
            like the others) sees with retrieved passages prepended; 0 trains no reader.
        seeds: seeds of the LMLM / Standard pair for the margins that need a spread (the first is
            ``seed``, the biography run's; the others train a pair each).
        offload_ratios: offloading ratios; 0 and 1 reuse the Standard and LMLM models, every other
            ratio trains one model like them.
        offload_tokens: tokens after each call whose loss difference ranks the facts (paper: 5).
        tofu: ``lmlm.worlds.tofu.TofuConfig`` fields; ``tofu_forget`` the forget split evaluated;
            ``tofu_real_people`` people of the biography world asked about as "real authors".
        tofu_epochs, tofu_lr, tofu_batch_size, tofu_seq_len: fine-tuning on TOFU from the
            biography checkpoints (the paper's warm-up then fine-tuning; 5 epochs as TOFU).
        unlearn: ``lmlm.evaluate.unlearn.UnlearnConfig`` fields shared by the training-based
            methods; ``unlearn_methods`` the methods run; ``unlearn_seeds`` one run per seed.
        tofu_seeds: seeds of the LMLM's TOFU fine-tuning (full and retain models): forget quality
            after the KB delete per seed, and the null (two retain models of different seeds).
        tofu_max_new_tokens: generated tokens per TOFU answer (ROUGE-L).
        threads: torch threads (None: one per core).
    """

    name: str = "cpu"
    bios: str = "default"
    bios_overrides: dict[str, Any] = field(default_factory=dict)
    n_trex: int | None = 400
    n_popqa: int | None = 400
    n_factscore: int | None = 50
    n_nlu: int | None = 300
    nlu_data: str | None = None
    max_new_tokens: int = 24
    factscore_tokens: int = 128
    batch_size: int = 32
    rag_k: int = 4
    rag_passage_words: int = 30
    rag_reader_fraction: float = 0.5
    seeds: tuple[int, ...] = (0, 1, 2)
    offload_ratios: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 0.9, 1.0)
    offload_tokens: int = 5
    tofu: dict[str, Any] = field(default_factory=lambda: dict(questions_per_relation=2, n_retain_perturbed=60))
    tofu_forget: str = "forget05"
    tofu_real_people: int = 20
    tofu_epochs: float = 5.0
    tofu_lr: float = 1e-3
    tofu_batch_size: int = 8
    tofu_seq_len: int = 128
    unlearn: dict[str, Any] = field(default_factory=lambda: dict(steps=30, lr=2e-4, batch_size=8, eval_every=5))
    unlearn_methods: tuple[str, ...] = ("npo", "ga")
    unlearn_seeds: tuple[int, ...] = (0,)
    tofu_seeds: tuple[int, ...] = (0, 1, 2)
    tofu_max_new_tokens: int = 40
    threads: int | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        self.offload_ratios = tuple(float(r) for r in self.offload_ratios)
        if any(not 0 <= r <= 1 for r in self.offload_ratios) or not {0.0, 1.0} <= set(self.offload_ratios):
            raise ValueError(f"offload_ratios must lie in [0, 1] and include 0 and 1, got {self.offload_ratios}")
        self.unlearn_methods, self.unlearn_seeds = tuple(self.unlearn_methods), tuple(self.unlearn_seeds)
        self.seeds, self.tofu_seeds = tuple(self.seeds), tuple(self.tofu_seeds)
        for name in ("seeds", "tofu_seeds"):
            seeds = getattr(self, name)
            if not seeds or seeds[0] != self.seed or len(set(seeds)) != len(seeds):
                raise ValueError(f"{name} must be distinct seeds starting with seed={self.seed}, got {seeds}")
        if not 0 <= self.rag_reader_fraction <= 1:
            raise ValueError(f"rag_reader_fraction must be in [0, 1], got {self.rag_reader_fraction}")
        if not self.tofu_forget.startswith("forget"):
            raise ValueError(f"tofu_forget must be a forget split (forget01, forget05, forget10), got {self.tofu_forget!r}")

    @classmethod
    def from_name(cls, name: str, sets: Iterable[str] = (), **overrides) -> "ReproduceConfig":
        """Preset ``name`` (of :data:`REPRODUCE_PRESETS`, or a ``.toml`` file of these fields), then the
        ``key=value`` assignments of ``sets`` (``--set``), then ``overrides`` (:func:`lmlm.recipe.from_preset`)."""
        return from_preset(cls, REPRODUCE_PRESETS, name, sets, kind="reproduce", **overrides)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


REPRODUCE_PRESETS: dict[str, dict[str, Any]] = {
    # about 40 minutes on an idle 2-core CPU, 1.4 GB peak (the report lists each stage's time)
    "cpu": {},
    # 2-4 minutes: what the tests run; every stage, tiny models
    "tiny": dict(
        bios="smoke",
        bios_overrides=dict(model="llama-tiny", model_overrides=dict(context_length=256), seq_len=128, max_steps=150, warmup_steps=15, lr=3e-3, precision="no",
                            threads=1, n_cloze=40, n_edits=10, n_retain=30, n_heldout=12, n_samples=2,
                            max_new_tokens=16),
        n_trex=40, n_popqa=40, n_factscore=6, n_nlu=20, factscore_tokens=40, max_new_tokens=16,
        offload_ratios=(0.0, 0.5, 1.0),
        tofu=dict(n_authors=20, questions_per_relation=2, n_perturbed=2, n_world_facts=4, world_fact_repeats=4,
                  n_retain_perturbed=14),
        tofu_real_people=3, tofu_epochs=3.0, tofu_lr=2e-3, tofu_seq_len=128,
        unlearn=dict(steps=4, lr=1e-3, batch_size=4, eval_every=2), tofu_max_new_tokens=16, threads=1,
        seeds=(0, 1), tofu_seeds=(0, 1),
    ),
}
