"""Corpus annotation: turning raw text into text with lookup calls and a knowledge base.

``wikipedia``: distant supervision from infoboxes (no LLM), ``lmlm annotate wikipedia``.
"""
