"""`vramscope ranks DIR [--json] [--jobs N] [--dask ADDRESS]`: a folder of per-rank snapshots."""
from __future__ import annotations

import argparse
import sys

from ..common.jsonio import dumps_pretty
from .common import add_input, add_json, check_rules
from .errors import EXIT_BAD_INPUT, EXIT_INTERNAL, EXIT_OK, UsageError


def _jobs(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"{n}: give at least 1")
    return n


def add_parser(sub) -> None:
    p = sub.add_parser("ranks", help="a folder of per-rank snapshots: each rank's peak, the outliers, the first OOM",
                       description="Read every snapshot under DIR as one rank of a multi-GPU job (rank from the "
                                   "metadata vramscope.record writes, else from the file name in torchtitan's, "
                                   "torchft's, Megatron-LM's or Megatron-Bridge's layout, else the sorted order) and "
                                   "compare them: each rank's peak as "
                                   "`summary` gives it, the ranks whose peak stands out, the first to run out of "
                                   "memory. Where a rank has several files, its dump at the failure is read, else "
                                   "its latest step.")
    p.add_argument("folder", metavar="DIR", help="a folder of snapshots, one per rank (searched recursively)")
    add_json(p)
    p.add_argument("--jobs", type=_jobs, metavar="N", help="processes that read the files, this one included "
                   "(default: one per core, at most 8)")
    p.add_argument("--dask", metavar="ADDRESS", help="run the analyses on this Dask scheduler "
                   "(tcp://host:8786, or tls:// with Dask's TLS settings; needs `pip install 'vramscope[dask]'`; "
                   "the workers get each file's absolute path, so the files must be at that path on them); --jobs "
                   "is then the cluster's business")
    add_input(p, device=False)          # each rank's device is the one its file leads with
    p.set_defaults(run=run)


def run(args) -> int:
    """Exit 0 when the ranks were read, 3 when no file was a snapshot, 4 when a rank could not
    be read by our fault (a bug, a worker process that died: listed per rank, the other ranks
    printed and counted), 2 for a wrong command line or a Dask scheduler that cannot be used."""
    from ..parsers import TerminalProgress
    from ..services.rank_read import RanksError
    from ..services.ranks import ranks_document, ranks_text, read_ranks
    check_rules(args.rules)
    progress = TerminalProgress()
    try:
        res = read_ranks(args.folder, args.rules, not args.no_cache, args.jobs, args.dask, progress)
    except RanksError as e:
        raise UsageError(str(e)) from None
    finally:
        progress.close()
    if not res.ranks:
        for n in res.not_snapshots + res.internal_errors:
            print(f"vramscope ranks: {n.file}: {n.error}", file=sys.stderr)
        unread = len(res.not_snapshots) + len(res.internal_errors)
        print(f"vramscope ranks: {args.folder}: no snapshot found" + (
            f" ({unread} file{'s' if unread != 1 else ''} could not be read)"
            if unread else " (the folder has no files)"), file=sys.stderr)
        return EXIT_INTERNAL if res.internal_errors else EXIT_BAD_INPUT
    if args.format == "json":
        sys.stdout.buffer.write(dumps_pretty(ranks_document(res)))
    else:
        print(ranks_text(res))
    for n in res.internal_errors:           # on stderr too: a script that reads only stdout's JSON sees exit 4
        print(f"vramscope ranks: {n.file}: {n.error}", file=sys.stderr)
    return EXIT_INTERNAL if res.internal_errors else EXIT_OK
