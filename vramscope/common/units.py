"""Readable numbers, one definition for every surface: bytes, durations, axis times, sizes typed by a user."""
from __future__ import annotations

import math
import re

KiB, MiB, GiB, TiB = 1 << 10, 1 << 20, 1 << 30, 1 << 40


def fmt_bytes(n, precision: int = 2) -> str:
    """1.50 GiB, 12.0 MiB, 512 B (binary units, as nvidia-smi and torch report)."""
    if n is None:
        return "-"
    n = float(n)
    sign = "-" if n < 0 else ""
    n = abs(n)
    for unit, scale in (("TiB", TiB), ("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= scale:
            v = n / scale
            p = precision if v < 100 else max(0, precision - 1)
            return f"{sign}{v:.{p}f} {unit}"
    return f"{sign}{int(n)} B"


def byte_unit(span: float) -> tuple[str, int]:
    """The unit to label an axis whose largest value is `span` bytes."""
    span = abs(span)
    for unit, scale in (("TiB", TiB), ("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if span >= scale:
            return unit, scale
    return "B", 1


def fmt_duration_us(us) -> str:
    """A duration given in microseconds: 850 µs, 12.3 ms, 4.56 s, 2 min 3 s."""
    if us is None or us < 0:
        return "-"
    us = float(us)
    if us < 1_000:
        return f"{us:.0f} µs"
    if us < 1_000_000:
        return f"{us / 1e3:.3g} ms"
    s = us / 1e6
    if s < 120:
        return f"{s:.3g} s"
    m, s = divmod(s, 60)
    if m < 120:
        return f"{int(m)} min {s:.0f} s"
    h, m = divmod(m, 60)
    return f"{int(h)} h {int(m)} min"


def fmt_seconds(x: float, spacing: float | None = None, span: float | None = None) -> str:
    """A time on the axis (seconds since the first event) in the unit that suits
    `span` (the largest value shown; default x), precise enough for `spacing`."""
    span = abs(span if span is not None else x)
    spacing = abs(spacing) if spacing else (span or 1.0)
    if span < 1e-3:
        unit, scale = "µs", 1e6
    elif span < 1.0:
        unit, scale = "ms", 1e3
    elif span < 600:
        unit, scale = "s", 1.0
    else:
        m, s = divmod(x, 60)
        digits = max(0, -int(math.floor(math.log10(spacing)))) if spacing < 1 else 0
        return f"{int(m)}:{s:0{3 + digits if digits else 2}.{digits}f}"
    digits = max(0, -int(math.floor(math.log10(spacing * scale) + 1e-9)))
    return f"{x * scale:.{digits}f} {unit}"


_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([kmgt]?)(i?)(b?)\s*$", re.IGNORECASE)


def parse_size(text: str) -> int | None:
    """'1.5 GiB', '512k', '100MB', '4096' -> bytes (K/M/G/T are binary either way:
    allocator sizes are). Empty -> 0; unreadable -> None."""
    if not text.strip():
        return 0
    m = _SIZE_RE.match(text)
    if not m:
        return None
    value = float(m.group(1))
    scale = {"": 1, "k": KiB, "m": MiB, "g": GiB, "t": TiB}[m.group(2).lower()]
    return int(value * scale)


# GPU and memory-limit sizes typed by a user (`--gpu`, `--max-peak`, the viewer's GPU box): one
# convention for every verb (DESIGN.md §6): GB = 10^9 bytes, GiB = 2^30; a bare K/M/G/T and a
# bare number are binary (torch, nvidia-smi and the allocator count in GiB)
_LIMIT_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*(?:([kmgt])(i?b?)|(b))?\s*$", re.IGNORECASE)
_BINARY = {"k": KiB, "m": MiB, "g": GiB, "t": TiB}
_DECIMAL = {"k": 10 ** 3, "m": 10 ** 6, "g": 10 ** 9, "t": 10 ** 12}


def parse_byte_size(text, what: str = "size", bare: int = GiB) -> int:
    """'24' (x `bare`: GiB), '24GiB', '24G', '500MiB' (binary), '80GB', '512MB' (decimal:
    GB = 10^9), '4096B' -> bytes. ValueError with one line naming `what` for anything else:
    not a size, zero, negative, under one byte, not finite."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        text = repr(text)
    s = str(text)
    m = _LIMIT_RE.match(s)
    if not m:
        sign = s.strip().startswith("-") and _LIMIT_RE.match(s.strip()[1:]) is not None
        raise ValueError(f"{what} {s!r}: " + ("must be more than 0" if sign else
                                              "expected a size such as 24 (GiB), 24GiB, 500MiB or 80GB (10^9 bytes)"))
    value = float(m.group(1))
    letter, suffix = (m.group(2) or "").lower(), (m.group(3) or "").lower()
    if not letter:
        scale = 1 if m.group(4) else bare
    else:
        scale = _DECIMAL[letter] if suffix == "b" else _BINARY[letter]
    size = value * scale
    if not math.isfinite(size) or size <= 0:
        raise ValueError(f"{what} {s!r}: must be more than 0")
    if size < 1 or size >= 2 ** 63:
        raise ValueError(f"{what} {s!r}: " + ("less than one byte" if size < 1 else "more bytes than any memory holds"))
    return int(size)
