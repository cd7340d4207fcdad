"""Readable units for the command line and reports (the viewer has its own, with precision)."""


def fmt_bytes(n) -> str:
    """1.50 GiB, 12.0 MiB, 512 B; '-' for None."""
    if n is None:
        return "-"
    n = float(n)
    sign = "-" if n < 0 else ""
    n = abs(n)
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            v = n / scale
            return f"{sign}{v:.2f} {unit}" if v < 100 else f"{sign}{v:.1f} {unit}"
    return f"{sign}{int(n)} B"
