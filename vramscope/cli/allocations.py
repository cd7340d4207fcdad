"""`vramscope allocations FILE --csv`: one row per allocation (DESIGN.md §6)."""
from __future__ import annotations

import sys

from ..services.allocations import COLUMNS, allocation_columns, allocation_devices
from .common import add_input, analyze_file, check_device
from .errors import EXIT_OK

HEADER = ",".join(COLUMNS) + "\n"
_ROW = ",".join("{}" for _ in COLUMNS) + "\n"


def add_parser(sub) -> None:
    p = sub.add_parser("allocations", help="one CSV row per allocation, blocks live before the trace included",
                       description="One row per allocation: " + HEADER.strip() + ". `index` is the trace entry "
                                   "that allocated it, -1 for blocks live before the trace began; times are -1 "
                                   "when unknown.")
    p.add_argument("file", help="a snapshot written by torch.cuda.memory._dump_snapshot")
    p.add_argument("--csv", action="store_true", help="CSV on stdout (the default and only format)")
    add_input(p)
    p.set_defaults(run=run)


def run(args) -> int:
    an = analyze_file(args.file, args.no_cache, args.rules)
    check_device(an, args.device)
    w = sys.stdout.write
    w(HEADER)
    step = 65536
    for dev in allocation_devices(an, args.device):
        for s in range(0, len(an.devices[dev].allocs), step):
            cols = allocation_columns(an, dev, s, s + step)
            w("".join(map(_ROW.format, *(cols[c].tolist() for c in COLUMNS))))
    return EXIT_OK
