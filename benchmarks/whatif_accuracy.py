"""How well do the what-if levers predict a run recorded with the lever pulled?

    python benchmarks/whatif_accuracy.py [--grid DIR] [--json OUT] [--quiet] [--only LEVER ...]

Records (once; cached) the grid of benchmarks/whatif_grid.py: a tiny GPT trained on the CPU
under torch's profiler, 4 and 8 layers, sequence 128 and 256, micro-batch 1-8, full
fine-tuning and LoRA (rank 8 on every Linear of every block), with and without activation
checkpointing. Then predicts each configuration from its neighbour with each lever, through
`vramscope.classifiers.whatif.what_if` (the function every surface reads), and compares the
predicted peak with the peak of the run recorded with the change:

  checkpointing      X            -> X with checkpointing
  no_checkpointing   X_ckpt       -> X
  half_batch         batch b      -> batch b / 2
  lora               full X       -> LoRA X (rank 8)
  fit batch x2       batch b      -> batch 2b   (the growth model behind `whatif --fit batch`)
  fit seq x2         sequence 128 -> 256        (`--fit seq`: attention scores grow as s^2)

With --hf, also a tiny Hugging Face Llama (transformers + peft; whatif_grid.hf_grid): another
model and its own checkpointing and LoRA code, reported apart and not in the error bands.

plus recorded pairs outside the grid (PAIRS): the real H100 pair tests/data/cuda_lora.pickle
<-> cuda_ckpt.pickle (Llama, bf16 autocast, LoRA on q/v: only checkpointing differs) and the
ground-truth CPU runs of tests/groundtruth. It prints a table per case (configuration, lever,
predicted, actual, error) and, per lever, the cases, the mean and worst absolute error, and
how many were under; `--bands` prints them as classifiers/levers.py's ERROR_BANDS (grid and
pairs together).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

import whatif_grid as wg  # noqa: E402

# recorded pairs outside the grid: the real H100 pair (Llama, bf16 autocast, PEFT LoRA on q/v,
# only checkpointing differs) and the ground-truth CPU runs of tests/groundtruth (2 layers,
# LoRA on qkv with fused AdamW, or full fine-tuning with foreach AdamW)
PAIRS = [("tests/data/cuda_lora.pickle", "tests/data/cuda_ckpt.pickle", "checkpointing", "H100"),
         ("tests/data/cuda_ckpt.pickle", "tests/data/cuda_lora.pickle", "no_checkpointing", "H100"),
         ("tests/groundtruth/ft_base.pickle", "tests/groundtruth/ft_checkpointing.pickle", "checkpointing", "tests"),
         ("tests/groundtruth/ft_checkpointing.pickle", "tests/groundtruth/ft_base.pickle", "no_checkpointing", "tests"),
         ("tests/groundtruth/ft_batch2x.pickle", "tests/groundtruth/ft_base.pickle", "half_batch", "tests"),
         ("tests/groundtruth/transformer_adamw.pickle", "tests/groundtruth/checkpointing.pickle", "checkpointing",
          "tests"),
         ("tests/groundtruth/checkpointing.pickle", "tests/groundtruth/transformer_adamw.pickle", "no_checkpointing",
          "tests")]


# the lever-validation families (benchmarks/record_families.py): a case per pair of variants of one
# family, the lever taking the first to the second
FAMILY_CASES = (("base", "ckpt", "checkpointing"), ("ckpt", "base", "no_checkpointing"),
                ("base", "half", "half_batch"), ("double", "base", "half_batch"),
                ("base", "double", "fit batch x2"), ("half", "base", "fit batch x2"),
                ("base", "seq2", "fit seq x2"),
                ("base", "lora_qv", "lora q,v"), ("base", "lora_all", "lora all-linear"),
                ("base", "lora_attn", "lora attention"))
FAMILIES = ROOT / "tests" / "data" / "levers"
CPU_FAMILIES = HERE / "out" / "families_cpu"


def family_cases(folder: Path, tag: str) -> list:
    """(source path, target path, source name, target name, lever, set) of the recorded families in
    `folder` (one file per `<family>.<variant>.pickle`)."""
    have = {p.name[: -len(".pickle")]: p for p in folder.glob("*.pickle")} if folder.is_dir() else {}
    fams = sorted({n.split(".")[0] for n in have})
    out = []
    for fam in fams:
        for a, b, lever in FAMILY_CASES:
            if f"{fam}.{a}" in have and f"{fam}.{b}" in have:
                out.append((str(have[f"{fam}.{a}"]), str(have[f"{fam}.{b}"]), f"{fam}.{a}", f"{fam}.{b}",
                            f"{lever} ({tag})"))
    return out


def cases(grid):
    """(source config, target config, lever) over the grid."""
    names = {c.name: c for c in grid}
    out = []
    for c in grid:
        def twin(**kw):
            t = wg.Config(**{**dict(layers=c.layers, seq=c.seq, batch=c.batch, lora=c.lora, ckpt=c.ckpt,
                                    model=c.model), **kw})
            return t if t.name in names else None
        tag = " (HF Llama)" if c.model == "llama" else ""
        for other, lever in ((twin(ckpt=not c.ckpt), "no_checkpointing" if c.ckpt else "checkpointing"),
                             (twin(batch=c.batch // 2) if c.batch > 1 else None, "half_batch"),
                             (twin(lora=True) if not c.lora else None, "lora"),
                             (twin(batch=c.batch * 2), "fit batch x2"),
                             (twin(seq=c.seq * 2), "fit seq x2")):
            if other is not None:
                out.append((c, other, lever + tag))
    return out


class Runs:
    """Analyses of the recorded runs, opened once each."""

    def __init__(self):
        self._an = {}

    def analysis(self, path):
        from vramscope.classifiers import analyze
        from vramscope.parsers import open_snapshot
        path = str(path)
        if path not in self._an:
            self._an[path] = analyze(open_snapshot(path))
        return self._an[path]

    def peak(self, path) -> int:
        an = self.analysis(path)
        return an.devices[an.primary_device()].peak.bytes


def predict(runs: Runs, path, lever: str) -> tuple[int | None, str, str]:
    """(predicted peak bytes or None when the lever declined, its peak type, the run's family key)
    for `lever` on the run at `path` ('lora q,v': LoRA on those targets; 'fit batch x2': twice the batch)."""
    from vramscope.classifiers.whatif import growth_peak, run_family, what_if
    an = runs.analysis(path)
    dev = an.primary_device()
    fam = run_family(an.devices[dev])
    key = fam.key if fam is not None else "?"
    if lever.startswith("fit "):
        dim = lever.split()[1]
        peak = growth_peak(an, dev, dim, 2.0)
        return peak, "" if peak is not None else "declined", key
    name, _, targets = lever.partition(" ")
    r = what_if(an, dev, levers=[name], lora_targets=targets or "all-linear")
    if not r.prediction:
        return None, "declined: " + "; ".join(lv.why for lv in r.levers if not lv.applied), key
    return r.scaled.bytes, r.scaled.type, key


def run(only=None, verbose=True, grid_dir=wg.DEFAULT_OUT, hf=False, sets=("grid", "dev")):
    """Every case of the sets asked for: "grid" (the tiny GPT on the CPU, and the recorded pairs),
    "dev" (the families the levers may be developed on: H100 runs, and the same families recorded
    on the CPU when benchmarks/out/families_cpu holds them), "heldout" (never used to change the
    code; reported apart)."""
    runs = Runs()
    rows = []
    todo = []
    if "grid" in sets:
        grid = wg.grid() + (wg.hf_grid() if hf else [])
        paths = wg.ensure(grid, grid_dir, verbose=verbose)
        todo += [(str(paths[a.name]), str(paths[b.name]), a.name, b.name, lv) for a, b, lv in cases(grid)]
        todo += [(str(ROOT / a), str(ROOT / b), Path(a).stem, Path(b).stem, f"{lv} ({where})")
                 for a, b, lv, where in PAIRS]
    if "dev" in sets:
        todo += family_cases(FAMILIES / "dev", "H100 dev")
        todo += family_cases(CPU_FAMILIES / "dev", "CPU dev")
    if "heldout" in sets:
        todo += family_cases(FAMILIES / "heldout", "H100 held out")
    t0 = time.time()
    for src, dst, a, b, lever in todo:
        name = lever.split(" (")[0]
        if only and name.split()[0] not in only:
            continue
        pred, typ, fam = predict(runs, src, name)
        actual = runs.peak(dst)
        rows.append({"source": a, "target": b, "lever": lever, "predicted": pred, "actual": actual,
                     "error": None if pred is None else (pred - actual) / actual, "type": typ, "family": fam,
                     "set": lever.split(" (")[1].rstrip(")") if " (" in lever else "grid"})
    return rows, time.time() - t0


def summary(rows, key=lambda r: r["lever"]) -> dict:
    """Per key: cases, declined, signed mean, worst under (most negative), worst over, how many low."""
    out: dict = {}
    for r in rows:
        s = out.setdefault(key(r), {"cases": 0, "declined": 0, "sum": 0.0, "worst_under": 0.0, "worst_over": 0.0,
                                    "under": 0})
        if r["error"] is None:
            s["declined"] += 1
            continue
        e = r["error"]
        s["cases"] += 1
        s["sum"] += e
        s["worst_under"] = min(s["worst_under"], e)
        s["worst_over"] = max(s["worst_over"], e)
        s["under"] += e < 0
    for s in out.values():
        s["mean"] = s.pop("sum") / s["cases"] if s["cases"] else 0.0
        s["worst"] = max(-s["worst_under"], s["worst_over"])
    return out


def _lever_of(r) -> str:
    return r["lever"].split(" (")[0].split(" ")[0] if not r["lever"].startswith("fit") else \
        " ".join(r["lever"].split(" (")[0].split()[:2])


LEVER_FILES = {"checkpointing": "checkpointing.py", "no_checkpointing": "no_checkpointing.py",
               "half_batch": "half_batch.py", "lora": "lora.py"}


def write_bands(rows) -> None:
    """Write each lever's measured bands into its module (`measured = (...)`) and the growth
    model's into classifiers/whatif.py (FIT_MEASURED): from the grid and the dev families only."""
    import re
    groups = _groups(rows)
    per: dict = {}
    for (lever, tag, kind), errs in sorted(groups.items()):
        per.setdefault(lever, []).append(
            f'Measured("{tag}", "{kind}", {sum(errs) / len(errs):.4g}, {min(0.0, min(errs)):.4g}, '
            f'{max(0.0, max(errs)):.4g}, {len(errs)})')

    def block(items, indent):
        pad = " " * indent
        return "(" + "".join(f"\n{pad}    {x}," for x in items) + f"\n{pad})" if items else "()"
    for lever, fname in LEVER_FILES.items():
        path = ROOT / "classifiers" / "levers" / fname
        text = path.read_text()
        text = re.sub(r"\n    measured = \((?:.|\n)*?\n    \)\n|\n    measured = \(\)\n",
                      "\n    measured = " + block(per.get(lever, []), 4) + "\n", text, count=1)
        path.write_text(text)
    path = ROOT / "classifiers" / "whatif.py"
    text = path.read_text()
    new = ('FIT_MEASURED: dict[str, tuple] = {"batch": ' + block(per.get("fit batch", []), 4)
           + ', "seq": ' + block(per.get("fit seq", []), 4) + "}\n")
    text = re.sub(r"FIT_MEASURED: dict\[str, tuple\] = \{(?:.|\n)*?\}\n", lambda m: new, text, count=1)
    path.write_text(text)


def _groups(rows) -> dict:
    groups: dict = {}
    for r in rows:
        if r["error"] is None or "(HF" in r["lever"] or r["set"] == "H100 held out":
            continue
        fam = r["source"].split(".")[0] if r["set"] not in ("grid", "H100", "tests") else (
            "tiny GPT (CPU grid)" if r["set"] == "grid" else f"{r['source']} ({r['set']})")
        tag = f"{fam}, {r['set']}" if r["set"] not in ("grid", "H100", "tests") else fam
        groups.setdefault((_lever_of(r), tag, r["family"]), []).append(r["error"])
    return groups


def bands(rows) -> None:
    """Print each lever's Measured(...) per family and run kind, for its module in
    classifiers/levers/ (and whatif.FIT_MEASURED for the growth model)."""
    groups: dict = {}
    for r in rows:
        if r["error"] is None or "(HF" in r["lever"]:
            continue
        fam = r["source"].split(".")[0] if r["set"] != "grid" else ("tiny GPT (CPU grid)" if "_b" in r["source"]
                                                                      else "ground-truth CPU runs")
        tag = f"{fam}, {r['set']}" if r["set"] != "grid" else fam
        groups.setdefault((_lever_of(r), tag, r["family"]), []).append(r["error"])
    for (lever, tag, kind), errs in sorted(groups.items()):
        print(f'    {lever:<14} Measured("{tag}", "{kind}", {sum(errs) / len(errs):.4g}, {min(0.0, min(errs)):.4g}, '
              f'{max(0.0, max(errs)):.4g}, {len(errs)}),')


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--grid", type=Path, default=wg.DEFAULT_OUT, help="where the recorded grid is cached")
    ap.add_argument("--json", type=Path, help="write every case and the summary here")
    ap.add_argument("--only", nargs="*", help="levers to check (default: all)")
    ap.add_argument("--quiet", action="store_true", help="the summary only")
    ap.add_argument("--bands", action="store_true", help="print the error bands for classifiers/levers/")
    ap.add_argument("--write-bands", action="store_true",
                    help="write the measured bands into the levers' modules (from the grid and dev sets only)")
    ap.add_argument("--hf", action="store_true",
                    help="also a tiny Hugging Face Llama (needs transformers and peft): another model, its own "
                         "checkpointing and LoRA code, away from the grid the levers were developed on")
    ap.add_argument("--sets", nargs="*", default=["grid", "dev"], choices=("grid", "dev", "heldout"),
                    help="which cases: the CPU grid, the dev families, the held-out families (default: grid dev)")
    ap.add_argument("--held-out", action="store_true",
                    help="the held-out families alone (recorded before the code was changed for the dev set, never "
                         "used to change it): report them, never tune on them")
    args = ap.parse_args(argv)
    os.environ.setdefault("VRAMSCOPE_CACHE_DIR", str(HERE / "out" / "cache"))
    sets = ("heldout",) if args.held_out else tuple(args.sets)
    rows, secs = run(args.only, not args.quiet, args.grid, args.hf, sets)
    MB = 1e6
    if not args.quiet:
        print(f"{'configuration':<28} {'recorded with the change':<28} {'lever':<34} {'predicted':>11} "
              f"{'actual':>11} {'error':>8}")
        for r in rows:
            pred = "declined" if r["predicted"] is None else f"{r['predicted'] / MB:>9.3f}MB"
            err = "" if r["error"] is None else f"{100 * r['error']:>+7.2f}%"
            print(f"{r['source']:<28} {r['target']:<28} {r['lever']:<34} {pred:>11} {r['actual'] / MB:>9.3f}MB {err}"
                  + (f"  {r['type']}" if r["predicted"] is None else ""))
        print()
    for title, key in (("per lever and set", lambda r: r["lever"].split(" (")[0] + " | " + r["set"]),
                       ("per lever and family", lambda r: f"{_lever_of(r)} | {r['source'].split('.')[0]}"
                        if r["set"] != "grid" else f"{_lever_of(r)} | {r['set']}")):
        s = summary(rows, key)
        print(f"{title}:\n{'':<48} {'cases':>5} {'declined':>8} {'mean':>8} {'worst low':>9} {'worst high':>10}")
        for k, v in s.items():
            print(f"{k:<48} {v['cases']:>5} {v['declined']:>8} {100 * v['mean']:>+7.2f}% "
                  f"{100 * v['worst_under']:>+8.2f}% {100 * v['worst_over']:>+9.2f}%")
        print()
    print(f"{len(rows)} predictions in {secs:.1f} s (analyses included)")
    if args.bands:
        if "heldout" in sets:
            print("(no bands from the held-out set: it is never tuned on)")
        else:
            bands(rows)
    if args.write_bands:
        if "heldout" in sets:
            print("refused: bands are never written from the held-out set")
            return 2
        write_bands(rows)
        print("bands written into classifiers/levers/*.py and classifiers/whatif.py (FIT_MEASURED)")
    if args.json:
        s = summary(rows)
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"cases": rows, "summary": s}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
