"""Grouped same-padding convolutions with bias and ReLU, one launch per group
(``kernels/conv.cu``): the engine under ``apps/inception``.

Public name (re-exported lazily by ``tsm_core``): ``ConvGroup``.

A `ConvGroup` is a list of `ConvSpec` convolutions (stride 1, odd R x R kernel,
padding R // 2, optionally a 3x3 stride-1 max-pool of the input first), each
reading an NCHW float32 tensor named by a slot and writing relu(conv + bias) into
a channel slice of other named tensors. Calling the group with those tensors runs
all of it in ONE kernel launch:

- 1x1 convolutions that read the same slot become one GEMM over their
  concatenated weights (the rows split into parts, each stored in its own
  destination slice);
- R x R convolutions are implicit GEMMs: the input patch is gathered while a
  shared-memory tile is loaded (no im2col buffer);
- the pool branch max-pools while loading its GEMM tile (the pooled tensor is
  never written);
- bias and ReLU are applied in the epilogue, which writes straight into the
  destination's channel slice (a concatenation costs nothing);
- where the launch would leave SMs idle (small batches), K is cut into chunks
  (split-K) and the last block of each tile adds the partials in a fixed order,
  in the same launch (`ConvGroup.choose_splits`).

Tiles: BM x BN per block from `CONFIGS` (128x128 down to 32x32, register-blocked
8x8 or 4x4 per thread), picked per launch by `choose_config`'s model.

NaN: the max-pool and ReLU use fmaxf, which returns the other operand of a NaN
(torch propagates it); finite inputs give the same results.

Slots: a call binds up to four CUDA tensors (CuPy arrays, C-contiguous NCHW
float32) by name; descriptors (weights, biases, gather tables, tile map, split-K
workspace and counters) live in device memory, built once per (device, batch, H, W)
and reused, so a call uploads nothing. The split-K workspace is per group: one
group must not run on two streams at once.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np

from tsm_core import _compile

FAMILY = "conv"
MAX_SLOTS = 4
MAX_PARTS = 6  # tsm_conv::MAX_PARTS
NF = 15 + 4 * MAX_PARTS  # tsm_conv::NF
(F_KIND, F_SRC, F_CIN, F_K, F_M, F_W, F_BIAS, F_TAB, F_TILE0, F_MTILES, F_NPARTS,
 F_SPLITS, F_KCHUNK, F_WS, F_CNT, F_PART0) = range(16)
MAX_SPLITS = 8
KIND_1X1, KIND_POOL, KIND_RXR = 0, 1, 2


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

    @property
    def threads(self) -> int:
        return (self.bm // self.tm) * (self.bn // self.tn)

    @property
    def name(self) -> str:
        return f"conv_gemm_relu<{self.bm}, {self.bn}, {self.bk}, {self.tm}, {self.tn}, {self.minb}>"


# Candidates, largest first. Registers on sm_90 (compile_report): 167, 125, 126, 80, 128;
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
)
# Relative speed of a block-tile's FMAs (register blocking and shared-memory reads
# per FMA); a guess to be replaced by measurements (see choose_config).
_EFFICIENCY = {(128, 128): 1.0, (128, 64): 0.9, (64, 128): 0.9, (64, 64): 0.7, (32, 32): 0.45}


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
            kind = KIND_POOL if sp.pool else (KIND_1X1 if sp.r == 1 else KIND_RXR)
            segs.append({"kind": kind, "specs": [sp], "parts": list(sp.dst), "cin": sp.cin})
    out = []
    for seg in segs:
        sps = seg["specs"]
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
    splits = max(1, min(int(splits), -(-k // bk)))
    chunk = -(-(-(-k // splits)) // bk) * bk
    return -(-k // chunk), chunk


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


def choose_config(segments, ncols: int, sm_count: int) -> TileConfig:
    """The candidate with the least modelled time (a model, not a measurement).

    Per SM: ceil(blocks / SMs) block-tiles of BM*BN*K FMAs, at 128 FMA lanes times
    the tile's efficiency, times the fraction of the four schedulers the resident
    warps can keep busy (a lone 64-thread block feeds only two). Small batches so
    pick small tiles (more SMs busy), large batches large ones.
    ``TSM_CONV_TILE=BMxBN`` (e.g. ``128x64``) forces a candidate, for tuning sweeps.
    """
    import os

    forced = os.environ.get("TSM_CONV_TILE")
    if forced:
        for cfg in CONFIGS:
            if f"{cfg.bm}x{cfg.bn}" == forced:
                return cfg
        raise ValueError(f"TSM_CONV_TILE={forced!r}: not one of "
                         f"{[f'{c.bm}x{c.bn}' for c in CONFIGS]}")
    best, best_t = None, None
    for cfg in CONFIGS:
        ntile = -(-ncols // cfg.bn)
        blocks = sum(-(-s.m // cfg.bm) * ntile for s in segments)
        work = sum(-(-s.m // cfg.bm) * ntile * s.k for s in segments) / max(blocks, 1)
        per_sm = -(-blocks // sm_count)
        resident = min(per_sm, cfg.minb)
        busy = min(1.0, resident * cfg.threads / 32 / 4)
        t = per_sm * cfg.bm * cfg.bn * work / (128 * _EFFICIENCY[cfg.bm, cfg.bn] * busy)
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

    Examples
    --------
    >>> import numpy as np
    >>> from tsm_core import ConvGroup
    >>> from tsm_core._conv import ConvSpec
    >>> rng = np.random.default_rng(0)
    >>> w1, b1 = rng.standard_normal((8, 4, 1, 1)), rng.standard_normal(8)
    >>> w3, b3 = rng.standard_normal((6, 4, 3, 3)), rng.standard_normal(6)
    >>> g = ConvGroup([ConvSpec(w1, b1, "x", ("y", 0)), ConvSpec(w3, b3, "x", ("y", 8))])
    >>> g.slots
    ('x', 'y')
    >>> # with a GPU: g({"x": x, "y": y}) fills y's 14 channels from x (N, 4, H, W)
    """

    def __init__(self, specs, *, channels: dict | None = None, config: TileConfig | None = None):
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

    @property
    def flops_per_pixel(self) -> int:
        """2 * K * M summed over segments: FLOPs per output pixel of one image."""
        return sum(2 * s.k * s.m for s in self.segments)

    def describe(self, n: int, H: int, W: int, sm_count: int | None = None) -> str:
        """The launch in words: segments (GEMM shapes, parts) and the tile the model picks
        (for the current GPU's SM count, or an H100's 132 where there is no GPU)."""
        if sm_count is None:
            from tsm_core._arrays import has_gpu

            sm_count = 132
            if has_gpu():
                import cupy

                sm_count = _sm_count(cupy.cuda.Device().id)
        cfg = self.config or choose_config(self.segments, n * H * W, sm_count)
        desc = self.descriptors(n, H, W, cfg)
        names = {KIND_1X1: "1x1", KIND_POOL: "maxpool3x3+1x1", KIND_RXR: "conv"}
        lines = [f"one launch, tile {cfg.bm}x{cfg.bn}x{cfg.bk} ({cfg.threads} threads), "
                 f"{self.grid_size(desc, n, H, W, cfg)} blocks for N*H*W = {n * H * W} columns:"]
        for seg in self.segments:
            kind = names[seg.kind] if seg.kind != KIND_RXR else f"{seg.r}x{seg.r} implicit GEMM"
            parts = ", ".join(f"{slot}[{off}:]" for _, slot, off in seg.parts)
            lines.append(f"  {kind} on {seg.src}: M={seg.m} K={seg.k} -> {parts}")
        return "\n".join(lines)

    def _device_weights(self, dev: int):
        import cupy

        w = self._weights.get(dev)
        if w is None:
            w = [(cupy.asarray(s.wt), cupy.asarray(s.bias)) for s in self.segments]
            self._weights[dev] = w
        return w

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
            sp, chunk = split_k(seg.k, cfg.bk, 1 if splits is None else splits[i])
            row = desc[i]
            row[F_KIND] = seg.kind
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
        if forced:
            want = [int(forced)] * len(self.segments)
        else:
            s = 1 if blocks >= sm_count else min(MAX_SPLITS, max(1, (2 * sm_count) // blocks))
            want = [min(s, max(1, seg.k // (8 * cfg.bk))) for seg in self.segments]
        return [split_k(seg.k, cfg.bk, w)[0] for seg, w in zip(self.segments, want)]

    def plan(self, n: int, H: int, W: int):
        """(kernel, descriptor array, grid, block, config, kept arrays, K chunks per segment)
        for n H x W images, made on first use and kept."""
        import cupy

        dev = cupy.cuda.Device().id
        key = (dev, n, H, W)
        p = self._plans.get(key)
        if p is not None:
            return p
        biggest = max(list(self._need.values()) + list(self._cin.values())) * n * H * W
        if biggest >= 2**31:
            raise ValueError(f"tensors of {biggest} elements: the kernel indexes with 32 bits "
                             "(split the batch)")
        cfg = self.config or choose_config(self.segments, n * H * W, _sm_count(dev))
        splits = self.choose_splits(n, H, W, cfg, _sm_count(dev))
        ntile = -(-(n * H * W) // cfg.bn)
        keep, ptrs = [], []
        for seg, sp, (wt, bias) in zip(self.segments, splits, self._device_weights(dev)):
            tab = ws = cnt = 0
            if seg.kind == KIND_RXR:
                t = cupy.asarray(gather_table(seg.cin, seg.r, H, W))
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
        p = (kern, cupy.asarray(desc), (grid,), (cfg.threads,), cfg, keep, tuple(splits))
        self._plans[key] = p
        return p

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

    def __call__(self, tensors: dict, *, checked: bool = False):
        """Run the group on `tensors` (slot name -> CuPy array), on the current stream.

        `checked=True` skips `check` (the caller has validated the shapes already:
        the Inception forward does, once per call, for both of its groups).
        """
        if checked:
            t0 = tensors[self.slots[0]]
            n, H, W = t0.shape[0], t0.shape[2], t0.shape[3]
        else:
            n, H, W = self.check(tensors)
        if n * H * W == 0:
            return
        kern, desc, grid, block = self.plan(n, H, W)[:4]
        ptrs = [tensors[s] for s in self.slots]
        ptrs += [ptrs[0]] * (MAX_SLOTS - len(ptrs))
        kern(grid, block, (desc, np.int32(len(self.segments)), *ptrs,
                           np.int32(n), np.int32(H), np.int32(W)))
