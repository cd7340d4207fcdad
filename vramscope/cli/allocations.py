"""`vramscope allocations FILE --csv`: one row per allocation (DESIGN.md §6)."""
from __future__ import annotations

from ..services.allocations import ALLOCATIONS_CSV, COLUMNS, AllocationTable
from .common import add_input, analyze_file, check_device, emit

REPORTERS = {"csv": ALLOCATIONS_CSV}


def add_parser(sub) -> None:
    p = sub.add_parser("allocations", help="one CSV row per allocation, blocks live before the trace included",
                       description="One row per allocation: " + ",".join(COLUMNS) + ". `index` is the trace entry "
                                   "that allocated it, -1 for blocks live before the trace began; times are -1 "
                                   "when unknown.")
    p.add_argument("file", help="a snapshot written by torch.cuda.memory._dump_snapshot")
    p.add_argument("--csv", dest="format", action="store_const", const="csv", default="csv",
                   help="CSV on stdout (the default and only format)")
    add_input(p)
    p.set_defaults(run=run)


def run(args) -> int:
    an = analyze_file(args.file, args.no_cache, args.rules)
    check_device(an, args.device)
    return emit(REPORTERS[args.format], AllocationTable(an, args.device))
