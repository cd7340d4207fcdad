"""The Selection panel: the selected allocation's category, rule, size, lifetime and stack."""
from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QPalette
from PySide6.QtWidgets import QCheckBox, QLabel, QTextBrowser, QVBoxLayout, QWidget

from ...common.units import fmt_bytes, fmt_duration_us
from ...present.markup import html as _esc
from ...present.stacks import short_path
from ...classifiers.evidence import EVIDENCE
from ...present.words import before_trace_text, evidence_words, freed_note, torch_tag_words
from ..model import DeviceData, when_text
from ..theme import category_color, muted_text


# -- the selected allocation ----------------------------------------------------------------
class StackPanel(QWidget):
    """The selected allocation: category, rule, size, lifetime and its full stack."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.data: DeviceData | None = None
        self.row = -1
        self._details = ""
        self.header = QLabel("Click the timeline or a table row to select an allocation.", self)
        self.header.setWordWrap(True)
        self.header.setTextFormat(Qt.TextFormat.RichText)
        self.header.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.python_only = QCheckBox("Hide C++ internals", self)
        self.python_only.setChecked(True)
        self.python_only.setToolTip("Show only the Python frames (or, for stacks without any, such as autograd's "
                                    "worker threads, drop the allocator's own frames and argument lists)")
        self.python_only.toggled.connect(lambda _: self._render())
        self.frames = QTextBrowser(self)
        self.frames.setOpenLinks(False)
        # sentences (no stack, which stack this is) wrap to the panel's width; the frames are
        # preformatted and scroll sideways when a path is longer than the panel is wide
        self.frames.setLineWrapMode(QTextBrowser.LineWrapMode.WidgetWidth)
        self.frames.setToolTip("The allocation's stack, innermost frame first")
        lay = QVBoxLayout(self)
        lay.setContentsMargins(6, 6, 6, 6)
        lay.addWidget(self.header)
        lay.addWidget(self.python_only)
        lay.addWidget(self.frames, 1)

    def set_data(self, data: DeviceData | None):
        self.data = data
        self.set_row(-1)

    def set_row(self, row: int):
        self.row = row
        self._render()

    def _render(self):
        d, row = self.data, self.row
        if d is None or row < 0:
            self.header.setText("<i>Click the timeline or a table row to select an allocation.</i>")
            self.header.setToolTip("")
            self.frames.clear()
            return
        a = d.allocs
        c = int(d.category[row])
        name = d.category_name(c)
        col = category_color(name).name()
        ai, fi = int(d.alloc_index[row]), int(d.free_index[row])
        life = ""
        muted = muted_text(self.palette(), QPalette.ColorRole.Window).name()
        if d.has_time and ai >= 0 and fi >= 0:
            life = f" · lived {fmt_duration_us(int(d.tkey[fi]) - int(d.tkey[ai]))}"
        # compact: the category, how sure, the rule, when; the exact size, the address and
        # why the rule chose it in the tooltip and under the frames (at 1024x700 the header
        # took the pane and left 1.5 frames; five show now, the rest scrolls)
        why = d.rule_why(row)
        self.header.setText(
            f"<span style='color:{col}; font-size:14pt'>■</span> <b>{name}</b> · <b>{fmt_bytes(int(a.size[row]))}</b>"
            f"<br>how sure: {_esc(evidence_words(EVIDENCE[int(d.da.evidence[row])]))}"
            f"<br>rule: <code>{_esc(d.rule_name(row))}</code>"
            f"<br>allocated {when_text(d, ai) if ai >= 0 else before_trace_text(d.state_only)} · "
            f"freed {when_text(d, fi) if fi >= 0 else 'never (live at the end)'}{life}")
        self.header.setToolTip(f"{name}: {int(a.size[row]):,} B at 0x{int(a.addr[row]):x}"
                               + (f"\nrule {d.rule_name(row)}: {why}" if why else ""))
        self._details = (f"<div style='color:{muted}'>{int(a.size[row]):,} B at address "
                         f"<code>0x{int(a.addr[row]):x}</code>"
                         + (f"<br>rule <code>{_esc(d.rule_name(row))}</code>: {_esc(why)}" if why else "") + "</div>")
        alloc = d.da.allocation(row)
        tag = torch_tag_words(alloc.torch_tag, alloc.rules_category)
        extra = (f"<br>{_esc(tag)}" if tag else "") \
            + (f"<br>module <code>{_esc(alloc.module)}</code>" if alloc.module else "") \
            + "".join(f"<br>{_esc(kind)}: <code>{_esc(text[:300])}</code>" for kind, text in alloc.metadata
                      if not (kind == "metadata" and text == alloc.module))
        if extra:
            self.header.setText(self.header.text() + extra)
        view = d.stacks.view_of(d.da, alloc, hide_internals=self.python_only.isChecked())
        lines, notes = [], []
        for fv in view.frames:
            if fv.role in ("user", "library"):
                name = f"<b>{_esc(fv.function)}</b>" if fv.role == "user" else _esc(fv.function)
                fx = f"  <i style='color:{muted}'>[{_esc(fv.note)}]</i>" if fv.note else ""
                lines.append(f"{name}{fx}<br>&nbsp;&nbsp;<span style='color:{muted}'>"
                             f"{_esc(short_path(fv.file))}:{fv.line}</span>")
            else:
                text = _esc(fv.where if self.python_only.isChecked() else fv.function)
                if fv.role in ("autograd", "op", "module"):
                    text = f"<b>{text}</b>"
                where = f"  <span style='color:{muted}'>{_esc(fv.file)}</span>" if fv.file else ""
                lines.append(f"{text}{where}")
        if not lines:
            notes.append("<i>no stack recorded for this allocation</i>")
        elif view.freed_here:
            notes.append(f"<i style='color:{muted}'>{_esc(freed_note())}</i>")
        elif view.forward_site is not None:
            fs = view.forward_site
            lines.insert(0, f"<i style='color:{muted}'>backward of the forward op at</i> <b>{_esc(fs.function)}</b>"
                            f"<br>&nbsp;&nbsp;<span style='color:{muted}'>{_esc(short_path(fs.file))}:{fs.line}</span>")
        elif view.from_forward:
            notes.append(f"<i style='color:{muted}'>forward stack of this backward allocation "
                         f"(autograd's thread recorded no Python frames)</i>")
        tail = f"<div><i style='color:{muted}'>{view.hidden} {view.hidden_what} frames hidden</i></div>" \
            if view.hidden else ""
        self.frames.setHtml("".join(f"<div>{n}</div>" for n in notes)
                            + ("<div style='font-family:monospace; white-space:pre'>" + "<br>".join(lines) + "</div>"
                               if lines else "") + tail + self._details)

    def stack_text(self) -> str:
        return self.frames.toPlainText()

    def room_for_frames(self, frames: int = 5) -> int:
        """The pane's height that shows its header whole and `frames` frames (two lines each:
        the function, then its file and line)."""
        line = self.frames.fontMetrics().lineSpacing()
        lay = self.layout()
        assert lay is not None
        m = lay.contentsMargins()
        width = max(100, self.width() - m.left() - m.right())
        header = self.header.heightForWidth(width) if self.header.hasHeightForWidth() else \
            self.header.sizeHint().height()
        spacing = lay.spacing() * 2
        return (m.top() + m.bottom() + header + self.python_only.sizeHint().height() + spacing
                + 2 * frames * line + 2 * self.frames.frameWidth() + 8)
