"""`vramscope FILE`, `vramscope view FILE [--screenshot OUT.png]`: the desktop viewer."""
from __future__ import annotations

import os

from .common import check_rules, output_file
from .display import HEADLESS, display_problem
from .errors import NoDisplayError, UsageError


def add_parser(sub) -> None:
    p = sub.add_parser("view", help="open the desktop viewer (also: vramscope FILE)",
                       description="Open the desktop viewer. With --screenshot, load FILE, render the window "
                                   "offscreen to a PNG and exit (no display needed).")
    p.add_argument("file", nargs="?", help="a snapshot to open, or a folder of per-rank snapshots (optional: "
                   "File > Open later)")
    p.add_argument("--screenshot", metavar="OUT.png", help="render the window offscreen to a PNG and exit")
    p.add_argument("--device", type=int, metavar="N", help="open on this CUDA device (default: an OOM, else the "
                   "highest peak)")
    p.add_argument("--no-cache", action="store_true",
                   help="neither read nor write the cache of parsed columns and analyses")
    p.add_argument("--rules", metavar="FILE", help="extra classification rules (TOML or JSON)")
    p.set_defaults(run=run)


def run(args) -> int:
    check_rules(args.rules)
    if args.rules:
        os.environ["VRAMSCOPE_RULES"] = os.path.abspath(args.rules)
    if args.screenshot:
        if not args.file:
            raise UsageError("--screenshot needs a snapshot FILE")
        output_file(args.screenshot, (".png",), "a screenshot")
        os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    else:
        if args.file is not None and not os.path.exists(args.file):
            raise UsageError(f"{args.file}: no such file")
        why = display_problem()
        if why is not None:
            raise NoDisplayError(f"cannot open a window: {why}. Headless: {HEADLESS}")
    try:
        from ..viewer.app import run_viewer
    except ImportError as e:
        raise UsageError(f"the viewer needs PySide6 and pyqtgraph ({e}); headless: {HEADLESS}") from None
    return run_viewer(args.file, screenshot=args.screenshot, device=args.device, use_cache=not args.no_cache)
