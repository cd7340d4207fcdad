"""Read torch CUDA memory snapshots safely into numpy columns (no Qt here, ever)."""
from .cache import open_snapshot
from .errors import (Cancelled, CorruptError, LimitError, NotASnapshotError, SnapshotError, TruncatedError,
                     UnsafePickleError, UnsupportedPickleError)
from .live import Allocations, LiveModel, allocations, live_model
from .metadata import METADATA_KEY, ParameterCount, RunMetadata, read_metadata
from .progress import Progress, TerminalProgress
from .snapshot import DeviceTrace, Snapshot

__all__ = [
    "open_snapshot", "Snapshot", "DeviceTrace", "live_model", "LiveModel", "allocations", "Allocations",
    "Progress", "TerminalProgress", "SnapshotError", "UnsafePickleError", "UnsupportedPickleError",
    "TruncatedError", "CorruptError", "LimitError", "NotASnapshotError", "Cancelled",
    "METADATA_KEY", "RunMetadata", "ParameterCount", "read_metadata",
]
