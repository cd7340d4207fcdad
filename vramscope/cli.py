"""`vramscope` command line (DESIGN.md §6; scripts depend on it).

Verbs are thin: they parse arguments, call the one query API
(`vramscope.parsers.open_snapshot` then `vramscope.classifiers.analyze`) and
format. Exit codes: 0 success, 2 usage error, 3 bad input, 130 interrupted.
Every error is one line on stderr.
"""
from __future__ import annotations

import argparse
import os
import sys

EXIT_OK, EXIT_USAGE, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 0, 2, 3, 130
VERBS = ("summary", "allocations", "report", "view", "export")


class UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2 (argparse would print the usage too)
        raise UsageError(message)


from .common.units import fmt_bytes  # noqa: E402


def _build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="vramscope", description="PyTorch CUDA memory snapshots: categories, peaks, leaks, OOMs.")
    p.add_argument("--version", action="store_true", help="print the version and exit")
    sub = p.add_subparsers(dest="verb", parser_class=_Parser)

    s = sub.add_parser("summary", help="per-device summary: peak, categories, iterations, leaks, OOMs")
    s.add_argument("file")
    s.add_argument("--json", action="store_true", help="print one JSON object")
    s.add_argument("--device", type=int, help="only this device")
    s.add_argument("--no-cache", action="store_true", help="do not read or write the column cache")
    s.add_argument("--rules", metavar="FILE", help="extra classification rules (TOML or JSON), as $VRAMSCOPE_RULES")

    a = sub.add_parser("allocations", help="one row per allocation")
    a.add_argument("file")
    a.add_argument("--csv", action="store_true", help="CSV on stdout (the default and only format)")
    a.add_argument("--device", type=int)
    a.add_argument("--no-cache", action="store_true")
    a.add_argument("--rules", metavar="FILE", help="extra classification rules (TOML or JSON)")

    r = sub.add_parser("report", help="Markdown + PNG + JSON report for a bug report")
    r.add_argument("file")
    r.add_argument("-o", "--output", required=True, help="output directory")
    r.add_argument("--device", type=int)
    r.add_argument("--redact-paths", action="store_true", help="keep only file basenames in stacks")
    r.add_argument("--no-cache", action="store_true")

    x = sub.add_parser("export", help="trimmed snapshot pickle, or Perfetto/Chrome trace JSON")
    x.add_argument("file")
    what = x.add_mutually_exclusive_group()
    what.add_argument("--trim", metavar="START:END", help="entries START..END (inclusive) of one device's trace")
    what.add_argument("--around-peak", action="store_true", help="a window of --window entries centred on the peak")
    what.add_argument("--perfetto", action="store_true", help="live bytes per category as Perfetto counter tracks")
    x.add_argument("--window", type=int, default=2000, help="entries in the --around-peak window (default 2000)")
    x.add_argument("--device", type=int)
    x.add_argument("--redact-paths", action="store_true", help="keep only file basenames in frames")
    x.add_argument("-o", "--output", required=True, help="OUT.pickle (trimmed) or OUT.json (--perfetto)")
    x.add_argument("--no-cache", action="store_true")

    v = sub.add_parser("view", help="open the desktop viewer")
    v.add_argument("file", nargs="?")
    v.add_argument("--screenshot", metavar="OUT.png", help="render the window offscreen to a PNG and exit")
    v.add_argument("--device", type=int)
    v.add_argument("--no-cache", action="store_true")
    return p


def _open(path, no_cache=False):
    from .parsers import TerminalProgress, open_snapshot
    progress = TerminalProgress()
    try:
        return open_snapshot(path, progress=progress, use_cache=not no_cache)
    finally:
        progress.close()


def _analyze(path, no_cache=False, rules=None):
    from .classifiers import analyze
    return analyze(_open(path, no_cache), rules_path=rules)


def _check_device(an, device):
    if device is not None and device not in an.devices:
        devs = ", ".join(str(d) for d in an.devices) or "none"
        raise UsageError(f"no device {device} in {an.snapshot.path} (devices with data: {devs})")


def cmd_summary(args) -> int:
    import orjson
    from .classifiers import analyze, summary_dict
    from .classifiers.cache import analysis_fingerprint
    from .parsers.cache import read_artifact, write_artifact
    snap = _open(args.file, args.no_cache)
    # the same key as the analysis cached beside the columns: our version, the code of
    # the classifiers and parsers, and the rules files in effect
    name = f"summary-{analysis_fingerprint(args.rules)}.json"
    summary = None
    cached = read_artifact(snap, name)
    if cached:
        try:
            summary = orjson.loads(cached)
        except orjson.JSONDecodeError:
            summary = None        # damaged: recompute and overwrite
    if not isinstance(summary, dict) or "devices" not in summary:
        an = analyze(snap, rules_path=args.rules)
        summary = summary_dict(an)
        write_artifact(snap, name, orjson.dumps(summary, option=orjson.OPT_NON_STR_KEYS))
    summary["file"] = snap.path   # the cache is keyed by content, not by path
    devices = [d["device"] for d in summary["devices"]]
    if args.device is not None:
        if args.device not in devices:
            listed = ", ".join(str(d) for d in devices) or "none"
            raise UsageError(f"no device {args.device} in {args.file} (devices with data: {listed})")
        summary = {**summary, "devices": [d for d in summary["devices"] if d["device"] == args.device]}
    if args.json:
        sys.stdout.buffer.write(orjson.dumps(summary, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS))
        sys.stdout.buffer.write(b"\n")
        return EXIT_OK
    out = [f"{os.path.basename(args.file)}"]
    if not summary["devices"]:
        out.append("  no allocations recorded (empty snapshot)")
    for d in summary["devices"]:
        pk = d["peak"]
        out.append(f"device {d['device']}: {d['entries']:,} trace entries, {d['allocations']:,} allocations")
        when = "at the start of the trace" if pk["index"] < 0 else f"at entry {pk['index']:,}"
        out.append(f"  peak live      {fmt_bytes(pk['bytes'])} ({pk['bytes']:,} B) {when}, type {pk['type']}")
        for cat, b in sorted(pk["by_category"].items(), key=lambda kv: -kv[1]):
            out.append(f"    {cat:<13} {fmt_bytes(b):>11}")
        out.append(f"  live at start  {fmt_bytes(d['start_live_bytes'])}, at end {fmt_bytes(d['end_live_bytes'])}")
        if d["reserved_peak_bytes"] is None:
            out.append("  reserved peak  unknown (profiler-converted snapshot: no allocator segments)")
        else:
            out.append(f"  reserved peak  {fmt_bytes(d['reserved_peak_bytes'])}")
        out.append(f"  iterations     {len(d['iterations'])}")
        if d["leaks"]:
            for lk in d["leaks"]:
                out.append(f"  LEAK           {fmt_bytes(lk.get('bytes_per_iteration'))}/iteration  {lk.get('where', '')}")
        else:
            out.append("  leaks          none found")
        for o in d["ooms"]:
            out.append(f"  OOM            requested {fmt_bytes(o['requested'])}, device free {fmt_bytes(o['device_free'])}")
            if o.get("suggestion"):
                out.append(f"                 next step: {o['suggestion']}")
    print("\n".join(out))
    return EXIT_OK


def cmd_allocations(args) -> int:
    import numpy as np
    from .classifiers import CATEGORIES
    an = _analyze(args.file, args.no_cache, getattr(args, "rules", None))
    _check_device(an, args.device)
    w = sys.stdout.write
    w("device,index,addr,size,alloc_us,free_us,category,rule\n")
    for dev, da in an.devices.items():
        if args.device is not None and dev != args.device:
            continue
        a = da.allocs
        cats = np.asarray(CATEGORIES, dtype=object)[da.category]
        rules = np.asarray(an.rule_names, dtype=object)[da.rule]
        step = 65536
        for s in range(0, len(a), step):
            e = min(len(a), s + step)
            rows = zip(a.alloc_index[s:e].tolist(), a.addr[s:e].tolist(), a.size[s:e].tolist(),
                       a.alloc_us[s:e].tolist(), a.free_us[s:e].tolist(), cats[s:e], rules[s:e])
            w("".join(f"{dev},{i},{ad},{sz},{au},{fu},{c},{r}\n" for i, ad, sz, au, fu, c, r in rows))
    return EXIT_OK


def cmd_report(args) -> int:
    from .report import write_report
    an = _analyze(args.file, args.no_cache)
    _check_device(an, args.device)
    paths = write_report(an, args.output, device=args.device, redact_paths=args.redact_paths)
    for p in paths:
        print(p)
    return EXIT_OK


def _parse_trim(text: str) -> tuple[int, int]:
    try:
        a, b = text.split(":")
        return int(a), int(b)
    except ValueError:
        raise UsageError(f"--trim wants START:END (entry numbers), not {text!r}") from None


def cmd_export(args) -> int:
    from . import export
    if not (args.trim or args.around_peak or args.perfetto):
        raise UsageError("export needs one of --trim START:END, --around-peak or --perfetto")
    if args.perfetto:
        an = _analyze(args.file, args.no_cache)
        _check_device(an, args.device)
        info = export.export_perfetto(an, args.output, device=args.device)
        print(f"{info['path']}: {info['counter_events']:,} counter events, {fmt_bytes(info['bytes'])}")
        return EXIT_OK
    snap = _open(args.file, args.no_cache)
    devices = [d for d in snap.devices if len(snap.trace(d))]
    if args.device is not None and args.device not in devices:
        raise UsageError(f"no trace for device {args.device} in {args.file} "
                         f"(devices with a trace: {', '.join(map(str, devices)) or 'none'})")
    if not devices:
        raise UsageError(f"{args.file} has no trace entries to trim")
    device = args.device if args.device is not None else devices[0]
    n = len(snap.trace(device))
    try:
        if args.trim:
            start, end = _parse_trim(args.trim)
            info = export.export_trimmed(snap, args.output, device=device, start=start, end=end,
                                         redact_paths=args.redact_paths)
        else:
            if args.window < 1:
                raise UsageError("--window must be at least 1")
            info = export.export_trimmed(snap, args.output, device=device, around_peak=args.window,
                                         redact_paths=args.redact_paths)
    except ValueError as e:
        raise UsageError(str(e)) from None
    print(f"{info['path']}: device {device}, entries {info['start']:,}-{info['end']:,} of {n:,}, "
          f"{fmt_bytes(info['bytes'])}")
    return EXIT_OK


def cmd_view(args) -> int:
    try:
        from .viewer.app import run_viewer
    except ImportError as e:
        raise UsageError(f"the viewer needs PySide6 and pyqtgraph ({e})") from None
    return run_viewer(args.file, screenshot=args.screenshot, device=args.device, use_cache=not args.no_cache)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # `vramscope FILE` opens the viewer.
    if argv and not argv[0].startswith("-") and argv[0] not in VERBS:
        argv = ["view"] + argv
    from .parsers import Cancelled, SnapshotError
    try:
        from .classifiers.rules import RulesError
    except ImportError:  # pragma: no cover
        RulesError = UsageError
    try:
        args = _build_parser().parse_args(argv)
        if args.version:
            from . import __version__
            print(f"vramscope {__version__}")
            return EXIT_OK
        if args.verb is None:
            args = _build_parser().parse_args(["view"])
        handler = {"summary": cmd_summary, "allocations": cmd_allocations, "report": cmd_report,
                   "export": cmd_export, "view": cmd_view}[args.verb]
        return handler(args)
    except UsageError as e:
        print(f"vramscope: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except SnapshotError as e:
        print(f"vramscope: {e.one_line()}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except RulesError as e:
        print(f"vramscope: error: rules: {' '.join(str(e).split())}", file=sys.stderr)
        return EXIT_USAGE
    except (KeyboardInterrupt, Cancelled):
        print("vramscope: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        try:
            sys.stdout = None
        finally:
            return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
