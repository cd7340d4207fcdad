"""`vramscope` command line (DESIGN.md §6; scripts depend on it).

One module per verb (summary, allocations, compare, report, export, whatif, check, ranks, view), each thin: it parses
its arguments, calls the services and prints. This module only dispatches and turns
every expected failure into one line on stderr and an exit code: 0 success, 2 usage
(a wrong command line, a path that cannot be written, no display for the viewer),
3 bad input (not a snapshot, unsafe, truncated, corrupt), 130 interrupted; `check` exits 1
when a memory limit is broken, and nothing else exits 1. An internal error (a bug of ours)
is one line asking for a bug report, exit 4; VRAMSCOPE_DEBUG=1 shows its traceback.
"""
from __future__ import annotations

import argparse
import difflib
import io
import os
import re
import sys

from ..common.interrupts import came_from_interrupt
from . import allocations, check, compare, export, ranks, report, summary, view, whatif
from .errors import EXIT_BAD_INPUT, EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, OutputError, UsageError

VERBS = {m.__name__.rsplit(".", 1)[1]: m for m in (summary, allocations, compare, report, export, whatif, check,
                                                   ranks, view)}

EPILOG = """\
also:
  vramscope FILE            open FILE in the desktop viewer (as `vramscope view FILE`)

exit codes: 0 success, 1 a limit broken (check; nothing else exits 1), 2 usage error (or
an output that cannot be written), 3 bad input (not a snapshot, unsafe, truncated,
corrupt), 4 internal error (a bug of vramscope: please report it), 130 interrupted.
Errors are one line on stderr.
"""


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # a word that starts with '-' and a digit is a value ("--max-peak -5GB": a negative
        # size, refused by its option with a reason), never an option: none of ours looks so
        self._negative_number_matcher = re.compile(r"^-\.?[0-9]")

    def error(self, message):  # one line naming the verb, exit 2 (argparse would print the usage too)
        raise UsageError(f"{message} (see `{self.prog} --help`)")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="vramscope", description="PyTorch CUDA memory snapshots, opened safely: categories, peaks, "
                "leaks, OOMs, in a desktop timeline or from the command line.", epilog=EPILOG,
                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="store_true", help="print the version and exit")
    sub = p.add_subparsers(dest="verb", parser_class=_Parser, metavar="VERB")
    for module in VERBS.values():
        module.add_parser(sub)
    return p


def _route(argv: list[str]) -> list[str]:
    """`vramscope FILE` opens the viewer; a first word that is neither a verb nor a file
    is a usage error that suggests the closest verb."""
    if not argv or argv[0].startswith("-") or argv[0] in VERBS:
        return argv
    if os.path.exists(argv[0]):
        return ["view"] + argv
    close = difflib.get_close_matches(argv[0], list(VERBS), n=1, cutoff=0.6)
    if close:
        raise UsageError(f"{argv[0]!r} is not a verb; did you mean `vramscope {close[0]}`?")
    raise UsageError(f"{argv[0]}: no such file (verbs: {', '.join(VERBS)}; see `vramscope --help`)")


def _tolerant_streams() -> None:
    """Text from a snapshot (or a file name from the shell) may hold lone surrogates: print
    them as \\udXXXX escapes instead of failing on them."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(errors="backslashreplace")  # type: ignore[union-attr]
        except (AttributeError, ValueError):
            pass


class _Output(io.FileIO):
    """Standard output's file, whose failed writes (other than a closed pipe) raise OutputError:
    a full disk under `vramscope summary f > out.txt` is said as such, not as a bug of ours."""

    def write(self, b):
        try:
            return super().write(b)
        except BrokenPipeError:
            raise
        except OSError as e:
            raise OutputError(e.errno, e.strerror) from None


def _guarded_stdout():
    """Standard output as a stream over `_Output` (same file, encoding, errors and buffering);
    returns the stream it replaces, to be put back, or None where stdout is not a plain file
    (a test's capture, a closed stream)."""
    old = sys.stdout
    try:
        fd = old.fileno()
        line_buffering = old.line_buffering
        encoding, errors = old.encoding, old.errors
    except (AttributeError, OSError, ValueError):
        return None
    try:
        old.flush()
    except (OSError, ValueError):
        return None
    sys.stdout = io.TextIOWrapper(io.BufferedWriter(_Output(fd, "w", closefd=False)), encoding=encoding,
                                  errors=errors, line_buffering=line_buffering)
    return old


def main(argv=None) -> int:
    old_stdout = _guarded_stdout()
    try:
        return _main(argv)
    except SystemExit:                    # argparse's --help and --version: their text written first
        if old_stdout is not None:
            try:
                sys.stdout.flush()
            except OutputError as e:
                return _output_failed("vramscope", e)
        raise
    finally:
        if old_stdout is not None:
            guarded, sys.stdout = sys.stdout, old_stdout
            try:
                guarded.flush()           # (empty here but after an error said already)
            except (OSError, ValueError):
                pass


def _dispatch(argv: list[str]) -> int:
    """Parse the (routed) command line and run its verb: its exit code."""
    parser = build_parser()
    if not argv:
        parser.print_help()
        return EXIT_OK
    args = parser.parse_args(argv)
    if args.version:
        from .. import __version__
        print(f"vramscope {__version__}")
        return EXIT_OK
    if args.verb is None:
        parser.print_help()
        return EXIT_OK
    return args.run(args)


def _main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    _tolerant_streams()
    from ..classifiers.rules import RulesError
    from ..parsers import Cancelled, SnapshotError
    from ..present.words import error_text as _one_line
    from ..present.words import internal_error_text
    verb = f"vramscope {argv[0]}" if argv and argv[0] in VERBS else "vramscope"     # what any error names
    try:
        argv = _route(argv)
        if argv and argv[0] in VERBS:
            verb = f"vramscope {argv[0]}"
        code = _dispatch(argv)
        sys.stdout.flush()               # here, where a write that fails is said (OutputError)
        return code
    except OutputError as e:
        return _output_failed(verb, e)
    except UsageError as e:
        print(f"{verb}: error: {_one_line(e)}", file=sys.stderr)
        return EXIT_USAGE
    except RulesError as e:
        print(f"{verb}: error: rules: {_one_line(e)}", file=sys.stderr)
        return EXIT_USAGE
    except SnapshotError as e:
        print(f"{verb}: {e.one_line()}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except (KeyboardInterrupt, Cancelled):
        print(f"{verb}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        _quiet_stdout()
        return EXIT_OK
    except Exception as e:          # a bug of ours: one line, and the traceback on request
        if came_from_interrupt(e):  # (a Ctrl-C whose unwinding failed in turn)
            print(f"{verb}: interrupted", file=sys.stderr)
            return EXIT_INTERRUPTED
        if os.environ.get("VRAMSCOPE_DEBUG"):
            raise
        print(f"{verb}: {internal_error_text(e)}", file=sys.stderr)
        return EXIT_INTERNAL


def _output_failed(verb: str, e: OutputError) -> int:
    """Say that the output could not be written (one line); the rest of it goes nowhere."""
    print(f"{verb}: error: cannot write the output: {e.strerror or e}", file=sys.stderr)
    _quiet_stdout()
    return EXIT_USAGE


def _quiet_stdout() -> None:
    """After a closed pipe (`vramscope allocations f | head`), make the final flush silent."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


__all__ = ["main", "build_parser", "VERBS", "UsageError", "EXIT_OK", "EXIT_USAGE", "EXIT_BAD_INPUT",
           "EXIT_INTERRUPTED", "EXIT_INTERNAL"]
