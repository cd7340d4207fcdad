"""`vramscope ranks DIR [--json] [--jobs N] [--dask ADDRESS]`: a folder of per-rank snapshots."""
from __future__ import annotations

import argparse
import sys

from ..common.jsonio import dumps_pretty
from .common import add_input, add_json, check_rules
from .errors import EXIT_BAD_INPUT, EXIT_OK, UsageError

EXIT_WORKER_DIED = 1


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
                                   "metadata vramscope.record writes, else from the file name in torchtitan's or "
                                   "Megatron's layout, else the sorted order) and compare them: each rank's peak as "
                                   "`summary` gives it, the ranks whose peak stands out, the first to run out of "
                                   "memory. Where a rank has several files, its dump at the failure is read, else "
                                   "its latest step.")
    p.add_argument("folder", metavar="DIR", help="a folder of snapshots, one per rank (searched recursively)")
    add_json(p)
    p.add_argument("--jobs", type=_jobs, metavar="N", help="processes that read the files, this one included "
                   "(default: one per core, at most 8)")
    p.add_argument("--dask", metavar="ADDRESS", help="run the analyses on this Dask scheduler "
                   "(e.g. tcp://host:8786; needs `pip install 'vramscope[dask]'`, and the files at the same path "
                   "on the workers); --jobs is then the cluster's business")
    add_input(p, device=False)          # each rank's device is the one its file leads with
    p.set_defaults(run=run)


def run(args) -> int:
    from ..parsers import TerminalProgress
    from ..services.rank_read import RanksError, WorkerDied
    from ..services.ranks import ranks_document, ranks_text, read_ranks
    check_rules(args.rules)
    progress = TerminalProgress()
    try:
        res = read_ranks(args.folder, args.rules, not args.no_cache, args.jobs, args.dask, progress)
    except RanksError as e:
        raise UsageError(str(e)) from None
    except WorkerDied as e:
        res, died = None, e
    finally:
        progress.close()
    if res is None:
        print(f"vramscope ranks: {died}", file=sys.stderr)
        return EXIT_WORKER_DIED
    if not res.ranks:
        for n in res.not_snapshots:
            print(f"vramscope ranks: {n.file}: {n.error}", file=sys.stderr)
        print(f"vramscope ranks: {args.folder}: no snapshot found" + (
            f" ({len(res.not_snapshots)} file{'s' if len(res.not_snapshots) != 1 else ''} could not be read)"
            if res.not_snapshots else " (the folder has no files)"), file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.format == "json":
        sys.stdout.buffer.write(dumps_pretty(ranks_document(res)))
    else:
        print(ranks_text(res))
    return EXIT_OK
