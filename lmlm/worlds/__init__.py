"""Corpora with known ground truth: every fact in the text is also a row of the knowledge base.

``bios``: synthetic biographies with a long tail of mentions per person (``lmlm world bios``).
"""

from .bios import (
    BIOS_PRESETS, CLOZE_TEMPLATES, RELATIONS, TEMPLATES, BiosConfig, BiosWorld, ClozePrompt, Document, Edit,
    Person, WorldFact,
)

__all__ = [
    "BIOS_PRESETS", "CLOZE_TEMPLATES", "RELATIONS", "TEMPLATES", "BiosConfig", "BiosWorld", "ClozePrompt",
    "Document", "Edit", "Person", "WorldFact",
]
