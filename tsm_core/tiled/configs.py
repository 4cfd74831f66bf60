"""The tiled GEMM and Strassen family's tuning space and switches, as data.

Tile shapes, occupancies, the thresholds of the planners and the on/off switches of
the kernel paths (gemm_pipe, gemm_ws, the two-level hybrid, PDL). The launchers read
them from this module at each call, so a test or a benchmark that sets one here (for
instance ``configs.WS_PLAIN = False``) changes the next launch. Figures are H100
measurements.
"""

from __future__ import annotations

from dataclasses import dataclass


THREADS = 256
TILE = {4: (128, 128), 8: (64, 64)}  # itemsize -> (BM, BN), as in gemm.cu TileCfg
VEC = {4: 4, 8: 2}  # elements per 16-byte vector
DESC_LEN = 32

# Tuning data: k-depth of a gemm_tiled tile and the occupancy it is compiled for
# (__launch_bounds__ minimum blocks per SM). Fused Strassen products run two blocks
# per SM like the plain kernel although ptxas then spills a few dozen bytes in the
# variants with two or four terms per operand: on the H100 that was faster than one
# block per SM without spills (first device run: 39.9 against 36.6 TFLOP/s at
# N = 8192, one level), the register-staged kernel being latency-bound.
DEFAULT_BK = {4: 8, 8: 8}
PLAIN_OCC = 2
WIDE_OCC = 1  # the wide tile (wn = 4): 204-255 registers, one block per SM
FUSED_OCC = 2


# gemm_pipe (v3) for the wide tile's whole tiles: 0.90-0.91 of cuBLAS against
# gemm_tiled's 0.86-0.87 at N = 2048-8192 (H100).
# False keeps gemm_tiled (A/B comparisons).
USE_PIPE = True
SPLIT_MAX = 8  # k-ranges of a split tail
# Cost of the partial sums (written, then read by the reduce kernel) per k-range, in
# waves per wave-fraction of tail tiles: fitted on N = 2560 (wide, 68 tail tiles on
# 132 slots), where 5 and 7 ranges measured the same (39.5 TFLOP/s) and 3 slower (38.2).
SPLIT_REDUCE_COST = 0.025
SPLIT_MIN_KTILES = 4  # k-tiles per range at least
SPLIT_MIN_GAIN = 0.05  # of the whole time (waves): N = 8192 (a third of 1 of 16 waves) lost 2%


@dataclass(frozen=True)
class AsyncConfig:
    """Tile of gemm_async: BM x BN block tile, BK k-depth, STAGES cp.async stages,
    OCC minimum blocks per SM (__launch_bounds__)."""

    bm: int
    bn: int
    bk: int
    stages: int
    occ: int = 2


# The plain-GEMM planner's candidates (float32): gemm_tiled's 128 x 128 tile (two
# blocks per SM), its 128 x 256 "wide" tile (one per SM) and gemm_async's 64 x 64
# tile (three per SM), with their measured speeds relative to each other on full
# waves (H100: 42-43, 43-45 and 34 TFLOP/s at N >= 4096, C-ordered; 0.7 rather
# than 0.8 fits the sizes where tiled and async64 are close).
# Time ~ (blocks per SM, rounded up) x tile area / efficiency: co-resident blocks
# share an SM, so a partial last wave costs in proportion to the blocks it puts on
# the busiest SM. float64 always takes gemm_tiled (64 x 64).
SMALL_TILE = AsyncConfig(64, 64, 16, 4, 3)
TILE_EFF = {"tiled": 1.0, "wide": 1.05, "async64": 0.7}
WIDE_TILE = (128, 256)  # float32 gemm_tiled with wn = 4


# gemm_async tiles the planner knows (each compiles without spills; see tests).
# (A 128 x 128 float32 tile was dropped: 37 against gemm_tiled's 43 TFLOP/s, and it
# spills once edge blocks load whole vectors.)
ASYNC_TILES = {4: (SMALL_TILE,), 8: (AsyncConfig(64, 64, 8, 4),)}
SMEM_DEFAULT = 48 * 1024  # above this a kernel must opt in (sm_70+)
SMEM_LIMIT = 227 * 1024   # sm_90's largest dynamic shared memory per block


PEEL_FRACTION = 8  # peel a last partial tile row/column of at most BM / 8 rows (BN / 8 columns)


# Both kernels read an operand whose rows (or columns) are not 16-byte aligned element
# by element. For gemm_tiled (both widths) that cost 9% at N = 4095 on the H100 (3640
# against 3320 us on aligned copies) and 13% at 2049 on whole tiles (485 against 429
# us), against 165 and 48 us to copy A and B into buffers with an aligned leading
# dimension (the two copies at the same time): worth it where
# m n k / (m k + k n) >= REALIGN_RATIO (N >= 2048 square; at 2047 the copies cost 45
# us for a 27 us gain). gemm_async is not given copies: at 1025 they cost more than
# they saved.
REALIGN_RATIO = 1024


# The wide tile's k-depth: 16 (49 KB of shared memory, one barrier per 2048 FFMAs
# per thread) measured 1-4% faster than 8 from K = 4096 on (H100, C- and F-ordered),
# 1% slower at 2048.
WIDE_BK16_MIN_K = 3072


@dataclass(frozen=True)
class PipeConfig:
    """gemm_pipe (float32, 128 x 256 tile): BK k-depth, STAGES shared-memory stages,
    UNROLL k-steps unrolled (0: all BK), ORDER of each step's FFMAs (0 rows outer, 1
    columns outer, 2 zig-zag). The default is the fastest measured (H100)."""

    bk: int = 16
    stages: int = 3
    unroll: int = 0
    order: int = 2
    midbar: bool = False  # the barrier half a k-tile in (needs stages >= 3)


PIPE_TILE = (128, 256)
PIPE = PipeConfig()
# The fused Strassen products (one level): the barrier half a k-tile in and four
# stages; N = 8192, one run: 0.906x of cuBLAS against 0.877x for PIPE's schedule
# (H100). The plain GEMM measured the
# same either way (0.91), and the hybrid's single-term products take PIPE.
PIPE_FUSED = PipeConfig(stages=4, midbar=True)
PIPE_HYBRID = PIPE


# gemm_ws (tiled/gemm.cu): gemm_pipe's tile and compute loop, its loads and the
# fused products' operand sums in a producer warpgroup (warp specialization, named
# barriers, setmaxnreg: sm_90a). Taken for float32 operands with 16-byte vectors and
# A contiguous along k on compute capability 9.0 devices, where these flags are set
# (fused products: B contiguous along n too).
WS_PLAIN = True  # the plain GEMM's gemm_pipe launches
WS_STRASSEN = True  # one level's fused products and the hybrid's products
WS_STAGES = 4
WS_THREADS = 384


WS_RC = 224  # the consumers' registers: the plain product
WS_RC_FUSED = 216  # and the fused ones (tiled/gemm.cu, WS_CONSUMER_REGS)
WS_RC_BK = 208  # B contiguous along k: its producers hold a tile of B (no spills here)


# One level on gemm_ws with C as scratch (no workspace): the products M6 and M7, the
# ones with two terms in both operands that no earlier product writes C12 or C21
# for, go first, each with its B sum formed beforehand into one of those (still
# unwritten) blocks of C, so that they run as (2, 1) products: gemm_ws's (2, 2)
# products cost 7-8% over a plain launch, its (2, 1) ones 0.4-2% (H100).
# Rounds: [M6, M7] (B from C), [M1], [M2, M5], [M3, M4]; M5 and M2 later overwrite
# the two scratch blocks (their first writes), after the first round is done (each
# launch waits for the one before it before its epilogue). Products are 0-based.
SCRATCH1 = True
SCRATCH1_ROUNDS = ((5, 6), (0,), (1, 4), (2, 3))
SCRATCH1_B = {5: (0, 1), 6: (1, 0)}  # product -> the C block its B sum goes into


# Two levels as the paper's hybrid (its Section 3.4): the top level as the reference
# algorithm, with its operand sums formed in a workspace, and the products of the
# bottom level on gemm_pipe, whose operand sums are formed in a second, smaller
# workspace too (on gemm_pipe's two-term path the products ran at about 0.84 of its
# plain speed, H100; a sum costs one pass over a block). Each product
# adds its result into its (up to four) blocks of C from registers. Workspace:
# (mk + kn) * 9/16 elements a set of buffers (a top-level product's sums and those of
# its seven products), two sets with HYBRID2_OVERLAP. False: the fully fused form
# (gemm_tiled, no workspace).
HYBRID2 = True


# gemm_pipe takes a Strassen launch (a round of products, or one hybrid product) only
# if it has at least this many waves of its 128 x 256 tiles (one block per SM); below,
# gemm_tiled's 128 x 128 tiles put a block on twice as many SMs. H100: at
# N = 2048 (one level, 32-64 tiles a launch) gemm_pipe read 0.35x of cuBLAS against
# gemm_tiled's 0.51x; at 4096 (128-256 tiles) 0.83x against 0.73x; the hybrid at
# 8192 (128 tiles a product) 0.89x against the fused two levels' 0.69x, at 4096 (32
# tiles) 0.20x against 0.50x.
PIPE_MIN_WAVE = 0.75


# Operand sums beside the products (HYBRID2_OVERLAP): small blocks of block_sum that
# fit on an SM next to gemm_pipe's one block (which leaves 2-6 K registers free), so
# that the sums of the next product run while this one computes.
HYBRID2_OVERLAP = True
SUM_THREADS = 64
SUM_BLOCKS_PER_SM = 2


# Programmatic dependent launch (PDL) between Strassen's gemm_pipe launches: each
# launch after the first of a run of products (the hybrid: the seven of a top-level
# product; one level: its four rounds) goes with the programmatic-serialization
# attribute, so that it starts on the SMs the previous one's last wave leaves idle
# (512 tiles of 128 x 256 are 3.88 waves on 132 SMs) and waits, before its epilogue,
# for the previous one to finish (gemm_pipe's pdl_wait). A run's first launch is an
# ordinary one: it must not overlap whatever wrote A and B. False, or a driver
# without cuLaunchKernelEx: ordinary launches.
STRASSEN_PDL = True
