"""Every analysis stage, timed at 10^5, 10^6 and 10^7 events, against pickle.load of the same file.

    python benchmarks/bench_stages.py [--events 1e5 1e6 1e7] [--json OUT] [--skip-viewer]

For each size it generates (or reuses) benchmarks/out/snap_<N>.pickle (gen_snapshot.py: about
20, 200 and 2,000 iterations), then, each in a fresh process and in the same run:

  load      `pickle.load` of the file with the garbage collector off (the fastest Python reads it:
            the reference every ratio is against), its wall time and peak RSS;
  stages    services/stages.py: parse (cold), the analysis a cold `summary` runs stage by stage
            (stacks, allocations, classify, peaks, run facts, advice, leaks, ooms, stale
            gradients, the summary document), then what runs on demand (the structure, each
            simulated lever, the fit, the budget, the memory tree, compare, the report): CPU
            and wall seconds, the peak RSS when each stage ends (the high-water mark so far);
  summary   `vramscope summary FILE --json` end to end, empty cache: wall and peak RSS;
  viewer    `vramscope view FILE --screenshot OUT.png` (offscreen), empty cache: wall and RSS.

It prints, per size, each stage's seconds, its ratio to pickle.load's, its time per event (so
growth shows at a glance: a linear stage keeps its ns/event across sizes) and the RSS; then the
end-to-end ratios the targets are about. Numbers vary on a loaded machine: compare ratios from
one run.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from _snapshots import ensure_snapshot  # noqa: E402
from bench_parse import PICKLE_CHILD, compile_tree, run_measured  # noqa: E402

# the same stages through the APIs every version has (open_snapshot, analyze, what_if, ...):
# what `--before DIR` runs on another checkout (PYTHONPATH=DIR), and this one beside it
COARSE_CHILD = r"""
import json, os, sys, tempfile, time
try:                                    # as the command line does (a checkout before it: nothing)
    from vramscope.common.memory import one_malloc_arena
    one_malloc_arena()
except ImportError:
    pass
def peak():
    try:
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
wall, cpu, rss = {}, {}, {}
class stage:
    def __init__(self, name): self.name = name
    def __enter__(self): self.w, self.c = time.perf_counter(), time.process_time()
    def __exit__(self, *a):
        wall[self.name] = time.perf_counter() - self.w; cpu[self.name] = time.process_time() - self.c
        rss[self.name] = peak()
from vramscope.parsers import open_snapshot
from vramscope.classifiers import analyze
from vramscope.services.summary import summary_document
with stage("parse"):
    snap = open_snapshot(sys.argv[1])
with stage("analyze"):
    an = analyze(snap, use_cache=False)
with stage("summary document"):
    summary_document(an)
dev = an.primary_device(); da = an.devices[dev]
from vramscope.classifiers.structure import structure
from vramscope.classifiers import structure as sm
sm._CACHE.pop(da, None)
with stage("structure"):
    structure(da)
from vramscope.classifiers.whatif import what_if
for lever in ("half_batch", "checkpointing", "no_checkpointing", "lora"):
    with stage("lever " + lever):
        what_if(an, dev, levers=[lever], with_budget=False)
with stage("fit batch"):
    what_if(an, dev, gpu="80", fit="batch", with_budget=False)
from vramscope.services.report import write_report
with stage("report"), tempfile.TemporaryDirectory() as out:
    write_report(an, out)
import vramscope
sys.stdout.write(json.dumps({"wall": wall, "cpu": cpu, "rss": rss, "code": vramscope.__file__}) + "\n")
"""

STAGES_CHILD = r"""
import json, sys
try:                                    # as the command line does (a checkout before it: nothing)
    from vramscope.common.memory import one_malloc_arena
    one_malloc_arena()
except ImportError:
    pass
from vramscope.services.stages import run_stages
c = run_stages(sys.argv[1])
sys.stdout.write(json.dumps({"wall": c.wall, "cpu": c.cpu, "rss": c.rss}) + "\n")
"""


def measure(path: str, viewer: bool = True, before: str | None = None) -> dict:
    py = sys.executable
    path = os.path.abspath(path)
    out: dict = {"file": path, "bytes": os.path.getsize(path)}
    for key, code in (("coarse", None), ("before", before)):
        if key == "before" and not code:
            continue
        # Each child runs in the checkout it measures: `python -c` and `python -m` put the working
        # directory first on sys.path, ahead of PYTHONPATH, so a child started in this checkout
        # imports this code whatever PYTHONPATH says (the "before" of the first tables did).
        cwd = os.path.abspath(code) if code else ROOT
        with tempfile.TemporaryDirectory() as cache:
            env = {**os.environ, "VRAMSCOPE_CACHE_DIR": cache}
            if code:
                env["PYTHONPATH"] = cwd
            r = run_measured([py, "-c", COARSE_CHILD, path], env=env, cwd=cwd)
            out[key] = {**json.loads(r["stdout"]), "wall_s": r["wall_s"], "rss_mb": r["rss_mb"]} if r["ok"] \
                else {"error": r.get("error")}
            got = out[key].get("code", "")
            if got and not os.path.abspath(got).startswith(cwd + os.sep):
                raise SystemExit(f"the {key} child imported {got}, not the code in {cwd}")
            s = run_measured([py, "-m", "vramscope", "summary", path, "--json"], cwd=cwd,
                             env=env | {"VRAMSCOPE_CACHE_DIR": cache + "/s"})
            out[key]["summary"] = {"wall_s": s["wall_s"], "rss_mb": s["rss_mb"], "ok": s["ok"]}
            if viewer:
                v = run_measured([py, "-m", "vramscope", "view", path, "--screenshot", cache + "/shot.png"], cwd=cwd,
                                 env=env | {"VRAMSCOPE_CACHE_DIR": cache + "/v", "QT_QPA_PLATFORM": "offscreen"})
                out[key]["viewer"] = {"wall_s": v["wall_s"], "rss_mb": v["rss_mb"], "ok": v["ok"]}
    load = run_measured([py, "-c", PICKLE_CHILD, path, "nogc"])
    out["load"] = {"wall_s": load["wall_s"], "rss_mb": load["rss_mb"],
                   **(json.loads(load["stdout"]) if load["ok"] else {"error": load.get("error")})}
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "VRAMSCOPE_CACHE_DIR": cache}
        st = run_measured([py, "-c", STAGES_CHILD, path], env=env)
        out["stages"] = {**json.loads(st["stdout"]), "wall_s": st["wall_s"], "rss_mb": st["rss_mb"]} if st["ok"] \
            else {"error": st.get("error")}
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "VRAMSCOPE_CACHE_DIR": cache}
        s = run_measured([py, "-m", "vramscope", "summary", path, "--json"], env=env)
        out["summary"] = {"wall_s": s["wall_s"], "rss_mb": s["rss_mb"], "ok": s["ok"], "error": s.get("error")}
    if viewer:
        with tempfile.TemporaryDirectory() as cache:
            env = {**os.environ, "VRAMSCOPE_CACHE_DIR": cache, "QT_QPA_PLATFORM": "offscreen"}
            png = os.path.join(cache, "shot.png")
            v = run_measured([py, "-m", "vramscope", "view", path, "--screenshot", png], env=env)
            out["viewer"] = {"wall_s": v["wall_s"], "rss_mb": v["rss_mb"], "ok": v["ok"], "error": v.get("error")}
    return out


def coarse_table(res: dict, events: int) -> str:
    """Before and after, stage by stage, through the APIs both versions have."""
    load = res["load"]
    ref_s = load.get("work_s") or load["wall_s"]
    ref_mb = load["rss_mb"]
    a, b = res.get("before"), res.get("coarse")
    if not b or "error" in b:
        return ""
    lines = [f"  before / after (x pickle.load gc off; ns/event), same run:",
             f"  {'stage':<22} {'before s':>9} {'x load':>7} {'ns/ev':>7} {'after s':>9} {'x load':>7} {'ns/ev':>7}"]
    for name in b["wall"]:
        old = a["wall"].get(name) if a and "wall" in a else None
        new = b["wall"][name]
        o = f"{old:>9.3f} {old / ref_s:>7.3f} {1e9 * old / events:>7.0f}" if old is not None else f"{'-':>9} {'':>7} {'':>7}"
        lines.append(f"  {name:<22} {o} {new:>9.3f} {new / ref_s:>7.3f} {1e9 * new / events:>7.0f}")
    for key in ("summary", "viewer"):
        old = a.get(key) if a else None
        new = b.get(key)
        if new:
            o = (f"{old['wall_s']:>9.2f} {old['wall_s'] / ref_s:>7.3f} RSS x{old['rss_mb'] / ref_mb:.3f}"
                 if old else "")
            lines.append(f"  {key + ' end to end':<22} {o}  ->  {new['wall_s']:.2f} s, x{new['wall_s'] / ref_s:.3f}, "
                         f"RSS {new['rss_mb']:.0f} MB, x{new['rss_mb'] / ref_mb:.3f}")
    return "\n".join(lines)


def table(res: dict, events: int) -> str:
    load = res["load"]
    ref_s, ref_mb = load.get("work_s") or load["wall_s"], load["rss_mb"]
    st = res["stages"]
    lines = [f"\n{events:.0e} events ({res['bytes'] / 1e6:.0f} MB): pickle.load (gc off) {ref_s:.2f} s, "
             f"{ref_mb:.0f} MB"]
    if "error" in st:
        return "\n".join(lines + [f"  stages failed: {st['error']}"])
    lines.append(f"  {'stage':<22} {'cpu s':>8} {'wall s':>8} {'x load':>7} {'ns/event':>9} {'RSS MB':>8}")
    for name, cpu in st["cpu"].items():
        wall = st["wall"][name]
        rss = st["rss"].get(name)
        lines.append(f"  {name:<22} {cpu:>8.3f} {wall:>8.3f} {wall / ref_s:>7.3f} {1e9 * wall / events:>9.0f} "
                     f"{(rss or 0) / 1e6:>8.0f}")
    for key in ("summary", "viewer"):
        r = res.get(key)
        if r:
            lines.append(f"  {key + ' (end to end)':<22} {'':>8} {r['wall_s']:>8.2f} {r['wall_s'] / ref_s:>7.3f} "
                         f"{'':>9} {r['rss_mb']:>8.0f}  RSS x load {r['rss_mb'] / ref_mb:.3f}"
                         + ("" if r.get("ok", True) else f"  FAILED: {r.get('error')}"))
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", nargs="*", type=float, default=[1e5, 1e6, 1e7])
    ap.add_argument("--out", default=os.path.join(HERE, "out"))
    ap.add_argument("--json", help="write every measurement here")
    ap.add_argument("--skip-viewer", action="store_true")
    ap.add_argument("--before", metavar="DIR",
                    help="another checkout (a git worktree of an earlier commit): its stages and end-to-end times "
                         "beside these, same run (PYTHONPATH=DIR)")
    args = ap.parse_args(argv)
    results = {}
    for ev in args.events:
        n = int(ev)
        path = ensure_snapshot(args.out, n)
        with open(path, "rb") as f:            # into the page cache: every run reads it warm
            while f.read(1 << 24):
                pass
        for code in filter(None, (ROOT, args.before)):           # .pyc compiled, as an installed copy's
            compile_tree(code)
        res = measure(path, not args.skip_viewer, args.before)
        results[n] = res
        print(table(res, n), flush=True)
        print(coarse_table(res, n), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
