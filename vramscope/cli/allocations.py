"""`vramscope allocations FILE --csv`: one row per allocation (DESIGN.md §6)."""
from __future__ import annotations

import sys

from .common import add_input, analyze_file, check_device
from .errors import EXIT_OK

HEADER = "device,index,addr,size,alloc_us,free_us,category,rule,evidence,rules_category,torch_tag,metadata,notes\n"


def add_parser(sub) -> None:
    p = sub.add_parser("allocations", help="one CSV row per allocation, blocks live before the trace included",
                       description="One row per allocation: " + HEADER.strip() + ". `index` is the trace entry "
                                   "that allocated it, -1 for blocks live before the trace began; times are -1 "
                                   "when unknown; rules_category is our rules' category where torch's own tag decided another, "
                                   "torch_tag torch's own tag (a profiler category, a component "
                                   "type), metadata the user_metadata of the allocation and notes its annotations "
                                   "(joined by ' | '), quoted as CSV needs.")
    p.add_argument("file", help="a snapshot written by torch.cuda.memory._dump_snapshot")
    p.add_argument("--csv", action="store_true", help="CSV on stdout (the default and only format)")
    add_input(p)
    p.set_defaults(run=run)


def run(args) -> int:
    import numpy as np

    from ..classifiers.categories import CATEGORIES
    from ..classifiers.evidence import EVIDENCE
    from ..services.export import allocation_text_columns
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
        tags, meta, notes = allocation_text_columns(da)
        ours = np.full(len(a), "", dtype=object)
        if da.rules_category is not None:
            differs = da.rules_category != da.category
            ours[differs] = np.asarray(CATEGORIES, dtype=object)[da.rules_category[differs]]
        step = 65536
        for s in range(0, len(a), step):
            e = min(len(a), s + step)
            rows = zip(a.alloc_index[s:e].tolist(), a.addr[s:e].tolist(), a.size[s:e].tolist(),
                       a.alloc_us[s:e].tolist(), a.free_us[s:e].tolist(), cats[s:e], rules[s:e], evid[s:e],
                       ours[s:e], tags[s:e], meta[s:e], notes[s:e])
            w("".join(f"{dev},{i},{ad},{sz},{au},{fu},{c},{r},{ev},{rc},{tg},{md},{nt}\n"
                      for i, ad, sz, au, fu, c, r, ev, rc, tg, md, nt in rows))
    return EXIT_OK
