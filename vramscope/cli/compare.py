"""`vramscope compare A B [--device N] [--json]`: before and after a change, side by side."""
from __future__ import annotations

import sys

from ..common.jsonio import dumps_pretty
from .common import add_input, analyze_file
from .errors import EXIT_OK, UsageError


def add_parser(sub) -> None:
    p = sub.add_parser("compare", help="two recordings of one run side by side: peaks, categories, code sites",
                       description="Compare two snapshots of the same training run, before (A) and after (B) a "
                                   "change: each side's peak (as `summary` reports it), the change in total and by "
                                   "category at each side's own peak, the iterations' peaks side by side, and the "
                                   "code sites live at the peaks (matched by path tail and function, so files "
                                   "recorded on two machines match), largest change first.")
    p.add_argument("a", metavar="A", help="the snapshot before the change")
    p.add_argument("b", metavar="B", help="the snapshot after the change")
    p.add_argument("--json", action="store_true", help="print one JSON object (stable: scripts use it)")
    add_input(p)
    p.set_defaults(run=run)


def run(args) -> int:
    from ..services.compare import compare_analyses, compare_document, compare_text
    an_a = analyze_file(args.a, args.no_cache, args.rules)
    an_b = analyze_file(args.b, args.no_cache, args.rules)
    if args.device is not None and args.device not in an_a.devices and args.device not in an_b.devices:
        listed = ", ".join(str(d) for d in sorted(set(an_a.devices) | set(an_b.devices))) or "none"
        raise UsageError(f"no device {args.device} in either file (devices with data: {listed})")
    cmp = compare_analyses(an_a, an_b, args.device)
    doc = compare_document(cmp, args.a, args.b)
    if args.json:
        sys.stdout.buffer.write(dumps_pretty(doc))
    else:
        print(compare_text(doc))
    return EXIT_OK
