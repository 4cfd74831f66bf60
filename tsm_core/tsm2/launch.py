"""Launchers of the TSM2R and TSM2L kernels (tsm2/tsm2r.cu, tsm2/tsm2l.cu).

Each launcher takes CuPy arrays that have already been checked
(``runtime.checks.check_operands``): A is (m, k), B is (k, n), C is (m, n), one
float dtype, m, k, n >= 1. It resolves the concrete kernel configuration (template
parameters, grid, split-K factor, workspace), then launches. Nothing here
allocates before the configuration is known, and C is the only array written.

The launchers import no tuner: a default launch (no configuration of its own)
consults the lookup the API hands over with :func:`use_tuner` (the autotuner's
``tuned``), once per problem, when it first resolves it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from tsm_core.runtime import compile as _compile
from tsm_core.runtime import device as _device
from tsm_core.tsm2.configs import TSM2L_KMAX, V3D_N2_MIN_ELEMS

INT_MAX = 2**31 - 1

# Allowed values of the tuning parameters.
T1_VALUES = (64, 128, 256)
TN_VALUES = (1, 2, 4, 8, 16, 32)


def _pow2_at_least(x: int) -> int:
    return 1 << max(0, int(x - 1).bit_length())


# ------------------------------------------------------------------ layouts


@dataclass(frozen=True)
class ALayout:
    """How the kernel reads A: which axis is contiguous, the leading dimension,
    and the widest aligned vector (in elements, 16 bytes at most)."""

    col: bool  # column-major: A[i, j] at i + j*lda
    lda: int
    vec: int


def a_layout(A) -> tuple[ALayout, object]:
    """Layout of A for the kernels, and the array to read (A itself, or a
    C-ordered copy when neither axis of A is contiguous)."""
    item = A.itemsize
    m, k = A.shape
    s0, s1 = A.strides

    def step(s):  # a usable stride, in elements
        return s // item if s > 0 and s % item == 0 else None

    if m == 1 and s1 == item:
        col, lda = False, k
    elif k == 1 and s0 == item:
        col, lda = True, m
    elif s1 == item and step(s0):
        col, lda = False, step(s0)
    elif s0 == item and step(s1):
        col, lda = True, step(s1)
    else:
        A, col, lda = _c_copy(A)
    full = 16 // item
    vec = full if (A.data.ptr % 16 == 0 and lda % full == 0) else 1
    if vec == 1 and item == 4 and A.data.ptr % 8 == 0 and lda % 2 == 0:
        vec = 2
    return ALayout(col=col, lda=int(lda), vec=vec), A


def _c_copy(A):
    import cupy

    A = cupy.ascontiguousarray(A)
    return A, False, A.shape[1]


def _k_major(B, vec: int):
    """B (k, n) as a k-major buffer Bk[j*ldb + kk] with ldb and the base aligned
    to `vec` elements: B itself when it already is (an F-ordered B), else a copy
    of B.T (n x k, padded), which is small next to A in every TSM2R problem."""
    import cupy

    item = B.itemsize
    k, n = B.shape
    s0, s1 = B.strides
    if (s0 == item or k == 1) and (n == 1 or (s1 > 0 and s1 % (vec * item) == 0)) \
            and B.data.ptr % (vec * item) == 0:
        return B, (s1 // item if n > 1 else -(-k // vec) * vec)
    kpad = -(-k // vec) * vec
    Bk = cupy.empty((n, kpad), dtype=B.dtype)
    Bk[:, :k] = B.T
    return Bk, kpad


def _strides(x) -> tuple[int, int]:
    item = x.itemsize
    return x.strides[0] // item, x.strides[1] // item


# ------------------------------------------------------------------ device facts


def _device_attrs(dev_id: int) -> dict:
    """The device facts the launchers size grids by (``runtime.device.launch_facts``)."""
    return _device.launch_facts(dev_id)


def _blocks_per_sm(kern, threads: int, smem: int, attrs: dict) -> int:
    regs = max(1, kern.num_regs)
    # Registers are allocated per warp in units of 256.
    regs_warp = ((regs * 32 + 255) // 256) * 256
    by_regs = attrs["regs_per_sm"] // (regs_warp * ((threads + 31) // 32))
    by_threads = attrs["threads_per_sm"] // threads
    by_smem = (attrs["smem_per_sm"] - 1024) // (smem + 1024) if smem else 32
    return max(1, min(by_regs, by_threads, by_smem, 32))


# ------------------------------------------------------------------ TSM2R


@dataclass(frozen=True)
class TSM2RConfig:
    version: int = 3
    t1: int = 0  # threads per block; 0 = 128 (column-major A; 256 in float64's one-wave
    #              launch, _col_one_wave), 128, 256 or 512 (row-major A, by kernel)
    t2: int = 0  # TN: columns of C per pass; 0 = from n
    t3: int = 0  # KC: k-depth of a pipeline stage (v3) / A elements per fetch (v2); 0 = default
    stages: int = 0  # v3: cp.async stages (column-major A, default 4, 3 in float64's
    #                  one-wave launch); row-major A: 2 = A
    #                  prefetched into registers, 1 = not (default by dtype and t2)
    splits: int = 0  # split-K factor (v3); 0 = chosen to fill the GPU
    rpt: int = 0  # rows per warp for row-major A (v3); 0 = from t2 and the dtype
    groups: int = 0  # lane groups splitting the n-chunk, row-major A (v3); 0 = 1
    rgroups: int = 0  # lane groups splitting the rows, row-major A (v3, FMA); 0 = default
    tc: int = 0  # row-major A (v3): 1 = tensor cores (float64: DMMA, tsm2r_v3d; float32:
    #              3xTF32, tsm2r_v3x), -1 = FMA (tsm2r_v3r), 0 = tensor cores on sm_80+
    #              (float32: unless groups or rgroups are asked for)
    u: int = 0  # tsm2r_v3x: 16-deep k pieces per warp step; 0 = default
    minb: int = 0  # tsm2r_v3x, and stream-K's tsm2r_v3d_sk: blocks per SM the registers must
    #                allow (launch bounds); 0 = 1 (stream-K: the blocks per SM its one wave
    #                is made of, 512 / t1 for v3x, 4 or 3 for v3d at 16 or 8 columns)
    streamk: int = 0  # tensor-core kernels (row-major A): 1 = stream-K (one wave of equal
    #                   runs of k-tiles; splits unused), -1 = split-K; 0 = stream-K on the
    #                   default block shapes where the problem has >= SK_MIN_UNITS (float32:
    #                   16-column chunks only; float64: both chunk widths), unless splits > 1


# tsm2r_v3 (column-major A): 8 columns of T1*VEC rows per cp.async stage (16 KB
# at T1=128, float32); v2: 4 elements of A fetched at a time. Row-major A: see
# resolve_tsm2r (tsm2r_v3r's B-tile depth).
V3_DEFAULT_KC = 8
V2_DEFAULT_T3 = 4
# tsm2r_v3d (float64 on DMMA): k per warp step, the B tile's padding (KP = KT + 8
# in the kernel) and its default depth.
V3D_DEFAULT_U = 4  # 16-byte pieces per row per warp step (STEP = 8u doubles)
V3D_PAD = 8
V3D_DEFAULT_KT = 64
# float64 with n <= 2 runs on DMMA (tsm2r_v3d) from V3D_N2_MIN_ELEMS elements of A
# (tsm2/configs.py), on the FMA kernel below (see resolve_tsm2r).
# Row-major A with n <= 2 and m * k in this range (ABFT's encodings of N = 4096 to
# 8192) runs the FMA kernel with 4 warps of 8 rows and no register prefetch of A,
# both dtypes. Measured on the H100 (2026-11-23, fraction of the read
# bandwidth, the former default -> this): float64 n = 2, N = 4096 / 8192: 0.80-0.81 /
# 0.92 -> 0.83-0.84 / 0.93-0.94; float32 0.67 / 0.87-0.88 -> 0.70 / 0.89-0.90; n = 1
# alike. Past 2^26 it is uneven by size (float64 N = 10240 and 20480 lost 2-3%
# against DMMA, 16384 won 1%), so the range stops there.
SMALL_N2_ELEMS = (2**24, 2**26)
# tsm2r_v3x (float32 in 3xTF32): the B tile's padding (KP = KT + 16) and its default
# depth; B is staged as three parts (hi, hc, lo).
V3X_PAD = 16
V3X_DEFAULT_KT = 64
# tsm2r_v3x with stream-K at 16 columns runs one 16-warp block per SM (instead of
# two of 8 warps) from this many (128-row block, 128-deep k-tile) units: m = k =
# 20480 has 25600, 10240 has 6400 (see resolve_tsm2r). A count, not a share of the
# GPU, so that kernel names do not depend on the GPU.
V3X_ONE_BLOCK_UNITS = 12288


def tsm2r_name(cfg: TSM2RConfig, dtype, lay: ALayout) -> str:
    t = _compile.ctype(dtype)
    if cfg.version == 0:
        return f"tsm2r_v0<{t}>"
    if cfg.version == 1:
        return f"tsm2r_v1<{t},{cfg.t2}>"
    if cfg.version == 2:
        return f"tsm2r_v2<{t},{cfg.t1},{cfg.t2},{cfg.t3 or V2_DEFAULT_T3}>"
    if cfg.version == 3 and not lay.col and cfg.tc == 1 and t == "float":
        sk = "_sk" if cfg.streamk == 1 else ""
        return (f"tsm2r_v3x{sk}<{lay.vec},{cfg.t1 // 32},{cfg.rpt},{cfg.t2},{cfg.t3},{cfg.u},"
                f"{cfg.stages if cfg.stages >= 2 else 0},{cfg.minb or 1}>")
    if cfg.version == 3 and not lay.col and cfg.tc == 1:
        pf = 0 if cfg.stages == 1 else 1
        if cfg.streamk == 1:
            return (f"tsm2r_v3d_sk<{lay.vec},{cfg.t1 // 32},{cfg.rpt},{cfg.t2},{cfg.t3},{pf},{cfg.u or 2},"
                    f"{cfg.minb or 1}>")
        return f"tsm2r_v3d<{lay.vec},{cfg.t1 // 32},{cfg.rpt},{cfg.t2},{cfg.t3},{pf},{cfg.u or 2}>"
    if cfg.version == 3 and not lay.col:
        pf = 0 if cfg.stages == 1 else 1
        return (f"tsm2r_v3r<{t},{lay.vec},{cfg.t1 // 32},{cfg.rpt},{cfg.t2},{cfg.t3},{cfg.groups},{pf},"
                f"{cfg.rgroups or 1}>")
    if cfg.version == 3:
        return f"tsm2r_v3<{t},{lay.vec},{cfg.t1},{cfg.t2},{cfg.t3},{cfg.stages}>"
    raise ValueError(f"TSM2R version must be 0, 1, 2 or 3, not {cfg.version!r}")


def v3_rows(cfg: TSM2RConfig, lay: ALayout, itemsize: int) -> int:
    """Rows of C per block of tsm2r_v3 (column-major A) or of the row-major kernels
    (tsm2r_v3r: R rows per row group; v3d: R fragments of 8 rows; v3x: of 16)."""
    if lay.col:
        return cfg.t1 * lay.vec
    if cfg.tc == 1:
        return (cfg.t1 // 32) * (cfg.rpt or 1) * (16 if itemsize == 4 else 8)
    return (cfg.t1 // 32) * (cfg.rpt or 1) * (cfg.rgroups or 1)


def v3_smem_bytes(cfg: TSM2RConfig, itemsize: int, lay: ALayout) -> int:
    if not lay.col and cfg.tc == 1 and itemsize == 4:
        # tsm2r_v3x: 2 x 3 padded B tiles, and each warp's ring of A stages
        step = 16 * cfg.u
        a_stage = 16 * cfg.rpt * (step + (16 if step % 32 == 0 else 32))
        ring = cfg.stages if cfg.stages >= 2 else 0
        return (2 * 3 * cfg.t2 * (cfg.t3 + V3X_PAD) + (cfg.t1 // 32) * ring * a_stage) * itemsize
    if not lay.col and cfg.tc == 1:
        return 2 * cfg.t2 * (cfg.t3 + V3D_PAD) * itemsize  # tsm2r_v3d: two padded B tiles
    if not lay.col:
        return 2 * cfg.t2 * cfg.t3 * itemsize  # tsm2r_v3r: two B tiles
    return cfg.stages * (cfg.t3 * v3_rows(cfg, lay, itemsize) + cfg.t3 * cfg.t2) * itemsize


def choose_tn(n: int, cap: int = 16) -> int:
    return min(_pow2_at_least(n), cap)


def resolve_tsm2r(m, k, n, dtype, lay: ALayout, cfg: TSM2RConfig | None = None) -> TSM2RConfig:
    """Fill the defaults of a TSM2R configuration for this problem."""
    import cupy

    itemsize = np.dtype(dtype).itemsize
    cfg = cfg or TSM2RConfig()
    t2 = cfg.t2 if cfg.t2 else choose_tn(n)
    t3 = cfg.t3 or (V3_DEFAULT_KC if cfg.version == 3 else V2_DEFAULT_T3)
    tc = cfg.tc
    if cfg.version == 3 and not lay.col and tc == 0:
        # The tensor-core kernels need sm_80+. A pinned configuration (splits given)
        # is resolved without touching the device, for the targets this package is
        # built for. float64: DMMA (n = 4: 0.88-0.94 of the read bandwidth against
        # 0.87-0.91 on the FMA units, before stream-K). float32:
        # 3xTF32 at every n unless lane groups (an FMA-kernel feature) are asked for.
        # Measured on the H100 (2026-11-23), fraction of the read
        # bandwidth, tsm2r_v3r -> tsm2r_v3x: m = 10240 n = 2/8/16 0.87/0.83/0.75 ->
        # 0.87/0.86/0.80, m = 20480 0.90/0.88/0.81 -> 0.91/0.89/0.86, m = 30720
        # 0.94/0.92/0.83 -> 0.96/0.95/0.87.
        mma = cfg.splits or _device_attrs(cupy.cuda.Device().id)["cc"] >= (8, 0)
        if (n <= 2 and SMALL_N2_ELEMS[0] <= m * k <= SMALL_N2_ELEMS[1] and lay.vec * itemsize == 16
                and cfg == replace(TSM2RConfig(), splits=cfg.splits)):
            # ABFT-sized encodings: the FMA kernel, 4 warps of 8 rows, no A prefetch.
            cfg, tc = replace(cfg, t1=128, rpt=8, stages=1), -1
        elif itemsize == 8:
            # n <= 2 too since stream-K, on large problems (2026-11-23, m = k = 10240 /
            # 20480 / 30720, n = 2: FMA 0.89 / 0.91 / 0.92 of the read bandwidth ->
            # DMMA with stream-K 0.93 / 0.97 / 0.98, cuBLAS 0.82 / 0.93 / 0.95; but at
            # m = k = 4096 (ABFT's encoding bench) 0.82 -> 0.78).
            tc = 1 if (mma and (n > 2 or m * k >= V3D_N2_MIN_ELEMS)) else -1
        else:
            tc = 1 if (mma and not (cfg.groups > 1 or cfg.rgroups > 1)) else -1
    if cfg.streamk not in (-1, 0, 1):
        raise ValueError(f"streamk must be -1, 0 or 1, not {cfg.streamk!r}")
    if cfg.streamk == 1 and not (cfg.version == 3 and not lay.col and tc == 1):
        raise ValueError("streamk=1 is a mode of the tensor-core kernels (tsm2r_v3x, tsm2r_v3d): "
                         "row-major A, tc=1")
    if cfg.u and not (cfg.version == 3 and not lay.col and tc == 1):
        raise ValueError("u (k pieces per warp step) is a parameter of the tensor-core kernels "
                         "(tsm2r_v3x, tsm2r_v3d): row-major A, tc=1")
    if cfg.u not in (0, 1, 2, 4, 8):
        raise ValueError(f"u must be 1, 2, 4 or 8, not {cfg.u!r}")
    if cfg.version == 3 and not lay.col and tc == 1 and itemsize == 4:
        # float32 in 3xTF32 on the tensor cores (tsm2r_v3x): R fragments of 16 rows
        # per warp, 8- or 16-column chunks (the MMA's n is 8). With 16 columns, 8 warps
        # per block share a 128-deep B tile (a block barrier every 2 steps, not every
        # step): measured on the H100 (2026-11-23) m = 20480 / 30720 0.86 / 0.89 ->
        # 0.88 / 0.91 of the read bandwidth; with 8 columns it lost (0.94 -> 0.90).
        wide = t2 > 8 and not cfg.t1 and not cfg.t3
        free_ring = not (cfg.stages or cfg.minb)  # neither the A ring nor the launch bounds asked for
        t1 = cfg.t1 or (256 if wide else 128)
        if t1 % 32:
            raise ValueError(f"t1 must be a multiple of 32 for row-major A, not {t1}")
        if t1 > 256 and lay.vec != 4:
            raise ValueError(f"t1={t1} on the tensor cores (tsm2r_v3x) needs a 16-byte aligned A: "
                             f"{t1} threads leave {65536 // t1} registers each, too few for the scalar "
                             "loads of a misaligned A (use t1 <= 256)")
        t2 = max(8, -(-t2 // 8) * 8) if t2 <= 16 else 16
        u = cfg.u or 4
        kq = max(32, 16 * u)  # B tile depth: whole warp steps, a multiple of 32
        t3 = max(kq, (cfg.t3 or (2 * V3X_DEFAULT_KT if wide else V3X_DEFAULT_KT)) // kq * kq)
        rpt = cfg.rpt or 1
        # stages: 1 = A loaded into registers at each step, >= 2 = a cp.async ring
        stages = cfg.stages or 1
        cfg = replace(cfg, t1=t1, t2=t2, t3=t3, rpt=rpt, u=u, stages=stages, groups=1, rgroups=1, tc=1)
        # Stream-K (tsm2/tsm2r.cu, tsm2r_v3x_sk) for 16-column chunks: measured on
        # the H100 (2026-11-23), fraction of the read bandwidth, split-K
        # -> stream-K on one wave of 2 blocks per SM: m = 10240 / 20480 / 30720, n = 16:
        # 0.83 / 0.88 / 0.91 -> 0.84 / 0.91 / 0.93. With 8 columns (4 warps, 64-deep
        # B tiles) it lost: m = 20480 / 30720 0.94 / 0.96 -> 0.93 / 0.94.
        sk = cfg.streamk
        units = -(-m // v3_rows(cfg, lay, itemsize)) * -(-k // t3)
        if sk == 0:
            fits = wide and t2 == 16 and lay.vec == 4
            sk = 1 if (fits and units >= SK_MIN_UNITS and cfg.splits <= 1) else -1
        if sk == 1:
            if wide and lay.vec == 4 and free_ring and units >= V3X_ONE_BLOCK_UNITS:
                # One block of 16 warps per SM with A through a 2-stage cp.async
                # ring. Measured on the H100 (2026-11-23, two operand
                # layouts, fraction of the read bandwidth), 2 blocks of 8 warps with
                # A loaded at each step -> this: m = k = 20480 / 30720, n = 16:
                # 0.898-0.900 / 0.920 -> 0.910 / 0.939-0.941 (bench: 0.91 / 0.94).
                # At m = k = 10240 (6400 units) it lost: 0.814 -> 0.807-0.815 in
                # a sweep, 0.79 in the bench. (u = 2 or 8, 3 stages, or 2 blocks
                # per SM all lost.)
                return replace(cfg, t1=512, stages=2, streamk=1, minb=1, splits=1)
            # Two blocks of 8 warps per SM need <= 128 registers: reached without
            # spilling with 16-byte loads of A (not with the scalar loads of a
            # misaligned A, which keep 1 block per SM).
            minb = cfg.minb or (max(1, 512 // t1) if lay.vec == 4 else 1)
            return replace(cfg, streamk=1, minb=minb, splits=1)
        cfg = replace(cfg, streamk=-1)
    elif cfg.version == 3 and not lay.col and tc == 1:
        # float64 on the FP64 tensor cores (tsm2r_v3d): R groups of 8 rows per
        # warp, 8- or 16-column chunks (DMMA's n is 8).
        # Measured on the H100 (2026-11-22, back-to-back host-timed calls):
        # 4 warps per block, 2 groups (16 rows) per warp for 16 columns, 4 for 8;
        # 0.75-0.80 of the bandwidth against 0.53 for tsm2r_v3r at 16 columns and
        # about equal at 8. On 2026-11-23 (the bench's timing): 4 pieces per step
        # (256-byte runs per row, u = 4) with A loaded at each step instead of
        # prefetched into registers (stages = 1: 88-144
        # registers instead of 160-245): m = 10240 / 20480 / 30720, n = 8: 0.82 /
        # 0.87 / 0.87 -> 0.87 / 0.92 / 0.92; n = 16: 0.84 / 0.84 / 0.83 -> 0.89 /
        # 0.89 / 0.90 (the chooser's splits).
        t1 = cfg.t1 or 128
        if t1 % 32:
            raise ValueError(f"t1 must be a multiple of 32 for row-major A, not {t1}")
        t2 = max(8, -(-t2 // 8) * 8) if t2 <= 16 else 16
        u = cfg.u or V3D_DEFAULT_U
        step = 8 * u  # k per warp step
        t3 = max(step, (cfg.t3 or V3D_DEFAULT_KT) // step * step)
        rpt = cfg.rpt or (2 if t2 >= 16 else 4)
        defaults = not (cfg.t1 or cfg.t3 or cfg.rpt)
        cfg = replace(cfg, t1=t1, t2=t2, t3=t3, rpt=rpt, u=u, stages=cfg.stages or 1, groups=1, rgroups=1,
                      tc=1)
        # Stream-K (tsm2r_v3d_sk): measured on the H100 (2026-11-23),
        # fraction of the read bandwidth, split-K -> stream-K on one wave, m = 10240 /
        # 20480 / 30720: n = 16 (4 blocks per SM, 104 registers) 0.84 / 0.90 / 0.90 ->
        # 0.93 / 0.96 / 0.96; n = 8 (3 per SM) - / 0.92 / 0.92 -> - / 0.97 / 0.97,
        # where cuBLAS read 0.85 / 0.93 / 0.95.
        sk = cfg.streamk
        if sk == 0:
            units = -(-m // v3_rows(cfg, lay, itemsize)) * -(-k // t3)
            sk = 1 if (defaults and lay.vec == 2 and units >= SK_MIN_UNITS and cfg.splits <= 1) else -1
        if sk == 1:
            # The launch bounds that keep 4 (3) blocks per SM without spilling hold
            # for the default shape with A loaded at each step; other shapes keep
            # what their registers give (the wave is sized by the occupancy).
            tight = defaults and cfg.stages == 1
            return replace(cfg, streamk=1, minb=cfg.minb or ((4 if t2 >= 16 else 3) if tight else 1),
                           splits=1)
        cfg = replace(cfg, streamk=-1)
    elif cfg.version == 3 and not lay.col:
        # Warp-per-rows kernel (tsm2r_v3r): R rows per warp, R*TN sums per lane.
        t1 = cfg.t1 or 256
        if t1 % 32:
            raise ValueError(f"t1 must be a multiple of 32 for row-major A, not {t1}")
        # Measured on the H100 (2026-11-22): a warp-wide
        # 512-byte load per row (groups = 1) beats splitting the n-chunk over lane
        # groups; R = 2 rows per warp for a 16-column chunk (more registers cost
        # more occupancy than the extra reuse of B gains), 4 otherwise (the bench
        # of 2026-11-22 had float64, 8 columns at 0.73-0.76 of the read bandwidth
        # with R = 2, 0.84-0.89 with R = 4). float64 with 16 columns runs 16 warps per block
        # with a one-step B tile (t3), which keeps it from spilling.
        groups = cfg.groups or 1
        # Row groups (two groups of 16 lanes, each with its own R rows) for float32
        # with a 16-column chunk: half the shared-memory wavefronts per byte of A.
        # Measured on the H100 (2026-11-23): m = 20480, n = 16 from
        # 0.77 to 0.82 of the read bandwidth, m = 30720 0.78 -> 0.83, m = 10240
        # 0.69 -> 0.76; n <= 8 unchanged, 4 and 8 groups slower (128-byte pieces of
        # a row per load), float64 slower (it runs on tsm2r_v3d anyway).
        rgroups = cfg.rgroups or (2 if (itemsize == 4 and t2 >= 16 and groups == 1) else 1)
        if groups > 1 and rgroups > 1:
            raise ValueError("lane groups split either the columns (groups) or the rows (rgroups), not both")
        if 32 % (groups * rgroups):
            raise ValueError(f"groups and rgroups must divide the 32 lanes of a warp, not {groups}, {rgroups}")
        wide64 = itemsize == 8 and t2 >= 16
        rpt = cfg.rpt or (2 if t2 >= 16 else 4)
        if not cfg.t1:
            # (512 threads cap registers at 128: only where that does not spill)
            t1 = 512 if ((t2 == 8 and itemsize == 4) or wide64) else 256
        step = (32 // (groups * rgroups)) * lay.vec
        # float64 with R*TN >= 32 sums per lane: a one-step B tile keeps 2 blocks
        # per SM (128 registers) without spilling.
        t3 = cfg.t3 or (step if (itemsize == 8 and rpt * t2 >= 32) else 4 * step)
        t3 = max(step, t3 // step * step)
        # stages: 2 = A prefetched into registers, 1 = not (tsm2r_v3r's PF).
        stages = cfg.stages or 2
        cfg = replace(cfg, t1=t1, t2=t2, t3=t3, rpt=rpt, stages=stages, groups=groups, rgroups=rgroups,
                      tc=-1)
    else:
        wave = None
        if cfg.version == 3 and not (cfg.t1 or cfg.t3 or cfg.stages or cfg.splits):
            attrs = _device_attrs(cupy.cuda.Device().id)
            wave = _col_one_wave(m, k, n, itemsize, lay, t2, attrs["sm_count"])
        if wave is not None:
            t1, stages, splits = wave
            return replace(cfg, t1=t1, t2=t2, t3=t3, rpt=cfg.rpt or 1, stages=stages, splits=splits)
        cfg = replace(cfg, t1=cfg.t1 or 128, t2=t2, t3=t3, rpt=cfg.rpt or 1, stages=cfg.stages or 4)
    if cfg.version != 3:
        return replace(cfg, splits=1)
    if cfg.splits:
        return cfg
    attrs = _device_attrs(cupy.cuda.Device().id)
    kern = _compile.get_kernel("tsm2r", tsm2r_name(cfg, dtype, lay))
    smem = v3_smem_bytes(cfg, itemsize, lay)
    per_sm = _blocks_per_sm(kern, cfg.t1, smem, attrs)
    row_blocks = -(-m // v3_rows(cfg, lay, itemsize))
    # tsm2r_v3x: one (nearly) full wave is enough. Measured on the H100
    # (2026-11-23, float32 n <= 8): m = 20480 at 2 splits (1.0 wave) 0.93-0.94
    # of the read bandwidth against 0.89-0.91 at the 6 that two waves need.
    waves = 0.9 if (not lay.col and cfg.tc == 1 and itemsize == 4) else 2
    if lay.col and cfg.t2 >= 16:
        # tsm2r_v3 (column-major A) with 16 columns: split sweeps on the H100
        # (2026-11-23) peak at about 240 blocks, 0.9 of two blocks
        # per SM (though registers and shared memory would allow 3 per SM): float32
        # at m = 10240 / 20480 / 30720 0.85 / 0.94 / 0.95 of the read bandwidth
        # against 0.76 / 0.89 / 0.92 at the two-wave counts; float64 at m = 20480 /
        # 30720 0.96 / 0.96 against 0.93 / 0.96. So one wave of 2 per SM there. With
        # n <= 8 the same rule lost 1-4% at m >= 20480 in the bench (float64 n = 8,
        # m = 30720: 0.95 against 0.99), so those keep the two waves.
        per_sm, waves = min(per_sm, 2), 0.9
    return replace(cfg, splits=_choose_splits(row_blocks, per_sm * attrs["sm_count"], k, cfg.t3, n,
                                              min_waves=waves))


# tsm2r_v3 (column-major A) in one wave of one 512-row block per SM: the most
# splits s with ONE_WAVE_FILL * SMs <= row_blocks * s <= SMs. Measured on the H100
# (2026-11-23, fraction of the read bandwidth, two operand layouts,
# the former defaults -> one wave):
#   float64, 256 threads, 3 stages, every n: m = k = 10240 / 20480 / 30720, n = 16:
#   0.90 / 0.95 / 0.95 -> 0.95 / 1.00 / 1.00; n = 8: 0.92 / 0.97 / 0.97 -> 0.98 /
#   0.99 / 0.99; n = 2, 4: 0.94-1.00 -> 0.99-1.00; m = k = 4096 / 8192, n = 2: 0.81 /
#   0.92 -> 0.86 / 0.99 (cuBLAS 0.87-0.98 at all of these). 4 stages lost (0.90-0.97).
#   float32, 128 threads, 4 stages, n <= 4 only: m = k = 10240 / 20480 / 30720
#   0.89 / 0.97 / 0.98 -> 0.95 / 1.00 / 0.99, m = k = 8192, n = 2 0.85 -> 0.94; with
#   8 or 16 columns it lost (0.92-0.96 -> 0.82-0.90: float32 needs more warps per
#   SM for its FMAs per byte), as did 3 stages.
# Where no split count fills a wave (row blocks past the SM count, e.g. m = 1e5, k
# = 1000: 0.96 -> 0.86 at 3 waves of it) the former defaults stay.
ONE_WAVE_FILL = 0.85


def _col_one_wave(m, k, n, itemsize, lay: ALayout, t2: int, sms: int):
    """(t1, stages, splits) of the one-wave launch of tsm2r_v3, or None where it does
    not apply (see ONE_WAVE_FILL)."""
    if lay.vec * itemsize != 16 or (itemsize == 4 and t2 > 4):
        return None
    rows = 512
    row_blocks = -(-m // rows)
    splits = min(sms // row_blocks, split_cap(k, n), max(1, k // (4 * V3_DEFAULT_KC)))
    if splits < 1 or row_blocks * splits < ONE_WAVE_FILL * sms:
        return None
    return (rows // lay.vec, 3 if itemsize == 8 else 4, splits)


# Stream-K needs this many (row block, k-tile) units before it is chosen by itself:
# a few per block of its one wave (device-independent, so that kernel names do not
# depend on the GPU).
SK_MIN_UNITS = 512


# Split-K writes its partial sums and reads them back: 2 * splits * m * n elements
# against A's m * k. At most this share of A's traffic: 3%, i.e. splits <= 0.015 k / n.
# Measured on the H100 (2026-11-23), column-major A, fraction of the
# read bandwidth, the former chooser -> capped: m = 10240 float32 n = 16 0.67 -> 0.75
# (58 -> 9 splits), n = 8 0.80 -> 0.88, n = 4 0.86 -> 0.89; float64 n = 16 0.84 ->
# 0.88, n = 8 0.91 -> 0.93; m = 20480 float32 n = 16 0.89 -> 0.91; the other shapes
# of the sweep were under the cap already. float64 row-major on DMMA, m = 10240,
# n = 16: 12 -> 4 splits, 0.79 -> 0.84. Raised from 3% to 4% later that day: column-major
# float32 m = 10240, n = 16 at 12 splits (3.75%) 0.85 against 0.76 at the 9 of 3%.
SPLIT_TRAFFIC_MAX = 0.04


def split_cap(k: int, n: int) -> int:
    """The most splits whose partial sums stay within SPLIT_TRAFFIC_MAX of A's bytes."""
    return max(1, int(SPLIT_TRAFFIC_MAX / 2 * k / max(1, n)))


def _choose_splits(row_blocks: int, resident: int, k: int, kstep: int, n: int | None = None,
                   min_waves: float = 2) -> int:
    """Split-K factor: at least `min_waves` waves of blocks when k allows it (every split
    at least 4 k-steps deep) and the partial sums stay cheap (`split_cap`, when n
    is given), then the fewest splits whose last wave is nearly full (longer runs
    along k are kinder to DRAM, and each split adds partial sums to write and
    reduce). Where the cap keeps two waves out of reach, or leaves the last wave
    ragged (under 90% full), every count up to the cap is a candidate: a nearly
    full single wave beats a ragged second one."""
    most = max(1, min(64, k // (4 * kstep)))
    if n is not None:
        most = min(most, split_cap(k, n))

    def fullest(lo, hi):
        best, best_eff = lo, -1.0
        for s in range(lo, hi + 1):
            waves = row_blocks * s / resident
            eff = waves / math.ceil(waves)  # share of the last wave that does work
            if eff > best_eff + 0.02:
                best, best_eff = s, eff
        return best, best_eff

    lo = next((s for s in range(1, most + 1) if row_blocks * s >= min_waves * resident), None)
    if lo is not None:
        best, eff = fullest(lo, min(most, max(2 * lo, 4)))
        if n is None or eff >= 0.9:
            return best
    elif n is None:
        return most
    return fullest(1, most)[0]


def _problem(family: str, A, B, cfg):
    """Sizes, dtype and A's layout (A itself or a C-ordered copy), and the key of
    the resolved-launch cache: device, problem, layout and requested configuration."""
    import cupy

    m, k = A.shape
    n = B.shape[1]
    if max(m, k, n) > INT_MAX:
        raise ValueError("tsm_core kernels take dimensions below 2**31")
    lay, A = a_layout(A)
    key = (family, cupy.cuda.runtime.getDevice(), m, k, n, A.dtype.char, lay, cfg)
    return m, k, n, A.dtype, lay, A, key


def launch_tsm2r(A, B, C, alpha: float, beta: float, cfg: TSM2RConfig | None = None) -> TSM2RConfig:
    """C = alpha * A @ B + beta * C with a TSM2R kernel. Returns the configuration used."""
    import cupy

    m, k, n, dtype, lay, A, key = _problem("r", A, B, cfg)
    hit = _resolved.get(key)
    if hit is None:
        if _tuner is not None and (cfg is None or cfg == TSM2RConfig()):  # a default launch
            cfg = _tuner("tsm2r", A, B, m, k, n, dtype, lay) or cfg
        rcfg = resolve_tsm2r(m, k, n, dtype, lay, cfg)
        kern = _compile.get_kernel("tsm2r", tsm2r_name(rcfg, dtype, lay))
        smem = kchunk = 0
        red = sk = None
        if rcfg.version == 3:
            smem = v3_smem_bytes(rcfg, dtype.itemsize, lay)
            optin = _device_attrs(cupy.cuda.runtime.getDevice())["smem_optin"]
            if smem > optin:
                raise ValueError(f"this TSM2R configuration needs {smem} bytes of shared memory per "
                                 f"block, more than the GPU's {optin}: use fewer stages, warps (t1), "
                                 f"rows per warp (rpt) or a shallower B tile (t3)")
            if smem > 48 * 1024:
                kern.max_dynamic_shared_size_bytes = smem
            if rcfg.streamk == 1:
                # One wave of equal runs: as many blocks as fit on the GPU at once;
                # kchunk carries the k-tiles per row block, `sk` the reduction's
                # figures (rows per block, blocks, slots of partial sums per row).
                # Never more blocks than units: every block's run is then non-empty,
                # and the blocks holding a row block's units are consecutive, which
                # is what numbers their slots 0, 1, ... (tsm2r_streamk_reduce).
                attrs = _device_attrs(cupy.cuda.runtime.getDevice())
                rows = v3_rows(rcfg, lay, dtype.itemsize)
                kchunk = -(-k // rcfg.t3)
                units = -(-m // rows) * kchunk
                blocks = min(units, max(1, _blocks_per_sm(kern, rcfg.t1, smem, attrs)) * attrs["sm_count"])
                # Slots per row block: its kchunk units meet at most this many runs
                # of at least floor(units / blocks) units each.
                slots = min(blocks, (kchunk - 1) // (units // blocks) + 2)
                sk = (rows, blocks, slots)
                grid = (blocks,)
                red = _compile.get_kernel("tsm2r", f"tsm2r_streamk_reduce<{_compile.ctype(dtype)}>")
            else:
                kchunk = -(-(-(-k // rcfg.splits)) // rcfg.t3) * rcfg.t3
                rcfg = replace(rcfg, splits=-(-k // kchunk))
                grid = (-(-m // v3_rows(rcfg, lay, dtype.itemsize)), rcfg.splits)
                if rcfg.splits > 1:
                    red = _compile.get_kernel("tsm2r", f"tsm2r_splitk_reduce<{_compile.ctype(dtype)}>")
        else:
            grid = (-(-m // rcfg.t1),)
        hit = _resolved[key] = (rcfg, kern, smem, kchunk, grid, red, sk)
    rcfg, kern, smem, kchunk, grid, red, sk = hit
    sc = dtype.type
    sb0, sb1 = _strides(B)
    sc0, sc1 = _strides(C)
    i64, i32 = np.int64, np.int32
    if sk is not None:  # stream-K (tsm2r_v3x_sk, tsm2r_v3d_sk), then the rows it split
        Bk, ldb = _k_major(B, lay.vec)
        rows, blocks, slots = sk
        W = cupy.empty(slots * n * m, dtype=dtype)
        kern(grid, (rcfg.t1,),
             (A, i64(lay.lda), Bk, i64(ldb), C, i64(sc0), i64(sc1), W,
              i32(m), i32(n), i32(k), i64(kchunk), sc(alpha), sc(beta)),
             shared_mem=smem)
        red((min(-(-(m * n) // 256), 8 * 1024),), (256,),
            (W, C, i64(sc0), i64(sc1), i32(m), i32(n), i32(rows), i64(kchunk), i64(blocks),
             sc(alpha), sc(beta)))
        return rcfg
    if rcfg.version == 3 and not lay.col:
        Bk, ldb = _k_major(B, lay.vec)
        W = cupy.empty(rcfg.splits * n * m, dtype=dtype) if red is not None else C
        kern(grid, (rcfg.t1,),
             (A, i64(lay.lda), Bk, i64(ldb), C, i64(sc0), i64(sc1), W,
              i32(m), i32(n), i32(k), i32(kchunk), sc(alpha), sc(beta)),
             shared_mem=smem)
    elif rcfg.version == 3:
        W = cupy.empty(rcfg.splits * n * m, dtype=dtype) if red is not None else C
        kern(grid, (rcfg.t1,),
             (A, i64(lay.lda), B, i64(sb0), i64(sb1), C, i64(sc0), i64(sc1), W,
              i32(m), i32(n), i32(k), i32(kchunk), sc(alpha), sc(beta)),
             shared_mem=smem)
    if rcfg.version == 3:
        if red is not None:
            blocks = min(-(-(m * n) // 256), 8 * 1024)
            red((blocks,), (256,),
                (W, i32(rcfg.splits), C, i64(sc0), i64(sc1), i32(m), i32(n), sc(alpha), sc(beta)))
        return rcfg
    # v0 - v2: the paper's thread-per-row ladder, generic strides.
    sa0, sa1 = _strides(A)
    kern(grid, (rcfg.t1,),
         (A, i64(sa0), i64(sa1), B, i64(sb0), i64(sb1), C, i64(sc0), i64(sc1),
          i32(m), i32(n), i32(k), sc(alpha), sc(beta)))
    return rcfg


# ------------------------------------------------------------------ TSM2L
# TSM2L_KMAX (tsm2/configs.py): opt1 keeps all of k in one shared-memory tile.


@dataclass(frozen=True)
class TSM2LConfig:
    opt: int = 1
    t1: int = 0  # threads per block; 0 = by shape (see resolve_tsm2l)
    t2: int = 0  # TN; 0 = from n
    kt: int = 0  # k-tile (KT); 0 = from k
    tcf: int = 0  # thread count factor (row tiles per block); 0 = one full wave
    vec: int = 0  # 0 = widest aligned
    stages: int = 0  # opt1's cp.async ring; 0 = 2
    warp: int = 0  # opt1, row-major A with short rows: 1 = tsm2l_opt1w (a warp reads whole
    #               rows into registers), -1 = tsm2l_opt1 (tiles staged in shared memory),
    #               0 = opt1w where it applies
    u: int = 0  # tsm2l_opt1w: load instructions per warp step; 0 = by dtype
    direct: int = 0  # opt1, column-major A: 1 = tsm2l_opt1d (A read straight into registers,
    #                 no shared-memory tile of A or block barrier per tile), 0 = tsm2l_opt1
    stage: int = 0  # tsm2l_opt1d: 1 = a row-major C staged through shared memory per warp,
    #                -1 = each thread stores its rows directly; 0 = staged


# tsm2l_opt1w's threads per block (its __launch_bounds__).
OPT1W_THREADS = 256


def tsm2l_name(cfg: TSM2LConfig, dtype, lay: ALayout) -> str:
    t = _compile.ctype(dtype)
    col = "true" if lay.col else "false"
    if cfg.opt == 1 and cfg.warp == 1:
        return f"tsm2l_opt1w<{t},{cfg.kt // cfg.vec},{cfg.t2},{cfg.u}>"
    if cfg.opt == 1 and cfg.direct == 1:
        return f"tsm2l_opt1d<{t},{cfg.vec},{cfg.t1},{cfg.kt},{cfg.t2},{int(cfg.stage == 1)}>"
    if cfg.opt == 1:
        return f"tsm2l_opt1<{t},{col},{cfg.vec},{cfg.t1},{cfg.t2},{cfg.kt},{cfg.stages}>"
    if cfg.opt == 2:
        return f"tsm2l_opt2<{t},{col},{cfg.vec},{cfg.t1},{cfg.t2},{cfg.kt}>"
    raise ValueError(f"TSM2L opt must be 1 or 2, not {cfg.opt!r}")


def tsm2l_rows(cfg: TSM2LConfig, lay: ALayout) -> int:
    if cfg.opt == 1 and cfg.warp == 1:  # warps x u instructions x rows per instruction
        return (cfg.t1 // 32) * cfg.u * (32 // (cfg.kt // cfg.vec))
    return cfg.t1 * (cfg.vec if lay.col else 1)


def tsm2l_smem_bytes(cfg: TSM2LConfig, itemsize: int, lay: ALayout) -> int:
    """Dynamic shared memory of tsm2l_opt1 and tsm2l_opt1d (opt2 uses static shared
    memory only)."""
    if cfg.opt != 1 or cfg.warp == 1:
        return 0
    if cfg.direct == 1:  # L1dTile: B's chunk, and each warp's rows of C when staged
        c = (cfg.t1 // 32) * 32 * cfg.vec * (cfg.t2 + 1) if cfg.stage == 1 else 0
        return (cfg.kt * cfg.t2 + c) * itemsize
    rows = tsm2l_rows(cfg, lay)
    a = cfg.kt * rows if lay.col else rows * (cfg.kt + 16 // itemsize)
    return (cfg.stages * a + rows * (cfg.t2 + 1) + cfg.kt * cfg.t2) * itemsize


def resolve_tsm2l(m, k, n, dtype, lay: ALayout, cfg: TSM2LConfig | None = None) -> TSM2LConfig:
    import cupy

    itemsize = np.dtype(dtype).itemsize
    cfg = cfg or TSM2LConfig()
    t2 = cfg.t2 or choose_tn(n, 16)
    kv = 16 // itemsize
    if cfg.warp not in (-1, 0, 1):
        raise ValueError(f"warp must be -1, 0 or 1, not {cfg.warp!r}")
    # tsm2l_opt1w: row-major A whose rows are whole 16-byte vectors (aligned), k <= 32
    # and n <= 16 (B's slice and the sums live in registers), no explicit tile.
    # (A configuration it resolved itself, kt, vec and t1 as it sets them, fits too.)
    own_kt = _pow2_at_least(-(-k // kv)) * kv
    fits_w = (cfg.opt == 1 and not lay.col and lay.vec == kv and k <= TSM2L_KMAX and n <= t2 <= 16
              and not cfg.stages and cfg.kt in (0, own_kt) and cfg.vec in (0, kv)
              and cfg.t1 in (0, OPT1W_THREADS))
    if cfg.warp == 1 and not fits_w:
        raise ValueError("warp=1 (tsm2l_opt1w) needs opt=1, a row-major A with 16-byte aligned rows, "
                         f"k <= {TSM2L_KMAX}, n <= 16 and no kt, stages, vec or t1 of its own")
    # Chosen by itself for rows of at most 64 bytes (4 lanes per row). Measured on the
    # H100 (2026-11-23), fraction of the read bandwidth at m = 1e7 with
    # n = k, tsm2l_opt1 -> tsm2l_opt1w: float32 k = 8 0.74 -> 0.91, k = 16 0.83 ->
    # 0.90, float64 k = 8 0.85 -> 0.90; float64 k = 16 (128-byte rows) 0.91 -> 0.89.
    if cfg.direct not in (0, 1) or cfg.stage not in (-1, 0, 1):
        raise ValueError(f"direct must be 0 or 1 and stage -1, 0 or 1, not {cfg.direct!r}, {cfg.stage!r}")
    if cfg.direct == 1:
        return _resolve_opt1d(m, k, n, dtype, lay, cfg, t2)
    if fits_w and (cfg.warp == 1 or (cfg.warp == 0 and k * itemsize <= 64)):
        return _resolve_opt1w(m, k, n, dtype, lay, cfg, t2)
    if cfg.kt:
        kt = cfg.kt
    elif cfg.opt == 1:
        kt = max(_pow2_at_least(k), 1 if lay.col else kv)
    else:
        # opt2 keeps KT x VEC values of A twice (current and next) in registers;
        # the float64 caps are where ptxas allocates them without spilling.
        cap = 16 if (itemsize == 4 or t2 >= 16) else 8
        kt = min(max(_pow2_at_least(k), 1 if lay.col else kv), cap)
    if cfg.opt == 1 and k > kt:
        raise ValueError(f"TSM2L opt1 needs k <= kt (k={k}, kt={kt}); use opt=2 (any k) or TSM2R")
    if cfg.vec:
        vec = cfg.vec
    elif not lay.col:
        vec = min(lay.vec, kt)  # along k
    elif cfg.opt == 1:
        vec = lay.vec  # rows per thread; A lives in shared memory
    else:
        # opt2 holds VEC x KT values of A (twice: current and next) in registers.
        vec = max(1, min(lay.vec, 16 // kt))
    # Measured at m = 1e7 on the H100 (2026-11-22): a two-stage ring beats the former 3-4 stages by 1-6% (float64
    # column-major, k = 16: +5%), and 256 threads beat 128 by 2-3% in float32
    # except row-major with k <= 8. (float64 at 256 threads is capped at 128
    # registers and spills with 16 columns.)
    stages = cfg.stages or 2
    t1 = cfg.t1 or (256 if cfg.opt == 1 and itemsize == 4 and (lay.col or k > 8) else 128)
    if cfg.opt == 1 and not cfg.t1 and not cfg.vec:
        t1, vec = _small_grid_tile(m, t1, vec, lay.col)
    cfg = replace(cfg, t1=t1, t2=t2, kt=kt, vec=vec, stages=stages)
    if not cfg.tcf:
        attrs = _device_attrs(cupy.cuda.Device().id)
        kern = _compile.get_kernel("tsm2l", tsm2l_name(cfg, dtype, lay))
        smem = tsm2l_smem_bytes(cfg, itemsize, lay) or kt * t2 * itemsize
        per_sm = _blocks_per_sm(kern, cfg.t1, smem, attrs)
        ntile = -(-m // tsm2l_rows(cfg, lay))
        resident = per_sm * attrs["sm_count"]
        # Section 3.2.2: launch as few threads as keep every SM full. With tcf
        # tiles per block and at most `resident` blocks, the launch is exactly one
        # wave: no tail of half-empty SMs.
        cfg = replace(cfg, tcf=max(1, -(-ntile // resident)))
    return cfg


# A TSM2L launch whose default tiles would give fewer blocks than this takes smaller
# tiles (opt1: fewer threads, then fewer rows per thread; opt1w: fewer load
# instructions per warp step, down to half of it). With one tile per block the
# launch is a chain of latencies (A's loads, the sums, the stores) on as few SMs
# as there are blocks: spreading it over more SMs shortens every link. Measured on
# the H100 at m = 1e4 (2026-11-23), default -> small tiles: float32
# column-major k = 16 7.6 -> 4.8 us, k = 8 5.0 -> 3.9; float64 column-major k = 16
# 7.2 -> 5.9; float32 row-major k = 8 (opt1w, u 4 -> 1) 4.1 -> 3.4. A fixed count
# rather than the device's SM count keeps kernel names device-independent (the
# compile tests enumerate them without a GPU); 128 is about one block per SM on
# the GPUs this targets (H100: 132 SMs, A100: 108).
SMALL_GRID_BLOCKS = 128


def _small_grid_tile(m: int, t1: int, vec: int, col: bool) -> tuple[int, int]:
    """(t1, vec) of tsm2l_opt1 for a grid of at least SMALL_GRID_BLOCKS row tiles where m
    allows: halve t1 down to 64 threads, then (column-major A) the rows per thread."""
    def tiles(t, v):
        return -(-m // (t * (v if col else 1)))

    while tiles(t1, vec) < SMALL_GRID_BLOCKS and t1 > 64:
        t1 //= 2
    while col and tiles(t1, vec) < SMALL_GRID_BLOCKS and vec > 1:
        vec //= 2
    return t1, vec


def _resolve_opt1w(m, k, n, dtype, lay: ALayout, cfg: TSM2LConfig, t2: int) -> TSM2LConfig:
    import cupy

    itemsize = np.dtype(dtype).itemsize
    kv = 16 // itemsize
    lpr = _pow2_at_least(-(-k // kv))  # lanes per row of A
    # Measured on the H100 (2026-11-23): 4 load instructions per warp
    # step in float32, 2 in float64 (4 spills with 16 columns). Small grids take fewer
    # (SMALL_GRID_BLOCKS; float32 k = 16 lost at u = 1, 5.4 against 5.0 us at m = 1e4,
    # hence only down to half the block count).
    u = cfg.u
    if not u:
        u = 4 if itemsize == 4 else 2
        rows_per_u = (OPT1W_THREADS // 32) * (32 // lpr)
        while u > 1 and -(-m // (rows_per_u * u)) < SMALL_GRID_BLOCKS // 2:
            u //= 2
    tn = -(-max(t2, lpr) // lpr) * lpr  # whole outputs per lane after the reduce-scatter
    cfg = replace(cfg, warp=1, t1=OPT1W_THREADS, t2=tn, kt=lpr * kv, vec=kv, u=u, stages=0)
    if not cfg.tcf:
        attrs = _device_attrs(cupy.cuda.Device().id)
        kern = _compile.get_kernel("tsm2l", tsm2l_name(cfg, dtype, lay))
        resident = _blocks_per_sm(kern, cfg.t1, 0, attrs) * attrs["sm_count"]
        ntile = -(-m // tsm2l_rows(cfg, lay))
        cfg = replace(cfg, tcf=max(1, -(-ntile // resident)))
    return cfg


# tsm2l_opt1d holds VEC x KT values of A per thread in registers: at most this many
# registers' worth (64 float32 or 32 float64 values), beside VEC x TN sums.
OPT1D_A_REGS = 64


def opt1d_fits(k: int, n: int, dtype, lay: ALayout) -> bool:
    """Whether tsm2l_opt1d can run this problem: column-major A, k and n <= 16."""
    return lay.col and k <= 16 and n <= 16


def _resolve_opt1d(m, k, n, dtype, lay: ALayout, cfg: TSM2LConfig, t2: int) -> TSM2LConfig:
    import cupy

    itemsize = np.dtype(dtype).itemsize
    if cfg.opt != 1 or not opt1d_fits(k, n, dtype, lay) or cfg.stages or t2 < n or t2 > 16 \
            or cfg.warp == 1:
        raise ValueError("direct=1 (tsm2l_opt1d) needs opt=1, a column-major A, k <= 16, n <= t2 <= 16 "
                         "and no stages or warp of its own")
    kt = cfg.kt or _pow2_at_least(k)
    if kt < k or kt > 16:
        raise ValueError(f"tsm2l_opt1d needs k <= kt <= 16 (k={k}, kt={kt})")
    regs = OPT1D_A_REGS * 4 // itemsize  # elements of A a thread may hold
    vec = cfg.vec or max(1, min(lay.vec, regs // kt))
    if vec > lay.vec or vec * kt * itemsize > OPT1D_A_REGS * 4:
        raise ValueError(f"tsm2l_opt1d: vec={vec} exceeds A's alignment ({lay.vec}) or the register budget")
    t1 = cfg.t1 or 128
    if t1 not in T1_VALUES:
        raise ValueError(f"t1 must be one of {T1_VALUES}, not {t1}")
    if not cfg.t1 and not cfg.vec:  # small grids: fewer threads per block, rows per thread kept
        t1, vec = _small_grid_tile(m, t1, vec, False)
    cfg = replace(cfg, t1=t1, t2=t2, kt=kt, vec=vec, stage=cfg.stage or 1, stages=0)
    if not cfg.tcf:
        attrs = _device_attrs(cupy.cuda.Device().id)
        kern = _compile.get_kernel("tsm2l", tsm2l_name(cfg, dtype, lay))
        per_sm = _blocks_per_sm(kern, cfg.t1, tsm2l_smem_bytes(cfg, itemsize, lay), attrs)
        ntile = -(-m // tsm2l_rows(cfg, lay))
        cfg = replace(cfg, tcf=max(1, -(-ntile // (per_sm * attrs["sm_count"]))))
    return cfg


def launch_tsm2l(A, B, C, alpha: float, beta: float, cfg: TSM2LConfig | None = None, *,
                 tuned: bool = True) -> TSM2LConfig:
    """C = alpha * A @ B + beta * C with a TSM2L kernel. Returns the configuration used.
    tuned=False ignores the tuner's choices (the TSM2L profile times the defaults)."""
    m, k, n, dtype, lay, A, key = _problem("l", A, B, cfg)
    if not tuned:
        key += ("untuned",)
    hit = _resolved.get(key)
    if hit is None:
        if tuned and _tuner is not None and (cfg is None or cfg in (TSM2LConfig(), TSM2LConfig(opt=2))):
            t = _tuner("tsm2l", A, B, m, k, n, dtype, lay)  # a default launch
            if t is not None and t.opt == (cfg or TSM2LConfig()).opt:
                cfg = t
        rcfg = resolve_tsm2l(m, k, n, dtype, lay, cfg)
        kern = _compile.get_kernel("tsm2l", tsm2l_name(rcfg, dtype, lay))
        smem = tsm2l_smem_bytes(rcfg, dtype.itemsize, lay)
        if smem > 48 * 1024:
            kern.max_dynamic_shared_size_bytes = smem
        grid = max(1, -(-(-(-m // tsm2l_rows(rcfg, lay))) // rcfg.tcf))
        hit = _resolved[key] = (rcfg, kern, smem, grid)
    rcfg, kern, smem, grid = hit
    sb0, sb1 = _strides(B)
    sc0, sc1 = _strides(C)
    sc = dtype.type
    i64, i32 = np.int64, np.int32
    kern((grid,), (rcfg.t1,),
         (A, i64(lay.lda), B, i64(sb0), i64(sb1), C, i64(sc0), i64(sc1),
          i32(m), i32(n), i32(k), sc(alpha), sc(beta)), shared_mem=smem)
    return rcfg


# Resolved launches, keyed by device, problem, layout and requested configuration:
# the planning work (occupancy, split-K) is done once per shape, not once per call.
_resolved: dict = {}

# The lookup of tuned configurations for default launches,
# ``tuner(family, A, B, m, k, n, dtype, lay) -> config or None``: handed over by the
# API (tsm2/api.py hands the autotuner's ``tuned``); None launches the defaults.
_tuner = None


def use_tuner(fn) -> None:
    """Consult ``fn`` for the configuration of default launches from now on (None:
    never); launches resolved before are resolved again."""
    global _tuner
    _tuner = fn
    _resolved.clear()


def forget_resolved() -> None:
    """Drop the resolved launches (after the tuner kept a new configuration)."""
    _resolved.clear()
