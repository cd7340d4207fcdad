#!/usr/bin/env python3
"""Benchmark: opening a snapshot with vramscope versus ``pickle.load``.

    python benchmarks/bench_parse.py [--events 1e4,1e5,1e6] [--repeat 1] [--extra "CMD {file}"]

For each size N it generates (or reuses) ``benchmarks/out/snap_<N>.pickle``
with ``gen_snapshot.py`` and runs, each in its own fresh process:

  a  pickle.load     ``python -c "pickle.load(f)"`` (imports nothing heavy)
  g  the same with ``gc.disable()`` (a stricter reference: the cyclic GC is
     most of pickle.load's time on big snapshots; ratios use a, not g)
  b  cold summary    ``python -m vramscope summary FILE --json`` with
                     VRAMSCOPE_CACHE_DIR set to a new empty directory
  c  warm reopen     the same command again with the same cache directory
  r  open_snapshot   in a child, the time of ``open_snapshot(FILE)`` alone on the
                     cache that (b) left (interpreter start and imports excluded,
                     like ``work_s`` of a): what a reopen costs the parser itself,
                     checks of the file's identity and of every cache file's
                     checksum included; judged against pickle.load's ``work_s``
  d  --extra CMD     any other command, measured the same way

Each process is waited for with ``os.wait4``, which returns that child's own
resource usage, so peak RSS (``ru_maxrss``) is exact per process; wall time is
the whole process (interpreter start and imports included).  For (a) the child
also reports the time of ``pickle.load`` alone (``work_s``).  The file is read
once before the measurements so that all of them find it in the page cache.

Ratios b/a and c/a (wall time and peak RSS) are printed per size and written,
with every raw run, to ``benchmarks/out/results.json``.  Targets (see
README.md): at 10^6 events, cold summary <= 2x the time and <= 0.25x the peak
RSS of pickle.load; warm reopen <= 0.1x.
"""

from __future__ import annotations

import argparse
import compileall
import hashlib
import json
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DEFAULT_OUT = os.path.join(HERE, "out")

# Imports only pickle, sys and time before the load: anything more (even
# `import json`) leaves more objects for the cyclic GC to walk during the load
# and makes pickle.load measurably slower (about +40% at 10^5 events).
PICKLE_CHILD = r"""
import pickle, sys, time
if len(sys.argv) > 2 and sys.argv[2] == "nogc":
    import gc
    gc.disable()
t0 = time.perf_counter()
with open(sys.argv[1], "rb") as f:
    obj = pickle.load(f)
work = time.perf_counter() - t0
import os, resource
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
n = sum(len(t) for t in obj["device_traces"]) if isinstance(obj, dict) else len(obj)
sys.stdout.write('{"work_s": %r, "self_maxrss": %d, "entries": %d}\n' % (work, rss, n))
sys.stdout.flush()
os._exit(0)   # skip tearing the object graph down: the process wall is start-up + load
"""

TARGETS = {  # ratio limits at 10^6 events (the acceptance targets)
    "b_time": 2.0,    # cold summary: <= 2x the time of pickle.load
    "b_rss": 0.25,    # ... and <= 0.25x its peak RSS
    "c_time": 0.1,    # cached reopen: <= 0.1x (its RSS ratio is reported, not judged)
    "r_load": 0.05,   # open_snapshot on a cached entry: <= 0.05x pickle.load's own time
}

# open_snapshot alone on a warm cache (VRAMSCOPE_CACHE_DIR from the environment)
REOPEN_CHILD = r"""
import sys, time
from vramscope.parsers import open_snapshot
t0 = time.perf_counter()
snap = open_snapshot(sys.argv[1])
work = time.perf_counter() - t0
sys.stdout.write('{"work_s": %r, "from_cache": %s}\n' % (work, "true" if snap.from_cache else "false"))
"""


def _rss_mb(ru_maxrss: int) -> float:
    # Linux reports KiB, macOS bytes
    return ru_maxrss / (1024 * 1024) if sys.platform == "darwin" else ru_maxrss / 1024


def run_measured(argv, env=None, timeout=None, cwd=ROOT):
    """Runs argv in a new process; returns wall time, peak RSS of that process
    (its waited-for children included), exit status and output."""
    out_f = tempfile.TemporaryFile()
    err_f = tempfile.TemporaryFile()
    t0 = time.perf_counter()
    try:
        p = subprocess.Popen(argv, stdout=out_f, stderr=err_f, env=env, cwd=cwd)
    except OSError as e:
        return {"ok": False, "rc": None, "wall_s": 0.0, "rss_mb": None, "error": str(e),
                "stdout": "", "stderr": ""}
    killed = []
    timer = None
    if timeout:
        def _kill():
            killed.append(True)
            p.kill()
        timer = threading.Timer(timeout, _kill)
        timer.daemon = True
        timer.start()
    _, status, ru = os.wait4(p.pid, 0)     # this child's own rusage
    if timer is not None:
        timer.cancel()
    timed_out = bool(killed)
    wall = time.perf_counter() - t0
    p.returncode = os.waitstatus_to_exitcode(status)   # keep Popen from waiting again
    out_f.seek(0)
    err_f.seek(0)
    stdout = out_f.read().decode("utf-8", "replace")
    stderr = err_f.read().decode("utf-8", "replace")
    rc = p.returncode
    res = {"ok": rc == 0 and not timed_out, "rc": rc, "wall_s": wall, "rss_mb": _rss_mb(ru.ru_maxrss),
           "user_s": ru.ru_utime, "sys_s": ru.ru_stime, "stdout": stdout, "stderr": stderr}
    if timed_out:
        res["error"] = f"timed out after {timeout:.0f} s"
    elif rc != 0:
        lines = [ln for ln in stderr.strip().splitlines() if ln.strip()]
        res["error"] = f"exit {rc}: " + (lines[-1][:300] if lines else "(no stderr)")
    return res


def generator_version() -> str:
    """Hash of the generator's sources: a snapshot is reused only if it was
    written by the same generator with the same seed."""
    h = hashlib.sha256()
    for name in ("gen_snapshot.py", "_pickle4.py"):
        with open(os.path.join(HERE, name), "rb") as f:
            h.update(f.read())
    return h.hexdigest()[:16]


def ensure_snapshot(n: int, out_dir: str, seed: int, regen: bool, timeout):
    path = os.path.join(out_dir, f"snap_{n}.pickle")
    meta_path = path + ".meta.json"
    want = {"events": n, "seed": seed, "generator": generator_version()}
    info = {"file": os.path.relpath(path, ROOT), "generated": False}
    try:
        with open(meta_path) as f:
            meta = json.load(f)
        fresh = all(meta.get(k) == v for k, v in want.items()) and meta.get("bytes") == os.path.getsize(path)
    except (OSError, ValueError):
        fresh = False
    if regen or not fresh:
        r = run_measured([sys.executable, os.path.join(HERE, "gen_snapshot.py"), "--events", str(n),
                          "-o", path, "--seed", str(seed), "-q"], timeout=timeout)
        if not r["ok"]:
            raise SystemExit(f"generating {path} failed: {r.get('error')}\n{r['stderr'][-2000:]}")
        meta = dict(want, bytes=os.path.getsize(path), gen_wall_s=round(r["wall_s"], 3),
                    gen_rss_mb=round(r["rss_mb"], 1))
        with open(meta_path, "w") as f:
            json.dump(meta, f)
        info["generated"] = True
    info.update(gen_wall_s=meta.get("gen_wall_s"), gen_rss_mb=meta.get("gen_rss_mb"))
    info["bytes"] = os.path.getsize(path)
    return path, info


def warm_page_cache(path: str):
    with open(path, "rb") as f:
        while f.read(1 << 24):
            pass


PACKAGES = ("vramscope", "parsers", "classifiers", "viewer")


def compile_tree(root: str) -> None:
    """Every module of the checkout at `root` compiled (.pyc), as pip leaves an installed copy and
    any first run leaves the modules it imports: `vramscope --help` alone left the analysis'
    and the viewer's modules (imported when used) to be compiled on every measured run where
    PYTHONDONTWRITEBYTECODE is set (0.3-1.9 s of a 10^7 open on this VM)."""
    for pkg in PACKAGES:
        if os.path.isdir(os.path.join(root, pkg)):
            compileall.compile_dir(os.path.join(root, pkg), quiet=1)


def checkouts_cli(description: str, argv=None):
    """The command line of the benchmarks that measure this checkout beside others (`bench_e2e`,
    `bench_warm_parse`): (args, the file's absolute path, the checkouts, this one last, each
    compiled, and the verbs [(name, vramscope argv)], "SHOT" standing for the picture's path)."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("file")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--viewer", action="store_true", help="also `vramscope view FILE --screenshot`")
    ap.add_argument("--before", nargs="*", default=[], metavar="DIR", help="other checkouts, measured beside this one")
    args = ap.parse_args(argv)
    path = os.path.abspath(args.file)
    trees = [os.path.abspath(d) for d in args.before] + [ROOT]
    for t in trees:                        # .pyc written, as after any first run of an installed copy
        compile_tree(t)
    verbs = [("summary", ["summary", path, "--json"])]
    if args.viewer:
        verbs.append(("viewer", ["view", path, "--screenshot", "SHOT"]))
    return args, path, trees, verbs


def run_verb(tree: str, verb: str, cmd: list, cache: str) -> tuple[float, float, float]:
    """`vramscope CMD` of checkout `tree` with cache folder `cache` (offscreen; "SHOT" a picture
    in it): (wall s, highest RSS MB, CPU s: user + system, helpers included). A failure ends
    the benchmark."""
    env = dict(os.environ, VRAMSCOPE_CACHE_DIR=cache, QT_QPA_PLATFORM="offscreen")
    if tree != ROOT:
        env["PYTHONPATH"] = tree
    cmd = [c.replace("SHOT", os.path.join(cache, "shot.png")) for c in cmd]
    y = run_measured([sys.executable, "-m", "vramscope", *cmd], env=env, cwd=tree)
    if y["rc"] != 0:
        raise SystemExit(f"{tree}: {verb} failed: {y['stderr'][-300:]}")
    return y["wall_s"], y["rss_mb"], y["user_s"] + y["sys_s"]


def warm_up(cli_argv):
    """Untimed runs so that the first measured process does not pay for cold
    interpreter/library files or for compiling vramscope's .pyc files."""
    run_measured([sys.executable, "-c", "import pickle, json, resource"], timeout=120)
    compile_tree(ROOT)
    tmp = tempfile.mkdtemp(prefix="vramscope-bench-cache-")
    try:
        run_measured(cli_argv + ["--help"], env=dict(os.environ, VRAMSCOPE_CACHE_DIR=tmp), timeout=300)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def measure_size(n, path, args, cli_argv, extras):
    env_base = dict(os.environ)
    runs = {"a": [], "g": [], "b": [], "c": [], "r": []}
    for k in range(len(extras)):
        runs[f"d{k + 1}"] = []
    warm_page_cache(path)
    for _ in range(args.repeat):
        if "a" in args.only:
            r = run_measured([sys.executable, "-c", PICKLE_CHILD, path], env=env_base, timeout=args.timeout)
            if r["ok"]:
                try:
                    child = json.loads(r["stdout"].strip().splitlines()[-1])
                    r["work_s"] = child["work_s"]
                    r["entries"] = child["entries"]
                except (ValueError, IndexError, KeyError) as e:
                    r["ok"], r["error"] = False, f"bad child output: {e}"
            runs["a"].append(r)
        if "g" in args.only:
            r = run_measured([sys.executable, "-c", PICKLE_CHILD, path, "nogc"], env=env_base, timeout=args.timeout)
            if r["ok"]:
                try:
                    child = json.loads(r["stdout"].strip().splitlines()[-1])
                    r["work_s"] = child["work_s"]
                except (ValueError, IndexError, KeyError) as e:
                    r["ok"], r["error"] = False, f"bad child output: {e}"
            runs["g"].append(r)
        if "b" in args.only or "c" in args.only or "r" in args.only:
            cache = tempfile.mkdtemp(prefix="vramscope-bench-cache-")
            try:
                env = dict(env_base, VRAMSCOPE_CACHE_DIR=cache)
                argv = cli_argv + ["summary", path, "--json"]
                for key in ("b", "c"):
                    if key == "c" and "c" not in args.only:
                        break
                    r = run_measured(argv, env=env, timeout=args.timeout)
                    if r["ok"]:
                        try:
                            summary = json.loads(r["stdout"])
                            r["json_ok"] = isinstance(summary, dict) and "devices" in summary
                        except ValueError as e:
                            r["ok"], r["error"] = False, f"stdout is not JSON: {e}"
                    r["cache_mb"] = round(_du(cache) / 1e6, 2)
                    if key in args.only:
                        runs[key].append(r)
                if "r" in args.only:
                    r = run_measured([sys.executable, "-c", REOPEN_CHILD, path], env=env, timeout=args.timeout)
                    if r["ok"]:
                        try:
                            child = json.loads(r["stdout"].strip().splitlines()[-1])
                            r["work_s"] = child["work_s"]
                            if not child["from_cache"]:
                                r["ok"], r["error"] = False, "not served from the cache"
                        except (ValueError, IndexError, KeyError) as e:
                            r["ok"], r["error"] = False, f"bad child output: {e}"
                    runs["r"].append(r)
            finally:
                shutil.rmtree(cache, ignore_errors=True)
        for k, cmd in enumerate(extras):
            cache = tempfile.mkdtemp(prefix="vramscope-bench-cache-")
            try:
                argv = [a.replace("{file}", path).replace("{python}", sys.executable).replace("{cache}", cache)
                        for a in cmd]
                if not any("{file}" in a for a in cmd):
                    argv.append(path)
                r = run_measured(argv, env=dict(env_base, VRAMSCOPE_CACHE_DIR=cache), timeout=args.timeout)
                r["cmd"] = " ".join(shlex.quote(a) for a in argv)
                runs[f"d{k + 1}"].append(r)
            finally:
                shutil.rmtree(cache, ignore_errors=True)
    return {k: v for k, v in runs.items() if v}


def _du(path):
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                total += os.path.getsize(os.path.join(root, f))
            except OSError:
                pass
    return total


def summarize(runs):
    """Best wall time, median peak RSS per row; None when any run failed."""
    out = {}
    for key, rs in runs.items():
        ok = [r for r in rs if r["ok"]]
        row = {"runs": len(rs), "ok": len(ok) == len(rs)}
        if ok and len(ok) == len(rs):
            row["wall_s"] = min(r["wall_s"] for r in ok)
            row["rss_mb"] = statistics.median(r["rss_mb"] for r in ok)
            if "work_s" in ok[0]:
                row["work_s"] = min(r["work_s"] for r in ok)
            if "cache_mb" in ok[0]:
                row["cache_mb"] = ok[-1]["cache_mb"]
        else:
            bad = next(r for r in rs if not r["ok"])
            row["error"] = bad.get("error", "failed")
        if "cmd" in rs[0]:
            row["cmd"] = rs[0]["cmd"]
        out[key] = row
    a = out.get("a")
    if a and a["ok"]:
        for key, row in out.items():
            if key not in ("a", "g") and row["ok"]:
                row["time_ratio"] = row["wall_s"] / a["wall_s"]
                row["time_ratio_load"] = row["wall_s"] / a["work_s"]
                if key == "r" and "work_s" in row:      # the parser's own time against pickle.load's
                    row["work_ratio_load"] = row["work_s"] / a["work_s"]
                row["rss_ratio"] = row["rss_mb"] / a["rss_mb"]
    return out


LABELS = {"a": "a pickle.load", "g": "g  ...gc disabled", "b": "b cold summary", "c": "c warm reopen",
          "r": "r open_snapshot"}


def print_table(n, info, rows, extras_labels):
    gen = ""
    if info.get("gen_wall_s") is not None:
        gen = (f", {'generated' if info['generated'] else 'reused; generated'} in {info['gen_wall_s']:.1f} s"
               f" (peak {info['gen_rss_mb']:.0f} MB)")
    print(f"\n== {n:,} events: {info['file']} ({info['bytes'] / 1e6:.1f} MB{gen})")
    print(f"{'':18} {'wall s':>9} {'load s':>9} {'peak MB':>9} {'t/a':>7} {'t/load':>7} {'rss/a':>7}  note")
    for key, row in rows.items():
        label = LABELS.get(key) or f"{key} {extras_labels.get(key, '')}"[:18]
        if not row["ok"]:
            print(f"{label:18} {'FAILED':>9}{'':>45}  {row.get('error', '')}")
            continue
        work = f"{row['work_s']:9.3f}" if "work_s" in row else f"{'':>9}"
        tr = f"{row['time_ratio']:7.2f} {row['time_ratio_load']:7.2f}" if "time_ratio" in row else f"{'':>15}"
        rr = f"{row['rss_ratio']:7.3f}" if "rss_ratio" in row else f"{'':>7}"
        note = f"cache {row['cache_mb']:.1f} MB" if key in ("b", "c") and "cache_mb" in row else ""
        if "work_ratio_load" in row:
            note = f"open_snapshot alone / pickle.load alone = {row['work_ratio_load']:.4f}"
        print(f"{label:18} {row['wall_s']:9.3f} {work} {row['rss_mb']:9.1f} {tr} {rr}  {note}")


def check_targets(n, rows):
    """Verdicts against the acceptance targets (meaningful at >= 10^6 events)."""
    verdict = {}
    for name, limit in TARGETS.items():
        key, what = name.split("_")
        row = rows.get(key)
        if not row or not row["ok"] or "time_ratio" not in row:
            continue
        ratio = {"time": "time_ratio", "rss": "rss_ratio", "load": "work_ratio_load"}[what]
        if ratio in row:
            verdict[name] = row[ratio] <= limit
    return verdict


def parse_sizes(s):
    return [int(float(x)) for x in s.split(",") if x.strip()]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", default="1e4,1e5,1e6", type=parse_sizes,
                    help="comma-separated sizes (default 1e4,1e5,1e6; add 1e7 for the big one)")
    ap.add_argument("--repeat", type=int, default=1, help="runs per measurement (best time, median RSS)")
    ap.add_argument("--extra", action="append", default=[],
                    help="another command to time like the others ({file}, {python}, {cache} are "
                         "substituted; FILE is appended when {file} is absent); repeatable")
    ap.add_argument("--cli", default="{python} -m vramscope",
                    help="the vramscope command prefix (default: '{python} -m vramscope')")
    ap.add_argument("--only", default="a,g,b,c,r",
                    help="which of a,g,b,c to run (default all; g = pickle.load with the cyclic GC "
                         "disabled, a stricter reference that the ratios do not use)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=DEFAULT_OUT, help="folder for snapshots and results.json")
    ap.add_argument("--regen", action="store_true", help="regenerate snapshots even if present")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per command (default 1800)")
    ap.add_argument("--results", default=None, help="results file (default OUT/results.json)")
    args = ap.parse_args(argv)
    args.only = set(x.strip() for x in args.only.split(","))
    os.makedirs(args.out, exist_ok=True)
    cli_argv = [a.replace("{python}", sys.executable) for a in shlex.split(args.cli)]
    extras = [shlex.split(e) for e in args.extra]
    extras_labels = {f"d{k + 1}": os.path.basename(c[0]) if c else "" for k, c in enumerate(extras)}

    results = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "python": sys.version.split()[0], "platform": platform.platform(),
        "cpus": os.cpu_count(), "mem_total_gb": _mem_total_gb(),
        "cli": cli_argv, "extras": [" ".join(e) for e in args.extra], "repeat": args.repeat,
        "targets_at_1e6": TARGETS, "sizes": [],
    }
    warm_up(cli_argv)
    for n in args.events:
        path, info = ensure_snapshot(n, args.out, args.seed, args.regen, args.timeout)
        runs = measure_size(n, path, args, cli_argv, extras)
        rows = summarize(runs)
        print_table(n, info, rows, extras_labels)
        entry = {"events": n, **info, "rows": rows, "targets_met": check_targets(n, rows),
                 "raw": {k: [{kk: vv for kk, vv in r.items() if kk not in ("stdout", "stderr")}
                             for r in rs] for k, rs in runs.items()}}
        if entry["targets_met"] and n >= 10**6:
            print("targets: " + ", ".join(f"{k} {'ok' if v else 'MISSED'}" for k, v in entry["targets_met"].items()))
        results["sizes"].append(entry)
        out = args.results or os.path.join(args.out, "results.json")
        with open(out, "w") as f:
            json.dump(results, f, indent=1)
    print(f"\nresults: {os.path.relpath(out, os.getcwd())}")
    return 0


def _mem_total_gb():
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    return None


if __name__ == "__main__":
    sys.exit(main())
