"""Batched irregular GEMM: ``Cs[i] = alpha * As[i] @ Bs[i] + beta * Cs[i]`` in one launch.

The method of Zhang et al., "A load-balanced acceleration method for small and
irregular batch matrix multiplication on GPU" (J. Syst. Archit. 160, 2025):

- five tile types, 16x16, 16x32, 32x32 (128 threads) and 32x64, 64x64 (256
  threads), so that a thread's computation and loads are similar whatever tile it
  works on (section 4.1, Table 3); the kernel is ``batched/batched.cu``. Ours adds
  two for float32: 128 x 64 with 8 x 4 outputs a thread (kernel version 3) and 128
  x 128 with 8 x 8 (version 4, on request; version 5 runs them on the tensor cores
  in 3xTF32 where K >= 128 and feeds every 256-thread type by cp.async). A float32
  call runs version 1, 3 or 5, whichever a cost model fitted to measured device
  times says is fastest for its plans (`plan_cost`);
- a tiling algorithm (section 4.2, Algorithm 1): every problem starts from the
  largest tile that suits it, then all tiles are shrunk one step at a time until
  the thread-level parallelism, counted in warps that can really be resident on
  the GPU (Eq. 4-9, from the kernel's registers and shared memory and the SM
  count of ``tsm_core.device_spec()``), reaches the threshold of one full wave.

The paper's code needs every size to be a multiple of its tile (Eq. 10); ours
does not: the initial tile is the largest one that fits the problem without
padding its C to more than MAX_PAD times its area, and edge tiles are masked in the
kernel.

Public: `batched_matmul` (re-exported by ``tsm_core``), `plan_batched` (the plan,
with `BatchedPlan.describe` for ``tsm_core.explain``), `prepare_batched` (bind a
batch once, launch it many times with no per-call planning or copying).

Layout rules. Each problem's A (M, K), B (K, N) and C (M, N) may have any strides:
C- or F-ordered, transposed or sliced views, and orders may differ from problem
to problem. All arrays of a call share one kind (numpy, CuPy, torch CUDA or torch
CPU), one dtype (float32 or float64; no mixing, no promotion) and, on the GPU, one
device. No output may overlap another output or any input of the batch.
"""

from __future__ import annotations

import functools
import math
import numbers
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from tsm_core.runtime import arrays as _arrays


from tsm_core.runtime import compile as _compile

__all__ = ["batched_matmul", "plan_batched", "prepare_batched", "BatchedPlan", "PreparedBatch",
           "TILE_TYPES"]

FAMILY = "batched"
BLOCK_THREADS = 256
BK = 16
META_STRIDE = 14  # TSM_BATCHED_META_STRIDE: 12 columns of the problem, 2 of split-K


@dataclass(frozen=True)
class TileType:
    """A tile type: the paper's five (Table 3), and version 3's 128 x 128."""

    name: str
    tm: int       # tile rows of C
    tn: int       # tile columns of C
    threads: int  # threads that compute it (the rest of the 256-thread block retire)

    @property
    def outputs_per_thread(self) -> int:  # W_CP, Eq. (1)
        return self.tm * self.tn // self.threads

    @property
    def loads_per_thread(self) -> int:  # W_DL, Eq. (2) with T_k = 16
        return (self.tm * self.tn + self.tm * BK + BK * self.tn) // self.threads


# Index = the type id the kernel switches on; from smallest to largest. The first
# five are the paper's (Table 3). The last two are ours, float32 only: 128 x 64
# tiles of 8 x 4 outputs a thread (kernel versions 3 and 4) and 128 x 128 tiles of
# 8 x 8 (version 4), for large problems, where the 64 x 64 type's 4 x 4 outputs a
# thread (two 16-byte shared reads per 16 FMAs) hold it to about 27 TFLOP/s.
TILE_TYPES = (
    TileType("small", 16, 16, 128),
    TileType("small-medium", 16, 32, 128),
    TileType("medium", 32, 32, 128),
    TileType("medium-large", 32, 64, 256),
    TileType("large", 64, 64, 256),
    TileType("wide", 128, 64, 256),
    TileType("xlarge", 128, 128, 256),
)
PAPER_TYPES = 5  # TILE_TYPES[:5]: what versions 0 to 2 use
WIDE_TYPE, XL_TYPE = 5, 6  # the 128 x 64 and 128 x 128 types
_TM = np.array([t.tm for t in TILE_TYPES], dtype=np.int64)
_TN = np.array([t.tn for t in TILE_TYPES], dtype=np.int64)
_THREADS = np.array([t.threads for t in TILE_TYPES], dtype=np.int64)

# The initial tile may pad a problem's C by at most this factor (our replacement
# of Eq. 10's divisibility condition). Session 19 (H100, device time of the call's
# own choice over the sweep's 72 cells, benchmarks/batched_versions_probe.py with
# the knob set): 1.5 ran 1.078x and 2 1.091x of 1.25, up to 1.59x on cells of
# large batches (256 / 128 / 256) and down to 0.78x on a few of batch 8-16: a tile
# four times larger computes up to twice the area it needs and is still faster
# (at 1.25 a 130 x 130 problem got 16 x 16 tiles; at 2, 32 x 64).
MAX_PAD = 2.0

# Registers per thread of each instantiation, for planning where neither a GPU nor
# NVRTC can tell (NVRTC 12/13 for sm_90 report these; tests/test_batched_compile.py
# checks they are current).
REGS_FALLBACK = {"float32": 80, "float64": 128}
REGS_FALLBACK_V2 = {"float32": 127, "float64": 126}  # version 2: two blocks per SM
REGS_FALLBACK_V3 = {"float32": 80}  # version 3 (float32 only): three blocks per SM
REGS_FALLBACK_V4 = {"float32": 128}  # version 4 (float32 only): two blocks per SM
REGS_FALLBACK_V5 = {"float32": 128}  # version 5 (float32 only): two blocks per SM
REGS_FALLBACK_V6 = {"float32": 128}  # version 6 (float32, sm_90a): two blocks per SM
# Spilled bytes the compile test accepts per version (NVRTC for sm_90). Version 3
# spills 36 at the 80 registers of three blocks per SM (its 128 x 64 path alone
# needs 79) and is still 1.0-1.23x faster than version 1 on the H100; out of line
# (__noinline__), with no spills, it ran at 0.82-1.0x of version 1
# (benchmarks/batched_v3_variants_probe.py, session 14).
SPILL_BYTES_ALLOWED = {3: 64, 6: 72}


def regs_fallback(dtype, version: int) -> int:
    """The table's registers per thread for `dtype` and kernel `version`."""
    name = np.dtype(dtype).name
    table = {2: REGS_FALLBACK_V2, 3: REGS_FALLBACK_V3, 4: REGS_FALLBACK_V4,
             5: REGS_FALLBACK_V5, 6: REGS_FALLBACK_V6}.get(version, REGS_FALLBACK)
    return table[name]


def blocks_per_sm_bound(dtype, version: int) -> int:
    """Blocks per SM the kernel's launch bounds promise (__launch_bounds__(256, n))."""
    return 3 if np.dtype(dtype) == np.float32 and version in (0, 1, 3) else 2


def top_type(version: int) -> int:
    """The largest tile type kernel `version` has (an index into TILE_TYPES)."""
    return {3: WIDE_TYPE, 4: XL_TYPE, 5: XL_TYPE, 6: XL_TYPE}.get(version, PAPER_TYPES - 1)


# Kernel versions (the optimisation ladder of batched/batched.cu): 0, the first
# version (one shared slab, two barriers per step, 64-bit addressing per element);
# 1, the default (double-buffered slabs, one barrier, 32-bit in-tile offsets); 2,
# version 1 with the 32 x 32, 32 x 64 and 64 x 64 tiles on the tensor cores: float32
# in 3xTF32 for problems with K >= TC_MIN_K, float64 on DMMA for every K; 3, float32
# only, version 1 plus the 128 x 64 type ("wide"), three blocks per SM; 4, float32
# only, version 3 plus the 128 x 128 type ("xlarge"), two blocks per SM; 5, float32
# only, two blocks per SM: the 256-thread types (32 x 64, 64 x 64, 128 x 64, 128 x
# 128) fed by cp.async rings instead of registers, and the 128 x 128 tiles of
# problems with K >= TC_MIN_K on the tensor cores (3xTF32, ldmatrix fragments); 6,
# float32 on compute capability 9.0 only (sm_90a): version 5 with those tiles on
# wgmma (warpgroup MMAs, B read from shared memory by the tensor cores).
VERSIONS = (0, 1, 2, 3, 4, 5, 6)
DEFAULT_VERSION = 1
WIDE_VERSION = 3
XL_VERSION = 4
FLOAT32_ONLY = (3, 4, 5, 6)
TC3_VERSION = 5
WG3_VERSION = 6
TC3_VERSIONS = (TC3_VERSION, WG3_VERSION)  # the 128 x 128 tiles on the tensor cores
# Version 5's cp.async rings (TSM_BATCHED_*): STAGES slabs of BK for the FMA tiles,
# XSTAGES of XBK for 128 x 128 FMA tiles, TC3_STAGES of TC3_BK for the tensor-core ones.
STAGES = 3
XSTAGES = 4
TC3_BK, TC3_STAGES = 16, 3
DYNAMIC_SMEM = (5, 6)  # versions whose shared memory is dynamic (passes 48 KB)
XBK = 8  # TSM_BATCHED_XBK: the k step of the 128 x 64 and 128 x 128 types
# Until session 20 (now: the cost model, TILE_COSTS below; `wide_pays` and `tc3_pays`
# remain, reported by the bench), float32 batches took version 3 where its plan put
# at least WIDE_MIN_SHARE of the FLOPs in 128 x 64 tiles and had at least
# WIDE_MIN_WAVES full waves of them (blocks resident at once): `wide_pays`. Measured on the H100 (session 14, device time over
# version 1, the 72 cells of the batched bench): the 18 cells past both bounds read
# 1.05-1.32x; with fewer 128 x 64 tiles than a wave, a few long blocks can make the
# tail (down to 0.69x), and with none at all version 3 reads 0.94-1.02x
# (its register spills). Version 4 is taken on request only: on uniform batches of
# 256-1024 rows it read 1.14-1.24x over version 1 against version 3's 1.13-1.26x,
# ahead in two cases of five (multiples of 128, K >= 256), and on the sweep 0.89x
# (two blocks per SM slow the small tiles).
# Session 19: with split-K the long tiles of a plan under a wave no longer make the
# tail (1024 / 512 / 8: 0.76x in session 14, 1.11x now; 512 / 512 / 16: 0.74x,
# 1.07x), so a third of a wave suffices: in the two runs of
# benchmarks/results/h100/batched*.json (session 19) the nine cells this adds read
# 0.98-1.20x over version 1 (geomean over the sweep 1.012x); the cells under 0.3 of
# a wave where version 3 has wide tiles read 0.84-1.03x.
WIDE_MIN_SHARE = 0.2
WIDE_MIN_WAVES = 0.3
# And version 5 where its plan put at least TC3_MIN_SHARE of the work in at least
# TC3_MIN_WAVES waves of tensor-core tiles (128 x 128, K >= TC_MIN_K): `tc3_pays`.
# Measured on the H100 (session 18, device time, the sweep's cells of 512
# rows and more; benchmarks/results/h100/batched_s18/versions_3e9dec8.json): the six
# cells past both bounds read 1.014-1.105x over the version chosen before (1 or 3);
# elsewhere version 5 read 0.69-1.18x of it (its small tiles at two blocks per SM), so
# it is not taken there.
TC3_MIN_SHARE = 0.45
TC3_MIN_WAVES = 2.0
# The fine-tuning loop's threshold as a fraction of the threads the GPU holds at once
# with the kernel: 1, the paper's. Measured on the H100 (session 18,
# benchmarks/batched_planner_probe.py tlp, the sweep's 60 cells of batch <= 256):
# fractions 0.5 / 0.25 / 0.125 ran at 0.971x / 0.944x / 0.925x of its speed (geomean;
# 0.5 ahead in two cells, by 1.07x and 1.17x).
TLP_FRACTION = 1.0
# Versions 1 and 2 form in-tile offsets (< 64 rows x 16 k) in int: strides must stay
# below this.
V1_MAX_STRIDE = 2**24
TC_MIN_K = 128  # TSM_BATCHED_TC_MIN_K in batched/batched.cu
# Whether batches run version 2 by default, per dtype (``TSM_BATCHED_TC=1`` / ``0``
# sets both). Measured on the H100 in session 11 (docs/NOTES.md):
# - float64 (DMMA): 1.06-1.99x faster than version 1 in device time, geomean 1.56x
#   over seven cells of the paper's sweep (benchmarks/batched_f64_probe.py): on.
# - float32 (3xTF32): 0.65-1.17x of version 1, geomean 0.91x over the 72 cells of
#   the batched bench (two blocks per SM instead of three, and the register-staged
#   fetch, not the FMAs, bound these tiles): off.
TC_DEFAULT = {"float32": False, "float64": True}


# Split-K (versions 1, 3 and 5, batched/batched.cu). A plan's tiles run in waves;
# where a few tiles of long K take longer than the average load of a block slot
# (the total work over the slots the GPU holds), they hold the launch while the
# other SMs idle. Such plans, if under SPLIT_MAX_WAVES waves of tiles, cut the K
# of those problems in two, round by round (up to SPLIT_MAX chunks of at least
# SPLIT_MIN_CHUNK), until no tile holds the launch. A tile's time is modelled as
# its outputs per thread times its k plus SPLIT_TILE_COST. The S tiles of one
# output tile add their partial sums through a workspace; the last one stores.
# Measured on the H100 (session 19, benchmarks/batched_splitk_probe.py, device
# time over the sweep's 72 cells): splitting every plan under 3 waves, 1.2-1.4x on
# the cells of K up to 512 and few tiles but 0.89x where small tiles split (128 /
# 512 / 32: none dominates there); chunks of 64 lost up to 0.75x on cells of K up
# to 256. ``TSM_BATCHED_SPLITK=0`` turns it off.
SPLIT_VERSIONS = (1, 3, 5, 6)
SPLIT_MAX_WAVES = 3.0
SPLIT_MIN_CHUNK = 128
SPLIT_MAX = 16
SPLIT_TILE_COST = 300  # a tile's fixed cost, in FMAs per thread
SPLIT_ALIGN = 16  # TSM_BATCHED_SPLIT_ALIGN: chunks are multiples of this


def splitk_default() -> bool:
    """Whether plans may split K (``TSM_BATCHED_SPLITK=0`` turns it off; on by default)."""
    import os

    v = os.environ.get("TSM_BATCHED_SPLITK", "").strip().lower()
    return v not in ("0", "false", "no", "off")


def split_chunk(K, S):
    """k per chunk when K is cut into S (the kernel's split_chunk): ceil(K / S)
    rounded up to SPLIT_ALIGN; the last chunk takes what is left."""
    K = np.asarray(K, dtype=np.int64)
    S = np.maximum(np.asarray(S, dtype=np.int64), 1)
    return -(-(-(-K // S)) // SPLIT_ALIGN) * SPLIT_ALIGN


def _settle_splits(K, S):
    """The largest S' <= S whose chunks are all non-empty (ceil(K / chunk) == S')."""
    K = np.asarray(K, dtype=np.int64)
    S = np.maximum(np.asarray(S, dtype=np.int64), 1).copy()
    while True:
        c = split_chunk(K, S)
        used = np.where(K > 0, -(-K // np.maximum(c, 1)), 1)
        bad = used < S
        if not bad.any():
            return S
        S[bad] = np.maximum(used[bad], 1)


def choose_splits(shapes, types, res, live=None) -> np.ndarray:
    """Splits per problem (1: none) for a plan of `types` (see SPLIT_MAX_WAVES)."""
    s = np.asarray(shapes, dtype=np.int64).reshape(-1, 3)
    P = len(s)
    S = np.ones(P, dtype=np.int64)
    if P == 0:
        return S
    live = np.ones(P, bool) if live is None else live
    tiles = np.where(live, tile_counts(s[:, 0], s[:, 1], types), 0)
    slots = res.sm_count * max(1, res.blocks_per_sm)
    per_k = np.array([t.outputs_per_thread for t in TILE_TYPES], dtype=np.int64)[types]
    K = s[:, 2]
    while int((tiles * S).sum()) < SPLIT_MAX_WAVES * slots:
        t = per_k * (-(-K // S)) + SPLIT_TILE_COST  # each problem's tile time
        load = float((tiles * S * t).sum()) / slots  # average work of a block slot
        grow = (tiles > 0) & (t > load) & (K // S >= 2 * SPLIT_MIN_CHUNK) & (2 * S <= SPLIT_MAX)
        if not grow.any():
            break
        S[grow] *= 2
    return _settle_splits(K, S)


def tc_default(dtype=np.float64) -> bool:
    """Whether batches of `dtype` take version 2 (the tensor cores) by default."""
    import os

    v = os.environ.get("TSM_BATCHED_TC", "").strip().lower()
    if not v:
        return TC_DEFAULT[np.dtype(dtype).name]
    return v not in ("0", "false", "no", "off")


def wide_default() -> bool:
    """Whether float32 batches may take version 3 (``TSM_BATCHED_WIDE=0`` keeps them
    on version 1; on by default)."""
    import os

    v = os.environ.get("TSM_BATCHED_WIDE", "").strip().lower()
    return v not in ("0", "false", "no", "off")


def tc3_default() -> bool:
    """Whether float32 batches may take version 5 (``TSM_BATCHED_TC3=0`` keeps them
    on versions 1 and 3; on by default)."""
    import os

    v = os.environ.get("TSM_BATCHED_TC3", "").strip().lower()
    return v not in ("0", "false", "no", "off")


def wgmma_ok() -> bool:
    """Whether the current device runs version 6 (wgmma: compute capability 9.0)."""
    import cupy

    return int(cupy.cuda.Device().compute_capability) == 90


def _name_expr(dtype, version: int = DEFAULT_VERSION) -> str:
    return f"tsm_batched_gemm<{_compile.ctype(dtype)}, {int(version)}>"


def smem_bytes(dtype, version: int = DEFAULT_VERSION) -> int:
    """Shared memory of the kernel: a 16-deep slab of A and of B for the 64x64 type,
    or an 8-deep one for 128 x 128 if larger (versions 1 to 4 keep two of each;
    version 2's rows are padded by 32 bytes instead of 16); version 5 (dynamic, set
    at launch): the largest of its cp.async rings."""
    item = np.dtype(dtype).itemsize
    pad = (32 if version == 2 else 16) // item
    slab = 2 * BK * (64 + pad)
    if version in (3, 4):
        slab = max(slab, 2 * XBK * (128 + pad))
    words = (2 if version else 1) * slab
    if version in TC3_VERSIONS:  # dynamic: the largest of its rings
        words = max(words, STAGES * BK * (128 + 64 + 2 * pad), XSTAGES * XBK * (128 + 128 + 2 * pad),
                    TC3_STAGES * (128 + 128) * (TC3_BK + pad),
                    # version 6: its ring of unpadded slabs and one slab of lo(B)
                    (TC3_STAGES * 2 + 1) * 128 * TC3_BK if version == WG3_VERSION else 0)
    return words * item


# ------------------------------------------------------------------ the plan


@dataclass(frozen=True)
class Residency:
    """How many blocks of the kernel an SM holds (the conversion phi of Eq. 5-9)."""

    regs: int
    smem: int
    blocks_per_sm: int
    limit: str  # what bounds blocks_per_sm
    sm_count: int
    max_warps_per_sm: int

    @property
    def warps_per_sm(self) -> int:
        return min(self.max_warps_per_sm, self.blocks_per_sm * BLOCK_THREADS // 32)

    @property
    def capacity_warps(self) -> int:
        return self.sm_count * self.warps_per_sm

    @property
    def theoretical_occupancy(self) -> float:
        """Resident warps / the SM's maximum, with every warp of a block alive."""
        return self.warps_per_sm / self.max_warps_per_sm


def residency(spec, regs: int, smem: int) -> Residency:
    """Blocks of 256 threads resident per SM given registers and shared memory.

    Registers are allocated per warp in units of 256 (sm_50 onwards), shared memory
    per block with 1 KiB reserved by the system per block (sm_80 onwards); both as
    the CUDA occupancy calculator counts them.
    """
    warps = BLOCK_THREADS // 32
    per_warp = math.ceil(regs * 32 / 256) * 256 if regs > 0 else 0
    by_regs = (spec.regs_per_sm // (per_warp * warps)) if per_warp else 10**9
    by_threads = spec.max_threads_per_sm // BLOCK_THREADS
    by_smem = spec.smem_per_sm // (smem + 1024) if smem > 0 else 10**9
    limits = {"threads": by_threads, "registers": by_regs, "shared memory": by_smem,
              "blocks": 32}
    limit = min(limits, key=limits.get)
    return Residency(regs=regs, smem=smem, blocks_per_sm=max(0, limits[limit]), limit=limit,
                     sm_count=spec.sm_count,
                     max_warps_per_sm=spec.max_threads_per_sm // spec.warp_size)


def initial_types(M, N, top: int = PAPER_TYPES - 1) -> np.ndarray:
    """Each problem's initial tile type (Algorithm 1, line 3; our form of Eq. 10).

    The largest type up to `top` with Tm <= M, Tn <= N whose tiles pad C by at most
    MAX_PAD; where none qualifies (M or N below 16, or every type pads too much),
    the type of least padded area, the larger one on a tie.
    """
    M = np.asarray(M, dtype=np.int64)
    N = np.asarray(N, dtype=np.int64)
    out = np.full(M.shape, -1, dtype=np.int64)
    area = np.maximum(M * N, 1)
    best_pad = np.full(M.shape, np.iinfo(np.int64).max)
    fallback = np.zeros(M.shape, dtype=np.int64)
    for t in range(top, -1, -1):
        padded = -(-M // _TM[t]) * _TM[t] * (-(-N // _TN[t]) * _TN[t])
        ok = (out < 0) & (_TM[t] <= M) & (_TN[t] <= N) & (padded <= MAX_PAD * area)
        out[ok] = t
        better = padded < best_pad
        best_pad = np.where(better, padded, best_pad)
        fallback = np.where(better, t, fallback)
    return np.where(out < 0, fallback, out)


def tile_counts(M, N, types) -> np.ndarray:
    """Tiles of each problem's C under `types` (0 for an empty C)."""
    M = np.asarray(M, dtype=np.int64)
    N = np.asarray(N, dtype=np.int64)
    return (-(-M // _TM[types])) * (-(-N // _TN[types]))


def tlp(M, N, types, res: Residency) -> int:
    """TLP_new of Eq. (4): threads in warps that can be resident at once.

    phi turns the tiles into warps (128- or 256-thread tiles: 4 or 8 warps) and
    caps them at what the GPU holds with this kernel's registers and shared
    memory (Eq. 5-9, in CUDA terms: ``Residency.capacity_warps``).
    """
    warps = int(np.sum(tile_counts(M, N, types) * (_THREADS[types] // 32)))
    return min(warps, res.capacity_warps) * 32


@dataclass
class BatchedPlan:
    """The tiling of one batch: tile type per problem and the flat tile list.

    Attributes
    ----------
    shapes : numpy.ndarray, int64, shape (P, 3)
        (M, N, K) of each problem.
    types : numpy.ndarray, int64, shape (P,)
        Index into TILE_TYPES of each problem's tile.
    tiles : numpy.ndarray, int32, shape (T, 4)
        One row per block: (problem, m0, n0, type), longest work first.
    residency : Residency
    threshold : int
        TLP_threshold, in threads: one full wave of resident warps.
    history : list of (types histogram, TLP) per step of Algorithm 1.
    """

    shapes: np.ndarray
    dtype: np.dtype
    types: np.ndarray
    tiles: np.ndarray
    residency: Residency
    threshold: int
    history: list = field(default_factory=list)
    device: str = ""
    version: int = DEFAULT_VERSION  # the kernel version planned for
    splits: np.ndarray = None  # (P,) int64: k chunks per problem (1: not split)
    tile_split: np.ndarray = None  # (T, 2) int64: each tile's (split index, splits)

    @property
    def split_problems(self) -> int:
        return int(np.sum(self.splits > 1)) if self.splits is not None else 0

    @property
    def tile_k(self) -> np.ndarray:
        """k each tile multiplies (its chunk where split), int64, shape (T,)."""
        K = self.shapes[self.tiles[:, 0], 2] if self.n_tiles else np.zeros(0, np.int64)
        if self.tile_split is None or not self.n_tiles:
            return K
        s, S = self.tile_split[:, 0], self.tile_split[:, 1]
        c = split_chunk(K, S)
        return np.where(S > 1, np.minimum(c, K - s * c), K)

    def device_tiles(self) -> np.ndarray:
        """The tile list as the kernel reads it: (problem, m0, n0, word), the word
        holding the type in bits 0-3, split index in 4-11, splits in 12-19."""
        return tile_words(self.tiles, self.tile_split)

    def workspace(self):
        """Split-K's workspace per problem: (offsets in elements, counter offsets,
        total elements, total counters). A problem of S splits and T output tiles of
        area A takes T * S * A elements and T counters."""
        P = len(self.shapes)
        S = self.splits if self.splits is not None else np.ones(P, np.int64)
        on = S > 1
        tiles = np.where(on, tile_counts(self.shapes[:, 0], self.shapes[:, 1], self.types), 0)
        elems = tiles * S * _TM[self.types] * _TN[self.types]
        woff = np.cumsum(elems) - elems
        coff = np.cumsum(tiles) - tiles
        return woff, coff, int(elems.sum()), int(tiles.sum()), on

    @property
    def n_tiles(self) -> int:
        return int(self.tiles.shape[0])

    @property
    def flops(self) -> int:
        s = self.shapes
        return int(np.sum(2 * s[:, 0] * s[:, 1] * s[:, 2])) if len(s) else 0

    @property
    def active_warps(self) -> int:
        """Warps alive in the first wave (the first resident tiles of the list)."""
        cap = self.residency.sm_count * self.residency.blocks_per_sm
        first = self.tiles[:cap, 3]
        return int(np.sum(_THREADS[first] // 32))

    @property
    def wave_occupancy(self) -> float:
        """Estimated occupancy of the first wave: its live warps / the SMs' maximum
        (128-thread tiles retire half of their block's warps)."""
        full = self.residency.sm_count * self.residency.max_warps_per_sm
        return self.active_warps / full if full else 0.0

    def histogram(self) -> dict:
        return {TILE_TYPES[t].name: int(np.sum(self.types == t)) for t in range(len(TILE_TYPES))
                if np.any(self.types == t)}

    def describe(self) -> str:
        """The plan in words (what ``tsm_core.explain`` shows for a batch)."""
        r = self.residency
        P = len(self.shapes)
        lines = [f"Batched irregular GEMM: {P} problems, {self.dtype.name}, "
                 f"{self.flops / 1e9:.3f} GFLOP, one launch of {self.n_tiles} blocks x "
                 f"{BLOCK_THREADS} threads{(' on ' + self.device) if self.device else ''}, "
                 f"kernel version {self.version}{_VERSION_WORDS.get(self.version, '')}."]
        if P:
            s = self.shapes
            lines.append(f"  sizes: M {s[:, 0].min()}..{s[:, 0].max()}, N {s[:, 1].min()}.."
                         f"{s[:, 1].max()}, K {s[:, 2].min()}..{s[:, 2].max()}")
        lines.append(f"  residency: {r.regs} registers/thread, {r.smem} B shared/block -> "
                     f"{r.blocks_per_sm} blocks/SM (bound by {r.limit}), theoretical occupancy "
                     f"{r.theoretical_occupancy:.0%}; {r.sm_count} SMs hold "
                     f"{r.capacity_warps} warps")
        lines.append(f"  Algorithm 1 (TLP_threshold = {self.threshold} threads = one full wave):")
        for i, (hist, t) in enumerate(self.history):
            h = ", ".join(f"{k} {v}" for k, v in hist.items())
            lines.append(f"    step {i}: TLP {t} ({h})")
        if self.split_problems:
            S = self.splits[self.splits > 1]
            lines.append(f"  split-K: {self.split_problems} problems cut into {S.min()}.."
                         f"{S.max()} chunks of k (their tiles held the launch)")
        lines.append(f"  first wave: {self.active_warps} live warps, estimated occupancy "
                     f"{self.wave_occupancy:.0%}; waves: "
                     f"{self.n_tiles / max(1, r.sm_count * r.blocks_per_sm):.2f}")
        return "\n".join(lines)

    __str__ = describe


def tile_words(tiles, tile_split=None) -> np.ndarray:
    """(problem, m0, n0, type) rows and their (split index, splits) as the kernel's
    int4 tile list: type in bits 0-3 of the last word, split index in 4-11, splits in
    12-19 (0 where not split)."""
    t = np.array(tiles, dtype=np.int32).reshape(-1, 4)
    if tile_split is not None and len(t):
        ts = np.asarray(tile_split, dtype=np.int64)
        S = ts[:, 1]
        t[:, 3] |= np.where(S > 1, (ts[:, 0] << 4) | (S << 12), 0).astype(np.int32)
    return np.ascontiguousarray(t)


def build_tiles(shapes: np.ndarray, types: np.ndarray, splits=None, *, with_split=False):
    """The flat tile list (problem, m0, n0, type), int32, longest work first.

    Every element of every C lies in exactly one tile, or, where `splits` cuts a
    problem's K into S chunks, in S tiles (one per chunk). Work of a tile = its area
    times its k (the FMAs it performs); sorting by it puts long blocks in the first
    wave and short ones in the tail (longest-processing-time-first scheduling).
    With `with_split`, also each tile's (split index, splits), int64 (T, 2).
    """
    P = len(shapes)
    if P == 0:
        z = np.zeros((0, 4), dtype=np.int32)
        return (z, np.zeros((0, 2), np.int64)) if with_split else z
    M, N, K = shapes[:, 0], shapes[:, 1], shapes[:, 2]
    S = np.ones(P, np.int64) if splits is None else np.asarray(splits, np.int64)
    gm = -(-M // _TM[types])
    gn = -(-N // _TN[types])
    counts = gm * gn * S
    total = int(counts.sum())
    prob = np.repeat(np.arange(P, dtype=np.int64), counts)
    start = np.repeat(np.cumsum(counts) - counts, counts)
    local = np.arange(total, dtype=np.int64) - start
    Sp = S[prob]
    sidx = local % Sp  # the S chunks of one output tile are neighbours before sorting
    local //= Sp
    t = types[prob]
    gnp = gn[prob]
    m0 = (local // gnp) * _TM[t]
    n0 = (local % gnp) * _TN[t]
    Kp = K[prob]
    c = split_chunk(Kp, Sp)
    kl = np.where(Sp > 1, np.minimum(c, Kp - sidx * c), Kp)
    work = _TM[t] * _TN[t] * np.maximum(kl, 1)
    order = np.argsort(-work, kind="stable")
    tiles = np.ascontiguousarray(np.stack([prob, m0, n0, t], axis=1)[order], dtype=np.int32)
    if with_split:
        return tiles, np.stack([sidx, Sp], axis=1)[order]
    return tiles


def plan_batched(shapes, dtype=np.float32, *, spec=None, regs=None,
                 version: int = DEFAULT_VERSION, split_k=None) -> BatchedPlan:
    """Plan a batch: each problem's tile type (Algorithm 1) and the flat tile list.

    Parameters
    ----------
    shapes : sequence of (M, N, K)
        Problem i computes an (M, N) C from A (M, K) and B (K, N).
    dtype : float32 or float64
    spec : tsm_core DeviceSpec, optional
        The GPU planned for. Default: the current GPU (``device_spec``, attributes
        only), else the H100 of ``KNOWN_GPUS``.
    regs : int, optional
        Registers per thread of the kernel. Default: from the compiled kernel on a
        GPU, else from NVRTC, else REGS_FALLBACK.
    version : int
        Kernel version planned for (its registers and shared memory set the TLP
        threshold); see VERSIONS.
    split_k : bool, optional
        Whether K may be split (versions in SPLIT_VERSIONS; see SPLIT_MAX_WAVES).
        Default: `splitk_default()`.

    Returns
    -------
    BatchedPlan

    Examples
    --------
    >>> from tsm_core.batched.api import plan_batched
    >>> from tsm_core.runtime.device import KNOWN_GPUS
    >>> p = plan_batched([(100, 37, 64), (1, 1, 1)], spec=KNOWN_GPUS["H100"], regs=80)
    >>> int(p.tiles[:, 0].max())
    1
    """
    dtype = np.dtype(dtype)
    _compile.ctype(dtype)  # TypeError for anything but float32/float64
    if version not in VERSIONS:
        raise ValueError(f"version must be one of {VERSIONS}; got {version!r}")
    if version in FLOAT32_ONLY and dtype != _F32:
        raise ValueError(f"kernel version {version} (128-row tiles) is float32 only")
    s = np.asarray(shapes, dtype=np.int64).reshape(-1, 3)
    if np.any(s < 0):
        raise ValueError("problem sizes must be >= 0")
    if np.any(s >= 2**31):
        raise ValueError("every M, N and K must be below 2**31 (the kernel indexes with int)")
    if spec is None:
        spec = _default_spec()
    if regs is None:
        regs = kernel_regs(dtype, version)
    res = residency(spec, int(regs), smem_bytes(dtype, version))
    threshold = int(res.capacity_warps * 32 * TLP_FRACTION)
    live = (s[:, 0] > 0) & (s[:, 1] > 0) if len(s) else np.zeros(0, bool)
    M, N = s[:, 0], s[:, 1]
    types = initial_types(M, N, top_type(version))
    history = []

    def hist(ty):
        return {TILE_TYPES[t].name: int(np.sum(ty[live] == t)) for t in range(len(TILE_TYPES))
                if np.any(ty[live] == t)}

    cur = tlp(M[live], N[live], types[live], res)
    history.append((hist(types), cur))
    # Algorithm 1, lines 8-22: while the parallelism is short of the threshold, shrink
    # every tile one step (xlarge -> large -> medium-large -> medium -> small-medium ->
    # small).
    # The paper's listing reads "while TLP >= threshold"; its text (and the purpose of
    # the loop) is "if the TLP is not reached, fine-tune": that is what runs here.
    while cur < threshold and np.any(types[live] > 0):
        types = np.where(live & (types > 0), types - 1, types)
        cur = tlp(M[live], N[live], types[live], res)
        history.append((hist(types), cur))
    splits = np.ones(len(s), np.int64)
    if version in SPLIT_VERSIONS and (split_k if split_k is not None else splitk_default()):
        splits = choose_splits(s, types, res, live)
    tiles, tsplit = build_tiles(np.where(live[:, None], s, 0), types, splits, with_split=True)
    return BatchedPlan(shapes=s, dtype=dtype, types=types, tiles=tiles, residency=res,
                       threshold=threshold, history=history, device=spec.name,
                       version=int(version), splits=splits, tile_split=tsplit)


def _default_spec():
    from tsm_core.runtime import device as _device

    if _arrays.has_gpu():
        import cupy

        return _device.query(cupy.cuda.Device().id, measure_peaks=False)
    return _device.KNOWN_GPUS["H100"]


@functools.lru_cache(maxsize=None)
def _regs_nvrtc(dtype_name: str, version: int) -> int:
    return _compile.compile_report(FAMILY, _name_expr(np.dtype(dtype_name), version)).registers


def kernel_regs(dtype, version: int = DEFAULT_VERSION) -> int:
    """Registers per thread of the kernel for `dtype` (GPU, else NVRTC, else a table)."""
    dtype = np.dtype(dtype)
    if _arrays.has_gpu():
        return _func_attrs(_name_expr(dtype, version))[0]
    try:
        return _regs_nvrtc(dtype.name, int(version))
    except Exception:  # no NVRTC here: the table is what sm_90 compiles to
        return regs_fallback(dtype, int(version))


@functools.lru_cache(maxsize=None)
def _func_attrs(name_expr: str):
    """(registers, static shared bytes) of the compiled kernel on the current GPU."""
    from cupy.cuda import driver

    f = _compile.get_kernel(FAMILY, name_expr)
    if hasattr(f, "num_regs"):  # CuPy 14: RawModule.get_function gives a RawKernel
        return int(f.num_regs), int(f.shared_size_bytes)
    # CUfunction_attribute: 4 = NUM_REGS, 1 = SHARED_SIZE_BYTES
    return driver.funcGetAttribute(4, f.ptr), driver.funcGetAttribute(1, f.ptr)


def func_ptr(f) -> int:
    """The CUfunction handle of a compiled kernel (a Function, or CuPy 14's RawKernel)."""
    return f.ptr if hasattr(f, "ptr") else f.kernel.ptr


# ------------------------------------------------------------------ validation

_F32, _F64 = np.dtype(np.float32), np.dtype(np.float64)
_KIND_WORDS = {"numpy": "numpy array", "cupy": "CuPy array", "torch": "torch CUDA tensor",
               "torch-cpu": "torch CPU tensor"}


def _real(v, name):
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Real):
        raise TypeError(f"{name} must be a real number; got {type(v).__name__} {v!r}")
    return float(v)


def _as_list(x, name):
    if isinstance(x, (list, tuple)):
        return x
    raise TypeError(f"{name} must be a list or tuple of 2-D arrays; got {type(x).__name__}")


def _describe(x, kind):
    """(dtype, shape, element strides, data pointer) of an array of `kind`."""
    if kind in ("torch", "torch-cpu"):
        return _arrays.numpy_dtype(x), tuple(x.shape), tuple(x.stride()), x.data_ptr()
    item = x.dtype.itemsize
    st = tuple(s // item if s % item == 0 else None for s in x.strides)
    ptr = x.ctypes.data if kind == "numpy" else x.data.ptr
    return np.dtype(x.dtype), tuple(x.shape), st, ptr


def _check(As, Bs, Cs):
    """Every rule, before anything is written. Returns (kind, dtype, shapes (P, 3))."""
    As = _as_list(As, "As")
    Bs = _as_list(Bs, "Bs")
    if Cs is not None:
        Cs = _as_list(Cs, "Cs")
    P = len(As)
    if len(Bs) != P or (Cs is not None and len(Cs) != P):
        lens = f"len(As) = {P}, len(Bs) = {len(Bs)}"
        if Cs is not None:
            lens += f", len(Cs) = {len(Cs)}"
        raise ValueError(f"the lists must have one entry per problem; got {lens}")
    if P == 0:
        return None, None, np.zeros((0, 3), dtype=np.int64)
    kind = _arrays.kind_of(As[0], "As[0]")
    dtype = None
    shapes = np.zeros((P, 3), dtype=np.int64)
    for i in range(P):
        trio = (("As", As[i]), ("Bs", Bs[i])) + ((("Cs", Cs[i]),) if Cs is not None else ())
        for name, x in trio:
            k = _arrays.kind_of(x, f"{name}[{i}]")
            if k != kind:
                raise TypeError(f"As[0] is a {_KIND_WORDS[kind]} but {name}[{i}] is a "
                                f"{_KIND_WORDS[k]}; pass every array as the same kind")
            if x.ndim != 2:
                raise ValueError(f"{name}[{i}] must be 2-D; got shape {tuple(x.shape)}")
            dt = _arrays.numpy_dtype(x)
            if dt is None or dt not in (_F32, _F64):
                raise TypeError(f"{name}[{i}] has dtype {_arrays.dtype_name(x)}; "
                                "batched_matmul supports float32 and float64")
            if dtype is None:
                dtype = dt
            elif dt != dtype:
                raise TypeError(f"{name}[{i}] is {dt} but As[0] is {dtype}; every array of a "
                                "batch must have the same dtype")
            if kind in ("torch", "torch-cpu") and x.requires_grad:
                raise TypeError(f"{name}[{i}] requires grad; tsm does not record autograd. "
                                f"Pass {name}[{i}].detach()")
        m, k = (int(d) for d in As[i].shape)
        kb, n = (int(d) for d in Bs[i].shape)
        if k != kb:
            raise ValueError(f"problem {i}: As[{i}] has shape {(m, k)} and Bs[{i}] has shape "
                             f"{(kb, n)}; inner dimensions differ")
        if Cs is not None and tuple(int(d) for d in Cs[i].shape) != (m, n):
            raise ValueError(f"problem {i}: Cs[{i}] must have shape {(m, n)}; got "
                             f"{tuple(Cs[i].shape)}")
        shapes[i] = (m, n, k)
    if kind in ("cupy", "torch"):
        dev = _device_of(As[0], kind)
        for name, xs in (("As", As), ("Bs", Bs), ("Cs", Cs or ())):
            for i, x in enumerate(xs):
                if _device_of(x, kind) != dev:
                    raise ValueError(f"{name}[{i}] is on GPU {_device_of(x, kind)} but As[0] on "
                                     f"GPU {dev}; put the whole batch on one GPU")
    if Cs is not None:
        _check_outputs(As, Bs, Cs, kind)
    return kind, dtype, shapes


def _device_of(x, kind):
    return x.device.index if kind == "torch" else x.data.device_id


def _extent(ptr, shape, strides, item):
    lo = hi = ptr
    for d, s in zip(shape, strides):
        step = (d - 1) * s * item
        if step < 0:
            lo += step
        else:
            hi += step
    return lo, hi + item


def _check_outputs(As, Bs, Cs, kind):
    """Outputs writable, not self-overlapping, disjoint from each other and every input.

    Byte ranges are compared (conservative for interleaved strided views)."""
    item = None
    cs, ins = [], []
    for i, c in enumerate(Cs):
        dt, shape, st, ptr = _describe(c, kind)
        item = dt.itemsize
        if kind == "numpy" and not c.flags.writeable:
            raise ValueError(f"Cs[{i}] is read-only; pass writable outputs")
        if 0 in shape:
            continue
        if None in st or (shape[0] > 1 and st[0] == 0) or (shape[1] > 1 and st[1] == 0) or (
                shape[0] > 1 and shape[1] > 1 and abs(st[0]) < shape[1] and abs(st[1]) < shape[0]):
            raise ValueError(f"Cs[{i}] has strides that make elements overlap; pass an "
                             "output whose every element has its own memory")
        cs.append((*_extent(ptr, shape, st, item), i))
    for name, xs in (("As", As), ("Bs", Bs)):
        for i, x in enumerate(xs):
            dt, shape, st, ptr = _describe(x, kind)
            if 0 in shape or None in st:
                continue
            ins.append((*_extent(ptr, shape, st, dt.itemsize), f"{name}[{i}]"))
    if not cs:
        return
    cs.sort()
    for (lo0, hi0, i0), (lo1, hi1, i1) in zip(cs, cs[1:]):
        if lo1 < hi0:
            raise ValueError(f"Cs[{i0}] and Cs[{i1}] share memory; every output must be "
                             "separate")
    import bisect

    lo_list = [c[0] for c in cs]
    for lo, hi, name in ins:
        j = bisect.bisect_left(lo_list, hi) - 1
        if j >= 0 and cs[j][1] > lo:
            raise ValueError(f"Cs[{cs[j][2]}] shares memory with {name}; outputs are written "
                             "while inputs are read, so pass separate outputs")


# ------------------------------------------------------------------ CPU path


def _cpu(As, Bs, Cs, alpha, beta, kind):
    from tsm_core.runtime import cpu
    from tsm_core.runtime.checks import Operands

    P = len(As)
    out = []
    for i in range(P):
        a = _arrays.to_backend(As[i])
        b = _arrays.to_backend(Bs[i])
        c = None if Cs is None else _arrays.to_backend(Cs[i])
        m, k = a.shape
        n = b.shape[1]
        ops = Operands(A=a, B=b, out=c, kind=kind, like=None, m=m, k=k, n=n, dtype=a.dtype,
                       alpha=alpha, beta=beta, xp=np)
        r = cpu.matmul_cpu(ops)
        out.append(Cs[i] if Cs is not None else _arrays.wrap(r, kind))
    return out


# ------------------------------------------------------------------ GPU path

_lock = threading.Lock()
# Plans per layout signature (dtype, device, shapes and strides of every operand):
# the planning and the tile-list upload are paid once per signature.
_plans: "OrderedDict[tuple, tuple]" = OrderedDict()
# Device metadata per exact batch (the signature plus the data pointers): a
# repeated call with the same arrays launches with no host-to-device copy.
_metas: "OrderedDict[tuple, object]" = OrderedDict()
_PLAN_CACHE = 64
_META_CACHE = 64


def _lru_get(cache, key):
    v = cache.get(key)
    if v is not None:
        cache.move_to_end(key)
    return v


def _lru_put(cache, key, value, size):
    cache[key] = value
    if len(cache) > size:
        cache.popitem(last=False)


_getters: dict = {}


def _key_fns(kind):
    """Attribute readers for the cache key, as C-level callables for ``map``: per
    array this costs a few attribute reads and no Python frame (Python's cost per
    problem is what a batch of small GEMMs pays on every call)."""
    g = _getters.get(kind)
    if g is None:
        from operator import attrgetter

        if kind == "cupy":
            g = (attrgetter("data.ptr"), attrgetter("shape"), attrgetter("strides"),
                 attrgetter("dtype"), None)
        else:
            import torch

            # Tensor.size() costs a fifth of Tensor.shape (a torch.Size built per read).
            g = (torch.Tensor.data_ptr, torch.Tensor.size, torch.Tensor.stride,
                 attrgetter("dtype"), attrgetter("requires_grad"))
        _getters[kind] = g
    return g


# torch only: batches recognised by the identity of their tensors. A tensor's
# _version counter moves with every in-place change of its data or of its
# metadata (t_, transpose_, resize_, set_, as_strided_, squeeze_ ...) and
# data_ptr() catches a new storage, so (ids, versions, pointers) names the exact
# batch at a third of the cost of reading every size and stride. An entry is
# dropped as soon as any of its tensors is freed (weak references), so an id is
# never matched to a new object. Not caught: assigning ``t.data = u`` where u has
# the same pointer but other sizes (for example ``t.data = t.t()``).
_idents: "OrderedDict[tuple, object]" = OrderedDict()
_IDENT_CACHE = 16
_VERSION = None


def _ident_key(As, Bs, Cs):
    global _VERSION
    if _VERSION is None:
        import torch
        from operator import attrgetter

        _VERSION = (attrgetter("_version"), torch.Tensor.data_ptr)
    ver, dp = _VERSION
    every = (*As, *Bs, *Cs)
    return (*map(id, every), *map(ver, every), *map(dp, every)), every


def _remember_ident(key, every, L):
    import weakref

    def drop(_ref, key=key):
        _idents.pop(key, None)

    refs = [weakref.ref(x, drop) for x in every]
    with _lock:
        _lru_put(_idents, key, (L, refs), _IDENT_CACHE)


# The C++ fast path for torch tensors (tsm_core/_native.py): [module or None] once
# looked up. Where it is loaded, it replaces the identity key above: a batch is
# matched by every tensor's pointer, sizes, strides, dtype and device, read from
# torch's C++ objects (12-16 ns a tensor against 0.2 us for the key in Python),
# and launched in the same call.
_NATIVE: list = []


# Once it is loaded and a GPU is there: the module's `call(As, Bs, Cs, alpha,
# beta)`, batched_matmul's whole hot path in C++ (checks, torch's current device
# and stream, lookup, launch).
_CALL = None
_C10_STREAMS: list = []  # [True] where call reads device and stream through c10
_GRAPHS: list = []  # [True] where hits launch through one-node CUDA graphs


def graphs_default() -> bool:
    """Whether the C++ fast path launches a remembered batch through a one-node CUDA
    graph (batched/fastpath.cpp, graph_launch) rather than cuLaunchKernel
    (``TSM_BATCHED_GRAPHS=0`` turns it off; on by default)."""
    v = os.environ.get("TSM_BATCHED_GRAPHS", "").strip().lower()
    return v not in ("0", "false", "no", "off")
_SEQ = (list, tuple)
_REALS = (float, int)


def _native():
    """The fast-path module, or None (no compiler, TSM_NATIVE=0): decided once."""
    global _CALL
    if not _NATIVE:
        from tsm_core.batched import native

        mod = native.get()
        _NATIVE.append(mod)
        if mod is not None:
            import torch

            if torch.cuda.is_available():
                _torch_stream()  # fills _CUR_DEVICE and _RAW_STREAM
                mod.set_stream_getters(_CUR_DEVICE[0], _RAW_STREAM[0])
                _C10_STREAMS[:] = [_use_c10_streams(mod, torch)]
                _GRAPHS[:] = [mod.use_graphs(graphs_default())]  # (False: not found)
                _CALL = mod.call
    return _NATIVE[0]


def _use_c10_streams(mod, torch) -> bool:
    """Let `mod.call` read torch's current device and stream through c10's C++
    functions (0.1 us against about 0.6 us through torch's Python getters on our
    H100's host) if it finds them in the loaded libc10_cuda and they give what the
    Python getters give, on the default stream and inside ``torch.cuda.stream``;
    else it keeps the Python getters. True if enabled."""
    lib = os.path.join(os.path.dirname(torch.__file__), "lib", "libc10_cuda.so")
    if not mod.use_c10(lib):
        return False
    try:
        dev = _CUR_DEVICE[0]()
        before = _RAW_STREAM[0](dev)
        ok = mod.current() == (dev, before)
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            ok = ok and side.cuda_stream != before and mod.current() == (dev, side.cuda_stream)
        ok = ok and mod.current() == (dev, before)
    except Exception:
        ok = False
    if not ok:
        mod.use_c10("")
    return ok


def _use_native(mod):
    """Take the C++ fast path `mod` (None: the Python path) for torch calls from now
    on; returns the module in use before (None if none). For tests and probes that
    time or check both paths in one process."""
    global _CALL
    prev = _native()
    _NATIVE[:] = [mod]
    _CALL = None if mod is None or not _RAW_STREAM else mod.call
    return prev


def _launch_failed(r):
    """Raise the CUDA driver's error for a fast-path launch that returned r != 0."""
    import cupy

    if r == 3:
        raise RuntimeError("tsm: the C++ fast path found no cuLaunchKernel (no CUDA driver)")
    raise cupy.cuda.driver.CUDADriverError(-r)


def _remember_torch(As, Bs, Cs, L):
    """Teach the fast path (identity key or C++) a torch batch and its launch."""
    nat = _NATIVE[0] if _NATIVE else _native()
    if nat is None:
        try:
            key, every = _ident_key(As, Bs, Cs)
        except RuntimeError:  # inference tensors: no version counter, no identity key
            return
        _remember_ident(key, every, L)
        return
    nat.remember(As, Bs, Cs, L.dev, L, *L._native_args)


def _key(As, Bs, Cs, kind):
    """(pointers, layout) of a batch: the layout (dtypes, shapes, strides, and for
    torch requires_grad) keys the plan, both together the device metadata."""
    ptr, shp, st, dt, rg = _key_fns(kind)
    ptrs = (*map(ptr, As), *map(ptr, Bs), *map(ptr, Cs))
    lay = (*map(shp, As), *map(shp, Bs), *map(shp, Cs), *map(st, As), *map(st, Bs),
           *map(st, Cs), *map(dt, As), *map(dt, Bs), *map(dt, Cs))
    if rg is not None:
        lay += (*map(rg, As), *map(rg, Bs), *map(rg, Cs))
    return ptrs, lay


def _meta_rows(As, Bs, Cs, kind, shapes):
    """(P, META_STRIDE) int64: pointers, sizes and element strides of every problem."""
    P = len(As)
    meta = np.empty((P, META_STRIDE), dtype=np.int64)
    meta[:, 3:6] = shapes
    meta[:, 12:] = 0  # split-K's workspace and counters (_split_workspace)
    for i in range(P):
        for j, (x, col) in enumerate(((As[i], 6), (Bs[i], 8), (Cs[i], 10))):
            _, _, st, ptr = _describe(x, kind)
            if None in st:
                raise ValueError("strides must be whole numbers of elements")
            meta[i, j] = ptr
            meta[i, col:col + 2] = st
    return meta


def _alloc_outputs(shapes, dtype, kind, like):
    """Fresh C-ordered outputs, carved out of one allocation (one pool request, not P)."""
    sizes = [int(m) * int(n) for m, n, _ in shapes]
    total = max(1, sum(sizes))
    if kind == "torch":
        import torch

        tdt = torch.float32 if dtype == _F32 else torch.float64
        buf = torch.empty(total, dtype=tdt, device=like.device)
        parts = torch.split(buf[:sum(sizes)], sizes) if sum(sizes) else [buf[:0]] * len(sizes)
        return [p.view(int(m), int(n)) for p, (m, n, _) in zip(parts, shapes)]
    import cupy

    buf = cupy.empty(total, dtype=dtype)
    out, o = [], 0
    for s, (m, n, _) in zip(sizes, shapes):
        out.append(buf[o:o + s].reshape(int(m), int(n)))
        o += s
    return out


# cuLaunchKernel straight from Python (CuPy's driver binding), or None after it once
# failed (then CuPy's RawKernel call is used).
_DIRECT = [True]
_launch_kernel = []


def _driver_launch():
    if not _launch_kernel:
        from cupy.cuda import driver

        _launch_kernel.append(driver.launchKernel)
    return _launch_kernel[0]


class _Launch:
    """Everything one launch needs, resolved: kernel, grid, device metadata.

    Launched with ``cuLaunchKernel`` on a raw stream handle, its argument block
    built once per (alpha, beta): CuPy's RawKernel call costs several microseconds
    of argument packing and stream lookup, a tenth of a small batch's whole time.
    """

    __slots__ = ("kern", "fptr", "grid", "meta", "tiles", "ctype", "plan", "dev", "version",
                 "shmem", "ws", "_ab", "_args", "_go", "_native_args")

    def _pack(self, alpha, beta):
        import ctypes

        c = ctypes.c_float if self.ctype is np.float32 else ctypes.c_double
        vals = (ctypes.c_void_p(self.meta.data.ptr), ctypes.c_void_p(self.tiles.data.ptr),
                c(alpha), c(beta))
        ptrs = (ctypes.c_void_p * 4)(*[ctypes.addressof(v) for v in vals])
        self._args = (vals, ptrs, ctypes.addressof(ptrs))
        self._ab = (alpha, beta)
        # cuLaunchKernel with all but the stream bound: one C call per launch.
        self._go = functools.partial(_driver_launch(), self.fptr, self.grid, 1, 1, BLOCK_THREADS,
                                     1, 1, self.shmem)

    def __call__(self, alpha, beta, stream_ptr):
        if self.grid == 0:
            return
        # Through the C++ fast path's cuLaunchKernel where it is loaded (TSM_NATIVE;
        # `_use_native(None)` sends launches to CuPy's binding below).
        nat = _NATIVE[0] if _NATIVE else None
        if nat is not None:
            f, g, b, sm, m, t, d = self._native_args
            r = nat.launch(f, g, b, sm, stream_ptr, m, t, alpha, beta, d)
            if r == 0:
                return
            if r != 3:  # 3: no driver found; CuPy's binding below says what is wrong
                _launch_failed(r)
        if _DIRECT[0]:
            try:
                if self._ab != (alpha, beta):
                    self._pack(alpha, beta)
                self._go(stream_ptr, self._args[2], 0)
                return
            except Exception:  # an older CuPy without it: its RawKernel call from now on
                _DIRECT[0] = False
        with _stream_from_ptr(stream_ptr):
            self.kern((self.grid,), (BLOCK_THREADS,),
                      (self.meta, self.tiles, self.ctype(alpha), self.ctype(beta)),
                      shared_mem=self.shmem)


_VERSION_WORDS = {2: " (tiles of 32 rows or more on the tensor cores: float32 in 3xTF32 "
                     f"where K >= {TC_MIN_K}, float64 on DMMA)",
                  3: " (the paper's five tile types plus 128 x 64 tiles of 8 x 4 outputs a "
                     "thread, three blocks per SM)",
                  4: " (the paper's five tile types plus 128 x 64 and 128 x 128 tiles of 8 x 4 "
                     "and 8 x 8 outputs a thread, two blocks per SM)",
                  5: " (the paper's five tile types plus 128 x 64 and 128 x 128 tiles, the "
                     "256-thread ones fed by cp.async rings, the 128 x 128 ones with K >= "
                     f"{TC_MIN_K} on the tensor cores in 3xTF32, two blocks per SM)",
                  6: " (version 5 with its tensor-core tiles on wgmma, sm_90a)"}


def tc_share(shapes) -> float:
    """Fraction of a batch's FLOPs in problems whose tiles version 2 can run on the
    tensor cores: K >= TC_MIN_K, M >= 32 and N >= 32 (the 32 x 32, 32 x 64 and
    64 x 64 types; the planner may still shrink some of their tiles)."""
    s = np.asarray(shapes, dtype=np.float64).reshape(-1, 3)
    if not len(s):
        return 0.0
    flops = s[:, 0] * s[:, 1] * s[:, 2]
    tc = (s[:, 0] >= 32) & (s[:, 1] >= 32) & (s[:, 2] >= TC_MIN_K)
    total = flops.sum()
    return float(flops[tc].sum() / total) if total else 0.0


def _tile_share(plan, select) -> float:
    """Fraction of a plan's FLOPs (edge tiles counted by their real area) in the
    tiles where ``select(tiles, shapes of their problems)`` is true."""
    t = plan.tiles
    if not len(t):
        return 0.0
    s = plan.shapes[t[:, 0]]
    rows = np.minimum(_TM[t[:, 3]], s[:, 0] - t[:, 1])
    cols = np.minimum(_TN[t[:, 3]], s[:, 1] - t[:, 2])
    work = rows.astype(np.float64) * cols * plan.tile_k
    total = work.sum()
    return float(work[select(t, s)].sum() / total) if total else 0.0


def plan_tc_share(plan) -> float:
    """Fraction of a version-2 plan's FLOPs in tiles on the tensor cores: tile types
    of 32 rows or more (2, 3, 4), for float32 in problems with K >= TC_MIN_K."""
    f64 = plan.dtype == _F64
    return _tile_share(plan, lambda t, s: (t[:, 3] >= 2) & ((s[:, 2] >= TC_MIN_K) | f64))


def plan_type_share(plan, tile_type: int) -> float:
    """Fraction of a plan's FLOPs in tiles of `tile_type`."""
    return _tile_share(plan, lambda t, s: t[:, 3] == tile_type)


def tc3_pays(plan) -> bool:
    """The share rule that chose version 5 until session 20 (now `plan_cost`; the
    bench still reports it): at least TC3_MIN_SHARE of the plan's work in at least
    TC3_MIN_WAVES waves of 128 x 128 tiles of problems with K >= TC_MIN_K (the ones
    on the tensor cores)."""
    if not plan.n_tiles:
        return False
    r = plan.residency
    wave = max(1, r.sm_count * r.blocks_per_sm)
    t = plan.tiles
    tc = (t[:, 3] == XL_TYPE) & (plan.shapes[t[:, 0], 2] >= TC_MIN_K)
    work = (_TM[t[:, 3]] * _TN[t[:, 3]] * plan.tile_k).astype(np.float64)
    share = work[tc].sum() / max(work.sum(), 1.0)
    return int(tc.sum()) >= TC3_MIN_WAVES * wave and share >= TC3_MIN_SHARE


def wide_pays(plan) -> bool:
    """The share rule that chose version 3 until session 20 (now `plan_cost`; the
    bench still reports it): at least WIDE_MIN_SHARE of the plan's work in at least
    WIDE_MIN_WAVES waves of 128 x 64 tiles."""
    r = plan.residency
    wave = max(1, r.sm_count * r.blocks_per_sm)
    n = int(np.sum(plan.tiles[:, 3] == WIDE_TYPE)) if plan.n_tiles else 0
    return n >= WIDE_MIN_WAVES * wave and plan_type_share(plan, WIDE_TYPE) >= WIDE_MIN_SHARE


# The cost model of a plan (float32 versions 1, 3 and 5), for choosing among them.
# A tile of class c with n k-steps of BK costs a[c] * n + b[c] microseconds on one
# block slot; the tiles go, in launch order, to the first free of the SMs' block
# slots; the plan's time is the last slot's finish plus t0. Classes: the tile type
# (0-6), and 7 for version 5's 128 x 128 tiles on the tensor cores (K >= TC_MIN_K).
N_COST_CLASSES = 8
TC3_CLASS = 7


def _costs(a, b, t0):
    """TILE_COSTS' flat form: a and b padded to N_COST_CLASSES with NaN (the classes
    a version has no tiles of), then t0."""
    pad = [math.nan] * (N_COST_CLASSES - len(a))
    return [*a, *pad, *b, *pad, t0]


# TILE_COSTS[v]: a, b (per class, microseconds) and t0 for version v, fitted to the
# device times of versions 1, 3 and 5 on four seeds of the sweep (288 cells each;
# H100, session 20, the kernel of commit 1a2adba:
#   python benchmarks/batched_cost_fit.py .../versions_1a2adba/seed{0,1,2,3}.json
#       --check .../versions_1a2adba/seed4.json
# under benchmarks/results/h100/batched_s20/). The model's time is within 5-7% of
# the measured (geomean of the ratio; worst 1.31x), and its choice ran at 1.008x of
# the fastest version's time on the seed it was not fitted to (version 1 alone:
# 1.15x). The share rules it replaced ran at 1.04-1.05x (on the kernel before the
# vector stores: batched_s20/versions_50f763c/).
TILE_COSTS = {
    1: _costs(a=(0.3998, 0.6149, 0.9662, 1.058, 1.611),
              b=(1.137, 1.241, 0, 2.977, 3.703),
              t0=0.7226),
    3: _costs(a=(0.4127, 0.5985, 1.046, 0.9558, 1.266, 2.632),
              b=(1.326, 1.281, 0, 3.377, 5.881, 4.963),
              t0=0.2776),
    5: _costs(a=(0.3716, 0.3525, 0.8127, 0.7605, 1.08, 1.346, 2.23, 2.14),
              b=(1.355, 1.514, 0, 2.415, 2.151, 6.048, 10.52, 8.723),
              t0=0.3748),
}


# Version 6 until it has costs of its own: version 5's (its plans are version 5's;
# only the tensor-core tiles' kernel differs).
TILE_COSTS.setdefault(WG3_VERSION, TILE_COSTS[TC3_VERSION])


def _tile_classes(plan) -> np.ndarray:
    t = plan.tiles
    cls = t[:, 3].astype(np.int64)
    if plan.version in TC3_VERSIONS:
        cls = np.where((cls == XL_TYPE) & (plan.shapes[t[:, 0], 2] >= TC_MIN_K), TC3_CLASS, cls)
    return cls


def _schedule(cost: np.ndarray, slots: int):
    """Greedy list scheduling of `cost` (in order) on `slots` identical slots: (slot of
    each tile, finish time of each slot)."""
    import heapq

    T = len(cost)
    slot = np.empty(T, np.int64)
    first = min(T, slots)
    slot[:first] = np.arange(first)
    finish = np.zeros(slots)
    finish[:first] = cost[:first]
    if T > first:
        heap = [(float(finish[i]), i) for i in range(slots)]
        heapq.heapify(heap)
        rest = cost[first:].tolist()
        out = slot[first:]
        replace = heapq.heapreplace
        for j, c in enumerate(rest):
            f, i = heap[0]
            out[j] = i
            replace(heap, (f + c, i))
        for f, i in heap:
            finish[i] = f
    return slot, finish


def plan_cost_features(plan, ab) -> np.ndarray:
    """The model's makespan as linear features of the costs: (k-steps per class, tiles
    per class) on the slot that finishes last, scheduled with costs `ab` (2, N)."""
    ab = np.asarray(ab, dtype=np.float64).reshape(2, N_COST_CLASSES)
    f = np.zeros(2 * N_COST_CLASSES)
    if not plan.n_tiles:
        return f
    cls = _tile_classes(plan)
    nk = -(-plan.tile_k // BK)
    cost = ab[0, cls] * nk + ab[1, cls]
    r = plan.residency
    slot, finish = _schedule(cost, max(1, r.sm_count * r.blocks_per_sm))
    on = slot == int(np.argmax(finish))
    np.add.at(f, cls[on], nk[on])
    np.add.at(f, N_COST_CLASSES + cls[on], 1.0)
    return f


def plan_cost(plan, theta=None) -> float:
    """The model's time of a plan in microseconds: `TILE_COSTS` of its version
    (computed once per plan) unless `theta` is given."""
    if theta is None:
        cached = plan.__dict__.get("_model_us")
        if cached is not None:
            return cached
    # NaN marks classes the version has no tiles of (their features are 0).
    th = np.nan_to_num(np.asarray(TILE_COSTS[plan.version] if theta is None else theta,
                                  np.float64))
    f = plan_cost_features(plan, th[:2 * N_COST_CLASSES])
    t = float(f @ th[:2 * N_COST_CLASSES] + th[-1])
    if theta is None:
        plan.__dict__["_model_us"] = t
    return t


def _choose_version(meta_rows, dtype=None):
    """0 where a stride is too large for int offsets; where `tc_default` allows (by
    default float64 only), 2 for float64 batches (DMMA, two blocks per SM as version
    1) and for float32 batches with at least half their FLOPs on the tensor cores
    (`tc_share`; version 2 holds two blocks per SM where version 1 holds three);
    else DEFAULT_VERSION."""
    if len(meta_rows) and np.abs(meta_rows[:, 6:12]).max() >= V1_MAX_STRIDE:
        return 0
    if dtype is not None and tc_default(dtype) and (
            np.dtype(dtype) == _F64 or tc_share(meta_rows[:, 3:6]) >= 0.5):
        return 2
    return DEFAULT_VERSION


def _settle_version(version, shapes, dtype, plan_of, tc_ok=True):
    """The automatic choice, refined by the plans (`plan_of(v)`, cached by the
    caller) of `_choose_version`'s pick:

    - version 2 in float32 falls back to 1 where the planner shrank the tiles off
      the tensor cores (`plan_tc_share` < 0.5);
    - float32 version 1 becomes whichever of 1, 3 and 5 has the least modelled time
      (`plan_cost`): 3 unless `wide_default` says no, and only where some problem
      has 128 rows and 64 columns (else its plan is version 1's); 5 on a GPU with
      tensor cores (`tc_ok`) unless `tc3_default` says no.
    """
    f32 = np.dtype(dtype) == _F32
    if version == 2 and f32 and plan_tc_share(plan_of(2)) < 0.5:
        version = DEFAULT_VERSION
    if version == DEFAULT_VERSION and f32:
        s = np.asarray(shapes, dtype=np.int64).reshape(-1, 3)
        cands = [DEFAULT_VERSION]
        if wide_default() and np.any((s[:, 0] >= 128) & (s[:, 1] >= 64)):
            cands.append(WIDE_VERSION)
        if tc_ok and tc3_default():
            cands.append(TC3_VERSION)
        if len(cands) > 1:
            t = [plan_cost(plan_of(v)) for v in cands]
            version = cands[int(np.argmin(t))]  # ties keep the lower version
    return version


def _resolve(As, Bs, Cs, kind, dtype, shapes, sig, version=None, split_k=None):
    """The _Launch of a checked batch: plan (cached per signature) and metadata."""
    import cupy

    rows = _meta_rows(As, Bs, Cs, kind, shapes)
    dev = cupy.cuda.runtime.getDevice()
    tc_ok = int(cupy.cuda.Device(dev).compute_capability) >= 80
    auto = version is None
    if auto:
        version = _choose_version(rows, dtype)
        if version == 2 and not tc_ok:
            version = DEFAULT_VERSION
    elif version in (2, TC3_VERSION) and not tc_ok:
        raise ValueError(f"kernel version {version} (tensor cores, cp.async) needs compute "
                         "capability 8.0 or later")
    elif version == WG3_VERSION and not wgmma_ok():
        raise ValueError(f"kernel version {version} (wgmma, sm_90a) needs compute capability "
                         "9.0 (H100, H200)")
    elif version != 0 and _choose_version(rows) == 0:
        version = 0  # strides too large for int offsets

    if split_k is None:
        split_k = splitk_default()

    def planned(v):
        entry = _lru_get(_plans, (sig, v, split_k))
        if entry is None:
            plan = plan_batched(shapes, dtype, version=v, split_k=split_k)
            entry = (plan, cupy.asarray(plan.device_tiles()) if plan.n_tiles else None)
            _lru_put(_plans, (sig, v, split_k), entry, _PLAN_CACHE)
        return entry

    if auto:
        version = _settle_version(version, shapes, dtype, lambda v: planned(v)[0], tc_ok)
    plan, tiles = planned(version)
    L = _Launch()
    L.plan = plan
    L.version = version
    L.dev = cupy.cuda.runtime.getDevice()
    L.kern = _compile.get_kernel(FAMILY, _name_expr(dtype, version))
    L.shmem = smem_bytes(dtype, version) if version in DYNAMIC_SMEM else 0
    if L.shmem > 48 * 1024 and getattr(L.kern, "max_dynamic_shared_size_bytes", 0) < L.shmem:
        L.kern.max_dynamic_shared_size_bytes = L.shmem
    L.fptr = func_ptr(L.kern)
    L.grid = plan.n_tiles
    L.tiles = tiles
    L.ctype = np.float32 if dtype == _F32 else np.float64
    L.ws = None
    if plan.split_problems:
        L.ws = _split_workspace(plan, rows, dtype)
    L.meta = cupy.asarray(rows) if plan.n_tiles else None
    L._ab = None
    L._native_args = (L.fptr, L.grid, BLOCK_THREADS, L.shmem,
                      L.meta.data.ptr if L.grid else 0, L.tiles.data.ptr if L.grid else 0,
                      L.ctype is np.float64)
    return L


def _split_workspace(plan, rows, dtype):
    """Device workspace and counters of a split-K plan, their pointers written into
    `rows` (meta columns 12 and 13); returned so the launch keeps them alive. The
    counters start at zero and the kernel leaves them so. One launch at a time may
    use them: a launch of the same batch on another stream at once would race (it
    would race on the outputs anyway)."""
    import cupy

    woff, coff, nw, nc, on = plan.workspace()
    ws = cupy.empty(max(1, nw), dtype=dtype)
    cnt = cupy.zeros(max(1, nc), dtype=np.int32)
    item = np.dtype(dtype).itemsize
    rows[:, 12] = np.where(on, ws.data.ptr + woff * item, 0)
    rows[:, 13] = np.where(on, cnt.data.ptr + coff * 4, 0)
    return ws, cnt


_streams: dict = {}


def _stream_from_ptr(ptr):
    """A CuPy stream object for a raw handle (cached: building one costs microseconds)."""
    import cupy

    s = _streams.get(ptr)
    if s is None:
        import warnings

        with warnings.catch_warnings():  # CuPy 14 deprecates it; 13 has no replacement
            warnings.simplefilter("ignore", DeprecationWarning)
            s = _streams[ptr] = cupy.cuda.ExternalStream(ptr)
    return s


_RAW_STREAM = []


def _torch_raw_stream():
    """A function of a device index giving torch's current stream on that device as
    a raw cudaStream_t (torch's C entry point where it has one: 0.1 us a call
    against 0.7 us through torch.cuda)."""
    if not _RAW_STREAM:
        import torch

        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        if raw is None:
            def raw(dev):
                return torch.cuda.current_stream(dev).cuda_stream
        _RAW_STREAM.append(raw)
    return _RAW_STREAM[0]


_CUR_DEVICE = []


def _torch_stream():
    """torch's current stream on the current device, as a raw cudaStream_t."""
    if not _CUR_DEVICE:
        import torch

        _CUR_DEVICE.append(getattr(torch._C, "_cuda_getDevice", torch.cuda.current_device))
    return _torch_raw_stream()(_CUR_DEVICE[0]())


def _cupy_stream():
    import cupy

    return cupy.cuda.get_current_stream().ptr


def batched_matmul(As, Bs, Cs=None, *, alpha=1.0, beta=0.0):
    """Compute ``Cs[i] = alpha * As[i] @ Bs[i] + beta * Cs[i]`` for every i, in one launch.

    As[i] has shape (M_i, K_i), Bs[i] (K_i, N_i), Cs[i] (M_i, N_i); sizes differ
    freely between problems and need not be multiples of anything.

    Parameters
    ----------
    As, Bs : list or tuple of 2-D arrays
        One entry per problem; numpy arrays, CuPy arrays or torch tensors (CUDA or
        CPU), all of one kind and one dtype (float32 or float64). Any strides: C- or
        F-ordered, transposed or sliced views, mixed within a batch.
    Cs : list or tuple of 2-D arrays, optional
        Outputs, written in place (the same objects are returned). They must not
        overlap each other or any input. Default: new C-ordered arrays of the
        inputs' kind (on the GPU, views of one allocation).
    alpha, beta : real
        beta == 0 means Cs is not read (NaN in it does not propagate), as in BLAS.

    Returns
    -------
    list
        Cs[i] for every problem, as the caller's kind.

    Raises
    ------
    TypeError
        Not lists; mixed kinds or dtypes; unsupported dtype; alpha or beta not real;
        a torch tensor that requires grad.
    ValueError
        Lists of different lengths; not 2-D; inner dimensions differ; Cs[i] of the
        wrong shape; outputs overlapping each other or an input; GPUs differ.
        Nothing is written when an error is raised.

    Notes
    -----
    numpy (and torch CPU) inputs are computed on the CPU, one numpy matmul per
    problem. CuPy and torch CUDA inputs run as one kernel launch on the current
    stream (torch's for torch tensors). The tiling (``plan_batched``) is cached per
    batch layout (dtypes, shapes, strides) and the device metadata per exact batch
    (the same plus data pointers): a repeated call costs the key lookup and the
    launch; new arrays of a known layout cost one small host-to-device copy. For
    torch tensors the lookup and the launch run in C++ (``tsm_core/_native.py``,
    built on first use where a C++ compiler is found; ``TSM_NATIVE=0`` keeps the
    Python path): 12-16 ns a tensor, matched by every tensor's data pointer,
    sizes, strides, dtype and device. For a batch launched many times,
    ``prepare_batched`` removes even the lookup.

    Examples
    --------
    >>> import numpy as np
    >>> import tsm_core
    >>> rng = np.random.default_rng(0)
    >>> As = [rng.standard_normal((m, k)) for m, k in ((5, 3), (17, 1))]
    >>> Bs = [rng.standard_normal((k, n)) for k, n in ((3, 2), (1, 40))]
    >>> Cs = tsm_core.batched_matmul(As, Bs)
    >>> [c.shape for c in Cs]
    [(5, 2), (17, 40)]
    >>> bool(np.allclose(Cs[1], As[1] @ Bs[1]))
    True
    """
    # Hot path: torch CUDA tensors with outputs given, a batch the C++ fast path
    # remembers: one C call recognises and launches it (about the host time of a
    # prepared run). Anything else, or a batch it does not know, goes on below.
    call = _CALL
    if call is not None and Cs is not None:
        r = call(As, Bs, Cs, alpha, beta)
        if r == 0:
            return Cs if type(Cs) is list else list(Cs)
        if r < 0:
            _launch_failed(r)
    tried = call is not None

    # Fast path: CuPy or torch CUDA lists with outputs given, a batch seen before.
    cupy = _arrays._loaded("cupy")
    if Cs is not None and cupy is not None and type(As) in (list, tuple) and len(As) and \
            len(As) == len(Bs) == len(Cs):
        t0 = type(As[0])
        tf = type(alpha), type(beta)
        if tf[0] in (float, int) and tf[1] in (float, int):
            key = None
            try:
                if t0 is cupy.ndarray:
                    key = _key(As, Bs, Cs, "cupy")
                    stream = None
                elif t0.__module__ == "torch" and As[0].is_cuda:
                    stream = _torch_stream()
                    nat = _NATIVE[0] if _NATIVE else _native()
                    if nat is not None:
                        if not tried:  # (the first call of a process)
                            r = nat.call(As, Bs, Cs, alpha, beta)
                            if r == 0:
                                return Cs if type(Cs) is list else list(Cs)
                            if r < 0:
                                _launch_failed(r)
                    else:
                        ident, every = _ident_key(As, Bs, Cs)
                        hit = _idents.get(ident)
                        if hit is not None and hit[0].dev == cupy.cuda.runtime.getDevice():
                            hit[0](alpha, beta, stream)
                            return Cs if type(Cs) is list else list(Cs)
                    key = _key(As, Bs, Cs, "torch")
            # A foreign object: the slow path says what. RuntimeError: torch's inference
            # tensors have no version counter (the identity key's).
            except (AttributeError, TypeError, RuntimeError):
                key = None
            if key is not None:
                L = _lru_get(_metas, key)
                # The kernel handle belongs to the device it was loaded on.
                if L is not None and L.dev == cupy.cuda.runtime.getDevice():
                    L(alpha, beta, _cupy_stream() if stream is None else stream)
                    if stream is not None:
                        _remember_torch(As, Bs, Cs, L)
                    return Cs if type(Cs) is list else list(Cs)

    alpha = _real(alpha, "alpha")
    beta = _real(beta, "beta")
    kind, dtype, shapes = _check(As, Bs, Cs)
    P = len(As)
    if P == 0:
        return []
    if kind in ("numpy", "torch-cpu"):
        return _cpu(As, Bs, Cs, alpha, beta, kind)

    import cupy

    if Cs is None:
        Cs = _alloc_outputs(shapes, dtype, kind, As[0])
    dev = _device_of(As[0], kind)
    with cupy.cuda.Device(dev):
        key = _key(As, Bs, Cs, kind)
        L = _resolve(As, Bs, Cs, kind, dtype, shapes, (dev, key[1]))
        _lru_put(_metas, key, L, _META_CACHE)
        L(alpha, beta, _torch_stream() if kind == "torch" else _cupy_stream())
        if kind == "torch":
            _remember_torch(As, Bs, Cs, L)
    return list(Cs)


class PreparedBatch:
    """A batch bound once, launched many times: ``run()`` costs one kernel launch.

    Made by `prepare_batched`; holds references to the arrays, so they stay alive.
    The arrays must keep their shapes, strides and memory (their contents may
    change between runs: that is the point).
    """

    def __init__(self, As, Bs, Cs, launch, kind, alpha, beta):
        self.As, self.Bs, self.Cs = list(As), list(Bs), list(Cs)
        self._launch = launch
        self._kind = kind
        self.alpha, self.beta = alpha, beta
        self.plan = launch.plan if launch is not None else None

    def run(self):
        """Launch on the current stream (for torch tensors, torch's current stream on
        their device); return Cs."""
        L = self._launch
        if L is not None:
            L(self.alpha, self.beta,
              _torch_raw_stream()(L.dev) if self._kind == "torch" else _cupy_stream())
        return self.Cs

    __call__ = run


def prepare_batched(As, Bs, Cs=None, *, alpha=1.0, beta=0.0, version=None,
                    split_k=None) -> PreparedBatch:
    """Check, plan and upload a batch once; ``run()`` then launches it with no
    per-problem Python work (the device-side path for repeated identical batches).

    Same arguments and rules as `batched_matmul`; CuPy or torch CUDA arrays only.
    `version` picks a kernel of the ladder (VERSIONS; default: the launcher's choice);
    `split_k` whether the plan may split K (default: `splitk_default()`).

    Examples
    --------
    >>> import tsm_core.batched.api as tb
    >>> tb.prepare_batched([], [])  .run()
    []
    """
    alpha = _real(alpha, "alpha")
    beta = _real(beta, "beta")
    kind, dtype, shapes = _check(As, Bs, Cs)
    if len(As) == 0:
        return PreparedBatch([], [], [], None, kind, alpha, beta)
    if kind not in ("cupy", "torch"):
        raise TypeError("prepare_batched needs CuPy arrays or torch CUDA tensors; numpy "
                        "inputs take batched_matmul's CPU path")
    import cupy

    if Cs is None:
        Cs = _alloc_outputs(shapes, dtype, kind, As[0])
    if kind == "torch":
        _native()  # its launch, where it loads (built on first use)
    dev = _device_of(As[0], kind)
    with cupy.cuda.Device(dev):
        if version is not None and version not in VERSIONS:
            raise ValueError(f"version must be one of {VERSIONS}; got {version!r}")
        L = _resolve(As, Bs, Cs, kind, dtype, shapes, (dev, _key(As, Bs, Cs, kind)[1]),
                     version, split_k)
    return PreparedBatch(As, Bs, Cs, L, kind, alpha, beta)


def explain_batched(As_or_shapes, Bs=None, dtype=np.float32) -> str:
    """The plan of a batch in words: for arrays (As, Bs) or a list of (M, N, K).

    Works without a GPU (the H100 of KNOWN_GPUS is planned for then).

    Examples
    --------
    >>> from tsm_core.batched.api import explain_batched
    >>> print(explain_batched([(784, 96, 192), (784, 64, 192)]).splitlines()[0])  # doctest: +ELLIPSIS
    Batched irregular GEMM: 2 problems, float32, ...
    """
    if Bs is None:
        shapes = As_or_shapes
    else:
        kind, dtype, s = _check(As_or_shapes, Bs, None)
        shapes = s
        dtype = dtype or np.float32
    rows = np.zeros((len(shapes), META_STRIDE), np.int64)
    rows[:, 3:6] = np.asarray(shapes, np.int64).reshape(-1, 3)
    # The version the call would choose (strides assumed below V1_MAX_STRIDE).
    plans = {}

    def plan_of(v):
        if v not in plans:
            plans[v] = plan_batched(shapes, dtype, version=v)
        return plans[v]

    chosen = _settle_version(_choose_version(rows, dtype), shapes, dtype, plan_of)
    text = plan_of(chosen).describe()
    modelled = sorted(v for v in plans if v in TILE_COSTS)
    if len(modelled) > 1:
        text += "\n  version choice (cost model, plan_cost): " + ", ".join(
            f"version {v} {plan_cost(plans[v]):.0f} us" for v in modelled) + f" -> {chosen}"
    return text
