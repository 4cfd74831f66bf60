"""The numpy path, check_operands() then matmul_cpu(), against a float64 reference.

Tolerance. For C = alpha * A @ B + beta * C0 computed in a precision with unit
round-off u (u = eps / 2), the standard bound for a dot product of length k
(Higham, "Accuracy and Stability of Numerical Algorithms", section 3.1) holds for
any summation order, blocked or with FMA:

    |fl(A @ B) - A @ B| <= gamma_k * |A| @ |B|,   gamma_k = k u / (1 - k u).

Scaling by alpha, scaling C0 by beta and the final add are three more rounded
operations, so |C - exact| <= gamma_{k+3} * (|alpha| |A| @ |B| + |beta| |C0|),
elementwise. The float64 reference obeys the same bound with u = 2**-53, so the
two may differ by the sum of both bounds, which is what `assert_close` allows.
"""

import itertools

import _ieee
import numpy as np
import pytest

from tsm_core.runtime import arrays as _arrays
from tsm_core.runtime.cpu import matmul_cpu
from tsm_core.runtime.checks import check_operands

try:
    import torch
except ImportError:  # torch is an optional extra
    torch = None

DTYPES = [np.float32, np.float64]

# Awkward on purpose: 1, primes, one off powers of two, k much larger than n.
SHAPES = [
    (1, 1, 1),
    (1, 127, 1),
    (31, 1, 129),
    (127, 129, 31),
    (129, 31, 127),
    (257, 1009, 8),
    (2, 4099, 3),
    (997, 13, 61),
    (1021, 64, 64),
]


def gamma(k, dtype):
    u = np.finfo(dtype).eps / 2
    return k * u / (1 - k * u)


def reference(A, B, alpha=1.0, beta=0.0, C0=None):
    """alpha * A @ B + beta * C0 in float64 (beta * C0 left out when beta == 0)."""
    R = alpha * (A.astype(np.float64) @ B.astype(np.float64))
    if C0 is not None and beta != 0.0:
        R += beta * C0.astype(np.float64)
    return R


def assert_close(C, A, B, alpha=1.0, beta=0.0, C0=None):
    """The elementwise bound of the module docstring, in C's precision."""
    k = A.shape[1]
    A64, B64 = A.astype(np.float64), B.astype(np.float64)
    scale = abs(alpha) * (np.abs(A64) @ np.abs(B64))
    if C0 is not None and beta != 0.0:
        scale += abs(beta) * np.abs(C0.astype(np.float64))
    tol = (gamma(k + 3, C.dtype) + gamma(k + 3, np.float64)) * scale
    err = np.abs(C.astype(np.float64) - reference(A, B, alpha, beta, C0))
    worst = np.unravel_index(np.argmax(err - tol), err.shape) if err.size else None
    assert np.all(err <= tol), (
        f"error {err[worst]:.3e} > bound {tol[worst]:.3e} at {worst} (k={k}, {C.dtype})"
    )


def layout(rng, shape, dtype, order):
    """Signed normal data of `shape` in the given memory layout."""
    r, c = shape
    if order == "C":
        return rng.standard_normal((r, c)).astype(dtype)
    if order == "F":
        return np.asfortranarray(rng.standard_normal((r, c)).astype(dtype))
    # A strided view with a negative column stride into a larger buffer.
    base = rng.standard_normal((2 * r, 3 * c)).astype(dtype)
    view = base[::2, ::-3]
    assert view.shape == (r, c) and view.base is base
    return view


def compute(A, B, **kw):
    return matmul_cpu(check_operands(A, B, **kw))


@pytest.mark.parametrize("order_a, order_b", list(itertools.product("CFS", "CFS")))
@pytest.mark.parametrize("m, k, n", SHAPES, ids=lambda s: str(s))
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_matches_reference(rng, dtype, m, k, n, order_a, order_b):
    A = layout(rng, (m, k), dtype, order_a)
    B = layout(rng, (k, n), dtype, order_b)
    A0, B0 = A.copy(), B.copy()
    C = compute(A, B)
    assert C.shape == (m, n) and C.dtype == dtype
    assert_close(C, A, B)
    np.testing.assert_array_equal(A, A0)  # inputs are left alone
    np.testing.assert_array_equal(B, B0)


ALPHA_BETA = [(1.0, 0.0), (2.5, 0.0), (-0.5, 1.0), (1.0, -2.0), (0.0, 3.0), (0.75, 0.5)]


@pytest.mark.parametrize("alpha, beta", ALPHA_BETA)
@pytest.mark.parametrize("out_order", ["C", "F", "S"])
@pytest.mark.parametrize("m, k, n", [(1, 31, 1), (127, 129, 31), (131, 1009, 7)])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_out_alpha_beta(rng, dtype, m, k, n, out_order, alpha, beta):
    A = layout(rng, (m, k), dtype, "C")
    B = layout(rng, (k, n), dtype, "F")
    if out_order == "S":
        # A strided view; the elements around it must stay untouched.
        buf = rng.standard_normal((2 * m, 3 * n)).astype(dtype)
        out = buf[1::2, ::3]
        keep = np.ones(buf.shape, dtype=bool)
        keep[1::2, ::3] = False
        around = buf[keep].copy()
    else:
        out = layout(rng, (m, n), dtype, out_order)
    C0 = out.copy()
    C = compute(A, B, out=out, alpha=alpha, beta=beta)
    assert C is out  # written in place and returned
    assert_close(C, A, B, alpha, beta, C0)
    if out_order == "S":
        np.testing.assert_array_equal(buf[keep], around)


@pytest.mark.parametrize("m, k, n", [(127, 129, 31), (1, 4099, 2)])
@pytest.mark.parametrize("order", ["C", "F"])
def test_mixed_precision_promotes_to_float64(rng, m, k, n, order):
    A = layout(rng, (m, k), np.float32, order)
    B = layout(rng, (k, n), np.float64, order)
    C = compute(A, B)
    assert C.dtype == np.float64
    assert_close(C, A, B)  # held to the float64 bound: nothing was done in float32
    out = np.empty((m, n), dtype=np.float64)
    assert compute(B.T, A.T, out=out.T) is not None
    assert_close(out.T, B.T, A.T)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_beta_zero_ignores_nan_in_out(rng, dtype):
    A, B = layout(rng, (33, 17), dtype, "C"), layout(rng, (17, 5), dtype, "C")
    out = np.full((33, 5), np.nan, dtype=dtype)
    out[0, 0] = np.inf
    C = compute(A, B, out=out, alpha=2.0, beta=0.0)
    assert np.all(np.isfinite(C))
    assert_close(C, A, B, alpha=2.0)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_beta_nonzero_propagates_nan_in_out(rng, dtype):
    A, B = layout(rng, (33, 17), dtype, "C"), layout(rng, (17, 5), dtype, "C")
    out = layout(rng, (33, 5), dtype, "C")
    out[4, 2] = np.nan
    C = compute(A, B, out=out, beta=0.5)
    assert np.isnan(C[4, 2]) and np.isnan(C).sum() == 1


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_nan_and_inf_in_inputs_propagate(rng, dtype):
    m, k, n = 41, 23, 7
    A, B = layout(rng, (m, k), dtype, "F"), layout(rng, (k, n), dtype, "C")
    _ieee.plant(A, B)
    with np.errstate(invalid="ignore"):  # Inf * -Inf at C[8, 4] is expected
        C = compute(A, B)
    _ieee.check(C, A, B, what="numpy path")


def test_nan_alpha_gives_nan():
    # No BLAS shortcut for alpha: alpha * (A @ B) as IEEE says.
    C = compute(np.ones((3, 2)), np.ones((2, 4)), alpha=np.nan)
    assert np.all(np.isnan(C))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_k_zero(rng, dtype):
    A, B = np.empty((5, 0), dtype=dtype), np.empty((0, 3), dtype=dtype)
    C = compute(A, B)
    assert C.shape == (5, 3) and C.dtype == dtype and not C.any()
    out = layout(rng, (5, 3), dtype, "F")
    C0 = out.copy()
    assert compute(A, B, out=out, alpha=2.0, beta=-1.5) is out
    np.testing.assert_array_equal(out, (-1.5 * C0).astype(dtype))
    out[:] = np.nan
    compute(A, B, out=out, beta=0.0)
    assert not out.any() and not np.isnan(out).any()


@pytest.mark.parametrize("m, k, n", [(0, 7, 3), (4, 7, 0), (0, 0, 0), (0, 7, 0)])
def test_empty_result(m, k, n):
    A, B = np.ones((m, k)), np.ones((k, n))
    C = compute(A, B)
    assert C.shape == (m, n)
    out = np.empty((m, n))
    assert compute(A, B, out=out, beta=2.0) is out


# --- torch CPU tensors ------------------------------------------------------------


@pytest.mark.skipif(torch is None, reason="torch is not installed")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64] if torch else [])
def test_torch_cpu_round_trip(rng, dtype):
    m, k, n = 129, 257, 9
    tA = torch.from_numpy(rng.standard_normal((m, k))).to(dtype)
    tB = torch.from_numpy(rng.standard_normal((n, k))).to(dtype).T  # a transposed view
    ops = check_operands(tA, tB)
    C = _arrays.wrap(matmul_cpu(ops), ops.kind, ops.like)
    assert isinstance(C, torch.Tensor) and C.dtype == dtype and C.device.type == "cpu"
    assert_close(C.numpy(), tA.numpy(), tB.numpy())

    tout = torch.full((n, m), 3.0, dtype=dtype).T  # F-ordered out
    C0 = tout.numpy().copy()
    ops = check_operands(tA, tB, out=tout, alpha=-1.0, beta=2.0)
    res = _arrays.wrap(matmul_cpu(ops), ops.kind, tout)
    assert res is tout  # the caller's own out comes back
    assert_close(tout.numpy(), tA.numpy(), tB.numpy(), -1.0, 2.0, C0)


def test_lazy_names_are_bound_on_first_use():
    """tsm_core's lazily imported names are bound into the package on first use, so
    that a call in a loop reads an attribute, not an import (an import each time cost 2 us a call on the H100's host, 2026-11-27)."""
    import importlib

    import tsm_core

    for name in ("batched_matmul", "gemm", "row_checksums", "kmeans_assign"):
        f = getattr(tsm_core, name)
        assert vars(tsm_core)[name] is f
        assert f is getattr(importlib.import_module(tsm_core._LAZY[name]), name)
