"""`vramscope allocations FILE --csv`: one row per allocation (DESIGN.md §6)."""
from __future__ import annotations

import sys
from collections.abc import Iterable

from ..services.allocations import COLUMNS, allocation_columns, allocation_devices
from .common import add_input, analyze_file, check_device
from .errors import EXIT_OK

HEADER = ",".join(COLUMNS) + "\n"
_ROW = ",".join("{}" for _ in COLUMNS) + "\n"


def add_parser(sub) -> None:
    p = sub.add_parser("allocations", help="one CSV row per allocation, blocks live before the trace included",
                       description="One row per allocation: " + HEADER.strip() + ". `index` is the trace entry "
                                   "that allocated it, -1 for blocks live before the trace began; times are -1 "
                                   "when unknown; evidence says what the category rests on (torch, stack, "
                                   "lifetime, guess, none).")
    p.add_argument("file", help="a snapshot written by torch.cuda.memory._dump_snapshot")
    p.add_argument("--csv", action="store_true", help="CSV on stdout (the default and only format)")
    p.add_argument("--extra", action="store_true",
                   help="four more columns after the nine: " + ",".join(EXTRA) + " (our rules' category where "
                        "torch's own tag decided another, torch's tag, the allocation's user_metadata, its "
                        "annotations joined by ' | ')")
    add_input(p)
    p.set_defaults(run=run)


def run(args) -> int:
    an = analyze_file(args.file, args.no_cache, args.rules)
    check_device(an, args.device)
    w = sys.stdout.write
    w(HEADER.rstrip("\n") + ("," + ",".join(EXTRA) if args.extra else "") + "\n")
    step = 65536
    for dev in allocation_devices(an, args.device):
        da = an.devices[dev]
        more = _extra_columns(da) if args.extra else None
        for s in range(0, len(da.allocs), step):
            cols = allocation_columns(an, dev, s, s + step)
            rows: Iterable[str] = map(_ROW.format, *(cols[c].tolist() for c in COLUMNS))
            if more is not None:
                rows = (r[:-1] + "," + ",".join(x) + "\n" for r, x in zip(rows, zip(*(m[s:s + step] for m in more))))
            w("".join(rows))
    return EXIT_OK


EXTRA = ("rules_category", "torch_tag", "metadata", "notes")


def _extra_columns(da):
    """The --extra columns per row, as CSV fields."""
    import numpy as np

    from ..classifiers.categories import CATEGORIES
    from ..services.export import allocation_text_columns
    tags, meta, notes = allocation_text_columns(da)
    ours = np.full(len(da.allocs), "", dtype=object)
    if da.rules_category is not None:
        differs = da.rules_category != da.category
        ours[differs] = np.asarray(CATEGORIES, dtype=object)[da.rules_category[differs]]
    return ours, tags, meta, notes
