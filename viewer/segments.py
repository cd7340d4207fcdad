"""The allocator's segments as the viewer draws them: every segment as a band (reserved
memory by segment) and its colour key. The segments themselves, and what is allocated in
them at any entry, come from the analysis (classifiers/allocator.py). Mixed into
DeviceData (viewer/model.py)."""
from __future__ import annotations

import numpy as np

from ..present.words import segment_pool_words, segment_stream_words


class SegmentsMixin:
    """Mixed into DeviceData: `allocator` (the analysis' AllocatorHistory of this device) and,
    from it, `seg_start`, `seg_end` (entries), `seg_addr`, `seg_size`, `seg_stream`,
    `seg_expandable`, `seg_small` per segment (or mapped piece), `streams`; `seg_key` the
    colour key of each."""

    def segment_stack(self):
        """Every allocator segment as a band (reserved memory by segment), keyed by its
        stream (several streams) or its pool (small / large), built on first use."""
        if self._segment_stack is None and self.segments_known:
            from .model.alloc_stack import AllocStack
            end = np.where(self.seg_end > self.n, -1, self.seg_end)
            self._segment_stack = AllocStack(self.seg_start, end, self.seg_size, self.seg_key, self.n)
        return self._segment_stack

    def segment_keys(self) -> list[tuple[int, str]]:
        """(key, what it is) for each colour key the segment bands use (`seg_key`; the colour
        is theme.SEGMENT_COLORS[key % len]): a stream when there are several, else a pool."""
        present = np.unique(self.seg_key).tolist()
        if len(self.streams) > 1:
            return [(k, segment_stream_words(int(self.streams[k]))) for k in present]
        return [(k, segment_pool_words(small=k == 0)) for k in present]

    def _build_segments(self):
        h = self.allocator = self.analysis.allocator(self.device)
        self.segments_known = h.known
        self.seg_start, self.seg_end, self.seg_addr, self.seg_size = h.start, h.end, h.address, h.size
        self.seg_stream, self.seg_expandable, self.seg_small, self.streams = h.stream, h.expandable, h.small, h.streams
        if len(self.streams) > 1:
            self.seg_key = np.searchsorted(self.streams, self.seg_stream).astype(np.int64)
        else:
            self.seg_key = (~self.seg_small).astype(np.int64)

    def allocated_in_segment(self, seg: int, i: int) -> int:
        return self.allocator.allocated_in_segment(seg, i)

    def segments_at(self, i: int):
        return self.allocator.segments_at(i)
