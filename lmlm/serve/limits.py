"""The limits of ``lmlm serve`` requests, as data (no web framework needed to read or set them)."""

from __future__ import annotations

from dataclasses import dataclass, fields

__all__ = ["ServeLimits"]


@dataclass(frozen=True)
class ServeLimits:
    """What one request may ask for. Requests over a limit get a 4xx saying which limit.

    Args:
        max_body_bytes (default 65536): request body size (413 above).
        max_prompt_chars (default 4000): prompt length in characters (422 above).
        max_prompt_tokens (default 512): prompt length in tokens (422 above; also bounded by the
            model's context less ``max_new_tokens``).
        max_new_tokens (default 256): tokens generated per prompt (422 above).
        max_prompts (default 8): prompts in one request: a list prompt times ``n`` (422 above).
        max_concurrent (default 64): generation requests queued or running at once (429 above).
        max_batch (default 32): prompts decoded together in one batch.
        batch_wait_ms (default 5): how long an idle worker waits for more requests to batch.
        max_field_chars (default 200): entity, relation, value, source, who and why.
        max_write_items (default 1000): triples in one add; ids, entities or sources in one forget.
        max_log (default 1000): log entries in one response.
        max_search_k (default 50): candidates in one search.
        max_beams (default 4): beams of one beam-search request (each decodes as a row).
    """

    max_body_bytes: int = 64 * 1024
    max_prompt_chars: int = 4000
    max_prompt_tokens: int = 512
    max_new_tokens: int = 256
    max_prompts: int = 8
    max_concurrent: int = 64
    max_batch: int = 32
    batch_wait_ms: float = 5.0
    max_field_chars: int = 200
    max_write_items: int = 1000
    max_log: int = 1000
    max_search_k: int = 50
    max_beams: int = 4

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name == "batch_wait_ms":
                if not v >= 0:
                    raise ValueError(f"batch_wait_ms must be >= 0, got {v!r}")
            elif isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{f.name} must be an int >= 1, got {v!r}")
