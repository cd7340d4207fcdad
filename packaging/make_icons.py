"""Render the application icon PNGs from assets/icons/vramscope.svg.

    QT_QPA_PLATFORM=offscreen python packaging/make_icons.py

Writes assets/icons/hicolor/<N>x<N>/apps/vramscope.png for the freedesktop
hicolor sizes (16 to 512), so the tree can be copied as-is into
~/.local/share/icons/hicolor/. Uses Qt's own SVG renderer (QSvgRenderer), the
same one the viewer uses for its window icon, so no extra tool is needed.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

SIZES = (16, 32, 48, 64, 128, 256, 512)
ROOT = Path(__file__).resolve().parent.parent
SVG = ROOT / "assets" / "icons" / "vramscope.svg"
OUT = ROOT / "assets" / "icons" / "hicolor"


def render(svg: Path = SVG, out: Path = OUT, sizes=SIZES) -> list[Path]:
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtCore import Qt
    from PySide6.QtGui import QGuiApplication, QImage, QPainter
    from PySide6.QtSvg import QSvgRenderer

    app = QGuiApplication.instance() or QGuiApplication(sys.argv[:1])  # noqa: F841 (QPainter needs it)
    renderer = QSvgRenderer(str(svg))
    if not renderer.isValid():
        raise SystemExit(f"make_icons: cannot render {svg}")
    written = []
    for n in sizes:
        img = QImage(n, n, QImage.Format.Format_ARGB32_Premultiplied)
        img.fill(Qt.GlobalColor.transparent)
        p = QPainter(img)
        p.setRenderHint(QPainter.RenderHint.Antialiasing)
        p.setRenderHint(QPainter.RenderHint.SmoothPixmapTransform)
        renderer.render(p)
        p.end()
        dest = out / f"{n}x{n}" / "apps" / "vramscope.png"
        dest.parent.mkdir(parents=True, exist_ok=True)
        if not img.save(str(dest), "PNG"):
            raise SystemExit(f"make_icons: cannot write {dest}")
        written.append(dest)
    return written


if __name__ == "__main__":
    for p in render():
        print(p.relative_to(ROOT))
