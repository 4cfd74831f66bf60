"""The version a float32 or float64 batch runs: a cost model fitted to measured times.

Every kernel version of ``batched.cu`` computes the same product; they differ in
tile types, blocks per SM and whether tiles run on the tensor cores, so the best
one depends on the batch. `choose_version` picks from the strides and dtype alone
(version 0 for strides too large for int offsets, 2 for float64 on DMMA);
`settle_version` then compares the plans of the candidate float32 versions (1, 3
and 5) with `plan_cost`, a makespan model whose per-tile costs (`TILE_COSTS`) were
fitted to device times on the H100.

The ``TSM_BATCHED_TC``, ``TSM_BATCHED_WIDE`` and ``TSM_BATCHED_TC3`` switches
(`tc_default`, `wide_default`, `tc3_default`) narrow the candidates. Imports the
planner only, never a launcher.
"""

from __future__ import annotations

import heapq

import numpy as np

from tsm_core.batched.plan import (ACC_MIN_K, N_COST_CLASSES, TC3_CLASS, TILE_COSTS,
                                   ACC_SPLIT_AREA, BK, DEFAULT_VERSION, SPLIT_TILE_COST,
                                   TC3_VERSION, TC3_VERSIONS, TC_MIN_K, TILE_TYPES,
                                   V1_MAX_STRIDE, WIDE_TYPE, WIDE_VERSION, XL_TYPE,
                                   _F32, _F64, _TM, _TN, wave_makespan)
from tsm_core.runtime import config as _config

# Whether batches run version 2 by default, per dtype (``TSM_BATCHED_TC=1`` / ``0``
# sets both). Measured on the H100 (2026-11-23):
# - float64 (DMMA): 1.06-1.99x faster than version 1 in device time, geomean 1.56x
#   over seven cells of the paper's sweep: on.
# - float32 (3xTF32): 0.65-1.17x of version 1, geomean 0.91x over the 72 cells of
#   the batched bench (two blocks per SM instead of three, and the register-staged
#   fetch, not the FMAs, bound these tiles): off.
TC_DEFAULT = {"float32": False, "float64": True}

# The share rules that chose versions 3 and 5 before the cost model (`wide_pays`,
# `tc3_pays`; the bench still reports them). Version 3 where its plan put at least
# WIDE_MIN_SHARE of the FLOPs in 128 x 64 tiles and had at least WIDE_MIN_WAVES
# full waves of them (blocks resident at once). Measured on the H100 (2026-11-23,
# device time over version 1, the 72 cells of the batched bench): the 18 cells past
# both bounds read 1.05-1.32x; with fewer 128 x 64 tiles than a wave, a few long
# blocks can make the tail (down to 0.69x), and with none at all version 3 reads
# 0.94-1.02x (its register spills). Version 4 is taken on request only: on uniform
# batches of 256-1024 rows it read 1.14-1.24x over version 1 against version 3's
# 1.13-1.26x, ahead in two cases of five (multiples of 128, K >= 256), and on the
# sweep 0.89x (two blocks per SM slow the small tiles). With split-K (2026-11-24)
# the long tiles of a plan under a wave no longer make the tail (1024 / 512 / 8:
# 0.76x before, 1.11x after; 512 / 512 / 16: 0.74x, 1.07x), so a third of a wave
# suffices: the nine cells this adds read 0.98-1.20x over version 1 (geomean over
# the sweep 1.012x); the cells under 0.3 of a wave where version 3 has wide tiles
# read 0.84-1.03x.
WIDE_MIN_SHARE = 0.2
WIDE_MIN_WAVES = 0.3
# Version 5 where its plan put at least TC3_MIN_SHARE of the work in at least
# TC3_MIN_WAVES waves of tensor-core tiles (128 x 128, K >= TC_MIN_K). Measured on
# the H100 (2026-11-24, device time, the sweep's cells of 512 rows and more): the
# six cells past both bounds read 1.014-1.105x over the version chosen before (1 or
# 3); elsewhere version 5 read 0.69-1.18x of it (its small tiles at two blocks per
# SM), so it is not taken there.
TC3_MIN_SHARE = 0.45
TC3_MIN_WAVES = 2.0


def tc_default(dtype=np.float64) -> bool:
    """Whether batches of `dtype` take version 2 (the tensor cores) by default
    (``TSM_BATCHED_TC=1`` / ``0`` sets both dtypes; else `TC_DEFAULT`)."""
    v = _config.flag("TSM_BATCHED_TC")
    return TC_DEFAULT[np.dtype(dtype).name] if v is None else v


def wide_default() -> bool:
    """Whether float32 batches may take version 3 (``TSM_BATCHED_WIDE=0`` keeps them
    on version 1; on by default)."""
    return _config.flag("TSM_BATCHED_WIDE")


def tc3_default() -> bool:
    """Whether float32 batches may take version 5 (``TSM_BATCHED_TC3=0`` keeps them
    on versions 1 and 3; on by default)."""
    return _config.flag("TSM_BATCHED_TC3")


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
    """The share rule that chose version 5 before `plan_cost` (the bench still
    reports it): at least TC3_MIN_SHARE of the plan's work in at least
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
    """The share rule that chose version 3 before `plan_cost` (the bench still
    reports it): at least WIDE_MIN_SHARE of the plan's work in at least
    WIDE_MIN_WAVES waves of 128 x 64 tiles."""
    r = plan.residency
    wave = max(1, r.sm_count * r.blocks_per_sm)
    n = int(np.sum(plan.tiles[:, 3] == WIDE_TYPE)) if plan.n_tiles else 0
    return n >= WIDE_MIN_WAVES * wave and plan_type_share(plan, WIDE_TYPE) >= WIDE_MIN_SHARE


# The cost model's tile classes and fitted costs (N_COST_CLASSES, TC3_CLASS,
# TILE_COSTS) live in plan.py, whose split rule reads them; imported above.


def _tile_classes(plan) -> np.ndarray:
    t = plan.tiles
    cls = t[:, 3].astype(np.int64)
    if plan.version in TC3_VERSIONS:
        cls = np.where((cls == XL_TYPE) & (plan.shapes[t[:, 0], 2] >= TC_MIN_K), TC3_CLASS, cls)
    return cls


def schedule(cost: np.ndarray, slots: int):
    """Greedy list scheduling of `cost` (in order) on `slots` identical slots: (slot of
    each tile, finish time of each slot)."""
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
    slot, finish = schedule(cost, max(1, r.sm_count * r.blocks_per_sm))
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


def choose_version(meta_rows, dtype=None):
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


# float64 with long K and small outputs: version 2 (DMMA, float64's default) cannot
# split K, so such a problem's sums run the whole K, where cuBLAS splits it: measured
# on the H100 (2026-11-28) 65 x 55 x 8192 at 6.7e-15 against cuBLAS's 6.3e-16, while
# version 1 (FMA tiles, splits K) had 1.43e-15 at K = 8192 against cuBLAS's 1.95e-15.
# A float64 batch with such a problem (one the planner's accuracy rules may split:
# K >= ACC_MIN_K and M N <= ACC_SPLIT_AREA) runs version 1, whose plan splits those
# problems, where `f64_time` finds version 1's plan at most F64_SPLIT_TOL slower than
# version 2's. There are no fitted float64 tile costs: the model is the planner's
# (outputs per thread times k plus SPLIT_TILE_COST a tile, list-scheduled), with
# version 2's tensor-core tiles (32 rows or more) F64_DMMA_SPEEDUP times faster a k. Where the batch leaves block slots idle, version 2's long tiles
# hold the launch and version 1's splits spread them; where its large problems fill
# the GPU, DMMA's rate decides and the small problems keep one sum.
F64_DMMA_SPEEDUP = 1.56  # version 2 over version 1, float64, geomean (H100, 2026-11-23)
# Accuracy first within this much modelled time: the accuracy bench's float64 batches
# model at 1.02x (K = 1024) and 1.16x (K = 8192, with 65 x 55 x 8192) on version 1; a
# batch of large products (4096^3 beside small ones, or 2048^3 ones) at 1.56-1.58x
# keeps DMMA. The model is not fitted to float64 times: to be measured.
F64_SPLIT_TOL = 0.25


def f64_wants_split(shapes) -> bool:
    """Whether a float64 batch has a problem the planner's accuracy rules may split:
    K >= ACC_MIN_K with at most ACC_SPLIT_AREA outputs.

    Parameters
    ----------
    shapes : array_like of int, shape (P, 3)
        (M, N, K) of each problem.

    Returns
    -------
    bool

    Examples
    --------
    >>> from tsm_core.batched import cost
    >>> cost.f64_wants_split([(65, 55, 8192), (300, 300, 300)])
    True
    >>> cost.f64_wants_split([(2048, 2048, 2048), (300, 300, 300)])
    False
    """
    s = np.asarray(shapes, dtype=np.int64).reshape(-1, 3)
    M, N, K = s[:, 0], s[:, 1], s[:, 2]
    return bool(np.any((M > 0) & (N > 0) & (K >= ACC_MIN_K) & (M * N <= ACC_SPLIT_AREA)))


def f64_time(plan) -> float:
    """The model of a float64 plan's time (see F64_DMMA_SPEEDUP), in FMAs per thread:
    per tile, outputs per thread times its chunk of k (over F64_DMMA_SPEEDUP for
    version 2's tiles of 32 rows or more) plus SPLIT_TILE_COST, list-scheduled on the
    GPU's block slots."""
    if not plan.n_tiles:
        return 0.0
    ty = plan.tiles[:, 3].astype(np.int64)
    per_k = np.array([t.outputs_per_thread for t in TILE_TYPES], dtype=np.float64)[ty]
    if plan.version == 2:
        per_k = np.where(ty >= 2, per_k / F64_DMMA_SPEEDUP, per_k)
    r = plan.residency
    return wave_makespan(per_k * plan.tile_k + SPLIT_TILE_COST,
                         r.sm_count * max(1, r.blocks_per_sm))


def settle_version(version, shapes, dtype, plan_of, tc_ok=True):
    """The automatic choice, refined by the plans (`plan_of(v)`, cached by the
    caller) of `choose_version`'s pick:

    - version 2 in float32 falls back to 1 where the planner shrank the tiles off
      the tensor cores (`plan_tc_share` < 0.5);
    - version 2 in float64 falls back to 1 where a problem has long K and few
      outputs (`f64_wants_split`), version 1's plan splits K (version 2 cannot) and
      `f64_time` finds it at most F64_SPLIT_TOL slower than version 2's;
    - float32 version 1 becomes whichever of 1, 3 and 5 has the least modelled time
      (`plan_cost`): 3 unless `wide_default` says no, and only where some problem
      has 128 rows and 64 columns (else its plan is version 1's); 5 on a GPU with
      tensor cores (`tc_ok`) unless `tc3_default` says no.
    """
    f32 = np.dtype(dtype) == _F32
    if version == 2 and f32 and plan_tc_share(plan_of(2)) < 0.5:
        version = DEFAULT_VERSION
    if version == 2 and not f32 and f64_wants_split(shapes):
        p1 = plan_of(DEFAULT_VERSION)
        if p1.split_problems and f64_time(p1) <= f64_time(plan_of(2)) * (1 + F64_SPLIT_TOL):
            version = DEFAULT_VERSION  # (never where version 1 would not split: split-K off)
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


# A batch of one problem goes to one cuBLAS call (batched_matmul, automatic version
# only, every operand in a layout cuBLAS takes in place): one product is the vendor
# library's own case, and our kernel ran it at 0.96x of a CUDA-graph-replayed
# torch.matmul (measured on the H100, 2026-11-27); the kernel's tiling earns its keep
# only where problems share the launch. Off for batches of more problems: a problem
# that dominates its batch still shares the launch with the others (two launches in
# a row would serialise what one launch overlaps).
CUBLAS_MAX_PROBLEMS = 1


def cublas_pays(shapes) -> bool:
    """Whether the cost model hands the batch `shapes` ((P, 3) of (M, N, K)) to one
    cuBLAS call: a batch of CUBLAS_MAX_PROBLEMS problem with a non-empty product."""
    s = np.asarray(shapes, dtype=np.int64).reshape(-1, 3)
    return 1 <= len(s) <= CUBLAS_MAX_PROBLEMS and bool(np.all(s > 0))
