"""`vramscope summary FILE [--json] [--device N]`: the analysis, headless."""
from __future__ import annotations

from ..services.reporters import JsonReporter, Reporter, TextReporter
from ..services.summary import SummaryJSON, cached_summary_document, summary_text
from .common import add_input, add_json, check_rules, emit, open_file
from .errors import UsageError

REPORTERS: dict[str, Reporter[SummaryJSON]] = {"text": TextReporter(summary_text), "json": JsonReporter()}


def add_parser(sub) -> None:
    p = sub.add_parser("summary", help="per device: peak (type, by category), iterations, leaks, OOMs",
                       description="Per device: the peak (its type and what was live by category), live memory at "
                                   "the start and end, reserved memory, iterations with their peaks, leaks and OOMs "
                                   "with the next step to try.")
    p.add_argument("file", help="a snapshot written by torch.cuda.memory._dump_snapshot")
    add_json(p)
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
    return emit(REPORTERS[args.format], doc)
