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


def predict(runs: Runs, path, lever: str) -> tuple[int, str]:
    """(predicted peak bytes, its peak type) for `lever` on the run at `path`."""
    from vramscope.classifiers.whatif import growth_peak, what_if
    an = runs.analysis(path)
    dev = an.primary_device()
    if lever.startswith("fit "):
        dim = lever.split()[1]
        return growth_peak(an, dev, dim, 2.0), ""
    r = what_if(an, dev, levers=[lever])
    return r.scaled.bytes, r.scaled.type


def run(only=None, verbose=True, grid_dir=wg.DEFAULT_OUT, hf=False):
    grid = wg.grid() + (wg.hf_grid() if hf else [])
    paths = wg.ensure(grid, grid_dir, verbose=verbose)
    runs = Runs()
    rows = []
    todo = [(str(paths[a.name]), str(paths[b.name]), a.name, b.name, lv) for a, b, lv in cases(grid)]
    todo += [(str(ROOT / a), str(ROOT / b), Path(a).stem, Path(b).stem, f"{lv} ({where})")
             for a, b, lv, where in PAIRS]
    t0 = time.time()
    for src, dst, a, b, lever in todo:
        name = lever.split(" (")[0]
        if only and name not in only:
            continue
        pred, typ = predict(runs, src, name)
        actual = runs.peak(dst)
        rows.append({"source": a, "target": b, "lever": lever, "predicted": pred, "actual": actual,
                     "error": (pred - actual) / actual, "type": typ})
    return rows, time.time() - t0


def summary(rows) -> dict:
    out: dict = {}
    for r in rows:
        s = out.setdefault(r["lever"], {"cases": 0, "sum": 0.0, "worst": 0.0, "under": 0})
        e = abs(r["error"])
        s["cases"] += 1
        s["sum"] += e
        s["worst"] = max(s["worst"], e)
        s["under"] += r["error"] < 0
    for s in out.values():
        s["mean"] = s.pop("sum") / s["cases"]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--grid", type=Path, default=wg.DEFAULT_OUT, help="where the recorded grid is cached")
    ap.add_argument("--json", type=Path, help="write every case and the summary here")
    ap.add_argument("--only", nargs="*", help="levers to check (default: all)")
    ap.add_argument("--quiet", action="store_true", help="the summary only")
    ap.add_argument("--bands", action="store_true", help="print the error bands for classifiers/levers.py")
    ap.add_argument("--hf", action="store_true",
                    help="also a tiny Hugging Face Llama (needs transformers and peft): another model, its own "
                         "checkpointing and LoRA code, away from the grid the levers were developed on")
    args = ap.parse_args(argv)
    os.environ.setdefault("VRAMSCOPE_CACHE_DIR", str(HERE / "out" / "cache"))
    rows, secs = run(args.only, not args.quiet, args.grid, args.hf)
    MB = 1e6
    if not args.quiet:
        print(f"{'configuration':<28} {'recorded with the change':<28} {'lever':<24} {'predicted':>11} "
              f"{'actual':>11} {'error':>8}")
        for r in rows:
            print(f"{r['source']:<28} {r['target']:<28} {r['lever']:<24} {r['predicted'] / MB:>9.3f}MB "
                  f"{r['actual'] / MB:>9.3f}MB {100 * r['error']:>+7.2f}%")
        print()
    s = summary(rows)
    print(f"{'lever':<28} {'cases':>5} {'mean':>7} {'worst':>7} {'under':>6}")
    for lever, v in s.items():
        print(f"{lever:<28} {v['cases']:>5} {100 * v['mean']:>6.2f}% {100 * v['worst']:>6.2f}% {v['under']:>6}")
    print(f"\n{len(rows)} predictions in {secs:.1f} s (analyses included)")
    if args.bands:
        merged = summary([dict(r, lever=r["lever"].split(" (")[0]) for r in rows if "(HF" not in r["lever"]])
        for lever, v in merged.items():
            if not lever.startswith("fit"):
                print(f'    "{lever}": ErrorBand({v["mean"]:.2g}, {v["worst"]:.2g}, {v["cases"]}, ...),')
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"cases": rows, "summary": s}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
