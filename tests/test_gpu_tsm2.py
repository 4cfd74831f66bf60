"""The GPU kernels (TSM2R v0-v3, TSM2L opt1/opt2) and matmul() against a float64 reference.

Every test here carries the `gpu` marker (skipped where no GPU is found; run with
``python -m pytest -m gpu tests/test_gpu_tsm2.py``). Operands are CuPy arrays (torch
CUDA tensors in one test) of signed normal data, never zeros.

Tolerance. The bound of tests/test_cpu_path.py, elementwise:

    |C - exact| <= gamma_{k+3}(u) * (|alpha| |A| @ |B| + |beta| |C0|),
    gamma_j(u) = j u / (1 - j u),   u = eps / 2 of the working dtype.

It holds for any order of summation whose depth is at most k + 3 roundings per
term (Higham, section 3.1), FMA or not: a thread's running sum, a cp.async tile
walk, a warp's butterfly reduce-scatter (depth 5 on top of k/32-long lane sums),
TSM2L opt2's k-tiles summed through C (depth <= KT + ceil(k/KT) + 1) and split-K
(depth <= ceil(k/splits) + splits + 2) all stay within it; adding the exact zeros
of a zero-filled tile edge costs nothing. The reference is cuBLAS DGEMM on float64
copies (exact for float32 inputs), itself off by gamma_{k+3}(2**-53) times the same
scale, so the two bounds are added, as on the CPU path. The slack, a relative
1e-6 on top, is there because the bound is itself computed in float64 by DGEMM
(|A| @ |B| has a relative error up to gamma_k(2**-53) < 1e-12 here): it keeps a
result that sits exactly on the bound from failing on the bound's own rounding, and
is far below any real error (a wrong, missing or doubled term is off by O(1) in
relative terms). float32 on algorithm="cublas" assumes CUPY_TF32 is unset (TF32
rounds inputs to 10 mantissa bits; that test is skipped otherwise).

Poison. Before each call with beta == 0, `out` is filled with NaN: an element the
kernel forgets to write, or a C the kernel reads although beta == 0, shows up as
NaN and fails the bound (NaN compares false). With beta != 0, out holds finite
random C0.

Runtime. A representative cross product, not the full one: about 1100 small cases
plus a few large ones (determinism: ~0.5-1 GB operands; the m*k > 2**31 test, marked
slow too: ~8.6 GB A). On an H100 the whole module ran in 94 s from a cold CuPy kernel
cache, most of it NVRTC compiling each instantiation once (cached on disk after).
"""

from __future__ import annotations

import itertools
import os

import numpy as np
import pytest

import _ieee
import tsm_core
from tsm_core.tsm2 import launch as _tsm2

try:
    import cupy
except ImportError:  # CPU-only CI: every test here is skipped by conftest
    cupy = None

try:
    import torch
except ImportError:
    torch = None

pytestmark = pytest.mark.gpu

DTYPES = [np.float32, np.float64]
DTYPE_IDS = {np.float32: "f32", np.float64: "f64"}
ORDERS = ["CC", "CF", "FC", "FF"]  # memory orders of A and B
SLACK = 1e-6
ALPHA_BETA = [(1.0, 0.0), (1.5, -0.5), (0.0, 1.0)]


def _dt_id(d):
    return DTYPE_IDS[d]


def _shape_id(s):
    return "x".join(map(str, s))


# ------------------------------------------------------------------ shapes
# Awkward on purpose: 1, primes and one past / one short of powers of two, n over the
# 16-column chunk (several passes), k long enough for split-K with m small.

# TSM2R v3 (the fast kernel; the full dtype x order cross product).
SHAPES_V3 = [
    (1, 1, 1), (1, 257, 2), (31, 127, 1), (127, 129, 3), (129, 31, 16), (257, 1021, 17),
    (1021, 257, 33), (4099, 129, 64), (129, 4099, 8), (31, 4099, 1), (4099, 1021, 2),
]
# TSM2R v0 - v2 (the slow ladder): fewer shapes and orders.
SHAPES_LADDER = [(1, 1, 1), (127, 129, 17), (257, 1021, 3), (1021, 31, 64), (4099, 127, 2)]
LADDER_ORDERS = ["CC", "FF", "CF"]
# TSM2L, k <= 32: opt1 and opt2.
SHAPES_L = [
    (1, 1, 1), (31, 1, 2), (127, 16, 16), (129, 31, 17), (257, 32, 64), (1021, 8, 8),
    (4099, 3, 33), (4099, 17, 1),
]
# TSM2L, k > 32: opt2 only.
SHAPES_L_BIGK = [(127, 33, 3), (257, 129, 17), (1021, 1021, 16), (4099, 64, 64), (31, 4099, 2)]
# matmul(algorithm=...): TSM2R-like, TSM2L-like, n > 64, m small, square-ish.
SHAPES_MATMUL = [(4099, 1021, 8), (4099, 16, 16), (1021, 31, 129), (31, 4099, 3), (129, 257, 17)]
ALGORITHMS = ["auto", "tsm2r", "tsm2l", "cublas"]

# Entries: name -> (function, fixed keyword arguments).
ENTRIES = {
    "tsm2r_v0": ("tsm2r", dict(version=0)),
    "tsm2r_v1": ("tsm2r", dict(version=1)),
    "tsm2r_v2": ("tsm2r", dict(version=2)),
    "tsm2r_v3": ("tsm2r", dict(version=3)),
    "tsm2r_v3_splits3": ("tsm2r", dict(version=3, splits=3)),
    "tsm2l_opt1": ("tsm2l", dict(opt=1)),
    "tsm2l_opt2": ("tsm2l", dict(opt=2)),
    "matmul_auto": ("matmul", dict(algorithm="auto")),
    "matmul_tsm2r": ("matmul", dict(algorithm="tsm2r")),
    "matmul_tsm2l": ("matmul", dict(algorithm="tsm2l")),
    "matmul_cublas": ("matmul", dict(algorithm="cublas")),
}


def call(entry, A, B, **kw):
    fn, fixed = ENTRIES[entry]
    return getattr(tsm_core, fn)(A, B, **fixed, **kw)


# out / alpha / beta: (entry, shape, A order, B order).
OUT_CASES = [
    ("tsm2r_v0", (257, 129, 17), "C", "F"),
    ("tsm2r_v1", (257, 129, 17), "F", "C"),
    ("tsm2r_v2", (257, 129, 17), "C", "C"),
    ("tsm2r_v3", (257, 1021, 17), "C", "F"),
    ("tsm2r_v3", (1021, 257, 17), "F", "C"),
    ("tsm2r_v3_splits3", (257, 1021, 17), "C", "C"),
    ("tsm2r_v3_splits3", (257, 1021, 17), "F", "F"),
    ("tsm2l_opt1", (1021, 31, 17), "C", "C"),
    ("tsm2l_opt1", (1021, 31, 17), "F", "F"),
    ("tsm2l_opt2", (1021, 129, 17), "C", "F"),
    ("tsm2l_opt2", (1021, 129, 17), "F", "C"),
    ("matmul_auto", (4099, 257, 3), "C", "C"),
    ("matmul_cublas", (129, 257, 17), "F", "C"),
]

# Views: (A kind, B kind). Kinds are described in `operand`.
VIEW_CASES = [
    ("step", "C"),   # A[::2, ::3]: neither stride 1 (copied once to C order)
    ("T", "C"),      # A = X.T: F-ordered view
    ("off1", "F"),   # A[:, 1:]: row-major, misaligned by one element (narrow vectors)
    ("off2", "C"),   # A[:, 2:]: row-major, 8-byte aligned, even lda (float2 / double2)
    ("offF", "C"),   # F-ordered A[1:, :]: column-major, misaligned
    ("neg", "C"),    # A[::-1, :]: negative row stride (copied)
    ("C", "step"),   # B[:, ::2]
    ("C", "T"),      # B = Y.T
    ("F", "neg"),    # B[::-1, ::-1]
    ("T", "off1"),
]
VIEW_ENTRIES = {
    "tsm2r_v0": (127, 129, 17),
    "tsm2r_v2": (257, 129, 17),
    "tsm2r_v3": (257, 1021, 17),
    "tsm2r_v3_splits3": (129, 1021, 3),
    "tsm2l_opt1": (1021, 31, 17),
    "tsm2l_opt2": (1021, 129, 17),
    "matmul_auto": (4099, 257, 8),
}

# Explicit parameters.
EXPLICIT_R_SHAPE = (1021, 4099, 33)
EXPLICIT_R_T2 = [1, 2, 4, 8, 16]
EXPLICIT_R_SPLITS = [1, 3, 7]
EXPLICIT_R_T1 = {1: 64, 2: 128, 4: 256, 8: 64, 16: 128}  # one t1 per t2, all three seen
# Row-major A only: lane groups splitting the n-chunk (tsm2r_v3r's G) or the rows
# (its RG; rgroups=1 is the float32 16-column default's opposite).
# (tc=-1: float64 would otherwise run on the tensor-core kernel, which has no groups.)
EXPLICIT_R_GROUPS = [dict(t2=16, groups=2, tc=-1), dict(t2=16, groups=4, tc=-1),
                     dict(t2=8, groups=2, rpt=2, tc=-1),
                     dict(t2=16, rgroups=1, tc=-1), dict(t2=16, rgroups=2, tc=-1),
                     dict(t2=16, rgroups=4, rpt=1, tc=-1), dict(t2=8, rgroups=4, rpt=4, stages=1, tc=-1),
                     dict(t2=4, rgroups=8, splits=3, tc=-1)]
# Row-major A on the tensor cores (float64: DMMA, tsm2r_v3d; float32: 3xTF32,
# tsm2r_v3x) and on the FMA units: sizes around their 8- and 16-row fragments,
# 16-element k pieces, 64-deep B tiles, 8-column halves.
EXPLICIT_R_TC_SHAPES = [(1, 1, 5), (7, 15, 8), (9, 17, 9), (17, 63, 16), (33, 65, 1),
                        (1021, 129, 17), (257, 1021, 33), (4099, 3001, 12)]
EXPLICIT_R_TC = [dict(tc=1), dict(tc=-1), dict(tc=1, splits=5), dict(tc=1, rpt=4, t1=128),
                 dict(tc=1, stages=1, t3=32), dict(tc=1, streamk=1), dict(tc=1, streamk=-1)]
# (streamk=1 forces stream-K on every shape, so also where the wave has more
# blocks than units; streamk=-1 is split-K where stream-K is the default.)
# float32 only (tsm2r_v3x's own knobs): k pieces per step, its cp.async ring of A,
# stream-K on 4 warps with shallow tiles.
EXPLICIT_R_TC32 = [dict(tc=1, u=1), dict(tc=1, u=8, stages=2), dict(tc=1, stages=3, t1=256),
                   dict(tc=1, u=2, t3=32, rpt=2, splits=3), dict(tc=1, streamk=1, t1=128, u=2, t3=32)]
# The ladder's own knobs (v1: t2; v2: t1, t2, t3).
EXPLICIT_LADDER = [
    dict(version=1, t2=1), dict(version=1, t2=8),
    dict(version=2, t1=64, t2=2, t3=1), dict(version=2, t1=256, t2=16, t3=8),
]
EXPLICIT_L_TCF = [1, 4, 64]
# tsm2l_opt1w (row-major A with 16-byte aligned rows, k <= 32, n <= 16) against
# tsm2l_opt1's shared-memory tiles (warp=-1) on the same problems: 1 to 16 lanes per
# row, lanes with no k (k = 12, 20, 24), rows past m inside a tile, n below the
# lanes per row, one output per lane, non-vector C stores.
L_WARP_SHAPES = [(1, 4, 1), (7, 8, 3), (1021, 8, 8), (1021, 12, 5), (4099, 16, 16), (257, 20, 13),
                 (4099, 24, 2), (513, 32, 16), (65537, 16, 9)]
L_WARP_OUTS = [("C", 1.0, 0.0), ("F", 1.5, -0.5), ("C", -2.0, 0.25), ("S", 1.0, 0.5)]
EXPLICIT_L_SHAPES = {1: (4099, 31, 17), 2: (4099, 129, 17)}

# Determinism: (entry, extra kwargs, shape).
DETERMINISM_CASES = [
    ("tsm2r_v3", {}, (2053, 65537, 16)),
    ("tsm2r_v3", dict(splits=7), (2053, 65537, 16)),
    ("tsm2r_v3", dict(splits=64), (257, 65537, 3)),
    ("tsm2r_v3", dict(t2=16), (130, 65537, 16)),  # float32 row-major: 2 row blocks over stream-K's wave
    ("tsm2l_opt1", {}, ((1 << 20) + 3, 31, 17)),
    ("tsm2l_opt1", dict(tcf=4), ((1 << 20) + 3, 31, 17)),
    ("tsm2l_opt2", {}, ((1 << 20) + 3, 129, 17)),
    ("matmul_auto", {}, (4099, 65537, 8)),
]


# ------------------------------------------------------------------ helpers


def gamma(k, dtype):
    u = np.finfo(dtype).eps / 2
    return k * u / (1 - k * u)


def operand(xp, rng, shape, dtype, kind="C"):
    """Signed normal data of `shape` laid out as `kind`, on numpy or CuPy (`xp`).

    C / F: contiguous; T: transpose of a C-ordered (c, r) array (an F-ordered view);
    step: X[::2, ::3] (neither stride 1); neg: X[::-1, ::-1] (negative strides);
    off1: X[:, 1:] (row-major, start one element past an aligned address);
    off2: X[:, 2:2+c] with an even row stride (8-byte aligned start);
    offF: F-ordered X[1:, :] (column-major, misaligned).
    """
    r, c = shape

    def data(s, order="C"):
        h = rng.standard_normal(s).astype(dtype)
        x = xp.asarray(h)
        return xp.asfortranarray(x) if order == "F" else xp.ascontiguousarray(x)

    if kind == "C":
        return data((r, c))
    if kind == "F":
        return data((r, c), "F")
    if kind == "T":
        return data((c, r)).T
    if kind == "step":
        return data((2 * r, 3 * c))[::2, ::3]
    if kind == "neg":
        return data((r, c))[::-1, ::-1]
    if kind == "off1":
        return data((r, c + 1))[:, 1:]
    if kind == "off2":
        return data((r, c + 2 + c % 2))[:, 2:2 + c]
    if kind == "offF":
        return data((r + 1, c), "F")[1:, :]
    raise ValueError(kind)


def make_out(rng, m, n, dtype, kind, beta):
    """(out, C0, check_around): out poisoned with NaN when beta == 0, else finite
    random C0. kind "S": a strided view into a larger array, whose other elements
    `check_around()` verifies untouched."""
    if kind == "S":
        big = cupy.asarray(rng.standard_normal((2 * m + 1, 3 * n + 2)).astype(dtype))
        out = big[1::2, 2::3]
        assert out.shape == (m, n)
        keep = cupy.ones(big.shape, dtype=bool)
        keep[1::2, 2::3] = False
        around = big[keep].copy()

        def check_around():
            cupy.testing.assert_array_equal(big[keep], around)
    else:
        out = operand(cupy, rng, (m, n), dtype, kind)

        def check_around():
            pass
    if beta == 0.0:
        out[...] = np.nan
        return out, None, check_around
    return out, out.copy(), check_around


def assert_close(C, A, B, alpha=1.0, beta=0.0, C0=None, what=""):
    """The elementwise bound of the module docstring, in C's precision, on the GPU."""
    assert C.shape == (A.shape[0], B.shape[1])
    k = A.shape[1]
    f64 = cupy.float64
    A64, B64 = A.astype(f64), B.astype(f64)
    ref = (A64 @ B64) * alpha
    scale = abs(alpha) * (cupy.abs(A64) @ cupy.abs(B64))
    if beta != 0.0:
        C064 = C0.astype(f64)
        ref += beta * C064
        scale += abs(beta) * cupy.abs(C064)
    tol = (gamma(k + 3, C.dtype) + gamma(k + 3, np.float64)) * (1 + SLACK) * scale
    err = cupy.abs(C.astype(f64) - ref)
    bad = ~(err <= tol)  # NaN counts as bad
    nbad = int(bad.sum())
    if nbad:
        idx = np.unravel_index(int(cupy.argmax(bad)), bad.shape)
        raise AssertionError(
            f"{what}: {nbad} of {C.size} elements off; first at {idx}: got {float(C[idx])!r}, "
            f"reference {float(ref[idx])!r}, |err| {float(err[idx]):.3e} > bound "
            f"{float(tol[idx]):.3e} (k={k}, {C.dtype}, alpha={alpha}, beta={beta})")


def run_check(entry, A, B, rng, *, out_kind="C", alpha=1.0, beta=0.0, what="", **kw):
    """Poison out, call, check the result and (for "S") the elements around out."""
    m, n = A.shape[0], B.shape[1]
    out, C0, check_around = make_out(rng, m, n, A.dtype, out_kind, beta)
    res = call(entry, A, B, out=out, alpha=alpha, beta=beta, **kw)
    assert res is out, "out= must be written in place and returned"
    assert_close(out, A, B, alpha, beta, C0, what=what or entry)
    check_around()
    return out


def bitwise_equal(x, y):
    ui = cupy.uint32 if x.dtype == cupy.float32 else cupy.uint64
    return bool((cupy.ascontiguousarray(x).view(ui) == cupy.ascontiguousarray(y).view(ui)).all())


# ------------------------------------------------------------------ correctness


@pytest.mark.parametrize("orders", ORDERS)
@pytest.mark.parametrize("dtype", DTYPES, ids=_dt_id)
@pytest.mark.parametrize("shape", SHAPES_V3, ids=_shape_id)
def test_tsm2r_v3(rng, shape, dtype, orders):
    m, k, n = shape
    A = operand(cupy, rng, (m, k), dtype, orders[0])
    B = operand(cupy, rng, (k, n), dtype, orders[1])
    A0, B0 = A.copy(), B.copy()
    run_check("tsm2r_v3", A, B, rng)
    cupy.testing.assert_array_equal(A, A0)  # inputs are left alone
    cupy.testing.assert_array_equal(B, B0)


@pytest.mark.parametrize("orders", LADDER_ORDERS)
@pytest.mark.parametrize("dtype", DTYPES, ids=_dt_id)
@pytest.mark.parametrize("shape", SHAPES_LADDER, ids=_shape_id)
@pytest.mark.parametrize("version", [0, 1, 2])
def test_tsm2r_ladder(rng, version, shape, dtype, orders):
    m, k, n = shape
    A = operand(cupy, rng, (m, k), dtype, orders[0])
    B = operand(cupy, rng, (k, n), dtype, orders[1])
    run_check(f"tsm2r_v{version}", A, B, rng)


@pytest.mark.parametrize("orders", ORDERS)
@pytest.mark.parametrize("dtype", DTYPES, ids=_dt_id)
@pytest.mark.parametrize("shape", SHAPES_L, ids=_shape_id)
@pytest.mark.parametrize("opt", [1, 2])
def test_tsm2l(rng, opt, shape, dtype, orders):
    m, k, n = shape
    A = operand(cupy, rng, (m, k), dtype, orders[0])
    B = operand(cupy, rng, (k, n), dtype, orders[1])
    run_check(f"tsm2l_opt{opt}", A, B, rng)


@pytest.mark.parametrize("orders", ORDERS)
@pytest.mark.parametrize("dtype", DTYPES, ids=_dt_id)
@pytest.mark.parametrize("shape", SHAPES_L_BIGK, ids=_shape_id)
def test_tsm2l_opt2_large_k(rng, shape, dtype, orders):
    m, k, n = shape
    A = operand(cupy, rng, (m, k), dtype, orders[0])
    B = operand(cupy, rng, (k, n), dtype, orders[1])
    run_check("tsm2l_opt2", A, B, rng)


@pytest.mark.parametrize("out", L_WARP_OUTS, ids=lambda o: f"{o[0]}-a{o[1]}-b{o[2]}")
@pytest.mark.parametrize("warp", [1, -1])
@pytest.mark.parametrize("dtype", DTYPES, ids=_dt_id)
@pytest.mark.parametrize("shape", L_WARP_SHAPES, ids=_shape_id)
def test_tsm2l_opt1_warp(rng, shape, dtype, warp, out):
    m, k, n = shape
    A = operand(cupy, rng, (m, k), dtype, "C")
    B = operand(cupy, rng, (k, n), dtype, "C")
    kind, alpha, beta = out
    run_check("tsm2l_opt1", A, B, rng, out_kind=kind, alpha=alpha, beta=beta, warp=warp,
              what=f"tsm2l opt1 warp={warp} out={kind}")


# Stream-K (tsm2r_v3x_sk, tsm2r_v3d_sk): rows it writes directly and rows whose
# partial sums the reduction adds, under every epilogue: m inside one row block, a
# row block split over many blocks of the wave, 16 and 12 columns, two passes
# (n = 33), a misaligned A (scalar loads).
SK_SHAPES = [(5, 700, 16), (130, 20000, 12), (1021, 3001, 16), (517, 1500, 33)]


@pytest.mark.parametrize("out", L_WARP_OUTS, ids=lambda o: f"{o[0]}-a{o[1]}-b{o[2]}")
@pytest.mark.parametrize("shape", SK_SHAPES, ids=_shape_id)
@pytest.mark.parametrize("a_kind", ["C", "off1"])
@pytest.mark.parametrize("dtype", DTYPES, ids=_dt_id)
def test_tsm2r_streamk(rng, shape, out, a_kind, dtype):
    m, k, n = shape
    A = operand(cupy, rng, (m, k), dtype, a_kind)
    B = operand(cupy, rng, (k, n), dtype, "C")
    kind, alpha, beta = out
    run_check("tsm2r_v3", A, B, rng, out_kind=kind, alpha=alpha, beta=beta, tc=1, streamk=1,
              what=f"tsm2r stream-K out={kind}")


@pytest.mark.parametrize("dtype", DTYPES, ids=_dt_id)
def test_tsm2l_opt1_warp_refuses_what_it_cannot_run(rng, dtype):
    cases = [(operand(cupy, rng, (64, 8), dtype, "F"), 4),   # column-major A
             (operand(cupy, rng, (64, 8), dtype, "C"), 17),  # n > 16
             (operand(cupy, rng, (64, 9), dtype, "C"), 4)]   # rows not 16-byte aligned (k odd)
    for A, n in cases:
        B = operand(cupy, rng, (A.shape[1], n), dtype)
        out = cupy.full((64, n), 7.0, dtype=dtype)
        with pytest.raises(ValueError, match="tsm2l_opt1w"):
            tsm_core.tsm2l(A, B, out=out, opt=1, warp=1)
        assert bool((out == 7.0).all())  # refused before anything was written
    with pytest.raises(ValueError, match="warp must be"):
        tsm_core.tsm2l(cases[0][0], operand(cupy, rng, (8, 4), dtype), warp=2)


@pytest.mark.parametrize("dtype", DTYPES, ids=_dt_id)
def test_tsm2l_opt1_refuses_large_k(rng, dtype):
    A = operand(cupy, rng, (64, 33), dtype)
    B = operand(cupy, rng, (33, 4), dtype)
    out = cupy.full((64, 4), 7.0, dtype=dtype)
    with pytest.raises(ValueError, match="opt=2"):
        tsm_core.tsm2l(A, B, out=out, opt=1)
    assert bool((out == 7.0).all())  # refused before anything was written


@pytest.mark.parametrize("orders", ["CC", "FF"])
@pytest.mark.parametrize("dtype", DTYPES, ids=_dt_id)
@pytest.mark.parametrize("shape", SHAPES_MATMUL, ids=_shape_id)
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_matmul_algorithms(rng, algorithm, shape, dtype, orders):
    if algorithm == "cublas" and dtype == np.float32 and os.environ.get("CUPY_TF32", "0") != "0":
        pytest.skip("CUPY_TF32 is set: cuBLAS float32 rounds inputs to TF32")
    m, k, n = shape
    A = operand(cupy, rng, (m, k), dtype, orders[0])
    B = operand(cupy, rng, (k, n), dtype, orders[1])
    run_check(f"matmul_{algorithm}", A, B, rng)
    # Without out: a new C-shaped CuPy array of the result dtype.
    C = call(f"matmul_{algorithm}", A, B)
    assert isinstance(C, cupy.ndarray) and C.dtype == dtype
    assert_close(C, A, B, what=f"matmul_{algorithm}, no out")


@pytest.mark.parametrize("alpha, beta", ALPHA_BETA, ids=lambda v: str(v))
@pytest.mark.parametrize("out_kind", ["C", "F", "S"])
@pytest.mark.parametrize("dtype", DTYPES, ids=_dt_id)
@pytest.mark.parametrize("entry, shape, oa, ob", OUT_CASES,
                         ids=[f"{e}-{_shape_id(s)}-{a}{b}" for e, s, a, b in OUT_CASES])
def test_out_alpha_beta(rng, entry, shape, oa, ob, dtype, out_kind, alpha, beta):
    if entry == "matmul_cublas" and dtype == np.float32 and os.environ.get("CUPY_TF32", "0") != "0":
        pytest.skip("CUPY_TF32 is set")
    m, k, n = shape
    A = operand(cupy, rng, (m, k), dtype, oa)
    B = operand(cupy, rng, (k, n), dtype, ob)
    run_check(entry, A, B, rng, out_kind=out_kind, alpha=alpha, beta=beta)


@pytest.mark.parametrize("dtype", DTYPES, ids=_dt_id)
@pytest.mark.parametrize("a_kind, b_kind", VIEW_CASES, ids=[f"A{a}-B{b}" for a, b in VIEW_CASES])
@pytest.mark.parametrize("entry", list(VIEW_ENTRIES))
def test_views(rng, entry, a_kind, b_kind, dtype):
    m, k, n = VIEW_ENTRIES[entry]
    A = operand(cupy, rng, (m, k), dtype, a_kind)
    B = operand(cupy, rng, (k, n), dtype, b_kind)
    A0, B0 = A.copy(), B.copy()
    run_check(entry, A, B, rng, out_kind="S" if a_kind in ("T", "neg") else "F")
    cupy.testing.assert_array_equal(A, A0)
    cupy.testing.assert_array_equal(B, B0)


# ------------------------------------------------------------------ explicit parameters


@pytest.mark.parametrize("a_order", ["C", "F"])
@pytest.mark.parametrize("dtype", DTYPES, ids=_dt_id)
@pytest.mark.parametrize("splits", EXPLICIT_R_SPLITS)
@pytest.mark.parametrize("t2", EXPLICIT_R_T2)
def test_tsm2r_explicit(rng, t2, splits, dtype, a_order):
    m, k, n = EXPLICIT_R_SHAPE
    A = operand(cupy, rng, (m, k), dtype, a_order)
    B = operand(cupy, rng, (k, n), dtype, "C")
    run_check("tsm2r_v3", A, B, rng, t1=EXPLICIT_R_T1[t2], t2=t2, splits=splits,
              what=f"tsm2r t1={EXPLICIT_R_T1[t2]} t2={t2} splits={splits}")


@pytest.mark.parametrize("dtype", DTYPES, ids=_dt_id)
@pytest.mark.parametrize("kw", EXPLICIT_R_GROUPS, ids=lambda d: str(d))
def test_tsm2r_explicit_groups(rng, kw, dtype):
    m, k, n = EXPLICIT_R_SHAPE
    A = operand(cupy, rng, (m, k), dtype, "C")  # groups apply to row-major A
    B = operand(cupy, rng, (k, n), dtype, "F")
    run_check("tsm2r_v3", A, B, rng, what=f"tsm2r {kw}", **kw)


def _tc_cases():
    return ([(kw, np.float64) for kw in EXPLICIT_R_TC] + [(kw, np.float32) for kw in EXPLICIT_R_TC]
            + [(kw, np.float32) for kw in EXPLICIT_R_TC32])


@pytest.mark.parametrize("kw, dtype", _tc_cases(), ids=lambda v: _dt_id(v) if isinstance(v, type) else str(v))
@pytest.mark.parametrize("shape", EXPLICIT_R_TC_SHAPES, ids=_shape_id)
def test_tsm2r_tensor_cores(rng, shape, kw, dtype):
    m, k, n = shape
    A = operand(cupy, rng, (m, k), dtype, "C")
    B = operand(cupy, rng, (k, n), dtype, "C")
    run_check("tsm2r_v3", A, B, rng, what=f"tsm2r {kw}", **kw)


@pytest.mark.parametrize("out", L_WARP_OUTS, ids=lambda o: f"{o[0]}-a{o[1]}-b{o[2]}")
@pytest.mark.parametrize("shape", [(5, 700, 16), (130, 20000, 12), (1021, 3000, 16), (517, 1500, 33)],
                         ids=_shape_id)
def test_tsm2r_v3x_16_warps(rng, shape, out):
    """tsm2r_v3x's large-problem default at 16 columns (one 16-warp block per SM, a
    2-stage ring of A, stream-K), forced on small problems; it needs a 16-byte
    aligned A (512 threads leave 128 registers, too few for scalar loads)."""
    m, k, n = shape
    A = operand(cupy, rng, (m, k), np.float32, "C")
    B = operand(cupy, rng, (k, n), np.float32, "C")
    kind, alpha, beta = out
    kw = dict(tc=1, streamk=1, t1=512, stages=2, t3=128)
    run_check("tsm2r_v3", A, B, rng, out_kind=kind, alpha=alpha, beta=beta, what=f"tsm2r {kw}", **kw)
    A1 = operand(cupy, rng, (m, k), np.float32, "off1")
    with pytest.raises(ValueError, match="16-byte aligned"):
        tsm_core.tsm2r(A1, B, **kw)


@pytest.mark.parametrize("where", ["A", "B"])
def test_tsm2r_3xtf32_ieee_specials(rng, where):
    """tsm2r_v3x splits operands into TF32 parts: Inf times an exactly representable
    value (whose low part is 0) must still give Inf, not Inf * 0 = NaN, and a NaN
    with its payload in the low bits must stay NaN."""
    m, k, n = 67, 300, 16
    A = operand(cupy, rng, (m, k), np.float32, "C")
    B = cupy.asarray(rng.integers(-3, 4, (k, n)).astype(np.float32))  # exact in TF32
    B[B == 0] = 1.0
    X = A if where == "A" else B
    X[3, 5] = np.inf
    X[7, 9] = -np.inf
    X[11, 2] = np.float32(np.frombuffer(np.uint32(0x7F800001).tobytes(), np.float32)[0])  # NaN, low payload
    X[13, 4] = np.nan
    if where == "B":
        B[20, :] = 0.0  # 0 * finite A stays finite
    out = cupy.full((m, n), cupy.nan, np.float32)
    tsm_core.tsm2r(A, B, out=out, tc=1)
    ref = A.astype(cupy.float64) @ B.astype(cupy.float64)
    cupy.testing.assert_array_equal(cupy.isnan(out), cupy.isnan(ref))
    cupy.testing.assert_array_equal(cupy.isinf(out), cupy.isinf(ref))
    cupy.testing.assert_array_equal(cupy.sign(out[cupy.isinf(ref)]), cupy.sign(ref[cupy.isinf(ref)]))
    fin = cupy.isfinite(ref)
    assert int(fin.sum()) > 0
    err = cupy.abs(out[fin].astype(cupy.float64) - ref[fin])
    scale = (cupy.abs(A.astype(cupy.float64)) @ cupy.abs(B.astype(cupy.float64)))[fin]
    assert bool((err <= gamma(k + 3, np.float32) * 2 * scale).all())


@pytest.mark.parametrize("dtype", DTYPES, ids=_dt_id)
@pytest.mark.parametrize("kw", EXPLICIT_LADDER, ids=lambda d: str(d))
def test_tsm2r_ladder_explicit(rng, kw, dtype):
    A = operand(cupy, rng, (257, 1021), dtype, "F")
    B = operand(cupy, rng, (1021, 17), dtype, "C")
    kw = dict(kw)
    version = kw.pop("version")
    run_check(f"tsm2r_v{version}", A, B, rng, what=f"tsm2r v{version} {kw}", **kw)


@pytest.mark.parametrize("a_order", ["C", "F"])
@pytest.mark.parametrize("dtype", DTYPES, ids=_dt_id)
@pytest.mark.parametrize("tcf", EXPLICIT_L_TCF)
@pytest.mark.parametrize("opt", [1, 2])
def test_tsm2l_explicit_tcf(rng, opt, tcf, dtype, a_order):
    m, k, n = EXPLICIT_L_SHAPES[opt]
    A = operand(cupy, rng, (m, k), dtype, a_order)
    B = operand(cupy, rng, (k, n), dtype, "C")
    run_check(f"tsm2l_opt{opt}", A, B, rng, tcf=tcf, what=f"tsm2l opt{opt} tcf={tcf}")


# ------------------------------------------------------------------ determinism


@pytest.mark.parametrize("a_order", ["C", "F"])
@pytest.mark.parametrize("dtype", DTYPES, ids=_dt_id)
@pytest.mark.parametrize("entry, kw, shape", DETERMINISM_CASES,
                         ids=[f"{e}-{kw}-{_shape_id(s)}" for e, kw, s in DETERMINISM_CASES])
def test_deterministic(entry, kw, shape, dtype, a_order):
    """The same call twice gives bitwise-identical results: split-K partials and
    TSM2L's k-tiles are reduced in a fixed order, so a result that moves is a race."""
    m, k, n = shape
    rs = cupy.random.RandomState(1234)
    if a_order == "C":
        A = rs.standard_normal((m, k), dtype=dtype)
    else:
        A = rs.standard_normal((k, m), dtype=dtype).T
    B = rs.standard_normal((k, n), dtype=dtype)
    first = call(entry, A, B, **kw)
    assert_close(first, A, B, what=f"{entry} {kw}")
    for _ in range(2):
        again = cupy.full((m, n), np.nan, dtype=dtype)
        call(entry, A, B, out=again, **kw)
        assert bitwise_equal(first, again), f"{entry} {kw}: two runs differ (a race?)"
    del A, B
    cupy.get_default_memory_pool().free_all_blocks()


# ------------------------------------------------------------------ 64-bit indexing

BIG_K = 1000 + 1  # m = 2**31 // k + 7 rows: m * k > 2**31
BIG_K_L = 16  # TSM2L opt1 (k <= 32): m = 2**31 // 16 + 7 rows
BIG_CASES = [("tsm2r_v3", "C", BIG_K, {}), ("tsm2r_v3", "F", BIG_K, {}), ("tsm2l_opt2", "C", BIG_K, {}),
             ("matmul_auto", "F", BIG_K, {}), ("tsm2l_opt1", "C", BIG_K_L, dict(warp=1)),
             ("tsm2l_opt1", "C", BIG_K_L, dict(warp=-1))]


@pytest.mark.slow
@pytest.mark.parametrize("entry, a_order, k, kw", BIG_CASES, ids=lambda x: str(x))
def test_more_than_2_31_elements(entry, a_order, k, kw):
    """float32 A of m * k > 2**31 elements (about 8.6 GB): an index product formed in
    32 bits would wrap. A few rows, those around element 2**31 included, are checked
    against float64 row products."""
    pool = cupy.get_default_memory_pool()
    pool.free_all_blocks()
    free, _ = cupy.cuda.runtime.memGetInfo()
    if free < 20 * 2**30:
        pytest.skip(f"needs 20 GB of free GPU memory, {free / 2**30:.1f} GB free")
    m, n = 2**31 // k + 7, 3
    assert m * k > 2**31
    try:
        A = cupy.empty((m, k) if a_order == "C" else (k, m), dtype=cupy.float32)
        flat = A.reshape(-1)
        rs = cupy.random.RandomState(7)
        step = 1 << 28
        for i in range(0, flat.size, step):
            j = min(flat.size, i + step)
            flat[i:j] = rs.standard_normal(j - i, dtype=cupy.float32)
        if a_order == "F":
            A = A.T
        B = rs.standard_normal((k, n), dtype=cupy.float32)
        out = cupy.full((m, n), np.nan, dtype=cupy.float32)
        assert call(entry, A, B, out=out, **kw) is out
        r0 = 2**31 // k  # C order: row r0 holds element 2**31
        rows = cupy.asarray(sorted({0, 1, r0 - 1, r0, r0 + 1, m // 2, m - 2, m - 1}))
        assert_close(out[rows], A[rows], B, what=f"{entry} {a_order} rows {rows.tolist()}")
        assert not bool(cupy.isnan(out).any()), "rows left unwritten"
    finally:
        A = B = out = flat = None
        pool.free_all_blocks()


# ------------------------------------------------------------------ torch


def _torch_cuda():
    return torch is not None and torch.cuda.is_available()


@pytest.mark.skipif(not _torch_cuda(), reason="torch with CUDA is not available")
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("entry, shape", [("matmul_auto", (4099, 1021, 8)), ("tsm2r_v3", (257, 1021, 17)),
                                          ("tsm2l_opt1", (1021, 31, 17)), ("tsm2l_opt2", (1021, 129, 5))])
def test_torch_cuda_tensors(entry, shape, dtype):
    m, k, n = shape
    tdt = getattr(torch, dtype)
    g = torch.Generator(device="cuda").manual_seed(5)
    tA = torch.randn(m, k, device="cuda", dtype=tdt, generator=g)
    tB = torch.randn(n, k, device="cuda", dtype=tdt, generator=g).T  # a transposed view
    cA, cB = cupy.from_dlpack(tA), cupy.from_dlpack(tB)

    C = call(entry, tA, tB)
    assert isinstance(C, torch.Tensor) and C.is_cuda and C.dtype == tdt
    assert C.device == tA.device and tuple(C.shape) == (m, n)
    cC = cupy.from_dlpack(C)
    assert cC.data.ptr == C.data_ptr()  # a view of the same memory, no copy
    assert_close(cC, cA, cB, what=f"{entry} torch")

    # out=: the very same tensor object comes back, written in place (F-ordered here).
    tout = torch.full((n, m), float("nan"), device="cuda", dtype=tdt).T
    ptr = tout.data_ptr()
    tC0 = torch.randn(m, n, device="cuda", dtype=tdt, generator=g)
    res = call(entry, tA, tB, out=tout)
    assert res is tout and tout.data_ptr() == ptr
    assert_close(cupy.from_dlpack(tout), cA, cB, what=f"{entry} torch out")
    tout.copy_(tC0)
    res = call(entry, tA, tB, out=tout, alpha=1.5, beta=-0.5)
    assert res is tout
    assert_close(cupy.from_dlpack(tout), cA, cB, 1.5, -0.5, cupy.from_dlpack(tC0),
                 what=f"{entry} torch out beta")


# ------------------------------------------------------------------ edge cases

EDGE_ENTRIES = ["tsm2r_v0", "tsm2r_v1", "tsm2r_v2", "tsm2r_v3", "tsm2r_v3_splits3", "tsm2l_opt1",
                "tsm2l_opt2", "matmul_auto", "matmul_cublas"]


@pytest.mark.parametrize("dtype", DTYPES, ids=_dt_id)
@pytest.mark.parametrize("shape", [(0, 7, 3), (5, 7, 0), (0, 0, 0), (0, 7, 0)], ids=_shape_id)
@pytest.mark.parametrize("entry", EDGE_ENTRIES)
def test_empty_result(entry, shape, dtype):
    m, k, n = shape
    A, B = cupy.ones((m, k), dtype=dtype), cupy.ones((k, n), dtype=dtype)
    C = call(entry, A, B)
    assert isinstance(C, cupy.ndarray) and C.shape == (m, n) and C.dtype == dtype
    out = cupy.empty((m, n), dtype=dtype)
    assert call(entry, A, B, out=out, beta=2.0) is out


@pytest.mark.parametrize("dtype", DTYPES, ids=_dt_id)
@pytest.mark.parametrize("entry", EDGE_ENTRIES)
def test_k_zero(rng, entry, dtype):
    m, n = 5, 3
    A, B = cupy.empty((m, 0), dtype=dtype), cupy.empty((0, n), dtype=dtype)
    C = call(entry, A, B)
    assert C.shape == (m, n) and C.dtype == dtype and not bool(C.any())
    out = cupy.full((m, n), np.nan, dtype=dtype)  # beta == 0: the NaN must not leak
    assert call(entry, A, B, out=out, alpha=2.0) is out
    assert not bool(out.any()) and not bool(cupy.isnan(out).any())
    out = operand(cupy, rng, (m, n), dtype, "F")
    C0 = out.copy()
    assert call(entry, A, B, out=out, alpha=2.0, beta=-1.5) is out
    cupy.testing.assert_array_equal(out, C0 * dtype(-1.5))


NAN_CASES = [
    ("tsm2r_v0", {}, (257, 31, 7)),
    ("tsm2r_v1", {}, (257, 31, 7)),
    ("tsm2r_v2", {}, (257, 129, 7)),
    ("tsm2r_v3", {}, (257, 1021, 7)),
    ("tsm2r_v3", dict(splits=5), (257, 1021, 7)),
    ("tsm2r_v3", dict(t2=4), (4099, 1021, 7)),
    ("tsm2l_opt1", {}, (257, 31, 7)),
    ("tsm2l_opt1", dict(tcf=4), (4099, 31, 7)),
    ("tsm2l_opt2", {}, (257, 129, 7)),
    ("matmul_auto", {}, (4099, 1021, 7)),
]


@pytest.mark.parametrize("a_order", ["C", "F"])
@pytest.mark.parametrize("dtype", DTYPES, ids=_dt_id)
@pytest.mark.parametrize("entry, kw, shape", NAN_CASES,
                         ids=[f"{e}-{kw}-{_shape_id(s)}" for e, kw, s in NAN_CASES])
def test_nan_and_inf_propagate(rng, entry, kw, shape, dtype, a_order):
    m, k, n = shape
    A = operand(cupy, rng, (m, k), dtype, a_order)
    B = operand(cupy, rng, (k, n), dtype, "C")
    _ieee.plant(A, B)
    out = cupy.full((m, n), np.nan, dtype=dtype)
    call(entry, A, B, out=out, **kw)
    _ieee.check(cupy.asnumpy(out), cupy.asnumpy(A), cupy.asnumpy(B), what=entry)


@pytest.mark.parametrize("dtype", DTYPES, ids=_dt_id)
@pytest.mark.parametrize("entry, kw, shape", NAN_CASES[3:],
                         ids=[f"{e}-{kw}-{_shape_id(s)}" for e, kw, s in NAN_CASES[3:]])
def test_beta_nonzero_propagates_nan_in_out(rng, entry, kw, shape, dtype):
    m, k, n = shape
    A = operand(cupy, rng, (m, k), dtype, "C")
    B = operand(cupy, rng, (k, n), dtype, "F")
    out = operand(cupy, rng, (m, n), dtype, "C")
    out[4, 2] = np.nan
    call(entry, A, B, out=out, beta=0.5, **kw)
    nan = cupy.isnan(out)
    assert bool(nan[4, 2]) and int(nan.sum()) == 1


@pytest.mark.parametrize("entry", ["tsm2r_v3", "tsm2l_opt1", "matmul_auto"])
def test_mixed_precision_promotes(rng, entry):
    m, k, n = 1021, 31, 5
    A = operand(cupy, rng, (m, k), np.float32, "C")
    B = operand(cupy, rng, (k, n), np.float64, "F")
    out = cupy.full((m, n), np.nan, dtype=np.float64)
    assert call(entry, A, B, out=out) is out
    assert_close(out, A, B, what=f"{entry} mixed")  # held to the float64 bound
    with pytest.raises(TypeError):
        call(entry, A, B, out=cupy.empty((m, n), dtype=np.float32))


# ------------------------------------------------------------------ for test_compile


def launches():
    """Every (entry, keyword arguments, (m, k, n), dtype, A kind) the tests above launch
    a kernel for (tests/test_compile.py compiles what these resolve to). Keep in step
    with the parametrisations above."""
    out = []
    for shape, dt, o in itertools.product(SHAPES_V3, DTYPES, ORDERS):
        out.append(("tsm2r_v3", {}, shape, dt, o[0]))
    for v, shape, dt, o in itertools.product([0, 1, 2], SHAPES_LADDER, DTYPES, LADDER_ORDERS):
        out.append((f"tsm2r_v{v}", {}, shape, dt, o[0]))
    for opt, shape, dt, o in itertools.product([1, 2], SHAPES_L, DTYPES, ORDERS):
        out.append((f"tsm2l_opt{opt}", {}, shape, dt, o[0]))
    for shape, dt, o in itertools.product(SHAPES_L_BIGK, DTYPES, ORDERS):
        out.append(("tsm2l_opt2", {}, shape, dt, o[0]))
    for alg, shape, dt, o in itertools.product(ALGORITHMS, SHAPES_MATMUL, DTYPES, ["C", "F"]):
        out.append((f"matmul_{alg}", {}, shape, dt, o))
    for (entry, shape, oa, _), dt in itertools.product(OUT_CASES, DTYPES):
        out.append((entry, {}, shape, dt, oa))
    for (entry, shape), (ak, _), dt in itertools.product(VIEW_ENTRIES.items(), VIEW_CASES, DTYPES):
        out.append((entry, {}, shape, dt, ak))
    for t2, splits, dt, o in itertools.product(EXPLICIT_R_T2, EXPLICIT_R_SPLITS, DTYPES, "CF"):
        out.append(("tsm2r_v3", dict(t1=EXPLICIT_R_T1[t2], t2=t2, splits=splits), EXPLICIT_R_SHAPE, dt, o))
    for kw, dt in itertools.product(EXPLICIT_R_GROUPS, DTYPES):
        out.append(("tsm2r_v3", kw, EXPLICIT_R_SHAPE, dt, "C"))
    for shape, (kw, dt) in itertools.product(EXPLICIT_R_TC_SHAPES, _tc_cases()):
        out.append(("tsm2r_v3", kw, shape, dt, "C"))
    for _ in ("A", "B"):
        out.append(("tsm2r_v3", dict(tc=1), (67, 300, 16), np.float32, "C"))
    for shape, a_kind, dt in itertools.product(SK_SHAPES, ["C", "off1"], DTYPES):
        out.append(("tsm2r_v3", dict(tc=1, streamk=1), shape, dt, a_kind))
    for kw, dt in itertools.product(EXPLICIT_LADDER, DTYPES):
        kw = dict(kw)
        out.append((f"tsm2r_v{kw.pop('version')}", kw, (257, 1021, 17), dt, "F"))
    for opt, tcf, dt, o in itertools.product([1, 2], EXPLICIT_L_TCF, DTYPES, "CF"):
        out.append((f"tsm2l_opt{opt}", dict(tcf=tcf), EXPLICIT_L_SHAPES[opt], dt, o))
    for shape, dt, warp in itertools.product(L_WARP_SHAPES, DTYPES, [1, -1]):
        out.append(("tsm2l_opt1", dict(warp=warp), shape, dt, "C"))
    for (entry, kw, shape), dt, o in itertools.product(DETERMINISM_CASES, DTYPES, "CF"):
        out.append((entry, kw, shape, dt, o))
    for shape, dt in itertools.product(SMALL_N2_SHAPES, DTYPES):
        out.append(("tsm2r_v3", {}, shape, dt, "C"))
    for entry, o, k, kw in BIG_CASES:
        out.append((entry, kw, (2**31 // k + 7, k, 3), np.float32, o))
    for entry, shape in [("matmul_auto", (4099, 1021, 8)), ("tsm2r_v3", (257, 1021, 17)),
                         ("tsm2l_opt1", (1021, 31, 17)), ("tsm2l_opt2", (1021, 129, 5))]:
        for dt in DTYPES:
            out.append((entry, {}, shape, dt, "C"))
    for (entry, kw, shape), dt, o in itertools.product(NAN_CASES, DTYPES, "CF"):
        out.append((entry, kw, shape, dt, o))
    for entry in ["tsm2r_v3", "tsm2l_opt1", "matmul_auto"]:
        out.append((entry, {}, (1021, 31, 5), np.float64, "C"))
    return out


@pytest.mark.gpu
@pytest.mark.parametrize("shape, order", [((20480, 2048, 8), "C"), ((20480, 2048, 8), "F"),
                                          ((200000, 16, 16), "C"), ((300, 300, 300), "C")])
def test_explain_names_what_runs(shape, order):
    cp = pytest.importorskip("cupy")
    m, k, n = shape
    rng = np.random.default_rng(3)
    A = cp.asarray(rng.standard_normal((m, k)), order=order)
    B = cp.asarray(rng.standard_normal((k, n)), order=order)
    text = tsm_core.explain(A, B)
    launch = [line for line in text.splitlines() if line.startswith("Launch:")]
    assert len(launch) == 1 and "could not be resolved" not in launch[0]
    assert ("cuBLAS" in launch[0]) or ("tsm2" in launch[0])


def test_tsm2l_profile_measures_once_and_is_cached(monkeypatch, tmp_path):
    """The planner's TSM2L profile on this GPU: a positive fixed cost, an efficiency
    in (0, 1], written to the cache directory and read back without measuring."""
    from tsm_core.runtime import device as _device
    from tsm_core.tsm2 import autotune as _autotune
    from tsm_core.tsm2 import profile as _profile

    monkeypatch.setenv("TSM_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(_profile, "_memo", {})
    spec = _device.query()
    assert _profile.tsm2l_profile(spec, np.float32, "F", 5) is None  # nothing stored, no measure
    p = _autotune.tsm2l_profile(spec, np.float32, "F", 5)  # bucket k = 8
    assert p is not None and p["k"] == 8
    assert 0 < p["fixed_s"] < 1e-3 and 0.05 <= p["eff"] <= 1.0
    assert p["large"][1] > p["small"][1] > 0
    assert list(tmp_path.glob("profile-*.json"))
    monkeypatch.setattr(_profile, "_memo", {})

    def measure(*a, **k):
        pytest.fail("measured twice")

    assert _profile.tsm2l_profile(spec, np.float32, "F", 8, measure=measure) == p


# ------------------------------------------------------------------ ABFT-sized n <= 2

SMALL_N2_SHAPES = [(4096, 4096, 2), (5003, 8192, 1), (8192, 8192, 2)]


@pytest.mark.parametrize("dtype", DTYPES, ids=_dt_id)
@pytest.mark.parametrize("shape", SMALL_N2_SHAPES, ids=_shape_id)
def test_tsm2r_small_n2(rng, shape, dtype):
    """Row-major A, n <= 2, m * k in _tsm2.SMALL_N2_ELEMS: the FMA kernel with 8 rows
    per warp and no prefetch is the launch taken, and it is right."""
    m, k, n = shape
    A = operand(cupy, rng, (m, k), dtype, "C")
    B = operand(cupy, rng, (k, n), dtype, "C")
    lay, _ = _tsm2.a_layout(A)
    rcfg = _tsm2.resolve_tsm2r(m, k, n, np.dtype(dtype), lay, _tsm2.TSM2RConfig())
    assert (rcfg.tc, rcfg.t1, rcfg.rpt, rcfg.stages) == (-1, 128, 8, 1)
    run_check("tsm2r_v3", A, B, rng)


# ------------------------------------------------------------------ column-major one wave

@pytest.mark.parametrize("shape, dtype, beta", [
    ((1030, 41011, 9), np.float64, 0.0),     # 3 row blocks x 44 splits, 16-column chunk
    ((1028, 20011, 3), np.float32, -0.5),    # float32 with n <= 4, beta
    ((10240, 10240, 33), np.float64, 0.0),   # three passes over A
    ((512, 30011, 1), np.float64, 1.0),      # one row block
])
def test_tsm2r_column_major_one_wave(rng, shape, dtype, beta):
    """The default launch for a column-major A whose split count fills one wave of
    one 512-row block per SM (tsm2/launch._col_one_wave): it is the launch taken,
    and it is right."""
    m, k, n = shape
    A = operand(cupy, rng, (m, k), dtype, "F")
    B = operand(cupy, rng, (k, n), dtype, "C")
    lay, _ = _tsm2.a_layout(A)
    sms = cupy.cuda.Device().attributes["MultiProcessorCount"]
    want = _tsm2._col_one_wave(m, k, n, np.dtype(dtype).itemsize, lay, _tsm2.choose_tn(n), sms)
    if want is None:
        pytest.skip(f"no one-wave launch for this shape on {sms} SMs")
    rcfg = _tsm2.resolve_tsm2r(m, k, n, np.dtype(dtype), lay, _tsm2.TSM2RConfig())
    assert (rcfg.t1, rcfg.stages, rcfg.splits) == want
    run_check("tsm2r_v3", A, B, rng, beta=beta, alpha=1.5 if beta else 1.0)
