"""What every reproduction stage reads: the run folder, its config, the biography world and models."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from rich.console import Console

from ..jsonio import read_json, write_json
from .config import ReproduceConfig

__all__ = ["Run", "console", "write_json", "read_json"]

console = Console(stderr=True)


@dataclass
class Run:
    """A reproduction in folder ``out``: the biography run lives in ``out/bios`` (a quickstart run)."""

    cfg: ReproduceConfig
    out: Path
    _cache: dict = field(default_factory=dict, repr=False)

    @property
    def bios(self) -> Path:
        return self.out / "bios"

    @property
    def data(self) -> Path:
        return self.out / "data"

    @cached_property
    def quickstart_config(self):
        from ..quickstart import QuickstartConfig

        return QuickstartConfig.from_name(self.cfg.bios, seed=self.cfg.seed, **self.cfg.bios_overrides)

    @cached_property
    def world(self):
        from ..worlds.bios import BiosWorld

        return BiosWorld.load(self.bios / "world")

    @cached_property
    def tok(self):
        from ..tokens import load_tokenizer

        return load_tokenizer(self.bios / "tokenizer")

    def model(self, mode: str):
        """The biography run's ``lmlm`` or ``standard`` model (loaded once)."""
        if mode not in self._cache:
            from ..checkpoint import load_checkpoint

            self._cache[mode] = load_checkpoint(self.bios / f"train-{mode}" / "checkpoint")[0]
        return self._cache[mode]

    def checkpoint(self, mode: str) -> Path:
        return self.bios / f"train-{mode}" / "checkpoint"

    @cached_property
    def kb(self):
        """The KB the biography models were trained against (read only: lookups, never edits)."""
        from ..kb import KnowledgeBase

        return KnowledgeBase.open(self.bios / "kb")

    def close(self) -> None:
        if "kb" in self.__dict__:
            self.kb.close()
