"""`vramscope check`: exit 0 when every limit holds, 1 when one is broken (one FAIL line each,
naming what grew by category and code site), 2 usage, 3 bad input, on recorded runs:
tests/groundtruth/ft_base.pickle against ft_batch2x.pickle (the same loop, twice the
micro-batch) and the CUDA runs in tests/data."""
from __future__ import annotations

import pickle

import orjson
import pytest

from vramscope.cli import main

from helpers import DATA, GROUNDTRUTH

BASE = str(GROUNDTRUTH / "ft_base.pickle")
BATCH2X = str(GROUNDTRUTH / "ft_batch2x.pickle")


@pytest.fixture(autouse=True)
def _env(monkeypatch, tmp_path):
    monkeypatch.setenv("VRAMSCOPE_CACHE_DIR", str(tmp_path / "cache"))


def run(capsys, *argv):
    code = main(["check", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def peak(capsys, path, device=None) -> int:
    assert main(["summary", path, "--json"]) == 0
    doc = orjson.loads(capsys.readouterr().out)
    return next(d for d in doc["devices"] if device is None or d["device"] == device)["peak"]["bytes"]


def fails(out: str) -> list[str]:
    return [ln for ln in out.splitlines() if ln.startswith("FAIL")]


def test_growth_past_the_limit_fails_with_what_grew(capsys):
    a, b = peak(capsys, BASE), peak(capsys, BATCH2X)
    growth = 100 * (b - a) / a                                  # 83.3%: twice the micro-batch
    code, out, err = run(capsys, BATCH2X, "--baseline", BASE, "--max-growth", "5")
    assert (code, err) == (1, "")
    [line] = fails(out)
    assert f"peak grew {growth:.1f}%" in line and "--max-growth 5%" in line
    # what grew: activations most (the batch doubled), and the forward's code site
    assert "grew: activations +" in line and "sites: record_runs.py:forward +" in line
    assert run(capsys, BATCH2X, "--baseline", BASE, "--max-growth", f"{growth + 0.1:.1f}%")[0] == 0
    assert run(capsys, BATCH2X, "--baseline", BASE, "--max-growth", f"{growth - 0.1:.1f}")[0] == 1


def test_peak_past_the_limit_fails_with_what_is_largest(capsys):
    b = peak(capsys, BATCH2X)
    code, out, _ = run(capsys, BATCH2X, "--max-peak", f"{b - 1}B")
    assert code == 1
    [line] = fails(out)
    assert f"peak {b / 2**20:.2f} MiB ({b:,} B), 1 B over" in line
    assert "largest at the peak: activations" in line and "sites at the peak: record_runs.py:forward" in line
    code, out, _ = run(capsys, BATCH2X, "--max-peak", f"{b}B")
    assert code == 0 and fails(out) == [] and out.startswith("ok   --max-peak")


def test_one_line_per_broken_limit(capsys):
    code, out, _ = run(capsys, BATCH2X, "--baseline", BASE, "--max-peak", "1MiB")
    assert code == 1 and len(out.splitlines()) == 2 and len(fails(out)) == 2   # default growth: none at all
    code, out, _ = run(capsys, BATCH2X, "--baseline", BASE, "--max-peak", "1GiB", "--max-growth", "100")
    assert code == 0 and len(out.splitlines()) == 2 and fails(out) == []


def test_the_same_run_passes_and_a_smaller_one_passes(capsys):
    assert run(capsys, BASE, "--baseline", BASE)[0] == 0
    code, out, _ = run(capsys, str(DATA / "cuda_ckpt.pickle"), "--baseline", str(DATA / "cuda_lora.pickle"))
    assert code == 0 and "peak fell" in out          # checkpointing lowers the peak
    code, out, _ = run(capsys, str(DATA / "cuda_leak.pickle"), "--baseline", str(DATA / "cuda_lora.pickle"),
                       "--max-growth", "1")
    assert code == 1 and len(fails(out)) == 1        # a leak grows it


def test_every_device_is_checked_and_device_picks_one(capsys):
    path = str(DATA / "multi_device.pickle")
    peaks = {d: peak(capsys, path, d) for d in (0, 1, 2)}
    limit = min(peaks.values())                       # every device but the smallest is over it
    code, out, _ = run(capsys, path, "--max-peak", f"{limit}B")
    over = [d for d, p in peaks.items() if p > limit]
    assert code == 1 and len(out.splitlines()) == 3 and len(fails(out)) == len(over) == 2
    assert [f"device {d} peak" in line for d, line in zip(over, fails(out))] == [True, True]
    fine = next(d for d, p in peaks.items() if p <= limit)
    assert run(capsys, path, "--max-peak", f"{limit}B", "--device", str(fine))[0] == 0


def test_json(capsys):
    code, out, _ = run(capsys, BATCH2X, "--baseline", BASE, "--max-growth", "5", "--max-peak", "1GiB", "--json")
    doc = orjson.loads(out)
    assert code == 1 and doc["ok"] is False and (doc["file"], doc["baseline"]) == (BATCH2X, BASE)
    peak_limit, growth = doc["limits"]
    assert (peak_limit["limit"], peak_limit["ok"], peak_limit["threshold"]) == ("max_peak", True, 2**30)
    assert (growth["limit"], growth["ok"], growth["threshold"]) == ("max_growth", False, 5)
    assert growth["measured"] == pytest.approx(100 * (growth["peak_bytes"] - growth["baseline_bytes"])
                                               / growth["baseline_bytes"])
    assert growth["grew"]["by_category"][0]["what"] == "activations" and growth["line"].startswith("FAIL")


@pytest.mark.parametrize("argv, words", [
    ([BASE], "no limit to check"),
    ([BASE, "--max-growth", "5"], "--max-growth needs --baseline"),
    ([BASE, "--max-peak", "lots"], "--max-peak 'lots'"),
    ([BASE, "--max-peak", "-1"], "must be positive"),
    ([BASE, "--baseline", BASE, "--max-growth", "five"], "expected a percentage"),
    ([BASE, "--baseline", BASE, "--max-growth", "-2"], "0 or more"),
    ([BASE, "--max-peak", "1G", "--device", "3"], "no device 3"),
])
def test_usage_errors(capsys, argv, words):
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == "" and len(err.splitlines()) == 1 and words in err


def test_bad_input_names_the_path(capsys, tmp_path):
    junk = tmp_path / "junk.pickle"
    junk.write_bytes(b"not a pickle")
    empty = tmp_path / "empty.pickle"
    empty.write_bytes(pickle.dumps({"segments": [], "device_traces": []}, protocol=4))
    for argv, path in (([str(junk), "--max-peak", "1G"], junk), ([BASE, "--baseline", str(junk)], junk),
                       ([BASE, "--baseline", str(tmp_path / "gone.pickle")], tmp_path / "gone.pickle"),
                       ([str(empty), "--max-peak", "1G"], empty), ([BASE, "--baseline", str(empty)], empty)):
        code, out, err = run(capsys, *argv)
        assert code == 3 and out == "" and len(err.splitlines()) == 1, (argv, err)
        assert str(path) in err and "Traceback" not in err
