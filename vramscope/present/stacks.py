"""What a user sees of a stack: the frame that is theirs first, C++ said briefly.

The classifiers decide each frame's role (classifiers/stacks.py: user code, library,
nn.Module, op, autograd node, other C++, the allocator's own frames) and each stack's
best frame; here those facts become text. Every surface takes its words from here:

  where(sid)             the one frame that names a stack, as 'path/file.py:12:function'
                         (the `where` of `summary --json`, leak sites, compare sites)
  where_of(allocation)   the same for an allocation row: a backward allocation with only
                         C++ frames is named by its forward stack (torch 2.13) when that
                         holds the user's code
  label(sid)             a compact form for tables: 'function  (file.py:12)'
  view(sid, ...)         the frames to list, innermost first, with the user's code never
                         behind allocator frames and C++ internals hidden on request
  short(sid, n)          a few frames for a report: the user's code first, then the
                         library frames that called the allocator
  site_key(sid)          (path tail, function) of the naming frame: the same code site in
                         two files recorded on different machines
  site_where(file, fn)   a site key as text: 'dir/file.py:function' (no line: lines move
                         between the two versions of the code a comparison is about)

Two facts of the newest torch change what a stack says. FX source mapping (frames of
FX-generated code that name their node's original trace): the original frames stand in the
stack where the generated frame is, innermost first, the generated frame right behind them
with its node ('[FX linear: call_function]'); the original user line names the stack.
Component tracking names the module an allocation was made in: `where_of` / `label_of`
add it ('model.py:52:forward in layers.0').
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass

import numpy as np

from ..classifiers.stacks import (
    KIND_BUILTIN,
    KIND_MODULE,
    LAUNCH_PATH,
    PLUMBING_FUNCTIONS,
    ROLE_AUTOGRAD,
    ROLE_CPP,
    ROLE_LIBRARY,
    ROLE_NAMES,
    ROLE_OP,
    ROLE_USER,
)

NO_FRAMES = "(no frames)"
_AUTOGRAD_NODE = re.compile(r"torch::autograd::generated::(\w+)::apply")
_ATEN_OP = re.compile(r"at::_ops::(\w+)::(?:call|redispatch)")
_THP_OP = re.compile(r"torch::autograd::THPVariable_(\w+)\(")
# dispatch frames that say nothing, and what launched the program (classifiers/stacks.py)
_PLUMBING = PLUMBING_FUNCTIONS
_LAUNCH = LAUNCH_PATH


@dataclass(frozen=True)
class FrameView:
    role: str                 # ROLE_NAMES: user | library | module | op | autograd | cpp | allocator
    file: str                 # normalized ('/' separators; profiler frames split), '' for C++ without one
    line: int                 # 0: unknown
    function: str             # the function, or a C++ symbol without its argument list
    where: str                # 'path/file.py:12:function', 'MmBackward0 (autograd)', 'aten::mm', ...
    label: str                # 'function  (file.py:12)' for Python frames, else as `where`
    note: str = ""            # FX-generated code: the node it runs ('FX linear: call_function')


@dataclass(frozen=True)
class StackView:
    frames: tuple[FrameView, ...]   # to show, innermost first
    hidden: int                     # frames left out
    hidden_what: str                # "C++" | "allocator" | ""
    from_forward: bool              # the frames are the forward stack of a backward allocation
    freed_here: bool                # the stack is where the block was freed (allocated before the trace)
    forward_site: FrameView | None = None   # an autograd node's forward op's user frame (older files)


def _dedupe(frames: list[FrameView]) -> list[FrameView]:
    """Drop a frame that says the same as the one before it (`at::_ops::mm::call` then
    `at::_ops::mm::redispatch` both read 'aten::mm')."""
    out: list[FrameView] = []
    for fv in frames:
        if not out or out[-1].where != fv.where:
            out.append(fv)
    return out


def short_cpp(name: str, limit: int = 90) -> str:
    """A C++ signature without its argument list: 'at::native::add_out(…)' (only the
    trailing, balanced group: '(anonymous namespace)' stays), at most `limit` characters."""
    s = name.rstrip()
    if s.endswith(" const"):
        s = s[:-6]
    if s.endswith(")"):
        depth = 0
        for k in range(len(s) - 1, -1, -1):
            if s[k] == ")":
                depth += 1
            elif s[k] == "(":
                depth -= 1
                if depth == 0:
                    if k > 0:
                        s = s[:k] + "(…)"
                    break
    return s if len(s) <= limit else s[:limit - 1] + "…"


def tidy_path(path: str) -> str:
    """Library paths are long and say little: keep them from the package on."""
    for marker in ("site-packages/", "dist-packages/"):
        k = path.find(marker)
        if k >= 0:
            return path[k + len(marker):]
    return path


def short_path(path: str, keep: int = 3) -> str:
    """The last few components of a long path: '…/cs336_basics/optimizers.py'."""
    parts = path.split("/")
    return path if len(parts) <= keep + 1 else "…/" + "/".join(parts[-keep:])


def path_tail(path: str, keep: int = 2) -> str:
    """The last `keep` components: what stays the same when one project is checked out
    on two machines or in two virtual environments."""
    return "/".join(tidy_path(path).split("/")[-keep:])


def module_words(module: str) -> str:
    """' in layers.0': the module an allocation was made in (component tracking), '' none."""
    return f" in {module}" if module else ""


def site_where(file: str, function: str) -> str:
    """A code site (`Stacks.site_key`) as text: 'dir/file.py:function'; a C++ or frameless
    site is already worded ('MmBackward0 (autograd)', '(no frames)')."""
    return f"{file}:{function}" if file else function


class Stacks:
    """Text for the frames and stacks of one analysed snapshot (cached per frame)."""

    def __init__(self, analysis, redact_paths: bool = False):
        self.facts = analysis.facts.stacks          # classifiers.stacks.StackFacts
        self.snap = analysis.snapshot
        self.redact = redact_paths
        self._frames: dict[int, FrameView] = {}
        self._free_note = {dev: da.frees_record_their_own_stack() for dev, da in analysis.devices.items()}

    # -- frames ----------------------------------------------------------------------------
    def frame(self, fid: int) -> FrameView:
        fv = self._frames.get(fid)
        if fv is None:
            fv = self._frames[fid] = self._frame(int(fid))
        return fv

    def _frame(self, f: int) -> FrameView:
        t = self.facts.table
        file, name = t.files[t.file_ids[f]], t.names[t.name_ids[f]]
        role = int(t.role[f])
        line = int(t.line[f])
        kind = int(t.kind[f])
        if self.redact and file:
            file = os.path.basename(file)
        if role in (ROLE_USER, ROLE_LIBRARY):
            shown = tidy_path(file) if role == ROLE_LIBRARY else file
            where = f"{shown}:{line}:{name}" if line > 0 else f"{shown}:{name}"
            label = f"{name}  ({os.path.basename(file)}:{line})" if line > 0 else f"{name}  ({os.path.basename(file)})"
            fx = self.snap.frame_fx.get(f)
            note = ""
            if fx is not None:          # FX-generated code: say which node of the graph it runs
                strings = self.snap.strings
                node, op = (strings[fx[1]] if fx[1] >= 0 else "?"), (strings[fx[0]] if fx[0] >= 0 else "?")
                note = f"FX {node}: {op}"
                where += f"  [{note}]"
                label += f"  [FX {node}]"
            return FrameView(ROLE_NAMES[role], file, line, name, where, label, note)
        if kind == KIND_MODULE:
            text = f"nn.Module: {name}"
        elif kind == KIND_BUILTIN:
            text = f"<{name}>"
        elif role == ROLE_AUTOGRAD:
            m = _AUTOGRAD_NODE.search(name)
            text = f"{m.group(1)} (autograd)" if m else short_cpp(name)
        elif role == ROLE_OP:
            m = _ATEN_OP.search(name) or _THP_OP.search(name)
            text = f"aten::{m.group(1)}" if m else short_cpp(name)
        else:
            text = short_cpp(name)
        return FrameView(ROLE_NAMES[role], file if file not in ("??", "none") else "", line, name, text, text)

    # -- stacks ----------------------------------------------------------------------------
    def frame_ids(self, sid: int) -> np.ndarray:
        """A stack's frames, innermost first (classifiers.stacks.StackFacts.frame_ids)."""
        return self.facts.frame_ids(sid)

    def naming_frame(self, sid: int) -> int:
        """The frame id that names a stack (its best frame), -1 for none."""
        if sid is None or sid < 0 or sid >= self.facts.n_stacks:
            return -1
        return int(self.facts.best_frame[sid])

    def has_user_frame(self, sid: int) -> bool:
        return sid is not None and 0 <= sid < self.facts.n_stacks and int(self.facts.user_frame[sid]) >= 0

    def forward_site(self, sid: int) -> int:
        """For a stack named by an autograd node: the user frame of the forward op that made
        the node, matched in this file (classifiers/stacks.py), else -1."""
        if sid is None or sid < 0 or sid >= self.facts.n_stacks:
            return -1
        return int(self.facts.forward_user_frame[sid])

    def where(self, sid: int) -> str:
        f = self.naming_frame(sid)
        if f < 0:
            return NO_FRAMES
        fwd = self.forward_site(sid)
        return self.frame(f).where + (f" of {self.frame(fwd).where}" if fwd >= 0 else "")

    def label(self, sid: int) -> str:
        f = self.naming_frame(sid)
        if f < 0:
            return "(no stack)"
        fwd = self.forward_site(sid)
        return self.frame(f).label + (f" of {self.frame(fwd).label}" if fwd >= 0 else "")

    def _naming_stack(self, stack: int, forward_stack: int) -> tuple[int, bool]:
        """The stack to name an allocation by: its own, or, when that holds no code of the
        user's and the entry recorded its forward stack (torch 2.13), the forward one."""
        if not self.has_user_frame(stack) and forward_stack >= 0 and self.has_user_frame(forward_stack):
            return forward_stack, True
        return stack, False

    def site(self, frame_id: int, stack: int = -1) -> str:
        """A frame as a site ('file.py:12:function'), or the stack's name without one."""
        return self.frame(frame_id).where if frame_id >= 0 else self.where(stack)

    def site_short(self, frame_id: int, stack: int = -1) -> str:
        """A site as briefly as a label can say it: 'train.py:180' (the file's name and the
        line), or the stack's name without a Python frame."""
        if frame_id < 0:
            return self.where(stack)
        fv = self.frame(frame_id)
        if not fv.file:
            return fv.where
        name = fv.file.rsplit("/", 1)[-1]
        return f"{name}:{fv.line}" if fv.line > 0 else f"{name}:{fv.function}"

    def site_short_of(self, sid: int, forward_stack: int = -1) -> str:
        """A stack's own code as briefly as a label can say it: its user frame ('train.py:88'),
        else the frame that names it ('adamw.py:163', 'MmBackward0 (autograd)'); a backward
        entry with no code of the user's is named by its forward stack (torch 2.13)."""
        use, _ = self._naming_stack(sid, forward_stack)
        if use is None or use < 0 or use >= self.facts.n_stacks:
            return NO_FRAMES
        f = int(self.facts.user_frame[use])
        return self.site_short(f if f >= 0 else self.naming_frame(use), use)

    def where_of(self, alloc) -> str:
        sid, _ = self._naming_stack(alloc.stack, alloc.forward_stack)
        return self.where(sid) + module_words(getattr(alloc, "module", ""))

    def label_of(self, alloc) -> str:
        sid, fwd = self._naming_stack(alloc.stack, alloc.forward_stack)
        return self.label(sid) + ("  [forward]" if fwd else "") + module_words(getattr(alloc, "module", ""))

    def site_key(self, sid: int) -> tuple[str, str]:
        """(path tail, function) of the frame naming `sid`: equal for the same code site in
        files recorded on different machines (absolute paths differ)."""
        f = self.naming_frame(sid)
        if f < 0:
            return ("", NO_FRAMES)
        fv = self.frame(f)
        return (path_tail(fv.file) if fv.file else "", fv.function if fv.file else fv.where)

    def view(self, sid: int, forward_stack: int = -1, hide_internals: bool = True, freed_here: bool = False,
             limit: int | None = None) -> StackView:
        """The frames to list for a stack, innermost first. With `hide_internals`, a stack
        with Python frames shows only those; one without (autograd's worker thread) drops
        the allocator's own frames and says how many were hidden. The allocator's frames
        never come first: they move behind the others when they are shown at all. A
        backward allocation with no code of the user's shows its forward stack (2.13)."""
        use, from_forward = self._naming_stack(sid, forward_stack)
        fids = self.frame_ids(use).tolist()
        frames = [self.frame(f) for f in fids]
        hidden, what = 0, ""
        if hide_internals:
            py = [fv for fv in frames if fv.role in ("user", "library")]
            named = _dedupe([fv for fv in frames if fv.role in ("autograd", "op", "module")])
            keep = [fv for fv in frames if fv.role != "allocator"]
            if py:
                hidden, what = len(frames) - len(py), "C++"
                frames = py
            elif named:
                # autograd's worker thread records no Python frames: the backward node and
                # the ops say what ran; kernels, dispatch and the allocator do not
                best = self.naming_frame(use)
                lead = [fv for fv in named if best >= 0 and fv is self.frame(best)]
                hidden, what = len(frames) - len(named), "C++"
                frames = lead + [fv for fv in named if fv not in lead]
            elif keep:
                hidden, what = len(frames) - len(keep), "allocator"
                frames = keep
        frames = [fv for fv in frames if fv.role != "allocator"] + [fv for fv in frames if fv.role == "allocator"]
        if limit is not None and len(frames) > limit:
            hidden += len(frames) - limit
            frames = frames[:limit]
        fwd = self.forward_site(use)
        return StackView(tuple(frames), hidden, what, from_forward, freed_here,
                         self.frame(fwd) if fwd >= 0 else None)

    def view_of(self, da, alloc, hide_internals: bool = True) -> StackView:
        """`view` for an allocation row: notes when the only stack is its free's."""
        freed_here = alloc.alloc_index < 0 and alloc.free_index >= 0 and da.frees_record_their_own_stack()
        return self.view(alloc.stack, alloc.forward_stack, hide_internals, freed_here)

    def short(self, sid: int, n: int = 4, forward_stack: int = -1) -> list[str]:
        """A few frames for a report: the user's own code first (innermost first), then the
        innermost library frames that were the actual caller of the allocator."""
        use, _ = self._naming_stack(sid, forward_stack)
        frames = [self.frame(f) for f in self.frame_ids(use).tolist()]
        if not frames:
            return []
        user = [fv for fv in frames if fv.role == "user"]
        if len(user) > 1:          # the script's top level says nothing when there is more
            user = [fv for fv in user if fv.function != "<module>"] or user
        others = [fv for fv in frames if fv.role != "user"]
        lib = [fv for fv in others if fv.role == "library"] or [fv for fv in others if fv.role != "allocator"] \
            or others
        lib = [fv for fv in lib if fv.function not in _PLUMBING] or lib
        launch = [fv for fv in lib if _LAUNCH.search(fv.file)]
        lib = [fv for fv in lib if fv not in launch] or ([] if user else lib)
        if not user:
            # no code of the user's: the frame that names the stack (the autograd node, the
            # op) leads, then the innermost others
            best = self.naming_frame(use)
            if best >= 0:
                lead = self.frame(best)
                lib = [lead] + [fv for fv in lib if fv is not lead]
        chosen = user[:max(1, n - 1)] if user else []
        chosen += lib[:n - len(chosen)]
        return [self._report_text(fv) for fv in chosen]

    @staticmethod
    def _report_text(fv: FrameView) -> str:
        if fv.role in ("user", "library"):
            file = tidy_path(fv.file)
            return f"{file}:{fv.line} {fv.function}" if fv.line else f"{file} {fv.function}"
        return fv.where

    def frames_text(self, sid: int, limit: int = 24) -> list[str]:
        """`where` of each frame `view` would show (for JSON)."""
        return [fv.where for fv in self.view(sid, limit=limit).frames]


__all__ = ["Stacks", "FrameView", "StackView", "short_cpp", "tidy_path", "short_path", "path_tail", "site_where",
           "module_words", "NO_FRAMES",
           "ROLE_CPP"]
