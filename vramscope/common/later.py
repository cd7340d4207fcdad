"""Work done on a thread of its own while the caller goes on, taken when needed.

    jobs = [Later(find_structure), Later(build_composition)]
    in_order(jobs)              # one thread runs them, one after another
    ...
    st = jobs[0].get()          # waits for it; its exception, if it raised, is raised here

numpy lets go of the interpreter during its big operations, so a thread of numpy work runs
beside the caller's on a second core. A job must read only what no one changes while it runs.
"""
from __future__ import annotations

import sys
import threading
from typing import Callable, Generic, TypeVar

T = TypeVar("T")


class Later(Generic[T]):
    """One job: `fn()`, run by `in_order`; `get()` its result."""

    def __init__(self, fn: Callable[[], T]):
        self._fn: Callable[[], T] | None = fn
        self._done = threading.Event()
        self._result: T | None = None
        self._error: BaseException | None = None

    def run(self) -> None:
        """Run it here, now (what `in_order` does on its thread)."""
        fn, self._fn = self._fn, None       # (what it refers to goes with it once run)
        try:
            assert fn is not None
            self._result = fn()
        except BaseException as e:          # handed to whoever asks for the result
            self._error = e
        finally:
            self._done.set()

    def give_up(self, error: BaseException) -> None:
        """Mark it as ended with `error`, unrun: for whoever waits for a job that never will be."""
        if not self._done.is_set():
            self._fn = None
            self._error = error
            self._done.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait (at most `timeout` seconds) for it to have run; whether it has."""
        return self._done.wait(timeout)

    def get(self) -> T:
        self._done.wait()
        if self._error is not None:
            raise self._error
        return self._result  # type: ignore[return-value]

    def take(self) -> T:
        """`get()`, and the result no longer held here (a big one is freed with its last user)."""
        try:
            return self.get()
        finally:
            self._result = None


_LEAVING = threading.Event()


def leaving() -> None:
    """The process is about to exit (the command has written what it answers): what waits
    with `after_unless_leaving` stops waiting. The interpreter is handed between threads more
    often from here: a job still running that nobody waits for (the blocks' structure, Python
    loops) held it 5 ms at a time from the cache's writing (1.7 s after a 10^7-entry summary)."""
    _LEAVING.set()
    sys.setswitchinterval(0.0002)


def after_unless_leaving(job: Later, poll_s: float = 0.02) -> Later:
    """A job that waits for `job` to have run, or for the process to be `leaving()`, whichever
    comes first: to put before work that must be done before the exit (a cache's writing) but
    should not hold the exit for `job` (one that only prepares for later, on a daemon thread)."""
    def wait() -> None:
        while not job.wait(poll_s):
            if _LEAVING.is_set():
                return
    return Later(wait)


def in_order(jobs: list[Later], name: str = "vramscope-later", daemon: bool = True) -> threading.Thread:
    """Run `jobs` one after another on a new thread (`daemon=False`: one the interpreter
    waits for before it exits, for work that must not be cut short)."""
    def work():
        for job in jobs:
            job.run()
    th = threading.Thread(target=work, name=name, daemon=daemon)
    th.start()
    return th


__all__ = ["Later", "after_unless_leaving", "in_order", "leaving"]
