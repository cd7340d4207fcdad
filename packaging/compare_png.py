"""Pixel-compare two PNGs (e.g. the bundle's and the installed app's --screenshot).

    python packaging/compare_png.py a.png b.png    # exit 0 if identical, 1 if not
"""
from __future__ import annotations

import os
import sys


def load(path):
    import numpy as np
    from PySide6.QtGui import QImage

    im = QImage(path)
    if im.isNull():
        raise SystemExit(f"compare_png: cannot read {path}")
    im = im.convertToFormat(QImage.Format.Format_RGBA8888)
    rows = np.frombuffer(im.constBits(), np.uint8, im.sizeInBytes()).reshape(im.height(), im.bytesPerLine())
    return rows[:, : im.width() * 4].reshape(im.height(), im.width(), 4).copy()  # own the pixels: im is freed on return


def main(argv) -> int:
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    import numpy as np
    from PySide6.QtGui import QGuiApplication

    _app = QGuiApplication.instance() or QGuiApplication(sys.argv[:1])  # noqa: F841
    a, b = load(argv[0]), load(argv[1])
    if a.shape != b.shape:
        print(f"different sizes: {a.shape[1]}x{a.shape[0]} vs {b.shape[1]}x{b.shape[0]}")
        return 1
    diff = np.abs(a.astype(np.int16) - b.astype(np.int16)).max(axis=2)
    n = int((diff > 0).sum())
    print(f"{a.shape[1]}x{a.shape[0]}: {n} differing pixels, max channel difference {int(diff.max())}")
    return 0 if n == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
