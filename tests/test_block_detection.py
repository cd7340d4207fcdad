"""The repeated blocks of a forward pass (classifiers/structure.py `_find_block_node`) are found
from a few passes spread over the run. A sampled pass that never runs through the block node (the
model called from elsewhere: an evaluation loop, another caller of the same model) says nothing of
how often the node repeats: it no longer hides the blocks every other pass shows. The number of
blocks per pass is the most common one among the passes that run through them (never 0)."""
from __future__ import annotations

import numpy as np

from helpers import DATA, analysis_of, require, shared
from vramscope.classifiers import structure as structure_module


def _structure(path):
    an = analysis_of(path)
    out = {}
    for dev, da in an.devices.items():
        out[dev] = (da, structure_module.structure(da))
    return out


def test_data_parallel_device_zero_shows_its_two_layers():
    """multi_device_oom.pickle: an LM of 2 layers under nn.DataParallel. Device 0's forward
    stretches are two passes through the model and, between them, two entries of DataParallel's
    own that run none of the layers: the blocks were not found while that one was sampled. Its
    2 blocks per forward pass are found now, in the passes that run them."""
    da, st = _structure(DATA / "multi_device_oom.pickle")[0]
    assert st.blocks is not None and st.blocks.count == 2, st.notes
    per_pass = np.bincount([c.forward_pass for c in st.calls])
    assert st.blocks.passes == int(np.count_nonzero(per_pass)) >= 2
    assert set(per_pass[per_pass > 0].tolist()) == {2}
    assert st.notes[0].startswith("2 model.py:forward blocks per forward pass")


def test_a_pass_that_does_not_run_the_blocks_does_not_hide_them(monkeypatch):
    """The same run with a pass added to the sample that runs nothing of the model (no row of its
    stacks goes through the block node): the blocks found are the same."""
    da, st = _structure(DATA / "multi_device_oom.pickle")[0]
    real = structure_module._forward_passes

    def with_an_empty_pass(d):
        passes = real(d)
        if d is not da or not len(passes):
            return passes
        # the entries before the first pass: loading, no model forward in them
        return np.concatenate([[[0, max(0, int(passes[0, 0]) - 1)]], passes]).astype(np.int64)
    monkeypatch.setattr(structure_module, "_forward_passes", with_an_empty_pass)
    again = structure_module._build(da)
    assert again.blocks is not None and again.blocks.count == st.blocks.count == 2


def test_opt_125m_zeroth_order_run_shows_its_twelve_decoder_layers():
    """DeComFL (OPT-125m, zeroth-order training: forwards only, the model called from two places):
    12 decoder layers, found in the passes that run them; no checkpointing advised (no backward)."""
    path = require(shared("ZidongLiu+DeComFL__memory.pickle"))
    da, st = _structure(path)[0]
    assert st.blocks is not None and st.blocks.count == 12, st.notes
    assert st.blocks.passes >= 2 and st.notes[0].startswith("12 modeling_opt.py:forward blocks")
    assert all(a.lever != "checkpointing" for a in da.peak.advice)


def test_one_pass_alone_is_not_taken_for_blocks(monkeypatch):
    """A node seen repeating in one sampled pass while the other sampled passes never run it is
    not taken for the run's blocks: at least two passes must show them (where two were sampled).
    Device 0 of multi_device_oom with its passes cut to a stretch before the first (two rows,
    nothing of the model) and the first (which runs both layers): no blocks. Given the first pass
    alone, both layers are found."""
    da, _ = _structure(DATA / "multi_device_oom.pickle")[0]
    real = structure_module._forward_passes
    first = tuple(real(da)[0].tolist())
    before = (0, first[0] - 1)
    ai = np.asarray(da.allocs.alloc_index)
    assert int(((ai >= before[0]) & (ai <= before[1])).sum()) > 0          # a pass with rows
    monkeypatch.setattr(structure_module, "_forward_passes", lambda d: np.array([before, first], dtype=np.int64) if d is da else real(d))
    st = structure_module._build(da)
    assert st.blocks is None and st.notes[0] == "no repeated block (layer) found in the stacks"
    monkeypatch.setattr(structure_module, "_forward_passes", lambda d: np.array([first], dtype=np.int64) if d is da else real(d))
    assert structure_module._build(da).blocks.count == 2
