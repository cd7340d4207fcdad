"""`vramscope summary FILE [--json] [--device N]`: the analysis, headless."""
from __future__ import annotations

import sys

from ..common.jsonio import dumps_pretty
from ..services.summary import cached_summary_document, summary_text
from .common import add_input, check_rules, open_file
from .errors import EXIT_OK, UsageError


def add_parser(sub) -> None:
    p = sub.add_parser("summary", help="per device: peak (type, by category), iterations, leaks, OOMs",
                       description="Per device: the peak (its type and what was live by category), live memory at "
                                   "the start and end, reserved memory, iterations with their peaks, leaks and OOMs "
                                   "with the next step to try.")
    p.add_argument("file", help="a snapshot written by torch.cuda.memory._dump_snapshot")
    p.add_argument("--json", action="store_true", help="print one JSON object (stable: scripts use it)")
    add_input(p)
    p.set_defaults(run=run)


def run(args) -> int:
    check_rules(args.rules)
    snap = open_file(args.file, args.no_cache)
    doc = cached_summary_document(snap, args.rules)
    if args.device is not None:
        devices = [d["device"] for d in doc["devices"]]
        if args.device not in devices:
            listed = ", ".join(str(d) for d in sorted(devices)) or "none"
            raise UsageError(f"no device {args.device} in {args.file} (devices with data: {listed})")
        doc = {**doc, "devices": [d for d in doc["devices"] if d["device"] == args.device]}
    if args.json:
        sys.stdout.buffer.write(dumps_pretty(doc))
    else:
        print(summary_text(doc))
    return EXIT_OK
