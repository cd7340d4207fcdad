"""Colours: categories from the category table, markers here, the rest from the system palette."""
from __future__ import annotations

from dataclasses import dataclass

from PySide6.QtGui import QColor, QGuiApplication, QPalette

from ..classifiers import category_color as table_color

PHASE_COLORS = {"forward": "#59A14F", "backward": "#F28E2B", "optimizer": "#B07AA1", "inputs": "#EDC948",
                "eval": "#76B7B2"}
PEAK_COLOR = "#D62728"
OOM_COLOR = "#D62728"
LEAK_COLOR = "#E15759"
ANNOTATION_COLOR = "#4E79A7"     # the snapshot's own record_function regions
# The user's notes: a magenta no category band uses, apart from the peak's red.
NOTE_COLOR = "#B5179E"
WHATIF_COLOR = "#7B3FE4"          # the what-if peak: apart from the measured peak's red
GPU_COLOR = "#1F77B4"
FITS_COLOR = "#2CA02C"            # what-if: it fits (drawn darker where the background needs it)
SHORT_COLOR = "#D62728"           # what-if: short by


def category_color(name: str) -> QColor:
    """The category's colour from the one category table (classifiers/categories.py)."""
    return QColor(table_color(name))


# -- contrast (WCAG 2.x): text that carries a finding or advice reads at 4.5:1 at least ---------
TEXT_CONTRAST = 4.5         # WCAG AA for normal text


def luminance(c: QColor) -> float:
    """WCAG relative luminance of an opaque colour."""
    def chan(v: int) -> float:
        x = v / 255.0
        return x / 12.92 if x <= 0.03928 else ((x + 0.055) / 1.055) ** 2.4
    return 0.2126 * chan(c.red()) + 0.7152 * chan(c.green()) + 0.0722 * chan(c.blue())


def contrast(fg: QColor, bg: QColor) -> float:
    """WCAG contrast ratio of two opaque colours (1 to 21)."""
    a, b = luminance(fg), luminance(bg)
    hi, lo = max(a, b), min(a, b)
    return (hi + 0.05) / (lo + 0.05)


def over(color: QColor | str, background: QColor) -> QColor:
    """A translucent colour as it shows over `background` (opaque)."""
    c = QColor(color)
    a = c.alphaF()
    return QColor(round(c.red() * a + background.red() * (1 - a)), round(c.green() * a + background.green() * (1 - a)),
                  round(c.blue() * a + background.blue() * (1 - a)))


def readable(color: QColor | str, background: QColor, ratio: float = TEXT_CONTRAST) -> QColor:
    """`color` (as it shows over `background`) darkened on a light background or lightened
    on a dark one until it reads at `ratio`: its hue kept, as little changed as needed."""
    c = over(color, background)
    toward = QColor(0, 0, 0) if luminance(background) > 0.18 else QColor(255, 255, 255)
    for k in range(21):
        t = k / 20.0
        mixed = QColor(round(c.red() + (toward.red() - c.red()) * t), round(c.green() + (toward.green() - c.green()) * t),
                       round(c.blue() + (toward.blue() - c.blue()) * t))
        if contrast(mixed, background) >= ratio:
            return mixed
    return toward


def muted_text(palette: QPalette | None = None, role: QPalette.ColorRole = QPalette.ColorRole.Base) -> QColor:
    """A quieter text colour than the palette's own that still reads at 4.5:1 on the
    background `role` (the palette's placeholder grey, at about 3.4:1 on Fusion's base, does
    not: it is for hints in empty fields, not for a finding's diagnosis)."""
    if palette is None:
        palette = QGuiApplication.palette()
    return readable(palette.color(QPalette.ColorRole.PlaceholderText), palette.color(role))


@dataclass
class Theme:
    dark: bool
    background: QColor
    foreground: QColor
    muted: QColor
    grid: QColor
    accent: QColor
    live_line: QColor
    reserved_line: QColor
    hover_bg: QColor

    @classmethod
    def from_palette(cls, palette: QPalette | None = None) -> "Theme":
        if palette is None:
            palette = QGuiApplication.palette()
        bg = palette.color(QPalette.ColorRole.Base)
        fg = palette.color(QPalette.ColorRole.Text)
        dark = bg.lightness() < 128
        muted = QColor(fg)
        muted.setAlpha(150)
        grid = QColor(fg)
        grid.setAlpha(40)
        accent = palette.color(QPalette.ColorRole.Highlight)
        live = QColor("#F0F0F0") if dark else QColor("#202020")
        reserved = QColor("#9AA0A6") if dark else QColor("#5F6368")
        hover_bg = QColor(palette.color(QPalette.ColorRole.ToolTipBase))
        hover_bg.setAlpha(235)
        return cls(dark, bg, fg, muted, grid, accent, live, reserved, hover_bg)

    def band_color(self, name: str) -> QColor:
        c = category_color(name)
        # opaque bands, a little lighter on light backgrounds so the lines stay readable
        return c.lighter(112) if not self.dark else c.darker(105)

    def guess_color(self, band: QColor) -> QColor:
        """A band's bytes that are a guess: the band's colour washed out toward the
        background (still its hue, clearly not the evidence's)."""
        bg = QColor(30, 30, 30) if self.dark else QColor(255, 255, 255)
        mix = 0.6
        return QColor(round(band.red() * (1 - mix) + bg.red() * mix), round(band.green() * (1 - mix) + bg.green() * mix),
                      round(band.blue() * (1 - mix) + bg.blue() * mix))

# By segment: streams (several) or the small / large pool (one stream), muted so the
# allocated line stays readable over them.
SEGMENT_COLORS = ("#E8C468", "#8FB8DE", "#A8D5A2", "#E6A57E", "#C7A8D6", "#9FD3CF", "#E7A3A8", "#C9B27C")
