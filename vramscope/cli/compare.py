"""`vramscope compare A B [--device N] [--json]`: before and after a change, side by side."""
from __future__ import annotations

from ..services.reporters import JsonReporter, Reporter, TextReporter
from .common import add_input, add_json, analyze_file, emit
from .errors import UsageError


def add_parser(sub) -> None:
    p = sub.add_parser("compare", help="two recordings of one run side by side: peaks, categories, code sites",
                       description="Compare two snapshots of the same training run, before (A) and after (B) a "
                                   "change: each side's peak (as `summary` reports it), the change in total and by "
                                   "category at each side's own peak, the iterations' peaks side by side, and the "
                                   "code sites live at the peaks (matched by path tail and function, so files "
                                   "recorded on two machines match), largest change first.")
    p.add_argument("a", metavar="A", help="the snapshot before the change")
    p.add_argument("b", metavar="B", help="the snapshot after the change")
    add_json(p)
    add_input(p)
    p.set_defaults(run=run)


def run(args) -> int:
    from ..services.compare import CompareJSON, compare_analyses, compare_document, compare_text
    reporters: dict[str, Reporter[CompareJSON]] = {"text": TextReporter(compare_text), "json": JsonReporter()}
    an_a = analyze_file(args.a, args.no_cache, args.rules)
    an_b = analyze_file(args.b, args.no_cache, args.rules)
    if args.device is not None and args.device not in an_a.devices and args.device not in an_b.devices:
        listed = ", ".join(str(d) for d in sorted(set(an_a.devices) | set(an_b.devices))) or "none"
        raise UsageError(f"no device {args.device} in either file (devices with data: {listed})")
    cmp = compare_analyses(an_a, an_b, args.device)
    return emit(reporters[args.format], compare_document(cmp, args.a, args.b))
