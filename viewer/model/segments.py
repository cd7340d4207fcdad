"""The allocator's segments as the viewer draws them: every segment as a band (reserved
memory by segment) and its colour key. The segments themselves, and what is allocated in
them at any entry, come from the analysis (classifiers/allocator.py); DeviceData holds one
of these as `segments`."""
from __future__ import annotations

import numpy as np

from ...present.words import segment_pool_words, segment_stream_words
from .alloc_stack import AllocStack


class SegmentBands:
    """One device's segments (or mapped pieces of expandable ones), from the analysis'
    AllocatorHistory `history`: `start`, `end` (entries), `addr`, `size`, `stream`,
    `expandable`, `small` per segment, the `streams` seen, `known` (False where the recording
    has no segment events), and `key`, the colour key of each segment: its stream when there
    are several, else its pool (0 small, 1 large)."""

    def __init__(self, history, n_entries: int):
        self.history = h = history
        self.n = int(n_entries)
        self.known = h.known
        self.start, self.end, self.addr, self.size = h.start, h.end, h.address, h.size
        self.stream, self.expandable, self.small, self.streams = h.stream, h.expandable, h.small, h.streams
        if len(self.streams) > 1:
            self.key = np.searchsorted(self.streams, self.stream).astype(np.int64)
        else:
            self.key = (~self.small).astype(np.int64)
        self._stack: AllocStack | None = None

    def stack(self) -> AllocStack | None:
        """Every segment as a band (reserved memory by segment), keyed by `key`, built on
        first use; None when the segments are not known."""
        if self._stack is None and self.known:
            end = np.where(self.end > self.n, -1, self.end)
            self._stack = AllocStack(self.start, end, self.size, self.key, self.n)
        return self._stack

    def keys(self) -> list[tuple[int, str]]:
        """(key, what it is) for each colour key the bands use (the colour is
        theme.SEGMENT_COLORS[key % len]): a stream when there are several, else a pool."""
        present = np.unique(self.key).tolist()
        if len(self.streams) > 1:
            return [(k, segment_stream_words(int(self.streams[k]))) for k in present]
        return [(k, segment_pool_words(small=k == 0)) for k in present]

    def allocated_in(self, seg: int, i: int) -> int:
        """Bytes allocated in segment `seg` right after entry `i`."""
        return self.history.allocated_in_segment(seg, i)

    def at(self, i: int):
        """The segments live right after entry `i` (classifiers.allocator.Segments)."""
        return self.history.segments_at(i)
