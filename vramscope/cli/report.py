"""`vramscope report FILE -o DIR`: Markdown + PNG + JSON, small enough for a bug report."""
from __future__ import annotations

from .common import add_input, analyze_file, check_device, output_dir
from .errors import EXIT_OK, UsageError


def add_parser(sub) -> None:
    p = sub.add_parser("report", help="report.md + timeline.png + analysis.json for a bug report",
                       description="Write report.md (at most 20 KB), one timeline PNG per device and analysis.json "
                                   "(the `summary --json` document plus the report's additions) into a folder, "
                                   "with your annotations from FILE.vramscope.json.")
    p.add_argument("file", help="a snapshot written by torch.cuda.memory._dump_snapshot")
    p.add_argument("-o", "--output", required=True, metavar="DIR", help="the folder to write into (made if missing)")
    p.add_argument("--redact-paths", action="store_true", help="keep only file basenames in stacks and notes")
    add_input(p)
    p.set_defaults(run=run)


def run(args) -> int:
    from ..services.report import RenderPng, write_report
    out = output_dir(args.output)
    an = analyze_file(args.file, args.no_cache, args.rules)
    check_device(an, args.device)
    render: RenderPng | None
    try:
        from ..viewer.report_png import render_timeline as render
    except ImportError:             # a lean install without Qt: the report without its image
        render = None
    try:
        paths = write_report(an, out, device=args.device, redact_paths=args.redact_paths, render_png=render)
    except OSError as e:
        raise UsageError(f"{out}: cannot write the report: {e.strerror or e}") from None
    for p in paths:
        print(p)
    return EXIT_OK
