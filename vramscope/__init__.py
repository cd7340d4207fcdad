"""vramscope: PyTorch CUDA memory snapshots, opened safely and fast.

The public Python API (stable; README "Python"):

    vramscope.open(path, device=None, rules=None)  -> SnapshotAnalysis (the analysis every surface reads)
    vramscope.record(out_dir, every=None, ...)     -> Recorder (records snapshots during a run)
    vramscope.SnapshotError                        bad input (not a snapshot, unsafe, truncated, corrupt)

The names are imported on first use (PEP 562): `import vramscope` loads neither numpy nor
torch, and the command line starts as fast as before. (No eager imports for type checkers
here: every layer imports this package for `__version__`, so an import of `api` here,
even under TYPE_CHECKING, would make the layers look circular to import-linter.)
"""
from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:            # `typing` costs milliseconds on every start, when Ctrl-C has no handler of ours yet
    from typing import Any

__version__ = "0.1.0"

_WHERE = {
    "open": "api", "SnapshotAnalysis": "api", "AllocationTable": "api",
    "record": "recorder", "Recorder": "recorder",
    "SnapshotError": "parsers", "RunMetadata": "parsers",
}
__all__ = ["__version__", *sorted(_WHERE)]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE))

