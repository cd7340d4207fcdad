"""The run's metadata document that `vramscope.record` puts into the snapshots it writes.

A snapshot written by `vramscope.record` carries one extra top-level key,
`vramscope_metadata`, after torch's own keys (so every reader of torch's layout, memory_viz
included, ignores it). Its value holds plain JSON values only:

    {"schema": 1, "writer": "vramscope 0.1.0", "torch": "2.13.0", "cuda": "12.8",
     "device": {"index": 0, "name": "NVIDIA H100 80GB HBM3", "total_memory": 85520809984},
     "distributed": {"rank": 3, "world_size": 8, "local_rank": 3, "source": "torch.distributed"},
     "allocator": {"conf": "expandable_segments:True", "backend": "native"},
     "parameters": {"trainable": {"bfloat16": {"count": 6815744, "bytes": 13631488}},
                    "frozen": {"bfloat16": {"count": 1235814400, "bytes": 2471628800}},
                    "not_on_gpu": {"count": 0, "bytes": 0}},
     "optimizer": {"class": "torch.optim.adamw.AdamW", "state_dtype": "float32", "state_bytes": 54525952},
     "batch": {"micro_batch": 8, "seq_len": 2048},
     "dump": {"step": 10, "reason": "step", "time_us": 1767225600000000},
     "recording": {"stacks": "python", "context": "all", "max_entries": 100000},
     "oom": {"device": 0, "requested": 2147483648, "device_total": 85520809984, "device_free": 1048576}}

`oom` holds what torch's OOM observer is called with (c10 CUDACachingAllocator.h
`OutOfMemoryObserver(device, allocated, device_total, device_free)`: the failed request,
the device's total memory, or the allowed maximum under `set_per_process_memory_fraction`,
and what CUDA reported free). Files of vramscope 0.1.0 before issue 30 stored the third as
`device_allocated`; it is read as `device_total`, which it always was.

Every part is optional. The file is untrusted input like the rest of the snapshot (the
reader has already bounded it, values.py): `read_metadata` checks every field on its own
(type, range, the characters a name may hold), keeps what passes, drops the rest and
lists what it dropped in `RunMetadata.dropped`. It never raises.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

METADATA_KEY = "vramscope_metadata"
SCHEMA = 1
DUMP_REASONS = ("step", "request", "oom", "exit")

_MAX_INT = (1 << 63) - 1
_MAX_PARAMS = 10 ** 15            # far beyond any model a GPU holds
_VERSION = re.compile(r"[0-9A-Za-z][0-9A-Za-z.+_-]{0,63}")
_DTYPE = re.compile(r"[a-z][a-z0-9_]{0,31}")
_CLASS = re.compile(r"[A-Za-z_][A-Za-z0-9_.<>]{0,199}")
_WORD = re.compile(r"[a-z_]{1,32}")
_TEXT_LIMIT = 300


@dataclass(frozen=True)
class ParameterCount:
    """The parameters of one dtype: elements, and the bytes torch stores them in (4-bit
    weights packed into uint8 count as the uint8 elements torch sees)."""
    dtype: str          # torch's dtype name without "torch.": "bfloat16", "float32", "uint8"
    count: int
    bytes: int


@dataclass(frozen=True)
class OomInfo:
    """What torch's OOM observer was told (`torch._C._cuda_attach_out_of_memory_observer`)."""
    device: int | None
    requested: int | None           # bytes the failed allocation asked for
    device_total: int | None        # the device's total memory (or the allowed maximum under a memory fraction)
    device_free: int | None         # bytes CUDA reported free


@dataclass(frozen=True)
class RunMetadata:
    """The checked metadata document of one snapshot (see the module docstring)."""
    schema: int | None = None
    writer: str | None = None               # "vramscope 0.1.0"
    torch_version: str | None = None
    cuda_version: str | None = None
    device: int | None = None               # the CUDA device the process used
    gpu_name: str | None = None
    gpu_total_memory: int | None = None     # bytes
    rank: int | None = None
    world_size: int | None = None
    local_rank: int | None = None
    rank_source: str | None = None          # "torch.distributed", "env RANK", "env LOCAL_RANK", "single process"
    allocator_conf: str | None = None       # PYTORCH_CUDA_ALLOC_CONF as the process had it
    allocator_backend: str | None = None
    trainable: tuple[ParameterCount, ...] | None = None   # None: no model was given
    frozen: tuple[ParameterCount, ...] | None = None
    params_not_on_gpu: int | None = None    # parameters (elements) outside CUDA memory when dumped
    optimizer: str | None = None            # its class, "torch.optim.adamw.AdamW"
    optimizer_state_dtype: str | None = None
    optimizer_state_bytes: int | None = None
    micro_batch: int | None = None
    seq_len: int | None = None
    step: int | None = None                 # the training step of this dump
    reason: str | None = None               # DUMP_REASONS
    time_us: int | None = None
    stacks: str | None = None               # how history was recorded: _record_memory_history's
    context: str | None = None              # stacks, context and max_entries
    max_entries: int | None = None
    oom: OomInfo | None = None
    dropped: tuple[str, ...] = field(default=())   # fields present but unusable, by dotted name

    @property
    def trainable_params(self) -> int | None:
        return None if self.trainable is None else sum(p.count for p in self.trainable)

    @property
    def frozen_params(self) -> int | None:
        return None if self.frozen is None else sum(p.count for p in self.frozen)

    @property
    def trainable_bytes(self) -> int | None:
        return None if self.trainable is None else sum(p.bytes for p in self.trainable)

    @property
    def frozen_bytes(self) -> int | None:
        return None if self.frozen is None else sum(p.bytes for p in self.frozen)


class _Checker:
    """Reads one document field by field, keeping what passes and naming what does not."""

    def __init__(self) -> None:
        self.dropped: list[str] = []

    def section(self, doc: dict, key: str) -> dict:
        v = doc.get(key)
        if v is None:
            return {}
        if type(v) is not dict:
            self.dropped.append(key)
            return {}
        return v

    def int(self, d: dict, key: str, name: str, lo: int = 0, hi: int = _MAX_INT) -> int | None:
        v = d.get(key)
        if v is None:
            return None
        if type(v) is not int or not lo <= v <= hi:   # bool is not int here
            self.dropped.append(name)
            return None
        return v

    def text(self, d: dict, key: str, name: str, pattern: re.Pattern | None = None,
             choices: tuple[str, ...] | None = None) -> str | None:
        v = d.get(key)
        if v is None:
            return None
        ok = type(v) is str and len(v) <= _TEXT_LIMIT and v.isprintable()
        if ok and pattern is not None:
            ok = pattern.fullmatch(v) is not None
        if ok and choices is not None:
            ok = v in choices
        if not ok:
            self.dropped.append(name)
            return None
        return v

    def counts(self, d: dict, key: str, name: str) -> tuple[ParameterCount, ...] | None:
        v = d.get(key)
        if v is None:
            return None
        if type(v) is not dict or len(v) > 64:
            self.dropped.append(name)
            return None
        out = []
        for dtype, c in v.items():
            if type(dtype) is not str or not _DTYPE.fullmatch(dtype) or type(c) is not dict:
                self.dropped.append(f"{name}.{str(dtype)[:40]}")
                continue
            n = self.int(c, "count", f"{name}.{dtype}.count", 0, _MAX_PARAMS)
            b = self.int(c, "bytes", f"{name}.{dtype}.bytes", 0, 8 * _MAX_PARAMS)
            if n is None or b is None:
                if c.get("count") is None or c.get("bytes") is None:     # missing, not wrong
                    self.dropped.append(f"{name}.{dtype}")
                continue
            out.append(ParameterCount(dtype, n, b))
        return tuple(sorted(out, key=lambda p: (-p.bytes, p.dtype)))


def read_metadata(doc) -> RunMetadata | None:
    """The checked metadata of a snapshot's `vramscope_metadata` value (None when the
    snapshot has none or it is not a document at all)."""
    if type(doc) is not dict:
        return None
    c = _Checker()
    schema = c.int(doc, "schema", "schema", 1, 1 << 20)
    dev = c.section(doc, "device")
    dist = c.section(doc, "distributed")
    alloc = c.section(doc, "allocator")
    params = c.section(doc, "parameters")
    opt = c.section(doc, "optimizer")
    batch = c.section(doc, "batch")
    dump = c.section(doc, "dump")
    rec = c.section(doc, "recording")
    oom_doc = c.section(doc, "oom")

    rank = c.int(dist, "rank", "distributed.rank", 0, 1 << 24)
    world = c.int(dist, "world_size", "distributed.world_size", 1, 1 << 24)
    if rank is not None and world is not None and rank >= world:
        c.dropped += ["distributed.rank", "distributed.world_size"]   # which of the two is wrong?
        rank = world = None
    not_on_gpu = c.section(params, "not_on_gpu")
    oom = None
    if oom_doc:
        oom = OomInfo(device=c.int(oom_doc, "device", "oom.device", 0, 1 << 16),
                      requested=c.int(oom_doc, "requested", "oom.requested"),
                      device_total=c.int(oom_doc, "device_total", "oom.device_total") if "device_total" in oom_doc
                      else c.int(oom_doc, "device_allocated", "oom.device_allocated"),   # its old, wrong name
                      device_free=c.int(oom_doc, "device_free", "oom.device_free"))
    writer = c.text(doc, "writer", "writer")
    return RunMetadata(
        schema=schema, writer=writer,
        torch_version=c.text(doc, "torch", "torch", _VERSION),
        cuda_version=c.text(doc, "cuda", "cuda", _VERSION),
        device=c.int(dev, "index", "device.index", 0, 1 << 16),
        gpu_name=c.text(dev, "name", "device.name"),
        gpu_total_memory=c.int(dev, "total_memory", "device.total_memory", 1),
        rank=rank, world_size=world,
        local_rank=c.int(dist, "local_rank", "distributed.local_rank", 0, 1 << 24),
        rank_source=c.text(dist, "source", "distributed.source"),
        allocator_conf=c.text(alloc, "conf", "allocator.conf"),
        allocator_backend=c.text(alloc, "backend", "allocator.backend", _WORD),
        trainable=c.counts(params, "trainable", "parameters.trainable"),
        frozen=c.counts(params, "frozen", "parameters.frozen"),
        params_not_on_gpu=c.int(not_on_gpu, "count", "parameters.not_on_gpu.count", 0, _MAX_PARAMS),
        optimizer=c.text(opt, "class", "optimizer.class", _CLASS),
        optimizer_state_dtype=c.text(opt, "state_dtype", "optimizer.state_dtype", _DTYPE),
        optimizer_state_bytes=c.int(opt, "state_bytes", "optimizer.state_bytes"),
        micro_batch=c.int(batch, "micro_batch", "batch.micro_batch", 1, 1 << 32),
        seq_len=c.int(batch, "seq_len", "batch.seq_len", 1, 1 << 32),
        step=c.int(dump, "step", "dump.step"),
        reason=c.text(dump, "reason", "dump.reason", choices=DUMP_REASONS),
        time_us=c.int(dump, "time_us", "dump.time_us"),
        stacks=c.text(rec, "stacks", "recording.stacks", _WORD),
        context=c.text(rec, "context", "recording.context", _WORD),
        max_entries=c.int(rec, "max_entries", "recording.max_entries", 1),
        oom=oom, dropped=tuple(c.dropped))


__all__ = ["METADATA_KEY", "SCHEMA", "DUMP_REASONS", "ParameterCount", "OomInfo", "RunMetadata", "read_metadata"]
