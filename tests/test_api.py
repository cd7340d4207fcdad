"""`vramscope.open`: the analysis the command line prints, from Python.

On every real snapshot in ../shared/snapshots (skipped when absent) and every fixture in
tests/data: `open(path).devices[i]` is `summary --json`'s `devices[i]` (same order, same
peak), `.summary()` is that document, and `.allocations()` holds the rows of
`allocations --csv`, column for column (whatever columns the CSV has)."""
from __future__ import annotations

import csv
import inspect
import io
import re
import subprocess
import sys

import numpy as np
import orjson
import pytest

import vramscope
from vramscope.classifiers.categories import CATEGORIES
from vramscope.classifiers.compare import Comparison
from vramscope.cli import main

from helpers import DATA, GROUNDTRUTH, NOT_A_SNAPSHOT, REAL_PEAKS, SHARED

REAL = sorted(p for p in SHARED.glob("*.p*kl*") if p.name != NOT_A_SNAPSHOT) if SHARED.is_dir() else []
FILES = REAL + sorted(DATA.glob("*.pickle"))
IDS = [p.name for p in FILES]


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("cache"))


@pytest.fixture(autouse=True)
def _env(monkeypatch, cache_dir):
    monkeypatch.setenv("VRAMSCOPE_CACHE_DIR", cache_dir)


def cli(capsys, *argv) -> str:
    code = main(list(argv))
    out = capsys.readouterr()
    assert code == 0, out.err
    return out.out


@pytest.mark.parametrize("path", FILES, ids=IDS)
def test_open_is_what_the_command_line_prints(path, capsys):
    doc = orjson.loads(cli(capsys, "summary", str(path), "--json"))
    s = vramscope.open(path)
    assert [d.device for d in s.devices] == [d["device"] for d in doc["devices"]]
    assert [d.peak.bytes for d in s.devices] == [d["peak"]["bytes"] for d in doc["devices"]]
    if doc["devices"]:
        assert s.devices[0].peak.bytes == doc["devices"][0]["peak"]["bytes"]
        assert s.devices[0].peak.index == doc["devices"][0]["peak"]["index"]
    if path.name in REAL_PEAKS:                  # the shared README's figures
        assert {d.device: d.peak.bytes for d in s.devices if d.device in REAL_PEAKS[path.name]} == \
            REAL_PEAKS[path.name]
    assert orjson.loads(orjson.dumps(s.summary())) == doc

    rows = list(csv.DictReader(io.StringIO(cli(capsys, "allocations", str(path), "--csv"))))
    table = s.allocations()
    assert isinstance(table, np.ndarray) and len(table) == len(rows)
    if rows:
        assert list(table.dtype.names) == list(rows[0])
    for name in table.dtype.names:
        assert [str(v) for v in table[name].tolist()] == [r[name] for r in rows], name


def test_device_summary_and_allocations_follow_device(capsys):
    path = str(DATA / "multi_device_oom.pickle")
    doc = orjson.loads(cli(capsys, "summary", path, "--json", "--device", "2"))
    s = vramscope.open(path, device=2)
    assert [d.device for d in s.devices] == [2] and s.summary() == doc
    assert set(s.allocations()["device"].tolist()) == {2}
    assert s.whatif().device == 2


def test_to_pandas():
    pd = pytest.importorskip("pandas")
    table = vramscope.open(DATA / "cuda_lora.pickle").allocations()
    df = table.to_pandas()
    assert list(df.columns) == list(table.dtype.names) and len(df) == len(table)
    assert isinstance(df["category"].dtype, pd.CategoricalDtype)
    assert df["size"].sum() == table["size"].sum()
    by_cat = df.groupby("category", observed=True)["size"].sum()
    assert by_cat.idxmax() in ("activations", "weights", "autograd", "temporary")


def test_a_column_is_a_numpy_array_and_its_max_a_number():
    table = vramscope.open(GROUNDTRUTH / "ft_base.pickle").allocations()
    size = table["size"]
    assert type(size) is np.ndarray and size.dtype.names is None
    biggest = size.max()
    assert isinstance(biggest, np.integer) and str(biggest) == str(int(biggest)) == "1048576"
    assert type(table["category"]) is np.ndarray and set(table["category"].tolist()) <= set(CATEGORIES)
    assert isinstance(table[:3], vramscope.AllocationTable) and len(table[:3]) == 3    # rows stay a table
    assert isinstance(table[["size", "device"]], vramscope.AllocationTable)


def _readme_python_section() -> str:
    from helpers import REPO
    return (REPO / "README.md").read_text().split("## Python\n", 1)[1].split("\n## ", 1)[0]


def _shown(sig: inspect.Signature) -> str:
    """A signature as README writes it: names and defaults, no annotations, no self."""
    return ", ".join(p.name if p.default is p.empty else f"{p.name}={p.default!r}"
                     for p in sig.parameters.values() if p.name != "self")


def test_the_readmes_api_section_matches_the_signatures():
    """Every call README's Python section writes as a signature (`vramscope.open(...)`,
    `.whatif(...)`: a code span that is one call) has the real parameters and defaults."""
    text = _readme_python_section().split("```python", 1)[0] + _readme_python_section().split("```", 2)[-1]
    spans = re.findall(r"`((?:vramscope)?\.?[A-Za-z_]\w*)\(((?:[^`()]|\(\))*)\)`", text)
    where = {"vramscope.open": vramscope.open, ".to_pandas": vramscope.AllocationTable.to_pandas}
    for name in ("summary", "allocations", "whatif", "compare"):
        where[f".{name}"] = getattr(vramscope.SnapshotAnalysis, name)
    seen = set()
    for name, params in spans:
        assert name in where, f"README's Python section shows `{name}(...)`, which is not in the public API"
        assert params == _shown(inspect.signature(where[name])), name
        seen.add(name)
    assert seen == set(where)          # each public call is shown with its signature


def test_whatif_and_compare_are_the_verbs(capsys):
    path, other = str(GROUNDTRUTH / "ft_base.pickle"), str(GROUNDTRUTH / "ft_checkpointing.pickle")
    s = vramscope.open(path)
    w = s.whatif(scales={"activations": 0.5})
    doc = orjson.loads(cli(capsys, "whatif", path, "--scale", "activations=0.5", "--json"))
    assert w.scaled.bytes == doc["devices"][0]["scaled"]["bytes"] < w.baseline.bytes == s.devices[0].peak.bytes
    cmp = s.compare(other)
    again = s.compare(vramscope.open(other))
    assert isinstance(cmp, Comparison) and cmp.devices[0].peak_delta == again.devices[0].peak_delta
    cdoc = orjson.loads(cli(capsys, "compare", path, other, "--json"))
    assert cmp.devices[0].peak_delta == cdoc["devices"][0]["delta"]["peak_bytes"] < 0
    with pytest.raises(ValueError, match="unknown lever"):
        s.whatif(levers=["magic"])


def test_errors_are_the_command_lines_one_liners(tmp_path):
    junk = tmp_path / "junk.pickle"
    junk.write_bytes(b"\x80\x04not really")
    for path, words in ((junk, "junk.pickle: "), (tmp_path / "gone.pickle", "gone.pickle: no such file"),
                        (SHARED / NOT_A_SNAPSHOT, "not a memory snapshot")):
        if not path.parent.is_dir():
            continue
        with pytest.raises(vramscope.SnapshotError) as e:
            vramscope.open(path)
        assert words in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(ValueError, match=r"no device 7 in .*\(devices with data: 0\)"):
        vramscope.open(GROUNDTRUTH / "ft_base.pickle", device=7)
    with pytest.raises(ValueError, match="rules file .*: no such file"):
        vramscope.open(GROUNDTRUTH / "ft_base.pickle", rules=tmp_path / "none.toml")


def test_the_public_api_and_a_cheap_import():
    assert {"open", "record", "SnapshotError", "SnapshotAnalysis", "Recorder"} <= set(vramscope.__all__)
    for name in vramscope.__all__:
        assert getattr(vramscope, name) is not None
    code = ("import sys, vramscope; heavy = [m for m in ('numpy', 'torch', 'PySide6', 'vramscope.parsers') "
            "if m in sys.modules]; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stdout
    assert out.strip() == "[]"
    assert "cuda:0 peak 13.28 MiB" in repr(vramscope.open(GROUNDTRUTH / "ft_base.pickle"))


def test_the_readme_example_runs_and_says_what_it_shows(monkeypatch):
    """The README's Python section, run as written from the repository root; the values its
    comments show are what it computes."""
    pytest.importorskip("pandas")
    from helpers import REPO
    text = (REPO / "README.md").read_text()
    block = text.split("## Python\n", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    monkeypatch.chdir(REPO)
    env: dict = {}
    lines = block.splitlines()
    for k, line in enumerate(lines):                  # each statement, its shown value checked
        code, _, shown = line.partition("  # ")
        if not code.strip():
            continue
        try:
            value = eval(code, env)
        except SyntaxError:
            exec(code, env)
            continue
        shown = shown.strip()
        if shown.startswith(("(", "{", "'", "-", "<")) or shown[:1].isdigit():
            expected = shown if shown.startswith("<") else eval(shown)
            assert (repr(value) if shown.startswith("<") else value) == expected, (k, line)
