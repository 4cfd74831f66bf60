"""apps/abft on the GPU: the bodies of tests/test_abft.py on CuPy, plus the GPU-only parts.

The fused checksum kernel (tsm_core/abft/abft.cu) is compared with float64
references on awkward sizes (1, primes, non-multiples of its 4-row blocks) and
views; its generated weights must equal ``abft.weights`` bit for bit. The verified
product is checked with the verification overlapped with the GEMM (the default)
and serial, on CuPy arrays and torch CUDA tensors.
"""

from __future__ import annotations

import numpy as np
import pytest

import test_abft as body  # tests/ is on sys.path under pytest
from tsm_apps import abft
from tsm_core.abft import checksums as _abft

try:
    import cupy
except ImportError:  # CPU-only CI: every test here is skipped by conftest
    cupy = None

pytestmark = pytest.mark.gpu


def test_row_checksums_gpu():
    body.check_row_checksums(cupy, np.random.default_rng(11))


def test_generated_weights_exact():
    for p in (1, 7, 1000, 4099):
        X = cupy.eye(p, dtype=cupy.float64)
        for c in range(1, abft.MAX_C + 1):
            Y, Z = _abft.row_checksums(X, c=c, weighted_squares=True)
            W = abft.weights(p, c)
            np.testing.assert_array_equal(Y.get(), W)  # one nonzero per row: exact
            np.testing.assert_array_equal(Z.get(), W * W)


def test_row_checksums_deterministic():
    X = cupy.random.default_rng(0).standard_normal((3001, 2049), dtype=cupy.float32)
    a, _ = _abft.row_checksums(X, c=2)
    b, _ = _abft.row_checksums(X, c=2)
    assert bool(cupy.all(a == b))


def test_encode_gpu():
    body.check_encode(cupy, np.random.default_rng(12))


def test_no_false_alarm_gpu():
    worst = body.check_no_false_alarm(cupy, np.random.default_rng(13), 1500)
    assert worst < 0.5


def test_no_false_alarm_serial_gpu(monkeypatch):
    rng = np.random.default_rng(14)
    for case in range(200):
        dt = body.DTYPES[case % 2]
        m, k, n = body.random_shape(rng, big=True)
        A = body.make(cupy, rng, (m, k), dt, body.DISTS[case % 6])
        B = body.make(cupy, rng, (k, n), dt)
        C1, r1 = abft.ft_matmul(A, B, overlap=False)
        C2, r2 = abft.ft_matmul(A, B, overlap=True)
        assert r1.clean and r2.clean
        assert bool(cupy.all(C1 == C2)) and r1.max_ratio == r2.max_ratio


def test_single_errors_gpu():
    body.check_single_errors(cupy, np.random.default_rng(15), 300)


def test_bit_flips_gpu():
    body.check_bit_flips(cupy, np.random.default_rng(16), 64 * 4)


def test_nonfinite_and_multiple_gpu():
    body.check_nonfinite_and_multiple(cupy, np.random.default_rng(17))


def test_cholesky_gpu():
    body.check_cholesky(cupy, np.random.default_rng(18), n=700, block=128)


def test_large_product_gpu():
    rng = cupy.random.default_rng(19)
    for dt in (cupy.float32, cupy.float64):
        A = rng.standard_normal((2048, 3001), dtype=dt)
        B = rng.standard_normal((3001, 1999), dtype=dt)
        C0, rep0 = abft.ft_matmul(A, B)
        assert rep0.clean and rep0.max_ratio < 0.1
        ref = A.astype(cupy.float64) @ B.astype(cupy.float64)
        u = np.finfo(dt).eps / 2
        assert bool(cupy.all(cupy.abs(C0 - ref) <= 2 * 3003 * u * (cupy.abs(A).astype(cupy.float64) @ cupy.abs(B))))
        lim = rep0.limits(1000, 1500)
        C, rep = abft.ft_matmul(A, B, inject=abft.AddError(1000, 1500, 3 * lim["locate"]))
        assert [(x.row, x.col, x.method) for x in rep.corrections] == [(1000, 1500, "checksum")]
        assert float(cupy.abs(C - C0).max()) <= 2 * float(rep0.thresholds[1000, 0])
        with pytest.raises(abft.ABFTError, match="too small to locate"):  # detected, not locatable
            abft.ft_matmul(A, B, inject=abft.AddError(1000, 1500, 3 * lim["flag"]))
        C, rep = abft.ft_matmul(A, B, inject=abft.AddError(1000, 1500, 3 * lim["flag"]), recompute=True)
        assert rep.recomputed_rows == (1000,)
        assert float(cupy.abs(C - C0).max()) <= 2 * float(rep0.thresholds[1000, 0])


def test_torch_cuda():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    A = torch.randn(300, 200, device="cuda", dtype=torch.float64)
    B = torch.randn(200, 100, device="cuda", dtype=torch.float64)
    C, rep = abft.ft_matmul(A, B, inject=abft.AddError(2, 3, 100.0))
    assert isinstance(C, torch.Tensor) and C.is_cuda and [(x.row, x.col) for x in rep.corrections] == [(2, 3)]
    torch.testing.assert_close(C, A @ B)
    R = abft.encode(A, 2)
    assert isinstance(R, torch.Tensor) and R.is_cuda
    torch.testing.assert_close(R[:, 0], A.sum(1))


def test_banded_product_gpu():
    """A float64 product large enough for the banded schedule (two GEMMs, most of the
    C pass beside the band's): clean, within round-off of float64 references, the
    same with and without overlap, and a fault injected into the band located."""
    from tsm_apps.abft._core import band_rows

    m, k, n = 4099, 8191, 8193
    band = band_rows(m, k, n, np.float64)
    assert band > 0
    rng = cupy.random.default_rng(21)
    A = rng.standard_normal((m, k), dtype=cupy.float64)
    B = rng.standard_normal((k, n), dtype=cupy.float64)
    C1, r1 = abft.ft_matmul(A, B)
    C2, r2 = abft.ft_matmul(A, B, overlap=False)
    assert r1.clean and r2.clean and r1.max_ratio < 0.1
    assert bool(cupy.all(C1 == C2)) and r1.max_ratio == r2.max_ratio
    C0 = A @ B  # one cuBLAS call: the band may differ in the last bits only
    u = np.finfo(np.float64).eps / 2
    bound = 2 * (k + 2) * u * (cupy.abs(A) @ cupy.abs(B))
    assert bool(cupy.all(cupy.abs(C1 - C0) <= bound))
    Cf, rf = abft.ft_matmul(cupy.asfortranarray(A), B)  # F-ordered A: one GEMM, no band
    assert rf.clean and bool(cupy.all(cupy.abs(Cf - C0) <= bound))
    del Cf
    for row in (m - band - 1, m - band, m - 1):  # both sides of the split, and the band
        lim = r1.limits(row, 4000)
        C, rep = abft.ft_matmul(A, B, inject=abft.AddError(row, 4000, 3 * lim["locate"]))
        assert [(x.row, x.col, x.method) for x in rep.corrections] == [(row, 4000, "checksum")]
        assert float(cupy.abs(C - C1).max()) <= 2 * float(r1.thresholds[row, 0])
