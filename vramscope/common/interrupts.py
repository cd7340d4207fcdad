"""Whether an error is what a Ctrl-C became.

    except Exception as e:
        if came_from_interrupt(e):
            raise KeyboardInterrupt from e      # 'interrupted', exit 130: not a bug of ours

A Ctrl-C raises KeyboardInterrupt wherever the main thread is; code that cleans up on the way out
(a `finally`, a context manager's exit, a thread joined) may then fail in turn, and that second
error replaces the first. Read as a bug of ours, a Ctrl-C said 'internal error' (exit 4) and a
rank read by `ranks` was listed as one. Python records the first error as the second one's
context: an error raised while a KeyboardInterrupt was being handled came from it.
"""
from __future__ import annotations


def came_from_interrupt(e: BaseException) -> bool:
    """Whether `e` was raised while a KeyboardInterrupt was unwinding (its context or cause,
    at any depth, is one)."""
    seen: set[int] = set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, KeyboardInterrupt):
            return True
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    return False


__all__ = ["came_from_interrupt"]
