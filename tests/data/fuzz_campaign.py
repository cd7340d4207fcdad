#!/usr/bin/env python3
"""A long fuzz campaign over the real snapshots and the fixtures (run once, by hand).

    python tests/data/fuzz_campaign.py --cases 10000 --kinds struct    # structure-aware
    python tests/data/fuzz_campaign.py --cases 10000 --kinds bytes     # byte-level
    python tests/data/fuzz_campaign.py --cases 200 --kinds all --seed 7 --out /tmp/fuzz.json

Each case is (seed file, mutation kind, rng seed): see fuzzing.py. A worker process runs
cases one after another, in process (`vramscope summary FILE --json` through cli.main, then
the fast path against the interpreter), under an address-space limit (--max-as-gb, default
2) and a per-case alarm (--case-timeout, default 20 s). Every outcome must be exit 0 or
exit 3 with one line; anything else is a finding: an exception, two stderr lines, a
disagreement between the fast path and the interpreter, a timeout, or the worker dying
(segfault, memory). When the worker dies the campaign records the case and starts a new
worker after it.

Findings are minimized (truncation and chunk deletion that keep the same failure, in fresh
processes) and, with --save-regressions, appended to fuzz_regressions.json beside this
script: tests/test_fuzz.py replays every one of them. The report (--out) lists the counts
per kind and outcome, the refusal messages and the findings.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import random
import resource
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import fuzzing  # noqa: E402

REGRESSIONS = os.path.join(HERE, "fuzz_regressions.json")
SHARED = os.path.join(os.path.dirname(ROOT), "shared", "snapshots")


def seed_files(max_bytes: int = 4 << 20) -> list[str]:
    """The real snapshots (when ../shared/snapshots is there) and every pickle fixture."""
    out = []
    for d in (os.path.join(ROOT, "tests", "data"), os.path.join(ROOT, "tests", "groundtruth"),
              os.path.join(ROOT, "assets"), SHARED):
        if os.path.isdir(d):
            for n in sorted(os.listdir(d)):
                p = os.path.join(d, n)
                if n.endswith((".pickle", ".pkl")) and os.path.getsize(p) <= max_bytes:
                    out.append(p)
    return out


def rel(p: str) -> str:
    p = os.path.abspath(p)
    if p.startswith(SHARED):
        return "shared:" + os.path.relpath(p, SHARED)
    return os.path.relpath(p, ROOT)


def unrel(r: str) -> str:
    return os.path.join(SHARED, r[7:]) if r.startswith("shared:") else os.path.join(ROOT, r)


def make_cases(n: int, kinds: tuple, seed: int, seeds: list[str]) -> list[dict]:
    rng = random.Random(seed)
    # small seeds more often: most findings need no big file, and they are quick
    weights = [1.0 / max(1.0, os.path.getsize(p) / 200_000) for p in seeds]
    cases = []
    for i in range(n):
        s = rng.choices(seeds, weights)[0]
        other = rng.choice(seeds)
        cases.append({"i": i, "seed": rel(s), "other": rel(other), "kind": rng.choice(kinds),
                      "rng": rng.randrange(1 << 31)})
    return cases


def case_data(c: dict) -> bytes:
    if "hex" in c:
        return bytes.fromhex(c["hex"])
    with open(unrel(c["seed"]), "rb") as fh:
        data = fh.read()
    other = None
    if c["kind"] == "splice_files":
        with open(unrel(c["other"]), "rb") as fh:
            other = fh.read()
    return fuzzing.case_bytes(data, c["kind"], c["rng"], other)


# -- the worker: runs cases in this process --------------------------------------------------------
def worker(spec_path: str, start: int, timeout: int) -> None:
    os.environ["VRAMSCOPE_CACHE_DIR"] = ""
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    with open(spec_path) as fh:
        cases = json.load(fh)

    def on_alarm(signum, frame):
        raise TimeoutError("case timed out")
    signal.signal(signal.SIGALRM, on_alarm)
    tmp = tempfile.mkdtemp(prefix="vramscope-fuzz-")
    path = os.path.join(tmp, "case.pickle")
    for c in cases[start:]:
        print(json.dumps({"begin": c["i"]}), flush=True)
        t0 = time.perf_counter()
        signal.alarm(timeout)
        try:
            outcome, detail = fuzzing.check_bytes(case_data(c), path)
        except TimeoutError:
            outcome, detail = "FAIL", f"timeout after {timeout} s"
        except BaseException as e:  # noqa: BLE001 - the harness itself must go on
            outcome, detail = "FAIL", f"harness: {type(e).__name__}: {str(e)[:120]}"
        finally:
            signal.alarm(0)
        print(json.dumps({"i": c["i"], "outcome": outcome, "detail": detail,
                          "secs": round(time.perf_counter() - t0, 3)}), flush=True)


def _limit(max_as_gb: float):
    def pre():
        lim = int(max_as_gb * (1 << 30))
        resource.setrlimit(resource.RLIMIT_AS, (lim, lim))
    return pre


def run_cases(cases: list[dict], max_as_gb: float, timeout: int, progress: bool = True) -> dict:
    """{case index: (outcome, detail, secs)}; a worker that dies fails its case."""
    spec = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)
    json.dump(cases, spec)
    spec.close()
    results = {}
    pos = 0
    t_start = time.time()
    try:
        while pos < len(cases):
            p = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker", spec.name, str(pos),
                                  str(timeout)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                 preexec_fn=_limit(max_as_gb), cwd=ROOT)
            current = None
            for line in p.stdout:
                msg = json.loads(line)
                if "begin" in msg:
                    current = msg["begin"]
                    continue
                results[msg["i"]] = (msg["outcome"], msg["detail"], msg["secs"])
                current = None
                done = len(results)
                if progress and done % 250 == 0:
                    rate = done / max(time.time() - t_start, 1e-9)
                    print(f"  {done}/{len(cases)} cases, {rate:.1f}/s", file=sys.stderr, flush=True)
            rc = p.wait()
            if current is None:
                break
            results[current] = ("FAIL", f"the worker died (exit {rc}: {_signal_name(rc)})", None)
            pos = next(k for k, c in enumerate(cases) if c["i"] == current) + 1
    finally:
        os.unlink(spec.name)
    return results


def _signal_name(rc: int) -> str:
    if rc < 0:
        try:
            return signal.Signals(-rc).name
        except ValueError:
            return f"signal {-rc}"
    return "memory or a hard error" if rc else "ok"


# -- minimizing a finding -----------------------------------------------------------------------------
def _same_failure(data: bytes, want: str, max_as_gb: float, timeout: int) -> bool:
    got = run_cases([{"i": 0, "hex": data.hex(), "seed": "", "kind": "raw", "rng": 0}], max_as_gb, timeout,
                    progress=False)
    outcome, detail, _ = got[0]
    return outcome == "FAIL" and _kind_of_failure(detail) == want


def _kind_of_failure(detail: str) -> str:
    return detail.split(":", 1)[0].split(" at ")[0][:60]


def minimize(data: bytes, detail: str, max_as_gb: float, timeout: int, budget: int = 60) -> bytes:
    """Shorter bytes with the same kind of failure: cut the tail, then drop chunks."""
    want = _kind_of_failure(detail)
    tries = 0
    cut = len(data) // 2
    while cut > 0 and tries < budget:
        tries += 1
        if len(data) > cut and _same_failure(data[:-cut], want, max_as_gb, timeout):
            data = data[:-cut]
        else:
            cut //= 2
    chunk = max(1, len(data) // 8)
    while chunk > 0 and tries < budget:
        i = 0
        while i < len(data) and tries < budget:
            tries += 1
            cand = data[:i] + data[i + chunk:]
            if cand and _same_failure(cand, want, max_as_gb, timeout):
                data = cand
            else:
                i += chunk
        chunk //= 2
    return data


# -- the campaign ----------------------------------------------------------------------------------
def main(argv=None) -> int:
    if argv is None and len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=1000)
    ap.add_argument("--kinds", choices=("struct", "bytes", "all"), default="all")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-as-gb", type=float, default=2.0, help="address-space limit of the worker")
    ap.add_argument("--case-timeout", type=int, default=20)
    ap.add_argument("--out", help="write the report (JSON) here")
    ap.add_argument("--no-minimize", action="store_true")
    ap.add_argument("--save-regressions", action="store_true", help=f"append findings to {REGRESSIONS}")
    args = ap.parse_args(argv)
    kinds = {"struct": fuzzing.STRUCT_KINDS, "bytes": fuzzing.BYTE_KINDS, "all": fuzzing.KINDS}[args.kinds]
    seeds = seed_files()
    cases = make_cases(args.cases, kinds, args.seed, seeds)
    t0 = time.time()
    results = run_cases(cases, args.max_as_gb, args.case_timeout)
    wall = time.time() - t0
    counts = collections.Counter()
    refusals = collections.Counter()
    findings = []
    slowest = sorted(((r[2] or 0, i) for i, r in results.items()), reverse=True)[:5]
    for c in cases:
        outcome, detail, secs = results[c["i"]]
        counts[(c["kind"], outcome)] += 1
        if outcome == "refused":
            refusals[detail.split(" at byte")[0][:70]] += 1
        elif outcome == "FAIL":
            findings.append({**c, "detail": detail})
    print(f"{len(cases)} cases ({args.kinds}, seed {args.seed}) in {wall:.0f} s over {len(seeds)} seed files")
    for kind in kinds:
        row = {o: counts[(kind, o)] for o in ("ok", "refused", "FAIL")}
        print(f"  {kind:14} ok {row['ok']:6}  refused {row['refused']:6}  FAIL {row['FAIL']:4}")
    print(f"slowest cases: {', '.join(f'#{i} {s:.2f} s' for s, i in slowest)}")
    print(f"findings: {len(findings)}")
    for f in findings:
        print(f"  #{f['i']} {f['seed']} {f['kind']} rng={f['rng']}: {f['detail']}")
    if findings and not args.no_minimize:
        seen = set()
        for f in findings:
            key = _kind_of_failure(f["detail"])
            if key in seen:
                continue
            seen.add(key)
            small = minimize(case_data(f), f["detail"], args.max_as_gb, args.case_timeout)
            f["minimized_hex"] = small.hex() if len(small) <= 4096 else None
            f["minimized_bytes"] = len(small)
            print(f"  minimized #{f['i']} to {len(small)} bytes")
    if args.save_regressions and findings:
        old = []
        if os.path.exists(REGRESSIONS):
            with open(REGRESSIONS) as fh:
                old = json.load(fh)
        for f in findings:
            entry = {"name": f"campaign{args.seed}_{f['kind']}_{f['i']}", "seed": f["seed"], "other": f["other"],
                     "kind": f["kind"], "rng": f["rng"], "found": f["detail"]}
            if f.get("minimized_hex"):
                entry["hex"] = f["minimized_hex"]
            old.append(entry)
        with open(REGRESSIONS, "w") as fh:
            json.dump(old, fh, indent=1)
            fh.write("\n")
    if args.out:
        with open(args.out, "w") as fh:
            json.dump({"cases": len(cases), "kinds": args.kinds, "seed": args.seed, "wall_s": round(wall, 1),
                       "seeds": [rel(s) for s in seeds],
                       "counts": {f"{k}/{o}": v for (k, o), v in sorted(counts.items())},
                       "refusals": refusals.most_common(), "findings": findings}, fh, indent=1)
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
