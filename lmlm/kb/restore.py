"""Bring a KB back to what it held at a past version (``lmlm kb restore``), as new versions.

History is never rewritten: a past version stays readable as it was (``lmlm kb checkout``). The
facts active now and not then are deleted (one version, op ``delete``), the facts active then and
not now are written again with the counts and sources they had then (one version, op ``restore``;
new triple ids, since the old rows keep their own history), and the aliases are made the ones active
then. A fact active at both keeps its row and its count. Each step is a version of its own, and the
plan is read from the KB as it is: after a crash, the same call does what is left, nothing twice.

Exercised by ``lmlm kb restore`` and ``POST /api/kb/restore``.
"""

from __future__ import annotations

from dataclasses import dataclass

from .keys import normalize_text, normalize_value
from .records import Fact

__all__ = ["Restored", "restore_version"]


@dataclass(frozen=True)
class Restored:
    """What :func:`restore_version` did: facts deleted and written back, aliases added and deleted."""

    version: int
    removed: int
    added: int
    aliases_added: int
    aliases_removed: int

    @property
    def changed(self) -> int:
        return self.removed + self.added + self.aliases_added + self.aliases_removed


def _key(r) -> tuple[str, str, str]:
    return normalize_text(r.entity), normalize_text(r.relation), normalize_value(r.value)


def restore_version(kb, version: int, who: str = "lmlm", why: str = "") -> Restored:
    """Make the active facts and aliases of ``kb`` (a live :class:`~lmlm.kb.KnowledgeBase`) those of
    ``version``; returns what changed (all 0 when they already are)."""
    version = kb.store.check_version(version)
    why = why or f"restore version {version}"
    then = {_key(r): r for r in kb.store.records(active_only=True, at=version)}
    now = {_key(r): r.id for r in kb.store.records()}
    gone = sorted(tid for k, tid in now.items() if k not in then)
    back = [r for k, r in then.items() if k not in now]
    removed = kb.forget(gone, who=who, why=why) if gone else 0  # an entity left without facts loses its aliases
    if back:
        kb._write((Fact(r.entity, r.relation, r.value, r.count, tuple(r.sources)) for r in back), "restore",
                  who, why, batch_size=1000, progress=None, total=len(back))
    old, new = kb.alias_diff(version, kb.version)  # active now and not then; then and not now
    if new:
        kb.add_aliases([(a.alias, a.entity) for a in new], who=who, why=why)
    for a in old:
        kb.delete_alias(a.alias, a.entity, who=who, why=why)
    return Restored(kb.version, removed, len(back), len(new), len(old))
