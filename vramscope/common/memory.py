"""How this process's C allocator is set up (glibc's malloc; elsewhere nothing changes).

    one_malloc_arena()      # at the start of the command line and the viewer, before any thread

glibc gives each thread that allocates its own arena. The analysis runs numpy work on a second
thread (the blocks' structure, beside the peaks, run facts and leaks: classifiers/structure.py
`find_in_background`), and the reader writes columns and checks the CRC on threads of its own;
what one thread frees in its arena is not reused by another, so each grows its own heap: a cold
`summary` of 10^7 events peaked 140 MB higher (1,270 MB instead of 1,131 MB) with the structure
on its thread, and as low as without it in one arena, at no measured cost in time (big arrays
are few; the lock is rarely contended).
"""
from __future__ import annotations

import sys

_M_ARENA_MAX = -8          # glibc's malloc.h
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4


def one_malloc_arena() -> bool:
    """Every thread allocates from the main arena (glibc's M_ARENA_MAX = 1); whether it took.
    To be called before the process starts another thread (an arena once made stays)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes
        import os
        if not (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc"):
            return False
        return bool(ctypes.CDLL(None).mallopt(_M_ARENA_MAX, 1))
    except (OSError, AttributeError, ValueError, TypeError):
        return False


def _glibc():
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


def give_back_freed_pages() -> bool:
    """Hand the heap's free pages back to the OS now (glibc's malloc_trim(0)); whether any went."""
    libc = _glibc()
    if libc is None:
        return False
    try:
        return bool(libc.malloc_trim(0))
    except (AttributeError, ValueError, TypeError):
        return False


__all__ = ["one_malloc_arena", "keep_freed_pages", "give_back_freed_pages"]
