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
    p.add_argument("--compare", metavar="B", help="add a comparison with snapshot B (the same run after a change): "
                   "a section in report.md, compare.png, `compare` in analysis.json")
    add_input(p)
    p.set_defaults(run=run)


def run(args) -> int:
    from ..services.report import RenderPng, write_report
    from ..services.report_compare import RenderComparePng
    out = output_dir(args.output)
    an = analyze_file(args.file, args.no_cache, args.rules)
    check_device(an, args.device)
    other = analyze_file(args.compare, args.no_cache, args.rules) if args.compare else None
    render: RenderPng | None
    render_compare: RenderComparePng | None = None
    try:
        from ..viewer.report_png import render_timeline as render
        if other is not None:
            from ..viewer.compare_png import render_compare
    except ImportError:             # a lean install without Qt: the report without its image
        render = None
    try:
        paths = write_report(an, out, device=args.device, redact_paths=args.redact_paths, render_png=render,
                             compare_with=other, render_compare_png=render_compare)
    except OSError as e:
        raise UsageError(f"{out}: cannot write the report: {e.strerror or e}") from None
    for p in paths:
        print(p)
    return EXIT_OK
