"""Why a timeline starts in seconds or in entries, in words (classifiers/timeaxis.py decides)."""
from __future__ import annotations

from ..classifiers.timeaxis import XAxis
from ..common.units import fmt_duration_us


def number_ranges(numbers) -> str:
    """'2-4', '1, 3-10': sorted whole numbers, runs of consecutive ones as ranges."""
    nums = sorted(set(int(n) for n in numbers))
    parts: list[str] = []
    k = 0
    while k < len(nums):
        j = k
        while j + 1 < len(nums) and nums[j + 1] == nums[j] + 1:
            j += 1
        parts.append(str(nums[k]) if j == k else f"{nums[k]}-{nums[j]}")
        k = j + 1
    return ", ".join(parts)


def axis_reason(ax: XAxis) -> str:
    """One sentence: the axis and why ('entries: iteration 1 took 3.04 s of the run's
    3.51 s, so iterations 2-4 (75% of the entries) would get 2.5% of a seconds axis')."""
    span = fmt_duration_us(ax.span_us)
    if ax.reason == "no_times":
        return "entries: the trace has no usable time stamps"
    if ax.reason == "one_pause":
        return (f"entries: one pause of {fmt_duration_us(ax.pause_us)} (before entry {ax.pause_before:,}) takes "
                f"{ax.pause_us / ax.span_us:.0%} of the run's {span}")
    if ax.reason == "iterations_squeezed":
        many = len(ax.iterations) > 1
        return (f"entries: iteration {ax.slowest} took {fmt_duration_us(ax.slowest_us)} of the run's {span}, so "
                f"iteration{'s' if many else ''} {number_ranges(ax.iterations)} ({ax.entries_share:.0%} of the "
                f"entries) would get {ax.seconds_share:.1%} of a seconds axis")
    if ax.reason == "idle":
        return (f"entries: {ax.idle_gaps} pause{'s' if ax.idle_gaps > 1 else ''} between the steps take "
                f"{fmt_duration_us(ax.idle_us)} of the run's {span}, so the work itself would get "
                f"{ax.seconds_share:.1%} of a seconds axis")
    if ax.reason == "crowded":
        return (f"entries: half of the entries ({ax.first:,} to {ax.last:,}) happen in {ax.seconds_share:.1%} of "
                f"the run's {span}")
    return f"seconds: the entries are spread over the run's {span} evenly enough"


def axis_reason_short(ax: XAxis) -> str:
    """The same in a few words, for a status bar with little room ('entries: pauses between
    the steps take 98% of the run')."""
    if ax.reason == "no_times":
        return "entries: no time stamps"
    if ax.reason == "one_pause":
        return f"entries: one pause takes {ax.pause_us / ax.span_us:.0%} of the run"
    if ax.reason == "iterations_squeezed":
        return f"entries: iteration {ax.slowest} takes {ax.slowest_us / ax.span_us:.0%} of the run"
    if ax.reason == "idle":
        return f"entries: pauses between the steps take {ax.idle_us / ax.span_us:.0%} of the run"
    if ax.reason == "crowded":
        return f"entries: half of the entries in {ax.seconds_share:.0%} of the run"
    return "seconds"


__all__ = ["axis_reason", "axis_reason_short", "number_ranges"]
