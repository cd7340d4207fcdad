"""The command line's errors and exit codes (DESIGN.md §6: scripts depend on them)."""
from __future__ import annotations

EXIT_OK, EXIT_USAGE, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 0, 2, 3, 130
EXIT_LIMIT_BROKEN = 1        # `vramscope check`: a memory limit is broken (and nothing else exits 1)
EXIT_INTERNAL = 4            # a bug of ours: a CI job must never take it for a broken limit


class UsageError(Exception):
    """A wrong command line, a path we cannot write, a rules file we cannot use: exit 2."""


class NoDisplayError(UsageError):
    """The viewer was asked for where no window can open."""


class OutputError(OSError):
    """The command's output could not be written (a full disk, a closed terminal): exit 2, like
    an output path that cannot be written; never taken for a bug of ours."""
