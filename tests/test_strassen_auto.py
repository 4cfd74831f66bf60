"""strassen(levels="auto"): the model that picks 0 (cuBLAS), 1 or 2 levels, checked
against the committed H100 measurements (CPU), the levels argument, and on the GPU
that the pick runs and that levels=0 is cuBLAS's own result.

The model's table must be the committed benchmark's numbers, and over every measured
point the level it picks must be one the measurement shows not losing to cuBLAS.
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import numpy as np
import pytest

import tsm_core
from tsm_core.tiled import configs as _configs
from tsm_core.tiled import plan as _plan

try:
    import cupy
except ImportError:
    cupy = None

DATA = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "h100" / "strassen.json"


def _records():
    doc = json.loads(DATA.read_text())
    out = []
    for r in doc["records"]:
        ms = r["methods"]
        cb = ms["cublas"]["median_s"]
        ratio = {L: cb / ms[f"strassen{L}"]["median_s"] for L in (1, 2)}
        out.append((r["m"], r["k"], r["n"], r["dtype"], ratio))
    return out


RECORDS = _records()


def _aligned(m, k, n, item=4):
    # C-ordered operands from cupy.empty: rows of k, n and n elements, base pointers
    # aligned; the rows are 16-byte aligned where k and n are multiples of 16 / item.
    v = 16 // item
    return k % v == 0 and n % v == 0


# ------------------------------------------------------------------ the model (CPU)


def test_table_is_the_committed_measurement():
    """STRASSEN_MEASURED holds exactly the aligned square points of strassen.json."""
    got = {L: dict(pts) for L, pts in _plan.STRASSEN_MEASURED.items()}
    seen = 0
    for m, k, n, dtype, ratio in RECORDS:
        if dtype != "float32" or not (m == k == n) or not _aligned(m, k, n):
            continue
        seen += 1
        for L in (1, 2):
            assert got[L][m] == pytest.approx(ratio[L], abs=5e-4), (m, L)
    assert seen == len(got[1]) == len(got[2])


@pytest.mark.parametrize("rec", RECORDS, ids=lambda r: f"{r[0]}x{r[1]}x{r[2]}-{r[3]}")
def test_never_picks_a_measured_loss(rec):
    m, k, n, dtype, ratio = rec
    item = np.dtype(dtype).itemsize
    L = _plan.strassen_levels(m, k, n, item, aligned=_aligned(m, k, n, item))
    measured = 1.0 if L == 0 else ratio[L]
    assert measured >= 1.0, (rec, L)
    if L:  # and the pick is the measured faster level where both win
        assert measured >= max(ratio.values()) - 0.05


def test_acceptance_sizes():
    """The acceptance sizes: cuBLAS below 8192 (where Strassen measured losing or within
    the margin), two levels from 8192 on (1.17x-1.21x measured)."""
    want = {1024: 0, 2048: 0, 3000: 0, 4096: 0, 5001: 0, 8192: 2, 12288: 2, 16384: 2}
    for N, L in want.items():
        assert _plan.strassen_levels(N, N, N, 4, aligned=_aligned(N, N, N)) == L, N
    assert _plan.strassen_speedup(2, 16384, 16384, 16384) >= 1.10


def test_cublas_outside_the_measured_conditions(monkeypatch):
    N = 16384
    assert _plan.strassen_levels(N, N, N, 4) == 2
    assert _plan.strassen_levels(N, N, N, 8) == 0            # float64: cuBLAS DGEMM (DMMA)
    assert _plan.strassen_levels(N, N, N, 4, cc=80) == 0     # no gemm_ws, not measured
    assert _plan.strassen_levels(N, N, N, 4, cc=100) == 0
    assert _plan.strassen_levels(N, N, N, 4, aligned=False) == 0
    monkeypatch.setattr(_configs, "HYBRID2", False)
    assert _plan.strassen_levels(N, N, N, 4) == 1            # one level measured 1.054x
    monkeypatch.setattr(_configs, "SCRATCH1", False)
    assert _plan.strassen_levels(N, N, N, 4) == 0
    monkeypatch.setattr(_configs, "HYBRID2", True)
    monkeypatch.setattr(_configs, "WS_STRASSEN", False)
    assert _plan.strassen_levels(N, N, N, 4) == 0


def test_rectangular_by_the_smallest_side():
    # 8192 x 2048 x 16384 measured 0.99x at two levels: the short k keeps cuBLAS.
    assert _plan.strassen_levels(8192, 2048, 16384, 4) == 0
    assert _plan.strassen_levels(16384, 8192, 16384, 4) == 2
    assert _plan.strassen_levels(4096, 16384, 16384, 4) == 0
    assert _plan.strassen_levels(64, 65536, 65536, 4) == 0


def test_model_properties():
    """Over random shapes: a pick beats the margin, is never predicted above the best
    measured speedup, and the peeled rest only ever lowers the prediction."""
    rng = np.random.default_rng(0)
    best = {L: max(r for _, r in pts) for L, pts in _plan.STRASSEN_MEASURED.items()}
    for _ in range(2000):
        m, k, n = (int(x) for x in np.exp(rng.uniform(np.log(16), np.log(40000), 3)))
        L = _plan.strassen_levels(m, k, n, 4)
        for lv in (1, 2):
            s = _plan.strassen_speedup(lv, m, k, n)
            assert 0.0 <= s <= best[lv]
            f = 4 << lv
            assert s <= _plan.strassen_speedup(lv, m - m % f, k - k % f, n - n % f) + 1e-12
        if L:
            assert _plan.strassen_speedup(L, m, k, n) >= _plan.STRASSEN_MIN_GAIN
            assert min(m, k, n) >= 6144


# ------------------------------------------------------------------ the argument (CPU)


def test_auto_is_the_default():
    p = inspect.signature(tsm_core.strassen).parameters["levels"]
    assert p.default == "auto"


@pytest.mark.parametrize("bad", ["Auto", "1", 3, -1, True, np.bool_(False), 1.0, None, 2.5])
def test_levels_validation(bad):
    A = np.ones((4, 4))
    with pytest.raises(ValueError, match=r"levels must be 'auto', 0, 1 or 2; got"):
        tsm_core.strassen(A, A, levels=bad)


@pytest.mark.parametrize("levels", ["auto", 0, np.int64(0)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_numpy_vendor_product(rng, levels, dtype):
    A = rng.standard_normal((37, 53)).astype(dtype)
    B = rng.standard_normal((53, 29)).astype(dtype)
    C = tsm_core.strassen(A, B, levels=levels)
    assert C.dtype == dtype and np.array_equal(C, np.matmul(A, B))
    out = np.full((37, 29), np.nan, dtype=dtype)
    assert tsm_core.strassen(A, B, levels=levels, out=out) is out
    assert np.array_equal(out, np.matmul(A, B))


@pytest.mark.parametrize("levels", [1, 2, np.int32(2)])
def test_numpy_explicit_levels_still_strassen(rng, levels):
    A = rng.standard_normal((40, 33))
    B = rng.standard_normal((33, 50))
    assert np.allclose(tsm_core.strassen(A, B, levels=levels), A @ B, rtol=1e-12, atol=1e-12)


def test_empty_products(rng):
    for levels in ("auto", 0):
        assert tsm_core.strassen(np.ones((0, 3)), np.ones((3, 4)), levels=levels).shape == (0, 4)
        C = tsm_core.strassen(np.ones((2, 0)), np.ones((0, 4)), levels=levels)
        assert C.shape == (2, 4) and not C.any()


# ------------------------------------------------------------------ GPU


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(1000, 777, 1025), (2048, 2048, 2048), (33, 4100, 17)])
def test_gpu_levels0_and_auto_small_are_cublas(rng, dtype, shape):
    m, k, n = shape
    A = cupy.asarray(rng.standard_normal((m, k)).astype(dtype))
    B = cupy.asarray(rng.standard_normal((k, n)).astype(dtype))
    ref = cupy.matmul(A, B)
    for levels in (0, "auto"):
        out = cupy.full((m, n), cupy.nan, dtype=dtype)
        assert tsm_core.strassen(A, B, levels=levels, out=out) is out
        assert bool(cupy.array_equal(out, ref)), levels
        assert bool(cupy.array_equal(tsm_core.strassen(A, B, levels=levels), ref))


@pytest.mark.gpu
def test_gpu_auto_picks_by_the_model():
    from tsm_core.tiled import launch as _launch
    from tsm_core.tiled import strassen as _strassen

    N = 8192
    A = cupy.empty((N, N), cupy.float32)
    cc = _launch._cc(A.data.device_id)
    want = 2 if cc == 90 else 0
    assert _strassen.auto_levels(A, A, None) == want
    assert _strassen.auto_levels(A, A, cupy.empty((N, N), cupy.float32, order="F")) == 0
    assert _strassen.auto_levels(A[:, 1:], A[1:, 1:], None) == 0         # unaligned rows
    assert _strassen.auto_levels(A.astype(cupy.float64), A.astype(cupy.float64), None) == 0


@pytest.mark.gpu
def test_gpu_auto_large_is_accurate(rng):
    """At N = 8192 float32 (two levels on the H100): within 12**2 times cuBLAS's error,
    out NaN-poisoned first (see test_strassen.py for the bound's reason)."""
    N = 8192
    A = cupy.random.default_rng(1).standard_normal((N, N), dtype=cupy.float32)
    B = cupy.random.default_rng(2).standard_normal((N, N), dtype=cupy.float32)
    ref = cupy.matmul(A.astype(cupy.float64), B.astype(cupy.float64))
    out = cupy.full((N, N), cupy.nan, dtype=cupy.float32)
    C = tsm_core.strassen(A, B, out=out)

    def rel(X):
        return float(cupy.linalg.norm((X.astype(cupy.float64) - ref).ravel()) / cupy.linalg.norm(ref.ravel()))

    e_cublas = rel(cupy.matmul(A, B))
    assert C is out and bool(cupy.isfinite(out).all())
    assert rel(out) <= 144 * e_cublas


@pytest.mark.gpu
def test_gpu_torch_inputs():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    A = torch.randn(300, 200, device="cuda", dtype=torch.float64)
    B = torch.randn(200, 100, device="cuda", dtype=torch.float64)
    C = tsm_core.strassen(A, B)
    assert isinstance(C, torch.Tensor)
    torch.testing.assert_close(C, A @ B, rtol=1e-12, atol=1e-12)
