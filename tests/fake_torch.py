"""A stand-in for torch's CUDA memory calls, for testing `vramscope.record` without a GPU.

`FakeCuda` records every call the recorder makes, in order, and behaves as torch does
where the order matters: attaching the OOM observer before recording started raises (it
crashed in torch), and `oom()` calls the observers from "inside the allocator" and only
then raises the OutOfMemoryError, noting which files existed at that moment.
`_snapshot()` returns a copy of a real CUDA snapshot (one of tests/data/cuda_*.pickle,
our own committed files, so `pickle.load` is safe here).

    fake = FakeCuda.from_fixture("cuda_oom.pickle")
    fake.install(monkeypatch)                     # a fake `torch` module: no torch needed (CI)
    fake.patch(monkeypatch, torch)                # or: the real torch, its CUDA calls faked
"""
from __future__ import annotations

import copy
import os
import pickle
import sys
import types
from types import SimpleNamespace

from helpers import DATA

GPU = SimpleNamespace(name="NVIDIA H100 80GB HBM3", total_memory=85_520_809_984)


class FakeOutOfMemoryError(RuntimeError):
    pass


class FakeDtype:
    def __init__(self, name: str, size: int):
        self.name, self.itemsize = name, size

    def __str__(self):
        return f"torch.{self.name}"


BF16, F32, U8 = FakeDtype("bfloat16", 2), FakeDtype("float32", 4), FakeDtype("uint8", 1)


class FakeTensor:
    def __init__(self, n: int, dtype: FakeDtype, requires_grad: bool = False, device: str = "cuda"):
        self.n, self.dtype, self.requires_grad = n, dtype, requires_grad
        self.device = SimpleNamespace(type=device)

    def numel(self):
        return self.n

    def element_size(self):
        return self.dtype.itemsize


class FakeModel:
    def __init__(self, *params: FakeTensor):
        self.params = list(params)

    def parameters(self):
        return iter(self.params)


class FakeAdamW:
    """An optimizer as torch's looks to the recorder: `param_groups` and per-parameter `state`."""
    __module__ = "torch.optim.adamw"

    def __init__(self, model: FakeModel):
        self.param_groups = [{"params": [p for p in model.params if p.requires_grad]}]
        self.state: dict = {}

    def step(self):
        for p in self.param_groups[0]["params"]:
            self.state[id(p)] = {"step": FakeTensor(1, F32, device="cpu"), "exp_avg": FakeTensor(p.n, F32),
                                 "exp_avg_sq": FakeTensor(p.n, F32)}


FakeAdamW.__qualname__ = FakeAdamW.__name__ = "AdamW"


class FakeCuda:
    def __init__(self, snapshot: dict):
        self.snapshot_dict = snapshot
        self.calls: list[tuple] = []
        self.observers: list = []
        self.recording = False
        self.error: type[BaseException] = FakeOutOfMemoryError
        self.files_at_oom: list[str] | None = None
        self.watch_dir: str | None = None
        self.dist: tuple[int, int] | None = None      # (rank, world size) once "initialised"

    @classmethod
    def from_fixture(cls, name: str = "cuda_oom.pickle") -> FakeCuda:
        with open(DATA / name, "rb") as fh:
            return cls(pickle.load(fh))

    # -- torch's calls --------------------------------------------------------------------------
    def record_memory_history(self, enabled="all", context="all", stacks="all", max_entries=sys.maxsize,
                              device=None, clear_history=False, compile_context=False,
                              global_record_annotations=False, skip_actions=None):
        self.calls.append(("history", {"enabled": enabled, "context": context, "stacks": stacks,
                                       "max_entries": max_entries}))
        self.recording = enabled is not None

    def attach_oom_observer(self, fn):
        if not self.recording:
            raise RuntimeError("OOM observer attached before recording started (this crashed in torch)")
        self.calls.append(("attach",))
        self.observers.append(fn)

    def snapshot(self, device=None, augment_with_fx_traces=False):
        self.calls.append(("snapshot",))
        return copy.deepcopy(self.snapshot_dict)

    # -- what the test drives -----------------------------------------------------------------------
    def mark(self, what: str) -> None:
        """A point in the user's program (e.g. 'model built'), for the order of calls."""
        self.calls.append(("mark", what))

    def oom(self, requested: int = 1 << 30, device: int = 0):
        """What the caching allocator does when it runs out: the observers, then the error."""
        self.calls.append(("oom",))
        for fn in self.observers:
            fn(device, requested, 80 << 30, 12 << 20)
        if self.watch_dir is not None:
            self.files_at_oom = sorted(os.path.relpath(os.path.join(d, f), self.watch_dir)
                                       for d, _, fs in os.walk(self.watch_dir) for f in fs)
        self.calls.append(("raise",))
        raise self.error(f"CUDA out of memory. Tried to allocate {requested} bytes")

    def names(self) -> list[str]:
        return [c[0] if c[0] != "mark" else f"mark:{c[1]}" for c in self.calls]

    # -- installing it ------------------------------------------------------------------------------
    def module(self) -> types.ModuleType:
        """A `torch` module with just what the recorder touches."""
        torch = types.ModuleType("torch")
        torch.__version__ = "2.13.0+fake"
        torch.version = SimpleNamespace(cuda="12.8")
        torch.OutOfMemoryError = FakeOutOfMemoryError
        torch.cuda = SimpleNamespace(
            is_available=lambda: True, current_device=lambda: 0, get_device_properties=lambda d: GPU,
            get_allocator_backend=lambda: "native", OutOfMemoryError=FakeOutOfMemoryError,
            memory=SimpleNamespace(_record_memory_history=self.record_memory_history, _snapshot=self.snapshot))
        torch._C = SimpleNamespace(_cuda_attach_out_of_memory_observer=self.attach_oom_observer)
        torch.distributed = SimpleNamespace(
            is_available=lambda: True, is_initialized=lambda: self.dist is not None,
            get_rank=lambda: self.dist[0], get_world_size=lambda: self.dist[1])
        return torch

    def install(self, monkeypatch) -> None:
        """Put the fake `torch` in sys.modules (whether or not torch is installed)."""
        from vramscope import recorder
        monkeypatch.setitem(sys.modules, "torch", self.module())
        monkeypatch.setattr(recorder, "_observer_attached", False)
        monkeypatch.setattr(recorder, "_active", None)

    def patch(self, monkeypatch, torch) -> None:
        """Fake only the CUDA memory calls of the real torch (a CPU build has none of them)."""
        from vramscope import recorder
        self.error = torch.OutOfMemoryError
        monkeypatch.setattr(torch.cuda.memory, "_record_memory_history", self.record_memory_history)
        monkeypatch.setattr(torch.cuda.memory, "_snapshot", self.snapshot)
        monkeypatch.setattr(torch._C, "_cuda_attach_out_of_memory_observer", self.attach_oom_observer,
                            raising=False)
        monkeypatch.setattr(recorder, "_cuda_available", lambda torch: True)
        monkeypatch.setattr(recorder, "_observer_attached", False)
        monkeypatch.setattr(recorder, "_active", None)
