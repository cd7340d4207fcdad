"""Keys the fast path does not know (a field a newer torch adds to some entries) on the fast path:
a value that is an int, a float, True, False, None or a memo reference is read in the entry's
batch and kept with the entry's rare fields exactly as the interpreter keeps it; any other value
(a list pickled inline) sends that entry to the interpreter. Before, every entry with such a key
went to the interpreter and the fast path backed off around it: a fixture with one every 17
entries, tiled to 10^6, parsed in 30 s (35x pickle.load)."""
from __future__ import annotations

import sys

from helpers import DATA
from test_fastpath_lists import read_fast as _read
from test_fastpath_lists import read_helped
from test_prefetch import with_helper  # noqa: F401  (a fixture)
from vramscope.parsers.cache import read_snapshot

sys.path.insert(0, str(DATA))
import fuzzing  # noqa: E402


def _entries(n: int, every: int = 17, inline_list: bool = False) -> list[dict]:
    frames = [{"name": f"f{i}", "filename": f"/srv/m{i % 7}.py", "line": i} for i in range(100)]
    lists = [[frames[(5 * j + i) % 100] for i in range(1 + j % 6)] for j in range(30)]
    shared_note = "group:7"
    payloads = [7, -3, 1 << 40, 2.5, float("inf"), True, False, None, shared_note, lists[3]]
    out = []
    for k in range(n):
        e = {"action": ("alloc", "free_requested", "free_completed")[k % 3],
             "addr": 0x7F0000000000 + 512 * (k // 3), "size": 512 * (1 + k % 5), "stream": 0,
             "time_us": 1_700_000_000_000_000 + k, "frames": lists[(k // 3) % 30]}
        if k % every == every - 1:
            e["future_payload"] = payloads[(k // every) % len(payloads)]
            e["future_flag"] = bool(k % 2)
            if inline_list:
                e["future_list"] = [k, k + 1]
        out.append(e)
    return out


def _same(fast, slow):
    assert fuzzing.snapshot_signature(fast) == fuzzing.snapshot_signature(slow)
    assert fast.trace(0).extras == slow.trace(0).extras


def test_unknown_keys_read_as_the_interpreter_reads_them_and_on_the_fast_path(tmp_path):
    entries = _entries(9000)
    path, fast, decoded = _read(tmp_path, entries)
    slow = read_snapshot(str(path), fast=False)
    _same(fast, slow)
    extras = fast.trace(0).extras
    assert len(extras) == 9000 // 17
    vals = [e["future_payload"] for e in extras.values()]
    assert {7, -3, 1 << 40, 2.5, True, False, "group:7"} <= set(x for x in vals if not isinstance(x, (dict, list)))
    assert vals[4] is None and vals[7] is None            # inf is no JSON number; None is None
    # the interpreter builds the entries that pickle a frames list or a payload first, and
    # those whose payload names an object of their own batch; the rest are the fast path's
    assert sum(decoded) > 8500, sum(decoded)
    assert len(decoded) < 100, len(decoded)


def test_an_unknown_value_of_another_form_goes_to_the_interpreter(tmp_path):
    entries = _entries(6000, every=50, inline_list=True)
    path, fast, decoded = _read(tmp_path, entries)
    slow = read_snapshot(str(path), fast=False)
    _same(fast, slow)
    assert [e["future_list"] for e in fast.trace(0).extras.values()] == [[k, k + 1] for k in range(49, 6000, 50)]
    assert sum(decoded) > 5000, sum(decoded)


def test_unknown_keys_with_a_helper(tmp_path, with_helper, monkeypatch):
    helped, alone = read_helped(tmp_path, _entries(60_000, every=97), monkeypatch)
    assert with_helper and with_helper[0] > 10_000, with_helper
    _same(helped, alone)
    assert len(helped.trace(0).extras) == 60_000 // 97


def test_ever_new_keys_read_as_the_interpreter_reads_them(tmp_path):
    # a key of its own on every entry: the fast path stops learning them (at most 8 in a
    # shape, 16 looked for in the memo) and the entries read as the interpreter reads them
    entries = _entries(12_000, every=10**9)
    for k, e in enumerate(entries):
        e[f"k{k}"] = k
    path, fast, decoded = _read(tmp_path, entries)
    slow = read_snapshot(str(path), fast=False)
    _same(fast, slow)
    assert len(fast.trace(0).extras) == 12_000
