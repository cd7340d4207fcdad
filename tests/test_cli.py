"""The command line at the edges users hit: no display, bad paths, typos, every verb on
every real snapshot (DESIGN.md §6: one line on stderr, exit 2 usage, 3 bad input)."""
from __future__ import annotations

import os
import pickle
import re
import subprocess
import sys
import time

import orjson
import pytest

from vramscope.cli import main
from vramscope.cli.display import debian_package

from helpers import DATA, NOT_A_SNAPSHOT, REPO, SHARED, needs_shared, require

EXAMPLE = str(REPO / "assets" / "example.pickle")
REAL = sorted(SHARED.glob("*.p*kl*")) if SHARED.is_dir() else []


@pytest.fixture(autouse=True)
def _env(monkeypatch, tmp_path):
    monkeypatch.setenv("VRAMSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("VRAMSCOPE_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("QT_QPA_PLATFORM", "offscreen")


def run(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def one_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    return lines[0]


def headless_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM")}
    env.update(VRAMSCOPE_CACHE_DIR="", **extra)
    return env


# -- no display ---------------------------------------------------------------------------------
def test_viewer_without_a_display_says_so_in_a_second():
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "vramscope", EXAMPLE], capture_output=True, text=True,
                       env=headless_env(), timeout=30)
    took = time.monotonic() - t0
    assert r.returncode == 2
    line = one_line(r.stderr)
    assert "no display" in line and "vramscope summary FILE" in line and "vramscope report FILE -o DIR" in line
    assert took < 10          # it used to abort in Qt, or (offscreen) run forever


def test_offscreen_platform_shows_no_window():
    r = subprocess.run([sys.executable, "-m", "vramscope", "view", EXAMPLE], capture_output=True, text=True,
                       env=headless_env(QT_QPA_PLATFORM="offscreen"), timeout=30)
    assert r.returncode == 2 and "shows no window" in one_line(r.stderr)


def test_report_and_screenshot_need_no_display(tmp_path):
    """The headless verbs draw their PNGs offscreen on their own."""
    r = subprocess.run([sys.executable, "-m", "vramscope", "report", EXAMPLE, "-o", str(tmp_path / "r")],
                       capture_output=True, text=True, env=headless_env(), timeout=120)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "r" / "timeline.png").stat().st_size > 1000
    r = subprocess.run([sys.executable, "-m", "vramscope", "view", EXAMPLE, "--screenshot", str(tmp_path / "s.png")],
                       capture_output=True, text=True, env=headless_env(), timeout=120)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "s.png").stat().st_size > 1000


def test_debian_package_names():
    assert debian_package("libxcb-icccm.so.4") == "libxcb-icccm4"
    assert debian_package("libxcb-keysyms.so.1") == "libxcb-keysyms1"
    assert debian_package("libxkbcommon-x11.so.0") == "libxkbcommon-x11-0"
    assert debian_package("libxcb-render-util.so.0") == "libxcb-render-util0"
    assert debian_package("libEGL.so.1") == "libegl1"


# -- arguments -------------------------------------------------------------------------------------
def test_no_arguments_prints_help(capsys):
    code, out, err = run(capsys)
    assert code == 0 and "usage: vramscope" in out and "vramscope FILE" in out and not err


def test_a_typo_suggests_the_verb(capsys):
    code, out, err = run(capsys, "sumary", EXAMPLE)
    assert code == 2 and "did you mean `vramscope summary`" in one_line(err)


def test_a_missing_file_is_a_usage_error(capsys, tmp_path):
    code, _, err = run(capsys, str(tmp_path / "nope.pickle"))
    assert code == 2 and "no such file" in one_line(err)
    code, _, err = run(capsys, "summary", str(tmp_path / "nope.pickle"))
    assert code == 3 and "no such file" in one_line(err) and err.startswith("vramscope summary:")


def test_an_internal_error_is_exit_4_with_one_line_asking_for_a_report(capsys, monkeypatch):
    """Never exit 1 (a broken limit of `check`): a CI job must tell a crash from a regression."""
    from vramscope.services import summary as summary_service

    def bug(*a, **k):
        raise KeyError("peak")
    monkeypatch.setattr(summary_service, "summary_document", bug)
    code, out, err = run(capsys, "summary", EXAMPLE, "--json")
    assert code == 4 and out == ""
    assert one_line(err) == ("vramscope summary: internal error: KeyError: 'peak' (a bug in vramscope: please "
                             "report it, with the traceback VRAMSCOPE_DEBUG=1 prints)")
    monkeypatch.setenv("VRAMSCOPE_DEBUG", "1")
    with pytest.raises(KeyError):
        main(["summary", EXAMPLE])
    assert "4 internal error" in main.__globals__["EPILOG"] and "nothing else exits 1" in main.__globals__["EPILOG"]


def test_every_option_has_help():
    from vramscope.cli import build_parser
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "verb")
    for verb, p in sub.choices.items():
        for action in p._actions:
            if action.dest != "help":
                assert action.help, f"{verb} {action.option_strings or action.dest} has no help"
    export_usage = sub.choices["export"].format_usage()
    assert "(--trim START:END | --around-peak | --perfetto)" in export_usage


def test_rules_everywhere_and_a_missing_rules_file(capsys, tmp_path):
    for verb in ("summary", "allocations", "whatif"):
        code, _, err = run(capsys, verb, EXAMPLE, "--rules", str(tmp_path / "none.toml"))
        assert code == 2 and "rules file" in one_line(err)


# -- output paths --------------------------------------------------------------------------------
def test_bad_output_paths(capsys, tmp_path):
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    cases = [
        ("report", EXAMPLE, "-o", str(a_file)),
        ("report", EXAMPLE, "-o", "/proc/vramscope-x"),
        ("export", EXAMPLE, "--around-peak", "-o", str(tmp_path / "missing" / "x.pickle")),
        ("export", EXAMPLE, "--perfetto", "-o", str(tmp_path / "missing" / "x.json")),
        ("export", EXAMPLE, "--perfetto", "-o", str(tmp_path / "x.pickle")),
        ("export", EXAMPLE, "--trim", "0:10", "-o", str(tmp_path / "x.json")),
        ("view", EXAMPLE, "--screenshot", str(tmp_path / "missing" / "s.png")),
    ]
    for argv in cases:
        code, out, err = run(capsys, *argv)
        assert code == 2, (argv, err)
        one_line(err)
    assert a_file.read_text() == "x"
    assert not (tmp_path / "missing").exists()


def test_report_makes_a_new_folder(capsys, tmp_path):
    out = tmp_path / "new" / "deeper"
    code, printed, err = run(capsys, "report", EXAMPLE, "-o", str(out))
    assert code == 0, err
    assert {p.name for p in out.iterdir()} == {"report.md", "analysis.json", "timeline.png"}


# -- export ------------------------------------------------------------------------------------------
def test_export_ranges(capsys, tmp_path):
    from vramscope.parsers import open_snapshot
    out = str(tmp_path / "t.pickle")
    code, _, err = run(capsys, "export", EXAMPLE, "--trim", "3000:99999", "-o", out)
    assert code == 0 and "clamped to the trace: 3000:3239" in err
    assert len(open_snapshot(out, use_cache=False).trace(0)) == 240
    code, _, err = run(capsys, "export", EXAMPLE, "--trim", "10:5", "-o", out)
    assert code == 2 and "END comes before START" in one_line(err)
    code, _, err = run(capsys, "export", EXAMPLE, "--trim", "5000:6000", "-o", out)
    assert code == 2 and "holds no entry" in one_line(err)


@needs_shared
def test_state_only_snapshots_export_their_state(capsys, tmp_path):
    src = SHARED / "volcengine+verl__mem.pickle"
    out = str(tmp_path / "state.pickle")
    code, printed, err = run(capsys, "export", str(src), "--around-peak", "-o", out)
    assert code == 0, err
    assert "allocator state" in printed
    code, printed, _ = run(capsys, "summary", out, "--json")
    assert orjson.loads(printed)["devices"][0]["peak"]["bytes"] == 25483614352


def test_export_takes_the_device_to_look_at_first(capsys, tmp_path):
    src = require(DATA / "multi_device_oom.pickle")
    out = str(tmp_path / "t.pickle")
    code, printed, err = run(capsys, "export", str(src), "--around-peak", "--window", "50", "-o", out)
    assert code == 0, err
    assert printed.split(": device ")[1].startswith("1,")          # the device that ran out of memory
    with open(out, "rb") as fh:
        doc = pickle.load(fh)
    assert len(doc["device_traces"][1]) == 50


# -- several devices ------------------------------------------------------------------------------
def test_summary_and_report_lead_with_the_oom_device(capsys, tmp_path):
    src = require(DATA / "multi_device_oom.pickle")
    code, printed, _ = run(capsys, "summary", str(src), "--json")
    doc = orjson.loads(printed)
    assert doc["primary_device"] == 1 and [d["device"] for d in doc["devices"]][0] == 1
    code, text, _ = run(capsys, "summary", str(src))
    assert text.splitlines()[1].startswith("devices (the one to look at first is marked *)")
    assert "* cuda:1" in text
    code, _, _ = run(capsys, "report", str(src), "-o", str(tmp_path / "r"))
    md = (tmp_path / "r" / "report.md").read_text()
    assert md.index("## Devices") < md.index("## Device 1") < md.index("## Device 0") < md.index("## Annotations")
    assert "cuda:1 (look here first)" in md


# -- whatif -------------------------------------------------------------------------------------------
def test_whatif_json_contract(capsys):
    code, printed, err = run(capsys, "whatif", EXAMPLE, "--scale", "activations=0.5", "--lever", "adam8bit",
                             "--gpu", "24", "--json")
    assert code == 0, err
    doc = orjson.loads(printed)
    assert doc["file"] == EXAMPLE
    (d,) = doc["devices"]
    for key in ("device", "baseline", "scaled", "scales", "budget", "fits"):
        assert key in d
    for side in ("baseline", "scaled"):
        assert set(d[side]) >= {"bytes", "index", "type", "by_category"}
    assert d["scales"]["activations"] == 0.5 and d["scales"]["optimizer"] < 0.5
    assert all(set(r) >= {"category", "measured", "measured_max", "expected", "formula", "note"} for r in d["budget"])
    code, printed, _ = run(capsys, "summary", EXAMPLE, "--json")
    peak = orjson.loads(printed)["devices"][0]["peak"]
    assert (d["baseline"]["bytes"], d["baseline"]["index"], d["baseline"]["type"]) == \
        (peak["bytes"], peak["index"], peak["type"])


@pytest.mark.parametrize("argv, words", [
    (["--scale", "bogus=2"], "unknown category"),
    (["--scale", "activations=-1"], ">= 0"),
    (["--scale", "activations"], "CATEGORY=FACTOR"),
    (["--gpu", "lots"], "GPU size"),
    (["--lever", "magic"], "invalid choice"),
])
def test_whatif_usage_errors(capsys, argv, words):
    code, _, err = run(capsys, "whatif", EXAMPLE, *argv)
    assert code == 2 and words in one_line(err)


# -- every verb on every real snapshot -------------------------------------------------------------
@pytest.mark.parametrize("path", REAL, ids=[p.name for p in REAL])
def test_every_verb_on_every_real_snapshot(path, capsys, tmp_path):
    bad = path.name == NOT_A_SNAPSHOT
    verbs = [["summary", str(path)], ["summary", str(path), "--json"], ["allocations", str(path), "--csv"],
             ["report", str(path), "-o", str(tmp_path / "r")], ["whatif", str(path), "--json"],
             ["export", str(path), "--around-peak", "-o", str(tmp_path / "t.pickle")],
             ["export", str(path), "--perfetto", "-o", str(tmp_path / "t.json")],
             ["view", str(path), "--screenshot", str(tmp_path / "s.png")]]
    for argv in verbs:
        code, out, err = run(capsys, *argv)
        if bad:
            assert code == 3, (argv, err)
            assert "not a memory snapshot" in one_line(err)
        else:
            # an empty snapshot has nothing to export: bad input, one line
            assert code == 0 or (code == 3 and argv[0] == "export" and "empty snapshot" in err), (argv, err)
            assert "Traceback" not in err


def test_a_truncated_file_says_it_is_an_incomplete_dump(capsys, tmp_path):
    cut = tmp_path / "cut.pickle"
    cut.write_bytes(open(EXAMPLE, "rb").read()[:5000])
    code, _, err = run(capsys, "summary", str(cut), "--no-cache")
    assert code == 3
    line = one_line(err)
    assert "truncated: an incomplete dump" in line and "record or copy it again" in line


def test_allocations_csv_is_valid_for_any_rule_id(capsys, tmp_path):
    """A user rule id is the user's text: with a comma, a quote and a line break in it, every
    row still reads back (csv.reader) as the header's fields, the id whole."""
    import csv
    import io

    from vramscope.services.allocations import COLUMNS
    rid = 'my,rule "quoted"\nsecond line'
    rules = tmp_path / "rules.toml"
    rules.write_text('version = 1\n[[rule]]\nid = "my,rule \\"quoted\\"\\nsecond line"\ncategory = "inputs"\n'
                     'phase = ["forward"]\n')
    code, out, err = run(capsys, "allocations", EXAMPLE, "--csv", "--rules", str(rules))
    assert code == 0, err
    rows = list(csv.reader(io.StringIO(out, newline="")))
    assert rows[0] == list(COLUMNS) and len(COLUMNS) == 9
    assert all(len(r) == len(COLUMNS) for r in rows)
    mine = [r for r in rows[1:] if r[7] == rid]
    assert mine and all(r[6] == "inputs" for r in mine)
    code, summary, err = run(capsys, "summary", EXAMPLE, "--json", "--rules", str(rules))
    assert len(rows) - 1 == sum(d["allocations"] for d in orjson.loads(summary)["devices"])
    # every other field is written as it is, unquoted: the usual CSV is unchanged
    plain = [ln for ln in out.splitlines() if "my,rule" not in ln and "second line" not in ln]
    assert len(plain) > len(mine) and not any('"' in ln for ln in plain)


def test_summary_lists_a_long_runs_iterations_by_their_first_highest_and_last(capsys, tmp_path):
    """2,000 iterations listed one a line buried the leaks and the OOM under them: past a dozen,
    the first three, the highest peak and the last, and where the rest are; --json keeps all."""
    from test_linear import loop           # the training loop its growth guard records

    p = tmp_path / "long.pickle"
    p.write_bytes(pickle.dumps(loop(30, oom=True), protocol=4))
    code, out, _ = run(capsys, "summary", str(p))
    assert code == 0
    its = orjson.loads(run(capsys, "summary", "--json", str(p))[1])["devices"][0]["iterations"]
    assert len(its) > 12
    highest = max(its, key=lambda it: it["peak_bytes"])["number"]
    listed = [int(m[1]) for m in re.finditer(r"^ +(\d+)  peak ", out, re.M)]
    assert listed == sorted({1, 2, 3, highest, len(its)})
    assert f"({len(listed)} of {len(its)} shown" in out and "OOM" in out.split("shown")[1]
