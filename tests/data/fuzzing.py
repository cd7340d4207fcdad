"""Seeded mutators of snapshot pickles, for tests/test_fuzz.py and tests/data/fuzz_campaign.py.

A case is (seed file, mutation kind, rng seed): `mutate(data, kind, rng)` returns new bytes,
deterministically, so a failing case is reproduced from three values and kept as a
regression in `fuzz_regressions.json` (no binary committed).

Byte-level kinds treat the file as bytes: bit flips, random bytes, truncation, splices of a
chunk from elsewhere, duplicated or deleted chunks.

Structure-aware kinds work on the opcode stream (pickletools.genops only decodes opcodes,
it never executes anything): an integer replaced by a huge, negative or 64-bit boundary
value; a value replaced by one of another type; a value replaced by deep nesting (TUPLE1
chains, nested lists); a value replaced by a reference to an object stored earlier (shared
references, cycles); a memo reference pointed elsewhere; an opcode deleted or duplicated;
the file cut at an opcode boundary; the heads and tails of two files spliced at opcode
boundaries.

DANGER: never `pickle.load` a mutated file: the mutations could in principle produce
anything. vramscope's reader refuses code-loading opcodes; that is what is being tested.
"""
from __future__ import annotations

import pickletools
import random
import struct

BYTE_KINDS = ("bitflip", "bytes", "truncate", "splice", "dup_chunk", "del_chunk")
STRUCT_KINDS = ("int_value", "wrong_type", "deep_nesting", "shared_ref", "memo_ref", "del_op", "dup_op",
                "cut_op", "splice_files")
KINDS = BYTE_KINDS + STRUCT_KINDS

INT_OPS = {"BININT", "BININT1", "BININT2", "LONG1", "LONG4", "INT", "LONG"}
VALUE_OPS = INT_OPS | {"SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "BINFLOAT", "NONE", "NEWTRUE", "NEWFALSE",
                       "EMPTY_LIST", "EMPTY_DICT", "EMPTY_TUPLE", "BINGET", "LONG_BINGET"}
ODD_INTS = (-1, -2, 0, 1, (1 << 31) - 1, 1 << 31, (1 << 32) - 1, 1 << 32, (1 << 53), (1 << 62), (1 << 63) - 1,
            1 << 63, (1 << 64) - 1, 1 << 64, 1 << 80, -(1 << 31), -(1 << 63), -(1 << 64), -(1 << 90), 10 ** 200)


def ops(data: bytes) -> list[tuple[int, int, str, object]]:
    """(start, end, opcode name, argument) of every opcode that decodes (a damaged tail is
    simply not listed)."""
    out = []
    try:
        prev = None
        for op, arg, pos in pickletools.genops(data):
            if prev is not None:
                out.append((prev[0], pos, prev[1], prev[2]))
            prev = (pos, op.name, arg)
            if op.name == "STOP":
                out.append((pos, pos + 1, "STOP", None))
                prev = None
                break
    except Exception:  # noqa: BLE001 - a mutated stream decodes only so far
        pass
    return out


def long1(v: int) -> bytes:
    if v == 0:
        return b"\x8a\x00"
    n = (v.bit_length() + 8) // 8
    if n > 255:
        b = v.to_bytes(n, "little", signed=True)
        return b"\x8b" + struct.pack("<i", len(b)) + b
    return b"\x8a" + bytes([n]) + v.to_bytes(n, "little", signed=True)


def _int_op(v: int) -> bytes:
    if 0 <= v < 256:
        return b"K" + bytes([v])
    if 0 <= v < 65536:
        return b"M" + struct.pack("<H", v)
    if -(1 << 31) <= v < (1 << 31):
        return b"J" + struct.pack("<i", v)
    return long1(v)


def _other_value(rng: random.Random) -> bytes:
    """Opcodes that push one object of some type, memoizing nothing."""
    return rng.choice([b"N", b"\x88", b"\x89", b")", b"G" + struct.pack(">d", rng.choice([0.5, -1.0, 1e308])),
                       b"G" + struct.pack(">d", float("nan")), b"\x8c\x01x", b"\x8c\x00",
                       b"\x8c\x04\xed\xa0\x80x",        # a lone surrogate (pickle's surrogatepass)
                       _int_op(rng.choice(ODD_INTS)), b"K\x07", b"(t", b"(\x8c\x01at",
                       b"N\x85", b"NN\x86", b"NNN\x87"])


def _deep(rng: random.Random) -> bytes:
    depth = rng.choice([50, 99, 100, 101, 500, 5000, 100_000])
    shape = rng.choice(["tuple1", "tuple2", "mark_tuple", "mark_list"])
    if shape == "tuple1":
        return b"N" + b"\x85" * depth
    if shape == "tuple2":
        return b"N" + b"N\x86" * depth
    if shape == "mark_tuple":
        return b"(" * min(depth, 2000) + b"N" + b"t" * min(depth, 2000)
    d = min(depth, 5000)
    return b"]" * d + b"a" * (d - 1)      # lists nested by APPEND


def _memo_refs(op_list) -> list[int]:
    """Memo indices of MEMOIZE opcodes (numbered as they come) and of BINPUTs."""
    out = []
    n = 0
    for _, _, name, arg in op_list:
        if name == "MEMOIZE":
            out.append(n)
            n += 1
        elif name in ("BINPUT", "LONG_BINPUT"):
            out.append(arg)
    return out


def _get(idx: int) -> bytes:
    return b"h" + bytes([idx]) if idx < 256 else b"j" + struct.pack("<I", idx)


def mutate(data: bytes, kind: str, rng: random.Random, other: bytes | None = None) -> bytes:
    """One mutation of `data` (several for the byte kinds), chosen by `rng`."""
    n = len(data)
    if not n:
        return data
    if kind == "bitflip":
        b = bytearray(data)
        for _ in range(rng.randint(1, 8)):
            i = rng.randrange(n)
            b[i] ^= 1 << rng.randrange(8)
        return bytes(b)
    if kind == "bytes":
        b = bytearray(data)
        for _ in range(rng.randint(1, 8)):
            b[rng.randrange(n)] = rng.randrange(256)
        return bytes(b)
    if kind == "truncate":
        return data[:rng.randrange(n)]
    if kind == "splice":
        i, j = sorted(rng.randrange(n + 1) for _ in range(2))
        k = rng.randrange(n)
        chunk = data[k:k + rng.randint(1, 512)]
        return data[:i] + chunk + data[j:]
    if kind == "dup_chunk":
        i = rng.randrange(n)
        chunk = data[i:i + rng.randint(1, 4096)]
        return data[:i] + chunk + data[i:]
    if kind == "del_chunk":
        i = rng.randrange(n)
        return data[:i] + data[i + rng.randint(1, 4096):]

    op_list = ops(data)
    if not op_list:
        return mutate(data, "bytes", rng)
    if kind == "int_value":
        cands = [o for o in op_list if o[2] in INT_OPS]
        if not cands:
            return mutate(data, "wrong_type", rng)
        out = data
        for s, e, _, _ in sorted(rng.sample(cands, min(len(cands), rng.randint(1, 4))), reverse=True):
            out = out[:s] + _int_op(rng.choice(ODD_INTS)) + out[e:]
        return out
    if kind in ("wrong_type", "deep_nesting", "shared_ref"):
        cands = [o for o in op_list if o[2] in VALUE_OPS]
        if not cands:
            return mutate(data, "bytes", rng)
        s, e, name, _ = rng.choice(cands)
        # a value followed by its MEMOIZE keeps the memo numbering; replace both or neither
        if kind == "wrong_type":
            new = _other_value(rng)
        elif kind == "deep_nesting":
            new = _deep(rng)
        else:
            memo = [m for m in _memo_refs([o for o in op_list if o[0] < s])]
            if not memo:
                return mutate(data, "wrong_type", rng)
            new = _get(rng.choice(memo))
        if name in ("EMPTY_LIST", "EMPTY_DICT"):
            # the container's contents follow (MARK ... APPENDS/SETITEMS): keep a type that takes them
            new = b"]" if name == "EMPTY_LIST" and kind != "shared_ref" else new
            if kind == "shared_ref":
                return data[:s] + new + data[e:]
        return data[:s] + new + data[e:]
    if kind == "memo_ref":
        cands = [o for o in op_list if o[2] in ("BINGET", "LONG_BINGET")]
        memo = _memo_refs(op_list)
        if not cands or not memo:
            return mutate(data, "shared_ref", rng)
        s, e, _, _ = rng.choice(cands)
        idx = rng.choice(memo + [max(memo) + 1, 1 << 31])
        return data[:s] + _get(min(idx, (1 << 32) - 1)) + data[e:]
    if kind == "del_op":
        s, e, _, _ = rng.choice(op_list)
        return data[:s] + data[e:]
    if kind == "dup_op":
        s, e, _, _ = rng.choice(op_list)
        return data[:e] + data[s:e] + data[e:]
    if kind == "cut_op":
        s, _, _, _ = rng.choice(op_list)
        return data[:s]
    if kind == "splice_files":
        src = other if other else data
        other_ops = ops(src) or [(0, 0, "", None)]
        s, _, _, _ = rng.choice(op_list)
        t, _, _, _ = rng.choice(other_ops)
        return data[:s] + src[t:]
    raise ValueError(kind)


def case_bytes(seed: bytes, kind: str, rng_seed: int, other: bytes | None = None) -> bytes:
    return mutate(seed, kind, random.Random(rng_seed), other)


__all__ = ["KINDS", "BYTE_KINDS", "STRUCT_KINDS", "mutate", "case_bytes", "ops"]


# -- checking one case ----------------------------------------------------------------------------
def snapshot_signature(snap) -> dict:
    """Everything a reader produced, by value (string ids and stack ids resolved), so that two
    reads (the fast path and the interpreter) compare equal when they mean the same."""
    import numpy as np
    out = {"devices": snap.devices, "layout": snap.layout, "segments": {}, "blocks": {}}
    for name, tab in (("segments", snap.segments), ("blocks", snap.blocks)):
        for k, v in tab.items():
            v = np.asarray(v)
            out[name][k] = [tuple(snap.stack_frames_list(int(x))) if x >= 0 else None for x in v.tolist()] \
                if k == "stack" else [snap.component_names[x] for x in v.tolist()] if k == "component" else v.tolist()
    for dev, t in snap.traces.items():
        cols = {}
        for k, v in t.columns.items():
            a = np.asarray(v).tolist()
            if k == "action":
                cols[k] = [snap.action_names[x] for x in a]
            elif k in ("stack", "forward_stack"):
                cols[k] = [tuple(snap.stack_frames_list(x)) if x >= 0 else None for x in a]
            elif k in ("compile_context", "user_metadata", "internal_metadata"):
                cols[k] = [snap.strings[x] if x >= 0 else None for x in a]
            elif k == "category":
                cols[k] = [snap.category_names[x] for x in a]
            elif k == "component":
                cols[k] = [snap.component_names[x] for x in a]
            else:
                cols[k] = a
        out[dev] = cols
        out[f"extras{dev}"] = {i: {kk: vv for kk, vv in e.items() if kk == "device_free"}
                               for i, e in t.extras.items()}
    out["frame_fx"] = {snap.frame(f): (tuple(snap.strings[x] if x >= 0 else None for x in v[:4]),
                                       tuple(snap.frame(g) for g in v[4])) for f, v in snap.frame_fx.items()}
    return out


def run_cli(argv: list[str]) -> tuple[int, bytes, str]:
    """vramscope.cli.main in this process, stdout and stderr captured: (exit code, stdout, stderr)."""
    import contextlib
    import io
    from vramscope import cli
    out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="surrogateescape")
    err = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli.main(argv)
        out.flush()
    return rc, out.buffer.getvalue(), err.getvalue()


def check_bytes(data: bytes, path: str, compare_paths: bool = True) -> tuple[str, str]:
    """The outcome of one case: ("ok" | "refused", detail) when vramscope behaves, else
    ("FAIL", what went wrong). Runs `summary --json` (and, when that reads the file,
    `allocations --csv`) in this process (no cache: the caller sets VRAMSCOPE_CACHE_DIR) and
    compares the fast path with the interpreter."""
    import traceback
    from vramscope.common import jsonio
    from vramscope.parsers import SnapshotError
    from vramscope.parsers.cache import read_snapshot
    with open(path, "wb") as fh:
        fh.write(data)
    try:
        rc, out, err = run_cli(["summary", path, "--json"])
    except BaseException as e:  # noqa: BLE001 - a traceback is the finding
        tb = traceback.extract_tb(e.__traceback__)
        where = f"{tb[-1].filename.rsplit('/', 2)[-2:]}:{tb[-1].lineno}" if tb else "?"
        return "FAIL", f"summary raised {type(e).__name__}: {str(e)[:120]} at {where}"
    lines = err.strip().splitlines()
    if rc == 0:
        try:
            doc = jsonio.loads(out)
        except ValueError:
            return "FAIL", "summary exit 0 without JSON on stdout"
        if not isinstance(doc, dict) or "devices" not in doc:
            return "FAIL", "summary JSON without devices"
        try:
            rc2, rows, err2 = run_cli(["allocations", path, "--csv"])
        except BaseException as e:  # noqa: BLE001
            tb = traceback.extract_tb(e.__traceback__)
            where = f"{tb[-1].filename.rsplit('/', 2)[-2:]}:{tb[-1].lineno}" if tb else "?"
            return "FAIL", f"allocations raised {type(e).__name__}: {str(e)[:120]} at {where}"
        from vramscope.cli.allocations import HEADER
        if rc2 != 0 or not rows.startswith(HEADER.encode()):
            return "FAIL", f"allocations exit {rc2} after summary exit 0: {err2.strip()[-150:]}"
        outcome, detail = "ok", ""
    elif rc == 3 and len(lines) == 1:
        outcome, detail = "refused", lines[0].split(": ", 2)[-1][:100]
    else:
        return "FAIL", f"summary exit {rc} with {len(lines)} lines on stderr: {(lines[-1] if lines else '')[:150]}"
    if compare_paths:
        got = []
        for fast in (True, False):
            try:
                got.append(("ok", snapshot_signature(read_snapshot(path, fast=fast))))
            except SnapshotError as e:
                got.append(("refused", type(e).__name__))
            except BaseException as e:  # noqa: BLE001
                return "FAIL", f"read_snapshot(fast={fast}) raised {type(e).__name__}: {str(e)[:120]}"
        if got[0] != got[1]:
            return "FAIL", f"the fast path and the interpreter disagree ({got[0][0]} vs {got[1][0]})"
        if (got[0][0] == "ok") != (outcome == "ok"):
            return "FAIL", f"summary {outcome} but the reader {got[0][0]}"
    return outcome, detail


__all__ += ["snapshot_signature", "run_cli", "check_bytes"]
