"""Evaluation protocols of the paper's appendix B, one module each (``lmlm eval ...``)."""
