"""Iterations held as columns (classifiers/iterations.py) read as the Iteration objects they
stand for: each row, a slice, a loop, `to_plain`, and the analysis cache's columns back."""
import dataclasses

import numpy as np
import orjson
import pytest

from vramscope.classifiers.iterations import Iterations, starts_ends
from vramscope.classifiers.results import Iteration, _dataclass_plain, to_plain

ITS = (Iteration(1, 0, 9, None, None, {}, 1),
       Iteration(2, 10, 99, 5, 70, {"forward": (10, 40), "backward": (41, 90)}, 2, source="forward_runs",
                 peak_bytes=1 << 40, peak_index=37, peak_type="forward"),
       Iteration(3, 100, 180, 71, None, {"inputs": (100, 104), "forward": (105, 130), "unwind": (170, 180)}, 1,
                 peak_bytes=12, peak_index=100, peak_type="oom"))
NAMES = tuple(f.name for f in dataclasses.fields(Iteration))


def many(n: int) -> tuple[Iteration, ...]:
    """n iterations of varied phases and times (more than the loops' thresholds for lists)."""
    rng = np.random.default_rng(n)
    out = []
    for k in range(n):
        a = 100 * k
        phases = {name: (a + 10 * j, a + 10 * j + 5) for j, name in
                  enumerate(("inputs", "forward", "backward", "optimizer", "eval", "unwind")) if rng.random() < 0.5}
        out.append(Iteration(k + 1, a, a + 99, None if rng.random() < 0.2 else a, a + 99, phases,
                             int(rng.integers(0, 3)), source=("phases", "forward_runs")[k % 2],
                             peak_bytes=int(rng.integers(0, 1 << 45)), peak_index=a + 3, peak_type="other"))
    return tuple(out)


@pytest.mark.parametrize("its", [ITS, many(200), ()], ids=["three", "many", "none"])
def test_columns_read_as_the_objects(its):
    col = Iterations.of(its)
    assert len(col) == len(its) and bool(col) == bool(its)
    assert tuple(col) == its                     # a loop over every row
    assert col == its and col == list(its)
    for k in range(len(its)):
        assert col[k] == its[k] and col[k - len(its)] == its[k]
        assert tuple(col[k].phases) == tuple(its[k].phases)      # the phases' order kept
    assert col[1:-1] == its[1:-1] and col[::7] == its[::7]
    assert col[::-1] == its[::-1] and col[5:190:2] == its[5:190:2] and col[150:10:-3] == its[150:10:-3]
    with pytest.raises(IndexError):
        col[len(its)]
    assert to_plain(col) == [_dataclass_plain(it, NAMES) for it in its]
    assert to_plain(col) == to_plain(list(its))
    s, e = starts_ends(col)
    assert s.tolist() == [it.start_index for it in its] and e.tolist() == [it.end_index for it in its]
    assert starts_ends(its)[0].tolist() == s.tolist()


def test_peaks_filled_in_keep_the_rest():
    col = Iterations.of(ITS)
    got = col.with_peaks(np.array([1, 2, 3]), np.array([5, 50, 150]), ["loss", "forward", "oom"])
    for old, new, b, i, t in zip(ITS, got, (1, 2, 3), (5, 50, 150), ("loss", "forward", "oom")):
        assert new == dataclasses.replace(old, peak_bytes=b, peak_index=i, peak_type=t)
    assert tuple(col) == ITS                       # the first is left as it was


def test_the_cache_arrays_come_back_checked():
    col = Iterations.of(many(50))
    arrays, names = col.to_arrays()
    names = orjson.loads(orjson.dumps(names))          # (the manifest's part is JSON)
    back = Iterations.from_arrays(arrays, names, n_entries=100 * 50)
    assert back == col and tuple(back) == tuple(col)
    with pytest.raises(ValueError):               # the last iteration ends past the trace
        Iterations.from_arrays(arrays, names, n_entries=100 * 50 - 1)
    overlapping = {**arrays, "end": arrays["end"].copy()}
    overlapping["end"][3] = arrays["start"][4]
    with pytest.raises(ValueError):
        Iterations.from_arrays(overlapping, names, n_entries=10 ** 6)
    for name, value in (("start", arrays["start"].astype(np.int32)), ("lo", arrays["lo"][:, 1:]),
                        ("source", np.full(50, 7, dtype=np.uint8)), ("micro_batches", arrays["micro_batches"][:9])):
        with pytest.raises(ValueError):
            Iterations.from_arrays({**arrays, name: value}, names, n_entries=10 ** 6)
    for bad in ({**names, "n": 49}, {**names, "source": [1, 2]}, {**names, "peak_type": []}, [], {"n": True}):
        with pytest.raises(ValueError):
            Iterations.from_arrays(arrays, bad, n_entries=10 ** 6)
    with pytest.raises(ValueError):
        Iterations.from_arrays({**arrays, "extra": arrays["start"]}, names, n_entries=10 ** 6)
    empty = Iterations.of(())
    assert len(Iterations.from_arrays(*empty.to_arrays(), n_entries=0)) == 0


def test_numbers_must_run_from_one():
    with pytest.raises(ValueError):
        Iterations.of(ITS[1:])


class _Rows:
    """A list that `write_pretty` writes a part at a time (as IterationRows does)."""

    def __init__(self, rows, size):
        self.rows, self.size = rows, size

    def __plain_parts__(self):
        yield []                                   # (an empty part writes nothing)
        for a in range(0, len(self.rows), self.size):
            yield self.rows[a:a + self.size]


@pytest.mark.parametrize("size", [1, 2, 3, 1000])
def test_rows_written_in_parts_are_the_whole_documents_bytes(size):
    """`write_pretty` gives `dumps_pretty`'s bytes, rows nested at any depth, none, several lists."""
    import io

    from vramscope.common.jsonio import dumps_pretty, write_pretty
    rows = to_plain(Iterations.of(many(7)))
    for doc in ({"a": 1, "its": rows, "b": [1, {"c": rows[:2]}]},
                {"devices": [{"device": 0, "iterations": rows}, {"device": 1, "iterations": []}], "x": "\ud800"},
                rows, {"its": rows[:1]}):
        def marked(o):
            if isinstance(o, list) and o and o[0] is rows[0] and isinstance(o[0], dict) and "number" in o[0]:
                return _Rows(o, size)
            if isinstance(o, dict):
                return {k: marked(v) for k, v in o.items()}
            if isinstance(o, list):
                return [marked(v) for v in o]
            return o
        out = io.BytesIO()
        write_pretty(marked(doc), out)
        assert out.getvalue() == dumps_pretty(doc)
    out = io.BytesIO()
    write_pretty({"its": _Rows([], size)}, out)
    assert out.getvalue() == dumps_pretty({"its": []})


@pytest.mark.parametrize("name", ["cuda_full.pickle", "protocol2.pickle", "clean_loop.pickle", "oom_step3.pickle",
                                  "forward_only_loop.pickle"])
def test_ranges_marked_at_once_are_those_marked_one_by_one(name, monkeypatch):
    """Where a run has many iterations (more than MANY_RANGES) their ids and the batches'
    input runs are marked at once: the same phases and ids the loop over them gives."""
    from helpers import DATA
    from vramscope.classifiers import analyze
    from vramscope.classifiers import timeline as tl_module
    from vramscope.parsers import open_snapshot

    def run():
        an = analyze(open_snapshot(str(DATA / name), use_cache=False), use_cache=False)
        return {d: (da.timeline.phase.copy(), da.timeline.iteration_ids(), to_plain(da.iterations))
                for d, da in an.devices.items()}
    one_by_one = run()
    monkeypatch.setattr(tl_module, "MANY_RANGES", 0)
    at_once = run()
    assert any(len(its) > 1 for _, _, its in one_by_one.values())
    for d, (phase, ids, its) in one_by_one.items():
        assert np.array_equal(at_once[d][0], phase) and np.array_equal(at_once[d][1], ids)
        assert at_once[d][2] == its
        assert (phase == tl_module.P_INPUTS).any()          # (input runs to mark, in each of them)
