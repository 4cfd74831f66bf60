"""Grouped same-padding convolutions with bias and ReLU, one launch per group
(``conv/conv.cu``): the engine under ``apps/inception``.

Public names (re-exported lazily by ``tsm_core``): ``ConvGroup``, ``ConvSpec``,
``MaxPoolSpec``.

A `ConvGroup` is a list of `ConvSpec` convolutions (stride 1, odd R x R kernel,
padding R // 2, optionally a 3x3 stride-1 max-pool of the input first) and
`MaxPoolSpec` max-pools, each reading an NCHW float32 tensor named by a slot and
writing into a channel slice of other named tensors (relu(conv + bias) for a
convolution, the pooled input for a max-pool). Calling the group with those
tensors runs all of it in ONE kernel launch:

- 1x1 convolutions that read the same slot become one GEMM over their
  concatenated weights (the rows split into parts, each stored in its own
  destination slice);
- R x R convolutions are implicit GEMMs: the input patch is gathered while a
  shared-memory tile is loaded (no im2col buffer);
- a pooled convolution max-pools while loading its GEMM tile; a `MaxPoolSpec`
  writes the pooled tensor instead (no GEMM), for a plain 1x1 in a later launch:
  four times faster at large batches (the Inception block uses this form);
- bias and ReLU are applied in the epilogue, which writes straight into the
  destination's channel slice (a concatenation costs nothing);
- where the launch would leave SMs idle (small batches), K is cut into chunks
  (split-K) and the last block of each tile adds the partials in a fixed order,
  in the same launch (`ConvGroup.choose_splits`).

Tiles: BM x BN per block from `CONFIGS`: the register-staged kernel's 128x128 down
to 32x32 (8x8 or 4x4 per thread, split-K), and the cp.async kernel's a128x128 /
a64x128 / a64x128b3 (two or three blocks per SM, no split-K). The first call at a
size times them all and keeps the fastest (`ConvGroup.autotune`; with
``TSM_CONV_TUNE=0``, `choose_config`'s model picks).

NaN: the max-pool and ReLU use fmaxf, which returns the other operand of a NaN
(torch propagates it); finite inputs give the same results.

Slots: a call binds up to five CUDA tensors (CuPy arrays, C-contiguous NCHW
float32) by name; descriptors (weights, biases, gather tables, tile map, split-K
workspace and counters) live in device memory, built once per (device, batch, H, W)
and reused, so a call uploads nothing; the launch's argument block is built once
too. The split-K workspace and the argument block are per group: one group must
not run on two streams, or from two host threads, at once.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np

from tsm_core.batched import api as _batched


from tsm_core.runtime import compile as _compile

FAMILY = "conv"
MAX_SLOTS = 5
MAX_PARTS = 6  # tsm_conv::MAX_PARTS
NF = 15 + 4 * MAX_PARTS  # tsm_conv::NF
(F_KIND, F_SRC, F_CIN, F_K, F_M, F_W, F_BIAS, F_TAB, F_TILE0, F_MTILES, F_NPARTS,
 F_SPLITS, F_KCHUNK, F_WS, F_CNT, F_PART0) = range(16)
MAX_SPLITS = 8
# Launches of at least this many GEMM columns (N*H*W) are tuned on their first call:
# all of them. The model's pick lost up to 25% of a launch at batch 32 and 128, and
# at batch 1 it lost 2-3x on the second launch (32 x 32 split-K tiles where 64 x 64
# ran 37 us against 120 us; H100, session 10). The candidates differ by far more
# than the spread of five timed runs, even for launches of 20 us.
TUNE_MIN_COLUMNS = 1
KIND_1X1, KIND_POOL, KIND_RXR = 0, 1, 2
KIND_MAXPOOL = 4  # tsm_conv::KIND_MAXPOOL_ (3 is the async kernel's own vector 1x1)
KIND_RXRT = 5  # an R x R segment on the tensor-core tiles with K tap-major (`tap_major`)


@dataclass(frozen=True)
class TileConfig:
    """One instantiation of ``conv_gemm_relu``: tile BM x BN, K step BK, TM x TN per thread,
    MINB blocks per SM promised to the compiler (its register cap)."""

    bm: int
    bn: int
    bk: int
    tm: int
    tn: int
    minb: int
    stages: int = 0  # > 0: conv_gemm_relu_async, a cp.async pipeline this deep (no split-K)
    spill_ok: int = 0  # spill bytes ptxas may use (measured faster all the same; see CONFIGS)
    tc: bool = False  # with stages: conv_gemm_relu_tc, the products on the tensor cores (3xTF32)
    deep: bool = False  # a deeper-K twin of a register-staged tile: its tag ends in d<BK>
    kw: int = 1  # register-staged: K groups splitting each step inside the block (tag w<KW>)

    @property
    def threads(self) -> int:
        return (self.bm // self.tm) * (self.bn // self.tn) * self.kw

    @property
    def splittable(self) -> bool:
        """Whether the kernel can cut a segment's K in chunks (split-K): the register-staged
        tiles and the 64-row tensor-core ones."""
        return not self.stages or (self.tc and self.bm == 64)

    @property
    def tag(self) -> str:
        """Short name, as ``TSM_CONV_TILE`` takes it: ``128x64``, or ``a128x128`` (async;
        ``a64x128b3`` for three blocks per SM)."""
        blocks = f"b{self.minb}" if self.stages and self.minb != 2 else ""
        kind = "t" if self.tc else "a" if self.stages else ""
        depth = f"d{self.bk}" if self.deep else ""
        groups = f"w{self.kw}" if self.kw > 1 else ""
        return f"{kind}{self.bm}x{self.bn}{blocks}{depth}{groups}"

    @property
    def name(self) -> str:
        if self.stages:
            kernel = "conv_gemm_relu_tc" if self.tc else "conv_gemm_relu_async"
            return (f"{kernel}<{self.bm}, {self.bn}, {self.bk}, {self.stages}, "
                    f"{self.minb}>")
        kw = f", {self.kw}" if self.kw > 1 else ""
        return f"conv_gemm_relu<{self.bm}, {self.bn}, {self.bk}, {self.tm}, {self.tn}, {self.minb}{kw}>"


# Candidates, largest first. Registers on sm_90 (compile_report): 167, 127, 122, 79, 128;
# none spills (128x128 capped at 128 registers, two blocks per SM, spills ~250 B:
# it runs one block of 8 warps per SM instead). The larger tiles read fewer bytes of
# shared memory per FMA; the smaller ones make enough blocks for small batches (a
# batch-1 Inception block at 7x7 has 49 GEMM columns), and the smallest steps 16
# deep in K: at batch 1 a block is bound by the latency of each K step's loads, so
# fewer, deeper steps finish sooner.
CONFIGS = (
    TileConfig(128, 128, 8, 8, 8, 1),
    TileConfig(128, 64, 8, 8, 4, 2),
    TileConfig(64, 128, 8, 4, 8, 2),
    TileConfig(64, 64, 8, 4, 4, 3),
    TileConfig(32, 32, 16, 4, 4, 8),
    # Deeper twins of the small tiles, for launches bound by the latency of their K
    # steps (batch 1: Table 6's K = 192 is 12 steps of 16; half as many steps of 32).
    TileConfig(64, 64, 16, 4, 4, 3, deep=True),
    TileConfig(32, 32, 32, 4, 4, 6, deep=True),
    # The small tiles with each K step split among KW thread groups inside the block
    # (conv_gemm_relu's KW): batch-1 launches of a few dozen blocks, where a thread's
    # FMAs run one after another (Table 6: 56 blocks of 64 threads, 4.4 cycles an
    # instruction, 12 us; Nsight Compute, session 13).
    TileConfig(32, 32, 64, 4, 4, 2, kw=4),
    TileConfig(64, 64, 16, 4, 4, 1, kw=2),
    # cp.async pipelines (conv_gemm_relu_async): two blocks of 8 warps per SM at 128
    # registers, no split-K; for launches of a wave or more.
    TileConfig(128, 128, 8, 8, 8, 2, stages=4),
    TileConfig(64, 128, 16, 4, 8, 2, stages=4),
    # Three blocks per SM: at 80 registers ptxas spills about 100 bytes, yet the 1x1
    # launches ran 14-17% faster than with two blocks (3b and 4e at batch 128; the
    # 3x3 launches 1-3% slower). The tuner picks it where it wins.
    TileConfig(64, 128, 16, 4, 8, 3, stages=4, spill_ok=128),
    # The cp.async pipeline with 3xTF32 products on the tensor cores
    # (conv_gemm_relu_tc): weights pre-split in fragment order (tc_frag_weights), B's
    # rows padded by 8 floats, stages in dynamic shared memory (tc_smem_bytes: 49 to
    # 50 KB in the first two). Other depths and K steps ran within 2% of these or
    # slower (3b, batches 32 and 128, session 13: benchmarks/inception_probes.py
    # stages). NVRTC 12.9 spills 8 bytes in the first two at 128 registers; nvcc 13.0
    # (and the device's NVRTC 13) none.
    TileConfig(128, 128, 8, 8, 8, 2, stages=4, spill_ok=8, tc=True),
    TileConfig(64, 128, 16, 4, 8, 2, stages=3, spill_ok=8, tc=True),
    # Three blocks per SM, as a64x128b3 (the 1x1 launches): BK = 8, 80 registers,
    # 8 bytes of spills with nvcc 13 as well.
    TileConfig(64, 128, 8, 4, 8, 3, stages=4, spill_ok=8, tc=True),
)
# Relative speed of a block-tile's FMAs: the median over a sweep of every Inception
# block at batch 32 and 128, each launch with each configuration forced (H100,
# session 10, `python -m tsm_apps.inception.bench --sweep`), of modelled / measured time,
# relative to 128x128 (a64x128: its BK = 16 form, estimated from a smaller sweep).
# The model's pick lost 7% in total against the measured best
# over that sweep (up to 25% on one launch), hence the tuning of large launches.
_EFFICIENCY = {"128x128": 1.0, "128x64": 1.11, "64x128": 0.94, "64x64": 1.03, "32x32": 0.62,
               "64x64d16": 1.03, "32x32d32": 0.62,  # as their twins (not swept; the tuner picks)
               "32x32w4": 0.62, "64x64w2": 1.03,
               "a128x128": 1.45, "a64x128": 1.15, "a64x128b3": 1.15,
               # the t-tiles: their FMA twins' times 1.25 (session 11: the tuner's
               # t-picks ran 1.22-1.27x faster than its a-picks per block).
               "t128x128": 1.8, "t64x128": 1.45, "t64x128b3": 1.45}


def all_names() -> list:
    """Every kernel instantiation the launcher can pick (for compile checks)."""
    return [c.name for c in CONFIGS]


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


def split_k(k: int, bk: int, splits: int) -> tuple:
    """(chunks, chunk length) for K = k cut in at most `splits` chunks of a multiple of bk."""
    if k <= 0:  # a max-pool segment: one block per tile, no K steps
        return 1, bk
    splits = max(1, min(int(splits), -(-k // bk)))
    chunk = -(-(-(-k // splits)) // bk) * bk
    return -(-k // chunk), chunk


def pad_rows4(wt: np.ndarray) -> np.ndarray:
    """(K, M) weights with zero columns appended up to a multiple of 4: the layout
    ``conv_gemm_relu_async`` reads (row stride (M + 3) // 4 * 4)."""
    K, M = wt.shape
    out = np.zeros((K, -(-M // 4) * 4), np.float32)
    out[:, :M] = wt
    return out


TC_ROWS = 128  # tc_frag_weights pads M to whole tiles of the largest t-tile (BM)
TC_DEPTH = 16  # ... and K to whole stages of the deepest one (BK)


def tc_frag_weights(wt: np.ndarray) -> np.ndarray:
    """(K, M) float32 weights as the tensor-core tiles read them: split into TF32 hi
    and lo parts once (as ``tf32_low`` in common.cuh splits an operand: hi the value
    itself, which the MMA truncates; lo the rest, biased by half a TF32 unit so the
    MMA's truncation rounds it) and laid out in mma.m16n8k8 A-fragment order.

    Flat float32 array of (Kp / 8) x (Mp / 16) fragments of 256 floats (Kp = K up to a
    multiple of TC_DEPTH, Mp = M up to a multiple of TC_ROWS, zero-filled): fragment
    (kg, mg) covers rows k = 8 kg .. 8 kg + 7 and m = 16 mg .. 16 mg + 15; lane
    l = 4 g + t holds W[8 kg + t][16 mg + g], W[.. + t][.. + g + 8], W[.. + t + 4][.. + g],
    W[.. + t + 4][.. + g + 8], hi parts at 4 l .. 4 l + 3 and lo parts at 128 + 4 l ...
    The fragments of one k-group are consecutive in m, so a tile's stage copies
    BK / 8 runs of BM * 16 floats.
    """
    wt = np.asarray(wt, np.float32)
    K, M = wt.shape
    Kp, Mp = -(-K // TC_DEPTH) * TC_DEPTH, -(-M // TC_ROWS) * TC_ROWS
    w = np.zeros((Kp, Mp), np.float32)
    w[:K, :M] = wt
    bits = w.view(np.uint32)
    hi = (bits & np.uint32(0xFFFFE000)).view(np.float32)
    with np.errstate(invalid="ignore"):
        lo = ((w - hi).view(np.uint32) + np.uint32(0x1000)).astype(np.uint32)
    lo[w == 0] = 0  # a zero (padding) stays zero in both parts
    # (kg, t4, t, mg, h, g) with k = 8 kg + 4 t4 + t and m = 16 mg + 8 h + g
    def frag(a):
        a = a.reshape(Kp // 8, 2, 4, Mp // 16, 2, 8)
        # -> (kg, mg, g, t, [a0 a1 a2 a3] = (t4, h) in order (0,0) (0,1) (1,0) (1,1))
        return a.transpose(0, 3, 5, 2, 1, 4).reshape(Kp // 8, Mp // 16, 128)
    out = np.empty((Kp // 8, Mp // 16, 256), np.uint32)
    out[..., :128] = frag(bits)
    out[..., 128:] = frag(lo)
    return out.reshape(-1).view(np.float32)


def tap_major(seg) -> bool:
    """Whether the tensor-core tiles run R x R segment `seg` with K in tap-major order
    (k = tap * Cin + ci, kernel kind KIND_RXRT): Cin a multiple of every t-tile's BK
    (TC_DEPTH), so that a k-tile is one tap. Its gather then costs a table entry
    per stage instead of one per element (conv.cu, conv_load_stage)."""
    return seg.kind == KIND_RXR and seg.cin % TC_DEPTH == 0


def tap_major_order(cin: int, r: int) -> np.ndarray:
    """Row k' = tap * Cin + ci of the tap-major order is row ci * R*R + tap of the
    channel-major one (`_segments`' weights, `packed_taps`): the permutation."""
    tap, ci = np.divmod(np.arange(cin * r * r), cin)
    return ci * r * r + tap


def layout_weights(seg, layout: str) -> np.ndarray:
    """A segment's (K, M) weights as a kernel reads them: "plain"; "pad4", rows padded
    with zeros to a multiple of 4 (the async kernel's 16-byte copies); "tc", split and
    in fragment order (`tc_frag_weights`), K tap-major where `tap_major`."""
    if layout == "tc":
        wt = seg.wt[tap_major_order(seg.cin, seg.r)] if tap_major(seg) else seg.wt
        return tc_frag_weights(wt)
    return {"plain": lambda a: a, "pad4": pad_rows4}[layout](seg.wt)


def segment_table(seg, cfg, H: int, W: int):
    """The gather table of R x R segment `seg` for tile `cfg` at H x W (None for other
    kinds): `packed_taps` for the cp.async tiles (tap-major on the tensor-core tiles
    where `tap_major`), `gather_table` for the register ones."""
    if seg.kind != KIND_RXR:
        return None
    if not cfg.stages:
        return gather_table(seg.cin, seg.r, H, W)
    return packed_taps(seg.cin, seg.r, H, W, tap_major=bool(cfg.tc) and tap_major(seg))


def segment_kind(seg, cfg) -> int:
    """The kernel's kind of `seg` on tile `cfg` (KIND_RXRT where `tap_major`)."""
    return KIND_RXRT if cfg.tc and tap_major(seg) else seg.kind


def tc_smem_bytes(cfg) -> int:
    """Dynamic shared memory of a tensor-core tile's launch: STAGES stages of A (hi and
    lo parts, BK x 2 BM floats) and B (BK x (BN + 8) floats)."""
    return cfg.stages * cfg.bk * (2 * cfg.bm + cfg.bn + 8) * 4


def packed_taps(cin: int, r: int, H: int, W: int, tap_major: bool = False) -> np.ndarray:
    """(Cin*R*R,) int32: (ci*H*W + dy*W + dx) << 6 | (ky*R + kx), the R x R gather of
    ``conv_gemm_relu_async`` (one load per k; the tap index selects the pixel's
    inside-the-image bit), k channel-major (k = ci*R*R + tap) or, with `tap_major`,
    tap-major (`tap_major_order`). Raises ValueError where it cannot be packed (see
    async_ok)."""
    if r * r > 64:
        raise ValueError(f"R = {r}: the async kernel's tap mask holds R*R <= 64 taps")
    k = np.arange(cin * r * r)
    ci, tap = np.divmod(k, r * r)
    ky, kx = np.divmod(tap, r)
    off = ci * H * W + (ky - r // 2) * W + (kx - r // 2)
    if off.size and np.abs(off).max() >= 2**25:
        raise ValueError("input channels x H x W too large for the packed 26-bit offsets")
    packed = ((off << 6) | tap).astype(np.int32)
    return packed[tap_major_order(cin, r)] if tap_major else packed


def async_ok(segments, H: int, W: int) -> bool:
    """Whether ``conv_gemm_relu_async`` can run these segments: R*R <= 64 and
    Cin*H*W < 2**25 for every R x R convolution (its packed gather table)."""
    return all(s.kind != KIND_RXR or (s.r * s.r <= 64 and (s.cin + 1) * H * W < 2**25)
               for s in segments)


def gather_table(cin: int, r: int, H: int, W: int) -> np.ndarray:
    """(Cin*R*R, 4) int32 rows {ci*H*W + dy*W + dx, dy, dx, 0} of an R x R convolution."""
    k = np.arange(cin * r * r)
    ci, rem = np.divmod(k, r * r)
    dy, dx = np.divmod(rem, r)
    dy, dx = dy - r // 2, dx - r // 2
    tab = np.zeros((k.size, 4), np.int64)
    tab[:, 0] = ci * H * W + dy * W + dx
    tab[:, 1], tab[:, 2] = dy, dx
    if np.abs(tab).max(initial=0) >= 2**31:
        raise ValueError("input channels x H x W too large for 32-bit gather offsets")
    return tab.astype(np.int32)


@functools.lru_cache(maxsize=None)
def _sm_count(device: int) -> int:
    import cupy

    return cupy.cuda.Device(device).attributes["MultiProcessorCount"]


# Whether the tensor-core configurations are candidates of the model and the tuner
# (``TSM_CONV_TC=0`` leaves them out, for a float32-FMA-only run). On since session
# 11's H100 run: the tuner picked them for every launch at batch 32 and 128, 1.2-1.3x
# faster than the FMA tiles' picks in device time, errors against float64 up to 8e-6
# (cuDNN's 1.3e-6; docs/NOTES.md). ``TSM_CONV_TILE=t128x128`` forces one.
TC_CANDIDATES = True


def tc_candidates() -> bool:
    """Whether the tensor-core configurations take part in the model's pick and tuning."""
    import os

    v = os.environ.get("TSM_CONV_TC", "").strip().lower()
    return TC_CANDIDATES if not v else v not in ("0", "false", "no", "off")


def candidates(segments, H: int, W: int, allow_tc: bool = True) -> list:
    """The configurations the model and the tuner choose among for these segments at
    H x W: all of `CONFIGS`, less the async ones where `async_ok` fails and the
    tensor-core ones unless the device runs them (`allow_tc`) and `tc_candidates`."""
    ok_async = async_ok(segments, H, W)
    tc = allow_tc and tc_candidates()
    return [c for c in CONFIGS if (ok_async or not c.stages) and (tc or not c.tc)]


# autotune: the largest relative difference (max |a - b| / max |b|) a candidate's
# outputs may show against the first candidate's. float32 FMA tiles and 3xTF32 agree
# to about 1e-6; a wrong kernel differs by O(1).
TUNE_AGREE = 1e-4


def rel_diff(a, b) -> float:
    """max |a - b| / max |b| over the elements finite in b; inf where a and b differ in
    which elements are NaN or infinite. NumPy or CuPy arrays."""
    xp = np
    if type(a).__module__.startswith("cupy"):
        import cupy as xp
    if not bool(xp.array_equal(xp.isfinite(a), xp.isfinite(b))) or \
            not bool(xp.array_equal(xp.isnan(a), xp.isnan(b))):
        return float("inf")
    fin = xp.isfinite(b)
    d = float(xp.abs(xp.where(fin, a, 0) - xp.where(fin, b, 0)).max()) if a.size else 0.0
    m = float(xp.abs(xp.where(fin, b, 0)).max()) if b.size else 0.0
    return d / m if m > 0 else d


def _tc_ok(device: int) -> bool:
    """Whether the device runs the tensor-core configurations (mma.tf32: sm_80 and up)."""
    import cupy

    return int(cupy.cuda.Device(device).compute_capability) >= 80


def choose_config(segments, ncols: int, sm_count: int, allow_async: bool = True,
                  allow_tc: bool = True) -> TileConfig:
    """The candidate with the least modelled time (a model, not a measurement).

    Per SM: ceil(blocks / SMs) block-tiles of BM*BN*K FMAs, at 128 FMA lanes times
    the tile's efficiency, times the fraction of the four schedulers the resident
    warps can keep busy (a lone 64-thread block feeds only two). Small batches so
    pick small tiles (more SMs busy), large batches large ones.
    ``TSM_CONV_TILE=BMxBN`` (e.g. ``128x64``, ``a128x128``) forces a candidate, for
    tuning sweeps. `allow_async`: whether the async configurations may run (`async_ok`);
    `allow_tc`: whether the tensor-core ones may (`_tc_ok`).
    """
    import os

    forced = os.environ.get("TSM_CONV_TILE")
    if forced:
        for cfg in CONFIGS:
            if cfg.tag == forced:
                if cfg.stages and not allow_async:
                    raise ValueError(f"TSM_CONV_TILE={forced!r}: the async kernel cannot run "
                                     "this group (see async_ok)")
                if cfg.tc and not allow_tc:
                    raise ValueError(f"TSM_CONV_TILE={forced!r}: the tensor-core tiles need "
                                     "compute capability 8.0 or later")
                return cfg
        raise ValueError(f"TSM_CONV_TILE={forced!r}: not one of {[c.tag for c in CONFIGS]}")
    best, best_t = None, None
    for cfg in CONFIGS:
        if (cfg.stages and not allow_async) or (cfg.tc and not (allow_tc and tc_candidates())):
            continue
        ntile = -(-ncols // cfg.bn)
        blocks = sum(-(-s.m // cfg.bm) * ntile for s in segments)
        work = sum(-(-s.m // cfg.bm) * ntile * s.k for s in segments) / max(blocks, 1)
        per_sm = -(-blocks // sm_count)
        resident = min(per_sm, cfg.minb)
        busy = min(1.0, resident * cfg.threads / 32 / 4)
        t = per_sm * cfg.bm * cfg.bn * work / (128 * _EFFICIENCY[cfg.tag] * busy)
        if best_t is None or t < best_t * 0.999:
            best, best_t = cfg, t
    return best


class ConvGroup:
    """Several same-padding convolutions + bias + ReLU on NCHW float32, one launch.

    Parameters
    ----------
    specs : list of ConvSpec
        At most 4 distinct slot names among their inputs and outputs.
    channels : dict, optional
        Channel count of each destination slot's tensor (default: the highest channel
        any spec writes there); needed when other launches fill the rest of it.
    config : TileConfig or None
        Force a tile configuration (default: `choose_config` per batch and image size).
    tune : bool or None
        Time every configuration on the first call at a size of at least
        TUNE_MIN_COLUMNS GEMM columns and keep the fastest (`autotune`). Default:
        on unless ``TSM_CONV_TUNE=0``.

    Examples
    --------
    >>> import numpy as np
    >>> from tsm_core import ConvGroup
    >>> from tsm_core.conv.api import ConvSpec
    >>> rng = np.random.default_rng(0)
    >>> w1, b1 = rng.standard_normal((8, 4, 1, 1)), rng.standard_normal(8)
    >>> w3, b3 = rng.standard_normal((6, 4, 3, 3)), rng.standard_normal(6)
    >>> g = ConvGroup([ConvSpec(w1, b1, "x", ("y", 0)), ConvSpec(w3, b3, "x", ("y", 8))])
    >>> g.slots
    ('x', 'y')
    >>> # with a GPU: g({"x": x, "y": y}) fills y's 14 channels from x (N, 4, H, W)
    """

    def __init__(self, specs, *, channels: dict | None = None, config: TileConfig | None = None,
                 tune: bool | None = None):
        specs = list(specs)
        if not specs:
            raise ValueError("a ConvGroup needs at least one convolution")
        names = []
        for sp in specs:
            for n in [sp.src] + [s for s, _, _ in sp.dst]:
                if n not in names:
                    names.append(n)
        if len(names) > MAX_SLOTS:
            raise ValueError(f"at most {MAX_SLOTS} tensors per group; got {names}")
        self.specs = specs
        self.slots = tuple(names)
        self.segments = _segments(specs)
        self.config = config
        self.tune = tune  # None: TSM_CONV_TUNE decides (default on)
        # Channels each slot must have at least (inputs exactly Cin).
        self._need = {}
        for sp in specs:
            for s, o, r in sp.dst:
                self._need[s] = max(self._need.get(s, 0), o + r)
        for s, c in (channels or {}).items():
            if s not in self._need or c < self._need[s]:
                raise ValueError(f"channels[{s!r}] = {c}: not a destination, or fewer channels "
                                 f"than the group writes ({self._need.get(s)})")
            self._need[s] = int(c)
        self._cin = {sp.src: sp.cin for sp in specs}
        self._weights = {}  # device -> [(wt, bias, table) per segment] kept alive
        self._plans = {}  # (device, n, H, W) -> plan(): kernel, descriptors, grid, ...
        self._launches = {}  # (device, n, H, W) -> _GroupLaunch of that plan
        self._checked = {}  # slot layouts seen -> (n, H, W): `_dims`

    @property
    def flops_per_pixel(self) -> int:
        """2 * K * M summed over segments: FLOPs per output pixel of one image."""
        return sum(2 * s.k * s.m for s in self.segments)

    def describe(self, n: int, H: int, W: int, sm_count: int | None = None) -> str:
        """The launch in words: segments (GEMM shapes, parts) and its tile: the one in use
        where this size has run on the current GPU (tuned, or forced), else the model's
        pick (for the current GPU's SM count, or an H100's 132 where there is no GPU)."""
        from tsm_core.runtime.arrays import has_gpu

        cfg, how = None, "the model's pick"
        if self.tuning_wanted(n, H, W):
            how += "; the first call at this size tunes it"
        tc = True  # an H100's, where there is no GPU
        if has_gpu():
            import cupy

            tc = _tc_ok(cupy.cuda.Device().id)
        if sm_count is None:
            sm_count = 132
            if has_gpu():
                dev = cupy.cuda.Device().id
                sm_count = _sm_count(dev)
                p = self._plans.get((dev, n, H, W))
                if p is not None:
                    cfg, how = p[4], "in use"
        if cfg is None and self.config is not None:
            cfg, how = self.config, "forced"
        if cfg is None:
            cfg = choose_config(self.segments, n * H * W, sm_count, async_ok(self.segments, H, W),
                                tc)
        desc = self.descriptors(n, H, W, cfg)
        names = {KIND_1X1: "1x1", KIND_POOL: "maxpool3x3+1x1", KIND_RXR: "conv",
                 KIND_MAXPOOL: "maxpool3x3"}
        lines = [f"one launch, tile {cfg.tag} ({cfg.bm}x{cfg.bn}x{cfg.bk}, {cfg.threads} threads"
                 f"{f', cp.async {cfg.stages} stages' if cfg.stages else ''}"
                 f"{', 3xTF32 tensor cores' if cfg.tc else ''}; {how}), "
                 f"{self.grid_size(desc, n, H, W, cfg)} blocks for N*H*W = {n * H * W} columns:"]
        for seg in self.segments:
            kind = names[seg.kind] if seg.kind != KIND_RXR else f"{seg.r}x{seg.r} implicit GEMM"
            if segment_kind(seg, cfg) == KIND_RXRT:
                kind += " (K tap-major)"
            parts = ", ".join(f"{slot}[{off}:]" for _, slot, off in seg.parts)
            lines.append(f"  {kind} on {seg.src}: M={seg.m} K={seg.k} -> {parts}")
        return "\n".join(lines)

    def _device_weights(self, dev: int, layout: str = "plain"):
        """Per segment (weights, bias) on GPU `dev`, the weights in `layout`: "plain"
        (K, M); "pad4", rows padded with zeros to a multiple of 4 (the async kernel's
        16-byte copies); "tc", split and in fragment order (`tc_frag_weights`)."""
        import cupy

        w = self._weights.get((dev, layout))
        if w is None:
            w = [(cupy.asarray(layout_weights(s, layout)), cupy.asarray(s.bias))
                 for s in self.segments]
            self._weights[dev, layout] = w
        return w

    @staticmethod
    def weight_layout(cfg: TileConfig) -> str:
        """The `_device_weights` layout `cfg`'s kernel reads."""
        return "tc" if cfg.tc else "pad4" if cfg.stages else "plain"

    def descriptors(self, n: int, H: int, W: int, cfg: TileConfig, pointers=None,
                    splits=None) -> np.ndarray:
        """The (segments, NF) int64 descriptor table of a batch of n H x W images.

        `pointers`: per segment (weights, bias, gather table, split-K workspace,
        split-K counters) device addresses; zeros when None (for inspection and the
        CPU emulation in the tests). `splits`: K chunks per segment (default 1 each).
        """
        ncols = n * H * W
        ntile = -(-ncols // cfg.bn)
        desc = np.zeros((len(self.segments), NF), np.int64)
        tile0 = 0
        for i, seg in enumerate(self.segments):
            mt = -(-seg.m // cfg.bm)
            one = splits is None or not cfg.splittable
            sp, chunk = split_k(seg.k, cfg.bk, 1 if one else splits[i])
            row = desc[i]
            row[F_KIND] = segment_kind(seg, cfg)
            row[F_SRC] = self.slots.index(seg.src)
            row[F_CIN], row[F_K], row[F_M] = seg.cin, seg.k, seg.m
            if pointers is not None:
                row[F_W], row[F_BIAS], row[F_TAB], row[F_WS], row[F_CNT] = pointers[i]
            row[F_TILE0], row[F_MTILES] = tile0, mt
            row[F_SPLITS], row[F_KCHUNK] = sp, chunk
            row[F_NPARTS] = len(seg.parts)
            for j, (first, slot, off) in enumerate(seg.parts):
                row[F_PART0 + 4 * j: F_PART0 + 4 * j + 4] = (
                    first, self.slots.index(slot), self._need[slot], off)
            tile0 += mt * ntile * sp
        if tile0 >= 2**31:
            raise ValueError("batch too large: more than 2**31 - 1 tiles")
        return desc

    @staticmethod
    def grid_size(desc: np.ndarray, n: int, H: int, W: int, cfg: TileConfig) -> int:
        last = desc[-1]
        return int(last[F_TILE0] + last[F_MTILES] * last[F_SPLITS] * -(-(n * H * W) // cfg.bn))

    def choose_splits(self, n: int, H: int, W: int, cfg: TileConfig, sm_count: int) -> list:
        """K chunks per segment: 1 unless the launch would leave most SMs idle.

        With fewer blocks than SMs each block's time is its K steps' latency
        (batch 1); cutting K in s chunks gives s times the blocks, each s times
        shorter, for the price of a partial-tile round trip through L2. Chunks keep
        at least 8 K steps. ``TSM_CONV_SPLITK=s`` forces s (for tests and tuning).
        """
        import os

        ntile = -(-(n * H * W) // cfg.bn)
        blocks = sum(-(-s.m // cfg.bm) * ntile for s in self.segments)
        forced = os.environ.get("TSM_CONV_SPLITK")
        if not cfg.splittable:  # every segment in one chunk
            want = [1] * len(self.segments)
        elif forced:
            want = [int(forced)] * len(self.segments)
        else:
            s = 1 if blocks >= sm_count else min(MAX_SPLITS, max(1, (2 * sm_count) // blocks))
            want = [min(s, max(1, seg.k // (8 * cfg.bk))) for seg in self.segments]
        return [split_k(seg.k, cfg.bk, w)[0] for seg, w in zip(self.segments, want)]

    def split_variants(self, n: int, H: int, W: int, cfg: TileConfig, sm_count: int) -> list:
        """The K chunkings the tuner times for `cfg`: `choose_splits`'s first, then, for
        a `splittable` tile whose launch is less than a wave (fewer blocks than SMs
        times the blocks an SM holds), every segment cut in s = 1, 2, 3, 4, 6, 8
        chunks of at least two K steps. Such a launch is bound by the latency of its
        blocks' serial work, which the model's rule of at least 8 steps a chunk
        leaves alone."""
        import os

        out = [self.choose_splits(n, H, W, cfg, sm_count)]
        if not cfg.splittable or os.environ.get("TSM_CONV_SPLITK"):
            return out
        ntile = -(-(n * H * W) // cfg.bn)
        blocks = sum(-(-s.m // cfg.bm) * ntile for s in self.segments)
        if blocks >= sm_count * cfg.minb:
            return out
        for s in (1, 2, 3, 4, 6, 8):
            sp = [split_k(seg.k, cfg.bk, min(s, max(1, seg.k // (2 * cfg.bk))))[0]
                  for seg in self.segments]
            if sp not in out and all(max(sp) != max(o) for o in out[1:]):  # one per label
                out.append(sp)
        return out

    def tune_label(self, cfg: TileConfig, splits, n: int, H: int, W: int, sm_count: int) -> str:
        """`autotune`'s name for `cfg` with K chunks `splits` (None: the model's) at n
        H x W images: the tag, or ``tag/kS`` (S the most chunks of a segment) where
        the chunks are not `choose_splits`'s."""
        base = self.choose_splits(n, H, W, cfg, sm_count)
        return cfg.tag if splits is None or list(splits) == base else f"{cfg.tag}/k{max(splits)}"

    def plan(self, n: int, H: int, W: int):
        """(kernel, descriptor array, grid, block, config, kept arrays, K chunks per segment,
        dynamic shared memory bytes)
        for n H x W images, made on first use and kept: the model's configuration
        (`choose_config`), or the measured fastest where a call has tuned it."""
        import cupy

        dev = cupy.cuda.Device().id
        key = (dev, n, H, W)
        p = self._plans.get(key)
        if p is None:
            p = self._plans[key] = self._build(
                self.config or choose_config(self.segments, n * H * W, _sm_count(dev),
                                             async_ok(self.segments, H, W), _tc_ok(dev)), n, H, W)
        return p

    def _build(self, cfg: TileConfig, n: int, H: int, W: int, splits=None):
        import cupy

        dev = cupy.cuda.Device().id
        biggest = max(list(self._need.values()) + list(self._cin.values())) * n * H * W
        if biggest >= 2**31:
            raise ValueError(f"tensors of {biggest} elements: the kernel indexes with 32 bits "
                             "(split the batch)")
        if splits is None:
            splits = self.choose_splits(n, H, W, cfg, _sm_count(dev))
        ntile = -(-(n * H * W) // cfg.bn)
        keep, ptrs = [], []
        for seg, sp, (wt, bias) in zip(self.segments, splits,
                                       self._device_weights(dev, self.weight_layout(cfg))):
            tab = ws = cnt = 0
            if seg.kind == KIND_RXR:
                t = cupy.asarray(segment_table(seg, cfg, H, W))
                keep.append(t)
                tab = t.data.ptr
            if sp > 1:
                tiles = -(-seg.m // cfg.bm) * ntile
                w = cupy.empty(tiles * sp * cfg.bm * cfg.bn, np.float32)
                c = cupy.zeros(tiles, np.int32)  # the kernel leaves them at zero again
                keep += [w, c]
                ws, cnt = w.data.ptr, c.data.ptr
            ptrs.append((wt.data.ptr, bias.data.ptr, tab, ws, cnt))
        desc = self.descriptors(n, H, W, cfg, ptrs, splits)
        grid = self.grid_size(desc, n, H, W, cfg)
        kern = _compile.get_kernel(FAMILY, cfg.name)
        smem = tc_smem_bytes(cfg) if cfg.tc else 0
        if smem > 48 * 1024 and getattr(kern, "max_dynamic_shared_size_bytes", 0) < smem:
            kern.max_dynamic_shared_size_bytes = smem
        return (kern, cupy.asarray(desc), (grid,), (cfg.threads,), cfg, keep, tuple(splits), smem)

    def tuning_wanted(self, n: int, H: int, W: int) -> bool:
        """Whether a first call at this size times the candidates (see `autotune`)."""
        import os

        if self.config is not None or os.environ.get("TSM_CONV_TILE") or \
                os.environ.get("TSM_CONV_SPLITK"):
            return False
        if not (self.tune if self.tune is not None else
                os.environ.get("TSM_CONV_TUNE", "1") != "0"):
            return False
        return n * H * W >= TUNE_MIN_COLUMNS

    def autotune(self, tensors: dict, reps: int = 5):
        """Time every candidate configuration (`candidates`) on `tensors` and keep the
        fastest for their size (the way ``torch.backends.cudnn.benchmark`` picks cuDNN's
        algorithm).

        Runs on the current stream and writes the group's outputs, as the kept
        configuration computes them. Each candidate's outputs are compared with the
        first's (`rel_diff`): one that differs by more than TUNE_AGREE is left out with
        a RuntimeWarning and not timed. Each configuration is timed with the K chunks
        of `split_variants`; returns {label: median ms}, the label the configuration's
        tag for `choose_splits`'s chunking and ``tag/kS`` for the others (S the most
        chunks of a segment). Called by the
        first call at a size of at least TUNE_MIN_COLUMNS columns (N*H*W) unless
        tuning is off (``ConvGroup(tune=False)`` or ``TSM_CONV_TUNE=0``); below that,
        and with a forced configuration, the model's choice stands.
        """
        import cupy

        n, H, W = self.check(tensors)
        dev = cupy.cuda.Device().id
        args_tail = [tensors[s] for s in self.slots]
        args_tail += [args_tail[0]] * (MAX_SLOTS - len(args_tail))
        times, best, best_tag, ref, first = {}, None, None, None, None
        stream = cupy.cuda.get_current_stream()
        written = [tensors[s] for s in self._need]
        sms = _sm_count(dev)
        tries = [(cfg, sp, self.tune_label(cfg, sp, n, H, W, sms))
                 for cfg in candidates(self.segments, H, W, _tc_ok(dev))
                 for sp in self.split_variants(n, H, W, cfg, sms)]
        for cfg, sp, tag in tries:
            p = self._build(cfg, n, H, W, sp)
            kern, desc, grid, block = p[:4]
            args = (desc, np.int32(len(self.segments)), *args_tail, np.int32(n), np.int32(H),
                    np.int32(W))
            if ref is not None:  # poison what the group writes: a skipped element shows
                for slot, c0, c1 in self._written_channels():
                    tensors[slot][:, c0:c1] = np.nan
            kern(grid, block, args, shared_mem=p[7])  # warm-up (and the module load)
            # Every candidate must compute what the first did: one that disagrees is
            # left out, with a warning (a safety net for configurations new to a GPU).
            if ref is None:
                ref, first = [w.copy() for w in written], tag
            else:
                diff = max((rel_diff(w, r) for w, r in zip(written, ref)), default=0.0)
                if not diff <= TUNE_AGREE:
                    import warnings

                    warnings.warn(f"ConvGroup.autotune: {tag} differs from {first} "
                                  f"by {diff:.2e} (relative): left out", RuntimeWarning,
                                  stacklevel=2)
                    continue
            ts = []
            for _ in range(reps):
                e0, e1 = cupy.cuda.Event(), cupy.cuda.Event()
                e0.record(stream)
                kern(grid, block, args, shared_mem=p[7])
                e1.record(stream)
                e1.synchronize()
                ts.append(cupy.cuda.get_elapsed_time(e0, e1))
            times[tag] = float(np.median(ts))
            if best is None or times[tag] < times[best_tag]:
                best, best_tag = p, tag
        self._plans[dev, n, H, W] = best
        self._launches.pop((dev, n, H, W), None)
        # The outputs as the kept plan computes them (the last candidate run may have
        # been one left out).
        best[0](best[2], best[3], (best[1], np.int32(len(self.segments)), *args_tail,
                                   np.int32(n), np.int32(H), np.int32(W)), shared_mem=best[7])
        return times

    def _written_channels(self) -> list:
        """(slot, first channel, end channel) of every channel range the group writes."""
        out = []
        for seg in self.segments:
            for i, (row, slot, off) in enumerate(seg.parts):
                end = seg.parts[i + 1][0] if i + 1 < len(seg.parts) else seg.m
                out.append((slot, off, off + end - row))
        return out

    def check(self, tensors: dict):
        """(n, H, W) of the bound tensors; ValueError if any disagrees with the group."""
        n = H = W = None
        for name in self.slots:
            t = tensors.get(name)
            if t is None:
                raise ValueError(f"tensor for slot {name!r} missing")
            if t.ndim != 4 or t.dtype != np.float32 or not t.flags.c_contiguous:
                raise ValueError(f"slot {name!r}: need a C-contiguous 4-D float32 array; "
                                 f"got shape {t.shape}, {t.dtype}")
            if n is None:
                n, _, H, W = t.shape
            elif (t.shape[0], t.shape[2], t.shape[3]) != (n, H, W):
                raise ValueError(f"slot {name!r} has shape {t.shape}; batch and image size "
                                 f"must be {(n, H, W)} in every slot")
            c = t.shape[1]
            if name in self._cin and c != self._cin[name]:
                raise ValueError(f"slot {name!r} has {c} channels; its convolutions read {self._cin[name]}")
            if name in self._need and c != self._need[name]:
                raise ValueError(f"slot {name!r} has {c} channels; the group writes {self._need[name]}")
        return n, H, W

    def _dims(self, tensors: dict):
        """`check`, remembered per layout: (shape, strides, dtype) of every slot's array
        decide the result, so a layout seen before costs three attribute reads a slot."""
        try:
            sig = tuple([(t.shape, t.strides, t.dtype)
                         for t in map(tensors.__getitem__, self.slots)])
        except (KeyError, AttributeError):  # check says what is wrong
            return self.check(tensors)
        dims = self._checked.get(sig)
        if dims is None:
            dims = self.check(tensors)
            if len(self._checked) >= 16:
                self._checked.clear()
            self._checked[sig] = dims
        return dims

    def launcher(self, device: int, n: int, H: int, W: int):
        """The launch of this size on `device` (called as ``launch(ptrs, stream)``: raw
        device pointers, one per slot in `slots` order, and a raw stream), or None if
        the group has not run this size there yet (its tuned plan and argument block
        come with the first call). For callers that have validated their tensors
        themselves: the Inception block's torch path, with no DLPack views per call."""
        return self._launches.get((device, n, H, W))

    def __call__(self, tensors: dict, *, checked: bool = False):
        """Run the group on `tensors` (slot name -> CuPy array), on the current stream.

        `checked=True` skips `check` (the caller has validated the shapes already:
        the Inception forward does, once per call, for both of its groups). A group
        is launched through ``cuLaunchKernel`` with an argument block built once per
        size (its slot pointers rewritten per call): CuPy's kernel call spent 10 us
        of host time packing the ten arguments, a third of a batch-1 call (H100 host).
        """
        if checked:
            t0 = tensors[self.slots[0]]
            n, H, W = t0.shape[0], t0.shape[2], t0.shape[3]
        else:
            n, H, W = self._dims(tensors)
        if n * H * W == 0:
            return
        import cupy

        key = (cupy.cuda.runtime.getDevice(), n, H, W)
        launch = self._launches.get(key)
        if launch is None:
            if key not in self._plans and self.tuning_wanted(n, H, W):
                self.autotune(tensors)
            launch = self._launches[key] = _GroupLaunch(self.plan(n, H, W), len(self.segments),
                                                         n, H, W)
        launch([tensors[s].data.ptr for s in self.slots], cupy.cuda.get_current_stream().ptr)


class _GroupLaunch:
    """One plan's launch: the kernel handle, the grid and an argument block built once;
    a call writes the slots' pointers into it and calls ``cuLaunchKernel`` (CuPy's
    driver binding; CuPy's kernel call where that is missing). Like the split-K
    workspace, the block is per group: one group must not be called from two host
    threads at once."""

    __slots__ = ("plan", "fptr", "grid", "block", "smem", "slots", "vals", "ptrs", "addr", "args")

    def __init__(self, plan, nseg: int, n: int, H: int, W: int):
        import ctypes

        self.plan = plan  # keeps the descriptors and workspaces alive
        kern, desc, grid, block = plan[:4]
        self.fptr = _batched.func_ptr(kern)
        self.grid, self.block, self.smem = grid[0], block[0], plan[7]
        self.slots = [ctypes.c_void_p(0) for _ in range(MAX_SLOTS)]
        self.vals = (ctypes.c_void_p(desc.data.ptr), ctypes.c_int(nseg), *self.slots,
                     ctypes.c_int(n), ctypes.c_int(H), ctypes.c_int(W))
        self.ptrs = (ctypes.c_void_p * len(self.vals))(*[ctypes.addressof(v) for v in self.vals])
        self.addr = ctypes.addressof(self.ptrs)
        self.args = (desc, np.int32(nseg), np.int32(n), np.int32(H), np.int32(W))

    def __call__(self, ptrs: list, stream: int):
        # Slots past the group's own are never read by the kernel: they stay 0.
        if _batched._DIRECT[0]:
            for slot, ptr in zip(self.slots, ptrs):
                slot.value = ptr
            try:
                _batched._driver_launch()(self.fptr, self.grid, 1, 1, self.block, 1, 1,
                                          self.smem, stream, self.addr, 0)
                return
            except Exception:  # an older CuPy without it: its kernel call from now on
                _batched._DIRECT[0] = False
        ptrs = ptrs + [0] * (MAX_SLOTS - len(ptrs))
        desc, nseg, n, H, W = self.args
        with _batched._stream_from_ptr(stream):  # pointers as 8-byte integers
            self.plan[0]((self.grid,), (self.block,),
                         (desc, nseg, *[np.uint64(p) for p in ptrs], n, H, W),
                         shared_mem=self.smem)
