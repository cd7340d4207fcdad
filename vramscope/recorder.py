"""Record CUDA memory snapshots during a real run, the way vramscope reads them best.

    with vramscope.record("memory_snapshot", every=100) as rec:    # before the model is built
        model = build_model().cuda()
        opt = torch.optim.AdamW(model.parameters())
        rec.watch(model, opt, micro_batch=8, seq_len=2048)         # optional: exact counts in the file
        for batch in loader:
            train_step(model, opt, batch)
            rec.step()                                              # dumps every 100 steps

What it does, in order, and why:
  * starts torch's allocator history (`torch.cuda.memory._record_memory_history`) when the
    block is entered, so that everything allocated inside (the weights first) carries its
    Python stack; `stacks="python"` and a bounded `max_entries` by default, because
    `stacks="all"` (C++ frames too) made one dump take 461 s against 4 s and an unbounded
    history writes gigabytes;
  * only then attaches torch's OOM observer (`torch._C._cuda_attach_out_of_memory_observer`;
    attaching it before recording started crashed in torch), once per process, and at an
    OOM dumps the snapshot from inside the allocator, before the OutOfMemoryError unwinds
    the stack and frees what filled the GPU;
  * dumps on request (`rec.dump()`) and every `every` steps (`rec.step()`), one file per
    rank in torchtitan's layout exactly (torchtitan/tools/profiler.py `MEMORY_STEP_DIR`,
    `MEMORY_EXIT_DIR`, `MEMORY_FILE`): `OUT/step_{N:012d}/{rank:06d}_step_{N}.pickle`, and at
    an OOM the same file name under `OUT/step_{N:012d}_exit/` (N: the steps completed; the
    zero-padded folders sort in step order), so that `ranks` and torchtitan's own tools read
    both alike; the rank from `torch.distributed` when it is initialised, else $RANK /
    $LOCAL_RANK;
  * pickles `torch.cuda.memory._snapshot()` itself with protocol 4, atomically (a reader sees
    the whole file or none): Python 3.14's default protocol 5 shows blank in memory_viz,
    whose JavaScript unpickler reads protocols 2 to 4 only;
  * adds one top-level key, `vramscope_metadata` (parsers/metadata.py: versions, the GPU,
    rank and world size, the allocator settings, parameter counts by dtype, the optimizer
    and its state dtype, micro-batch and sequence length, the step and reason of the dump),
    which vramscope's analysis reads and every other reader ignores;
  * stops recording when the block is left (`_record_memory_history(enabled=None)`), after a
    last dump if none was made at the current step (`dump_on_exit`).

torch is imported when recording starts, never by `import vramscope`. Without CUDA the
recorder warns and records nothing, so the same script runs on a laptop. Nothing the
recorder does may break the run it records: a dump that fails is a warning.
"""
from __future__ import annotations

import contextlib
import os
import pickle
import sys
import threading
import time
import warnings
from types import FrameType
from typing import Any, Callable, Literal

from . import __version__
from .common.atomic import atomic_write
from .parsers.metadata import METADATA_KEY, SCHEMA

DEFAULT_DIR = "memory_snapshot"
DEFAULT_MAX_ENTRIES = 100_000       # about 13 MB of pickle (10^6 entries: about 128 MB)
PICKLE_PROTOCOL = 4                 # memory_viz reads 2 to 4 (protocol 5: a blank page)

_lock = threading.RLock()           # one dump at a time (an OOM may come from autograd's thread)
_active: Recorder | None = None     # the recorder torch's history belongs to (one per process)
_observer_attached = False          # torch cannot detach an OOM observer: attach one, once


_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep      # vramscope/, integrations/ included


def _warn(message: str) -> None:
    """A RuntimeWarning pointed at the user's line: the first caller outside vramscope (the
    Trainer callbacks included) and contextlib (through which `with` and the decorator call)."""
    level = 2
    frame: FrameType | None = sys._getframe(1)
    while frame is not None and (frame.f_code.co_filename.startswith(_PACKAGE)
                                 or frame.f_code.co_filename == contextlib.__file__):
        frame = frame.f_back
        level += 1
    warnings.warn(message, RuntimeWarning, stacklevel=level)


def _cuda_available(torch) -> bool:
    return bool(torch.cuda.is_available())


def _is_oom(torch, exc: BaseException | None) -> bool:
    if exc is None:
        return False
    types = tuple(t for t in (getattr(torch, "OutOfMemoryError", None),
                              getattr(getattr(torch, "cuda", None), "OutOfMemoryError", None))
                  if isinstance(t, type))
    if types and isinstance(exc, types):
        return True
    return isinstance(exc, RuntimeError) and "CUDA out of memory" in str(exc)   # torch < 2.1


def _on_oom(device, allocated, device_total, device_free) -> None:
    """torch's OOM observer: called by the caching allocator, before it raises, with the
    arguments c10's `OutOfMemoryObserver` names (CUDACachingAllocator.h): the device, the
    request that failed, the device's total memory (the allowed maximum under a memory
    fraction) and the bytes CUDA reported free."""
    rec = _active
    if rec is None:
        return
    try:
        rec._dump_oom({"device": device, "requested": allocated, "device_total": device_total,
                       "device_free": device_free})
    except Exception as e:  # noqa: BLE001 - never raise into the allocator
        _warn(f"vramscope.record: the snapshot at the OOM was not written: {type(e).__name__}: {e}")


class Recorder(contextlib.ContextDecorator):
    """Records the CUDA allocator's history and dumps snapshots (see the module docstring).

    A context manager and a decorator; `start()` / `stop()` for code that cannot use a
    `with` block (the Trainer callbacks)."""

    def __init__(self, out_dir: str | os.PathLike = DEFAULT_DIR, *, every: int | None = None,
                 max_entries: int = DEFAULT_MAX_ENTRIES, stacks: str = "python", context: str = "all",
                 model: Any = None, optimizer: Any = None, micro_batch: int | None = None,
                 seq_len: int | None = None, dump_on_oom: bool = True, dump_on_exit: bool = True,
                 start_step: int = 0):
        if every is not None and (not isinstance(every, int) or every < 1):
            raise ValueError(f"every must be a positive number of steps, not {every!r}")
        if not isinstance(max_entries, int) or max_entries < 1:
            raise ValueError(f"max_entries must be a positive int, not {max_entries!r} (unbounded history "
                             f"writes gigabytes)")
        if stacks not in ("python", "all"):
            raise ValueError(f"stacks must be 'python' or 'all', not {stacks!r}")
        self.out_dir = os.fspath(out_dir)
        self.every = every
        self.max_entries = max_entries
        self.stacks = stacks
        self.context = context
        self.dump_on_oom = dump_on_oom
        self.dump_on_exit = dump_on_exit
        self.model, self.optimizer = model, optimizer
        self.micro_batch, self.seq_len = micro_batch, seq_len
        self.start_step = start_step
        self.step_count = start_step         # steps completed (rec.step() counts them)
        self.files: list[str] = []           # every file written, in order
        self.recording = False               # history is on for this recorder
        self._torch: Any = None
        self._dumped_steps: set[tuple[int, str]] = set()

    # -- what the user tells us ---------------------------------------------------------------
    def watch(self, model: Any = None, optimizer: Any = None, *, micro_batch: int | None = None,
              seq_len: int | None = None) -> Recorder:
        """The model and optimizer (and batch shape) whose facts go into every later dump's
        metadata: parameter counts by dtype, the optimizer's class and state dtype."""
        if model is not None:
            self.model = model
        if optimizer is not None:
            self.optimizer = optimizer
        if micro_batch is not None:
            self.micro_batch = micro_batch
        if seq_len is not None:
            self.seq_len = seq_len
        return self

    # -- start and stop -------------------------------------------------------------------------
    def start(self) -> Recorder:
        """Start recording (what entering the `with` block does)."""
        global _active, _observer_attached
        try:
            import torch
        except ImportError:
            raise ImportError("vramscope.record needs PyTorch: pip install torch (or \"vramscope[torch]\")") from None
        with _lock:
            if _active is not None and _active is not self:
                _warn("vramscope.record: another recorder was still recording; it is stopped and "
                              "this one takes over")
                _active.stop()
            self._torch = torch
            self._dumped_steps.clear()
            self.step_count = self.start_step     # a decorated function's every call is a run
            if not _cuda_available(torch):
                _warn("vramscope.record: CUDA is not available, nothing is recorded")
                return self
            torch.cuda.memory._record_memory_history(enabled="all", context=self.context, stacks=self.stacks,
                                                     max_entries=self.max_entries)
            self.recording = True
            _active = self
            # after recording started, never before: attaching first crashed in torch
            if self.dump_on_oom and not _observer_attached:
                attach = getattr(torch._C, "_cuda_attach_out_of_memory_observer", None)
                if attach is None:
                    _warn("vramscope.record: this torch has no OOM observer; at an OOM the snapshot "
                                  "is dumped when the OutOfMemoryError leaves the `with` block instead")
                else:
                    attach(_on_oom)
                    _observer_attached = True
        return self

    def stop(self, exc: BaseException | None = None) -> None:
        """Dump what is due (an OOM the observer missed, or a last snapshot) and stop recording."""
        global _active
        with _lock:
            if not self.recording:
                return
            try:
                if _is_oom(self._torch, exc):
                    if self.dump_on_oom and (self.step_count, "oom") not in self._dumped_steps:
                        self._dump_quietly(reason="oom")
                elif exc is None and self.dump_on_exit and not any(s == self.step_count
                                                                  for s, _ in self._dumped_steps):
                    self._dump_quietly(reason="exit")
            finally:
                self.recording = False
                if _active is self:
                    _active = None
                try:
                    self._torch.cuda.memory._record_memory_history(enabled=None)
                except Exception as e:  # noqa: BLE001 - never hide the run's own exception
                    _warn(f"vramscope.record: stopping the history failed: {type(e).__name__}: {e}")

    def __enter__(self) -> Recorder:
        return self.start()

    def __exit__(self, exc_type, exc, tb) -> Literal[False]:
        self.stop(exc)
        return False

    # -- dumps ----------------------------------------------------------------------------------
    def step(self, step: int | None = None) -> str | None:
        """One training step done (`step`: its number, else one more than the last): dumps
        every `every` steps, once per step. Returns the file written, if any."""
        self.step_count = self.step_count + 1 if step is None else int(step)
        if self.every and self.step_count % self.every == 0 and (self.step_count, "step") not in self._dumped_steps:
            return self.dump(reason="step")
        return None

    def dump(self, path: str | os.PathLike | None = None, *, step: int | None = None,
             reason: str = "request") -> str | None:
        """Write a snapshot now: to `path`, else to this rank's file for `step` (default: the
        steps completed). Returns the path, or None when nothing is recorded (no CUDA)."""
        with _lock:
            if not self.recording:
                return None
            step = self.step_count if step is None else int(step)
            return self._write(path, step, reason, None)

    def path_for(self, step: int, exit: bool = False, rank: int | None = None) -> str:
        """This rank's file for `step` in torchtitan's layout (see the module docstring)."""
        r = self._rank()[0] if rank is None else rank
        folder = f"step_{step:012d}" + ("_exit" if exit else "")
        return os.path.join(self.out_dir, folder, f"{r:06d}_step_{step}.pickle")

    def _dump_oom(self, oom: dict) -> None:
        with _lock:
            if not (self.recording and self.dump_on_oom) or (self.step_count, "oom") in self._dumped_steps:
                return      # one snapshot per step: the first OOM (a retry's later ones add little)
            self._write(None, self.step_count, "oom", oom)

    def _dump_quietly(self, reason: str) -> None:
        try:
            self._write(None, self.step_count, reason, None)
        except Exception as e:  # noqa: BLE001 - leaving the block must not fail because a dump did
            _warn(f"vramscope.record: the {reason} snapshot was not written: {type(e).__name__}: {e}")

    def _write(self, path, step: int, reason: str, oom: dict | None) -> str:
        torch = self._torch
        snapshot = torch.cuda.memory._snapshot()
        if isinstance(snapshot, dict):          # after torch's keys: readers look for those first
            snapshot[METADATA_KEY] = self.metadata(step, reason, oom)
        target = os.fspath(path) if path is not None else self.path_for(step, exit=reason == "oom")
        folder = os.path.dirname(os.path.abspath(target))
        os.makedirs(folder, exist_ok=True)
        atomic_write(target, lambda fh: pickle.dump(snapshot, fh, protocol=PICKLE_PROTOCOL))
        self._dumped_steps.add((step, reason))
        self.files.append(target)
        return target

    # -- the metadata document ----------------------------------------------------------------------
    def metadata(self, step: int, reason: str, oom: dict | None = None) -> dict:
        """The `vramscope_metadata` document of a dump now (parsers/metadata.py). Each part
        is collected on its own; a part that fails is left out, never fatal."""
        torch = self._torch
        rank, world, local, source = self._rank()
        doc: dict[str, Any] = {"schema": SCHEMA, "writer": f"vramscope {__version__}"}
        parts: list[tuple[str, Callable[[], Any]]] = [
            ("torch", lambda: str(torch.__version__)),
            ("cuda", lambda: torch.version.cuda),
            ("device", lambda: _device_info(torch)),
            ("distributed", lambda: {"rank": rank, "world_size": world, "local_rank": local, "source": source}),
            ("allocator", lambda: _allocator_info(torch)),
            ("parameters", lambda: parameter_counts(self.model) if self.model is not None else None),
            ("optimizer", lambda: optimizer_info(self.optimizer) if self.optimizer is not None else None),
            ("batch", lambda: {k: v for k, v in (("micro_batch", self.micro_batch), ("seq_len", self.seq_len))
                               if isinstance(v, int) and not isinstance(v, bool)} or None),
            ("dump", lambda: {"step": step, "reason": reason, "time_us": int(time.time() * 1e6)}),
            ("recording", lambda: {"stacks": self.stacks, "context": self.context, "max_entries": self.max_entries}),
            ("oom", lambda: {k: int(v) for k, v in oom.items() if isinstance(v, int)} if oom else None),
        ]
        for key, get in parts:
            try:
                value = get()
            except Exception:  # noqa: BLE001 - a fact we cannot collect is left out
                continue
            if value is not None:
                doc[key] = value
        return doc

    def _rank(self) -> tuple[int, int | None, int | None, str]:
        """(rank, world size, local rank, where the rank came from), asked at each dump: the
        process group may be initialised after recording started."""
        local = _env_int("LOCAL_RANK")
        dist = getattr(self._torch, "distributed", None)
        try:
            if dist is not None and dist.is_available() and dist.is_initialized():
                return int(dist.get_rank()), int(dist.get_world_size()), local, "torch.distributed"
        except Exception:  # noqa: BLE001
            pass
        for var in ("RANK", "LOCAL_RANK"):
            r = _env_int(var)
            if r is not None:
                return r, _env_int("WORLD_SIZE"), local, f"env {var}"
        return 0, 1, local, "single process"


def record(out_dir: str | os.PathLike | Callable = DEFAULT_DIR, **options) -> Any:
    """A `Recorder` (see the module docstring): `with vramscope.record(DIR, every=N) as rec:`,
    or as a decorator, `@vramscope.record(DIR)` or bare `@vramscope.record`."""
    if callable(out_dir) and not isinstance(out_dir, (str, os.PathLike)):
        return Recorder(**options)(out_dir)
    return Recorder(out_dir, **options)


# -- facts about the run ---------------------------------------------------------------------------
def _env_int(name: str) -> int | None:
    v = os.environ.get(name, "").strip()
    return int(v) if v.isdigit() else None


def _dtype_name(dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _device_info(torch) -> dict:
    dev = int(torch.cuda.current_device())
    props = torch.cuda.get_device_properties(dev)
    return {"index": dev, "name": str(props.name), "total_memory": int(props.total_memory)}


def _allocator_info(torch) -> dict:
    conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", os.environ.get("PYTORCH_ALLOC_CONF"))
    out: dict[str, Any] = {"conf": conf}
    backend = getattr(torch.cuda, "get_allocator_backend", None)
    if backend is not None:
        with contextlib.suppress(Exception):
            out["backend"] = str(backend())
    return out


def _local(t):
    """A parameter's local shard (FSDP2 / DTensor parameters), else the parameter."""
    to_local = getattr(t, "to_local", None)
    return to_local() if callable(to_local) else t


def parameter_counts(model) -> dict:
    """{"trainable": {dtype: {"count", "bytes"}}, "frozen": {...}, "not_on_gpu": {"count", "bytes"}}
    over the model's parameters (each shared parameter once; a sharded one by its local shard)."""
    out: dict[str, dict] = {"trainable": {}, "frozen": {}}
    off_count = off_bytes = 0
    for p in model.parameters():
        t = _local(p)
        n = int(t.numel())
        b = n * int(t.element_size())
        side = out["trainable" if p.requires_grad else "frozen"]
        c = side.setdefault(_dtype_name(t.dtype), {"count": 0, "bytes": 0})
        c["count"] += n
        c["bytes"] += b
        if getattr(getattr(t, "device", None), "type", "cuda") != "cuda":
            off_count += n
            off_bytes += b
    out["not_on_gpu"] = {"count": off_count, "bytes": off_bytes}
    return out


def _unwrap_optimizer(opt):
    """The torch optimizer inside the wrappers frameworks put around it (accelerate's
    AcceleratedOptimizer `.optimizer`, Lightning's LightningOptimizer `._optimizer`)."""
    for _ in range(4):
        inner = next((getattr(opt, a) for a in ("optimizer", "_optimizer")
                      if hasattr(getattr(opt, a, None), "param_groups")), None)
        if inner is None or inner is opt:
            break
        opt = inner
    return opt


def optimizer_info(optimizer) -> dict:
    """{"class": "torch.optim.adamw.AdamW", "state_dtype", "state_bytes"}: the state's dtype
    is the one holding the most bytes (scalars such as Adam's `step` left out); no state
    before the first step."""
    opt = _unwrap_optimizer(optimizer)
    cls = type(opt)
    out: dict[str, Any] = {"class": f"{cls.__module__}.{cls.__qualname__}"}
    by_dtype: dict[str, int] = {}
    for state in getattr(opt, "state", {}).values():
        for v in (state.values() if isinstance(state, dict) else ()):
            if hasattr(v, "dtype") and hasattr(v, "numel") and hasattr(v, "element_size"):
                v = _local(v)
                n = int(v.numel())
                if n > 1:
                    by_dtype[_dtype_name(v.dtype)] = by_dtype.get(_dtype_name(v.dtype), 0) + n * int(v.element_size())
    if by_dtype:
        out["state_dtype"] = max(by_dtype, key=lambda k: (by_dtype[k], k))
        out["state_bytes"] = sum(by_dtype.values())
    return out


__all__ = ["record", "Recorder", "parameter_counts", "optimizer_info", "DEFAULT_DIR", "DEFAULT_MAX_ENTRIES",
           "PICKLE_PROTOCOL"]
