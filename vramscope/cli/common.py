"""What every verb shares: opening and analysing with a progress bar, output paths, and
writing a document with the reporter its options picked."""
from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, TypeVar

from .errors import EXIT_OK, UsageError

if TYPE_CHECKING:
    from ..classifiers import Analysis
    from ..parsers import Snapshot
    from ..services.reporters import Reporter

D = TypeVar("D")


def add_json(p, help: str = "print one JSON object (stable: scripts use it)") -> None:
    """`--json`: the JSON reporter instead of the text one (`args.format`: 'json' or 'text')."""
    p.add_argument("--json", dest="format", action="store_const", const="json", default="text", help=help)


def emit(reporter: Reporter[D], document: D) -> int:
    """Write `document` to standard output with `reporter` (services/reporters.py); the verb's
    exit code."""
    sys.stdout.flush()
    reporter.render(document, sys.stdout.buffer)
    sys.stdout.buffer.flush()
    return EXIT_OK


def add_input(p, rules: bool = True, device: bool = True) -> None:
    """The options of every verb that reads a snapshot."""
    if device:
        p.add_argument("--device", type=int, metavar="N", help="only this CUDA device (default: all, or the one "
                       "to look at first: an OOM, else the highest peak)")
    p.add_argument("--no-cache", action="store_true",
                   help="neither read nor write the cache of parsed columns and analyses")
    if rules:
        p.add_argument("--rules", metavar="FILE", help="extra classification rules (TOML or JSON); "
                       "default $VRAMSCOPE_RULES or ~/.config/vramscope/rules.toml")


def open_file(path: str, no_cache: bool = False) -> Snapshot:
    from ..parsers import TerminalProgress, open_snapshot
    progress = TerminalProgress()
    try:
        return open_snapshot(path, progress=progress, use_cache=not no_cache)
    finally:
        progress.close()


def analyze_file(path: str, no_cache: bool = False, rules: str | None = None) -> Analysis:
    from ..classifiers import analyze
    check_rules(rules)
    return analyze(open_file(path, no_cache), rules_path=rules)


def check_rules(rules: str | None) -> None:
    if rules is not None and not os.path.isfile(rules):
        raise UsageError(f"rules file {rules}: no such file")


def check_device(an: Analysis, device: int | None) -> None:
    if device is not None and device not in an.devices:
        devs = ", ".join(str(d) for d in sorted(an.devices)) or "none"
        raise UsageError(f"no device {device} in {an.snapshot.path} (devices with data: {devs})")


def output_dir(path: str) -> str:
    """A folder to write into: made when missing (with its parents); refused when it is a
    file or cannot be made or written."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise UsageError(f"{path}: exists and is not a folder (give a folder for the report)")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        raise UsageError(f"{path}: cannot create the folder: {e.strerror or e}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise UsageError(f"{path}: the folder is not writable")
    return path


def output_file(path: str, extensions: tuple[str, ...], what: str) -> str:
    """A file to write: its folder must exist and be writable, its name must end in one
    of `extensions`, and it must not be a folder."""
    if not path.lower().endswith(extensions):
        raise UsageError(f"{path}: {what} is written as {' or '.join(extensions)}; name the file so")
    if os.path.isdir(path):
        raise UsageError(f"{path}: is a folder, give a file name")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise UsageError(f"{path}: the folder {folder} does not exist")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise UsageError(f"{path}: the folder {folder} is not writable")
    return path
