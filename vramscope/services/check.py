"""`vramscope check`: memory limits for CI, with what broke them.

    result = check(an, max_peak=SIZE, baseline=an_base, max_growth=PCT, device=None)
    result.ok, result.limits                 # one LimitResult per limit and device
    check_document(result), check_text(result)

Two kinds of limit, each checked per device (every device with data, or `device`):
  * `max_peak`: the peak (exactly `summary`'s) must not exceed the size;
  * `max_growth`: against a baseline recording of the same run, the peak must not grow by
    more than the percentage (the comparison is classifiers/compare.py's, as `vramscope
    compare BASELINE FILE` reports it: A the baseline, B the file). A device with data in
    the file and none in the baseline fails it, with that reason: its growth cannot be
    checked, and a limit that cannot be checked never passes (`max_peak`, when given, is
    still checked on it as on every device).
A broken limit says what its number is made of: with a baseline, what grew, by category
and by code site (the compare analysis' deltas, largest growth first); without one, what
was largest at the peak (categories, and the code sites live there).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..classifiers.compare import DeviceComparison, sites_at
from ..common.units import fmt_bytes
from ..parsers import SnapshotError
from ..present.stacks import Stacks, site_where
from ..present.words import signed_bytes
from .compare import compare_analyses

if TYPE_CHECKING:
    from ..classifiers.analysis import Analysis

SHOWN = 3                     # categories and sites named in a line


@dataclass(frozen=True)
class Contribution:
    """A category or a code site: its bytes (at the peak) or its growth (B - A)."""
    what: str
    bytes: int


@dataclass(frozen=True)
class LimitResult:
    limit: str                      # "max_peak" or "max_growth"
    device: int
    threshold: float                # bytes (max_peak) or percent (max_growth)
    measured: float                 # the peak in bytes, or its growth in percent (inf: from nothing)
    ok: bool
    peak_bytes: int                 # the file's peak on this device
    baseline_bytes: int | None      # the baseline's (max_growth only)
    by_category: tuple[Contribution, ...]   # what grew (with a baseline) or was largest (without)
    sites: tuple[Contribution, ...]
    grew: bool                      # by_category / sites are growth (True) or sizes at the peak (False)
    line: str                       # the one line that tells it


@dataclass(frozen=True)
class CheckResult:
    file: str
    baseline: str | None
    limits: tuple[LimitResult, ...]
    notes: tuple[str, ...] = field(default=())

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.limits)


def parse_growth(text: str) -> float:
    """'5', '5%', '2.5' -> 5.0, 5.0, 2.5 (percent); ValueError with a one-line message."""
    s = str(text).strip().removesuffix("%").strip()
    try:
        v = float(s)
    except ValueError:
        raise ValueError(f"--max-growth {text!r}: expected a percentage such as 5 or 2.5%") from None
    if not v >= 0 or v == float("inf"):
        raise ValueError(f"--max-growth {text!r}: must be a percentage of 0 or more")
    return v


def _largest(d: dict[str, int], positive: bool) -> tuple[Contribution, ...]:
    items = [(k, v) for k, v in d.items() if v > 0] if positive else list(d.items())
    return tuple(Contribution(k, int(v)) for k, v in sorted(items, key=lambda kv: (-kv[1], kv[0]))[:SHOWN])


def _said(items: tuple[Contribution, ...], growth: bool) -> str:
    return ", ".join(f"{c.what} {signed_bytes(c.bytes) if growth else fmt_bytes(c.bytes)}" for c in items)


def _what(cats: tuple[Contribution, ...], sites: tuple[Contribution, ...], grew: bool) -> str:
    """What a broken limit's number is made of, as the rest of its line."""
    if not cats and not sites:
        return "; nothing grew" if grew else ""
    text = f"; {'grew' if grew else 'largest at the peak'}: {_said(cats, grew) or '-'}"
    if sites:
        text += f"; {'sites' if grew else 'sites at the peak'}: {_said(sites, grew)}"
    return text


def _growth_of(dc: DeviceComparison) -> tuple[tuple[Contribution, ...], tuple[Contribution, ...]]:
    cats = _largest(dict(dc.by_category_delta), positive=True)
    sites = tuple(Contribution(site_where(s.file, s.function), s.delta)
                  for s in sorted((s for s in dc.sites if s.delta > 0), key=lambda s: (-s.delta, s.file, s.function))
                  [:SHOWN])
    return cats, sites


def _at_peak(an: Analysis, dev: int, stacks: Stacks) -> tuple[tuple[Contribution, ...], tuple[Contribution, ...]]:
    da = an.devices[dev]
    cats = _largest(da.peak.by_category, positive=True)
    sites = tuple(Contribution(site_where(s.file, s.function), s.bytes)
                  for s in sites_at(da, da.peak.index, stacks.site_key)[:SHOWN])
    return cats, sites


def check(an: Analysis, max_peak: int | None = None, baseline: Analysis | None = None,
          max_growth: float | None = None, device: int | None = None) -> CheckResult:
    """Check `an` against the limits (see the module docstring). `max_growth` without a
    `baseline` is a ValueError; files with nothing to check raise SnapshotError (bad input)."""
    if max_growth is not None and baseline is None:
        raise ValueError("--max-growth needs --baseline OTHER (the recording to grow from)")
    if max_peak is None and baseline is None:
        raise ValueError("no limit to check: give --max-peak SIZE and/or --baseline OTHER")
    path = an.snapshot.path
    if not an.devices:
        raise SnapshotError("no allocations recorded (an empty snapshot): nothing to check", path)
    devices = [d for d in sorted(an.devices) if device is None or d == device]
    if not devices:
        listed = ", ".join(str(d) for d in sorted(an.devices))
        raise ValueError(f"no device {device} in {path} (devices with data: {listed})")
    limits: list[LimitResult] = []
    notes: list[str] = []
    growth: dict[int, DeviceComparison] = {}
    if baseline is not None:
        if not baseline.devices:
            raise SnapshotError("no allocations recorded (an empty snapshot): no baseline to grow from",
                                baseline.snapshot.path)
        if any(d in baseline.devices for d in devices):
            growth = {dc.device: dc for dc in compare_analyses(baseline, an, device).devices}
        notes += [f"device {d} has data in the baseline only: nothing of it to check"
                  for d in sorted(baseline.devices) if d not in an.devices and device is None]
    stacks = Stacks(an)
    for dev in devices:
        peak = an.devices[dev].peak.bytes
        dc = growth.get(dev)
        if max_peak is not None:
            cats, sites = _growth_of(dc) if dc is not None else _at_peak(an, dev, stacks)
            ok = peak <= max_peak
            line = (f"{'ok  ' if ok else 'FAIL'} --max-peak {fmt_bytes(max_peak)}: device {dev} peak "
                    f"{fmt_bytes(peak)} ({peak:,} B)")
            if not ok:
                line += f", {fmt_bytes(peak - max_peak)} over" + _what(cats, sites, dc is not None)
            limits.append(LimitResult("max_peak", dev, float(max_peak), float(peak), ok, peak,
                                      dc.a.peak.bytes if dc is not None else None, cats, sites, dc is not None, line))
        if baseline is not None and dc is None:
            limit = 0.0 if max_growth is None else max_growth
            cats, sites = _at_peak(an, dev, stacks)
            line = (f"FAIL --max-growth {limit:g}%: device {dev} peak {fmt_bytes(peak)} has no data in the baseline "
                    f"to grow from: its growth cannot be checked (record the baseline on this device too)"
                    + _what(cats, sites, False))
            limits.append(LimitResult("max_growth", dev, limit, float("inf"), False, peak, None, cats, sites, False,
                                      line))
        elif dc is not None:
            limit = 0.0 if max_growth is None else max_growth
            base = dc.a.peak.bytes
            pct = 100.0 * dc.peak_delta / base if base else (0.0 if dc.peak_delta <= 0 else float("inf"))
            ok = pct <= limit
            cats, sites = _growth_of(dc)
            moved = "grew" if dc.peak_delta > 0 else "fell" if dc.peak_delta < 0 else "unchanged"
            amount = "" if moved == "unchanged" else f" {abs(pct):.1f}%" if pct != float("inf") else " from nothing"
            line = (f"{'ok  ' if ok else 'FAIL'} --max-growth {limit:g}%: device {dev} peak {moved}{amount} "
                    f"({fmt_bytes(base)} -> {fmt_bytes(dc.b.peak.bytes)}, {signed_bytes(dc.peak_delta)}) "
                    f"against the baseline" + ("" if ok else _what(cats, sites, True)))
            limits.append(LimitResult("max_growth", dev, limit, pct, ok, dc.b.peak.bytes, base, cats, sites, True,
                                      line))
    return CheckResult(path, baseline.snapshot.path if baseline is not None else None, tuple(limits), tuple(notes))


def check_document(result: CheckResult) -> dict[str, Any]:
    """The JSON of `vramscope check --json`."""
    def items(cs):
        return [{"what": c.what, "bytes": c.bytes} for c in cs]
    return {"file": result.file, "baseline": result.baseline, "ok": result.ok,
            "limits": [{"limit": r.limit, "device": r.device, "threshold": r.threshold,
                        "measured": None if r.measured == float("inf") else r.measured, "ok": r.ok,
                        "peak_bytes": r.peak_bytes, "baseline_bytes": r.baseline_bytes,
                        "grew" if r.grew else "at_peak": {"by_category": items(r.by_category), "sites": items(r.sites)},
                        "line": r.line} for r in result.limits],
            "notes": list(result.notes)}


def check_text(result: CheckResult) -> str:
    """One line per limit (broken ones start with FAIL), then the notes."""
    return "\n".join([r.line for r in result.limits] + [f"note: {n}" for n in result.notes])


__all__ = ["check", "CheckResult", "LimitResult", "Contribution", "check_document", "check_text", "parse_growth"]
