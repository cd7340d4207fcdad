"""Facts about interned frames and stacks, computed once per frame and once per stack.

Nothing here loops over trace events. A frame is normalized once (profiler-style
names are split into file and function, Windows paths get forward slashes), a
frame matcher is a pair of regexes evaluated over the *unique* file and function
strings, and a per-stack answer ("does any frame of stack s match?", "which is its
innermost Python frame?") is one `cumsum` over the CSR array `snap.stack_frames`.

Frame kinds (what the rules match on):
  python   a Python frame (`*.py`, `<frozen ...>`, profiler 'path/file.py(12): fn')
  cpp      a C/C++ frame (stacks='all'; CPython's own ceval.c frames count here)
  builtin  profiler '<built-in method zeros_like of ...>' (a torch op called from Python)
  module   profiler 'nn.Module: Linear_0' (a module's forward)

Frame roles (what a user is shown first; the one frame-kind test of the project):
  user       a Python frame of the user's own code (not torch, not site-packages, not <frozen>)
  library    a Python frame of an installed package or the standard library
  module     profiler 'nn.Module: X'
  op         the torch op an allocation was made for: profiler '<built-in method mm>',
             C++ `at::_ops::mm::call`, `torch::autograd::THPVariable_mm`
  autograd   an autograd node running backward: `torch::autograd::generated::MmBackward0::apply`
  cpp        any other C/C++ frame (kernels, CPython's interpreter)
  allocator  the allocator's and the stack capture's own frames, which every CUDA
             allocation goes through and which say nothing about who allocated:
             `torch::unwind::`, `torch::CapturedTraceback::`, `c10::` (the caching
             allocator, the dispatcher), `at::detail::empty*`, `at::empty`
`best_frame` per stack follows that order of preference: a stack's user frame when it
has one, else the innermost library frame, the module, the autograd node, the op, and
only then C++ frames; an allocator frame is named only when a stack holds nothing else.

FX source mapping (`_snapshot(augment_with_fx_traces=True)`, snap.frame_fx): a frame of
FX-generated code names the node it runs and the node's original trace. The innermost user
frame of that trace is the stack's user frame (the model's own line, not the generated
one), unless a user frame of the stack itself lies inside the generated code's call.
"""
from __future__ import annotations

import re
import sys
from dataclasses import dataclass

import numpy as np

KIND_PYTHON, KIND_CPP, KIND_BUILTIN, KIND_MODULE = 0, 1, 2, 3
KIND_CODES = {"python": KIND_PYTHON, "cpp": KIND_CPP, "builtin": KIND_BUILTIN, "module": KIND_MODULE}

_PROF_PY = re.compile(r"^(.*)\((\d+)\): (.*)$")
_PROF_MODULE = re.compile(r"^nn\.Module: (.*?)(?:_\d+)?$")
_PROF_BUILTIN = re.compile(r"^<built-in (?:method|function) ([\w.]+)")
# torch 2.13 `forward_frames`: Python traceback lines, outermost first
_TRACEBACK = re.compile(r'^\s*File "(.*)", line (\d+), in ([^\n]*)')
# The torch op a C++ stack was called for: torch::autograd::THPVariable_linear(...) -> linear
_CPP_OP = re.compile(r"torch::autograd::THPVariable_(\w+)\(")
_ATEN_OP = re.compile(r"at::_ops::(\w+)::(?:call|redispatch)")
_AUTOGRAD_NODE = re.compile(r"torch::autograd::generated::(\w+)::apply")
_ALLOCATOR = ("torch::unwind::", "torch::CapturedTraceback::", "torch::cuda::(anonymous namespace)::gather",
              "c10::", "at::detail::empty", "at::detail::_empty", "at::TensorBase at::detail::_empty",
              "at::empty", "at::TensorBase at::empty")
# Python frames outside the user's code: installed packages, the standard library, torch itself,
# and code torch generates (Inductor's kernels in /tmp/torchinductor_<user>/, FX graph modules:
# '<eval_with_key>.N', or 'fx_generated__<hash>.py' where torch registers FX metadata)
GENERATED_PATH = ("/torchinductor_", "<eval_with_key>", "fx_generated_")
LIBRARY_PATH = ("site-packages/", "dist-packages/", "/lib/python", "/torch/", "<frozen", "<string>") + GENERATED_PATH

# what launched the program, not what it did: the interpreter's module runner, threads, event
# loops, notebooks' kernels, debuggers and process launchers; a short stack or a memory tree
# never shows them (matched on a frame's normalized file)
LAUNCH_PATH = re.compile(r"(^|/)(runpy\.py|threading\.py|<frozen runpy>|<frozen importlib[^/]*>|asyncio/|"
                         r"concurrent/futures/|multiprocessing/|IPython/|ipykernel/|ipykernel_launcher\.py|tornado/|"
                         r"traitlets/|zmq/|debugpy/|_pydevd|pydevd|torch/distributed/(elastic|run\.py|launch)|"
                         r"accelerate/commands/|lightning/fabric/strategies/launchers/|"
                         r"pytorch_lightning/strategies/launchers/)")
# nn.Module / autograd.Function dispatch frames (library functions) repeat on every stack and say nothing
PLUMBING_FUNCTIONS = frozenset({"_call_impl", "_wrapped_call_impl", "apply", "decorate_context", "wrapper", "inner"})

ROLE_USER, ROLE_LIBRARY, ROLE_MODULE, ROLE_OP, ROLE_AUTOGRAD, ROLE_CPP, ROLE_ALLOCATOR = range(7)
ROLE_NAMES = ("user", "library", "module", "op", "autograd", "cpp", "allocator")
# preference for the frame that names a stack (see the module docstring)
BEST_ORDER = (ROLE_USER, ROLE_LIBRARY, ROLE_MODULE, ROLE_AUTOGRAD, ROLE_OP, ROLE_CPP, ROLE_ALLOCATOR)


# forward ops whose autograd nodes are named after what they call (the rest match by name)
_COMPOSITE_OPS = {"linear": ("mm", "addmm", "t"), "crossentropyloss": ("nllloss", "logsoftmax"),
                  "scaleddotproductattention": ("scaleddotproductefficientattention",
                                                "scaleddotproductflashattention", "scaleddotproductcudnnattention",
                                                "scaleddotproductattentionmath"),
                  "dropout": ("nativedropout",), "to": ("tocopy",), "totype": ("tocopy",),
                  "reshape": ("view", "unsafeview"), "matmul": ("mm", "bmm"), "layernorm": ("nativelayernorm",),
                  "groupnorm": ("nativegroupnorm",), "batchnorm": ("nativebatchnorm",)}
_NODE_OPS: dict[str, list[str]] = {}
for _op, _nodes in _COMPOSITE_OPS.items():
    for _n in _nodes:
        _NODE_OPS.setdefault(_n, []).append(_op)


def _op_key(name: str) -> str:
    """'_log_softmax' / 'log_softmax' / 'cross_entropy_loss' -> 'logsoftmax', ..."""
    return name.replace("_", "").lower()


def _node_ops(node: str) -> list[str]:
    """The op keys whose forward makes autograd node `node` ('MmBackward0' -> mm, linear, matmul)."""
    key = re.sub(r"Backward\d*$", "", node).replace("_", "").lower()
    return [key] + _NODE_OPS.get(key, [])


# torch's profiler writes a frame's file relative to the sys.path entry it was found under
# ('transformers/models/bert/modeling_bert.py', 'contextlib.py', the script as 'train.py'): a
# relative path is a library's when its top-level name is the standard library's or a package
# of the ecosystem's (a user's own package of the same name would be read as the library)
_RELATIVE_LIBRARIES = frozenset(sys.stdlib_module_names) | frozenset({
    "torch", "torchvision", "torchaudio", "torchtext", "functorch", "transformers", "peft", "accelerate", "trl",
    "datasets", "tokenizers", "safetensors", "huggingface_hub", "diffusers", "timm", "lightning",
    "pytorch_lightning", "lightning_fabric", "deepspeed", "bitsandbytes", "xformers", "flash_attn", "triton",
    "apex", "fairscale", "einops", "numpy", "megatron", "vllm", "optimum", "auto_gptq", "awq", "torchao",
    "unsloth", "sentence_transformers", "open_clip", "torchmetrics", "hydra", "omegaconf", "wandb", "tqdm",
    "_pytest", "pytest", "pluggy", "IPython", "ipykernel", "tensorboard", "composer", "torchtune", "liger_kernel"})


def is_library_file(file: str) -> bool:
    if file.startswith("torch/") or any(p in file for p in LIBRARY_PATH):
        return True
    if file.startswith("/") or file[1:3] == ":/" or not file:
        return False
    top = file.split("/", 1)[0]
    return (top[:-3] if top.endswith(".py") else top) in _RELATIVE_LIBRARIES


def cpp_role(name: str) -> int:
    if _AUTOGRAD_NODE.search(name):
        return ROLE_AUTOGRAD
    if _ATEN_OP.search(name) or _CPP_OP.search(name):
        return ROLE_OP
    # the C++ symbol may carry its return type first: 'at::TensorBase at::detail::...'
    bare = name.split(" ", 1)[1] if name.startswith(("at::Tensor ", "at::TensorBase ")) else name
    if bare.startswith(_ALLOCATOR) or name.startswith(_ALLOCATOR):
        return ROLE_ALLOCATOR
    return ROLE_CPP


@dataclass
class FrameTable:
    """Normalized frames: `file_ids[f]` / `name_ids[f]` index the unique strings."""
    files: list            # unique normalized file strings
    names: list            # unique normalized function names
    file_ids: np.ndarray   # int32 per frame
    name_ids: np.ndarray   # int32 per frame
    kind: np.ndarray       # uint8 per frame
    op_ids: np.ndarray     # int32 per frame: index into `names` of the op it names, -1 if none
    profiler_frames: int   # how many frames are profiler-style ('none' file)
    line: np.ndarray       # int32 per frame (profiler frames: the number in 'file.py(N)')
    role: np.ndarray       # uint8 per frame: ROLE_*
    traceback: np.ndarray  # bool per frame: a traceback line (2.13 forward_frames, outermost first)


def build_frame_table(snap) -> FrameTable:
    strings = snap.strings
    n = len(snap.frame_file)
    file_index: dict = {}
    name_index: dict = {}
    files: list = []
    names: list = []

    def fid(s):
        i = file_index.get(s)
        if i is None:
            i = file_index[s] = len(files)
            files.append(s)
        return i

    def nid(s):
        i = name_index.get(s)
        if i is None:
            i = name_index[s] = len(names)
            names.append(s)
        return i

    file_ids = np.empty(n, dtype=np.int32)
    name_ids = np.empty(n, dtype=np.int32)
    op_ids = np.full(n, -1, dtype=np.int32)
    kind = np.empty(n, dtype=np.uint8)
    role = np.empty(n, dtype=np.uint8)
    traceback = np.zeros(n, dtype=bool)
    line = np.asarray(snap.frame_line, dtype=np.int32).copy()
    prof = 0
    ff = snap.frame_file.tolist()
    fn = snap.frame_name.tolist()
    # one pass per unique frame (not per event): a few thousand at most in real files
    for f in range(n):
        file = strings[ff[f]]
        name = strings[fn[f]]
        op = None
        tb = _TRACEBACK.match(name) if file == "" else None
        if tb:                                  # a forward_frames line: a Python frame
            file, name, k = tb.group(1).replace("\\", "/"), tb.group(3).strip(), KIND_PYTHON
            line[f] = int(tb.group(2)) if len(tb.group(2)) < 10 else 0
            traceback[f] = True
        elif file == "none":                    # torch.cuda._memory_viz._profile_to_snapshot
            prof += 1
            m = _PROF_PY.match(name)
            if m:
                file, name, k = m.group(1), m.group(3), KIND_PYTHON
                line[f] = int(m.group(2)) if len(m.group(2)) < 10 else 0
            elif name.startswith("nn.Module: "):
                m = _PROF_MODULE.match(name)
                file, name, k = "", (m.group(1) if m else name[11:]), KIND_MODULE
            else:
                m = _PROF_BUILTIN.match(name)
                if m:
                    file, name, k = "", m.group(1), KIND_BUILTIN
                    op = name
                else:
                    file, k = "", KIND_CPP
        else:
            if "\\" in file:
                file = file.replace("\\", "/")
            if file.endswith(".py") or file.startswith("<"):
                k = KIND_PYTHON
            else:
                k = KIND_CPP
                m = _CPP_OP.search(name)
                if m:
                    op = m.group(1)
        file_ids[f] = fid(file)
        name_ids[f] = nid(name)
        kind[f] = k
        if k == KIND_PYTHON:
            role[f] = ROLE_LIBRARY if is_library_file(file) else ROLE_USER
        elif k == KIND_MODULE:
            role[f] = ROLE_MODULE
        elif k == KIND_BUILTIN:
            role[f] = ROLE_OP
        else:
            role[f] = cpp_role(name)
        if op is not None:
            op_ids[f] = nid(op)
    return FrameTable(files, names, file_ids, name_ids, kind, op_ids, prof, line, role, traceback)


class StackFacts:
    """Per-stack queries over a snapshot's interned stacks (CSR: offsets + frame ids)."""

    def __init__(self, snap, table: FrameTable | None = None):
        self.snap = snap
        self.table = table or build_frame_table(snap)
        self.offsets = np.asarray(snap.stack_offsets, dtype=np.int64)
        self.frames = np.asarray(snap.stack_frames, dtype=np.int64)
        self.n_stacks = len(self.offsets) - 1
        lengths = np.diff(self.offsets)
        self.lengths = lengths
        # stack id of every slot of the CSR array
        self.slot_stack = np.repeat(np.arange(self.n_stacks, dtype=np.int64), lengths)
        self.slot_pos = np.arange(len(self.frames), dtype=np.int64) - self.offsets[self.slot_stack] \
            if len(self.frames) else np.zeros(0, dtype=np.int64)
        self._file_cache: dict = {}
        self._name_cache: dict = {}
        self.top_python = self.first_frame(self.table.kind == KIND_PYTHON)
        op_frame = self.first_frame(self.table.op_ids >= 0)
        if len(self.table.op_ids):
            self.op_name_id = np.where(op_frame >= 0, self.table.op_ids[np.maximum(op_frame, 0)], -1)
        else:
            self.op_name_id = np.full(self.n_stacks, -1, dtype=np.int64)
        # stacks made of traceback lines list their frames outermost first
        tbc = np.zeros(len(self.frames) + 1, dtype=np.int64)
        if len(self.frames):
            np.cumsum(self.table.traceback[self.frames], out=tbc[1:])
        n_tb = tbc[self.offsets[1:]] - tbc[self.offsets[:-1]]
        self.outer_first = (n_tb > 0) & (n_tb == lengths)
        self.user_frame, self.best_frame = self._best_frames()
        self.forward_user_frame = self._forward_user_frames()

    # -- one stack -----------------------------------------------------------------
    def frame_ids(self, sid: int) -> np.ndarray:
        """A stack's frames, innermost first (traceback-line stacks are stored outermost first);
        an FX-generated frame with an original trace comes right behind that trace's frames."""
        if sid is None or sid < 0 or sid >= self.n_stacks:
            return np.zeros(0, dtype=np.int64)
        fr = self.frames[self.offsets[sid]:self.offsets[sid + 1]]
        fr = fr[::-1] if self.outer_first[sid] else fr
        fx = getattr(self.snap, "frame_fx", None)
        if fx and any(int(f) in fx for f in fr):
            out: list[int] = []
            for f in fr.tolist():
                out += list(fx[f][4]) if f in fx else []
                out.append(f)
            return np.asarray(out, dtype=np.int64)
        return fr

    # -- frame level -------------------------------------------------------------
    def _match_strings(self, pattern: str | None, strings: list, cache: dict) -> np.ndarray | None:
        if pattern is None:
            return None
        hit = cache.get(pattern)
        if hit is None:
            rx = re.compile(pattern)
            hit = np.fromiter((rx.search(s) is not None for s in strings), dtype=bool, count=len(strings))
            cache[pattern] = hit
        return hit

    def frame_mask(self, matcher) -> np.ndarray:
        """bool per frame: the frame matches `matcher` (file / name regexes, kind).

        The name regex only runs on the names of frames that pass the kind and file tests
        (C++ symbols are the bulk of the strings in stacks='all' files)."""
        t = self.table
        m = None
        if matcher.kind is not None:
            m = np.isin(t.kind, matcher.kind)
        fh = self._match_strings(matcher.file, t.files, self._file_cache)
        if fh is not None:
            m = fh[t.file_ids] if m is None else m & fh[t.file_ids]
        if matcher.name is not None:
            if m is None:
                m = self.name_mask(matcher.name)[t.name_ids]
            else:
                key = (matcher.name, matcher.kind, matcher.file)
                hit = self._name_cache.get(key)
                if hit is None:
                    ids = np.unique(t.name_ids[m])
                    rx = re.compile(matcher.name)
                    ok = np.fromiter((rx.search(t.names[i]) is not None for i in ids.tolist()), dtype=bool,
                                     count=len(ids))
                    hit = self._name_cache[key] = ids[ok]
                m &= np.isin(t.name_ids, hit)
        return m if m is not None else np.ones(len(t.kind), dtype=bool)

    def name_mask(self, pattern: str) -> np.ndarray:
        """bool per unique name string (for op matching)."""
        hit = self._match_strings(pattern, self.table.names, self._name_cache)
        assert hit is not None
        return hit

    # -- stack level -------------------------------------------------------------
    def any(self, frame_mask: np.ndarray) -> np.ndarray:
        """bool per stack: some frame of the stack is in `frame_mask`. A mask of no frame (most
        markers in most traces: 23-31 of the 31 asked here) or of every frame is answered
        without a pass over the stacks' frame slots (3.3 million of them in 10^6 entries of
        200,000 stacks)."""
        if not len(self.frames) or not frame_mask.any():
            return np.zeros(self.n_stacks, dtype=bool)
        if frame_mask.all():
            return self.lengths > 0
        cs = np.zeros(len(self.frames) + 1, dtype=np.int64)
        np.cumsum(frame_mask[self.frames], out=cs[1:])
        return cs[self.offsets[1:]] > cs[self.offsets[:-1]]

    def first_pos(self, frame_mask: np.ndarray) -> np.ndarray:
        """int per stack: position (0 = innermost) of the first frame in `frame_mask`, -1 if none
        (a mask of no frame or of every frame: no pass over the slots, as in `any`)."""
        out = np.full(self.n_stacks, -1, dtype=np.int64)
        if not len(self.frames) or not frame_mask.any():
            return out
        if frame_mask.all():
            out[self.lengths > 0] = 0
            return out
        idx = np.flatnonzero(frame_mask[self.frames])
        if len(idx):
            st = self.slot_stack[idx]
            first = np.r_[True, st[1:] != st[:-1]]
            out[st[first]] = self.slot_pos[idx[first]]
        return out

    def first_frame(self, frame_mask: np.ndarray) -> np.ndarray:
        """int per stack: frame id of the first frame (in stack order) in `frame_mask`, -1 if none."""
        pos = self.first_pos(frame_mask)
        out = np.full(self.n_stacks, -1, dtype=np.int64)
        ok = pos >= 0
        out[ok] = self.frames[self.offsets[:-1][ok] + pos[ok]]
        return out

    def last_frame(self, frame_mask: np.ndarray) -> np.ndarray:
        """int per stack: frame id of the last frame (in stack order) in `frame_mask`, -1 if none."""
        out = np.full(self.n_stacks, -1, dtype=np.int64)
        if not len(self.frames) or not frame_mask.any():
            return out
        idx = np.flatnonzero(frame_mask[self.frames])
        if len(idx):
            st = self.slot_stack[idx]
            last = np.r_[st[1:] != st[:-1], True]
            out[st[last]] = self.frames[idx[last]]
        return out

    def innermost_frame(self, frame_mask: np.ndarray) -> np.ndarray:
        """int per stack: frame id of the innermost frame in `frame_mask` (the first, or the
        last for traceback-line stacks, which list the outermost first), -1 if none."""
        out = self.first_frame(frame_mask)
        if self.outer_first.any():
            out[self.outer_first] = self.last_frame(frame_mask)[self.outer_first]
        return out

    def top_mask(self, frame_mask: np.ndarray) -> np.ndarray:
        """bool per stack: its innermost Python frame is in `frame_mask`."""
        tp = self.top_python
        if not len(frame_mask):
            return np.zeros(self.n_stacks, dtype=bool)
        return (tp >= 0) & frame_mask[np.maximum(tp, 0)]

    def op_mask(self, pattern: str) -> np.ndarray:
        """bool per stack: the torch op it was called for matches `pattern` (C++ or profiler stacks)."""
        nh = self.name_mask(pattern)
        op = self.op_name_id
        if not len(nh):
            return np.zeros(self.n_stacks, dtype=bool)
        return (op >= 0) & nh[np.maximum(op, 0)]

    def _best_frames(self) -> tuple[np.ndarray, np.ndarray]:
        """(user frame, best frame) per stack: frame ids, -1 where a stack has none."""
        t = self.table
        role = t.role
        user = self.innermost_frame(role == ROLE_USER) if len(role) else np.full(self.n_stacks, -1, np.int64)
        self._fx_user_frames(user)
        best = user.copy()
        if not len(role):
            return user, best
        # a library's own frame names a stack before code torch generated for it (an Inductor
        # kernel's `call` says less than the model's forward that ran it)
        generated = np.array([any(g in f for g in GENERATED_PATH) for f in t.files], dtype=bool)
        generated = generated[np.maximum(t.file_ids, 0)] & (t.file_ids >= 0) if len(t.files) \
            else np.zeros(len(role), dtype=bool)
        masks = [(role == ROLE_LIBRARY) & ~generated, (role == ROLE_LIBRARY) & generated]
        masks += [role == r for r in BEST_ORDER[2:]]
        for m in masks:
            todo = best < 0
            if not todo.any():
                break
            best[todo] = self.innermost_frame(m)[todo]
        return user, best

    def fx_original_user(self) -> np.ndarray:
        """int64 per frame: the innermost user frame of its FX original trace, -1 none."""
        role = self.table.role
        out = np.full(len(role), -1, dtype=np.int64)
        for f, v in (getattr(self.snap, "frame_fx", None) or {}).items():
            mine = [g for g in v[4] if 0 <= g < len(role) and role[g] == ROLE_USER]
            if 0 <= f < len(out) and mine:
                out[f] = mine[0]
        return out

    def _fx_user_frames(self, user: np.ndarray) -> None:
        """In place: a stack through FX-generated code is the user's at the node's original
        line (see the module docstring)."""
        if not getattr(self.snap, "frame_fx", None) or not len(self.table.role):
            return
        orig = self.fx_original_user()
        has = orig >= 0
        if not has.any():
            return
        fx_pos = self.first_pos(has)
        user_pos = self.first_pos(self.table.role == ROLE_USER)
        if self.outer_first.any():          # traceback-line stacks: no FX frames there
            fx_pos[self.outer_first] = -1
        take = (fx_pos >= 0) & ((user_pos < 0) | (user_pos > fx_pos))
        if take.any():
            g = self.frames[self.offsets[:-1][take] + fx_pos[take]]
            user[take] = orig[g]

    def _forward_user_frames(self) -> np.ndarray:
        """Per stack named by an autograd node (a backward allocation on autograd's thread,
        no Python frames): the user frame of the forward op that made the node, where the
        file's other stacks tell it without doubt (every stack that ran that op from user
        code has the same user frame), else -1. torch 2.13 records it (forward_frames);
        older files only name the node (`LogSoftmaxBackward0`), so the op is matched by name."""
        out = np.full(self.n_stacks, -1, dtype=np.int64)
        t = self.table
        best = self.best_frame
        if not len(t.role) or not (t.role[np.maximum(best, 0)] == ROLE_AUTOGRAD).any():
            return out
        sites: dict[str, set] = {}
        has = (self.op_name_id >= 0) & (self.user_frame >= 0)
        for s in np.flatnonzero(has).tolist():
            sites.setdefault(_op_key(t.names[self.op_name_id[s]]), set()).add(int(self.user_frame[s]))
        node_site: dict[str, int] = {}
        for s in np.flatnonzero((best >= 0) & (self.user_frame < 0)).tolist():
            f = int(best[s])
            if t.role[f] != ROLE_AUTOGRAD:
                continue
            m = _AUTOGRAD_NODE.search(t.names[t.name_ids[f]])
            if not m:
                continue
            node = m.group(1)
            if node not in node_site:
                found: set = set()
                for op in _node_ops(node):
                    found |= sites.get(op, set())
                node_site[node] = next(iter(found)) if len(found) == 1 else -1
            out[s] = node_site[node]
        return out
