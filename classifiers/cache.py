"""The analysis of a snapshot, kept beside its cached columns, so that a reopen skips it.

`analyze` is deterministic in (the snapshot, our code, the rules), so its results are
stored as artifacts of the snapshot's column-cache entry (parsers/cache.py) under a key
that changes with any of those: the entry itself is keyed by the file's identity, and
`analysis_fingerprint` by our version, the source of the classifiers and parsers, and
the rules in effect (the shipped files and the user's file, or the content of a RuleSet
passed in). In the entry:

  art-an-<fp>-d<dev>-<array>.npy  one per large array (live bytes per entry, the phase of
                                   every entry and where its runs start, every column of
                                   the allocation rows and their category, rule, chain and
                                   phase): memory-mapped read-only on reopen, so a reopen
                                   reads only the pages it uses, and they are file pages
                                   that the OS can drop under pressure (DESIGN.md §7)
  art-an-<fp>.json                 the manifest, written last: each array's dtype and
                                   length, and the small results (live-memory scalars,
                                   iterations, peak, leaks, OOMs) as JSON

A save keeps the analysis under one other key besides its own (the command line with
--rules and the viewer may take turns on one file) and drops older ones.

Every file is written to a temporary name and renamed into place, and a manifest only
names arrays already written, so a reader sees a complete analysis or none. Anything
that does not match on reading (format, fingerprint, rule names, devices, lengths,
dtypes, value ranges, unreadable or truncated files, bad JSON) makes `load` return None,
and the caller analyses afresh and stores again; a cache that cannot be written costs
nothing but the time. No Qt here.
"""
from __future__ import annotations

import dataclasses
import os
import re
import weakref
import zlib
from pathlib import Path

import numpy as np
import orjson

from ..common.later import Later, in_order
from ..parsers import Allocations, LiveModel
from ..parsers.cache import (
    artifact_names,
    map_artifact_array,
    prune_artifacts,
    read_artifact,
    write_artifact,
    write_artifact_array,
)
from .categories import CATEGORIES
from .evidence import EVIDENCE
from .iterations import Iterations
from .results import Leak, Oom, Peak, RunFacts, StaleGradients, from_plain, to_plain
from .rules import user_rules_path
from .timeline import PHASE_NAMES, Timeline

FORMAT = 8                # 2: typed results (results.py), iterations numbered from 1; 4: evidence; 5: components;
                          # 6: the timeline's runs as their first entries, not an id per entry;
                          # 7: iterations' source "forward_runs" (runs without backward or optimizer);
                          # 8: iterations as arrays (iterations.Iterations.to_arrays)
PREFIX = "an-"
KEEP = 2                  # analyses kept per snapshot (under different keys)

# array -> (where it lives, expected length: "n" trace entries, "rows" allocation rows, None any)
_ARRAYS = {
    "live_after": ("live", "live_after", "n"),
    "reserved_change_index": ("live", "reserved_change_index", None),
    "reserved_change_value": ("live", "reserved_change_value", None),
    "alloc_index": ("allocs", "alloc_index", "rows"),
    "free_index": ("allocs", "free_index", "rows"),
    "addr": ("allocs", "addr", "rows"),
    "size": ("allocs", "size", "rows"),
    "stack": ("allocs", "stack", "rows"),
    "category": ("da", "category", "rows"),
    "rule": ("da", "rule", "rows"),
    "evidence": ("da", "evidence", "rows"),
    "rules_category": ("da", "rules_category", "rows"),
    "chain_root": ("da", "chain_root", "rows"),
    "chain_last": ("da", "chain_last", "rows"),
    "row_phase": ("da", "row_phase", "rows"),
    "torch_category": ("da", "torch_category", "rows"),
    "torch_component": ("da", "torch_component", "rows"),
    "oom_indices": ("da", "oom_indices", None),
    "phase": ("timeline", "phase", "n"),
    "seg_start": ("timeline", "seg_start", None),
}
_ITERATION_ARRAY = "it-"     # an-<fp>-d<dev>-it-<column>.npy: the iterations' columns (iterations.py)
_LIVE_SCALARS = ("start_bytes", "end_bytes", "peak_bytes", "peak_index", "reserved_start", "reserved_end",
                 "reserved_peak")


# -- the key -----------------------------------------------------------------------------
def _code_files() -> list[Path]:
    """The sources an analysis depends on: classifiers (with the shipped rules), parsers
    (live memory and allocation rows are computed there) and the common layer (units)."""
    from .. import classifiers, common, parsers
    files = []
    for pkg in (classifiers, parsers, common):
        for folder in sorted({str(Path(p).resolve()) for p in pkg.__path__}):
            files += sorted(f for f in Path(folder).glob("*") if f.suffix in (".py", ".toml", ".json"))
    return files


def _canonical(x):
    """A plain, complete, ordered description of a RuleSet's content (TypeError if it holds
    anything we cannot describe faithfully)."""
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    if isinstance(x, re.Pattern):
        return ("re", x.pattern, x.flags)
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return (type(x).__name__, tuple((f.name, _canonical(getattr(x, f.name))) for f in dataclasses.fields(x)))
    if isinstance(x, (list, tuple)):
        return tuple(_canonical(v) for v in x)
    if isinstance(x, dict):
        return ("dict", tuple(sorted(((repr(_canonical(k)), _canonical(v)) for k, v in x.items()),
                                     key=lambda kv: kv[0])))
    raise TypeError(f"cannot fingerprint a {type(x).__name__}")


def analysis_fingerprint(rules_path=None, rules=None) -> str | None:
    """What an analysis depends on besides the snapshot: our version, the code of the
    classifiers and parsers, and the rules: the files in effect for `load_rules(rules_path)`
    (shipped and the user's), or, when a RuleSet `rules` is given, its content. None when
    a RuleSet holds something that cannot be fingerprinted (then nothing is cached)."""
    from .. import __version__
    parts = [b"vramscope-analysis", __version__.encode()]
    for f in _code_files():
        try:
            parts += [f.name.encode(), f.read_bytes()]
        except OSError:
            parts += [f.name.encode(), b"\0unreadable"]
    if rules is not None:
        try:
            parts += [b"ruleset", repr(_canonical(rules)).encode()]
        except (TypeError, RecursionError):
            return None
    else:
        user = user_rules_path(rules_path)
        if user is not None and user.is_file():
            try:
                parts += [str(user).encode(), user.read_bytes()]
            except OSError:
                parts += [str(user).encode(), b"\0unreadable"]
    blob = b"\0".join(parts)
    return f"{zlib.crc32(blob):08x}{zlib.adler32(blob):08x}{len(blob):x}"


def _manifest_name(fp: str) -> str:
    return f"{PREFIX}{fp}.json"


def _array_name(fp: str, dev: int, name: str) -> str:
    return f"{PREFIX}{fp}-d{dev}-{name}.npy"


# -- writing -----------------------------------------------------------------------------
def _source(da, where):
    return {"live": da.live, "allocs": da.allocs, "da": da, "timeline": da.timeline}[where]


_SAVING: list = []           # Later jobs of `save_later` not yet waited for
_EARLY: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()   # DeviceAnalysis -> Later of its arrays


def arrays_job(snap, fp: str | None, dev: int, da) -> Later | None:
    """The writing of the device's arrays as a job for a thread of the caller's choosing
    (common.later: after another job there), to run while the analysis goes on, once its rows
    are classified: after that no stage changes an array `save` writes. `save` waits for it,
    then writes the rest (the manifest, last), naming them: on a big run most of what a save
    writes is no longer written after the analysis, where a `summary` waited for it before it
    could exit. None where nothing is cached."""
    if not snap.cache_entry or fp is None:
        return None
    job: Later = Later(lambda: (fp, _write_arrays(snap, fp, dev, da)))
    _EARLY[da] = job
    return job


def save_later(snap, fp: str, devices: dict, rule_names: list) -> None:
    """`save` on a thread (one the interpreter waits for before it exits): the caller goes on
    with what it shows (the summary document, the viewer's model) while the arrays are written.
    `load` and the next save wait for it first. Nothing it reads changes once the analysis is
    returned."""
    wait_saved()
    job: Later = Later(lambda: save(snap, fp, devices, rule_names))
    _SAVING.append(job)
    in_order([job], name="vramscope-analysis-cache", daemon=False)


def wait_saved() -> None:
    """Wait for the saves `save_later` started (one that failed stored nothing: the next
    analysis runs again, as after any failed save)."""
    while _SAVING:
        job = _SAVING.pop(0)
        try:
            job.get()
        except Exception:      # an unexpected error writing the cache: it is only a cache
            pass


def _write_arrays(snap, fp: str, dev: int, da) -> dict | None:
    """Write the device's arrays; {name: [dtype, length]} of those written, None on failure."""
    arrays = {}
    for name, (where, attr, _) in _ARRAYS.items():
        src = _source(da, where)
        arr = getattr(src, attr, None) if src is not None else None
        if arr is None:
            continue
        arr = np.asarray(arr)
        if arr.size and not write_artifact_array(snap, _array_name(fp, dev, name), arr):
            return None
        arrays[name] = [arr.dtype.str, int(arr.shape[0]) if arr.ndim else -1]
    return arrays


def _arrays_of(snap, fp: str, dev: int, da) -> dict | None:
    """The device's arrays written for this save: by `arrays_job` where it ran (waited
    for), else now."""
    early = _EARLY.pop(da, None)
    if early is not None:
        try:
            got_fp, arrays = early.get()
            if got_fp == fp and arrays is not None:
                return arrays
        except Exception:      # (written again below: it is only a cache)
            pass
    return _write_arrays(snap, fp, dev, da)


def save(snap, fp: str, devices: dict, rule_names: list) -> bool:
    """Store the analysis of every device (arrays first, the manifest last). False when
    nothing was stored (no cache entry, unwritable, or results JSON cannot hold exactly)."""
    if not snap.cache_entry or fp is None:
        return False
    devices_json: dict[str, dict] = {}
    manifest = {"format": FORMAT, "fingerprint": fp, "rule_names": list(rule_names), "devices": devices_json}
    try:
        for dev, da in devices.items():
            n = len(snap.trace(dev))
            arrays = _arrays_of(snap, fp, dev, da)
            if arrays is None:
                return False
            tl = da.timeline
            devices_json[str(dev)] = {
                "n": n, "rows": len(da.allocs), "arrays": arrays,
                "live": {k: getattr(da.live, k) for k in _LIVE_SCALARS},
                "timeline": None if tl is None else {"first_start": int(tl.first_start),
                                                     "frees_carry_alloc_frames": bool(tl.frees_carry_alloc_frames)},
                "iterations": _write_iterations(snap, fp, dev, da.iterations), "peak": to_plain(da.peak), "leaks": to_plain(da.leaks),
                "ooms": to_plain(da.ooms), "stale_gradients": to_plain(da.stale_gradients),
                "run": to_plain(da.run),
            }
        blob = orjson.dumps(manifest)         # TypeError on anything JSON would not give back
    except (TypeError, ValueError, OSError, orjson.JSONEncodeError):
        return False
    if not write_artifact(snap, _manifest_name(fp), blob):
        return False
    _prune(snap, fp)
    return True


def _write_iterations(snap, fp: str, dev: int, iterations) -> dict:
    """Write the device's iterations as arrays (a run of short steps has a million); the
    manifest's part: their names and what each array is (OSError when one is not written)."""
    arrays, names = Iterations.of(iterations).to_arrays()
    for name, arr in arrays.items():
        if not write_artifact_array(snap, _array_name(fp, dev, _ITERATION_ARRAY + name), arr):
            raise OSError("iterations not written")
    return {"names": names, "arrays": sorted(arrays)}


def load_iterations(snap, fp: str, dev: int) -> Iterations | None:
    """The iterations of device `dev` in the analysis cached under `fp`, or None (absent,
    stale or damaged): the cached summary document reads them from there."""
    if not snap.cache_entry or fp is None:
        return None
    wait_saved()
    raw = read_artifact(snap, _manifest_name(fp))
    try:
        man = orjson.loads(raw) if raw else None
        if not (isinstance(man, dict) and man.get("format") == FORMAT and man.get("fingerprint") == fp):
            return None
        info = man["devices"][str(dev)]
        return _read_iterations(snap, fp, dev, info["iterations"], info["n"])
    except (_Mismatch, ValueError, TypeError, KeyError, IndexError, AttributeError, OSError,
            OverflowError, orjson.JSONDecodeError):
        return None


def _read_iterations(snap, fp: str, dev: int, part, n: int) -> Iterations:
    """`_write_iterations`' arrays, mapped and checked (ValueError or _Mismatch: damaged)."""
    _check(isinstance(part, dict) and isinstance(part.get("arrays"), list) and type(n) is int, "iterations")
    arrays: dict[str, np.ndarray] = {}
    for name in part["arrays"]:
        _check(isinstance(name, str) and name.isidentifier(), "iteration array name")
        a = map_artifact_array(snap, _array_name(fp, dev, _ITERATION_ARRAY + name))
        if a is None:
            raise _Mismatch(f"iteration array {name}")
        arrays[name] = a
    return Iterations.from_arrays(arrays, part.get("names"), n)


def _prune(snap, fp: str) -> None:
    """Keep this analysis and the most recent one under another key (other rules: the
    command line with --rules and the viewer take turns); older code's go."""
    keep = {fp}
    others = []
    for n in artifact_names(snap):
        if n.startswith(PREFIX) and n.endswith(".json") and "-d" not in n[len(PREFIX):]:
            other = n[len(PREFIX):-len(".json")]
            if other != fp:
                try:
                    others.append((os.path.getmtime(os.path.join(snap.cache_entry, "art-" + n)), other))
                except OSError:
                    pass
    keep.update(o for _, o in sorted(others, reverse=True)[:KEEP - 1])
    prune_artifacts(snap, lambda n: n.startswith(PREFIX) and _key_of(n) not in keep)


def _key_of(name: str) -> str:
    """The fingerprint in an artifact name (an-<fp>.json or an-<fp>-d<dev>-<array>.npy)."""
    rest = name[len(PREFIX):]
    return rest.split("-", 1)[0].removesuffix(".json")


# -- reading -----------------------------------------------------------------------------
class _Mismatch(Exception):
    pass


def _check(cond, what):
    if not cond:
        raise _Mismatch(what)


def _int_or_none(v):
    _check(v is None or (isinstance(v, int) and not isinstance(v, bool)), "scalar")
    return v


def load(snap, fp: str, rule_names: list) -> dict | None:
    """{device: DeviceAnalysis} from the cache, or None (absent, stale or damaged)."""
    if not snap.cache_entry or fp is None:
        return None
    wait_saved()
    raw = read_artifact(snap, _manifest_name(fp))
    if not raw:
        return None
    try:
        return _load(snap, fp, rule_names, orjson.loads(raw))
    except (_Mismatch, ValueError, TypeError, KeyError, IndexError, AttributeError, OSError,
            OverflowError, orjson.JSONDecodeError):
        return None


def _load(snap, fp, rule_names, man) -> dict:
    from .analysis import DeviceAnalysis
    _check(isinstance(man, dict) and man.get("format") == FORMAT and man.get("fingerprint") == fp, "format")
    _check(man.get("rule_names") == list(rule_names), "rule names")
    devs = man["devices"]
    _check(isinstance(devs, dict) and sorted(int(d) for d in devs) == list(snap.devices), "devices")
    out = {}
    for dev in snap.devices:
        info = devs[str(dev)]
        t = snap.trace(dev)
        n = len(t)
        rows = info["rows"]
        _check(info["n"] == n and isinstance(rows, int) and rows >= 0, "lengths")
        want = {"n": n, "rows": rows}
        arrs: dict[str, np.ndarray] = {}
        for name, (dt, length) in info["arrays"].items():
            _check(name in _ARRAYS, "array name")
            expect = _ARRAYS[name][2]
            _check(expect is None or length == want[expect], f"{name} length")
            a = map_artifact_array(snap, _array_name(fp, dev, name)) if length else np.zeros(0, dtype=dt)
            if a is None or a.dtype != np.dtype(dt) or a.shape != (length,):
                raise _Mismatch(f"{name} shape")
            arrs[name] = a
        for name, (_, _, expect) in _ARRAYS.items():
            _check(name in arrs or name in ("torch_category", "rules_category", "torch_component"), f"{name} missing")
        # cheap range checks on the small columns (a damaged file is recomputed, not trusted)
        _check(_below(arrs["category"], len(CATEGORIES)) and _below(arrs["rule"], len(rule_names))
               and _below(arrs["evidence"], len(EVIDENCE))
               and _below(arrs.get("rules_category", arrs["category"]), len(CATEGORIES))
               and _below(arrs["row_phase"], len(PHASE_NAMES)) and _below(arrs["phase"], len(PHASE_NAMES)),
               "codes")
        _check(_within(arrs["alloc_index"], -1, n) and _within(arrs["free_index"], -1, n)
               and _within(arrs["chain_root"], 0, rows) and _within(arrs["chain_last"], 0, rows)
               and _within(arrs["oom_indices"], 0, n), "indices")
        lv = {k: _int_or_none(info["live"][k]) for k in _LIVE_SCALARS}
        live = LiveModel(dev, n, lv["start_bytes"], lv["end_bytes"], arrs["live_after"], lv["peak_bytes"],
                         lv["peak_index"], lv["reserved_start"], lv["reserved_end"], lv["reserved_peak"],
                         arrs["reserved_change_index"], arrs["reserved_change_value"])
        _check(-1 <= live.peak_index < n, "peak index")
        allocs = Allocations(dev, arrs["alloc_index"], arrs["free_index"], arrs["addr"], arrs["size"],
                             arrs["stack"], snap.trace(dev).columns.get("time_us"))
        iterations = _read_iterations(snap, fp, dev, info["iterations"], n)     # (ValueError: damaged)
        ss = arrs["seg_start"]
        _check((len(ss) == 0) == (n == 0) and (not len(ss) or (int(ss[0]) == 0 and _within(ss, 0, n)))
               and bool(np.all(ss[1:] > ss[:-1])), "runs")
        tli = info["timeline"]
        tl = Timeline(arrs["phase"], ss, iterations,
                      first_start=int(tli["first_start"]),
                      frees_carry_alloc_frames=bool(tli["frees_carry_alloc_frames"]))
        peak = from_plain(Peak, info["peak"])
        _check(-1 <= peak.index < n, "peak")
        ooms = from_plain(tuple[Oom, ...], info["ooms"])
        _check(all(0 <= o.index < n for o in ooms), "ooms")
        da = DeviceAnalysis(dev, live, allocs, arrs["category"], arrs["rule"], timeline=tl,
                            chain_root=arrs["chain_root"], chain_last=arrs["chain_last"],
                            row_phase=arrs["row_phase"], trace_action=np.asarray(t.columns["action"]),
                            trace_stack=np.asarray(t.columns["stack"]), oom_indices=arrs["oom_indices"],
                            evidence=arrs["evidence"], rules_category=arrs.get("rules_category"),
                            torch_category=arrs.get("torch_category"), torch_component=arrs.get("torch_component"),
                            iterations=iterations, peak=peak,
                            leaks=from_plain(tuple[Leak, ...], info["leaks"]), ooms=ooms,
                            stale_gradients=from_plain(StaleGradients | None, info["stale_gradients"]),
                            run=from_plain(RunFacts, info["run"]))
        out[dev] = da
    return out


def _below(a, limit) -> bool:
    return _within(a, 0, limit)


def _within(a, lo, hi) -> bool:
    return not len(a) or (int(a.min()) >= lo and int(a.max()) < hi)


__all__ = ["analysis_fingerprint", "load", "save", "FORMAT"]
