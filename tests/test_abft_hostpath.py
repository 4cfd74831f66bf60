"""ft_matmul's host path: the per-problem call plan (CPU, with stand-ins for the
device objects) and, on the GPU, that the cached plan gives the product and the
verdict of an uncached call whatever changes between calls (strides, dtype, device,
freed and reused memory, a fault).
"""

from __future__ import annotations

import contextlib
import types

import numpy as np
import pytest

import tsm_core
from tsm_apps import abft
from tsm_apps.abft import _core

try:
    import cupy
except ImportError:
    cupy = None


# ------------------------------------------------------------------ call plan (CPU)


class _Arr:
    """What _call_plan reads of a CuPy array: shape, strides, itemsize, device, flags."""

    def __init__(self, shape, dtype, order="C", device=0, ptr=4096):
        self.shape = shape
        self.dtype = np.dtype(dtype)
        self.itemsize = self.dtype.itemsize
        self.ndim = 2
        m, n = shape
        item = self.itemsize
        self.strides = (n * item, item) if order == "C" else (item, m * item)
        self.flags = types.SimpleNamespace(c_contiguous=order == "C" or m <= 1)
        self.data = types.SimpleNamespace(device_id=device, ptr=ptr)


def _ops(m, k, n, dtype="float32", orders=("C", "C"), device=0, ptr=4096):
    A = _Arr((m, k), dtype, orders[0], device, ptr)
    B = _Arr((k, n), dtype, orders[1], device, ptr + (1 << 30))
    xp = types.SimpleNamespace(cuda=types.SimpleNamespace(Device=lambda d: contextlib.nullcontext()))
    return types.SimpleNamespace(A=A, B=B, m=m, k=k, n=n, dtype=A.dtype, xp=xp)


@pytest.fixture
def stubbed(monkeypatch):
    """_call_plan without a GPU: streams and weight norms as tokens, and a planner
    that sends n <= 16 to TSM2R and the rest to cuBLAS (as tsm_core.plan might)."""
    calls = []

    def plan(m, k, n, dtype, order=("C", "C")):
        calls.append((m, k, n, np.dtype(dtype).name, tuple(order)))
        return types.SimpleNamespace(algorithm="tsm2r" if n <= 16 else "cublas")

    monkeypatch.setattr(_core, "_plans", {})
    monkeypatch.setattr(_core.arrays, "side_stream", lambda purpose: ("stream", purpose))
    monkeypatch.setattr(_core, "_weight_norms", lambda xp, n, c: ("norms", n, c))
    monkeypatch.setattr(tsm_core, "plan", plan)
    return calls


def test_plan_matches_the_uncached_computation(stubbed):
    for (m, k, n), dt in [((8192,) * 3, "float32"), ((8192,) * 3, "float64"), ((300, 200, 100), "float64"),
                          ((5000, 4096, 8), "float32")]:
        for bound, lam in (("probabilistic", 8.0), ("worst-case", 3.0)):
            p = _core._call_plan(_ops(m, k, n, dt), 2, bound, lam)
            assert p.coef == _core._coefficients(m, k, n, np.dtype(dt), bound, lam, True)
            assert p.band == _core.band_rows(m, k, n, dt)
            assert p.norms == ("norms", n, 2)
            assert p.streams == tuple(("stream", s) for s in ("abft-checks", "abft-band", "abft-cpass"))
    p = _core._call_plan(_ops(8192, 8192, 8192, "float64"), 2, "probabilistic", 8.0)
    assert p.band == 768 and p.direct == (True, True)
    assert (7424, 8192, 8192, "float64", ("C", "C")) in stubbed
    assert (768, 8192, 8192, "float64", ("C", "C")) in stubbed
    assert _core._call_plan(_ops(5000, 4096, 8), 2, "probabilistic", 8.0).direct == (False,)


def test_only_c_ordered_a_is_banded(stubbed):
    p = _core._call_plan(_ops(8192, 8192, 8192, "float64", orders=("F", "C")), 2, "probabilistic", 8.0)
    assert p.band == 0 and p.direct == (True,)
    assert (8192, 8192, 8192, "float64", ("F", "C")) in stubbed


def test_plan_cached_per_problem(stubbed):
    base = _ops(4096, 4096, 4096)
    p = _core._call_plan(base, 2, "probabilistic", 8.0)
    n_calls = len(stubbed)
    # The same problem in other memory (a freed and reused pointer, or another array):
    # the same plan, no new lookups.
    assert _core._call_plan(_ops(4096, 4096, 4096, ptr=1 << 34), 2, "probabilistic", 8.0) is p
    assert len(stubbed) == n_calls
    # Anything the plan depends on: a new plan.
    others = [_core._call_plan(_ops(4096, 4096, 4096, orders=("F", "C")), 2, "probabilistic", 8.0),
              _core._call_plan(_ops(4096, 4096, 4096, orders=("C", "F")), 2, "probabilistic", 8.0),
              _core._call_plan(_ops(4096, 4096, 4096, "float64"), 2, "probabilistic", 8.0),
              _core._call_plan(_ops(4096, 4096, 4096, device=1), 2, "probabilistic", 8.0),
              _core._call_plan(_ops(4096, 4096, 4095), 2, "probabilistic", 8.0),
              _core._call_plan(base, 3, "probabilistic", 8.0),
              _core._call_plan(base, 2, "worst-case", 8.0),
              _core._call_plan(base, 2, "probabilistic", 9.0)]
    assert all(o is not p for o in others)
    assert len({id(o) for o in others}) == len(others)
    assert others[-1].coef != p.coef and others[-2].coef != p.coef


def test_plan_cache_is_bounded(stubbed):
    for n in range(1, 2 * _core.PLAN_CACHE_SIZE + 2):
        _core._call_plan(_ops(64, 64, n), 1, "probabilistic", 8.0)
        assert len(_core._plans) <= _core.PLAN_CACHE_SIZE


def test_empty_problems_are_not_routed(stubbed):
    assert _core._call_plan(_ops(64, 0, 64), 2, "probabilistic", 8.0).direct == (False,)
    assert _core._call_plan(_ops(0, 64, 64), 2, "probabilistic", 8.0).direct == (False,)
    assert stubbed == []


# ------------------------------------------------------------------ numpy path (CPU)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_numpy_path_unchanged(rng, dtype):
    A = rng.standard_normal((257, 131)).astype(dtype)
    B = rng.standard_normal((131, 65)).astype(dtype)
    C, rep = abft.ft_matmul(A, B)
    assert rep.clean and 0 < rep.max_ratio < 1 and np.array_equal(C, A @ B)
    C, rep = abft.ft_matmul(A, B, inject=abft.BitFlip(7, 42, bit=30 if dtype == np.float32 else 60))
    assert [(f.row, f.col) for f in rep.corrections] == [(7, 42)]
    tol = 1e-4 if dtype == np.float32 else 1e-12  # the corrected element: round-off of its row sum
    assert np.allclose(C, A @ B, rtol=tol, atol=tol)


# ------------------------------------------------------------------ GPU


def _check(A, B, C, rep, exact=None):
    assert rep.clean, rep
    ref = cupy.asnumpy(A).astype(np.float64) @ cupy.asnumpy(B).astype(np.float64)
    u = np.finfo(np.dtype(C.dtype)).eps / 2
    bound = 2 * (A.shape[1] + 2) * u * (np.abs(cupy.asnumpy(A)).astype(np.float64) @ np.abs(cupy.asnumpy(B)))
    assert np.all(np.abs(cupy.asnumpy(C) - ref) <= bound)
    if exact is not None:
        assert bool(cupy.array_equal(C, exact))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gpu_product_is_the_dispatchers(dtype):
    """The cached route gives tsm_core.matmul's own result: bit for bit where that is
    cuBLAS (cupy.matmul), within the GEMM bound where it is the dispatcher's kernel
    (a tall-and-skinny product; a split-K reduction need not be bitwise repeatable)."""
    rng = cupy.random.default_rng(0)
    for m, k, n in [(1000, 777, 513), (20000, 2048, 8), (64, 3000, 2)]:
        A = rng.standard_normal((m, k), dtype=np.float64).astype(dtype)
        B = rng.standard_normal((k, n), dtype=np.float64).astype(dtype)
        cublas = tsm_core.plan(m, k, n, dtype).algorithm == "cublas"
        for _ in range(2):  # the first call makes the plan, the second uses it
            C, rep = abft.ft_matmul(A, B)
            _check(A, B, C, rep, exact=cupy.matmul(A, B) if cublas else None)


@pytest.mark.gpu
def test_gpu_cache_follows_strides_dtype_and_memory():
    rng = cupy.random.default_rng(1)
    shape = (1536, 1024, 768)
    m, k, n = shape
    for dtype in (np.float32, np.float64, np.float32):
        A = rng.standard_normal((m, k), dtype=np.float64).astype(dtype)
        B = rng.standard_normal((k, n), dtype=np.float64).astype(dtype)
        wide = cupy.empty((m, k + 4), dtype)
        wide[:, :k] = A
        for a, b in [(A, B), (cupy.asfortranarray(A), B), (A, cupy.asfortranarray(B)),
                     (wide[:, :k], B), (cupy.asfortranarray(A), cupy.asfortranarray(B))]:
            C, rep = abft.ft_matmul(a, b)
            _check(a, b, C, rep, exact=cupy.matmul(a, b))
        del A, B, C, wide
        cupy.get_default_memory_pool().free_all_blocks()  # the next operands may reuse the memory


@pytest.mark.gpu
def test_gpu_fault_after_the_plan_is_cached():
    rng = cupy.random.default_rng(2)
    A = rng.standard_normal((2048, 1024))
    B = rng.standard_normal((1024, 512))
    abft.ft_matmul(A, B)
    C, rep = abft.ft_matmul(A, B, inject=abft.BitFlip(100, 200, bit=60))
    assert [(f.row, f.col) for f in rep.corrections] == [(100, 200)]
    assert bool(cupy.allclose(C, A @ B, rtol=1e-12, atol=1e-10))


@pytest.mark.gpu
def test_gpu_banded_float64():
    """The banded schedule (float64, M >= 4096, 2MNK >= 2^39): the band's rows by
    their own cuBLAS call, within the GEMM's round-off of one call; overlap on/off."""
    rng = cupy.random.default_rng(3)
    m, k, n = 4096, 8192, 8192
    assert _core.band_rows(m, k, n, "float64") > 0
    A = rng.standard_normal((m, k))
    B = rng.standard_normal((k, n))
    ref = cupy.matmul(A, B)
    u = np.finfo(np.float64).eps / 2
    bound = 2 * (k + 2) * u * (cupy.abs(A) @ cupy.abs(B))
    for overlap in (True, False, True):
        C, rep = abft.ft_matmul(A, B, overlap=overlap)
        assert rep.clean and bool(cupy.all(cupy.abs(C - ref) <= bound))
    C, rep = abft.ft_matmul(A, B, inject=abft.BitFlip(4000, 17, bit=62))  # in the band
    assert [(f.row, f.col) for f in rep.corrections] == [(4000, 17)]


@pytest.mark.gpu
def test_gpu_other_device():
    if cupy.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("one GPU")
    rng = np.random.default_rng(4)
    a, b = rng.standard_normal((700, 500)), rng.standard_normal((500, 300))
    for dev in (0, 1, 0):
        with cupy.cuda.Device(dev):
            A, B = cupy.asarray(a), cupy.asarray(b)
            C, rep = abft.ft_matmul(A, B)
            assert C.data.device_id == dev
            _check(A, B, C, rep)


@pytest.mark.gpu
def test_gpu_torch_inputs():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    A = torch.randn(900, 400, device="cuda", dtype=torch.float64)
    B = torch.randn(400, 300, device="cuda", dtype=torch.float64)
    for _ in range(2):
        C, rep = abft.ft_matmul(A, B)
        assert isinstance(C, torch.Tensor) and rep.clean
        torch.testing.assert_close(C, A @ B, rtol=1e-12, atol=1e-10)
