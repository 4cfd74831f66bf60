"""The paper's performance model and parameter choice (Chen et al., TSM2X, 3.1.8-3.2).

Plain functions, one per formula of section 3.1.8, then Algorithm 5 (t2, t3 by
gradient descent), a model for TSM2L's tcf, and `plan()` (which algorithm, which
parameters, what time to expect, and why). Pure: it imports no launcher and times
nothing. A measured TSM2L profile enters through ``plan(..., profile=...)``, by
default the figures already stored on disk (``tsm2/profile.py``). Nothing here
needs a GPU when a `DeviceSpec` is passed in (e.g. ``KNOWN_GPUS["H100"]``); with
none, and no GPU found, it plans for the reference GPU
(``runtime.device.REFERENCE_GPU``) and says so.

Units: bytes, seconds, FLOP (a fused multiply-add counts 2), threads.

Examples
--------
>>> from tsm_core.runtime.device import KNOWN_GPUS
>>> from tsm_core.tsm2 import model
>>> p = model.plan(20480, 20480, 8, "float64", spec=KNOWN_GPUS["H100"])
>>> p.algorithm, p.t2, p.bound
('tsm2r', 8, 'memory')
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from dataclasses import asdict, dataclass, field

import numpy as np

from tsm_core.runtime import device as _device
from tsm_core.runtime.arrays import has_gpu
from tsm_core.runtime.device import DeviceSpec
from tsm_core.tsm2 import profile as _profile
from tsm_core.tsm2.configs import TSM2L_KMAX, V3D_N2_MIN_ELEMS

__all__ = [
    "Plan", "algorithm5", "algorithm5_detail", "choose_tcf", "max_occupancy",
    "neighbourhood", "plan", "regs_per_thread", "smem_per_thread", "t2_threshold",
    "util_comp", "util_mem",
]

# What the kernels accept (their template parameters in tsm2r.cu and tsm2l.cu).
T1_CHOICES = (64, 128, 256)
T2_CHOICES = (1, 2, 4, 8, 16)
T3_CHOICES = (1, 2, 4, 8, 16)
TCF_CHOICES = (1, 2, 4, 8, 16, 32, 64)
T2_MAX, T3_MAX = T2_CHOICES[-1], T3_CHOICES[-1]

# Classification (the bounds are this module's choice):
SKINNY_MAX = 64        # n (TSM2R) at most this
TSM2L_MAX = TSM2L_KMAX # k and n (TSM2L) at most this: opt1 keeps a k x n chunk of B and a
                       # whole row tile of A in shared memory (tsm2/tsm2l.cu)
TSM2R_MIN_K = 256      # TSM2R needs k >= 256: at least one full t1 tile of B per block
# Where cuBLAS wins, measured on the H100 (a sweep of TSM shapes against cuBLAS,
# 2026-11-22): with m small cuBLAS's own split-K GEMV-like kernels beat a launch
# that has few row blocks; with n > 16 TSM2R reads A more than once; TSM2L pays
# off only once A is tall enough to stream. These keep matmul() off those shapes.
AUTO_TSM2R_MIN_M = 8192
AUTO_TSM2R_MIN_K = 1024
AUTO_TSM2R_MAX_N = 16
AUTO_TSM2L_MIN_M = 65536
AUTO_TSM2L_MAX_KN = 16
TSM2L_MIN_M_RATIO = 8  # TSM2L needs m >= 8 * max(k, n): A really tall
SPLITK_MIN_DEPTH = 256 # each split-K slice keeps at least this much of k
WAVES = 2              # blocks for two full waves: the second hides the first's tail
# A TSM shape still goes to cuBLAS when the model predicts the TSM kernel slower than
# this many times cuBLAS's roofline. Not 1: on our H100 cuBLAS reaches only 20-95% of
# the roofline on tall-and-skinny shapes (measured 2026-11-22), so two
# passes over A (n in 17..32) stay with TSM2R and three or more go to cuBLAS.
CUBLAS_MARGIN = 2.5

# C of R_thread (section 3.1.8): registers a thread holds whatever t2 and t3 are
# (indices, pointers, loop counters, alpha/beta). The paper gets it by offline
# profiling; 32 is what ptxas reports for the index arithmetic of kernels of this
# shape (64-bit offsets). A measured count overrides the whole formula.
DEFAULT_REG_OVERHEAD = 32
BYTES_PER_REGISTER = 4

# Algorithm 5's gradient descent (section 3.1.9): "initial value of both t2 and t3
# to be 1, and step size to be 0.1. The stop threshold is set to be 1e-4".
GD_INIT, GD_STEP, GD_TOL, GD_MAX_ITER = 1.0, 0.1, 1e-4, 10_000


def _dtype(dtype) -> np.dtype:
    dt = np.dtype(dtype)
    if dt not in (np.float32, np.float64):
        raise TypeError(f"tsm_core: the planner models float32 and float64, not {dt}")
    return dt


def _pow2_ceil(x: float) -> int:
    return 1 if x <= 1 else 1 << math.ceil(math.log2(x) - 1e-12)


def _pow2_floor(x: float) -> int:
    return 1 if x < 2 else 1 << int(math.floor(math.log2(x) + 1e-12))


# ---------------------------------------------------------------- section 3.1.8


def t2_threshold(spec: DeviceSpec, dtype) -> float:
    """t2^threshold = PeakPerf / PeakBand x bytes_per_elem (section 3.1.8, Table 1).

    Columns of C per pass above which a TSM2R pass is compute-bound (ratio r > 1).
    The paper's formula as printed (its r counts t2 operations per element of A);
    it reproduces the thresholds the paper quotes (K40c ~40, M40 ~6, P100 ~50,
    V100 ~70, A100 ~50, double precision).
    """
    dt = _dtype(dtype)
    return spec.peak_flops(dt) / spec.peak_bw * dt.itemsize


def regs_per_thread(t2, t3, dtype, C: float = DEFAULT_REG_OVERHEAD, *,
                    rows_per_thread: int = 1, elems_per_access: int = 1,
                    measured: float | None = None) -> float:
    """R_thread = (3 t2 + 2 t3) x bytes_per_element / bytes_per_register + C (3.1.8).

    The paper's three sets of t2 registers are next-B, current-B and the C
    accumulators; the two sets of t3 are current-A and next-A. Our vectorised
    kernels generalise it: a thread owning ``rows_per_thread`` rows keeps that many
    accumulator sets, and each of its t3 loads brings ``elems_per_access`` elements
    (a 16-byte vector), so R = (2 t2 + rows t2 + 2 t3 elems) x b/4 + C; both 1 give
    the paper's formula. ``measured`` (e.g. from the compiler's resource report)
    replaces the estimate.
    """
    if measured is not None:
        return float(measured)
    b = _dtype(dtype).itemsize
    return (2 * t2 + rows_per_thread * t2 + 2 * t3 * elems_per_access) * b / BYTES_PER_REGISTER + C


def smem_per_thread(t2, dtype) -> float:
    """S_thread = t2 x bytes_per_element (3.1.8): a t1 x t2 tile of B over t1 threads."""
    return t2 * _dtype(dtype).itemsize


def max_occupancy(spec: DeviceSpec, regs: float, smem: float) -> float:
    """MaxOccup_SM = min(HW_MAX, R_SM / R_thread, S_SM / S_thread), in threads (3.1.8).

    Continuous, as in the paper: the gradient descent needs it smooth. `plan()`
    rounds it down to whole blocks.
    """
    by_regs = spec.regs_per_sm / regs if regs > 0 else math.inf
    by_smem = spec.smem_per_sm / smem if smem > 0 else math.inf
    return float(min(spec.max_threads_per_sm, by_regs, by_smem))


def util_mem(spec: DeviceSpec, occupancy: float, t3: float, dtype, *,
             bytes_per_access: float | None = None) -> float:
    """Util_mem by Little's law (3.1.8, item 2).

    Concurrent_mem = MaxOccup_SM x t3 loads in flight per SM, each of
    ``bytes_per_access`` bytes (the element size in the paper; 16 for our
    vectorised loads). Throughput_max_mem = PeakBand / (#SM x clock) bytes per cycle
    per SM; Concurrent_max_mem = latency_mem x Throughput_max_mem bytes must be in
    flight to reach it. Util_mem = min(1, Concurrent_mem / Concurrent_max_mem).
    """
    bpa = _dtype(dtype).itemsize if bytes_per_access is None else bytes_per_access
    in_flight = occupancy * t3 * bpa
    throughput_max = spec.peak_bw / (spec.sm_count * spec.clock_hz)
    needed = spec.mem_latency_cycles * throughput_max
    return min(1.0, in_flight / needed)


def util_comp(spec: DeviceSpec, occupancy: float, t2: float, t3: float, dtype) -> float:
    """Util_comp by Little's law (3.1.8, item 3).

    Concurrent_comp = MaxOccup_SM x t3 x t2 independent FMAs per SM, counted here as
    2 FLOP each so that it has the unit of PeakPerf; Throughput_max_comp = PeakPerf /
    (#SM x clock); Concurrent_max_comp = latency_comp x Throughput_max_comp.
    """
    in_flight = occupancy * t3 * t2 * 2
    throughput_max = spec.peak_flops(dtype) / (spec.sm_count * spec.clock_hz)
    needed = spec.comp_latency_cycles * throughput_max
    return min(1.0, in_flight / needed)


# ---------------------------------------------------------------- Algorithm 5


@dataclass(frozen=True)
class _Layout:
    """How a kernel maps rows and loads: what the model needs of the data layout."""
    rows_per_thread: int = 1
    elems_per_access: int = 1
    bytes_per_access: int | None = None   # None: the element size (the paper)
    reg_overhead: float = DEFAULT_REG_OVERHEAD
    measured_regs: float | None = None


def _occupancy(spec, t2, t3, dt, lay: _Layout) -> float:
    regs = regs_per_thread(t2, t3, dt, lay.reg_overhead, rows_per_thread=lay.rows_per_thread,
                           elems_per_access=lay.elems_per_access, measured=lay.measured_regs)
    return max_occupancy(spec, regs, smem_per_thread(t2, dt))


def _time_mem(spec, m, k, n, dt, t2, t3, lay) -> float:
    """Algorithm 5 lines 2-4: Total_memory / (PeakBand x Util_mem), A only."""
    occ = _occupancy(spec, t2, t3, dt, lay)
    u = util_mem(spec, occ, t3, dt, bytes_per_access=lay.bytes_per_access)
    return m * k * (n / t2) * dt.itemsize / (spec.peak_bw * u)


def _time_comp(spec, m, k, n, dt, t2, t3, lay) -> float:
    """Algorithm 5 lines 7-9: Total_flops / (PeakPerf x Util_comp)."""
    occ = _occupancy(spec, t2, t3, dt, lay)
    u = util_comp(spec, occ, t2, t3, dt)
    return 2.0 * m * k * n / (spec.peak_flops(dt) * u)


def _gradient_descent(f, lo, hi, *, x0=GD_INIT, step=GD_STEP, tol=GD_TOL,
                      max_iter=GD_MAX_ITER):
    """Projected gradient descent of f(t2, t3) inside the box [lo, hi].

    The paper gives the constants (start 1, step 0.1, stop 1e-4) but not the
    coordinates. In seconds the gradient is ~1e-3 x step and the descent would never
    move, so it descends log f over (log t2, log t3): scale-free, and a step of 0.1
    changes a parameter by ~10%. The gradient is numerical (central differences,
    one-sided at a bound); the descent stops when a projected step moves less than
    `tol`. Returns (t2, t3, f(t2, t3), iterations).
    """
    ulo = [math.log(v) for v in lo]
    uhi = [math.log(v) for v in hi]
    clamp = lambda u: [min(max(ui, a), b) for ui, a, b in zip(u, ulo, uhi)]
    g = lambda u: math.log(f(math.exp(u[0]), math.exp(u[1])))
    u = clamp([math.log(x0), math.log(x0)])
    h = 1e-4
    it = 0
    for it in range(1, max_iter + 1):
        grad = []
        for i in range(2):
            up, dn = list(u), list(u)
            up[i] = min(u[i] + h, uhi[i])
            dn[i] = max(u[i] - h, ulo[i])
            width = up[i] - dn[i]
            grad.append((g(up) - g(dn)) / width if width > 0 else 0.0)
        new = clamp([ui - step * gi for ui, gi in zip(u, grad)])
        moved = math.hypot(new[0] - u[0], new[1] - u[1])
        u = new
        if moved < tol:
            break
    t2, t3 = math.exp(u[0]), math.exp(u[1])
    return t2, t3, f(t2, t3), it


@dataclass(frozen=True)
class Alg5Result:
    """What Algorithm 5 decided, with the working shown."""
    t2: int                  # snapped to the kernels' values
    t3: int
    bound: str               # "memory" | "compute": the paper's r at the final t2
    branch: str              # "memory" (n <= threshold, line 1) or "compute" (line 6)
    t2_threshold: float
    t2_cont: float           # the descent's result before rounding
    t3_cont: float
    time_s: float            # the winning branch objective at (t2_cont, t3_cont)
    iterations: int


def _snap(t2c, t3c, n, k, objective) -> tuple[int, int]:
    """Round (paper: "to the nearest integers"), then snap to the kernels' values.

    t2 rounds to the nearest integer, as in the paper. t3 takes whichever of its two
    integer neighbours the objective prefers (the smaller on a tie): the descent
    stops just past the point where Util_mem saturates, and rounding 1.45 down to 1
    would give back a third of the bandwidth the model just found.
    Then, as the kernels allow: t2 the next power of two, at most 16 and at
    most n rounded up to a power of two (one pass with masked columns beats two
    passes); t3 the next power of two, at most 16 and at most k rounded down to a
    power of two (a whole group of loads fits in k).
    """
    t2i = max(1, round(t2c))
    lo, hi = max(1, math.floor(t3c)), max(1, math.ceil(t3c))
    t3i = lo if objective(t2c, lo) <= objective(t2c, hi) else hi
    t2 = min(T2_MAX, _pow2_ceil(n), _pow2_ceil(t2i))
    t3 = min(T3_MAX, _pow2_floor(max(1, k)), _pow2_ceil(t3i))
    return t2, t3


@functools.lru_cache(maxsize=1024)
def _alg5_cached(spec, m, k, n, dtname, lay) -> Alg5Result:
    dt = np.dtype(dtname)
    thr = t2_threshold(spec, dt)
    t3_hi = float(min(T3_MAX, _pow2_floor(max(1, k))))
    tmem = lambda a, b: _time_mem(spec, m, k, n, dt, a, b, lay)
    tcomp = lambda a, b: _time_comp(spec, m, k, n, dt, a, b, lay)
    if n <= thr:
        # Lines 1-5: memory-bound problem; keep it memory-bound, 1 <= t2 <= n.
        t2c, t3c, tm, it = _gradient_descent(tmem, (1.0, 1.0), (float(n), t3_hi))
        branch, objective = "memory", tmem
    else:
        # Lines 6-21: compute-bound problem. The paper's line 9 bounds t2 by k and
        # line 12 counts n x n x k / t2 bytes; both read as typos (3.1.9's text
        # says thr <= t2 <= n, and line 2 counts m x k x n / t2), fixed here.
        a2, a3, time1, it1 = _gradient_descent(tcomp, (max(1.0, thr), 1.0), (float(n), t3_hi))
        b2, b3, time2, it2 = _gradient_descent(tmem, (1.0, 1.0), (max(1.0, thr), t3_hi))
        it = it1 + it2
        if time1 < time2:  # line 17
            t2c, t3c, tm, objective = a2, a3, time1, tcomp
        else:
            t2c, t3c, tm, objective = b2, b3, time2, tmem
        branch = "compute"
    t2, t3 = _snap(t2c, t3c, n, k, objective)
    # Section 3.1.8 item 4: r = t2 / threshold; r > 1 is compute-bound.
    bound = "compute" if t2 > thr else "memory"
    return Alg5Result(t2, t3, bound, branch, thr, t2c, t3c, tm, it)


def algorithm5_detail(spec: DeviceSpec, m: int, k: int, n: int, dtype, *,
                      bytes_per_access: int | None = None, rows_per_thread: int = 1,
                      elems_per_access: int = 1, reg_overhead: float = DEFAULT_REG_OVERHEAD,
                      measured_regs: float | None = None) -> Alg5Result:
    """Algorithm 5 with its working (branch, continuous optimum, iterations)."""
    dt = _dtype(dtype)
    if min(m, k, n) < 1:
        raise ValueError(f"tsm_core: algorithm5 needs m, k, n >= 1, got {(m, k, n)}")
    lay = _Layout(rows_per_thread, elems_per_access, bytes_per_access, reg_overhead,
                  measured_regs)
    return _alg5_cached(spec, int(m), int(k), int(n), dt.name, lay)


def algorithm5(spec: DeviceSpec, m: int, k: int, n: int, dtype, **layout) -> tuple[int, int, str]:
    """The paper's Algorithm 5: (t2, t3, bound) for TSM2R.

    Line 1 compares n with t2_threshold. Memory-bound: gradient descent of
    Total_memory / (PeakBand x Util_mem) over 1 <= t2 <= n, 1 <= t3. Compute-bound:
    descend Total_flops / (PeakPerf x Util_comp) over threshold <= t2 <= n, and the
    memory time over 1 <= t2 <= threshold, keep the faster (line 17). t3 is also
    bounded above by the kernels' largest value (16) and by k: the paper leaves it
    unbounded, and the descent would otherwise run on wherever the model is flat.
    Rounded, then snapped to the kernels' values. `bound` is the paper's r at the
    final t2. Keyword arguments describe the kernel's layout (see
    `algorithm5_detail`).
    """
    r = algorithm5_detail(spec, m, k, n, dtype, **layout)
    return r.t2, r.t3, r.bound


# ---------------------------------------------------------------- TSM2L: tcf


def choose_tcf(spec: DeviceSpec, m: int, k: int, n: int, dtype, *, order=("C", "C"),
               occupancy: float | None = None, waves: int = WAVES) -> int:
    """Thread count factor of TSM2L (section 3.2.2): m / tcf threads are launched.

    The paper picks tcf by offline profiling (its Figure 5: on V100 with m = 1e7
    the speed holds up to tcf = 64). Model used here: fewer threads, each walking
    more row tiles, trade warp latency for memory latency, which pays as long as
    the GPU stays full. So take the largest tcf in {1, ..., 64} whose launch still
    makes `waves` waves of full occupancy:
    threads = m / (tcf x rows_per_thread) >= #SM x MaxOccup_SM x waves.
    """
    dt = _dtype(dtype)
    lay = _layout_for(tuple(_order(o) for o in order), dt)
    if occupancy is None:
        t2, t3, _ = algorithm5(spec, m, k, n, dt, **_lay_kwargs(lay))
        occupancy = _occupancy(spec, t2, t3, dt, lay)
    full = spec.sm_count * occupancy * waves
    for tcf in reversed(TCF_CHOICES):
        if math.ceil(m / (tcf * lay.rows_per_thread)) >= full:
            return tcf
    return 1


# ---------------------------------------------------------------- plan


@dataclass(frozen=True)
class Plan:
    """What `plan()` decided for C = alpha A @ B + beta C, and why.

    A has shape (m, k), B (k, n), C (m, n). Frozen and hashable (``details`` does
    not take part in comparisons). Kernel parameters that do not apply to the
    algorithm are None. Made by ``tsm_core.plan``, not by hand.

    Parameters
    ----------
    algorithm : {"tsm2r", "tsm2l", "cublas"}
        What runs.
    version : int or None
        TSM2R: 3 (the prefetching kernel); TSM2L: opt 1 or 2.
    dtype : str
        "float32" or "float64".
    m, k, n : int
        The problem's sizes.
    a_order, b_order : {"C", "F"}
        The memory orders of A and B.
    t1, t2, t3, tcf : int or None
        Threads per block, columns of C per pass, loads of A in flight per thread,
        TSM2L's thread count factor (m / tcf threads launched).
    splits : int
        TSM2R's split-K factor (1: none).
    bound : {"memory", "compute", "latency"}
        What limits the predicted time.
    t2_threshold : float
        Peak FLOP/s / peak bytes/s x element size (section 3.1.8).
    occupancy : float or None
        Resident threads per SM the launch gets.
    util_mem, util_comp : float
        The model's memory and compute utilisation (Little's law).
    bytes, flops : int
        A, B and C moved once (C twice when beta != 0); 2 m n k.
    predicted_time_s, predicted_bw : float
        The model's time and bytes / time.
    reason : str
        Why this algorithm, in one sentence.
    spec_name : str
        The GPU planned for.
    details : dict
        The model's working (memory, compute, launch and reduction times,
        traffic, passes, the descent's continuous optimum, the TSM2L profile).
    note : str
        Why the plan is for a GPU other than the caller's (no GPU found: the
        reference GPU's); empty otherwise.

    Examples
    --------
    >>> import tsm_core
    >>> from tsm_core.runtime.device import KNOWN_GPUS
    >>> p = tsm_core.plan(30720, 30720, 8, "float32", spec=KNOWN_GPUS["H100"])
    >>> p.algorithm, p.version, p.bound
    ('tsm2r', 3, 'memory')
    >>> p.describe().splitlines()[0]  # doctest: +ELLIPSIS
    'TSM2R (tall and skinny on the right), kernel tsm2r_v3x, float32: A (30720 x 30720, ...'
    >>> sorted(p.to_dict())[:3]
    ['a_order', 'algorithm', 'b_order']
    """

    algorithm: str                  # "tsm2r" | "tsm2l" | "cublas"
    version: int | None             # tsm2r: 3; tsm2l: opt 1 or 2
    dtype: str
    m: int
    k: int
    n: int
    a_order: str
    b_order: str
    t1: int | None                  # threads per block (= rows of a B tile)
    t2: int | None                  # columns of C per pass
    t3: int | None                  # loads of A in flight per thread
    tcf: int | None                 # tsm2l: m / tcf threads launched
    splits: int                     # split-K factor (1: none)
    bound: str                      # "memory" | "compute" | "latency"
    t2_threshold: float
    occupancy: float | None         # resident threads per SM the launch gets
    util_mem: float
    util_comp: float
    bytes: int                      # A, B, C once (C twice when beta != 0)
    flops: int                      # 2 m n k
    predicted_time_s: float
    predicted_bw: float             # bytes / predicted_time_s
    reason: str                     # one sentence: why this algorithm
    spec_name: str
    # The model's working: "memory", "compute", "launch", "reduction" (seconds),
    # "traffic" (bytes actually moved: A once per pass), "passes", "rows_per_thread",
    # "occupancy_max" (MaxOccup_SM), "alg5_branch", "alg5_t2"/"alg5_t3" (the
    # descent's continuous optimum); "tsm_time" where a TSM shape went to cuBLAS.
    details: dict = field(default_factory=dict, compare=False, hash=False)
    # Where the plan is for a GPU other than the caller's: why (e.g. no GPU was found
    # and it is the reference GPU's plan); empty otherwise.
    note: str = ""

    def describe(self) -> str:
        """A plain-words account of the plan, several lines (what ``explain`` prints)."""
        return _describe(self)

    def to_dict(self) -> dict:
        """The plan as plain data (JSON-ready)."""
        return asdict(self)


def _layout_for(order, dt) -> _Layout:
    """Our kernels read A in 16-byte vectors in both layouts (tsm2/tsm2r.cu): a
    column-major A gives each thread VEC = 16 / itemsize consecutive rows, a
    row-major A gives it one row read VEC elements at a time."""
    vec = 16 // dt.itemsize
    a_order = order[0]
    return _Layout(rows_per_thread=vec if a_order == "F" else 1, elems_per_access=vec,
                   bytes_per_access=16)


def _lay_kwargs(lay: _Layout) -> dict:
    return dict(bytes_per_access=lay.bytes_per_access, rows_per_thread=lay.rows_per_thread,
                elems_per_access=lay.elems_per_access, reg_overhead=lay.reg_overhead,
                measured_regs=lay.measured_regs)


def _choose_t1(occ_max: float, max_block: int = 1024) -> int:
    """t1: the paper benchmarks the t1 that divide MaxOccup_SM (3.1.9). Model: the
    first of 128, 256, 64 (the paper's usual picks first) whose whole blocks cover
    at least 90% of MaxOccup_SM; else the one that covers most."""
    cands = [t for t in (128, 256, 64) if t <= max_block]
    cover = lambda t: (occ_max // t) * t
    for t in cands:
        if cover(t) >= 0.9 * occ_max:
            return t
    return max(cands, key=cover)


def _classify(m, k, n):
    """(algorithm, reason). The shape rules of the module's constants, made exact."""
    if min(m, k, n) == 0:
        return "cublas", "the product is empty: there is nothing for a kernel to do"
    if n <= SKINNY_MAX and k >= TSM2R_MIN_K and not (
            m >= AUTO_TSM2R_MIN_M and k >= AUTO_TSM2R_MIN_K and n <= AUTO_TSM2R_MAX_N):
        return "cublas", (
            f"B is tall and skinny (n = {n}, k = {k}) but m = {m}, k = {k}, n = {n} lies "
            f"outside where TSM2R beat cuBLAS on the H100 (m >= {AUTO_TSM2R_MIN_M}, "
            f"k >= {AUTO_TSM2R_MIN_K}, n <= {AUTO_TSM2R_MAX_N}), so cuBLAS")
    if k <= TSM2L_MAX and n <= TSM2L_MAX and m >= TSM2L_MIN_M_RATIO * max(k, n) and not (
            m >= AUTO_TSM2L_MIN_M and k <= AUTO_TSM2L_MAX_KN and n <= AUTO_TSM2L_MAX_KN):
        return "cublas", (
            f"A is tall and skinny (m = {m}, k = {k}, n = {n}) but outside where TSM2L beat "
            f"cuBLAS on the H100 (m >= {AUTO_TSM2L_MIN_M}, k and n <= {AUTO_TSM2L_MAX_KN}), "
            f"so cuBLAS")
    if n <= SKINNY_MAX and k >= TSM2R_MIN_K:
        return "tsm2r", (
            f"B is tall and skinny on the right (n = {n} <= {SKINNY_MAX} and k = {k} >= "
            f"{TSM2R_MIN_K}): each thread keeps its rows' n-chunk of C in registers and "
            f"reads A once per chunk, where a general GEMM's tiles would be mostly padding")
    if k <= TSM2L_MAX and n <= TSM2L_MAX and m >= TSM2L_MIN_M_RATIO * max(k, n):
        return "tsm2l", (
            f"A is tall and skinny and B small (k = {k}, n = {n} <= {TSM2L_MAX}, m = {m} "
            f">= {TSM2L_MIN_M_RATIO} x max(k, n)): with so little work per row the launch "
            f"is latency-bound, so TSM2L launches m / tcf threads that each stream tcf rows")
    if n > SKINNY_MAX:
        why = (f"n = {n} > {SKINNY_MAX}: a thread cannot keep a row of C in registers, and "
               f"a 2-D tiled GEMM reuses both A and B")
    elif k > SKINNY_MAX:
        why = (f"k = {k} lies between {SKINNY_MAX + 1} and {TSM2R_MIN_K - 1}: too short "
               f"for TSM2R to amortise its tiles of B, too long for TSM2L's small B")
    else:
        why = (f"m = {m} < {TSM2L_MIN_M_RATIO} x max(k, n): the problem is too small for "
               f"a specialised kernel to matter; launch overhead dominates either way")
    return "cublas", "the tall-and-skinny kernels do not fit: " + why + ", so cuBLAS"


def _cublas_plan(spec, dt, common, tsm_time=None) -> Plan:
    """cuBLAS, predicted by an ideal roofline (no model of its internals): A, B and
    C moved once at peak bandwidth, or the FLOP at the CUDA cores' peak, plus one
    launch. On cc 8.0/9.0 DGEMM also has the FP64 tensor cores, so for float64 this
    overestimates its time."""
    nbytes, flops, launch = common["bytes"], common["flops"], spec.launch_overhead_s
    t_mem, t_comp = nbytes / spec.peak_bw, flops / spec.peak_flops(dt)
    total = max(t_mem, t_comp) + launch if (flops or nbytes) else 0.0
    bound = ("latency" if launch > 0.5 * total else
             "memory" if t_mem >= t_comp else "compute")
    details = dict(memory=t_mem, compute=t_comp, launch=launch, reduction=0.0, traffic=nbytes)
    if tsm_time is not None:
        details["tsm_time"] = tsm_time
    return Plan(algorithm="cublas", version=None, t1=None, t2=None, t3=None, tcf=None,
                splits=1, bound=bound, occupancy=None, util_mem=1.0, util_comp=1.0,
                predicted_time_s=total, predicted_bw=nbytes / total if total else 0.0,
                details=details, **common)


def _bound(t_mem, t_comp, launch, total, u_mem, u_comp) -> str:
    """'latency' when the launch is more than half the time, or when the dominant
    term runs below half its peak because too few threads are resident to keep
    enough requests in flight (the paper's latency-bound case, 3.2.1)."""
    if launch > 0.5 * total:
        return "latency"
    if t_mem >= t_comp:
        return "latency" if u_mem < 0.5 else "memory"
    return "latency" if u_comp < 0.5 else "compute"


@functools.lru_cache(maxsize=4096)
def _plan_cached(spec, m, k, n, dtname, a_order, b_order, beta_nonzero, force=None,
                 profile_fn=None) -> Plan:
    dt = np.dtype(dtname)
    b = dt.itemsize
    thr = t2_threshold(spec, dt)
    flops = 2 * m * n * k
    c_times = 2 if beta_nonzero else 1
    nbytes = (m * k + k * n + c_times * m * n) * b
    algorithm, reason = _classify(m, k, n)
    if force is not None and force != algorithm and min(m, k, n) > 0:
        algorithm, reason = force, f"{force.upper()} was asked for (the automatic choice is {algorithm})"
        if force == "tsm2l" and k > TSM2L_MAX:
            raise ValueError(f"tsm_core: TSM2L needs k <= {TSM2L_MAX}, got k = {k}")
    common = dict(dtype=dt.name, m=m, k=k, n=n, a_order=a_order, b_order=b_order,
                  t2_threshold=thr, bytes=nbytes, flops=flops, reason=reason,
                  spec_name=spec.name)
    launch = spec.launch_overhead_s

    if algorithm == "cublas":
        return _cublas_plan(spec, dt, common)
    lay = _layout_for((a_order, b_order), dt)
    r5 = algorithm5_detail(spec, m, k, n, dt, **_lay_kwargs(lay))
    t2, t3 = r5.t2, r5.t3
    occ_max = _occupancy(spec, t2, t3, dt, lay)
    t1 = _choose_t1(occ_max, spec.max_threads_per_block)
    occ_blocks = max(t1, (occ_max // t1) * t1)   # whole blocks per SM
    passes = math.ceil(n / t2)
    rows = lay.rows_per_thread

    if algorithm == "tsm2r":
        version, tcf = 3, None
        row_blocks = math.ceil(m / (t1 * rows))
        blocks_needed = spec.sm_count * math.ceil(occ_max / t1) * WAVES
        splits = min(max(1, math.ceil(blocks_needed / row_blocks)),
                     max(1, k // SPLITK_MIN_DEPTH))
        threads = row_blocks * splits * t1
        # A once per pass; B once (its tiles are re-read by every row block, but
        # from L2); C once, twice when read for beta.
        traffic = m * k * b * passes + k * n * b + c_times * m * n * b
    else:
        # opt1 (Algorithm 6, with a cp.async ring over row tiles) holds all of
        # k <= 32 in one tile; opt2 (Algorithm 7) is the any-k form.
        version = 1
        tcf = choose_tcf(spec, m, k, n, dt, order=(a_order, b_order), occupancy=occ_max)
        splits = 1
        threads = math.ceil(m / (tcf * rows))
        c_passes = math.ceil(k / t1) if version == 2 else 1
        traffic = m * k * b * passes + k * n * b + c_times * c_passes * m * n * b

    # Resident threads per SM: the launch may not fill every SM.
    occ = float(min(occ_blocks, threads / spec.sm_count))
    u_mem = util_mem(spec, occ, t3, dt, bytes_per_access=lay.bytes_per_access)
    u_comp = util_comp(spec, occ, t2, t3, dt)
    t_mem = traffic / (spec.peak_bw * u_mem)
    t_comp = flops / (spec.peak_flops(dt) * u_comp)
    # Split-K: partial sums written then read back by one more (reduction) launch.
    t_red = (2 * splits * m * n * b / spec.peak_bw + launch) if splits > 1 else 0.0
    profile = None
    if algorithm == "tsm2l" and passes == 1:
        profile = (profile_fn or _profile.tsm2l_profile)(spec, dt, a_order, k)
    if profile is not None:
        # This GPU's measured TSM2L line (tsm2/profile.py): a fixed cost (the
        # launch and the round trips nothing overlaps) plus the bytes streamed at
        # the measured fraction of the bandwidth, in place of launch + Little's law.
        launch = profile["fixed_s"]
        u_mem = profile["eff"]
        t_mem = traffic / (spec.peak_bw * u_mem)
    total = max(t_mem, t_comp) + launch + t_red
    bound = _bound(t_mem, t_comp, launch + t_red, total, u_mem, u_comp)

    # n > 16 means ceil(n / 16) passes over A; far enough out, a 2-D tiled GEMM that
    # reads A once wins even at the pessimistic CUDA-core roofline used for it.
    alt = _cublas_plan(spec, dt, common)
    if force is None and passes > 1 and total > CUBLAS_MARGIN * alt.predicted_time_s:
        why = (f"{algorithm.upper()} would read A {passes} times (t2 <= {T2_MAX} columns of C "
               f"per pass) and the model predicts {_fmt_time(total)} for it, more than "
               f"{CUBLAS_MARGIN:g} x cuBLAS's roofline of {_fmt_time(alt.predicted_time_s)}")
        common = dict(common, reason=f"the tall-and-skinny kernels do not pay here: {why}, "
                                     f"so cuBLAS")
        return _cublas_plan(spec, dt, common, tsm_time=total)
    return Plan(algorithm=algorithm, version=version, t1=t1, t2=t2, t3=t3, tcf=tcf,
                splits=splits, bound=bound, occupancy=occ, util_mem=u_mem, util_comp=u_comp,
                predicted_time_s=total, predicted_bw=nbytes / total,
                details=dict(memory=t_mem, compute=t_comp, launch=launch, reduction=t_red,
                             traffic=traffic, rows_per_thread=rows, occupancy_max=occ_max,
                             passes=passes, alg5_branch=r5.branch,
                             alg5_t2=r5.t2_cont, alg5_t3=r5.t3_cont,
                             profile=(None if profile is None else
                                      dict(fixed_s=profile["fixed_s"], eff=profile["eff"]))),
                **common)


def _order(o) -> str:
    o = str(o).upper()
    if o not in ("C", "F"):
        raise ValueError(f"tsm_core: order must be 'C' or 'F', got {o!r}")
    return o


def reference_note(spec: DeviceSpec) -> str:
    """The words a plan carries when it is made for the reference GPU because no GPU
    was found."""
    return (f"No CUDA GPU was found: this is the plan for the reference GPU, {spec.name} "
            f"(tsm_core.runtime.device.KNOWN_GPUS[{_device.REFERENCE_GPU!r}]).")


def plan(m: int, k: int, n: int, dtype, order=("C", "C"), *, spec: DeviceSpec | None = None,
         algorithm: str | None = None, beta: float = 0.0, profile=None) -> Plan:
    """Choose TSM2R, TSM2L or cuBLAS for A (m, k) @ B (k, n), with parameters.

    Classification:

    * TSM2R ("tall and skinny on the right"): n <= 64 and k >= 256 (so k >= 4 n);
    * TSM2L ("tall and skinny on the left"): k <= 32, n <= 32, m >= 8 max(k, n);
    * within those, the automatic choice keeps to where the kernels were measured
      faster than cuBLAS on the H100 (the AUTO_* constants); `algorithm=` forces one;
    * cuBLAS otherwise (and for empty products).

    t2, t3 come from Algorithm 5, t1 from occupancy, tcf from `choose_tcf`, and
    TSM2R's split-K factor fills the GPU for two waves:
    splits = clamp(ceil(#SM x ceil(MaxOccup / t1) x 2 / row_blocks), 1, k // 256).
    Predicted time = max(traffic / (PeakBand x Util_mem), flops / (PeakPerf x
    Util_comp)) + launch overhead (+ the split-K reduction and its launch). For TSM2L
    on the current GPU (a measured spec), this GPU's profiled line replaces launch +
    Little's law: a fixed cost + bytes / (measured fraction x PeakBand), measured
    once per dtype, order of A and k bucket (`tsm_core.tsm2.profile`).

    Parameters
    ----------
    m, k, n : int
        A has shape (m, k), B (k, n), C (m, n).
    dtype : str or numpy dtype
        float32 or float64.
    order : (str, str)
        The memory orders of A and B, "C" (row-major) or "F" (column-major).
    spec : DeviceSpec, optional
        The GPU to plan for. Default: the current GPU (``runtime.device.query()``),
        or, where no GPU is found, the reference GPU (the H100 entry of
        ``KNOWN_GPUS``); the plan's ``note`` and ``describe()`` then say so.
    algorithm : {None, "auto", "tsm2r", "tsm2l", "cublas"}
        Force the model of one kernel; None or "auto" for the automatic choice.
    beta : float
        Whether C is read (beta != 0) changes the bytes counted.
    profile : callable, optional
        ``profile(spec, dtype, a_order, k) -> dict | None``: a measured TSM2L line
        (see ``tsm2/profile.py``). Default: the figures stored on disk, if any.

    Returns
    -------
    Plan
        Memoised: the same arguments return the same (frozen) Plan.

    Raises
    ------
    TypeError
        If dtype is not float32 or float64.
    ValueError
        For a negative dimension, an order other than "C"/"F", an unknown
        algorithm, or TSM2L forced with k > 32.

    Examples
    --------
    >>> from tsm_core.runtime.device import KNOWN_GPUS
    >>> from tsm_core.tsm2.model import plan
    >>> plan(10**7, 16, 16, "float32", spec=KNOWN_GPUS["H100"]).algorithm
    'tsm2l'
    """
    dt = _dtype(dtype)
    m, k, n = (int(v) for v in (m, k, n))
    if min(m, k, n) < 0:
        raise ValueError(f"tsm_core: negative dimension in {(m, k, n)}")
    a_order, b_order = (_order(o) for o in order)
    if algorithm not in (None, "auto", "tsm2r", "tsm2l", "cublas"):
        raise ValueError(f"tsm_core: algorithm must be auto, tsm2r, tsm2l or cublas, not {algorithm!r}")
    force = None if algorithm in (None, "auto") else algorithm
    note = ""
    if spec is None:
        if has_gpu():
            spec = _device.query()
        else:
            spec = _device.KNOWN_GPUS[_device.REFERENCE_GPU]
            note = reference_note(spec)
    p = _plan_cached(spec, m, k, n, dt.name, a_order, b_order, beta != 0, force, profile)
    return dataclasses.replace(p, note=note) if note else p


# ---------------------------------------------------------------- describe


def _fmt_time(s: float) -> str:
    if s >= 1:
        return f"{s:.3g} s"
    if s >= 1e-3:
        return f"{s * 1e3:.3g} ms"
    return f"{s * 1e6:.3g} us"


def _fmt_bytes(x: float, per_s: bool = False) -> str:
    unit = "B/s" if per_s else "B"
    for p, name in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if x >= p:
            return f"{x / p:.3g} {name}{unit}"
    return f"{x:.3g} {unit}"


def _describe(p: Plan) -> str:
    names = {"tsm2r": "TSM2R (tall and skinny on the right)",
             "tsm2l": "TSM2L (tall and skinny on the left)", "cublas": "cuBLAS GEMM"}
    d = p.details
    # v3 has one kernel per layout of A: tsm2r_v3 (column-major); row-major: tsm2r_v3x
    # for float32 (3xTF32 tensor cores), tsm2r_v3d for float64 (FP64 tensor
    # cores; n <= 2 only on large A), tsm2r_v3r (FMA) otherwise (sm_80+ assumed:
    # the plan is the H100's).
    v3r = ""
    if p.version == 3 and p.a_order == "C":
        v3r = "x" if p.dtype == "float32" else ("d" if p.n > 2 or p.m * p.k >= V3D_N2_MIN_ELEMS else "r")
    kern = {"tsm2r": f"kernel tsm2r_v{p.version}{v3r}", "tsm2l": f"kernel tsm2l_opt{p.version}",
            "cublas": "library call"}[p.algorithm]
    lines = [f"{names[p.algorithm]}, {kern}, {p.dtype}: A ({p.m} x {p.k}, {p.a_order}-order) "
             f"@ B ({p.k} x {p.n}, {p.b_order}-order) on {p.spec_name}."]
    if p.note:
        lines.append(p.note)
    lines.append(f"Why: {p.reason}.")

    thr = p.t2_threshold
    dim, dname = (p.k, "k") if p.algorithm == "tsm2l" else (p.n, "n")
    side = "at or below" if dim <= thr else "above"
    if p.flops == 0:
        intensity = "There is no arithmetic to do."
    elif p.algorithm == "cublas":
        ai = p.flops / p.bytes if p.bytes else 0.0
        balance = thr / np.dtype(p.dtype).itemsize
        intensity = (f"The product does {ai:.3g} FLOP per byte it must move at least once, "
                     f"{'below' if ai < balance else 'above'} the GPU's balance of "
                     f"{balance:.3g} FLOP/byte (peak FLOP/s / peak bytes/s; t2_threshold = "
                     f"{thr:.1f} in the paper's terms).")
    else:
        intensity = (f"{dname} = {dim} is {side} t2_threshold = {thr:.1f} (peak FLOP/s / "
                     f"peak bytes/s x element size, paper 3.1.8): each element of A read "
                     f"from memory feeds {dim} multiply-adds, "
                     + ("fewer than the GPU can do while it reads the next one, so memory "
                        "is the limit." if dim <= thr else
                        "more than the GPU can do while it reads the next one, so "
                        "arithmetic is the limit."))
    if p.bound == "latency":
        if d["launch"] + d.get("reduction", 0) > 0.5 * p.predicted_time_s:
            why = (f"The fixed launch cost ({_fmt_time(d['launch'])}"
                   + (" per launch, two launches with split-K" if p.splits > 1 else "")
                   + ") is more than half of the predicted time: the problem is too small "
                   "to keep the GPU busy.")
        else:
            why = (f"Only {p.occupancy:.0f} threads per SM are resident, too few loads "
                   f"in flight to cover the memory latency (Little's law): memory "
                   f"utilisation {p.util_mem:.0%}.")
        lines.append(f"Bound: latency. {why} ({intensity})")
    else:
        lines.append(f"Bound: {p.bound}. {intensity}")

    if p.algorithm == "cublas":
        lines.append("Parameters: chosen by cuBLAS.")
        lines.append(f"Predicted: {_fmt_time(p.predicted_time_s)} at best (roofline: "
                     f"{_fmt_bytes(p.bytes)} at peak bandwidth, {p.flops:.3g} FLOP at peak "
                     f"rate, plus one launch), {_fmt_bytes(p.predicted_bw, True)}.")
        return "\n".join(lines)

    passes = d.get("passes", 1)
    rows = d.get("rows_per_thread", 1)
    lines.append("Parameters:")
    lines.append(f"  t1 = {p.t1}: threads per block, each fetching one row of a {p.t1}-row "
                 f"tile of B into shared memory")
    lines.append(f"  t2 = {p.t2}: columns of C each thread accumulates in registers per pass; "
                 f"{passes} pass{'es' if passes != 1 else ''} over A for n = {p.n}")
    lines.append(f"  t3 = {p.t3}: 16-byte loads of A each thread keeps in flight "
                 f"({rows} row{'s' if rows != 1 else ''} of C per thread)")
    if p.algorithm == "tsm2r":
        lines.append(f"  splits = {p.splits}: split-K, k cut into {p.splits} slice"
                     f"{'s' if p.splits != 1 else ''}"
                     + (" whose partial sums a second kernel adds in a fixed order"
                        if p.splits > 1 else " (the row blocks alone fill the GPU)"))
    else:
        lines.append(f"  tcf = {p.tcf}: thread count factor, m / {p.tcf} threads launched, "
                     f"each walking {p.tcf} row tile{'s' if p.tcf != 1 else ''} of A")
    prof = d.get("profile")
    if prof:
        lines.append(f"Model: this GPU's measured TSM2L line (tsm2/profile.py, k bucket "
                     f"{_pow2_ceil(p.k)}): a fixed cost of {_fmt_time(prof['fixed_s'])} plus the "
                     f"bytes at {prof['eff']:.0%} of the peak bandwidth; compute utilisation "
                     f"{p.util_comp:.0%}.")
    else:
        lines.append(f"Model: {p.occupancy:.0f} resident threads per SM (at most "
                     f"{d.get('occupancy_max', 0):.0f} by registers and shared memory), "
                     f"memory utilisation {p.util_mem:.0%}, compute utilisation {p.util_comp:.0%}.")
    lines.append(f"Predicted: {_fmt_time(p.predicted_time_s)}, {_fmt_bytes(p.predicted_bw, True)} "
                 f"of useful traffic ({_fmt_bytes(p.bytes)}: A, B and C once"
                 f"{', C twice as beta != 0' if p.bytes > (p.m * p.k + p.k * p.n + p.m * p.n) * np.dtype(p.dtype).itemsize else ''}); "
                 f"memory {_fmt_time(d['memory'])}, arithmetic {_fmt_time(d['compute'])}, "
                 f"{'fixed cost' if prof else 'launch'} {_fmt_time(d['launch'])}"
                 + (f", split-K reduction {_fmt_time(d['reduction'])}" if p.splits > 1 else "")
                 + ".")
    return "\n".join(lines)


# ---------------------------------------------------------------- autotuner hook


def neighbourhood(p: Plan) -> list[dict]:
    """Candidate parameter sets around the model's choice, the model's own first.

    t1 in {64, 128, 256}; t3 halved / doubled; for TSM2R splits halved / doubled
    (at most k // 256); for TSM2L tcf halved / doubled. t2 and the version stay:
    Algorithm 5 settles t2 and the timing loop should not re-open it. Empty for
    cuBLAS.
    """
    if p.algorithm == "cublas":
        return []

    def around(v, allowed):
        return sorted({x for x in (v // 2, v, v * 2) if x in allowed}, key=lambda x: x != v)

    t1s = sorted(T1_CHOICES, key=lambda x: x != p.t1)
    t3s = around(p.t3, T3_CHOICES)
    if p.algorithm == "tsm2r":
        max_splits = max(1, p.k // SPLITK_MIN_DEPTH)
        splitss = around(p.splits, set(range(1, max_splits + 1)))
        tcfs = [None]
    else:
        splitss = [1]
        tcfs = around(p.tcf, TCF_CHOICES)
    out = []
    for t1, t3, s, tcf in itertools.product(t1s, t3s, splitss, tcfs):
        out.append(dict(t1=t1, t2=p.t2, t3=t3, splits=s, tcf=tcf, version=p.version))
    return out
