"""`vramscope check FILE [--max-peak SIZE] [--baseline OTHER [--max-growth PCT]] [--device N] [--json]`:
memory limits for CI. Exit 0 when every limit holds, 1 when one is broken (one FAIL line
each, with what grew; nothing else exits 1), 2 usage, 3 bad input, 4 internal error."""
from __future__ import annotations

import sys

from ..common.jsonio import dumps_pretty
from .common import add_input, add_json, analyze_file
from .errors import EXIT_LIMIT_BROKEN, EXIT_OK, UsageError


def add_parser(sub) -> None:
    p = sub.add_parser("check", help="memory limits for CI: the peak under a size, or no more growth than PCT",
                       description="Check a snapshot against memory limits, per device: its peak (as `summary` "
                                   "reports it) at most --max-peak, and against a baseline recording of the same run "
                                   "(as `compare BASELINE FILE` reports it) a peak grown by at most --max-growth "
                                   "percent (default 0: no growth at all). Prints one line per limit; a broken one "
                                   "starts with FAIL and names what grew, by category and code site; a device with "
                                   "no data in the baseline fails --max-growth (its growth cannot be checked). Exit "
                                   "0: every limit holds; 1: a limit is broken (nothing else exits 1); 2: usage; 3: "
                                   "bad input; 4: internal error.")
    p.add_argument("file", help="the snapshot to check (written by torch.cuda.memory._dump_snapshot or "
                                "vramscope.record)")
    p.add_argument("--max-peak", metavar="SIZE", help="the highest peak allowed: 24 (GiB), 24GiB, 500MiB, "
                                                      "80GB (GB = 10^9 bytes, GiB = 2^30)")
    p.add_argument("--baseline", metavar="OTHER", help="a recording of the same run to compare against (A)")
    p.add_argument("--max-growth", metavar="PCT", help="the peak may grow by at most PCT percent over the "
                                                       "baseline's (5, 2.5%%; default 0)")
    add_json(p)
    add_input(p)
    p.set_defaults(run=run)


def run(args) -> int:
    from ..common.units import parse_byte_size
    from ..services.check import check, check_document, check_text, parse_growth
    if args.max_growth is not None and args.baseline is None:
        raise UsageError("--max-growth needs --baseline OTHER (the recording to grow from)")
    if args.max_peak is None and args.baseline is None:
        raise UsageError("no limit to check: give --max-peak SIZE and/or --baseline OTHER")
    try:
        max_peak = parse_byte_size(args.max_peak, "--max-peak") if args.max_peak is not None else None
        growth = parse_growth(args.max_growth) if args.max_growth is not None else None
    except ValueError as e:
        raise UsageError(str(e)) from None
    an = analyze_file(args.file, args.no_cache, args.rules)
    base = analyze_file(args.baseline, args.no_cache, args.rules) if args.baseline is not None else None
    try:
        result = check(an, max_peak, base, growth, args.device)
    except ValueError as e:          # a device the file has no data on
        raise UsageError(str(e)) from None
    if args.format == "json":
        sys.stdout.buffer.write(dumps_pretty(check_document(result)))
    else:
        print(check_text(result))
    return EXIT_OK if result.ok else EXIT_LIMIT_BROKEN
