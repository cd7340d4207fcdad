"""Errors a snapshot reader raises for bad input.

Every expected failure is a `SnapshotError` whose message is one line fit for a
terminal or a dialog; the command line maps them to exit code 3.
"""


class SnapshotError(Exception):
    """Bad input: not a snapshot, unsafe, truncated or corrupt."""

    kind = "bad input"

    def __init__(self, message: str, path: str | None = None):
        super().__init__(message)
        self.path = path

    def one_line(self) -> str:
        msg = " ".join(str(self).split())
        return f"{self.path}: {msg}" if self.path else msg


class UnsafePickleError(SnapshotError):
    """The pickle asks to import or call something: refused before it can act."""

    kind = "unsafe"


class UnsupportedPickleError(SnapshotError):
    """A pickle opcode no torch snapshot uses (and that we therefore do not accept)."""

    kind = "unsupported"


class TruncatedError(SnapshotError):
    """The file ends before the pickle does: a dump cut short (the process was killed while
    writing, the disk filled up, a copy or download was interrupted)."""

    kind = "truncated"

    def one_line(self) -> str:
        msg = " ".join(str(self).split())
        text = f"truncated: an incomplete dump ({msg}); record or copy it again"
        return f"{self.path}: {text}" if self.path else text


class CorruptError(SnapshotError):
    kind = "corrupt"


class LimitError(CorruptError):
    """A declared length, nesting depth or memo size beyond any real snapshot."""

    kind = "limit"


class NotASnapshotError(SnapshotError):
    kind = "not a snapshot"


class Cancelled(Exception):
    """The user cancelled a long operation (not an error in the input)."""
