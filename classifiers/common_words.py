"""Refusals more than one lever (and the growth model) share, in words."""
from __future__ import annotations

from .structure import WORKSPACE_SHARE, library_scratch


def library_scratch_words(da) -> str:
    """Why the batch cannot be scaled on this run ('' when it can): a library's scratch (cuDNN's
    convolution workspace) holds much of the peak, and its size follows the library's choice of
    algorithm, not the batch."""
    ws = library_scratch(da)
    if ws and ws >= WORKSPACE_SHARE * max(1, da.peak.bytes):
        from ..common.units import fmt_bytes
        return (f"a convolution library's workspace of up to {fmt_bytes(ws)} (cuDNN's, made and freed inside one op; "
                f"{ws / max(1, da.peak.bytes):.0%} of the peak): cuDNN picks its algorithm, and the workspace, by the "
                f"shapes, so it does not follow the batch and no prediction is made; record the run at the batch "
                f"you want to know")
    return ""
