"""What every numeric field of a snapshot may hold, and what we do with the rest.

torch writes sizes, addresses, streams and pool ids as C++ unsigned or pointer-sized
integers, and some unknowns as unsigned -1 (torch 2.5+ writes a frame's unknown line as
18446744073709551615). A broken or hostile file can put anything there: negative numbers,
integers of 2**80, strings. Every value that reaches a fixed-width column passes through
one of the policies below, in the interpreter (Python ints, any size) and in the fast path
(numpy int64 arrays, whose values always fit 64 bits), with the same result:

=========== ========= ===================================================================
field       column    policy
=========== ========= ===================================================================
line        int32     [0, 2**31) kept; anything else (sentinels, negative, huge, not an
                      int) is 0, torch's own "no line" (C++ frames)
size        int64     [0, 2**53) kept; -1 and unsigned -1 / INT64_MAX are "unknown": 0;
                      anything else is refused (it would poison every sum); a segment's
                      sizes (reserved memory only) may also be negative down to -2**53
addr        int64     [0, 2**64) kept as the pointer's 64-bit pattern (>= 2**63 reads
                      negative); -1, unsigned -1 and INT64_MAX are "unknown": 0;
                      negative or wider than 64 bits is refused
stream,     int64     opaque 64-bit ids: [-2**63, 2**64) kept as their bit pattern;
pool id               wider than 64 bits is refused
time_us     int64     [0, 2**62] kept; anything else (sentinels too) is -1, "unknown"
device      int32     [0, 65536) kept; anything else is refused
=========== ========= ===================================================================

On top of each value's range, the sums that live and reserved memory take must stay in
int64: every size is below 2**53 and `MAX_TOTAL_BYTES` bounds the sum of a device's trace
sizes, of its block sizes and of its segment sizes (2**61 each, so that live bytes, start
bytes and their differences all stay within +-2**62).
"""
from __future__ import annotations

import numpy as np

from .errors import LimitError

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
U64_MAX = (1 << 64) - 1
MAX_LINE = (1 << 31) - 1
MAX_SIZE = (1 << 53) - 1            # 8 PiB in one allocation: no GPU comes near
MAX_TIME_US = 1 << 62
MAX_DEVICE = (1 << 16) - 1
MAX_TOTAL_BYTES = 1 << 61           # sum over one device's trace, blocks or segments
_UNKNOWN = (-1, U64_MAX, INT64_MAX)  # how C++ writes "no value" into an integer


def line(v) -> int:
    if type(v) is int and 0 <= v <= MAX_LINE:
        return v
    if isinstance(v, bool):
        return int(v)
    return 0


def size(v, what: str = "size", unknown: int = 0) -> int:
    """A byte count; `unknown` for a missing value or a sentinel."""
    if type(v) is int:
        if 0 <= v <= MAX_SIZE:
            return v
        if v in _UNKNOWN:
            return unknown
        raise LimitError(f"a {what} of {_short(v)} bytes: no allocation is larger than "
                         f"{MAX_SIZE:,} bytes or negative")
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, int):
        return size(int(v), what, unknown)
    return unknown


def signed_size(v, what: str = "segment size", unknown: int = 0) -> int:
    """A byte count of allocator state that only reserved memory adds up (a segment's
    sizes): a negative one is nonsense but harmless, and kept as given as it always was
    (trimmed exports of expandable segments have written one); its magnitude is held to
    the same bound as every size."""
    if type(v) is int and -MAX_SIZE <= v <= MAX_SIZE:
        return v
    return size(v, what, unknown)


def addr(v, what: str = "address") -> int:
    if type(v) is int:
        if 0 <= v <= INT64_MAX:
            return 0 if v == INT64_MAX else v
        if v in _UNKNOWN:
            return 0
        if INT64_MAX < v <= U64_MAX:
            return v - (1 << 64)            # the pointer's bit pattern
        raise LimitError(f"an {what} of {_short(v)}: not a 64-bit pointer")
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, int):
        return addr(int(v), what)
    return 0


def opaque(v, what: str = "stream", unknown: int = 0) -> int:
    """A 64-bit identifier (stream, pool id): kept as its bit pattern."""
    if type(v) is int:
        if INT64_MIN <= v <= INT64_MAX:
            return v
        if INT64_MAX < v <= U64_MAX:
            return v - (1 << 64)
        raise LimitError(f"a {what} of {_short(v)}: wider than 64 bits")
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, int):
        return opaque(int(v), what, unknown)
    return unknown


def time_us(v) -> int:
    if type(v) is int and 0 <= v <= MAX_TIME_US:
        return v
    return -1


def device(v, default: int = 0) -> int:
    if v is None:
        return default
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, int) and 0 <= v <= MAX_DEVICE:
        return int(v)
    if isinstance(v, int):
        raise LimitError(f"device {_short(v)}: device numbers run from 0 to {MAX_DEVICE}")
    return default


def optional_size(v) -> int | None:
    """A byte count that only informs (oom `device_free`): None when unknown or absurd."""
    if type(v) is int and 0 <= v <= MAX_SIZE:
        return v
    return None


# -- the same policies on the fast path's int64 arrays ---------------------------------------
def size_array(a: np.ndarray, what: str = "size") -> np.ndarray:
    bad = (a < 0) | (a > MAX_SIZE)
    if bad.any():
        vals = a[bad]
        unknown = (vals == -1) | (vals == INT64_MAX)
        if not unknown.all():
            raise LimitError(f"a {what} of {_short(int(vals[~unknown][0]))} bytes: no allocation is larger "
                             f"than {MAX_SIZE:,} bytes or negative")
        a = np.where(bad, 0, a)
    return a


def addr_array(a: np.ndarray, what: str = "address") -> np.ndarray:
    bad = (a < 0) | (a == INT64_MAX)
    if bad.any():
        vals = a[bad]
        unknown = (vals == -1) | (vals == INT64_MAX)
        if not unknown.all():
            raise LimitError(f"an {what} of {_short(int(vals[~unknown][0]))}: not a 64-bit pointer")
        a = np.where(bad, 0, a)
    return a


def time_array(a: np.ndarray) -> np.ndarray:
    bad = (a < 0) | (a > MAX_TIME_US)
    if bad.any():
        a = np.where(bad, -1, a)
    return a


def check_total(total: float, what: str) -> None:
    """`total`: a float64 sum of non-negative sizes (exact enough for a bound)."""
    if total > MAX_TOTAL_BYTES:
        raise LimitError(f"{what} add up to more than 2**61 bytes (2 EiB): not a real trace")


def _short(v: int) -> str:
    if abs(v) < 10 ** 30:
        return f"{v:,}"
    return f"an integer of {v.bit_length()} bits"


__all__ = ["line", "size", "signed_size", "addr", "opaque", "time_us", "device", "optional_size", "size_array", "addr_array",
           "time_array", "check_total", "MAX_SIZE", "MAX_LINE", "MAX_TOTAL_BYTES"]
