"""Reporters: one document, one output format, behind one small protocol (memray's
`BaseReporter`). A verb builds its document once and hands it to the reporter its options
picked; it never branches on the format:

    REPORTERS = {"text": TextReporter(summary_text), "json": JsonReporter()}
    REPORTERS[args.format].render(document, sys.stdout.buffer)      # cli/common.py: emit()

Every reporter writes UTF-8 bytes to a binary stream (standard output's buffer, or the
file `atomic_write` opens), so a document is byte-for-byte the same on a terminal, in a
pipe and in a file, and a lone surrogate from a damaged frame name is written as
\\udXXXX instead of failing.
"""
from __future__ import annotations

import io
from typing import IO, Any, Callable, Generic, Iterable, Protocol, Sequence, TypeVar

from ..common.jsonio import write_pretty

D = TypeVar("D", contravariant=True)
T = TypeVar("T")


class Reporter(Protocol[D]):
    """Writes `document` in one format to `out`."""

    def render(self, document: D, out: IO[bytes]) -> None: ...


def _utf8(text: str) -> bytes:
    return text.encode("utf-8", "backslashreplace")


class JsonReporter:
    """Any JSON document, indented, with a final newline (`--json`, analysis.json)."""

    def render(self, document: Any, out: IO[bytes]) -> None:
        write_pretty(document, out)


class TextReporter(Generic[T]):
    """A document in words: `words(document)` (the presentation layer's) and a final newline."""
    end = "\n"

    def __init__(self, words: Callable[[T], str]):
        self.words = words

    def render(self, document: T, out: IO[bytes]) -> None:
        out.write(_utf8(self.words(document) + self.end))


class MarkdownReporter(TextReporter[T]):
    """Markdown (report.md): `words(document)` as it is (it ends its own last line)."""
    end = ""


class CsvReporter(Generic[T]):
    """A table as CSV: the header, then `batches(document)`: the rows a batch at a time, as
    columns (a list per header field, in its order). A column of numbers is written as Python
    writes them; any other as the `csv` module writes a field (quoted only where it holds a
    comma, a quote, '\\n' or '\\r': RFC 4180); lines end with '\\n'. Quoting once
    per distinct text and formatting a batch in one pass keeps a million rows near the
    cost of plain f-strings (csv.writer.writerows takes twice as long)."""

    def __init__(self, header: Sequence[str], batches: Callable[[T], Iterable[Sequence[list]]]):
        self.header = tuple(header)
        self.batches = batches

    def render(self, document: T, out: IO[bytes]) -> None:
        quoted = _Quoted()
        line = ",".join(["{}"] * len(self.header)) + "\n"
        out.write(_utf8(line.format(*map(quoted.__getitem__, self.header))))
        for columns in self.batches(document):
            if len(columns) != len(self.header):
                raise ValueError(f"{len(columns)} columns for a header of {len(self.header)}")
            cols = [c if set(map(type, c)) <= _NUMBERS else list(map(quoted.__getitem__, c)) for c in columns]
            out.write(_utf8("".join(map(line.format, *cols))))
            if len(quoted) > 100_000:           # a column of all-distinct text: keep memory bounded
                quoted.clear()


_NUMBERS = {int, float}


class _Quoted(dict):
    """text -> the field the csv module writes for it inside a row. Its writer ends lines with
    '\\r\\n' (the default) so that a field holding either character is quoted: a reader takes
    a bare '\\r' for a line end too (with '\\n' alone the module would leave it bare)."""

    def __missing__(self, text):
        import csv                      # here: a verb that writes no CSV never loads it
        buf = io.StringIO()
        csv.writer(buf).writerow([text, ""])              # (a lone empty field is written '""')
        field = self[text] = buf.getvalue()[:-3]          # less ',\r\n'
        return field


__all__ = ["Reporter", "JsonReporter", "TextReporter", "MarkdownReporter", "CsvReporter"]
