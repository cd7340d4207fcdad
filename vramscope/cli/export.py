"""`vramscope export FILE (--trim START:END | --around-peak | --perfetto) -o OUT`."""
from __future__ import annotations

import sys

from ..common.units import fmt_bytes
from .common import add_input, analyze_file, check_device, output_file
from .errors import EXIT_OK, UsageError

TRIM_EXT = (".pickle", ".pkl")
PERFETTO_EXT = (".json",)


def add_parser(sub) -> None:
    p = sub.add_parser("export", help="a trimmed snapshot (opens in PyTorch's memory_viz), or a Perfetto trace",
                       description="Write a window of one device's trace as a snapshot pickle in torch's own "
                                   "layout (live and reserved memory stay exact at every entry), or live memory "
                                   "per category as Perfetto counter tracks (ui.perfetto.dev).")
    p.add_argument("file", help="a snapshot written by torch.cuda.memory._dump_snapshot")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--trim", metavar="START:END", help="entries START..END (inclusive) of one device's trace; "
                      "clamped to the trace")
    what.add_argument("--around-peak", action="store_true", help="a window of --window entries centred on the peak")
    what.add_argument("--perfetto", action="store_true", help="live bytes per category as Perfetto counter tracks")
    p.add_argument("--window", type=int, default=2000, metavar="N",
                   help="entries in the --around-peak window (default 2000)")
    p.add_argument("--redact-paths", action="store_true", help="keep only file basenames in frames")
    p.add_argument("-o", "--output", required=True, metavar="OUT",
                   help="OUT.pickle (--trim, --around-peak) or OUT.json (--perfetto)")
    add_input(p)
    p.set_defaults(run=run)


def parse_trim(text: str) -> tuple[int, int]:
    try:
        a, b = text.split(":")
        start, end = int(a), int(b)
    except ValueError:
        raise UsageError(f"--trim wants START:END (entry numbers), not {text!r}") from None
    if start >= 0 and end >= 0 and end < start:
        raise UsageError(f"--trim {text}: END comes before START (give the first entry first)")
    return start, end


def run(args) -> int:
    from ..services import export
    if args.perfetto:
        out = output_file(args.output, PERFETTO_EXT, "a Perfetto trace")
    else:
        out = output_file(args.output, TRIM_EXT, "a trimmed snapshot")
        trim = parse_trim(args.trim) if args.trim else None
        if args.around_peak and args.window < 1:
            raise UsageError("--window must be at least 1")
    an = analyze_file(args.file, args.no_cache, args.rules)
    check_device(an, args.device)
    try:
        if args.perfetto:
            info = export.export_perfetto(an, out, device=args.device)
            print(f"{info['path']}: {info['counter_events']:,} counter events, {fmt_bytes(info['bytes'])}")
            return EXIT_OK
        device = args.device if args.device is not None else an.primary_device()
        if device is None:
            from ..parsers.errors import SnapshotError
            raise SnapshotError("no allocations recorded (an empty snapshot): nothing to export", args.file)
        n = len(an.snapshot.trace(device))
        if trim is not None and n:
            start, end = (v + n if v < 0 else v for v in trim)
            if end < start:
                raise UsageError(f"--trim {args.trim}: END comes before START")
            c_start, c_end = max(0, start), min(n - 1, end)
            if c_start > c_end:
                raise UsageError(f"--trim {args.trim} holds no entry of device {device}'s trace (0:{n - 1})")
            if (c_start, c_end) != (start, end):
                print(f"vramscope export: note: --trim {args.trim} clamped to the trace: {c_start}:{c_end}",
                      file=sys.stderr)
            info = export.export_trimmed(an.snapshot, out, device=device, start=c_start, end=c_end,
                                         redact_paths=args.redact_paths, analysis=an)
        else:
            info = export.export_trimmed(an.snapshot, out, device=device,
                                         around_peak=args.window if n else None, redact_paths=args.redact_paths,
                                         analysis=an)
    except OSError as e:
        raise UsageError(f"{out}: cannot write: {e.strerror or e}") from None
    what = (f"entries {info['start']:,}-{info['end']:,} of {n:,}" if n else
            "its allocator state (the snapshot has no trace entries)")
    print(f"{info['path']}: device {device}, {what}, {fmt_bytes(info['bytes'])}")
    return EXIT_OK
