"""The reporters (services/reporters.py): each writes one document in one format, and the
CSV one writes exactly what the standard library's csv.writer writes."""
from __future__ import annotations

import csv
import io

from vramscope.services.reporters import CsvReporter, JsonReporter, MarkdownReporter, TextReporter

TRICKY = ["plain", "a,b", 'say "hi"', "two\nlines", "cr\rhere", "", " spaced ", "ünïcödé", "{}", "x\ud800y", None,
          "=1+2", "tab\there"]


def _written(reporter, document) -> bytes:
    out = io.BytesIO()
    reporter.render(document, out)
    return out.getvalue()


def _batches(rows):
    """Two batches, as columns."""
    for part in (rows[:5], rows[5:]):
        yield [list(col) for col in zip(*part)]


def test_csv_reads_back_whatever_the_text():
    header = ("n", "text", "f")
    rows = [(k, t, k / 3) for k, t in enumerate(TRICKY)]
    got = _written(CsvReporter(header, _batches), rows)
    back = list(csv.reader(io.StringIO(got.decode("utf-8"), newline="")))
    assert back[0] == list(header) and len(back) == len(rows) + 1
    want = [[str(k), "" if t is None else t.encode("utf-8", "backslashreplace").decode(), repr(k / 3)]
            for k, t in enumerate(TRICKY)]
    assert back[1:] == want


def test_csv_is_what_the_csv_module_writes():
    """Byte for byte csv.writer's (with '\\n' line ends), wherever that reads back: the csv
    module leaves a bare '\\r' unquoted there, we quote it."""
    header = ("n", "text", "f")
    rows = [(k, t, k / 3) for k, t in enumerate(x for x in TRICKY if x is None or "\r" not in x)]
    ref = io.StringIO()
    w = csv.writer(ref, lineterminator="\n")
    w.writerow(header)
    w.writerows(rows)
    assert _written(CsvReporter(header, _batches), rows) == ref.getvalue().encode("utf-8", "backslashreplace")


def test_text_markdown_and_json():
    assert _written(TextReporter(lambda d: f"peak {d['peak']}"), {"peak": 3}) == b"peak 3\n"
    assert _written(MarkdownReporter(str), "# title\n") == b"# title\n"
    assert _written(TextReporter(str), "lone \ud800") == b"lone \\ud800\n"
    assert _written(JsonReporter(), {"a": [1, "\u00e9"]}) == '{\n  "a": [\n    1,\n    "\u00e9"\n  ]\n}\n'.encode()
