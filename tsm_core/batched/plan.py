"""The tiling of a batch (the paper's TLP tiling), its tile types and its constants.

Zhang et al., "A load-balanced acceleration method for small and irregular batch
matrix multiplication on GPU" (J. Syst. Archit. 160, 2025):

- five tile types, 16x16, 16x32, 32x32 (128 threads) and 32x64, 64x64 (256
  threads), so that a thread's computation and loads are similar whatever tile it
  works on (section 4.1, Table 3); ours adds two for float32, 128 x 64 and
  128 x 128 (`TILE_TYPES`);
- a tiling algorithm (section 4.2, Algorithm 1, `tile_batch`): every problem
  starts from the largest tile that suits it, then all tiles are shrunk one step
  at a time until the thread-level parallelism, counted in warps that can really
  be resident on the GPU (Eq. 4-9, `residency`), reaches the threshold of one
  full wave;
- split-K (`choose_splits`): the k range of the few problems whose tiles would
  hold the launch is cut into chunks.

The paper's code needs every size to be a multiple of its tile (Eq. 10); ours
does not: the initial tile is the largest one that fits the problem without
padding its C to more than MAX_PAD times its area, and edge tiles are masked in the
kernel.

Pure functions of shapes, a `DeviceSpec` and the kernel's registers: this module
imports no launcher and needs no GPU. The constants that mirror a macro of
``batched.cu`` say which.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from tsm_core.runtime import config as _config

_F32, _F64 = np.dtype(np.float32), np.dtype(np.float64)

FAMILY = "batched"
BLOCK_THREADS = 256
BK = 16
META_STRIDE = 14  # batched.cu's TSM_BATCHED_META_STRIDE: 12 columns of the problem, 2 of split-K


@dataclass(frozen=True)
class TileType:
    """A tile type: the paper's five (Table 3), and our 128 x 64 and 128 x 128."""

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
# of Eq. 10's divisibility condition). Measured on the H100 (2026-11-24, device
# time of the call's own choice over the sweep's 72 cells): 1.5 ran 1.078x and 2 1.091x of 1.25, up to 1.59x on cells of
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
# (__noinline__), with no spills, it ran at 0.82-1.0x of version 1 (measured
# on the H100, 2026-11-23).
# Version 5 spills 44 bytes (NVRTC 12 for sm_90; none before) since its tensor-core
# tiles accumulate each k8 step's three MMAs in a fresh partial (blocked accumulation,
# for the error's growth with K, batched.cu's tile_gemm_tc3): at 128 registers the
# partial, even 4 of them, does not fit beside 64 accumulators. Blocking the ring's
# 64 x 64 FMA tiles (BLOCKED_MAX_RING) adds 8 bytes in version 5 and 16 in version 6
# (88): version 5's device time stayed within 1% (H200, 2026-11-28).
SPILL_BYTES_ALLOWED = {3: 64, 5: 64, 6: 88}


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
# Version 5's cp.async rings (batched.cu's TSM_BATCHED_* macros): STAGES slabs of BK for the FMA tiles,
# XSTAGES of XBK for 128 x 128 FMA tiles, TC3_STAGES of TC3_BK for the tensor-core ones.
STAGES = 3
XSTAGES = 4
TC3_BK, TC3_STAGES = 16, 3
DYNAMIC_SMEM = (5, 6)  # versions whose shared memory is dynamic (passes 48 KB)
XBK = 8  # batched.cu's TSM_BATCHED_XBK: the k step of the 128 x 64 and 128 x 128 types
# The fine-tuning loop's threshold as a fraction of the threads the GPU holds at once
# with the kernel: 1, the paper's. Measured on the H100 (2026-11-24, the sweep's 60
# cells of batch <= 256): fractions 0.5 / 0.25 / 0.125 ran at 0.971x / 0.944x / 0.925x of its speed (geomean;
# 0.5 ahead in two cells, by 1.07x and 1.17x).
TLP_FRACTION = 1.0
# Versions 1 and 2 form in-tile offsets (< 64 rows x 16 k) in int: strides must stay
# below this.
V1_MAX_STRIDE = 2**24
TC_MIN_K = 128  # batched.cu's TSM_BATCHED_TC_MIN_K: the least K on the tensor cores


# How `BatchedPlan.describe` names each version.
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


# Split-K (versions 1, 3 and 5, batched/batched.cu). A plan's tiles run in waves;
# where a few tiles of long K take longer than the average load of a block slot
# (the total work over the slots the GPU holds), they hold the launch while the
# other SMs idle. Such plans, if under SPLIT_MAX_WAVES waves of tiles, cut the K
# of those problems in two, round by round (up to SPLIT_MAX chunks of at least
# SPLIT_MIN_CHUNK), until no tile holds the launch. A tile's time is modelled as
# its outputs per thread times its k plus SPLIT_TILE_COST. The S tiles of one
# output tile add their partial sums through a workspace; the last one stores.
# Measured on the H100 (2026-11-24, device time over the sweep's 72 cells): splitting every plan under 3 waves, 1.2-1.4x on
# the cells of K up to 512 and few tiles but 0.89x where small tiles split (128 /
# 512 / 32: none dominates there); chunks of 64 lost up to 0.75x on cells of K up
# to 256. ``TSM_BATCHED_SPLITK=0`` turns it off.
SPLIT_VERSIONS = (1, 3, 5, 6)
SPLIT_MAX_WAVES = 3.0
SPLIT_MIN_CHUNK = 128
SPLIT_MAX = 16
SPLIT_TILE_COST = 300  # a tile's fixed cost, in FMAs per thread
SPLIT_ALIGN = 16  # batched.cu's TSM_BATCHED_SPLIT_ALIGN: chunks are multiples of this


# Split-K for accuracy (the same kernels, the same deterministic combine: partials
# added in split order). One running float32 FMA sum per output, the FMA tiles' order
# and cuBLAS's SGEMM kernels' own, has an error growing like sqrt(K) on signed data
# (emulated, batched/numerics.py: 8-9 units of 2^-24 of max |C| at K = 1024, 14-17 at
# 4096); cuBLAS cuts the K of products with few output tiles, so for those its error
# is that of short sums. Two rules, both through `accuracy_splits`:
#
# - coarse (every plan): a problem with K > ACC_CHUNK and at most ACC_SPLIT_AREA
#   outputs gets at least ceil(K / ACC_CHUNK) splits (up to SPLIT_MAX). Cost: S
#   partials of its C written and read, 8 S M N bytes in float32 against 2 M N K
#   flops (67 S / K of its time at 50 TFLOP/s and 3 TB/s, less in L2).
# - fine (where the model says it costs nothing; tiles without blocked accumulation
#   only, see BLOCKED_MAX): a problem with K >= ACC_MIN_K and
#   at most ACC_FINE_AREA outputs, then (second tier) at most ACC_SPLIT_AREA, gets
#   chunks of c k (up to ACC_SPLIT_MAX splits), c the first of ACC_FINE_CHUNKS whose
#   plan `split_time` (the fitted tile costs of cost.py, list-scheduled) finds within
#   ACC_COST_TOL of the coarse plan's. Such a
#   problem has few tiles, so its splits mostly take idle block slots and shorten
#   the launch's longest tile; where the batch fills the GPU the rule takes longer
#   chunks or none.
#   Why 64-128: the H100 measured cuBLAS (2026-11-28, 48 x 48 samples) at 3.0, 4.9,
#   2.3 and (float64) 5.7 units of the unit roundoff of max |C| on 202 x 15 x 1024,
#   19 x 10 x 4096, 2 x 24 x 8192 and 65 x 55 x 8192; k in chunks of 64 summed by
#   FMAs and added in order gives 2.9, 3.6, 5.3 and 6.1 (numerics.cublas_split_order,
#   median of eight seeds). Ours emulated against that model on the same data
#   (numerics.split_ratios, six seeds), median / max of the ratio at those shapes and
#   10 x 4 x 1024, 100 x 100 x 512, 512 x 512 x 1024: chunks of 64 1 (the model's
#   own order), of 128 0.74-1.45 / 0.86-1.97, of 256 0.95-2.56 / 1.14-3.69, of 512
#   1.12-3.89 / 1.26-4.74, of 1024 (the coarse rule) 1.69-4.83 / 2.06-6.68. Only
#   chunks of 64-128 keep the factor 2 (docs/lab/batched.md, 2026-11-28).
# Problems with more than ACC_SPLIT_AREA outputs keep one sum: cuBLAS has tiles enough
# not to split them (at 4096^3 its error, 2.7e-6, is one running sum's). Workspace
# capped per plan by ACC_SPLIT_WORDS elements: past it the fine rule is dropped, and
# past it with the coarse rule alone, every accuracy split.
ACC_CHUNK = 1024
# Blocked accumulation in the kernel (batched.cu's TSM_BATCHED_BLOCK_K and
# TSM_BATCHED_BLOCKED_MAX): tiles of at most BLOCKED_MAX sums a thread (the FMA types
# up to medium-large, version 2's float64 tensor-core tiles of 32 rows) sum their
# outputs in 64-k blocks added in order, the order the rules below aim at, with no
# split. In versions 1-4 the 64 x 64 type (16 sums a thread) and the 128-row ones
# would spill with a second set of sums: they keep one running sum and the split
# rules. Version 2 in
# float64 cannot split, so its long-K problems of few outputs (K >= ACC_MIN_K, at most
# ACC_SPLIT_AREA outputs) take tiles no larger than F64_BLOCKED_TOP (32 x 64).
# Versions 5 and 6 run their FMA tiles through a cp.async ring whose tiles block up
# to BLOCKED_MAX_RING sums a thread: the 64 x 64 type too.
BLOCKED_MAX = 8
BLOCKED_MAX_RING = 16
F64_BLOCKED_TOP = 3
ACC_SPLIT_AREA = 512 * 512
ACC_SPLIT_WORDS = 1 << 26
ACC_MIN_K = 512
ACC_FINE_AREA = 128 * 128
# The fine rule's tiers of output size, tried in order within one allowance: a problem
# of 128 x 128 outputs or fewer has at most a few tiles for cuBLAS too; up to 512 x
# 512 cuBLAS still has few (16 of 128 x 128) and splits, but the fine split costs more.
ACC_FINE_TIERS = (ACC_FINE_AREA, ACC_SPLIT_AREA)
ACC_FINE_CHUNKS = (64, 128, 256, 512)
# The kernel's tile word holds S in 8 bits (up to 255); 64 keeps chunks of 128 k up
# to K = 8192 and the last block's combine (S reads of its tile's partials) short.
ACC_SPLIT_MAX = 64
# The split-K combine in `split_time`: the last block of an output tile reads the S
# partials back from L2 one after another (batched.cu's split_combine; the loop over
# splits waits on each read), about one L2 round trip (~260 cycles, 0.15 us at 1.75
# GHz) a split; spread over the S tiles as their average. Not fitted: the tile costs
# were fitted to plans of at most SPLIT_MAX splits.
SPLIT_COMBINE_US = 0.15
# The fine rule's allowance over the coarse plan's modelled time: small against the
# model's own error (5-7% for `plan_cost`), so that a few small problems split in a
# batch that fills the GPU are not refused for a few tiles' fixed cost.
ACC_COST_TOL = 0.05


def accuracy_splits(shapes, types, live=None, chunk=None, area=ACC_FINE_AREA, version=None) -> np.ndarray:
    """The least splits per problem the accuracy rules ask for (see ACC_CHUNK).

    Parameters
    ----------
    shapes : array_like of int, shape (P, 3)
        (M, N, K) of each problem.
    types : array_like of int, shape (P,)
        Each problem's tile type (for the workspace).
    live : numpy.ndarray of bool, optional
        Problems with a non-empty C (default: all).
    chunk : int, optional
        None: the coarse rule only (K > ACC_CHUNK, ceil(K / ACC_CHUNK) splits). An
        int c: also the fine rule, ceil(K / c) splits (at most ACC_SPLIT_MAX) where
        K >= ACC_MIN_K and M N <= `area`.
    area : int, default ACC_FINE_AREA
        The fine rule's largest output.
    version : int, optional
        The kernel version, for which tiles block their sums (`blocked_types`).

    Returns
    -------
    numpy.ndarray of int64, shape (P,)
        Ones where no split is asked, and everywhere if the plan's workspace would
        pass ACC_SPLIT_WORDS elements.

    Examples
    --------
    >>> from tsm_core.batched import plan as bp
    >>> shapes = [(202, 15, 1024), (33, 17, 8192), (4096, 4096, 4096)]
    >>> types = bp.initial_types([202, 33, 4096], [15, 17, 4096])
    >>> bp.accuracy_splits(shapes, types).tolist()
    [1, 8, 1]
    >>> bp.accuracy_splits(shapes, types, chunk=128).tolist()  # blocked tiles: coarse only
    [1, 8, 1]
    >>> bp.accuracy_splits(shapes, [4, 4, 4], chunk=128).tolist()  # 64 x 64 tiles
    [8, 64, 1]
    """
    s = np.asarray(shapes, dtype=np.int64).reshape(-1, 3)
    types = np.asarray(types, dtype=np.int64)
    P = len(s)
    S = np.ones(P, np.int64)
    if P == 0:
        return S
    live = np.ones(P, bool) if live is None else live
    M, N, K = s[:, 0], s[:, 1], s[:, 2]
    small = live & (M * N <= ACC_SPLIT_AREA)
    S = np.where(small & (K > ACC_CHUNK), np.minimum(-(-K // ACC_CHUNK), SPLIT_MAX), 1)
    if chunk is not None:
        # Not for tiles of blocked accumulation (their sums are in 64-k blocks already)
        fine = live & (M * N <= area) & (K >= ACC_MIN_K) & ~blocked_types(types, version)
        S = np.maximum(S, np.where(fine, np.minimum(-(-K // int(chunk)), ACC_SPLIT_MAX), 1))
    if not (S > 1).any():
        return S
    words = tile_counts(M, N, types) * S * _TM[types] * _TN[types]
    if int(words[S > 1].sum()) > ACC_SPLIT_WORDS:
        return np.ones(P, np.int64)
    return S


def blocked_types(types, version=None) -> np.ndarray:
    """Whether tiles of each type sum in 64-k blocks (see BLOCKED_MAX): at most
    BLOCKED_MAX sums a thread (the FMA types up to medium-large), BLOCKED_MAX_RING in
    versions 5 and 6 (their 64 x 64 type too).

    >>> from tsm_core.batched import plan as bp
    >>> bp.blocked_types([0, 3, 4, 6]).tolist()
    [True, True, False, False]
    >>> bp.blocked_types([0, 3, 4, 6], version=5).tolist()
    [True, True, True, False]
    """
    t = np.asarray(types, dtype=np.int64)
    top = BLOCKED_MAX_RING if version in (TC3_VERSION, WG3_VERSION) else BLOCKED_MAX
    return (_TM[t] * _TN[t]) // _THREADS[t] <= top


def splitk_default() -> bool:
    """Whether plans may split K (``TSM_BATCHED_SPLITK=0`` turns it off; on by default)."""
    return _config.flag("TSM_BATCHED_SPLITK")


def split_chunk(K, S):
    """k per chunk when K is cut into S (the kernel's split_chunk): ceil(K / S)
    rounded up to SPLIT_ALIGN; the last chunk takes what is left."""
    K = np.asarray(K, dtype=np.int64)
    S = np.maximum(np.asarray(S, dtype=np.int64), 1)
    return -(-(-(-K // S)) // SPLIT_ALIGN) * SPLIT_ALIGN


def settle_splits(K, S):
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


# TILE_COSTS[v]: a, b (per class, microseconds) and t0 for version v, fitted by
# least squares on `plan_cost_features` to the device times of versions 1, 3 and 5
# on four seeds of the sweep (288 cells each), measured on the H100 on 2026-11-24
# with the kernel of commit 1a2adba. The model's time is within 5-7% of the
# measured (geomean of the ratio; worst 1.31x), and its choice ran at 1.008x of
# the fastest version's time on a fifth seed it was not fitted to (version 1 alone:
# 1.15x). The share rules it replaced ran at 1.04-1.05x.
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


def split_time(shapes, types, S, res, live=None, version=None, dtype=_F32) -> float:
    """A plan's modelled time under splits `S`, for `choose_splits`' accuracy rule.

    Each tile's cost: where ``TILE_COSTS`` has `version` (float32 versions 1,
    3, 5 and 6, fitted to H100 times), its class's a n + b microseconds with n the
    16-k steps of its chunk, as ``cost.plan_cost`` counts them, plus SPLIT_COMBINE_US
    where split; else the speed rule's
    model, outputs per thread times the chunk plus SPLIT_TILE_COST. The tiles, longest
    first (the launch order), go to the first free of the GPU's block slots
    (`wave_makespan`); the last slot's finish. Waves count: the idle slots of a
    plan's last wave take split tiles for nothing.
    """

    s = np.asarray(shapes, dtype=np.int64).reshape(-1, 3)
    if not len(s):
        return 0.0
    live = np.ones(len(s), bool) if live is None else live
    S = np.maximum(np.asarray(S, np.int64), 1)
    tiles = np.where(live, tile_counts(s[:, 0], s[:, 1], types), 0)
    chunk = np.minimum(split_chunk(s[:, 2], S), s[:, 2])
    theta = TILE_COSTS.get(version) if np.dtype(dtype) == _F32 else None
    if theta is not None:
        th = np.nan_to_num(np.asarray(theta, np.float64))
        n = N_COST_CLASSES
        cls = np.asarray(types, np.int64).copy()
        if version in TC3_VERSIONS:
            cls = np.where((cls == XL_TYPE) & (s[:, 2] >= TC_MIN_K), TC3_CLASS, cls)
        t = th[cls] * (-(-chunk // BK)) + th[n + cls] + np.where(S > 1, SPLIT_COMBINE_US, 0.0)
    else:
        per_k = np.array([t.outputs_per_thread for t in TILE_TYPES], dtype=np.int64)[types]
        t = (per_k * chunk + SPLIT_TILE_COST).astype(np.float64)
    return wave_makespan(np.repeat(t, tiles * S), res.sm_count * max(1, res.blocks_per_sm))


def wave_makespan(cost, slots: int) -> float:
    """List scheduling of `cost`, longest first, on `slots` identical slots, a wave at
    a time: each wave's `slots` tiles go, longest to the earliest free slot, in one
    sorted pairing (numpy, T / slots steps) instead of ``cost.schedule``'s tile by
    tile heap (a Python step per tile: 30,000 tiles took 30 ms). The same where a
    plan fits in one wave; otherwise a tile may wait for a slot that one of its own
    wave would free sooner. Returns the last slot's finish."""
    cost = -np.sort(-np.asarray(cost, dtype=np.float64))
    if not len(cost):
        return 0.0
    finish = np.zeros(max(1, int(slots)))
    for w in range(0, len(cost), len(finish)):
        c = cost[w:w + len(finish)]
        finish[:len(c)] += c  # finish is sorted ascending: the longest to the earliest
        finish.sort()
    return float(finish[-1])


def choose_splits(shapes, types, res, live=None, version=None, dtype=_F32) -> np.ndarray:
    """Splits per problem (1: none) for a plan of `types`: the speed rule (see
    SPLIT_MAX_WAVES), then the accuracy rules (see ACC_CHUNK): per tier of
    ACC_FINE_TIERS, the shortest chunk of ACC_FINE_CHUNKS whose plan `split_time`
    (with `version`'s fitted tile costs where there are some) finds within
    ACC_COST_TOL of the coarse rule's, else that tier keeps the coarse rule."""
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
    coarse = settle_splits(K, np.maximum(S, accuracy_splits(s, types, live)))
    cur, base = coarse, None
    for area in ACC_FINE_TIERS:  # the smallest outputs first, then larger ones if affordable
        for c in ACC_FINE_CHUNKS:
            acc = accuracy_splits(s, types, live, chunk=c, area=area, version=version)
            if not (acc > cur).any():
                break  # no problem of this tier the rule would split further
            fine = settle_splits(K, np.maximum(cur, acc))
            if int((tiles * fine).sum()) <= slots:
                cur = fine  # one wave: every tile runs at once, none longer than before
                break
            if base is None:
                base = split_time(s, types, coarse, res, live, version, dtype)
            if split_time(s, types, fine, res, live, version, dtype) <= base * (1 + ACC_COST_TOL):
                cur = fine
                break
    return cur


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
    """How many blocks of the kernel an SM holds (the conversion phi of Eq. 5-9).

    Attributes
    ----------
    regs : int
        Registers per thread of the kernel.
    smem : int
        Shared memory per block, bytes.
    blocks_per_sm : int
        Blocks of 256 threads resident per SM.
    limit : str
        What bounds `blocks_per_sm`: "threads", "registers", "shared memory" or "blocks".
    sm_count : int
        SMs of the GPU.
    max_warps_per_sm : int
        Warps an SM holds at most.
    """

    regs: int
    smem: int
    blocks_per_sm: int
    limit: str
    sm_count: int
    max_warps_per_sm: int

    @property
    def warps_per_sm(self) -> int:
        """Warps resident per SM with this kernel."""
        return min(self.max_warps_per_sm, self.blocks_per_sm * BLOCK_THREADS // 32)

    @property
    def capacity_warps(self) -> int:
        """Warps resident on the whole GPU with this kernel."""
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

    Made by `plan_batched` (and held by ``PreparedBatch.plan``); ``str(plan)`` is
    `describe`. The fields are also the constructor's parameters.

    Parameters
    ----------
    shapes : numpy.ndarray of int64, shape (P, 3)
        (M, N, K) of each problem.
    dtype : numpy.dtype
        float32 or float64.
    types : numpy.ndarray of int64, shape (P,)
        Index into `TILE_TYPES` of each problem's tile.
    tiles : numpy.ndarray of int32, shape (T, 4)
        One row per block: (problem, m0, n0, type), longest work first.
    residency : Residency
        Blocks of the kernel an SM holds, and why.
    threshold : int
        TLP_threshold, in threads: one full wave of resident warps.
    history : list of (dict, int)
        Per step of Algorithm 1: the histogram of tile types and the TLP.
    device : str
        Name of the GPU planned for.
    version : int
        The kernel version planned for (see `VERSIONS`).
    splits : numpy.ndarray of int64, shape (P,)
        Chunks of k per problem (1: not split).
    tile_split : numpy.ndarray of int64, shape (T, 2)
        Each tile's (split index, splits).

    Examples
    --------
    >>> from tsm_core.batched import plan_batched
    >>> from tsm_core.runtime.device import KNOWN_GPUS
    >>> p = plan_batched([(100, 37, 64), (1, 1, 1)], spec=KNOWN_GPUS["H100"], regs=80)
    >>> p.n_tiles, p.flops
    (22, 473602)
    >>> p.histogram()
    {'small': 2}
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
        """Problems whose k range is split."""
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
        """Blocks of the launch (tiles of the list)."""
        return int(self.tiles.shape[0])

    @property
    def flops(self) -> int:
        """Floating-point operations of the batch (2 M N K summed)."""
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
        """Problems per tile type (by name), for the types the plan uses."""
        return {TILE_TYPES[t].name: int(np.sum(self.types == t)) for t in range(len(TILE_TYPES))
                if np.any(self.types == t)}

    def describe(self) -> str:
        """The plan in words (what ``tsm_core.explain`` shows for a batch).

        Returns
        -------
        str
            One line for the launch, then sizes, residency, each step of
            Algorithm 1, split-K and the first wave.
        """
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
                         f"{S.max()} chunks of k (their tiles held the launch, or their K "
                         "was long for their outputs: the accuracy rules)")
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


def tile_batch(shapes, dtype, spec, regs: int, version: int, split_k: bool) -> BatchedPlan:
    """Algorithm 1 and split-K for checked `shapes` (int64, (P, 3) of (M, N, K)).

    `spec` is the GPU planned for, `regs` the kernel's registers per thread;
    ``tsm_core.batched.plan_batched`` checks its arguments and fills these in.
    """
    s = shapes
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
    if version == 2 and np.dtype(dtype) == _F64 and len(s):
        # Version 2 cannot split K: a long-K problem of few outputs takes tiles of
        # blocked accumulation (see F64_BLOCKED_TOP) instead of the 64 x 64 ones.
        few = live & (s[:, 2] >= ACC_MIN_K) & (M * N <= ACC_SPLIT_AREA)
        types = np.where(few, np.minimum(types, F64_BLOCKED_TOP), types)
    splits = np.ones(len(s), np.int64)
    if version in SPLIT_VERSIONS and split_k:
        splits = choose_splits(s, types, res, live, version, dtype)
    tiles, tsplit = build_tiles(np.where(live[:, None], s, 0), types, splits, with_split=True)
    return BatchedPlan(shapes=s, dtype=dtype, types=types, tiles=tiles, residency=res,
                       threshold=threshold, history=history, device=spec.name,
                       version=int(version), splits=splits, tile_split=tsplit)
