"""The parsed snapshot: numpy columns per device plus interned frames and stacks."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from . import numbers
from .errors import NotASnapshotError
from .metadata import METADATA_KEY, RunMetadata, read_metadata
from .sink import TracesList
from .tables import (ACTIONS, BLOCK_STATES, COMPONENT_KEY, HOST_DEVICE, LIVE_BLOCK_STATES, PROFILER_CATEGORIES,
                     release_mapped)
from .values import DROPPED

SEGMENT_COLUMNS = {
    "device": np.int32, "address": np.int64, "total_size": np.int64, "allocated_size": np.int64,
    "active_size": np.int64, "requested_size": np.int64, "stream": np.int64, "segment_type": np.uint8,
    "pool_a": np.int64, "pool_b": np.int64, "is_expandable": np.uint8, "stack": np.int32,
}
BLOCK_COLUMNS = {
    "device": np.int32, "segment": np.int32, "address": np.int64, "size": np.int64,
    "requested_size": np.int64, "state": np.uint8, "stack": np.int32,
    "component": np.uint8,      # component tracking's tag of the block (code into component_names)
}
SEGMENT_TYPES = ("small", "large", "other")
_SEGMENT_TYPE_CODES = {"small": 0, "large": 1}
_STATE_CODES = {**{s: i for i, s in enumerate(BLOCK_STATES)}, "active_awaiting_free": 2}  # torch's docstring name


@dataclass
class DeviceTrace:
    """One device's trace: `columns[name][i]` is entry i of `device_traces[device]`."""
    device: int
    columns: dict
    extras: dict = field(default_factory=dict)   # entry index -> rare fields (oom device_free, ...)

    def __len__(self) -> int:
        return len(self.columns["action"])

    def release(self, names) -> int:
        """Hand back the memory this process holds of the columns `names` where they are
        mapped from the cache (the OS keeps their pages in its file cache: a later read maps
        them again, from memory, with the same values); how many were let go. A stage calls
        this once it is done with a column, so what it read does not count in the highest
        memory of the stages after it. In-memory columns stay as they are."""
        return sum(release_mapped(self.columns[k]) for k in names if k in self.columns)

    def __getattr__(self, name):
        cols = self.__dict__.get("columns")
        if cols is not None and name in cols:
            return cols[name]
        raise AttributeError(name)


@dataclass
class Snapshot:
    path: str
    strings: list
    frame_file: np.ndarray
    frame_line: np.ndarray
    frame_name: np.ndarray
    stack_offsets: np.ndarray
    stack_frames: np.ndarray
    traces: dict                       # device -> DeviceTrace (only devices with entries)
    segments: dict                     # column -> array
    blocks: dict
    action_names: list = field(default_factory=lambda: list(ACTIONS))
    category_names: list = field(default_factory=lambda: list(PROFILER_CATEGORIES))
    allocator_settings: dict | None = None
    annotations: list = field(default_factory=list)
    extra: dict = field(default_factory=dict)      # unknown top-level keys, kept (flattened, bounded)
    layout: str = ""                   # e.g. "dict", "segment-list", "profiler"
    trace_device_count: int = 0        # len(device_traces)
    from_cache: bool = False
    cache_entry: str | None = None     # the cache directory holding its columns, if any
    dropped_values: int = 0            # values outside the schema not kept: over the file's bound
    component_names: list = field(default_factory=lambda: [""])   # component tracking's names
    # frame id -> FX source mapping (augment_with_fx_traces, #166676): (fx_node_op, fx_node_name,
    # fx_node_target, fx_original_trace) string ids (-1: absent) and the original trace's
    # frames, innermost first (tables.Interner.frame_fx)
    frame_fx: dict = field(default_factory=dict)

    @property
    def metadata(self) -> RunMetadata | None:
        """The run's metadata document that `vramscope.record` wrote (every field checked),
        or None for a snapshot without one."""
        return read_metadata(self.extra.get(METADATA_KEY))

    # -- devices --------------------------------------------------------------
    @property
    def devices(self) -> list[int]:
        """The GPUs with data (pinned host memory is not one of them: `host`)."""
        devs = {d for d in self.traces if d >= 0}
        devs.update(int(d) for d in np.unique(self.segments["device"]) if d >= 0)
        return sorted(devs)

    @property
    def has_host(self) -> bool:
        """The file recorded pinned host memory (2.14 `record_pinned_host_memory`): a trace
        or segments under `HOST_DEVICE`."""
        return HOST_DEVICE in self.traces or bool((self.segments["device"] == HOST_DEVICE).any())

    @property
    def host(self) -> DeviceTrace | None:
        return self.traces.get(HOST_DEVICE)

    def trace(self, device: int) -> DeviceTrace:
        t = self.traces.get(device)
        if t is None:
            from .tables import ALL_COLUMNS
            t = DeviceTrace(device, {k: np.zeros(0, dtype=v) for k, v in
                                     ALL_COLUMNS.items() if k in ("action", "addr", "size", "stream", "time_us", "stack")})
        return t

    def device_blocks(self, device: int) -> dict:
        sel = self.blocks["device"] == device
        return {k: v[sel] for k, v in self.blocks.items()}

    def device_segments(self, device: int) -> dict:
        sel = self.segments["device"] == device
        return {k: v[sel] for k, v in self.segments.items()}

    # -- frames and stacks ---------------------------------------------------------
    def stack(self, sid: int) -> np.ndarray:
        """Frame ids of a stack, innermost first (empty for -1 or the empty stack)."""
        if sid < 0:
            return self.stack_frames[:0]
        return self.stack_frames[self.stack_offsets[sid]:self.stack_offsets[sid + 1]]

    def frame(self, fid: int) -> tuple[str, int, str]:
        return (self.strings[self.frame_file[fid]], int(self.frame_line[fid]), self.strings[self.frame_name[fid]])

    def stack_frames_list(self, sid: int) -> list[tuple[str, int, str]]:
        return [self.frame(int(f)) for f in self.stack(sid)]

    @property
    def n_stacks(self) -> int:
        return len(self.stack_offsets) - 1

    @property
    def n_events(self) -> int:
        return sum(len(t) for t in self.traces.values())


def build_tables(top, sink, reader):
    """Turn the small Python parts of the parsed pickle into tables. Every number goes
    through numbers.py, every row counts against the file's row budget (a segment list or
    block list shared by reference counts once per reference) and every value outside the
    schema is flattened with bounds (values.py)."""
    if type(top) is dict:
        if "segments" not in top and "device_traces" not in top:
            raise NotASnapshotError("a pickled dict without 'segments' or 'device_traces': not a memory snapshot")
        segments = top.get("segments", [])
        layout = "dict"
    elif isinstance(top, list) and not isinstance(top, TracesList):
        if not all(type(s) is dict and "blocks" in s for s in top):
            raise NotASnapshotError("a pickled list that is not a list of allocator segments")
        segments = top
        layout = "segment-list"
    else:
        raise NotASnapshotError(f"a pickled {type(top).__name__}, not a memory snapshot")
    if not isinstance(segments, list) or isinstance(segments, TracesList):
        raise NotASnapshotError("'segments' is not a list")
    rows = sink.rows
    seg_rows = {k: [] for k in SEGMENT_COLUMNS}
    blk_rows = {k: [] for k in BLOCK_COLUMNS}
    _segment_rows(segments, sink, seg_rows, blk_rows, None)
    host_segments = top.get("host_segments") if type(top) is dict else None
    if isinstance(host_segments, list) and not isinstance(host_segments, TracesList):
        # torch 2.14 pinned host memory: segments of the host allocator (device -1, one
        # block each), read under HOST_DEVICE after the devices' own
        _segment_rows(host_segments, sink, seg_rows, blk_rows, HOST_DEVICE)
    if segments and all(type(s) is dict and "segment_type" not in s and "allocated_size" not in s
                        for s in segments):
        # torch.cuda._memory_viz._profile_to_snapshot writes one pseudo-segment per
        # device spanning the addresses it saw: no allocator state to speak of.
        layout = "profiler"
    seg_tab = {k: np.asarray(v, dtype=dt) for (k, dt), v in zip(SEGMENT_COLUMNS.items(), seg_rows.values())}
    blk_tab = {k: np.asarray(v, dtype=dt) for (k, dt), v in zip(BLOCK_COLUMNS.items(), blk_rows.values())}

    settings = annotations = None
    extra = {}
    trace_device_count = 0
    flat = sink.flat
    if type(top) is dict:
        settings = top.get("allocator_settings")
        settings = flat.value(settings) if type(settings) is dict else None
        if type(settings) is not dict:
            settings = None
        ann = top.get("external_annotations")
        annotations = []
        if isinstance(ann, list) and not isinstance(ann, TracesList):
            rows.take(len(ann), "external annotations")
            for a in ann:
                v = flat.value(a)
                if v is not DROPPED:
                    annotations.append(v)
        dt = top.get("device_traces")
        if dt is not None and not isinstance(dt, list):
            raise NotASnapshotError("'device_traces' is not a list")
        trace_device_count = len(dt) if dt is not None else 0
        for k, v in top.items():
            if type(k) is str and k in ("segments", "device_traces", "allocator_settings", "external_annotations",
                                        "host_segments", "host_traces"):
                continue
            v = flat.value(v)
            if v is not DROPPED:
                extra[k if type(k) is str else flat.key(k, len(extra))] = v
    return seg_tab, blk_tab, settings, annotations or [], extra, layout, trace_device_count


def _segment_rows(segments: list, sink, seg_rows: dict, blk_rows: dict, device: int | None) -> None:
    """Append the rows of a list of segment dicts (and their blocks) to the tables; `device`
    overrides each segment's own (host segments say -1, which is no device number)."""
    rows = sink.rows
    rows.take(len(segments), "segments")
    seg_total: dict[int, float] = {}
    blk_total: dict[int, float] = {}
    base = len(seg_rows["device"])
    for si, s in enumerate(segments, base):
        if type(s) is not dict:
            raise NotASnapshotError("a segment is not a dict")
        dev = numbers.device(s.get("device"), 0) if device is None else device
        addr = numbers.addr(s.get("address", 0), "segment address")
        pool = s.get("segment_pool_id")
        pa, pb = pool if type(pool) is tuple and len(pool) == 2 else (-1, -1)
        stype = s.get("segment_type")
        total = numbers.signed_size(s.get("total_size", 0))
        seg_total[dev] = seg_total.get(dev, 0.0) + abs(total)
        seg_rows["device"].append(dev)
        seg_rows["address"].append(addr)
        seg_rows["total_size"].append(total)
        seg_rows["allocated_size"].append(numbers.signed_size(s.get("allocated_size"), unknown=-1))
        seg_rows["active_size"].append(numbers.signed_size(s.get("active_size"), unknown=-1))
        seg_rows["requested_size"].append(numbers.signed_size(s.get("requested_size"), unknown=-1))
        seg_rows["stream"].append(numbers.opaque(s.get("stream", 0)))
        seg_rows["segment_type"].append(_SEGMENT_TYPE_CODES.get(stype, 2) if type(stype) is str else 2)
        seg_rows["pool_a"].append(numbers.opaque(pa, "pool id", -1))
        seg_rows["pool_b"].append(numbers.opaque(pb, "pool id", -1))
        seg_rows["is_expandable"].append(1 if s.get("is_expandable") else 0)
        seg_rows["stack"].append(sink.stack_of(s.get("frames")) if "frames" in s else -1)
        blocks = s.get("blocks", [])
        if not isinstance(blocks, list) or isinstance(blocks, TracesList):
            raise NotASnapshotError("a segment's blocks are not a list")
        rows.take(len(blocks), "segments and blocks")
        # torch 2.0 blocks have no address: the segment's plus the sizes before them
        cursor = addr if addr >= 0 else addr + (1 << 64)
        for b in blocks:
            if type(b) is not dict:
                raise NotASnapshotError("a block is not a dict")
            size = numbers.size(b.get("size", 0), "block size")
            given = b.get("address")
            baddr = numbers.addr(given if type(given) is int else cursor, "block address")
            cursor = (baddr if baddr >= 0 else baddr + (1 << 64)) + size
            requested = numbers.size(b.get("requested_size", size), "block size", size)
            state = b.get("state")
            frames = b.get("frames")
            hist = b.get("history")
            if frames is None and isinstance(hist, list) and hist and type(hist[-1]) is dict:
                frames = hist[-1].get("frames")      # torch 2.0: frames live in history
            code = _STATE_CODES.get(state, 3) if type(state) is str else 3
            if code in LIVE_BLOCK_STATES:
                blk_total[dev] = blk_total.get(dev, 0.0) + requested
            blk_rows["device"].append(dev)
            blk_rows["segment"].append(si)
            blk_rows["address"].append(baddr)
            blk_rows["size"].append(size)
            blk_rows["requested_size"].append(requested)
            blk_rows["state"].append(code)
            blk_rows["stack"].append(sink.stack_of(frames) if frames is not None else -1)
            comp = b.get(COMPONENT_KEY)
            blk_rows["component"].append(sink.component_code(comp) if type(comp) is str else 0)
    for dev, summed in seg_total.items():
        numbers.check_total(summed, f"the segment sizes of device {dev}")
    for dev, summed in blk_total.items():
        numbers.check_total(summed, f"the live block sizes of device {dev}")


def interned_arrays(interner):
    offsets = np.zeros(len(interner.stacks) + 1, dtype=np.int64)
    np.cumsum([len(s) for s in interner.stacks], out=offsets[1:])
    frames = np.fromiter((f for s in interner.stacks for f in s), dtype=np.int32, count=int(offsets[-1]))
    # frame lines are int32 already (numbers.line keeps [0, 2**31)): no value can overflow here
    return (np.asarray(interner.frame_file, dtype=np.int32), np.asarray(interner.frame_line, dtype=np.int32),
            np.asarray(interner.frame_name, dtype=np.int32), offsets, frames)
