"""Where the time of an analysis goes, stage by stage (benchmarks/bench_stages.py, and the test
that no stage grows faster than the trace: tests/test_linear.py). A stage is a `with clock(name):`
block; a clock of None costs nothing."""
from __future__ import annotations

import time
from contextlib import contextmanager


def peak_rss() -> int | None:
    """This process's peak resident memory so far in bytes (Linux: VmHWM), None elsewhere."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


class StageClock:
    """Wall and CPU seconds per named stage (a stage entered twice adds up), and the process's
    peak resident memory when each stage ends (`rss`: the high-water mark so far). `cpu` is
    the process's CPU time; `thread_cpu` the calling thread's alone (the analysis runs there),
    which another thread of the process busy meanwhile does not inflate."""

    def __init__(self):
        self.wall: dict[str, float] = {}
        self.cpu: dict[str, float] = {}
        self.thread_cpu: dict[str, float] = {}
        self.rss: dict[str, int | None] = {}

    @contextmanager
    def __call__(self, name: str):
        w, c, t = time.perf_counter(), time.process_time(), time.thread_time()
        try:
            yield
        finally:
            self.wall[name] = self.wall.get(name, 0.0) + time.perf_counter() - w
            self.cpu[name] = self.cpu.get(name, 0.0) + time.process_time() - c
            self.thread_cpu[name] = self.thread_cpu.get(name, 0.0) + time.thread_time() - t
            self.rss[name] = peak_rss()


@contextmanager
def _nothing():
    yield


def stage(clock: StageClock | None, name: str):
    """`with stage(clock, "parse"):` times the block on `clock`, or does nothing without one."""
    return clock(name) if clock is not None else _nothing()


__all__ = ["StageClock", "stage", "peak_rss"]
