"""The protocol-4 FRAME headers are dropped as the file is read, a megabyte at a time: the
stream the interpreter sees is the pickle without its FRAME opcodes (pickletools finds them),
whatever the sizes asked for, for framed, unframed and cut-short files."""
from __future__ import annotations

import io
import pickle
import pickletools
import random

import pytest

from vramscope.parsers.interpreter import Deframed


def without_frames(data: bytes) -> bytes:
    cut = [(pos, pos + 9) for op, _arg, pos in pickletools.genops(data) if op.name == "FRAME"]
    out, at = [], 0
    for a, b in cut:
        out.append(data[at:a])
        at = b
    out.append(data[at:])
    return b"".join(out)


def read_all(data: bytes, sizes, parts: bool) -> bytes:
    d = Deframed(io.BufferedReader(io.BytesIO(data)))
    out = []
    for n in sizes:
        got = b"".join(d.read_parts(n)) if parts else d.read(n)
        out.append(got)
        if len(got) < n:
            break
    return b"".join(out)


def payload(k: int):
    rng = random.Random(k)
    return {"device_traces": [[{"action": "alloc", "addr": rng.randrange(1 << 40), "size": rng.randrange(1 << 30),
                                "frames": [{"filename": "x" * rng.randrange(40), "line": i}]}
                               for i in range(rng.randrange(1, 9000))]],
            "blob": "y" * rng.choice((0, 70_000, 300_000))}          # a large string is written unframed


@pytest.mark.parametrize("k", range(6))
@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_the_stream_is_the_pickle_without_its_frames(k, protocol, monkeypatch):
    data = pickle.dumps(payload(k), protocol=protocol)
    want = without_frames(data)
    rng = random.Random(k * 7 + protocol)
    monkeypatch.setattr(Deframed, "READ", rng.choice((7, 4096, 1 << 20)))    # reads that end inside headers too
    sizes = [rng.choice((1, 9, 100, 65_536, 1 << 22)) for _ in range(len(data))]
    assert read_all(data, sizes, parts=bool(k % 2)) == want
    # cut short anywhere: what is there, in order, and then nothing more
    cut = rng.randrange(len(data))
    got = read_all(data[:cut], [1 << 22] * 4, parts=True)
    frames = (len(data) - len(want)) // 9
    assert want.startswith(got) and len(got) >= cut - 9 * (frames + 1)
