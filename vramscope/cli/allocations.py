"""`vramscope allocations FILE --csv`: one row per allocation (DESIGN.md §6)."""
from __future__ import annotations

import sys

from .common import add_input, analyze_file, check_device
from .errors import EXIT_OK

HEADER = "device,index,addr,size,alloc_us,free_us,category,rule,evidence\n"


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
    import numpy as np

    from ..classifiers.categories import CATEGORIES
    from ..classifiers.evidence import EVIDENCE
    an = analyze_file(args.file, args.no_cache, args.rules)
    check_device(an, args.device)
    w = sys.stdout.write
    w(HEADER)
    for dev in sorted(an.devices):
        if args.device is not None and dev != args.device:
            continue
        da = an.devices[dev]
        a = da.allocs
        cats = np.asarray(CATEGORIES, dtype=object)[da.category]
        rules = np.asarray(an.rule_names, dtype=object)[da.rule]
        evid = np.asarray(EVIDENCE, dtype=object)[da.evidence]
        step = 65536
        for s in range(0, len(a), step):
            e = min(len(a), s + step)
            rows = zip(a.alloc_index[s:e].tolist(), a.addr[s:e].tolist(), a.size[s:e].tolist(),
                       a.alloc_us[s:e].tolist(), a.free_us[s:e].tolist(), cats[s:e], rules[s:e], evid[s:e])
            w("".join(f"{dev},{i},{ad},{sz},{au},{fu},{c},{r},{ev}\n" for i, ad, sz, au, fu, c, r, ev in rows))
    return EXIT_OK
