"""The process's memory during bulk work: the garbage collector paused, glibc's allocator tuned and trimmed.

Ground floor: imports nothing of the package. Exercised by ``lmlm kb build`` (a write of 10^6 facts,
an IVF index's lists) and ``lmlm bench kb`` (the heap given back between measurements).
"""

from __future__ import annotations

import ctypes
import gc
from contextlib import contextmanager
from typing import Iterator

__all__ = ["gc_paused", "mallopt", "allocations_from_os", "trim_heap"]


@contextmanager
def gc_paused() -> Iterator[None]:
    """No cyclic garbage collection inside: a loop making 10^6 tuples (a write, a reader's map) would
    otherwise trigger full collections that each walk every object alive, a third of its time."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt's parameters
# What glibc's own thresholds rise to on a 64-bit system: the largest block it maps itself, and twice
# that for the heap's free top it keeps
_HEAP_MMAP_THRESHOLD, _HEAP_TRIM_THRESHOLD = 32 << 20, 64 << 20


def mallopt(param: int, value: int) -> bool:
    """Set one of glibc malloc's parameters; False where the C library is not glibc (or refused it)."""
    try:
        return bool(ctypes.CDLL("libc.so.6").mallopt(param, value))
    except (OSError, AttributeError):  # not glibc
        return False


@contextmanager
def allocations_from_os(threshold: int = 128 * 1024) -> Iterator[bool]:
    """Inside the block, glibc's malloc serves every allocation of ``threshold`` bytes or more with
    its own pages from the system, returned when freed (``mallopt(M_MMAP_THRESHOLD)``). An IVF
    grows each of its thousands of lists by reallocating to the next power of two: from the heap,
    the freed blocks stay as holes and the unwritten halves are counted as used, 1.5 times the
    codes' size in all; from the system, only the pages written count (measured 1.1 times at
    1.5 x 10^6 keys), and a list once mapped stays mapped as it grows (``mremap``), after the block too.

    On leaving, the thresholds are set where glibc's own would have risen to (32 MB, and 64 MB of
    free heap kept): once set, they no longer move by themselves, and at 128 kB every tensor and
    array of more than that was mapped and zeroed by the system again at each allocation, which
    halved the encoder's speed in a process holding an IVF (MiniLM on 256 queries, 2 cores: 700
    a second, 1,465 with the thresholds raised). Yields False where the C library is not glibc."""
    done = mallopt(_M_MMAP_THRESHOLD, threshold)
    try:
        yield done
    finally:
        if done:
            mallopt(_M_MMAP_THRESHOLD, _HEAP_MMAP_THRESHOLD)
            mallopt(_M_TRIM_THRESHOLD, _HEAP_TRIM_THRESHOLD)


def trim_heap() -> None:
    """Give the heap's free pages back to the system (glibc keeps them otherwise; elsewhere nothing)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
