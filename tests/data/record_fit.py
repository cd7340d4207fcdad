"""Record the small CPU runs that check `vramscope whatif --fit batch` against reality
(tests/test_whatif_levers.py):

    python tests/data/record_fit.py [OUT_DIR]        # default: tests/data

A two-layer tiny GPT (benchmarks/whatif_grid.py's model: vocab 512, width 128, 4 heads, MLP
512, sequence 64), full fine-tuning with fused AdamW for two steps, recorded on the CPU under
torch's profiler and converted by `torch.cuda._memory_viz._profile_to_snapshot` with the
per-allocation `category` dropped, at micro-batch 2 (what `--fit` reads) and at 5 and 6 (what
the prediction is checked against), without and with activation checkpointing:

    fit_b2.pickle  fit_b5.pickle  fit_b6.pickle  fit_b5_ckpt.pickle  fit_b6_ckpt.pickle

about 0.3-0.45 MB each. Peaks and file sizes are deterministic on one torch build (fixed
seeds); addresses and the `<built-in ... at 0x...>` frame names differ between recordings.
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import whatif_grid as wg  # noqa: E402

LAYERS, SEQ = 2, 64
RUNS = {"fit_b2": (2, False), "fit_b5": (5, False), "fit_b6": (6, False),
        "fit_b5_ckpt": (5, True), "fit_b6_ckpt": (6, True)}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    out = Path(argv[0]) if argv else Path(__file__).resolve().parent
    out.mkdir(parents=True, exist_ok=True)
    for name, (batch, ckpt) in RUNS.items():
        meta = wg.record(wg.Config(LAYERS, SEQ, batch, False, ckpt), out / f"{name}.pickle")
        print(f"{name}: {meta['bytes']:,} bytes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
