"""`vramscope check`: exit 0 when every limit holds, 1 when one is broken (one FAIL line each,
naming what grew by category and code site), 2 usage, 3 bad input, on recorded runs:
tests/groundtruth/ft_base.pickle against ft_batch2x.pickle (the same loop, twice the
micro-batch) and the CUDA runs in tests/data."""
from __future__ import annotations

import pickle

import orjson
import pytest

from vramscope.cli import main
from vramscope.common.units import fmt_bytes

import ranks_data as rd
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


def test_sizes_gb_is_ten_to_the_nine_gib_two_to_the_thirty(capsys):
    """GB = 10^9 and GiB = 2^30, as every verb reads them (--gpu too); a bare number is GiB."""
    p = peak(capsys, BASE)                                          # 13,920,824 B
    kib = -(-p // 1024)                                             # the fewest KiB that hold it
    assert kib * 1000 < p <= kib * 1024
    assert run(capsys, BASE, "--max-peak", f"{kib}KiB")[0] == 0
    assert run(capsys, BASE, "--max-peak", f"{kib}kB")[0] == 1
    gb = round(p / 1e9, 4) - 0.0001                                 # 0.0138 GB < p < 0.0138 GiB
    assert gb * 1e9 < p <= gb * 2 ** 30
    code, out, _ = run(capsys, BASE, "--max-peak", f"{gb}GB")
    assert code == 1 and f"--max-peak {fmt_bytes(int(gb * 1e9))}" in out
    assert run(capsys, BASE, "--max-peak", f"{gb}GiB")[0] == run(capsys, BASE, "--max-peak", f"{gb}")[0] == 0
    from vramscope.classifiers.whatif import parse_gpu_size
    assert parse_gpu_size("80GB") == 80 * 10 ** 9 and parse_gpu_size("80GiB") == parse_gpu_size("80") == 80 << 30


def test_a_device_missing_from_the_baseline_fails_growth_with_the_reason(capsys, tmp_path):
    """multi_device.pickle has data on devices 0, 1 and 2; ft_base.pickle on device 0 only:
    the growth of 1 and 2 cannot be checked, so --max-growth fails there (exit 1, never a
    silent note), and --max-peak is still checked on every device."""
    path = str(DATA / "multi_device.pickle")
    code, out, err = run(capsys, path, "--baseline", BASE, "--max-growth", "1000000", "--max-peak", "1TiB")
    assert (code, err) == (1, "")
    lines = out.splitlines()
    assert [ln.split(":")[0] for ln in lines] == ["ok   --max-peak 1.00 TiB", "ok   --max-growth 1e+06%"] + [
        "ok   --max-peak 1.00 TiB", "FAIL --max-growth 1e+06%"] * 2
    for d, line in zip((1, 2), fails(out)):
        assert f"device {d} peak" in line and "has no data in the baseline to grow from" in line
        assert "largest at the peak:" in line
    code, out, _ = run(capsys, path, "--baseline", BASE, "--device", "1", "--json")
    doc = orjson.loads(out)
    [limit] = doc["limits"]
    assert code == 1 and (limit["device"], limit["ok"], limit["measured"], limit["baseline_bytes"]) == (1, False,
                                                                                                       None, None)
    # no device in common at all (the job moved to another GPU): it fails too, with the reason
    moved = tmp_path / "cuda3.pickle"
    rd.write(moved, rd.rank_object(3))
    code, out, err = run(capsys, str(moved), "--baseline", BASE, "--max-growth", "50")
    assert (code, err) == (1, "") and len(fails(out)) == 1 and "device 3 peak" in fails(out)[0]
    assert "note: device 0 has data in the baseline only" in out


@pytest.mark.parametrize("argv, words", [
    ([BASE], "no limit to check"),
    ([BASE, "--max-growth", "5"], "--max-growth needs --baseline"),
    ([BASE, "--max-peak", "lots"], "--max-peak 'lots'"),
    ([BASE, "--max-peak", "-1"], "--max-peak '-1': must be more than 0"),
    ([BASE, "--max-peak", "-5GB"], "--max-peak '-5GB': must be more than 0"),
    ([BASE, "--max-peak=-5GB"], "--max-peak '-5GB': must be more than 0"),
    ([BASE, "--max-peak", "0"], "--max-peak '0': must be more than 0"),
    ([BASE, "--max-peak=0GB"], "--max-peak '0GB': must be more than 0"),
    ([BASE, "--max-peak", "5e-12"], "--max-peak '5e-12': less than one byte"),
    ([BASE, "--max-peak", "nan"], "--max-peak 'nan': expected a size"),
    ([BASE, "--max-peak", "inf"], "--max-peak 'inf': expected a size"),
    ([BASE, "--max-peak", "1e30"], "more bytes than any memory holds"),
    ([BASE, "--max-peak", "16 XB"], "--max-peak '16 XB': expected a size"),
    ([BASE, "--max-peak", ""], "--max-peak '': expected a size"),
    ([BASE, "--baseline", BASE, "--max-growth", "-2%"], "0 or more"),
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
