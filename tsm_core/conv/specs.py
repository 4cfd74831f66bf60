"""The user's side of a convolution group: `ConvSpec` (a convolution with bias and
ReLU), `MaxPoolSpec` (a stored max-pool), and the GEMM segments a group's specs
become (``_segments``)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tsm_core.conv.configs import KIND_1X1, KIND_MAXPOOL, KIND_POOL, KIND_RXR, MAX_PARTS

@dataclass
class ConvSpec:
    """One convolution of a `ConvGroup`.

    Parameters
    ----------
    weight : numpy.ndarray, shape (Cout, Cin, R, R)
        R odd; stride 1, padding R // 2 (output the size of the input).
    bias : numpy.ndarray, shape (Cout,)
    src : str
        Slot name of the input, an (N, Cin, H, W) tensor.
    dst : list of (str, int, int)
        ``(slot, channel offset, rows)`` parts: output channels are taken in order,
        ``rows`` of them stored at ``[offset, offset + rows)`` of that slot's tensor.
        A single ``(slot, offset)`` pair is also accepted (all Cout rows).
    pool : bool
        Max-pool the input (3x3, stride 1, padding 1) before the convolution (R must be 1).

    Raises
    ------
    ValueError
        A weight that is not (Cout, Cin, R, R) with R odd, a bias that is not (Cout,),
        ``pool`` with R > 1, or ``dst`` parts that do not cover the Cout channels
        exactly once.

    Examples
    --------
    >>> import numpy as np
    >>> from tsm_core import ConvSpec
    >>> w, b = np.zeros((16, 8, 3, 3)), np.zeros(16)
    >>> sp = ConvSpec(w, b, "x", [("y", 0, 10), ("z", 4, 6)])
    >>> sp.cout, sp.cin, sp.r, sp.dst
    (16, 8, 3, [('y', 0, 10), ('z', 4, 6)])
    >>> ConvSpec(np.zeros((16, 8, 2, 2)), b, "x", ("y", 0))
    Traceback (most recent call last):
    ...
    ValueError: weight must have shape (Cout, Cin, R, R) with R odd; got (16, 8, 2, 2)
    """

    weight: np.ndarray
    bias: np.ndarray
    src: str
    dst: list
    pool: bool = False

    def __post_init__(self):
        w = np.asarray(self.weight)
        if w.ndim != 4 or w.shape[2] != w.shape[3] or w.shape[2] % 2 == 0:
            raise ValueError(f"weight must have shape (Cout, Cin, R, R) with R odd; got {w.shape}")
        b = np.asarray(self.bias)
        if b.shape != (w.shape[0],):
            raise ValueError(f"bias must have shape ({w.shape[0]},); got {b.shape}")
        if self.pool and w.shape[2] != 1:
            raise ValueError("a pooled convolution must be 1x1")
        dst = self.dst
        if isinstance(dst, tuple) and len(dst) == 2 and isinstance(dst[0], str):
            dst = [(dst[0], dst[1], w.shape[0])]
        dst = [(str(s), int(o), int(r)) for s, o, r in dst]
        if sum(r for _, _, r in dst) != w.shape[0] or any(r <= 0 or o < 0 for _, o, r in dst):
            raise ValueError(f"dst parts {dst} must cover the {w.shape[0]} output channels")
        self.weight = np.ascontiguousarray(w, dtype=np.float32)
        self.bias = np.ascontiguousarray(b, dtype=np.float32)
        self.dst = dst

    @property
    def cout(self):
        return self.weight.shape[0]

    @property
    def cin(self):
        return self.weight.shape[1]

    @property
    def r(self):
        return self.weight.shape[2]


@dataclass
class MaxPoolSpec:
    """A 3x3, stride 1, padding 1 max-pool of a `ConvGroup`, stored (no convolution).

    The pool branch of an Inception block as two steps: this in the first launch,
    a plain 1x1 `ConvSpec` on its output in the second. (A `ConvSpec` with
    ``pool=True`` pools inside the GEMM's gather instead, in one launch: four times
    slower on that segment at large batches, H100.)

    Parameters
    ----------
    channels : int
        Channels of the input (all of them are pooled).
    src : str
        Slot name of the input, an (N, channels, H, W) tensor.
    dst : (str, int)
        ``(slot, channel offset)``: where the pooled channels go.

    Raises
    ------
    ValueError
        ``channels`` not positive, or a negative channel offset.

    Examples
    --------
    >>> from tsm_core.conv.api import MaxPoolSpec
    >>> MaxPoolSpec(192, "x", ("xp", 0)).dst
    [('xp', 0, 192)]
    """

    channels: int
    src: str
    dst: tuple

    def __post_init__(self):
        self.channels = int(self.channels)
        if self.channels <= 0:
            raise ValueError(f"channels must be positive; got {self.channels}")
        slot, off = self.dst
        if int(off) < 0:
            raise ValueError(f"channel offset must be >= 0; got {off}")
        self.dst = [(str(slot), int(off), self.channels)]
        self.pool = False

    @property
    def cin(self):
        return self.channels

    @property
    def cout(self):
        return self.channels

    r = 0  # neither 1x1 nor R x R: its own segment kind


@dataclass
class _Segment:
    kind: int
    src: str
    cin: int
    r: int
    wt: np.ndarray  # (K, M) float32
    bias: np.ndarray  # (M,)
    parts: list = field(default_factory=list)  # (first row, slot, offset)

    @property
    def k(self):
        return self.wt.shape[0]

    @property
    def m(self):
        return self.wt.shape[1]


def _segments(specs) -> list:
    """Specs to GEMM segments: 1x1 (unpooled) convolutions on one input share a segment
    (concatenated weights, up to MAX_PARTS parts); the rest get one each. Longest K
    first, so that the slowest blocks are scheduled first."""
    segs = []
    open_1x1 = {}
    for sp in specs:
        if sp.r == 1 and not sp.pool:
            seg = open_1x1.get(sp.src)
            if seg is not None and seg["cin"] == sp.cin and len(seg["parts"]) + len(sp.dst) <= MAX_PARTS:
                seg["specs"].append(sp)
                seg["parts"] += sp.dst
                continue
            seg = {"kind": KIND_1X1, "specs": [sp], "parts": list(sp.dst), "cin": sp.cin}
            open_1x1[sp.src] = seg
            segs.append(seg)
        else:
            if len(sp.dst) > MAX_PARTS:
                raise ValueError(f"at most {MAX_PARTS} destination parts per convolution")
            kind = (KIND_MAXPOOL if isinstance(sp, MaxPoolSpec) else KIND_POOL if sp.pool else
                    KIND_1X1 if sp.r == 1 else KIND_RXR)
            segs.append({"kind": kind, "specs": [sp], "parts": list(sp.dst), "cin": sp.cin})
    out = []
    for seg in segs:
        sps = seg["specs"]
        if seg["kind"] == KIND_MAXPOOL:  # no weights: K = 0 rows, M = the channels
            wt = np.zeros((0, sps[0].cin), np.float32)
            bias = np.zeros(sps[0].cin, np.float32)
        else:
            # W (Cout, Cin, R, R) -> rows k = ci*R*R + ky*R + kx, the gather table's order.
            wt = np.concatenate([sp.weight.reshape(sp.cout, -1) for sp in sps], axis=0).T
            bias = np.concatenate([sp.bias for sp in sps])
        parts, row = [], 0
        for slot, off, rows in seg["parts"]:
            parts.append((row, slot, off))
            row += rows
        out.append(_Segment(seg["kind"], sps[0].src, seg["cin"], sps[0].r,
                            np.ascontiguousarray(wt, dtype=np.float32), bias, parts))
    out.sort(key=lambda s: -s.k)
    return out
