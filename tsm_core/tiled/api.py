"""Regular GEMM and Strassen's algorithm fused into it (tiled/gemm.cu, issue 6).

Kernels (the optimisation ladder, each checked against the same float64 reference):

- v1 ``gemm_tiled``: 128 x 128 block tile (float64: 64 x 64), 256 threads, an 8 x 8
  (4 x 4) register block per thread, global -> registers -> k-major shared tiles
  (a k-contiguous operand is transposed on the way), two shared buffers, one
  barrier per k-step. The fastest plain kernel on full waves, and the base of the
  fused Strassen products.
  Its wide form (``wn = 4``, float32): 128 x 256, 8 x 16 per thread, one block per
  SM, 5% faster on full waves.
- v2 ``gemm_async``: the same outer products on a 4-stage cp.async pipeline, each
  operand copied in its own layout. Measured slower than v1 at 128 x 128 (H100: 37
  against 43 TFLOP/s), faster at 64 x 64 on problems too small to fill the GPU.

``gemm`` picks among v1 (128 x 128 or 128 x 256) and v2 (64 x 64) by a wave model
(``plan_plain``); a last partial tile row or column of at most 1/8 of a tile goes to
TSM2R (``plan_peel``); v1 is given aligned copies of operands whose leading
dimension is not 16-byte aligned when the product is large enough
(``REALIGN_RATIO``), and splits the tiles of a partial last wave (or of a problem
under half a wave) along k (``plan_tail_split``): no cliff at 1025, 2049 or 4097,
none at 2560 or 3072 from the wave count. ``strassen`` runs one or two levels of Strassen's algorithm in
which every product is one launch of v1 in its fused form (the paper's
``M = (X + dY)(V + eW); D += g0 M; E += g1 M``, generalised to the Kronecker product
of two levels: up to 4 terms per operand and 4 destinations).

Scheduling and races. Products that add into a common block of C never run at
the same time: the products are split into rounds whose destination sets are
disjoint (greedy colouring), the rounds run in stream order, and each round is
one launch per operand signature (``blockIdx.z`` picks the product). No atomics;
the result is deterministic. The first product to reach a block of C stores into
it (the rest accumulate), so ``out`` is never read and needs no clearing.

Odd sizes: dynamic peeling. Strassen runs on the leading (m', k', n') part, each a
multiple of 2**levels * V (V = 4 float32 or 2 float64 elements: 16-byte blocks); the
remaining rows, columns and the k-remainder are finished by the plain kernels (a
rank-(k - k') update with beta = 1, plus the thin strips of C).

Memory orders: A and B may each be C- or F-ordered or strided with one unit stride;
the kernel reads both layouts directly (a k-contiguous operand is transposed on
its way into shared memory), so nothing is copied. A view with no unit stride is
copied once to C order. ``out`` may have any strides.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from tsm_core.runtime import arrays as _arrays

from tsm_core.runtime import compile as _compile
from tsm_core.tsm2.launch import a_layout
from tsm_core.runtime.checks import check_operands

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


# ------------------------------------------------------------------ layouts


def _operand(X, transposed: bool):
    """(contiguous-along-k, leading dimension, 16-byte vectors ok, array to read).

    A (m, k) is passed as is; B (k, n) as B.T (n, k), so that for both the question
    is whether the second axis (k) is the contiguous one."""
    lay, X2 = a_layout(X.T if transposed else X)
    arr = X2.T if transposed else X2
    v = VEC[X.itemsize]
    return (not lay.col), lay.lda, lay.vec == v, arr


def gemm_name(dtype, a_k, b_k, va, vb, bk=None, na=1, nb=1, nc=1, fused=False, occ=None, wn=2,
              split=False):
    """Name expression of one gemm_tiled instantiation (wn = 4: the wide tile; split:
    the split-K tail's variant)."""
    item = np.dtype(dtype).itemsize
    bk = DEFAULT_BK[item] if bk is None else bk
    occ = (FUSED_OCC if fused else (PLAIN_OCC if wn == 2 else WIDE_OCC)) if occ is None else occ
    b = lambda x: "true" if x else "false"  # noqa: E731
    return (f"gemm_tiled<{_compile.ctype(dtype)}, {b(a_k)}, {b(b_k)}, {b(va)}, {b(vb)}, "
            f"{bk}, {na}, {nb}, {nc}, {b(fused)}, {occ}, {wn}, {b(split)}>")


def _grid(m, n, item, nz=1, wn=2):
    bm, bn = TILE[item]
    bn = bn * wn // 2
    return (-(-m // bm) * -(-n // bn), 1, nz)


# ------------------------------------------------------------------ plain GEMM


# gemm_pipe (v3) for the wide tile's whole tiles: 0.90-0.91 of cuBLAS against
# gemm_tiled's 0.86-0.87 at N = 2048-8192 (H100, session 15,
# benchmarks/gemm_pipe_probe.py). False keeps gemm_tiled (A/B probes).
USE_PIPE = True
SPLIT_MAX = 8  # k-ranges of a split tail
# Cost of the partial sums (written, then read by the reduce kernel) per k-range, in
# waves per wave-fraction of tail tiles: fitted on N = 2560 (wide, 68 tail tiles on
# 132 slots), where 5 and 7 ranges measured the same (39.5 TFLOP/s) and 3 slower (38.2).
SPLIT_REDUCE_COST = 0.025
SPLIT_MIN_KTILES = 4  # k-tiles per range at least
SPLIT_MIN_GAIN = 0.05  # of the whole time (waves): N = 8192 (a third of 1 of 16 waves) lost 2%


def plan_tail_split(tiles, slots, k, bk):
    """(t1, S): tiles [0, t1) run whole; the others (those of the last, partial
    wave) each run as S blocks over k-ranges, whose sums a second kernel adds.

    A last wave of r tiles on `slots` block slots takes a whole wave's time for r /
    slots of the work; split S ways it takes ceil(S r / slots) / S of a wave, plus the
    partial sums' traffic (SPLIT_REDUCE_COST). S is
    the one of 2 .. SPLIT_MAX that makes this smallest, used where it saves at least
    SPLIT_MIN_GAIN of the whole time (N = 3072, gemm_tiled: 576 tiles on 264 slots,
    the 48 of the third wave split 4 ways: 2.25 waves instead of 3, measured 0.71 ->
    0.90 of cuBLAS; the planner now takes the wide tile split 5 ways there, 0.96). A problem of at most half a wave is split whole (N = 1024:
    64 tiles as 256 blocks of a quarter of k)."""
    full, rem = divmod(tiles, slots)
    if rem == 0 or (full == 0 and 2 * rem > slots):
        return tiles, 1
    best, best_s = 1.0, 1
    for S in range(2, SPLIT_MAX + 1):
        if k < SPLIT_MIN_KTILES * bk * S:
            break
        c = -(-S * rem // slots) / S + SPLIT_REDUCE_COST * S * rem / slots
        if c < best - 0.005:  # ties go to fewer ranges (less memory)
            best, best_s = c, S
    if best_s == 1 or (1 - best) / (full + 1) < SPLIT_MIN_GAIN:
        return tiles, 1
    return full * slots, best_s


def _launch_gemm(A, B, C, alpha, beta, bk=None, wn=2, split=None):
    """C = alpha A @ B + beta C on CuPy arrays (checked; m, n, k >= 1).

    ``split``: None plans a split-K tail (``plan_tail_split``), False never splits,
    (t1, S) forces one (tests)."""
    m, k = A.shape
    n = B.shape[1]
    A0, B0 = A, B
    a_k, lda, va, A = _operand(A, False)
    b_k, ldb, vb, B = _operand(B, True)
    item = A.itemsize
    T = np.float32 if item == 4 else np.float64
    # The wide tile's whole tiles run on gemm_pipe where both operands have vectors
    # (the same tile and tile order; the split-K tail stays on gemm_tiled).
    pipe = wn == 4 and item == 4 and va and vb and USE_PIPE
    bk = bk or DEFAULT_BK[item]
    if wn == 4 and bk == 16 and not (va and vb):
        bk = 8  # scalar loads at BK = 16 need more than 255 registers (ptxas spills)
    rs, cs = (s // item for s in C.strides)
    bm, bn = TILE[item][0], TILE[item][1] * wn // 2
    tiles = -(-m // bm) * -(-n // bn)
    if split is None:
        occ = PLAIN_OCC if wn == 2 else WIDE_OCC
        split = plan_tail_split(tiles, _sm_count(C.data.device_id) * occ, k, bk)
    t1, S = split if split else (tiles, 1)
    common = (A, B, C, np.int32(m), np.int32(n), np.int32(k), np.int64(lda), np.int64(ldb),
              np.int64(rs), np.int64(cs), T(alpha), T(beta), np.uint64(0))

    def launch(grid, split_variant, tail_args):
        # (a small problem split whole never compiles the unsplit variant)
        kern = _compile.get_kernel("gemm", gemm_name(A.dtype, a_k, b_k, va, vb, bk, wn=wn,
                                                     split=split_variant))
        kern((grid,), (THREADS,), common + tail_args, shared_mem=_dynamic_smem(kern, item, bk, wn))

    if t1 > 0 and pipe:
        _launch_pipe(A0, B0, C, alpha, beta, tiles=t1)
    elif t1 > 0:
        launch(t1, False, (np.int32(0), np.int32(1), np.int32(k), np.uint64(0)))
    if t1 < tiles:
        import cupy

        rem = tiles - t1
        kchunk = -(-(-(-k // S)) // bk) * bk  # whole k-tiles per range
        S = -(-k // kchunk)  # rounding kchunk up can leave the last range(s) empty
        W = cupy.empty(rem * S * bm * bn, dtype=A.dtype)
        launch(rem * S, True, (np.int32(t1), np.int32(S), np.int32(kchunk), W))
        red = _compile.get_kernel("gemm", reduce_name(A.dtype, bm, bn))
        blocks = min(-(-(rem * bm * bn) // THREADS), 8 * _sm_count(C.data.device_id))
        red((blocks,), (THREADS,), (W, np.int32(S), np.int32(t1), np.int32(rem), C, np.int32(m),
                                    np.int32(n), np.int64(rs), np.int64(cs), T(alpha), T(beta)))


def reduce_name(dtype, bm, bn):
    return f"gemm_splitk_reduce<{_compile.ctype(dtype)}, {bm}, {bn}>"


def _dynamic_smem(kern, item, bk, wn):
    """Bytes of dynamic shared memory gemm_tiled takes (0: its static buffers fit)."""
    bm, bn = TILE[item]
    v = VEC[item]
    need = 2 * bk * (bm + v + bn * wn // 2 + v) * item
    if need <= SMEM_DEFAULT:
        return 0
    if getattr(kern, "max_dynamic_shared_size_bytes", 0) < need:
        kern.max_dynamic_shared_size_bytes = need
    return need


# ------------------------------------------------------------------ v2: cp.async


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


def plan_plain(m, n, item, sms=132, k=None):
    """("tiled", None), ("wide", None) or ("async", AsyncConfig): the plain GEMM
    kernel for (m, n).

    Each tile is costed on the part of C it will cover after ``plan_peel`` (the
    peeled strips cost about the same for both), and, given k, with the split-K
    tail ``plan_tail_split`` would give gemm_tiled's tiles."""
    if item != 4:
        return "tiled", None

    def cost(bm, bn, eff, occ=None, bk=8):
        pm, pn = plan_peel(m, n, item, (bm, bn))
        blocks = -(-(m - pm) // bm) * -(-(n - pn) // bn)
        per_sm = -(-blocks // sms)
        if occ and k:
            t1, S = plan_tail_split(blocks, sms * occ, k, bk)
            if S > 1:
                per_sm = t1 // sms + -(-S * (blocks - t1) // sms) / S
        return per_sm * bm * bn / eff

    c = SMALL_TILE
    wide_bk = 16 if k and k >= WIDE_BK16_MIN_K else 8
    costs = [(cost(*TILE[item], TILE_EFF["tiled"], PLAIN_OCC), ("tiled", None)),
             (cost(*WIDE_TILE, TILE_EFF["wide"], WIDE_OCC, wide_bk), ("wide", None)),
             (cost(c.bm, c.bn, TILE_EFF["async64"]), ("async", c))]
    return min(costs, key=lambda x: x[0])[1]


def async_name(dtype, a_k, b_k, va, vb, cfg: AsyncConfig):
    b = lambda x: "true" if x else "false"  # noqa: E731
    return (f"gemm_async<{_compile.ctype(dtype)}, {b(a_k)}, {b(b_k)}, {b(va)}, {b(vb)}, "
            f"{cfg.bm}, {cfg.bn}, {cfg.bk}, {cfg.stages}, {cfg.occ}>")


# gemm_async tiles the planner knows (each compiles without spills; see tests).
# (A 128 x 128 float32 tile was dropped: 37 against gemm_tiled's 43 TFLOP/s, and it
# spills once edge blocks load whole vectors.)
ASYNC_TILES = {4: (SMALL_TILE,), 8: (AsyncConfig(64, 64, 8, 4),)}
SMEM_DEFAULT = 48 * 1024  # above this a kernel must opt in (sm_70+)
SMEM_LIMIT = 227 * 1024   # sm_90's largest dynamic shared memory per block


@functools.lru_cache(maxsize=None)
def _sm_count(dev):
    import cupy

    return cupy.cuda.runtime.getDeviceProperties(dev)["multiProcessorCount"]


PEEL_FRACTION = 8  # peel a last partial tile row/column of at most BM / 8 rows (BN / 8 columns)


def plan_peel(m, n, item, tile=None):
    """(pm, pn): rows and columns of C that the tile kernel (``tile`` = (BM, BN),
    gemm_tiled's by default) leaves to TSM2R strips.

    A last partial tile row with r <= BM / 8 rows costs a whole tile row of FFMAs
    for r rows of results, and on a GPU with S tile slots it can add a wave: N = 2049
    is 17 x 17 = 289 tiles on 264 slots (two waves, the second 9% full) where 2048
    is 256 (one wave). Those r rows are a tall-and-skinny product instead, C[m - r:]^T
    = B^T A[m - r:]^T, which TSM2R runs at memory speed (it reads B once), as it does
    the r last columns, A B[:, n - r:]. Cost: about one read of A and of B.
    """
    bm, bn = tile or TILE[item]
    rm, rn = m % bm, n % bn
    pm = rm if m > bm and rm <= bm // PEEL_FRACTION else 0
    pn = rn if n > bn and rn <= bn // PEEL_FRACTION else 0
    return pm, pn


# Both kernels read an operand whose rows (or columns) are not 16-byte aligned element
# by element. For gemm_tiled (both widths) that cost 9% at N = 4095 on the H100 (3640
# against 3320 us on aligned copies) and 13% at 2049 on whole tiles (485 against 429
# us), against 165 and 48 us to copy A and B into buffers with an aligned leading
# dimension (the two copies at the same time): worth it where
# m n k / (m k + k n) >= REALIGN_RATIO (N >= 2048 square; at 2047 the copies cost 45
# us for a 27 us gain). gemm_async is not given copies: at 1025 they cost more than
# they saved.
REALIGN_RATIO = 1024


def _realigned(X, stream):
    """X's values in a fresh buffer whose leading dimension is a multiple of 16 bytes
    (the same layout). The buffer comes from the current stream's pool; the copy runs
    on ``stream``. gemm_tiled's edge blocks read the padding (a vector that starts
    inside the matrix may end there; what it produces is not stored), so the copy
    kernel (``realign_copy``) zeroes it: a read of uninitialized memory would be
    flagged by compute-sanitizer's initcheck and could carry NaN through registers
    for nothing."""
    import cupy

    if X.strides[0] == X.itemsize and X.shape[1] > 1:  # column-major: pad the columns
        return _realigned(X.T, stream).T
    v, item = VEC[X.itemsize], X.itemsize
    rows, cols = X.shape
    ld = X.strides[0] // item if rows > 1 else cols
    buf = cupy.empty((rows, -(-cols // v) * v), dtype=X.dtype)
    kern = _compile.get_kernel("gemm", f"realign_copy<{_compile.ctype(X.dtype)}>")
    groups = buf.shape[1] // v
    grid = (-(-groups // THREADS), min(rows, 65535))
    with stream:
        kern(grid, (THREADS,), (X, np.int64(ld), buf, np.int64(buf.shape[1]), np.int32(rows),
                                np.int32(cols)))
    return buf[:, :cols]


def _plain(A, B, C, alpha, beta):
    """The planner's plain kernel for C = alpha A @ B + beta C (CuPy, m, n, k >= 1)."""
    m, k = A.shape
    n = B.shape[1]
    kind, cfg = plan_plain(m, n, A.itemsize, _sm_count(C.data.device_id), k)
    bm, bn = _tile_of(kind, cfg, A.itemsize)
    pm, pn = plan_peel(m, n, A.itemsize, (bm, bn))
    realign = kind != "async" and m * n * k >= REALIGN_RATIO * (m * k + k * n)
    if pm or pn or (realign and not (_aligned(A) and _aligned(B.T))):
        return _launch_peeled(A, B, C, alpha, beta, pm, pn, kind, cfg, realign)
    return _launch_kind(kind, cfg, A, B, C, alpha, beta)


def _aligned(X):
    """True if the kernels can read X (as A: (rows, k)) with 16-byte vectors."""
    item = X.itemsize
    s0, s1 = X.strides
    ld = s0 // item if s1 == item else (s1 // item if s0 == item else 0)
    return ld > 0 and ld % VEC[item] == 0 and X.data.ptr % 16 == 0


def _tile_of(kind, cfg, item):
    return {"tiled": TILE[item], "wide": WIDE_TILE}.get(kind) or (cfg.bm, cfg.bn)


# The wide tile's k-depth: 16 (49 KB of shared memory, one barrier per 2048 FFMAs
# per thread) measured 1-4% faster than 8 from K = 4096 on (H100, C- and F-ordered),
# 1% slower at 2048.
WIDE_BK16_MIN_K = 3072


def _launch_kind(kind, cfg, A, B, C, alpha, beta):
    if kind == "async":
        return _launch_async(A, B, C, alpha, beta, cfg)
    if kind == "wide":
        bk = 16 if A.shape[1] >= WIDE_BK16_MIN_K else 8
        return _launch_gemm(A, B, C, alpha, beta, bk=bk, wn=4)
    return _launch_gemm(A, B, C, alpha, beta)


def _launch_peeled(A, B, C, alpha, beta, pm, pn, kind="tiled", cfg=None, realign=False):
    """The planner's kernel on the whole tiles of C, TSM2R on the last pm rows and pn
    columns (none if both are 0), the strips on a second stream while the tiles run.

    The three pieces of C are disjoint, so each takes alpha and beta as they are.
    With ``realign``, an operand whose leading dimension is not 16-byte aligned is
    first copied into an aligned buffer for the tile kernel (B on the second stream,
    A on the caller's, at the same time); the strips read the operands as they are.
    Every buffer is allocated on the caller's stream, and that stream waits for the
    second one before anything after this call, so the memory pool hands no buffer
    to later work while a copy or a strip still uses it."""
    import cupy

    from tsm_core.tsm2 import launch as _tsm2

    m, n = A.shape[0], B.shape[1]
    mm, nn = m - pm, n - pn
    main = cupy.cuda.get_current_stream()
    side = _arrays.side_stream("gemm-strips")
    v = VEC[A.itemsize]
    At, Bt = A, B  # what the tile kernel reads
    if realign:
        lay, At = a_layout(A)  # (A itself, or its C-ordered copy if no axis is contiguous)
        if lay.vec != v:
            At = _realigned(At, main)
        lay, Btt = a_layout(B.T)
        Bt = Btt.T if lay.vec == v else None
    side.wait_event(main.record())
    if Bt is None:
        Bt = _realigned(Btt.T, side)
    b_ready = side.record()
    with side:
        if pn:
            _tsm2.launch_tsm2r(A[:mm], B[:, nn:], C[:mm, nn:], alpha, beta)
        if pm:  # the full last rows, corner included: C[mm:]^T = B^T A[mm:]^T
            _tsm2.launch_tsm2r(B.T, A[mm:].T, C[mm:].T, alpha, beta)
        done = side.record()
    main.wait_event(b_ready)
    _launch_kind(kind, cfg, At[:mm], Bt[:, :nn], C[:mm, :nn], alpha, beta)
    main.wait_event(done)


def _launch_async(A, B, C, alpha, beta, cfg=None):
    """C = alpha A @ B + beta C with gemm_async, or gemm_tiled where gemm_async has
    no register-clean variant (A and B both contiguous along k).

    C-ordered A and B (A contiguous along k, B along n) run as C^T = B^T A^T: the
    kernel then reads B^T along its rows and A^T along k, the variant that fits in 128
    registers (the direct one needs ~147). The price is a scattered store of C^T in
    the epilogue, once per block."""
    m, k = A.shape
    n = B.shape[1]
    a_k, lda, va, A2 = _operand(A, False)
    b_k, ldb, vb, B2 = _operand(B, True)
    if a_k and not b_k:
        return _launch_async(B.T, A.T, C.T, alpha, beta, cfg)
    if a_k and b_k:
        return _launch_gemm(A, B, C, alpha, beta)
    item = A2.itemsize
    cfg = cfg or ASYNC_TILES[item][0]
    T = np.float32 if item == 4 else np.float64
    kern = _compile.get_kernel("gemm", async_name(A2.dtype, a_k, b_k, va, vb, cfg))
    rs, cs = (s // item for s in C.strides)
    v = VEC[item]
    st_a = cfg.bm * (cfg.bk + v) if a_k else cfg.bk * (cfg.bm + v)
    st_b = cfg.bn * (cfg.bk + v) if b_k else cfg.bk * (cfg.bn + v)
    smem = cfg.stages * (st_a + st_b) * item
    if smem > SMEM_LIMIT:
        raise ValueError(f"gemm_async tile {cfg} needs {smem} bytes of shared memory; "
                         f"at most {SMEM_LIMIT} (fewer stages or a smaller tile)")
    if smem > SMEM_DEFAULT and getattr(kern, "max_dynamic_shared_size_bytes", 0) < smem:
        kern.max_dynamic_shared_size_bytes = smem
    grid = (-(-m // cfg.bm) * -(-n // cfg.bn), 1, 1)
    kern(grid, (THREADS,),
         (A2, B2, C, np.int32(m), np.int32(n), np.int32(k), np.int64(lda), np.int64(ldb),
          np.int64(rs), np.int64(cs), T(alpha), T(beta)), shared_mem=smem)


@dataclass(frozen=True)
class PipeConfig:
    """gemm_pipe (float32, 128 x 256 tile): BK k-depth, STAGES shared-memory stages,
    UNROLL k-steps unrolled (0: all BK), ORDER of each step's FFMAs (0 rows outer, 1
    columns outer, 2 zig-zag). The default is the fastest measured (H100, session 15:
    benchmarks/gemm_pipe_probe.py)."""

    bk: int = 16
    stages: int = 3
    unroll: int = 0
    order: int = 2
    midbar: bool = False  # the barrier half a k-tile in (needs stages >= 3)


PIPE_TILE = (128, 256)
PIPE = PipeConfig()
# The fused Strassen products (one level): the barrier half a k-tile in and four
# stages; N = 8192, one run: 0.906x of cuBLAS against 0.877x for PIPE's schedule
# (H100, session 15, benchmarks/strassen_pipe_probe.py). The plain GEMM measured the
# same either way (0.91), and the hybrid's single-term products take PIPE.
PIPE_FUSED = PipeConfig(stages=4, midbar=True)
PIPE_HYBRID = PIPE


def pipe_name(a_k, b_k, cfg: PipeConfig = PIPE, na=1, nb=1, nc=1, fused=False):
    b = lambda x: "true" if x else "false"  # noqa: E731
    return (f"gemm_pipe<{b(a_k)}, {b(b_k)}, {cfg.bk}, {cfg.stages}, {cfg.unroll or cfg.bk}, "
            f"{cfg.order}, {na}, {nb}, {nc}, {b(fused)}, {b(cfg.midbar)}>")


def pipe_smem(cfg: PipeConfig = PIPE, a_k=True, b_k=False, na=1, nb=1):
    """Bytes of shared memory gemm_pipe takes: STAGES stages of both k-major tiles, a
    second buffer for the second term of an operand copied by cp.async."""
    bm, bn = PIPE_TILE
    xa = 2 if (not a_k and na == 2) else 1
    xb = 2 if (not b_k and nb == 2) else 1
    return cfg.stages * cfg.bk * (xa * (bm + 4) + xb * (bn + 4)) * 4


def _pipe_kernel(name, smem):
    kern = _compile.get_kernel("gemm", name)
    if getattr(kern, "max_dynamic_shared_size_bytes", 0) < smem:
        kern.max_dynamic_shared_size_bytes = smem
    return kern


def pipe_fused_ok(item, a_k, b_k, sig):
    """True if gemm_pipe runs a fused product of signature (NA, NB, NC) on operands
    of this layout: float32, at most two terms per operand, and B contiguous along n
    (with B contiguous along k, the register stage of its two terms makes ptxas spill
    8-48 bytes; those products stay on gemm_tiled)."""
    return item == 4 and USE_PIPE and not b_k and max(sig[:2]) <= 2


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


def ws_name(na=1, nb=1, nc=1, fused=False, stages=None, rc=None, k=0, b_k=False):
    """gemm_ws's name expression; k: the product's K (not a multiple of 16: the
    instantiation with a zero-filled last k-tile); b_k: B contiguous along k (the
    plain product only)."""
    rc = rc or (WS_RC_FUSED if fused else WS_RC_BK if b_k else WS_RC)
    b = lambda x: "true" if x else "false"  # noqa: E731
    kpart = b(k % 16 and not fused)  # (fused: K % 16 == 0, ws_ok)
    lay = ", true" if b_k else ""
    return f"gemm_ws<{na}, {nb}, {nc}, {b(fused)}, {stages or WS_STAGES}, {rc}, {kpart}{lay}>"


def ws_smem(nb=1, stages=None):
    """Bytes of shared memory gemm_ws takes: its stages of A (16 x 132 floats) and B
    (16 x 260, twice for a second term of B)."""
    return (stages or WS_STAGES) * 16 * (132 + (2 if nb == 2 else 1) * 260) * 4


def ws_ok(item, a_k, b_k, k, sig=(1, 1, 1), device_id=None, fused=False):
    """True if gemm_ws can run this product: float32, A contiguous along k, at most two
    terms an operand, a compute capability 9.0 device; the plain product B in either
    layout and any K (its last k-tile zero-filled), a fused one B contiguous along n
    and K % 16 == 0 (with the zero fill its producers spill: those stay on gemm_pipe).
    A contiguous along m stays on gemm_pipe (a gemm_ws path for it spilled)."""
    lay_ok = a_k and (not b_k or not fused)  # A along m: gemm_pipe (see tiled/gemm.cu)
    return (item == 4 and lay_ok and (k % 16 == 0 or not fused) and max(sig[:2]) <= 2
            and _cc(device_id) == 90 and _ws_builds())


@functools.lru_cache(maxsize=None)
def _ws_builds() -> bool:
    """True if this CuPy's NVRTC builds gemm_ws (sm_90a); else a warning, once, and
    gemm_pipe in its place."""
    try:
        _compile.get_kernel("gemm", ws_name())
    except Exception as exc:  # noqa: BLE001 (an NVRTC without sm_90a, say)
        import warnings

        warnings.warn(f"gemm_ws does not build here ({type(exc).__name__}: {exc}); "
                      "tsm_core.gemm and strassen use gemm_pipe instead")
        return False
    return True


def _launch_ws(A, B, C, alpha, beta, tiles=None):
    """C = alpha A @ B + beta C with gemm_ws (``ws_ok`` holds; 16-byte vectors)."""
    m, k = A.shape
    n = B.shape[1]
    a_k, lda, va, A2 = _operand(A, False)
    b_k, ldb, vb, B2 = _operand(B, True)
    if not (va and vb and ws_ok(A2.itemsize, a_k, b_k, k, device_id=C.data.device_id)):
        raise ValueError("gemm_ws needs float32 operands with 16-byte vectors and a "
                         "compute capability 9.0 device")
    smem = ws_smem()
    _launch_wide(_pipe_kernel(ws_name(k=k, b_k=b_k), smem), WS_THREADS, smem,
                 A2, B2, C, (m, n, k), lda, ldb, alpha, beta, tiles)


def _launch_wide(kern, threads, smem, A2, B2, C, mnk, lda, ldb, alpha, beta, tiles):
    """One plain launch of a 128 x 256 tile kernel (gemm_pipe, gemm_ws) on tiles
    [0, tiles) of C (all by default); A2, B2, lda, ldb as `_operand` gives them."""
    m, n, k = mnk
    rs, cs = (s // 4 for s in C.strides)
    bm, bn = PIPE_TILE
    grid = (tiles if tiles is not None else -(-m // bm) * -(-n // bn), 1, 1)
    kern(grid, (threads,),
         (A2, B2, C, np.int32(m), np.int32(n), np.int32(k), np.int64(lda), np.int64(ldb),
          np.int64(rs), np.int64(cs), np.float32(alpha), np.float32(beta), np.uint64(0)),
         shared_mem=smem)


def _launch_pipe(A, B, C, alpha, beta, cfg=None, tiles=None):
    """C = alpha A @ B + beta C with gemm_pipe (float32; both operands 16-byte
    aligned, see ``_aligned``), on tiles [0, tiles) of C (all by default)."""
    cfg = cfg or PIPE
    m, k = A.shape
    n = B.shape[1]
    a_k, lda, va, A2 = _operand(A, False)
    b_k, ldb, vb, B2 = _operand(B, True)
    if not (va and vb) or A2.itemsize != 4:
        raise ValueError("gemm_pipe needs float32 operands with 16-byte vectors")
    if WS_PLAIN and cfg is PIPE and ws_ok(4, a_k, b_k, k, device_id=C.data.device_id):
        smem, threads = ws_smem(), WS_THREADS
        kern = _pipe_kernel(ws_name(k=k, b_k=b_k), smem)
    else:
        smem, threads = pipe_smem(cfg, a_k, b_k), THREADS
        kern = _pipe_kernel(pipe_name(a_k, b_k, cfg), smem)
    _launch_wide(kern, threads, smem, A2, B2, C, (m, n, k), lda, ldb, alpha, beta, tiles)


def _empty_cases(ops, xp):
    """Handle m, n or k == 0; returns C or None if there is work for the kernel."""
    m, k, n = ops.m, ops.k, ops.n
    C = ops.out if ops.out is not None else xp.empty((m, n), dtype=ops.dtype)
    if m == 0 or n == 0:
        return C
    if k == 0:
        if ops.out is None or ops.beta == 0.0:
            C.fill(0)
        elif ops.beta != 1.0:
            C *= ops.beta
        return C
    return None


def gemm(A, B, *, out=None, alpha=1.0, beta=0.0):
    """``alpha * A @ B + beta * out`` with tsm_core's tiled GEMM kernel.

    A has shape (M, K), B (K, N), out (M, N). float32 and float64 (mixed inputs
    promote as numpy does); any memory order.

    Parameters
    ----------
    A : array of shape (M, K)
        numpy, CuPy or torch (CPU or CUDA).
    B : array of shape (K, N)
        The same kind as A.
    out : array of shape (M, N), optional
        Written in place; with ``beta == 0`` its old contents are never read (NaN
        in it does not propagate).
    alpha, beta : float
        Scalars of ``C = alpha * A @ B + beta * C``.

    Returns
    -------
    array of shape (M, N), the caller's kind
        ``out`` itself when it was given.

    Notes
    -----
    numpy inputs (and torch CPU tensors) are computed on the CPU with numpy.
    float64 runs on the FP64 SIMT units; cuBLAS's DGEMM uses the FP64 tensor cores
    (DMMA) on the H100 and is several times faster.

    Examples
    --------
    >>> import numpy as np, tsm_core
    >>> A = np.arange(6.0).reshape(2, 3); B = np.ones((3, 2))
    >>> tsm_core.gemm(A, B, alpha=2.0)
    array([[ 6.,  6.],
           [24., 24.]])
    """
    ops = check_operands(A, B, out=out, alpha=alpha, beta=beta)
    if ops.xp is np:
        from tsm_core.runtime.cpu import matmul_cpu

        return _arrays.wrap(matmul_cpu(ops), ops.kind, like=out)
    C = _empty_cases(ops, ops.xp)
    if C is None:
        C = ops.out if ops.out is not None else ops.xp.empty((ops.m, ops.n), dtype=ops.dtype)
        beta = ops.beta if ops.out is not None else 0.0
        _plain(ops.A, ops.B, C, ops.alpha, beta)
    return _arrays.wrap(C, ops.kind, like=out)


# ------------------------------------------------------------------ Strassen

# Strassen's seven products (the paper's Eq. 1): (A terms, B terms, C terms), each a
# list of (coefficient, (row block, column block)).
_S1 = (
    ([(1, (0, 0)), (1, (1, 1))], [(1, (0, 0)), (1, (1, 1))], [(1, (0, 0)), (1, (1, 1))]),
    ([(1, (1, 0)), (1, (1, 1))], [(1, (0, 0))], [(1, (1, 0)), (-1, (1, 1))]),
    ([(1, (0, 0))], [(1, (0, 1)), (-1, (1, 1))], [(1, (0, 1)), (1, (1, 1))]),
    ([(1, (1, 1))], [(1, (1, 0)), (-1, (0, 0))], [(1, (0, 0)), (1, (1, 0))]),
    ([(1, (0, 0)), (1, (0, 1))], [(1, (1, 1))], [(-1, (0, 0)), (1, (0, 1))]),
    ([(1, (1, 0)), (-1, (0, 0))], [(1, (0, 0)), (1, (0, 1))], [(1, (1, 1))]),
    ([(1, (0, 1)), (-1, (1, 1))], [(1, (1, 0)), (1, (1, 1))], [(1, (0, 0))]),
)


def _kron(outer, inner):
    """Terms of a two-level product: block (2i + i', 2j + j'), coefficient c * c'."""
    return [(c * d, (2 * i + p, 2 * j + q)) for c, (i, j) in outer for d, (p, q) in inner]


@functools.lru_cache(maxsize=None)
def products(levels: int):
    """The 7**levels products, each (A terms, B terms, C terms) over a
    2**levels x 2**levels grid of blocks."""
    if levels == 1:
        return _S1
    prev = products(levels - 1)
    return tuple(tuple(_kron(o, i) for o, i in zip(po, pi)) for po in prev for pi in _S1)


@functools.lru_cache(maxsize=None)
def schedule(levels: int):
    """Rounds of products whose C blocks are disjoint, in execution order, and for
    each product the mask of its C terms that are the first write of their block.

    Returns a tuple of rounds; a round is a tuple of (product index, first mask).
    """
    rounds: list[list[int]] = []
    used: list[set] = []
    for p, (_, _, cs) in enumerate(products(levels)):
        dest = {blk for _, blk in cs}
        for r, u in enumerate(used):
            if not (u & dest):
                rounds[r].append(p)
                u |= dest
                break
        else:
            rounds.append([p])
            used.append(set(dest))
    written: set = set()
    out = []
    for rnd in rounds:
        items = []
        for p in rnd:
            cs = products(levels)[p][2]
            mask = 0
            for t, (_, blk) in enumerate(cs):
                if blk not in written:
                    mask |= 1 << t
            items.append((p, mask))
        for p in rnd:
            written |= {blk for _, blk in products(levels)[p][2]}
        out.append(tuple(items))
    return tuple(out)


def _descriptor(prod, mask, sa, sb, sc, bs):
    """One product's descriptor (tiled/gemm.cu DESC_LEN layout): element offsets
    of its blocks in A, B, C given element strides sa, sb, sc and block sizes
    bs = (ms, ks, ns)."""
    ms, ks, ns = bs
    at, bt, ct = prod
    d = [0] * DESC_LEN
    for t, (c, (i, j)) in enumerate(at):
        d[t] = i * ms * sa[0] + j * ks * sa[1]
        d[12 + t] = c
    for t, (c, (i, j)) in enumerate(bt):
        d[4 + t] = i * ks * sb[0] + j * ns * sb[1]
        d[16 + t] = c
    for t, (c, (i, j)) in enumerate(ct):
        d[8 + t] = i * ms * sc[0] + j * ns * sc[1]
        d[20 + t] = c
    d[24] = mask
    return d


def plan_strassen(levels, bs, sa, sb, sc, vec):
    """The launches of a fused Strassen: a list of (signature, descriptors, vec ok),
    signature = (NA, NB, NC), in execution order."""
    launches = []
    for rnd in schedule(levels):
        groups: dict = {}
        for p, mask in rnd:
            prod = products(levels)[p]
            sig = tuple(len(x) for x in prod)
            groups.setdefault(sig, []).append(_descriptor(prod, mask, sa, sb, sc, bs))
        for sig, descs in groups.items():
            va = all(o % vec == 0 for d in descs for o in d[0:sig[0]])
            vb = all(o % vec == 0 for d in descs for o in d[4:4 + sig[1]])
            launches.append((sig, descs, va, vb))
    return launches


# One level on gemm_ws with C as scratch (no workspace): the products M6 and M7, the
# ones with two terms in both operands that no earlier product writes C12 or C21
# for, go first, each with its B sum formed beforehand into one of those (still
# unwritten) blocks of C, so that they run as (2, 1) products: gemm_ws's (2, 2)
# products cost 7-8% over a plain launch, its (2, 1) ones 0.4-2% (H100, session 17).
# Rounds: [M6, M7] (B from C), [M1], [M2, M5], [M3, M4]; M5 and M2 later overwrite
# the two scratch blocks (their first writes), after the first round is done (each
# launch waits for the one before it before its epilogue). Products are 0-based.
SCRATCH1 = True
SCRATCH1_ROUNDS = ((5, 6), (0,), (1, 4), (2, 3))
SCRATCH1_B = {5: (0, 1), 6: (1, 0)}  # product -> the C block its B sum goes into


@functools.lru_cache(maxsize=None)
def plan_strassen1_scratch(bs, sa, sb, sc, vec):
    """One level with C as scratch (SCRATCH1_ROUNDS): (sums, launches). sums: (B
    terms, C block) to form first, into the block's first ks rows; launches: (signature,
    descriptors, vec ok A, vec ok B, B read from C) in execution order, descriptors as
    `_descriptor`'s, with the B offset of a product in SCRATCH1_B an offset into C."""
    ms, ks, ns = bs
    written: set = set()
    sums, launches = [], []
    for rnd in SCRATCH1_ROUNDS:
        groups: dict = {}
        for p in rnd:
            at, bt, ct = products(1)[p]
            mask = 0
            for t, (_, blk) in enumerate(ct):
                if blk not in written:
                    mask |= 1 << t
            in_c = p in SCRATCH1_B
            if in_c:
                i, j = SCRATCH1_B[p]
                sums.append((bt, (i, j)))
                d = _descriptor((at, [(1, (0, 0))], ct), mask, sa, sb, sc, bs)
                d[4] = i * ms * sc[0] + j * ns * sc[1]
                sig = (len(at), 1, len(ct))
            else:
                d = _descriptor((at, bt, ct), mask, sa, sb, sc, bs)
                sig = (len(at), len(bt), len(ct))
            groups.setdefault((sig, in_c), []).append(d)
        for p in rnd:
            written |= {blk for _, blk in products(1)[p][2]}
        for (sig, in_c), descs in groups.items():
            va = all(o % vec == 0 for d in descs for o in d[0:sig[0]])
            vb = all(o % vec == 0 for d in descs for o in d[4:4 + sig[1]])
            launches.append((sig, tuple(tuple(d) for d in descs), va, vb, in_c))
    return tuple(sums), tuple(launches)


def _scratch1_ok(A, B, C, bs):
    """True if one level can run with C as scratch on gemm_ws (`SCRATCH1`): float32,
    A and B contiguous along k and n with 16-byte vectors, C row-major and aligned, a
    B block fits in a C block (K <= M), gemm_ws runs every signature, and a product
    has 0.75 of a wave of tiles."""
    if not (SCRATCH1 and WS_STRASSEN and C.itemsize == 4):
        return False
    a_k, lda, va, _ = _operand(A, False)
    b_k, ldb, vb, _ = _operand(B, True)
    ms, ks, ns = bs
    rsc, csc = (s // 4 for s in C.strides)
    bm, bn = PIPE_TILE
    dev = C.data.device_id
    if not (a_k and not b_k and va and vb and csc == 1 and rsc % VEC[4] == 0
            and C.data.ptr % 16 == 0 and ks <= ms
            and all(ws_ok(4, a_k, b_k, ks, sig, dev, fused=True)
                    for sig in ((2, 1, 1), (2, 2, 2)))
            and _pipe_fills(-(-ms // bm) * -(-ns // bn), dev)):
        return False
    _, plan = plan_strassen1_scratch(bs, (lda, 1), (ldb, 1), (rsc, csc), VEC[4])
    return all(pva and pvb for _, _, pva, pvb, _ in plan)


def _launch_strassen1_scratch(A, B, C, bs):
    """One level with C as scratch (`plan_strassen1_scratch`), `_scratch1_ok` true."""
    ms, ks, ns = bs
    _, lda, _, A = _operand(A, False)
    _, ldb, _, B = _operand(B, True)
    sc = tuple(s // 4 for s in C.strides)
    sums, plan = plan_strassen1_scratch(bs, (lda, 1), (ldb, 1), sc, VEC[4])
    key = ("scratch1", bs, lda, ldb, sc, C.data.device_id)
    devs = _desc_cache(key, lambda: [d for L in plan for d in L[1]])
    for bt, (i, j) in sums:
        _operand_sum(B, bt, C[i * ms:i * ms + ks, j * ns:(j + 1) * ns], (ks, ns))
    import cupy

    stream = cupy.cuda.get_current_stream()
    bm, bn = PIPE_TILE
    first = 0
    for li, (sig, descs, va, vb, in_c) in enumerate(plan):
        nz = len(descs)
        smem = ws_smem(sig[1])
        kern = _pipe_kernel(ws_name(*sig, fused=True, k=ks), smem)
        grid = (-(-ms // bm) * -(-ns // bn), 1, nz)
        args = (A, C if in_c else B, C, np.int32(ms), np.int32(ns), np.int32(ks), np.int64(lda),
                np.int64(sc[0] if in_c else ldb), np.int64(sc[0]), np.int64(sc[1]),
                np.float32(1), np.float32(0), devs[first * DESC_LEN:])
        first += nz
        # The first launch follows the sums (an ordinary launch); the others PDL.
        if li and STRASSEN_PDL and _launch_pdl(kern, grid, smem, stream, args, WS_THREADS):
            continue
        kern(grid, (WS_THREADS,), args, shared_mem=smem)


def _strassen_cpu(A, B, C, levels):
    """The fused schedule executed with numpy (same products, order and first-write
    rule as the GPU), for C[:m', :n'] with every dimension a multiple of 2**levels."""
    m, k = A.shape
    n = B.shape[1]
    f = 1 << levels
    ms, ks, ns = m // f, k // f, n // f

    def blk(X, i, j, r, c):
        return X[i * r:(i + 1) * r, j * c:(j + 1) * c]

    for rnd in schedule(levels):
        for p, mask in rnd:
            at, bt, ct = products(levels)[p]
            X = sum(c * blk(A, i, j, ms, ks) for c, (i, j) in at)
            Y = sum(c * blk(B, i, j, ks, ns) for c, (i, j) in bt)
            Mp = X @ Y
            for t, (c, (i, j)) in enumerate(ct):
                D = blk(C, i, j, ms, ns)
                if (mask >> t) & 1:
                    D[...] = c * Mp
                else:
                    D += c * Mp


# Two levels as the paper's hybrid (its Section 3.4): the top level as the reference
# algorithm, with its operand sums formed in a workspace, and the products of the
# bottom level on gemm_pipe, whose operand sums are formed in a second, smaller
# workspace too (on gemm_pipe's two-term path the products ran at about 0.84 of its
# plain speed, H100, session 15; a sum costs one pass over a block). Each product
# adds its result into its (up to four) blocks of C from registers. Workspace:
# (mk + kn) * 9/16 elements a set of buffers (a top-level product's sums and those of
# its seven products), two sets with HYBRID2_OVERLAP. False: the fully fused form
# (gemm_tiled, no workspace).
HYBRID2 = True


# gemm_pipe takes a Strassen launch (a round of products, or one hybrid product) only
# if it has at least this many waves of its 128 x 256 tiles (one block per SM); below,
# gemm_tiled's 128 x 128 tiles put a block on twice as many SMs. H100, session 15: at
# N = 2048 (one level, 32-64 tiles a launch) gemm_pipe read 0.35x of cuBLAS against
# gemm_tiled's 0.51x; at 4096 (128-256 tiles) 0.83x against 0.73x; the hybrid at
# 8192 (128 tiles a product) 0.89x against the fused two levels' 0.69x, at 4096 (32
# tiles) 0.20x against 0.50x.
PIPE_MIN_WAVE = 0.75


def _pipe_fills(tiles, device_id):
    return tiles >= PIPE_MIN_WAVE * _sm_count(device_id)


def hybrid2_ok(A, B, device_id=0):
    """True if a two-level Strassen on these (CuPy, block-aligned) operands runs as
    the hybrid: float32, 16-byte vectors, B contiguous along n (`pipe_fused_ok`), and
    enough tiles in a product (`PIPE_MIN_WAVE`)."""
    a_k, _, va, _ = _operand(A, False)
    b_k, _, vb, _ = _operand(B, True)
    bm, bn = PIPE_TILE
    tiles = -(-A.shape[0] // (4 * bm)) * -(-B.shape[1] // (4 * bn))
    return (HYBRID2 and va and vb and pipe_fused_ok(A.itemsize, a_k, b_k, (1, 1, 4))
            and _pipe_fills(tiles, device_id))


def _blk(X, r, c, bs):
    return X[r * bs[0]:(r + 1) * bs[0], c * bs[1]:(c + 1) * bs[1]]


def _lines(X):
    """(outer, inner, ld) of a 2-D view with one contiguous axis (elements)."""
    item = X.itemsize
    if X.strides[1] == item:
        return X.shape[0], X.shape[1], X.strides[0] // item
    return X.shape[1], X.shape[0], X.strides[1] // item


# Operand sums beside the products (HYBRID2_OVERLAP): small blocks of block_sum that
# fit on an SM next to gemm_pipe's one block (which leaves 2-6 K registers free), so
# that the sums of the next product run while this one computes.
HYBRID2_OVERLAP = True
SUM_THREADS = 64
SUM_BLOCKS_PER_SM = 2


def _operand_sum(X, terms, W, bs, small=False):
    """The block of X named by `terms` (one term of coefficient +1: a view), or the sum
    of two blocks into W (block_sum), for Strassen's operand sums X + dY. ``small``:
    the sum runs beside a product (SUM_THREADS-thread blocks, SUM_BLOCKS_PER_SM per
    SM)."""
    (c0, (r0, k0)), *rest = terms
    X0 = _blk(X, r0, k0, bs)
    if c0 != 1 or len(rest) > 1:
        raise AssertionError(f"operand terms {terms}: one or two, the first +1")
    if not rest:
        return X0
    c1, (r1, k1) = rest[0]
    X1 = _blk(X, r1, k1, bs)
    outer, inner, ldx = _lines(X0)
    ldy = _lines(X1)[2]
    ldw = _lines(W)[2]
    kern = _compile.get_kernel("gemm", f"block_sum<{_compile.ctype(X.dtype)}>")
    sms = _sm_count(W.data.device_id)
    threads = SUM_THREADS if small else THREADS
    cap = SUM_BLOCKS_PER_SM * sms if small else 4 * sms
    blocks = min(outer, cap)  # whole lines a block
    T = np.float32 if X.itemsize == 4 else np.float64
    kern((blocks,), (threads,), (X0, np.int64(ldx), X1, np.int64(ldy), T(c1), W, np.int64(ldw),
                                 np.int32(outer), np.int32(inner)))
    return W


@functools.lru_cache(maxsize=None)
def _hybrid2_plan(bs, sc):
    """(NC, descriptor) of each of the 49 bottom-level products, in execution order
    (top-level product i, then its bottom-level product j): the C blocks of
    products(2)[7 i + j], their coefficients and first-write mask, as element offsets
    for block size bs = (ms, ks, ns) and C strides sc."""
    written: set = set()
    out = []
    for prod in products(2):
        cs = prod[2]
        mask = 0
        for t, (_, blk) in enumerate(cs):
            if blk not in written:
                mask |= 1 << t
        written |= {blk for _, blk in cs}
        d = _descriptor(([(1, (0, 0))], [(1, (0, 0))], cs), mask, (0, 0), (0, 0), sc, bs)
        out.append((len(cs), d))
    return tuple(out)


# Programmatic dependent launch (PDL) between Strassen's gemm_pipe launches: each
# launch after the first of a run of products (the hybrid: the seven of a top-level
# product; one level: its four rounds) goes with the programmatic-serialization
# attribute, so that it starts on the SMs the previous one's last wave leaves idle
# (512 tiles of 128 x 256 are 3.88 waves on 132 SMs) and waits, before its epilogue,
# for the previous one to finish (gemm_pipe's pdl_wait). A run's first launch is an
# ordinary one: it must not overlap whatever wrote A and B. False, or a driver
# without cuLaunchKernelEx: ordinary launches.
STRASSEN_PDL = True
_PDL: list = []  # [cuLaunchKernelEx, config struct type, attribute struct type] or [None]


@functools.lru_cache(maxsize=None)
def _cc_of(device_id: int) -> int:
    import cupy

    return int(cupy.cuda.Device(device_id).compute_capability)


def _cc(device_id=None) -> int:
    """Compute capability of `device_id` (default: the current device), as 90 for 9.0.
    gemm_ws (sm_90a) runs on 90 only."""
    if device_id is None:
        import cupy

        device_id = cupy.cuda.Device().id
    return _cc_of(int(device_id))


def _cc_major(device_id=None) -> int:
    """Compute capability major of `device_id` (default: the current device). PDL
    (griddepcontrol) needs 9 (Hopper) or later."""
    return _cc(device_id) // 10


@functools.lru_cache(maxsize=None)
def _pdl_structs():
    """ctypes mirrors of cuda.h's CUlaunchConfig and CUlaunchAttribute (12.x, 13.x)."""
    import ctypes

    class Attr(ctypes.Structure):  # CUlaunchAttribute: id, pad to 8, a 64-byte union
        _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4),
                    ("value", ctypes.c_int * 16)]

    class Config(ctypes.Structure):  # CUlaunchConfig
        _fields_ = [("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint),
                    ("gridDimZ", ctypes.c_uint), ("blockDimX", ctypes.c_uint),
                    ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
                    ("sharedMemBytes", ctypes.c_uint), ("hStream", ctypes.c_void_p),
                    ("attrs", ctypes.POINTER(Attr)), ("numAttrs", ctypes.c_uint)]

    return Config, Attr


def _pdl_api():
    if not _PDL:
        import ctypes

        try:
            fn = ctypes.CDLL("libcuda.so.1").cuLaunchKernelEx
        except (OSError, AttributeError):
            _PDL.append(None)
            return None
        Config, Attr = _pdl_structs()
        fn.argtypes = [ctypes.POINTER(Config), ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        fn.restype = ctypes.c_int
        _PDL.extend([fn, Config, Attr])
    return _PDL[0] and _PDL


def _launch_pdl(kern, grid, smem, stream, args, threads=None):
    """Launch gemm_pipe `kern` with the PDL attribute on `stream` (a CuPy stream); args
    as for a fused gemm_pipe launch (arrays, then scalars as numpy values). False if
    the driver has no cuLaunchKernelEx (the caller launches normally)."""
    import ctypes

    api = _pdl_api()
    if not api or _cc_major() < 9:  # the launch goes to the current device
        return False
    fn, Config, Attr = api
    vals = []
    for a in args:
        if hasattr(a, "data") and hasattr(a.data, "ptr"):
            vals.append(ctypes.c_void_p(a.data.ptr))
        elif isinstance(a, np.int32):
            vals.append(ctypes.c_int32(int(a)))
        elif isinstance(a, np.int64):
            vals.append(ctypes.c_int64(int(a)))
        elif isinstance(a, np.float32):
            vals.append(ctypes.c_float(float(a)))
        else:
            raise TypeError(f"_launch_pdl: argument of type {type(a).__name__}")
    params = (ctypes.c_void_p * len(vals))(*[ctypes.addressof(v) for v in vals])
    attr = Attr()
    attr.id = 6  # CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
    attr.value[0] = 1
    cfg = Config(grid[0], grid[1], grid[2], threads or THREADS, 1, 1, smem, stream.ptr,
                 ctypes.pointer(attr), 1)
    from tsm_core.batched.api import func_ptr

    err = fn(ctypes.byref(cfg), func_ptr(kern), params, None)
    if err != 0:
        raise RuntimeError(f"cuLaunchKernelEx failed with CUresult {err}")
    return True


def _launch_strassen2_hybrid(A, B, C):
    """Two-level hybrid Strassen (see HYBRID2) on CuPy arrays whose dimensions are
    multiples of 4 V (V = elements per 16-byte vector), `hybrid2_ok` true.

    Per top-level product i: its operand sums (top level, then the two-term operands
    of its seven bottom-level products) into buffer set i % 2, then the seven products
    back to back (PDL after the first, `STRASSEN_PDL`). With HYBRID2_OVERLAP the sums
    of top-level product i + 1 run on a side stream during the products of i, after
    those of i - 1 (the last readers of set (i + 1) % 2) are done. Workspace: two sets
    of the top-level sums (mk + kn) / 4 and five bottom-level sums of each operand
    5 (mk + kn) / 16 elements: 9/8 (mk + kn) in all (one set without overlap). The
    caller's stream ends after the last product, which follows every sum, so the
    buffers go back to the pool only when no kernel uses them."""
    import cupy

    m, k = A.shape
    n = B.shape[1]
    A = _operand(A, False)[3]
    B = _operand(B, True)[3]
    order = "C" if A.strides[1] == A.itemsize else "F"  # workspace as the operand's
    b1, b2 = (m // 2, k // 2, n // 2), (m // 4, k // 4, n // 4)
    overlap = HYBRID2_OVERLAP
    nbuf = 2 if overlap else 1
    sets = []
    for _ in range(nbuf):
        sets.append((cupy.empty(b1[:2], A.dtype, order=order), cupy.empty(b1[1:], B.dtype),
                     [cupy.empty(b2[:2], A.dtype, order=order) if len(_S1[j][0]) > 1 else None
                      for j in range(7)],
                     [cupy.empty(b2[1:], B.dtype) if len(_S1[j][1]) > 1 else None
                      for j in range(7)]))
    sc = tuple(s // C.itemsize for s in C.strides)
    plan = _hybrid2_plan(b2, sc)
    dev = _desc_cache(("hybrid2", b2, sc, C.data.device_id),
                      lambda: [d for _, d in plan])
    bm, bn = PIPE_TILE
    grid = (-(-b2[0] // bm) * -(-b2[2] // bn), 1, 1)
    main = cupy.cuda.get_current_stream()
    side = _arrays.side_stream("strassen-sums") if overlap else main

    def sums(i):  # the operands of top-level product i's seven products, on `side`
        SA1, SB1, SA2, SB2 = sets[i % nbuf]
        at1, bt1, _ = _S1[i]
        small = overlap and i > 0  # the first ones run alone: full-sized launches
        S = _operand_sum(A, at1, SA1, b1[:2], small)
        T = _operand_sum(B, bt1, SB1, b1[1:], small)
        return [(_operand_sum(S, _S1[j][0], SA2[j], b2[:2], small),
                 _operand_sum(T, _S1[j][1], SB2[j], b2[1:], small)) for j in range(7)]

    if overlap:
        side.wait_event(main.record())  # the operands (and workspace) are ready
    with side:
        ops = sums(0)
        ready = side.record() if overlap else None
    done = []  # an event after each top-level product's last product (overlap)
    for i in range(7):
        nxt = nxt_ready = None
        if overlap and i + 1 < 7:
            with side:
                if i >= 1:  # set (i + 1) % 2 was last read by top-level product i - 1
                    side.wait_event(done[i - 1])
                nxt = sums(i + 1)
                nxt_ready = side.record()
        if overlap:
            main.wait_event(ready)
        for j in range(7):
            q = 7 * i + j
            Sj, Tj = ops[j]
            a_k, lda, _, Sj = _operand(Sj, False)
            b_k, ldb, _, Tj = _operand(Tj, True)
            nc, _ = plan[q]
            threads = THREADS
            if WS_STRASSEN and ws_ok(4, a_k, b_k, b2[1], device_id=C.data.device_id, fused=True):
                smem, threads = ws_smem(), WS_THREADS
                kern = _pipe_kernel(ws_name(1, 1, nc, fused=True, k=b2[1]), smem)
            else:
                smem = pipe_smem(PIPE_HYBRID, a_k, b_k)
                kern = _pipe_kernel(pipe_name(a_k, b_k, PIPE_HYBRID, 1, 1, nc, fused=True), smem)
            args = (Sj, Tj, C, np.int32(b2[0]), np.int32(b2[2]), np.int32(b2[1]), np.int64(lda),
                    np.int64(ldb), np.int64(sc[0]), np.int64(sc[1]), np.float32(1),
                    np.float32(0), dev[q * DESC_LEN:])
            if j and STRASSEN_PDL and _launch_pdl(kern, grid, smem, main, args, threads):
                continue
            kern(grid, (threads,), args, shared_mem=smem)
        if overlap:
            done.append(main.record())
        if i + 1 < 7:
            if overlap:
                ops, ready = nxt, nxt_ready
            else:
                ops = sums(i + 1)


def _launch_strassen(A, B, C, levels):
    """Fused Strassen on CuPy arrays whose dimensions are multiples of 2**levels."""
    if levels == 2 and hybrid2_ok(A, B, C.data.device_id):
        import cupy

        try:
            return _launch_strassen2_hybrid(A, B, C)
        except cupy.cuda.memory.OutOfMemoryError:
            pass  # no room for the workspace (nothing launched yet): the fused form
    m, k = A.shape
    n = B.shape[1]
    f = 1 << levels
    bs = (m // f, k // f, n // f)
    if levels == 1 and _scratch1_ok(A, B, C, bs):
        return _launch_strassen1_scratch(A, B, C, bs)
    a_k, lda, va0, A = _operand(A, False)
    b_k, ldb, vb0, B = _operand(B, True)
    item = A.itemsize
    sa = (lda, 1) if a_k else (1, lda)
    sb = (1, ldb) if b_k else (ldb, 1)
    sc = tuple(s // item for s in C.strides)
    key = (levels, bs, sa, sb, sc, VEC[item], C.data.device_id)
    launches = _desc_cache(key)
    T = np.float32 if item == 4 else np.float64
    stream = None
    for li, (sig, dev, nz, va, vb, lead_pos) in enumerate(launches):
        bm, bn = PIPE_TILE
        fills = _pipe_fills(nz * -(-bs[0] // bm) * -(-bs[2] // bn), C.data.device_id)
        if pipe_fused_ok(item, a_k, b_k, sig) and va0 and vb0 and va and vb and lead_pos and fills:
            threads = THREADS
            if WS_STRASSEN and ws_ok(item, a_k, b_k, bs[1], sig, C.data.device_id, fused=True):
                smem, threads = ws_smem(sig[1]), WS_THREADS
                kern = _pipe_kernel(ws_name(*sig, fused=True, k=bs[1]), smem)
            else:
                smem = pipe_smem(PIPE_FUSED, a_k, b_k, sig[0], sig[1])
                kern = _pipe_kernel(pipe_name(a_k, b_k, PIPE_FUSED, *sig, fused=True), smem)
            grid = (-(-bs[0] // bm) * -(-bs[2] // bn), 1, nz)
            args = (A, B, C, np.int32(bs[0]), np.int32(bs[2]), np.int32(bs[1]), np.int64(lda),
                    np.int64(ldb), np.int64(sc[0]), np.int64(sc[1]), T(1), T(0), dev)
            if li and STRASSEN_PDL:  # after one of our own launches (see STRASSEN_PDL)
                import cupy

                stream = stream or cupy.cuda.get_current_stream()
                if _launch_pdl(kern, grid, smem, stream, args, threads):
                    continue
            kern(grid, (threads,), args, shared_mem=smem)
            continue
        kern = _compile.get_kernel("gemm", gemm_name(A.dtype, a_k, b_k, va0 and va, vb0 and vb,
                                                     None, *sig, fused=True))
        kern(_grid(bs[0], bs[2], item, nz), (THREADS,),
             (A, B, C, np.int32(bs[0]), np.int32(bs[2]), np.int32(bs[1]), np.int64(lda),
              np.int64(ldb), np.int64(sc[0]), np.int64(sc[1]), T(1), T(0), dev,
              np.int32(0), np.int32(1), np.int32(bs[1]), np.uint64(0)))


_DESC: dict = {}


def _desc_cache(key, build=None):
    """Device arrays of the descriptors, built once per layout (a host-to-device copy
    per call would cost more than a small product); with ``build``, one array of the
    descriptors it returns."""
    got = _DESC.get(key)
    if got is None and build is not None:
        import cupy

        got = cupy.asarray(np.asarray(build(), dtype=np.int64).ravel())
        if len(_DESC) > 256:
            _DESC.clear()
        _DESC[key] = got
    if got is None:
        import cupy

        levels, bs, sa, sb, sc, vec, _ = key
        got = []
        for sig, descs, va, vb in plan_strassen(levels, bs, sa, sb, sc, vec):
            dev = cupy.asarray(np.asarray(descs, dtype=np.int64).ravel())
            # gemm_pipe's fused products take a first term of coefficient +1
            lead_pos = all(d[12] == 1 and d[16] == 1 for d in descs)
            got.append((sig, dev, len(descs), va, vb, lead_pos))
        if len(_DESC) > 256:
            _DESC.clear()
        _DESC[key] = got
    return got


def strassen(A, B, *, levels=1, out=None):
    """``A @ B`` by Strassen's algorithm, fused into tsm_core's GEMM kernel.

    A has shape (M, K), B (K, N), the result (M, N). Each of the 7**levels products
    adds its result into its blocks of C from registers. One level forms its operand
    sums while loading tiles: no workspace (on the H100, two of its products read
    their B sums from blocks of the output not yet written, see SCRATCH1). Two
    levels run as the paper's hybrid for float32 with B contiguous along N and
    16-byte aligned operands: the operand sums of both levels are formed in a
    workspace of (MK + KN) * 9/8 elements (two sets of buffers, so that the sums of
    the next top-level product run beside this one's products); otherwise, or where
    the workspace cannot be allocated, two levels are fused too (no workspace).

    Parameters
    ----------
    A : array of shape (M, K)
    B : array of shape (K, N)
    levels : {1, 2}
        Levels of recursion: 7 products of (M/2, K/2, N/2) or 49 of (M/4, K/4, N/4).
    out : array of shape (M, N), optional
        Overwritten (never read).

    Returns
    -------
    array of shape (M, N), the caller's kind

    Notes
    -----
    Sizes that are not multiples of 2**levels are peeled: Strassen computes the
    leading multiple-of-2**levels part and ``gemm`` the rest. Strassen's rounding
    error grows with the levels (each level adds operand sums); the benchmark
    reports it next to plain GEMM's. numpy inputs run the same schedule on the CPU.

    Examples
    --------
    >>> import numpy as np, tsm_core
    >>> rng = np.random.default_rng(0)
    >>> A = rng.standard_normal((6, 5)); B = rng.standard_normal((5, 7))
    >>> bool(np.allclose(tsm_core.strassen(A, B, levels=1), A @ B))
    True
    """
    if isinstance(levels, (bool, np.bool_)) or levels not in (1, 2):
        raise ValueError(f"levels must be 1 or 2; got {levels!r}")
    ops = check_operands(A, B, out=out)
    xp = ops.xp
    C = _empty_cases(ops, xp)
    if C is not None:
        return _arrays.wrap(C, ops.kind, like=out)
    m, k, n = ops.m, ops.k, ops.n
    C = ops.out if ops.out is not None else xp.empty((m, n), dtype=ops.dtype)
    A, B = ops.A, ops.B
    # Peel to multiples of 2**levels * V (V = elements per 16-byte vector): every
    # block of A, B and C then starts 16-byte aligned when the matrix does, so the
    # fused kernels keep their vector loads (and there are fewer variants).
    f = (1 << levels) * VEC[np.dtype(ops.dtype).itemsize]
    m2, k2, n2 = m - m % f, k - k % f, n - n % f
    gpu = xp is not np
    mm = _plain if gpu else (lambda X, Y, Z, al, be: _cpu_gemm(X, Y, Z, be))
    if min(m2, k2, n2) == 0:
        mm(A, B, C, 1.0, 0.0)
        return _arrays.wrap(C, ops.kind, like=out)
    if gpu:
        _launch_strassen(A[:m2, :k2], B[:k2, :n2], C[:m2, :n2], levels)
    else:
        _strassen_cpu(A[:m2, :k2], B[:k2, :n2], C[:m2, :n2], levels)
    # Peeling: the k-remainder as a rank-(k - k2) update, then the strips of C.
    if k2 < k:
        mm(A[:m2, k2:], B[k2:, :n2], C[:m2, :n2], 1.0, 1.0)
    if n2 < n:
        mm(A[:m2, :], B[:, n2:], C[:m2, n2:], 1.0, 0.0)
    if m2 < m:
        mm(A[m2:, :], B, C[m2:, :], 1.0, 0.0)
    return _arrays.wrap(C, ops.kind, like=out)


def _cpu_gemm(A, B, C, beta):
    if beta == 0.0:
        np.matmul(A, B, out=C)
    else:
        C += A @ B


# ------------------------------------------------------------------ compilation


def instantiations(dtypes=(np.float32, np.float64), *, plain=True, levels=(1, 2),
                   layouts=((True, False), (False, False), (True, True), (False, True)),
                   vecs=((True, True), (False, False)), occ=None):
    """Name expressions of gemm_tiled: every plain variant (dtype x layout x vector
    flags) and the fused ones of the given Strassen levels, layouts and vector flags."""
    names = []
    for dt in dtypes:
        if plain:
            for a_k in (True, False):
                for b_k in (True, False):
                    for va in (True, False):
                        for vb in (True, False):
                            for split in (False, True):
                                names.append(gemm_name(dt, a_k, b_k, va, vb, split=split))
                                if np.dtype(dt).itemsize == 4:
                                    for bk in ((8, 16) if va and vb else (8,)):
                                        names.append(gemm_name(dt, a_k, b_k, va, vb, bk, wn=4,
                                                               split=split))
            bm, bn = TILE[np.dtype(dt).itemsize]
            names.append(reduce_name(dt, bm, bn))
            if np.dtype(dt).itemsize == 4:
                names.append(reduce_name(dt, bm, 2 * bn))
        if plain:
            item = np.dtype(dt).itemsize
            for cfg in sorted(set(ASYNC_TILES[item]), key=str):
                for a_k, b_k in ((False, False), (False, True)):
                    for va in (True, False):
                        for vb in (True, False):
                            names.append(async_name(dt, a_k, b_k, va, vb, cfg))
        if plain and np.dtype(dt).itemsize == 4:
            for a_k in (True, False):
                for b_k in (True, False):
                    names.append(pipe_name(a_k, b_k))
            names += [ws_name(k=k, b_k=b_k) for k in (0, 1) for b_k in (True, False)]
        sigs = sorted({tuple(len(x) for x in p) for L in levels for p in products(L)})
        for a_k, b_k in layouts:
            for va, vb in vecs:
                for sig in sigs:
                    names.append(gemm_name(dt, a_k, b_k, va, vb, None, *sig, fused=True,
                                           occ=occ))
            if occ is None:
                for sig in sigs:
                    if pipe_fused_ok(np.dtype(dt).itemsize, a_k, b_k, sig):
                        names.append(pipe_name(a_k, b_k, PIPE_FUSED, *sig, fused=True))
                if 2 in levels and pipe_fused_ok(np.dtype(dt).itemsize, a_k, b_k, (1, 1, 4)):
                    for nc in (1, 2, 4):  # the hybrid's products
                        names.append(pipe_name(a_k, b_k, PIPE_HYBRID, 1, 1, nc, fused=True))
                if np.dtype(dt).itemsize == 4 and a_k and not b_k:  # gemm_ws's layout
                    wsigs = {s for s in sigs if max(s[:2]) <= 2}
                    if 2 in levels:
                        wsigs |= {(1, 1, nc) for nc in (1, 2, 4)}
                    names += [ws_name(*s, fused=True) for s in sorted(wsigs)]
        if 2 in levels:
            names.append(f"block_sum<{_compile.ctype(dt)}>")
    return names


def _compile_one(name):
    import cupy

    cupy.RawModule(code=_compile.source("gemm"), options=_compile.options_for(name),
                   name_expressions=[name]).compile()
    return name


def precompile(names, workers=None):
    """Compile `names` in parallel processes into CuPy's on-disk kernel cache, so that
    the first call of each in this process loads it instead of compiling (NVRTC holds
    the GIL: threads would not overlap; a fused two-level kernel takes ~2 s)."""
    import concurrent.futures
    import multiprocessing
    import os

    import warnings

    names = sorted(set(names))
    workers = workers or min(len(names), os.cpu_count() or 1)
    ctx = multiprocessing.get_context("spawn")
    try:
        with concurrent.futures.ProcessPoolExecutor(workers, mp_context=ctx) as ex:
            return list(ex.map(_compile_one, names))
    except Exception as e:  # only a warm-up: each kernel still compiles on first use
        warnings.warn(f"precompile failed ({type(e).__name__}: {e}); compiling lazily")
        return []


__all__ = ["gemm", "strassen", "products", "schedule", "plan_strassen", "gemm_name"]
