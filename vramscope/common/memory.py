"""How this process's memory is managed: its C allocator (glibc's malloc; elsewhere nothing
changes) and Python's cyclic garbage collector.

    one_malloc_arena()      # at the start of the command line and the viewer, before any thread
    keep_freed_pages()      # ... and big arrays' pages kept for the next ones
    fewer_collections()     # ... and the cyclic collector run less often
    collect_garbage()       # the viewer, once a file is shown: the replaced file's cycles
    give_back_freed_pages() # ... and then the heap's free pages

glibc gives each thread that allocates its own arena. The analysis runs numpy work on a second
thread (the blocks' structure, beside the peaks, run facts and leaks: classifiers/structure.py
`find_in_background`), and the reader writes columns and checks the CRC on threads of its own;
what one thread frees in its arena is not reused by another, so each grows its own heap: a cold
`summary` of 10^7 events peaked 140 MB higher (1,270 MB instead of 1,131 MB) with the structure
on its thread, and as low as without it in one arena, at no measured cost in time (big arrays
are few; the lock is rarely contended).

glibc also hands each array above its mmap threshold (at most 32 MB) straight back to the OS when
freed, and faults the next one in afresh, page by page; the analysis makes and frees hundreds of
them. With `keep_freed_pages` they come from the heap and its freed pages are reused: a cold
10^7 `summary` was faster in 6 of 8 interleaved runs, its highest memory within the spread. A
process that lives on (the viewer) gives the pages back once its burst of work is done.

Python's cyclic collector runs its youngest generation every 700 new containers and, now and
then, all of them over every object alive. The analysis of a trace of many short iterations
makes a few hundred thousand small objects (an iteration, its phases, their plain JSON), which
hold no cycles: of a cold `summary` of 10^7 entries and 170,000 iterations (a real run's trace
tiled), 3 s of 14.6 went to collections that found nothing. `pickle.load`, which the benchmarks
measure us against, is timed with the collector off.
"""
from __future__ import annotations

import gc
import sys

_M_ARENA_MAX = -8          # glibc's malloc.h
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4


def _glibc():
    """The C library, where it is glibc (its malloc's settings are glibc's own); else None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes
        import os
        if not (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc"):
            return None
        return ctypes.CDLL(None)
    except (OSError, AttributeError, ValueError, TypeError):
        return None


def one_malloc_arena() -> bool:
    """Every thread allocates from the main arena (glibc's M_ARENA_MAX = 1); whether it took.
    To be called before the process starts another thread (an arena once made stays)."""
    libc = _glibc()
    if libc is None:
        return False
    try:
        return bool(libc.mallopt(_M_ARENA_MAX, 1))
    except (AttributeError, ValueError, TypeError):
        return False


def keep_freed_pages() -> bool:
    """Big blocks from the heap, and the heap's freed pages kept for the next block, not handed
    back to the OS and faulted in afresh (glibc's M_MMAP_MAX = 0, M_TRIM_THRESHOLD = 2 GiB);
    whether it took. To be paired with `give_back_freed_pages` once a burst of work is done."""
    libc = _glibc()
    if libc is None:
        return False
    try:
        return bool(libc.mallopt(_M_MMAP_MAX, 0)) and bool(libc.mallopt(_M_TRIM_THRESHOLD, 2 ** 31 - 1))
    except (AttributeError, ValueError, TypeError):
        return False


def fewer_collections() -> None:
    """The cyclic collector's youngest generation run every 200,000 new containers (not 700),
    and the older ones a hundred times more rarely each: cycles are still collected, without a
    pass over every object alive each time the analysis has made a few thousand. (mypy's build
    runs its youngest generation as rarely.)"""
    gc.set_threshold(200_000, 100, 100)


def collect_garbage() -> int:
    """A full collection now, of what `fewer_collections` puts off: the viewer's, once a file is
    shown (the cycles of the file it replaced, which the rarer collections might keep for the
    whole session); how many objects it freed."""
    return gc.collect()


def give_back_freed_pages() -> bool:
    """Hand the heap's free pages back to the OS now (glibc's malloc_trim(0)); whether any went."""
    libc = _glibc()
    if libc is None:
        return False
    try:
        return bool(libc.malloc_trim(0))
    except (AttributeError, ValueError, TypeError):
        return False


__all__ = ["one_malloc_arena", "keep_freed_pages", "fewer_collections", "collect_garbage", "give_back_freed_pages"]
