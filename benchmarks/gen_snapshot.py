#!/usr/bin/env python3
"""Generate large, realistic PyTorch CUDA memory snapshots, streaming.

    python benchmarks/gen_snapshot.py --events 1000000 -o benchmarks/out/snap_1000000.pickle [--seed 0]

or ``from gen_snapshot import generate; generate(path, events, seed=0)``.

The output is byte for byte what ``pickle.dump(obj, f, protocol=4)`` (CPython's
C pickler) writes for the equivalent snapshot object (see ``_pickle4.py``), and
the object mirrors what ``torch.cuda.memory._dump_snapshot`` writes in torch
2.5-2.9 with ``_record_memory_history(stacks='all')``, as observed in real
files:

* top level ``{segments, device_traces, allocator_settings, external_annotations}``;
* frame dicts ``{name, filename, line}`` (that key order), one shared dict per
  unique frame, each with its own ``name`` and ``filename`` str objects (only
  the empty string, a CPython singleton, is shared); some frames with equal
  content are distinct objects (one per program counter in torch, e.g. many
  ``_PyEval_EvalFrameDefault``);
* one frames list object per traceback: an ``alloc`` entry's list is shared
  with the ``segment_alloc`` it caused and with the block/segment in
  ``segments``; ``free_requested`` and ``free_completed`` share their own list
  (the stack of the free, torch's default ``context='all'``; use
  ``free_stacks='alloc'`` for the ``context='alloc'`` layout where frees
  reuse the allocation's list);
* trace entries ``{action, addr, size, stream, time_us, frames}``; dict keys
  and action strings are shared str objects; ``external_annotations`` entries
  ``{stage, name, device, time_us}`` with fresh ``stage``/``name`` keys.

Memory stays bounded: the training loop's live set is small and the file is
written in two passes over the same deterministic simulation (pass 1 finds
the end state, which ``segments`` -- written first -- needs; pass 2 writes).
"""

from __future__ import annotations

import argparse
import bisect
import os
import random
import sys
import time

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from _pickle4 import (APPEND, APPENDS, EMPTY_DICT, EMPTY_LIST, MARK, SETITEMS,
                          Writer, enc_get, enc_int)
else:  # pragma: no cover - imported as benchmarks.gen_snapshot
    from ._pickle4 import (APPEND, APPENDS, EMPTY_DICT, EMPTY_LIST, MARK, SETITEMS,
                           Writer, enc_get, enc_int)

KiB = 1024
MiB = 1024 * 1024

# --------------------------------------------------------------------------
# strings with controlled identity


def fresh(s: str) -> str:
    """A new str object equal to ``s`` (the pickler memoizes by identity).
    '' and one-character strings are CPython singletons anyway."""
    return s.encode("utf-8").decode("utf-8")


class Keys:
    """The shared key strings (torch's C++ side interns them)."""

    NAMES = ("segments", "device_traces", "allocator_settings", "external_annotations",
             "device", "address", "total_size", "allocated_size", "active_size",
             "requested_size", "stream", "segment_type", "segment_pool_id",
             "is_expandable", "blocks", "frames", "size", "state", "name", "filename",
             "line", "action", "addr", "time_us")

    def __init__(self):
        for n in self.NAMES:
            setattr(self, n, fresh(n))


ACTIONS = ("alloc", "free_requested", "free_completed", "segment_alloc", "segment_free")

# --------------------------------------------------------------------------
# frames and stacks

SITE = "/home/user/.venv/lib/python3.11/site-packages/torch"
TRAIN = "/home/user/proj/train.py"
MODEL = "/home/user/proj/model.py"
MODULE = SITE + "/nn/modules/module.py"
LINEAR = SITE + "/nn/modules/linear.py"
NORM = SITE + "/nn/modules/normalization.py"
DROPOUT = SITE + "/nn/modules/dropout.py"
SPARSE = SITE + "/nn/modules/sparse.py"
FUNC = SITE + "/nn/functional.py"
ADAMW = SITE + "/optim/adamw.py"
OPTIM = SITE + "/optim/optimizer.py"
AUTOGRAD = SITE + "/autograd/__init__.py"
GRAPH = SITE + "/autograd/graph.py"
TENSOR = SITE + "/_tensor.py"
CUDAMEM = SITE + "/cuda/memory.py"
CONTEXTLIB = SITE + "/utils/_contextlib.py"
FOREACH = SITE + "/utils/_foreach_utils.py"

ALLOC_PREFIX = (
    ("torch::unwind::unwind()", "??"),
    ("torch::CapturedTraceback::gather(bool, bool, bool)", "??"),
    ("torch::cuda::(anonymous namespace)::gather_with_cpp()", "memory_snapshot.cpp"),
    ("c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(signed char, "
     "unsigned long, CUstream_st*)", "CUDACachingAllocator.cpp"),
    ("c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator::malloc(void**, signed "
     "char, unsigned long, CUstream_st*)", ""),
    ("c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator::allocate(unsigned long)", ""),
    ("at::TensorBase at::detail::_empty_generic<long>(c10::ArrayRef<long>, c10::Allocator*, "
     "c10::DispatchKeySet, c10::ScalarType, std::optional<c10::MemoryFormat>)", ""),
    ("at::detail::empty_generic(c10::ArrayRef<long>, c10::Allocator*, c10::DispatchKeySet, "
     "c10::ScalarType, std::optional<c10::MemoryFormat>)", "??"),
    ("at::detail::empty_cuda(c10::ArrayRef<long>, c10::TensorOptions const&)", "??"),
)
FREE_PREFIX = (
    ("torch::unwind::unwind()", "??"),
    ("torch::CapturedTraceback::gather(bool, bool, bool)", "??"),
    ("torch::cuda::(anonymous namespace)::gather_with_cpp()", "memory_snapshot.cpp"),
    ("c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::free(c10::cuda::"
     "CUDACachingAllocator::Native::(anonymous namespace)::Block*)", "CUDACachingAllocator.cpp"),
    ("c10::cuda::CUDACachingAllocator::Native::local_raw_delete(void*)", "CUDACachingAllocator.cpp"),
    ("c10::StorageImpl::~StorageImpl()", ""),
    ("c10::intrusive_ptr<c10::StorageImpl, c10::detail::intrusive_target_default_null_type<"
     "c10::StorageImpl> >::reset_()", ""),
    ("c10::TensorImpl::~TensorImpl()", "??"),
    ("c10::TensorImpl::~TensorImpl() [clone .localalias]", "TensorImpl.cpp"),
)
PY_DEALLOC = (
    ("THPVariable_subclass_clear(THPVariable*)", "python_variable.cpp"),
    ("THPVariable_subclass_dealloc(_object*)", "??"),
)
INTERP_TAIL = (
    ("PyEval_EvalCode", "??"), ("run_mod.llvm.9196888086361497952", "??"),
    ("_PyRun_SimpleFileObject", "??"), ("Py_RunMain", "??"),
    ("__libc_start_main", "??"), ("_start", "??"),
)
THREAD_TAIL = (
    ("torch::autograd::Engine::evaluate_function(std::shared_ptr<torch::autograd::GraphTask>&, "
     "torch::autograd::Node*, torch::autograd::InputBuffer&, std::shared_ptr<torch::autograd::"
     "ReadyQueue> const&)", "??"),
    ("torch::autograd::Engine::thread_main(std::shared_ptr<torch::autograd::GraphTask> const&)", "??"),
    ("torch::autograd::Engine::thread_init(int, std::shared_ptr<torch::autograd::ReadyQueue> "
     "const&, bool)", "??"),
    ("torch::autograd::python::PythonEngine::thread_init(int, std::shared_ptr<torch::autograd::"
     "ReadyQueue> const&, bool)", "??"),
    ("execute_native_thread_routine", "thread48.o"),
    ("start_thread", "??"),
    ("clone", "??"),
)
OP_SIGS = {
    "mm": "at::Tensor const&, at::Tensor const&",
    "addmm": "at::Tensor const&, at::Tensor const&, at::Tensor const&, c10::Scalar const&, c10::Scalar const&",
    "bmm": "at::Tensor const&, at::Tensor const&",
    "add": "at::Tensor const&, at::Tensor const&, c10::Scalar const&",
    "mul": "at::Tensor const&, at::Tensor const&",
    "div": "at::Tensor const&, at::Tensor const&",
    "gelu": "at::Tensor const&, c10::basic_string_view<char>",
    "silu": "at::Tensor const&",
    "silu_backward": "at::Tensor const&, at::Tensor const&",
    "gelu_backward": "at::Tensor const&, at::Tensor const&, c10::basic_string_view<char>",
    "native_layer_norm": "at::Tensor const&, c10::ArrayRef<c10::SymInt>, std::optional<at::Tensor> const&, std::optional<at::Tensor> const&, double",
    "native_layer_norm_backward": "at::Tensor const&, at::Tensor const&, c10::ArrayRef<c10::SymInt>, at::Tensor const&, at::Tensor const&, std::optional<at::Tensor> const&, std::optional<at::Tensor> const&, std::array<bool, 3ul>",
    "native_dropout": "at::Tensor const&, double, std::optional<bool>",
    "native_dropout_backward": "at::Tensor const&, at::Tensor const&, double",
    "_log_softmax": "at::Tensor const&, long, bool",
    "_log_softmax_backward_data": "at::Tensor const&, at::Tensor const&, long, c10::ScalarType",
    "nll_loss_forward": "at::Tensor const&, at::Tensor const&, std::optional<at::Tensor> const&, long, c10::SymInt",
    "nll_loss_backward": "at::Tensor const&, at::Tensor const&, at::Tensor const&, std::optional<at::Tensor> const&, long, c10::SymInt, at::Tensor const&",
    "embedding": "at::Tensor const&, at::Tensor const&, c10::SymInt, bool, bool",
    "embedding_dense_backward": "at::Tensor const&, at::Tensor const&, c10::SymInt, c10::SymInt, bool",
    "_efficient_attention_forward": "at::Tensor const&, at::Tensor const&, at::Tensor const&, std::optional<at::Tensor> const&, std::optional<at::Tensor> const&, std::optional<at::Tensor> const&, std::optional<long>, std::optional<long>, double, long, bool, std::optional<double>, std::optional<at::Tensor> const&, std::optional<long>",
    "_efficient_attention_backward": "at::Tensor const&, at::Tensor const&, at::Tensor const&, at::Tensor const&, std::optional<at::Tensor> const&, at::Tensor const&, at::Tensor const&, at::Tensor const&, double, bool",
    "softmax": "at::Tensor const&, long, std::optional<c10::ScalarType>",
    "topk": "at::Tensor const&, c10::SymInt, long, bool, bool",
    "index": "at::Tensor const&, c10::List<std::optional<at::Tensor> > const&",
    "index_add": "at::Tensor const&, long, at::Tensor const&, at::Tensor const&, c10::Scalar const&",
    "sum": "at::Tensor const&, c10::OptionalArrayRef<long>, bool, std::optional<c10::ScalarType>",
    "zeros_like": "at::Tensor const&, std::optional<c10::ScalarType>, std::optional<c10::Layout>, std::optional<c10::Device>, std::optional<bool>, std::optional<c10::MemoryFormat>",
    "ones_like": "at::Tensor const&, std::optional<c10::ScalarType>, std::optional<c10::Layout>, std::optional<c10::Device>, std::optional<bool>, std::optional<c10::MemoryFormat>",
    "_to_copy": "at::Tensor const&, std::optional<c10::ScalarType>, std::optional<c10::Layout>, std::optional<c10::Device>, std::optional<bool>, bool, std::optional<c10::MemoryFormat>",
    "_foreach_sqrt": "c10::ArrayRef<at::Tensor>",
    "_foreach_div": "c10::ArrayRef<at::Tensor>, c10::ArrayRef<c10::Scalar>",
    "_foreach_mul": "c10::ArrayRef<at::Tensor>, c10::ArrayRef<at::Tensor>",
    "argsort": "at::Tensor const&, bool, long, bool",
    "clone": "at::Tensor const&, std::optional<c10::MemoryFormat>",
}
STRUCTURED = {"silu", "silu_backward", "mm", "addmm", "bmm", "add", "mul", "div", "gelu", "gelu_backward", "_log_softmax",
              "_log_softmax_backward_data", "nll_loss_forward", "nll_loss_backward", "softmax",
              "topk", "index", "index_add", "sum"}


def _op_chain(op: str, h: int):
    """C++ frames between the allocator and the caller for one aten op."""
    sig = OP_SIGS[op]
    reg = "RegisterCUDA.cpp"
    out = []
    if op in STRUCTURED:
        out.append(("at::(anonymous namespace)::create_out(c10::ArrayRef<long>, c10::ArrayRef<long>, "
                    "c10::TensorOptions const&)", reg))
        out.append((f"at::(anonymous namespace)::structured_{op}_out_functional::set_output_raw_strided("
                    "long, c10::ArrayRef<long>, c10::ArrayRef<long>, c10::TensorOptions, "
                    "c10::ArrayRef<at::Dimname>)", reg))
    elif op.startswith("_foreach"):
        out.append((f"at::native::foreach_tensor_{op[9:]}_cuda({sig})", "??"))
    else:
        out.append((f"at::native::{op}_cuda({sig})", "??"))
    out.append((f"at::(anonymous namespace)::wrapper_CUDA_{op}({sig})", reg))
    out.append(("c10::impl::wrap_kernel_functor_unboxed_<c10::impl::detail::WrapFunctionIntoFunctor_<"
                f"c10::CompileTimeFunctionPointer<at::Tensor ({sig}), &at::(anonymous namespace)::"
                f"wrapper_CUDA_{op}>, at::Tensor, c10::guts::typelist::typelist<{sig}> >, at::Tensor "
                f"({sig})>::call(c10::OperatorKernel*, c10::DispatchKeySet, {sig})", reg))
    out.append((f"at::_ops::{op}::redispatch(c10::DispatchKeySet, {sig})", "??"))
    out.append((f"torch::autograd::VariableType::(anonymous namespace)::{op}(c10::DispatchKeySet, {sig})",
                f"VariableType_{h % 5}.cpp"))
    out.append((f"at::_ops::{op}::call({sig})", "??"))
    return out


class Catalog:
    """Unique frames (specs) and stacks (tuples of frame ids), interned in
    creation order, so that both simulation passes see the same ids."""

    def __init__(self):
        self.frames = []         # (name, filename, line)
        self._fidx = {}
        self.stacks = []         # tuple of frame ids, innermost first
        self._sidx = {}

    def f(self, name, filename, line=0, variant=0):
        key = (name, filename, line, variant)
        i = self._fidx.get(key)
        if i is None:
            i = self._fidx[key] = len(self.frames)
            self.frames.append((name, filename, line))
        return i

    def _intern(self, key, build):
        i = self._sidx.get(key)
        if i is None:
            i = self._sidx[key] = len(self.stacks)
            self.stacks.append(tuple(build()))
        return i

    def _py(self, ctx):
        """Python frames (ctx is outermost first) interleaved with the
        interpreter's C frames, innermost first, then the process tail."""
        f = self.f
        out = []
        inner = list(reversed(ctx))
        module_frame = None
        if inner and inner[-1][0] == "<module>":
            module_frame = inner.pop()
        for name, fn, line in inner:
            out.append(f(name, fn, line))
            # one _PyEval_EvalFrameDefault per call site (distinct frame
            # objects with equal content, as torch reports one per PC)
            out.append(f("_PyEval_EvalFrameDefault", "??", 0, variant=(line * 7 + len(fn)) % 6))
            if name == "forward":
                out.append(f("slot_tp_call", "??"))
        for name, fn in INTERP_TAIL:
            out.append(f(name, fn))
        if module_frame is not None:
            out.append(f(*module_frame))
        return out

    def alloc(self, op, ctx, via="python"):
        """Allocation inside aten op ``op`` called from Python context ``ctx``."""
        def build():
            f = self.f
            out = [f(n, fn) for n, fn in ALLOC_PREFIX]
            h = sum(map(ord, op))
            out += [f(n, fn) for n, fn in _op_chain(op, h)]
            out.append(f(f"torch::autograd::THPVariable_{op.lstrip('_')}(_object*, _object*, _object*)",
                         f"python_torch_functions_{h % 3}.cpp"))
            out += self._py(ctx)
            return out
        return self._intern(("a", op, tuple(ctx)), build)

    def alloc_bw(self, op, node):
        """Allocation in aten op ``op`` run by autograd node ``node`` on the
        autograd device thread (no Python frames)."""
        def build():
            f = self.f
            out = [f(n, fn) for n, fn in ALLOC_PREFIX]
            out += [f(n, fn) for n, fn in _op_chain(op, sum(map(ord, node)))]
            out.append(f(f"torch::autograd::generated::{node}::apply(std::vector<at::Tensor, "
                         "std::allocator<at::Tensor> >&&)", "??"))
            out.append(f("torch::autograd::Node::operator()(std::vector<at::Tensor, "
                         "std::allocator<at::Tensor> >&&)", ""))
            out += [f(n, fn) for n, fn in THREAD_TAIL]
            return out
        return self._intern(("b", op, node), build)

    def free_py(self, ctx, via=PY_DEALLOC):
        """A tensor freed when its last Python reference goes away."""
        def build():
            f = self.f
            out = [f(n, fn) for n, fn in FREE_PREFIX]
            out += [f(n, fn) for n, fn in via]
            out += self._py(ctx)
            return out
        return self._intern(("f", tuple(ctx), via), build)

    def free_bw(self, node, what="release_variables"):
        """A saved tensor or gradient released by the autograd engine."""
        def build():
            f = self.f
            out = [f(n, fn) for n, fn in FREE_PREFIX]
            if what == "release_variables":
                out.append(f("torch::autograd::SavedVariable::reset_data()", "saved_variable.cpp"))
                out.append(f(f"torch::autograd::generated::{node}::release_variables()", "Functions.h"))
            else:
                out.append(f("std::vector<at::Tensor, std::allocator<at::Tensor> >::~vector()", "??"))
                out.append(f(f"torch::autograd::generated::{node}::apply(std::vector<at::Tensor, "
                             "std::allocator<at::Tensor> >&&)", "??"))
            out += [f(n, fn) for n, fn in THREAD_TAIL]
            return out
        return self._intern(("g", node, what), build)


# --------------------------------------------------------------------------
# the caching allocator (a faithful-enough model of CUDACachingAllocator)

SMALL_SIZE = 1 * MiB
SMALL_BUFFER = 2 * MiB
LARGE_BUFFER = 20 * MiB
MIN_LARGE_ALLOC = 10 * MiB
ROUND_LARGE = 2 * MiB


def round_size(n: int) -> int:
    return 512 if n < 512 else (n + 511) // 512 * 512


class Allocator:
    """Blocks are lists ``[addr, size, seg, allocated, req, seq, stack, lm]``:
    ``seq`` numbers allocations (the identity of their frames list), ``lm`` is
    the writer's memo index of that list (pass 2), ``seg`` the segment record
    ``[addr, size, is_small, trig_seq, trig_stack]``."""

    def __init__(self, base: int):
        self.next_addr = base
        self.blocks = {}             # addr -> block
        self.ends = {}               # end addr -> block
        self.free_small = []         # sorted (size, addr)
        self.free_large = []
        self.segments = {}           # addr -> segment
        self.released = {}           # size -> [addr] reusable virtual ranges

    def _new_segment(self, size, small, trig_seq, trig_stack):
        pool = self.released.get(size)
        if pool:
            addr = pool.pop()
        else:
            addr = self.next_addr
            # cudaMalloc leaves gaps between unrelated segments
            self.next_addr += size + (0 if size % ROUND_LARGE == 0 and len(self.segments) % 3 else ROUND_LARGE)
            self.next_addr = (self.next_addr + ROUND_LARGE - 1) // ROUND_LARGE * ROUND_LARGE
        seg = [addr, size, small, trig_seq, trig_stack]
        self.segments[addr] = seg
        blk = [addr, size, seg, False, 0, -1, -1, -1]
        self.blocks[addr] = blk
        self.ends[addr + size] = blk
        return seg, blk

    def malloc(self, req, seq, stack):
        """Returns (block, new_segment or None)."""
        rounded = round_size(req)
        small = rounded <= SMALL_SIZE
        fl = self.free_small if small else self.free_large
        i = bisect.bisect_left(fl, (rounded, 0))
        seg = None
        if i < len(fl):
            size, addr = fl.pop(i)
            blk = self.blocks[addr]
        else:
            if small:
                ssize = SMALL_BUFFER
            elif rounded < MIN_LARGE_ALLOC:
                ssize = LARGE_BUFFER
            else:
                ssize = (rounded + ROUND_LARGE - 1) // ROUND_LARGE * ROUND_LARGE
            seg, blk = self._new_segment(ssize, small, seq, stack)
            size = ssize
        remaining = size - rounded
        if (small and remaining >= 512) or (not small and remaining > SMALL_SIZE):
            addr = blk[0]
            rest = [addr + rounded, remaining, blk[2], False, 0, -1, -1, -1]
            blk[1] = rounded
            self.ends[addr + rounded] = blk
            self.blocks[addr + rounded] = rest
            self.ends[addr + size] = rest
            bisect.insort(fl, (remaining, addr + rounded))
        blk[3] = True
        blk[4] = req
        blk[5] = seq
        blk[6] = stack
        return blk, seg

    def _unlist(self, fl, blk):
        i = bisect.bisect_left(fl, (blk[1], blk[0]))
        del fl[i]

    def free(self, blk):
        blk[3] = False
        seg = blk[2]
        fl = self.free_small if seg[2] else self.free_large
        addr, size = blk[0], blk[1]
        seg_end = seg[0] + seg[1]
        nxt = self.blocks.get(addr + size) if addr + size < seg_end else None
        if nxt is not None and not nxt[3]:
            self._unlist(fl, nxt)
            del self.blocks[nxt[0]]
            del self.ends[addr + size]
            size += nxt[1]
        prv = self.ends.get(addr) if addr > seg[0] else None
        if prv is not None and not prv[3]:
            self._unlist(fl, prv)
            del self.blocks[addr]
            del self.ends[addr]
            addr = prv[0]
            size += prv[1]
            blk = prv
        blk[1] = size
        self.ends[addr + size] = blk
        bisect.insort(fl, (size, addr))

    def releasable(self):
        """Segments whose whole range is one free block, by address."""
        out = []
        for addr in sorted(self.segments):
            seg = self.segments[addr]
            blk = self.blocks[addr]
            if not blk[3] and blk[1] == seg[1]:
                out.append(seg)
        return out

    def release(self, seg):
        addr, size = seg[0], seg[1]
        blk = self.blocks.pop(addr)
        del self.ends[addr + size]
        self._unlist(self.free_small if seg[2] else self.free_large, blk)
        del self.segments[addr]
        self.released.setdefault(size, []).append(addr)

    def end_state(self):
        segs = []
        for addr in sorted(self.segments):
            seg = self.segments[addr]
            blocks = []
            a, end = addr, addr + seg[1]
            while a < end:
                b = self.blocks[a]
                blocks.append((b[0], b[1], b[4], b[3], b[5], b[6]))
                a += b[1]
            segs.append((seg, blocks))
        return segs


# --------------------------------------------------------------------------
# the training program


class Program:
    """A GPT-style model trained with AdamW, as a deterministic stream of ops:

    ``('a', handle, size, stack, dt)``  allocation
    ``('f', handle, stack, dt)``        free (free_requested + free_completed)
    ``('n', name, stage, dt)``          external annotation
    ``('e', stack, dt)``                torch.cuda.empty_cache()
    """

    def __init__(self, seed: int, cat: Catalog):
        self.rng = random.Random(seed)
        self.cat = cat
        r = self.rng
        self.B = 8
        self.S = r.choice((256, 512, 512, 1024))
        self.D = r.choice((768, 1024, 1024, 1280))
        self.H = 16
        self.V = 32000
        self.L = r.randrange(6, 11)
        self.E = 4                               # experts in MoE blocks
        self.eval_every = 50
        self.h = 0
        self.ops = []
        self.pretrace = []                       # (handle, size) live before recording

    # -- helpers -----------------------------------------------------------
    def dt(self, lo=0, hi=30):
        return self.rng.randint(lo, hi)

    def A(self, size, stack, dt=None):
        self.h += 1
        self.ops.append(("a", self.h, size, stack, self.dt() if dt is None else dt))
        return self.h

    def F(self, h, stack, dt=None):
        self.ops.append(("f", h, stack, self.dt() if dt is None else dt))

    def N(self, name, stage, dt=None):
        self.ops.append(("n", name, stage, self.dt(1, 20) if dt is None else dt))

    # -- contexts ----------------------------------------------------------
    BASE = (("<module>", TRAIN, 241), ("main", TRAIN, 230))
    MCALL = (("_wrapped_call_impl", MODULE, 1739), ("_call_impl", MODULE, 1750))

    def step_ctx(self, line):
        return self.BASE + (("train_step", TRAIN, line),)

    # -- the model ----------------------------------------------------------
    def params(self):
        if getattr(self, "_params", None) is None:
            self._params = self._make_params()
        return self._params

    def _make_params(self):
        D, V = self.D, self.V
        ps = [("wte", V * D * 4, ("embedding",))]
        for i in range(self.L):
            moe = i % 2 == 1
            ps += [(f"h{i}.ln_1.weight", D * 4, ()), (f"h{i}.ln_1.bias", D * 4, ()),
                   (f"h{i}.attn.c_attn.weight", 3 * D * D * 4, ()), (f"h{i}.attn.c_attn.bias", 3 * D * 4, ()),
                   (f"h{i}.attn.c_proj.weight", D * D * 4, ()), (f"h{i}.attn.c_proj.bias", D * 4, ()),
                   (f"h{i}.ln_2.weight", D * 4, ()), (f"h{i}.ln_2.bias", D * 4, ())]
            if moe:
                ps.append((f"h{i}.moe.router.weight", self.E * D * 4, ()))
                for e in range(self.E):
                    ps += [(f"h{i}.moe.experts.{e}.c_fc.weight", 2 * D * D * 4, ()),
                           (f"h{i}.moe.experts.{e}.c_proj.weight", 2 * D * D * 4, ())]
            elif (i // 2) % 2:
                hid = (8 * D // 3 + 255) // 256 * 256
                ps += [(f"h{i}.mlp.w_gate.weight", hid * D * 4, ()), (f"h{i}.mlp.w_up.weight", hid * D * 4, ()),
                       (f"h{i}.mlp.w_down.weight", hid * D * 4, ())]
            else:
                ps += [(f"h{i}.mlp.c_fc.weight", 4 * D * D * 4, ()), (f"h{i}.mlp.c_fc.bias", 4 * D * 4, ()),
                       (f"h{i}.mlp.c_proj.weight", 4 * D * D * 4, ()), (f"h{i}.mlp.c_proj.bias", D * 4, ())]
        ps += [("ln_f.weight", D * 4, ()), ("ln_f.bias", D * 4, ()), ("lm_head.weight", V * D * 4, ())]
        return ps

    def run(self):
        """Yields lists of ops, phase by phase, forever."""
        cat = self.cat
        ps = self.params()
        # weights loaded before _record_memory_history(): the embedding and
        # the head, plus a cached batch freed during the first iteration
        self.param_h = {}
        for name, size, _ in ps:
            if name in ("wte", "lm_head.weight"):
                self.h += 1
                self.pretrace.append((self.h, size))
                self.param_h[name] = self.h
        self.h += 1
        self.stale_batch = self.h
        self.pretrace.append((self.h, self.B * self.S * 8))
        # model.to('cuda') for the rest
        apply_ctx = self.BASE[:1] + (("main", TRAIN, 214), ("to", MODULE, 1355))
        for depth in range(1, 4):
            apply_ctx += (("_apply", MODULE, 915 if depth < 3 else 942),)
        s_to = cat.alloc("_to_copy", apply_ctx + (("convert", MODULE, 1341),))
        for name, size, _ in ps:
            if name not in self.param_h:
                self.param_h[name] = self.A(size, s_to, self.dt(20, 400))
        yield self.flush()
        it = 0
        while True:
            self.iteration(it)
            yield self.flush()
            if it % self.eval_every == self.eval_every - 1:
                self.evaluate()
                yield self.flush()
            it += 1

    def flush(self):
        ops, self.ops = self.ops, []
        return ops

    # forward pieces: each returns output handle(s); `saved` collects
    # (handle, node) freed in backward in reverse order
    def layer_norm(self, ctx, tokens, saved, train):
        cat = self.cat
        c = ctx + self.MCALL + (("forward", NORM, 217), ("layer_norm", FUNC, 2910))
        s = cat.alloc("native_layer_norm", c)
        out = self.A(tokens * self.D * 4, s)
        mean = self.A(tokens * 4, s, 0)
        rstd = self.A(tokens * 4, s, 0)
        if train:
            saved += [(mean, "NativeLayerNormBackward0"), (rstd, "NativeLayerNormBackward0")]
        else:
            self.F(mean, cat.free_py(c))
            self.F(rstd, cat.free_py(c))
        return out

    def dropout(self, ctx, x, numel, train):
        """Returns (out, mask); in eval dropout is the identity."""
        cat = self.cat
        if not train:
            return x, None
        c = ctx + self.MCALL + (("forward", DROPOUT, 70), ("dropout", FUNC, 1425))
        s = cat.alloc("native_dropout", c)
        out = self.A(numel * 4, s)
        mask = self.A(numel, s, 0)
        return out, mask

    def block(self, i, ctx, x, train, saved):
        """One transformer block; ``x`` is the residual stream handle."""
        cat = self.cat
        B, S, D, H = self.B, self.S, self.D, self.H
        T = B * S
        moe = i % 2 == 1
        bctx = ctx + self.MCALL + (("forward", MODEL, 171 if moe else 131),)
        fr = lambda line: cat.free_py(bctx[:-1] + (("forward", MODEL, line),))  # noqa: E731
        # attention: three classes (global, sliding-window with a mask,
        # ALiBi with a bias) at different lines of model.py
        akind = i % 3
        ab = (74, 104, 134)[akind]
        ln1 = self.layer_norm(bctx[:-1] + (("forward", MODEL, 128 if not moe else 168),), T, saved, train)
        actx = bctx[:-1] + (("forward", MODEL, 129 if not moe else 169),) + self.MCALL + (("forward", MODEL, ab + 8),)
        qkv = self.A(T * 3 * D * 4, cat.alloc("addmm", actx[:-1] + (("forward", MODEL, ab),) + self.MCALL + (("forward", LINEAR, 125),)))
        extra = None
        if akind == 1:
            extra = self.A(S * S, cat.alloc("ones_like", actx[:-1] + (("forward", MODEL, ab + 3),) + (("_window_mask", MODEL, 61),)))
        elif akind == 2:
            extra = self.A(H * S * S * 4, cat.alloc("mul", actx[:-1] + (("forward", MODEL, ab + 3),) + (("_alibi_bias", MODEL, 66),)))
        sctx = actx[:-1] + (("forward", MODEL, ab + 5),)
        s_sdpa = cat.alloc("_efficient_attention_forward", sctx)
        y = self.A(T * D * 4, s_sdpa)
        lse = self.A(B * H * ((S + 31) // 32 * 32) * 4, s_sdpa, 0)
        ws = self.A(B * H * 64 * 4, s_sdpa, 0)               # kernel workspace
        self.F(ws, cat.free_py(sctx), 1)
        if extra is not None and (akind == 1 or not train):
            self.F(extra, cat.free_py(actx[:-1] + (("forward", MODEL, ab + 6),)))
        proj = self.A(T * D * 4, cat.alloc("addmm", actx[:-1] + (("forward", MODEL, ab + 7),) + self.MCALL + (("forward", LINEAR, 125),)))
        d1, m1 = self.dropout(actx[:-1] + (("forward", MODEL, ab + 7),), proj, T * D, train)
        if train:
            self.F(proj, cat.free_py(actx[:-1] + (("forward", MODEL, ab + 8),)))
            saved += [(ln1, "AddmmBackward0"), (qkv, "ScaledDotProductEfficientAttentionBackward0"),
                      (y, "AddmmBackward0"), (lse, "ScaledDotProductEfficientAttentionBackward0"),
                      (m1, "NativeDropoutBackward0")]
            if akind == 2:
                saved.append((extra, "ScaledDotProductEfficientAttentionBackward0"))
        else:
            self.F(ln1, fr(129))
            self.F(qkv, cat.free_py(sctx))
            self.F(y, cat.free_py(actx[:-1] + (("forward", MODEL, ab + 7),)))
            self.F(lse, cat.free_py(sctx))
        x2 = self.A(T * D * 4, cat.alloc("add", bctx[:-1] + (("forward", MODEL, 169 if moe else 129),)))
        self.F(d1, fr(130))
        if not train:
            self.F(x, fr(130))
        # feed forward
        ln2 = self.layer_norm(bctx[:-1] + (("forward", MODEL, 130 if not moe else 170),), T, saved, train)
        if not moe and (i // 2) % 2 == 0:
            mctx = bctx[:-1] + (("forward", MODEL, 131),) + self.MCALL + (("forward", MODEL, 102),)
            fc = self.A(T * 4 * D * 4, cat.alloc("addmm", mctx[:-1] + (("forward", MODEL, 99),) + self.MCALL + (("forward", LINEAR, 125),)))
            g = self.A(T * 4 * D * 4, cat.alloc("gelu", mctx[:-1] + (("forward", MODEL, 100),) + self.MCALL + (("forward", SITE + "/nn/modules/activation.py", 734),)))
            if not train:
                self.F(fc, cat.free_py(mctx[:-1] + (("forward", MODEL, 100),)))
            p2 = self.A(T * D * 4, cat.alloc("addmm", mctx[:-1] + (("forward", MODEL, 101),) + self.MCALL + (("forward", LINEAR, 125),)))
            if not train:
                self.F(g, cat.free_py(mctx[:-1] + (("forward", MODEL, 101),)))
            d2, m2 = self.dropout(mctx[:-1] + (("forward", MODEL, 102),), p2, T * D, train)
            if train:
                self.F(p2, cat.free_py(mctx[:-1] + (("forward", MODEL, 102),)))
                saved += [(ln2, "AddmmBackward0"), (fc, "GeluBackward0"), (g, "AddmmBackward0"),
                          (m2, "NativeDropoutBackward0")]
            else:
                self.F(ln2, fr(131))
        elif not moe:
            # SwiGLU
            hid = (8 * D // 3 + 255) // 256 * 256
            mctx = bctx[:-1] + (("forward", MODEL, 131),) + self.MCALL + (("forward", MODEL, 122),)
            lin = lambda line: mctx[:-1] + (("forward", MODEL, line),) + self.MCALL + (("forward", LINEAR, 125),)  # noqa: E731
            gate = self.A(T * hid * 4, cat.alloc("mm", lin(118)))
            up = self.A(T * hid * 4, cat.alloc("mm", lin(119)))
            act = self.A(T * hid * 4, cat.alloc("silu", mctx[:-1] + (("forward", MODEL, 120),) + (("silu", FUNC, 2102),)))
            prod = self.A(T * hid * 4, cat.alloc("mul", mctx[:-1] + (("forward", MODEL, 120),)))
            if not train:
                for t_ in (gate, up, act):
                    self.F(t_, cat.free_py(mctx[:-1] + (("forward", MODEL, 120),)))
            p2 = self.A(T * D * 4, cat.alloc("mm", lin(121)))
            d2, m2 = self.dropout(mctx[:-1] + (("forward", MODEL, 122),), p2, T * D, train)
            if train:
                self.F(p2, cat.free_py(mctx[:-1] + (("forward", MODEL, 122),)))
                saved += [(ln2, "MmBackward0"), (gate, "SiluBackward0"), (up, "MulBackward0"),
                          (act, "MulBackward0"), (prod, "MmBackward0"), (m2, "NativeDropoutBackward0")]
            else:
                self.F(prod, cat.free_py(mctx[:-1] + (("forward", MODEL, 122),)))
                self.F(ln2, fr(131))
        else:
            mctx = bctx[:-1] + (("forward", MODEL, 171),) + self.MCALL + (("forward", MODEL, 57),)
            r = self.rng
            logits = self.A(T * self.E * 4, cat.alloc("mm", mctx[:-1] + (("forward", MODEL, 44),) + self.MCALL + (("forward", LINEAR, 125),)))
            probs = self.A(T * self.E * 4, cat.alloc("softmax", mctx[:-1] + (("forward", MODEL, 45),) + (("softmax", FUNC, 2140),)))
            s_topk = cat.alloc("topk", mctx[:-1] + (("forward", MODEL, 46),))
            topv = self.A(T * 2 * 4, s_topk)
            topi = self.A(T * 2 * 8, s_topk, 0)
            self.F(logits, cat.free_py(mctx[:-1] + (("forward", MODEL, 46),)))
            out = self.A(T * D * 4, cat.alloc("zeros_like", mctx[:-1] + (("forward", MODEL, 48),)))
            counts = [r.randint(T // 4, T * 3 // 4) for _ in range(self.E)]
            ectx = mctx[:-1] + (("forward", MODEL, 53),) + self.MCALL + (("forward", MODEL, 28),)
            for e in range(self.E):
                n = counts[e]
                idx = self.A(n * 8, cat.alloc("index", mctx[:-1] + (("forward", MODEL, 51),)))
                xe = self.A(n * D * 4, cat.alloc("index", mctx[:-1] + (("forward", MODEL, 52),)))
                h1 = self.A(n * 2 * D * 4, cat.alloc("mm", ectx[:-1] + (("forward", MODEL, 25),) + self.MCALL + (("forward", LINEAR, 125),)))
                g1 = self.A(n * 2 * D * 4, cat.alloc("gelu", ectx[:-1] + (("forward", MODEL, 26),) + (("gelu", FUNC, 1735),)))
                o = self.A(n * D * 4, cat.alloc("mm", ectx[:-1] + (("forward", MODEL, 27),) + self.MCALL + (("forward", LINEAR, 125),)))
                w = self.A(n * D * 4, cat.alloc("mul", mctx[:-1] + (("forward", MODEL, 54),)))
                self.F(o, cat.free_py(mctx[:-1] + (("forward", MODEL, 54),)))
                new_out = self.A(T * D * 4, cat.alloc("index_add", mctx[:-1] + (("forward", MODEL, 55),)))
                if train:
                    saved += [(idx, "IndexAddBackward0"), (xe, "MmBackward0"), (h1, "GeluBackward0"),
                              (g1, "MmBackward0"), (w, "IndexAddBackward0")]
                    self.F(out, cat.free_py(mctx[:-1] + (("forward", MODEL, 55),)))
                else:
                    for t in (idx, xe, h1, g1, w, out):
                        self.F(t, cat.free_py(mctx[:-1] + (("forward", MODEL, 55),)))
                out = new_out
            if train:
                saved += [(ln2, "MmBackward0"), (probs, "SoftmaxBackward0"), (topv, "TopkBackward0"),
                          (topi, "IndexBackward0")]
            else:
                for t in (ln2, probs, topv, topi):
                    self.F(t, cat.free_py(mctx[:-1] + (("forward", MODEL, 57),)))
            d2, m2 = self.dropout(mctx[:-1] + (("forward", MODEL, 57),), out, T * D, train)
            if train:
                self.F(out, cat.free_py(mctx[:-1] + (("forward", MODEL, 57),)))
                saved.append((m2, "NativeDropoutBackward0"))
        x3 = self.A(T * D * 4, cat.alloc("add", bctx[:-1] + (("forward", MODEL, 171 if moe else 131),)))
        self.F(d2, fr(132))
        if train:
            saved += [(x, "NativeLayerNormBackward0"), (x2, "NativeLayerNormBackward0")]
        else:
            self.F(x2, fr(132))
        return x3

    def forward(self, ctx, train):
        """Returns (loss handle, saved list, extra handles freed at the end)."""
        cat = self.cat
        T = self.B * self.S
        saved = []
        gctx = ctx + self.MCALL + (("forward", MODEL, 205),)
        # inputs
        ictx = ctx[:-1] + ((ctx[-1][0], TRAIN, ctx[-1][2] - 3),)
        s_in = cat.alloc("_to_copy", ictx)
        ids = self.A(T * 8, s_in, self.dt(50, 500))
        labels = self.A(T * 8, s_in)
        emb = self.A(T * self.D * 4, cat.alloc("embedding", gctx[:-1] + (("forward", MODEL, 196),) + self.MCALL +
                                               (("forward", SPARSE, 190), ("embedding", FUNC, 2551))))
        x = emb
        for i in range(self.L):
            x = self.block(i, gctx[:-1] + (("forward", MODEL, 199),), x, train, saved)
        lnf = self.layer_norm(gctx[:-1] + (("forward", MODEL, 200),), T, saved, train)
        if not train:
            self.F(x, cat.free_py(gctx[:-1] + (("forward", MODEL, 201),)))
        lctx = gctx[:-1] + (("forward", MODEL, 201),) + self.MCALL + (("forward", LINEAR, 125),)
        logits = self.A(T * self.V * 4, cat.alloc("mm", lctx))
        cctx = gctx[:-1] + (("forward", MODEL, 203),) + (("cross_entropy", FUNC, 3494),)
        logp = self.A(T * self.V * 4, cat.alloc("_log_softmax", cctx))
        self.F(logits, cat.free_py(cctx))
        s_nll = cat.alloc("nll_loss_forward", cctx)
        loss = self.A(4, s_nll)
        tw = self.A(4, s_nll, 0)
        if train:
            saved += [(ids, "EmbeddingBackward0"), (x, "NativeLayerNormBackward0"), (lnf, "MmBackward0"),
                      (logp, "LogSoftmaxBackward0"), (labels, "NllLossBackward0"), (tw, "NllLossBackward0")]
            return loss, saved, []
        for t in (lnf, logp, tw, ids, labels):
            self.F(t, cat.free_py(cctx))
        return loss, saved, []

    def backward(self, ctx, loss, saved, grads):
        cat = self.cat
        T = self.B * self.S
        D = self.D
        bctx = ctx + (("backward", TENSOR, 626), ("backward", AUTOGRAD, 347), ("_engine_run_backward", GRAPH, 823))
        g = self.A(4, cat.alloc("ones_like", bctx), self.dt(100, 2000))
        # nll / log_softmax backward
        gl = self.A(T * self.V * 4, cat.alloc_bw("nll_loss_backward", "NllLossBackward0"))
        self.F(g, cat.free_bw("NllLossBackward0", "grad"))
        gx = self.A(T * self.V * 4, cat.alloc_bw("_log_softmax_backward_data", "LogSoftmaxBackward0"))
        self.F(gl, cat.free_bw("LogSoftmaxBackward0", "grad"))
        cur = self.A(T * D * 4, cat.alloc_bw("mm", "MmBackward0"))
        # the gradient of the head weight
        grads.append(self.A(self.V * D * 4, cat.alloc_bw("mm", "MmBackward0"), 0))
        self.F(gx, cat.free_bw("MmBackward0", "grad"))
        # saved activations are released in reverse order, interleaved with
        # gradient computations of the matching nodes
        ps = self.params()
        pgrad = [(n, s) for n, s, _ in ps[1:-1]][::-1]
        k = 0
        for h, node in reversed(saved):
            self.F(h, cat.free_bw(node))
            if node in ("AddmmBackward0", "MmBackward0", "NativeLayerNormBackward0", "GeluBackward0",
                        "NativeDropoutBackward0", "ScaledDotProductEfficientAttentionBackward0",
                        "SiluBackward0", "MulBackward0"):
                op = {"SiluBackward0": "silu_backward", "MulBackward0": "mul", "AddmmBackward0": "mm", "MmBackward0": "mm", "NativeLayerNormBackward0": "native_layer_norm_backward",
                      "GeluBackward0": "gelu_backward", "NativeDropoutBackward0": "native_dropout_backward",
                      "ScaledDotProductEfficientAttentionBackward0": "_efficient_attention_backward"}[node]
                new = self.A(T * D * 4, cat.alloc_bw(op, node))
                self.F(cur, cat.free_bw(node, "grad"), 0)
                cur = new
                # weight / bias gradients of this node (AccumulateGrad keeps them)
                while k < len(pgrad) and node in ("AddmmBackward0", "MmBackward0", "NativeLayerNormBackward0"):
                    name, size = pgrad[k]
                    k += 1
                    op2 = "sum" if name.endswith("bias") and node == "AddmmBackward0" else op
                    grads.append(self.A(size, cat.alloc_bw(op2, node), 0))
                    if not name.endswith("weight") or node != "AddmmBackward0" or self.rng.random() < 0.5:
                        break
        while k < len(pgrad):
            name, size = pgrad[k]
            k += 1
            grads.append(self.A(size, cat.alloc_bw("mm", "MmBackward0"), 0))
        # embedding backward: sort scratch, then the dense gradient
        s_emb = cat.alloc_bw("embedding_dense_backward", "EmbeddingBackward0")
        tmp = [self.A(T * 8, cat.alloc_bw("argsort", "EmbeddingBackward0")) for _ in range(3)]
        grads.append(self.A(self.V * D * 4, s_emb))
        for t in tmp:
            self.F(t, cat.free_bw("EmbeddingBackward0", "grad"), 0)
        self.F(cur, cat.free_bw("EmbeddingBackward0", "grad"), 0)

    def optimizer_step(self, it, grads):
        cat = self.cat
        sctx = self.step_ctx(122) + (("wrapper", OPTIM, 493), ("_use_grad", OPTIM, 89), ("step", ADAMW, 227))
        self.N("Optimizer.step#AdamW.step", "START", self.dt(50, 300))
        ps = self.params()
        if it == 0:
            s_init = cat.alloc("zeros_like", sctx[:-1] + (("step", ADAMW, 216), ("_init_group", ADAMW, 159)))
            s_init2 = cat.alloc("zeros_like", sctx[:-1] + (("step", ADAMW, 216), ("_init_group", ADAMW, 163)))
            self.state = []
            for _, size, _ in ps:
                self.state.append(self.A(size, s_init, self.dt(2, 10)))
                self.state.append(self.A(size, s_init2, 1))
        fctx = sctx + (("maybe_fallback", OPTIM, 147), ("adamw", ADAMW, 767), ("_multi_tensor_adamw", ADAMW, 590))
        # grouped by device/dtype, in chunks, foreach temporaries live together
        chunk = 24
        for c0 in range(0, len(ps), chunk):
            part = ps[c0:c0 + chunk]
            s_sqrt = cat.alloc("_foreach_sqrt", fctx[:-1] + (("_multi_tensor_adamw", ADAMW, 590),))
            s_div = cat.alloc("_foreach_div", fctx[:-1] + (("_multi_tensor_adamw", ADAMW, 598),))
            tmp = [self.A(size, s_sqrt, self.dt(0, 5)) for _, size, _ in part]
            tmp2 = [self.A(size, s_div, self.dt(0, 5)) for _, size, _ in part]
            f1 = cat.free_py(fctx[:-1] + (("_multi_tensor_adamw", ADAMW, 603),))
            for t in tmp:
                self.F(t, f1, 0)
            for t in tmp2:
                self.F(t, f1, 0)
        self.N("Optimizer.step#AdamW.step", "END", self.dt(5, 50))

    def zero_grad(self, grads):
        cat = self.cat
        zctx = self.step_ctx(115) + (("zero_grad", OPTIM, 971),)
        gap, self.sync_gap = getattr(self, "sync_gap", 0), 0
        self.N("Optimizer.zero_grad#AdamW.zero_grad", "START", gap + self.dt(50, 500))
        s = cat.free_py(zctx, via=(("torch::autograd::THPVariable_set_grad(THPVariable*, _object*, void*)",
                                    "python_variable.cpp"), ("getset_set", "??")))
        for h in grads:
            self.F(h, s, self.dt(0, 3))
        grads.clear()
        self.N("Optimizer.zero_grad#AdamW.zero_grad", "END", self.dt(1, 10))

    def iteration(self, it):
        cat = self.cat
        if not hasattr(self, "grads"):
            self.grads = []
        self.zero_grad(self.grads)
        loss, saved, _ = self.forward(self.step_ctx(118), True)
        if it == 0:
            self.F(self.stale_batch, cat.free_py(self.step_ctx(112)))
        self.backward(self.step_ctx(121), loss, saved, self.grads)
        self.F(loss, cat.free_py(self.step_ctx(124)), self.dt(10, 100))
        self.optimizer_step(it, self.grads)
        # the CPU runs ahead of the GPU until `loss.item()` for logging
        # waits for the step to finish: most of an iteration's wall time is
        # between trace entries here, the rest of the trace is bursty
        self.sync_gap = self.rng.randint(150_000, 400_000)

    def evaluate(self):
        cat = self.cat
        ectx = self.BASE + (("decorate_context", CONTEXTLIB, 116), ("evaluate", TRAIN, 97))
        loss, _, _ = self.forward(ectx, False)
        self.F(loss, cat.free_py(ectx[:-1] + (("evaluate", TRAIN, 99),)), self.dt(100, 1000))
        self.ops.append(("e", cat.free_py(self.BASE + (("empty_cache", CUDAMEM, 192),),
                                            via=(("c10::cuda::CUDACachingAllocator::Native::"
                                                  "NativeCachingAllocator::emptyCache()", ""),
                                                 ("THCPModule_emptyCache(_object*, _object*)", "Module.cpp"))),
                         self.dt(10, 100)))


# --------------------------------------------------------------------------
# simulation driver


class _Stop(Exception):
    pass


def simulate(events: int, seed: int, sink, cat: Catalog):
    """Runs the program through the allocator, calling ``sink`` for each trace
    entry, until ``events`` entries (or one less) have been produced.
    Returns (allocator, program, entries)."""
    prog = Program(seed, cat)
    rng = random.Random(seed * 7919 + 1)
    # user-space CUDA VAs as torch reports them: 0x7f.. (below 2**47)
    base = 0x7F1000000000 + rng.randrange(0, 0x40) * 0x100000000
    alloc = Allocator(base)
    t = 1_750_000_000_000_000 + rng.randrange(0, 10**12)
    live = {}           # handle -> block
    seq = 0
    n = 0
    ops_iter = prog.run()
    first = next(ops_iter)
    # blocks alive before recording started: no trace entries
    s_load = cat.alloc("_to_copy", Program.BASE[:1] + (("main", TRAIN, 209), ("load_checkpoint", TRAIN, 61)))
    for h, size in prog.pretrace:
        blk, seg = alloc.malloc(size, -1, -1)
        if seg is not None:
            seg[3] = -1
            seg[4] = s_load
        live[h] = blk
    s_alloc = sink.alloc
    s_free = sink.free
    s_ann = sink.annotation
    s_segfree = sink.segment_free
    batch = first
    try:
        while True:
            for op in batch:
                kind = op[0]
                if kind == "a":
                    if n + 2 > events:
                        raise _Stop
                    _, h, size, stack, dt = op
                    t += dt
                    blk, seg = alloc.malloc(size, seq, stack)
                    seq += 1
                    lm = s_alloc(blk, seg, t)
                    blk[7] = lm
                    live[h] = blk
                    n += 2 if seg is not None else 1
                elif kind == "f":
                    if n + 2 > events:
                        raise _Stop
                    _, h, stack, dt = op
                    t += dt
                    blk = live.pop(h)
                    s_free(blk, stack, t)
                    alloc.free(blk)
                    n += 2
                elif kind == "n":
                    t += op[3]
                    s_ann(op[1], op[2], t)
                else:
                    _, stack, dt = op
                    segs = alloc.releasable()
                    if n + len(segs) > events:
                        raise _Stop
                    t += dt
                    for seg in segs:
                        t += 1
                        s_segfree(seg, stack, t)
                        alloc.release(seg)
                        n += 1
            batch = next(ops_iter)
    except _Stop:
        pass
    return alloc, prog, n


class CountSink:
    def alloc(self, blk, seg, t):
        return -1

    def free(self, blk, stack, t):
        pass

    def annotation(self, name, stage, t):
        pass

    def segment_free(self, seg, stack, t):
        pass


class WriteSink:
    """Writes trace entries (pass 2)."""

    def __init__(self, w: Writer, keys: Keys, cat: Catalog, frame_objs, n_entries: int,
                 prelists: dict, free_stacks: str):
        self.w = w
        self.K = keys
        self.cat = cat
        self.FR = frame_objs
        self.n_total = n_entries
        self.k = 0                      # entries written
        self.prelists = prelists        # alloc seq -> memo index of its list
        self.free_stacks = free_stacks
        self.act = {a: fresh(a) for a in ACTIONS}
        self.stack_enc = {}             # stack id -> (bytes, parts) of a new list
        self.fast = {}                  # action -> pre-encoded pieces once its keys are memoized
        self.annotations = []

    # -- list framing of the trace list ------------------------------------
    def _before(self):
        if self.n_total > 1 and self.k % 1000 == 0:
            self.w.raw(MARK)

    def _after(self):
        self.k += 1
        n = self.n_total
        if n == 1:
            self.w.raw(APPEND)
        elif self.k % 1000 == 0 or self.k == n:
            self.w.raw(APPENDS)

    # -- frames lists -------------------------------------------------------
    def _enc_stack(self, s):
        """(bytes, parts) of a new list of stack ``s`` whose frames are all
        memoized, without the list's own MEMOIZE index (caller assigns)."""
        e = self.stack_enc.get(s)
        if e is not None:
            return e
        memo = self.w.memo
        FR = self.FR
        refs = []
        for f in self.cat.stacks[s]:
            idx = memo.get(id(FR[f]))
            if idx is None:
                return None
            refs.append(enc_get(idx))
        n = len(refs)
        if n == 0:
            parts = [EMPTY_LIST + b"\x94"]
        elif n == 1:
            parts = [EMPTY_LIST + b"\x94", refs[0] + APPEND]
        else:
            parts = [EMPTY_LIST + b"\x94" + MARK] + refs
            parts[-1] = parts[-1] + APPENDS
            if n > 1000:
                return None   # never in practice; use the generic path
        e = (b"".join(parts), parts)
        self.stack_enc[s] = e
        return e

    def _write_new_list(self, s):
        """Writes a new frames list (a complete save). Returns its memo index."""
        w = self.w
        e = self._enc_stack(s)
        if e is not None:
            w.put(e[0], e[1])
            i = w.memo_n
            w.memo_n = i + 1
            return i
        frames = [self.FR[f] for f in self.cat.stacks[s]]
        w.boundary()
        w.raw(EMPTY_LIST)
        i = w.memoize()
        w.batch_appends(frames, len(frames))
        return i

    # -- entries ------------------------------------------------------------
    def _head(self, action, addr, size, t):
        """Writes the entry dict up to (excluding) the frames value."""
        w = self.w
        K = self.K
        fast = self.fast.get(action)
        if fast is None:
            memo = w.memo
            if all(id(x) in memo for x in (K.action, K.addr, K.size, K.stream, K.time_us, K.frames,
                                           self.act[action])):
                g = lambda o: enc_get(memo[id(o)])  # noqa: E731
                fast = self.fast[action] = (EMPTY_DICT + b"\x94" + MARK + g(K.action), g(self.act[action]),
                                            g(K.addr), g(K.size), g(K.stream) + b"K\x00", g(K.time_us),
                                            g(K.frames))
        if fast is not None:
            h0, av, kad, ks, kst, kt, kf = fast
            ea, es, et = enc_int(addr), enc_int(size), enc_int(t)
            data = b"".join((h0, av, kad, ea, ks, es, kst, kt, et, kf))
            # save boundaries: the dict itself, then every key and value
            w.put(data, lambda: [h0[:3], h0[3:], av, kad, ea, ks, es, kst[:-2], kst[-2:], kt, et, kf])
            w.memo_n += 1          # the entry dict's MEMOIZE (inside h0)
            return
        w.boundary()
        w.raw(EMPTY_DICT)
        w.memoize()
        w.raw(MARK)
        for k, v in ((K.action, self.act[action]), (K.addr, addr), (K.size, size), (K.stream, 0),
                     (K.time_us, t)):
            w.save(k)
            w.save(v)
        w.save(K.frames)

    def _entry(self, action, addr, size, t, stack=None, ref=None):
        """One trace entry; frames is a new list of ``stack`` or a memo
        reference ``ref``. Returns the memo index of the frames list."""
        w = self.w
        self._before()
        self._head(action, addr, size, t)
        if ref is None:
            ref = self._write_new_list(stack)
        else:
            w.boundary()
            w.raw(enc_get(ref))
        w.raw(SETITEMS)
        self._after()
        return ref

    def alloc(self, blk, seg, t):
        seq = blk[5]
        pre = self.prelists.get(seq)
        if seg is not None:
            pre = self._entry("segment_alloc", seg[0], seg[1], t, blk[6], pre)
        return self._entry("alloc", blk[0], blk[4], t, blk[6], pre)

    def free(self, blk, stack, t):
        if self.free_stacks == "alloc" and blk[7] >= 0:
            self._entry("free_requested", blk[0], blk[4], t, ref=blk[7])
            self._entry("free_completed", blk[0], blk[4], t, ref=blk[7])
        else:
            ref = self._entry("free_requested", blk[0], blk[4], t, stack)
            self._entry("free_completed", blk[0], blk[4], t, ref=ref)

    def segment_free(self, seg, stack, t):
        self._entry("segment_free", seg[0], seg[1], t, stack)

    def annotation(self, name, stage, t):
        self.annotations.append((name, stage, t))


# --------------------------------------------------------------------------
# the file


def _frame_objects(cat: Catalog, K: Keys):
    out = []
    for name, fn, line in cat.frames:
        out.append({K.name: fresh(name), K.filename: fresh(fn) if fn else "", K.line: line})
    return out


def _allocator_settings():
    d = {}
    d[fresh("PYTORCH_CUDA_ALLOC_CONF")] = ""
    d[fresh("max_split_size")] = -1
    d[fresh("garbage_collection_threshold")] = 0.0
    d[fresh("expandable_segments")] = False
    d[fresh("pinned_num_register_threads")] = 1
    d[fresh("release_lock_on_cudamalloc")] = False
    d[fresh("pinned_use_cuda_host_register")] = False
    d[fresh("roundup_power2_divisions")] = {fresh(str(1 << i)): 0 for i in range(16)}
    return d


def _segments_objects(end_state, K: Keys, cat: Catalog, FR, lists: dict):
    """Python objects of the ``segments`` list (bounded: the end state).
    ``lists`` receives alloc seq -> the frames list object shared with the
    trace."""
    st = {"active_allocated": fresh("active_allocated"), "inactive": fresh("inactive")}
    seg_type = {True: fresh("small"), False: fresh("large")}

    def alloc_list(seq, stack):
        lst = lists.get(seq)
        if lst is None:
            lst = lists[seq] = [FR[f] for f in cat.stacks[stack]]
        return lst

    out = []
    for seg, blocks in end_state:
        addr, total, small, trig_seq, trig_stack = seg
        bl = []
        alloc_sz = req_sz = 0
        for baddr, bsize, breq, allocated, bseq, bstack in blocks:
            if allocated:
                alloc_sz += bsize
                req_sz += breq
                frames = alloc_list(bseq, bstack) if bseq >= 0 else []
            else:
                frames = []
            bl.append({K.address: baddr, K.size: bsize, K.requested_size: breq,
                       K.state: st["active_allocated" if allocated else "inactive"], K.frames: frames})
        if trig_seq >= 0:
            sframes = alloc_list(trig_seq, trig_stack)
        else:
            sframes = [FR[f] for f in cat.stacks[trig_stack]] if trig_stack >= 0 else []
        out.append({K.device: 0, K.address: addr, K.total_size: total, K.allocated_size: alloc_sz,
                    K.active_size: alloc_sz, K.requested_size: req_sz, K.stream: 0,
                    K.segment_type: seg_type[small], K.segment_pool_id: tuple([0, 0]),
                    K.is_expandable: False, K.blocks: bl, K.frames: sframes})
    return out


def _write_pass2(tmp, events, seed, free_stacks, devices, cat, end_state, n1):
    """Pass 2: writes the whole file to ``tmp``. Returns (size, annotations)."""
    K = Keys()
    FR = _frame_objects(cat, K)
    with open(tmp, "wb", buffering=1 << 20) as f:
        w = Writer(f)
        # top dict
        w.boundary()
        w.raw(EMPTY_DICT)
        w.memoize()
        w.raw(MARK)
        # segments
        lists = {}
        segs = _segments_objects(end_state, K, cat, FR, lists)
        w.save(K.segments)
        w.save(segs)
        prelists = {seq: w.memo[id(lst)] for seq, lst in lists.items()}
        del segs, end_state
        # device_traces
        w.save(K.device_traces)
        w.boundary()
        w.raw(EMPTY_LIST)
        w.memoize()
        if devices > 1:
            w.raw(MARK)
        w.boundary()
        w.raw(EMPTY_LIST)
        w.memoize()
        sink = WriteSink(w, K, cat, FR, n1, prelists, free_stacks)
        # the catalog is complete after pass 1; pass 2 must not grow it
        n_stacks = len(cat.stacks)
        _, _, n2 = simulate(events, seed, sink, cat)
        if n2 != n1 or sink.k != n1 or len(cat.stacks) != n_stacks:
            raise AssertionError(f"passes disagree: {n1} vs {n2} ({sink.k} written)")
        for _ in range(devices - 1):
            w.boundary()
            w.raw(EMPTY_LIST)
            w.memoize()
        w.raw(APPENDS if devices > 1 else APPEND)
        # allocator_settings
        w.save(K.allocator_settings)
        w.save(_allocator_settings())
        # external_annotations: START/END pairs (drop a dangling START)
        ann = sink.annotations
        if ann and ann[-1][1] == "START":
            ann.pop()
        w.save(K.external_annotations)
        w.boundary()
        w.raw(EMPTY_LIST)
        w.memoize()

        def save_ann(a):
            name, stage, t = a
            w.boundary()
            w.raw(EMPTY_DICT)
            w.memoize()
            w.raw(MARK)
            w.fresh_str("stage")
            w.fresh_str(stage)
            w.fresh_str("name")
            w.fresh_str(name)
            w.save(K.device)
            w.save(0)
            w.save(K.time_us)
            w.save(t)
            w.raw(SETITEMS)

        w.batch_appends(ann, len(ann), save=save_ann)
        w.raw(SETITEMS)
        w.finish()
        size = w.bytes_written
    return size, ann


def generate(path, events: int, seed: int = 0, free_stacks: str = "free", devices: int = 1,
             verbose: bool = False) -> dict:
    """Writes a snapshot with ``events`` trace entries (or one less) to ``path``.
    Returns a small dict of statistics."""
    if free_stacks not in ("free", "alloc"):
        raise ValueError("free_stacks must be 'free' or 'alloc'")
    t0 = time.perf_counter()
    cat = Catalog()
    # pass 1: the end state and the exact number of entries
    alloc1, _, n1 = simulate(events, seed, CountSink(), cat)
    end_state = alloc1.end_state()
    del alloc1
    t1 = time.perf_counter()
    if verbose:
        print(f"pass 1: {n1} entries, {len(end_state)} segments, {t1 - t0:.1f} s", file=sys.stderr)

    # a private temporary name, renamed atomically: concurrent generators of
    # the same file (parallel benchmarks) cannot corrupt it, and readers see
    # either the old or the new complete file
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        size, ann = _write_pass2(tmp, events, seed, free_stacks, devices, cat, end_state, n1)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    t2 = time.perf_counter()
    stats = {"entries": n1, "bytes": size, "unique_frames": len(cat.frames),
             "unique_stacks": len(cat.stacks), "annotations": len(ann),
             "pass1_s": round(t1 - t0, 3), "total_s": round(t2 - t0, 3)}
    if verbose:
        print(f"pass 2: {size / 1e6:.1f} MB, {t2 - t1:.1f} s; {stats}", file=sys.stderr)
    return stats


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--events", required=True, type=lambda s: int(float(s)),
                   help="number of trace entries (1e6 style accepted)")
    p.add_argument("-o", "--output", required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--free-stacks", choices=("free", "alloc"), default="free",
                   help="frees carry their own stack (torch default context='all') or "
                        "reuse the allocation's list (context='alloc')")
    p.add_argument("--devices", type=int, default=1, help="number of device trace lists (others empty)")
    p.add_argument("-q", "--quiet", action="store_true")
    a = p.parse_args(argv)
    d = os.path.dirname(os.path.abspath(a.output))
    os.makedirs(d, exist_ok=True)
    stats = generate(a.output, a.events, a.seed, a.free_stacks, a.devices, verbose=not a.quiet)
    if not a.quiet:
        print(stats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
