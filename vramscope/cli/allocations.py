"""`vramscope allocations FILE --csv`: one row per allocation (DESIGN.md §6)."""
from __future__ import annotations

from ..services.allocations import ALLOCATIONS_CSV, ALLOCATIONS_CSV_EXTRA, COLUMNS, EXTRA_COLUMNS, AllocationTable
from .common import add_input, analyze_file, check_device, emit

HEADER = ",".join(COLUMNS) + "\n"


def add_parser(sub) -> None:
    p = sub.add_parser("allocations", help="one CSV row per allocation, blocks live before the trace included",
                       description="One row per allocation: " + ",".join(COLUMNS) + ". `index` is the trace entry "
                                   "that allocated it, -1 for blocks live before the trace began; times are -1 "
                                   "when unknown; evidence says what the category rests on (torch, stack, "
                                   "lifetime, guess, none).")
    p.add_argument("file", help="a snapshot written by torch.cuda.memory._dump_snapshot")
    p.add_argument("--csv", dest="format", action="store_const", const="csv", default="csv",
                   help="CSV on stdout (the default and only format)")
    p.add_argument("--extra", action="store_true",
                   help="four more columns after the nine: " + ",".join(EXTRA_COLUMNS) + " (our rules' category "
                        "where torch's own tag decided another, torch's tag, the allocation's user_metadata, its "
                        "annotations joined by ' | ')")
    add_input(p)
    p.set_defaults(run=run)


def run(args) -> int:
    an = analyze_file(args.file, args.no_cache, args.rules)
    check_device(an, args.device)
    return emit(ALLOCATIONS_CSV_EXTRA if args.extra else ALLOCATIONS_CSV, AllocationTable(an, args.device, args.extra))
