"""matmul's host path: the key of a call, the remembered decisions, and when they are
not used (new strides, dtype, device, a reused address, overlap). CPU tests use numpy
arrays and torch CPU tensors, which take the same key and cache logic as CuPy arrays
and torch CUDA tensors; the GPU tests skip without a GPU."""

from __future__ import annotations

import math

import numpy as np
import pytest

import tsm_core
from tsm_core.runtime.checks import check_operands
from tsm_core.tsm2 import api

try:
    import torch
except ImportError:  # pragma: no cover
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")


@pytest.fixture(autouse=True)
def fresh():
    api.forget_decisions()
    yield
    api.forget_decisions()


def normal(rng, shape, dtype=np.float64, order="C"):
    return np.asarray(rng.standard_normal(shape), dtype=dtype, order=order)


def ref(A, B, out=None, alpha=1.0, beta=0.0):
    C = alpha * (np.asarray(A, np.float64) @ np.asarray(B, np.float64))
    if out is not None and beta != 0:
        C = C + beta * np.asarray(out, np.float64)
    return C


def key(A, B, out=None, alpha=1.0, beta=0.0, algorithm="auto"):
    return api.host_key(A, B, out, alpha, beta, algorithm)


# --- the key ----------------------------------------------------------------------


def test_key_equal_for_equal_properties_not_pointers():
    rng = np.random.default_rng(0)
    A, B = normal(rng, (7, 5)), normal(rng, (5, 3))
    assert key(A, B) == key(A.copy(), B.copy())
    assert key(A, B) == key(A, B, alpha=1, beta=0)  # ints equal to the defaults


def test_key_changes_with_strides_dtype_shape_and_flags():
    rng = np.random.default_rng(1)
    A, B = normal(rng, (7, 5)), normal(rng, (5, 3))
    k0 = key(A, B)
    assert key(np.asfortranarray(A), B) != k0  # same shape, new strides
    assert key(normal(rng, (14, 5))[::2], B) != k0  # a strided view
    assert key(A.astype(np.float32), B) != k0  # dtype
    assert key(normal(rng, (8, 5)), B) != k0  # shape
    assert key(A, B, alpha=2.0) != k0
    out = np.empty((7, 3))
    assert key(A, B, out=out) != k0
    assert key(A, B, out=out, beta=1.0) != key(A, B, out=out)
    assert key(A, B, beta=1.0) == k0  # beta is not read without out
    assert key(A, B, algorithm="cublas") != k0
    ro = out.copy()
    ro.flags.writeable = False
    assert key(A, B, out=ro) != key(A, B, out=out)


@pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")
def test_key_none_for_what_the_full_path_must_check():
    rng = np.random.default_rng(2)
    A, B = normal(rng, (4, 3)), normal(rng, (3, 2))
    assert key(A, B, alpha=np.float64(2.0)) is None
    assert key(A, B, beta=True) is None
    assert key(A, [[1.0]]) is None
    assert key(np.ma.masked_array(A), B) is None
    assert key(A, B, out=np.matrix(np.zeros((4, 2)))) is None


@needs_torch
def test_torch_key_has_device_dtype_strides_and_grad():
    A = torch.randn(6, 4, dtype=torch.float64)
    B = torch.randn(4, 3, dtype=torch.float64)
    k0 = key(A, B)
    assert key(A.clone(), B.clone()) == k0
    assert key(A.t().contiguous().t(), B) != k0  # same shape, column-major
    assert key(A.float(), B) != k0
    assert key(A.requires_grad_(True), B) != k0
    if torch.cuda.is_available():  # pragma: no cover - GPU
        assert key(A.detach().cuda(), B.cuda()) != key(A.detach(), B)


# --- the cache ----------------------------------------------------------------------


def test_decision_remembered_and_reused():
    rng = np.random.default_rng(3)
    A, B = normal(rng, (9, 4)), normal(rng, (4, 6))
    C = tsm_core.matmul(A, B)
    k = key(A, B)
    assert api._DECISIONS[k].route == api._R_NUMPY
    A2, B2 = normal(rng, (9, 4)), normal(rng, (4, 6))
    np.testing.assert_allclose(tsm_core.matmul(A2, B2), ref(A2, B2), rtol=1e-12)
    np.testing.assert_allclose(C, ref(A, B), rtol=1e-12)


@pytest.mark.parametrize("order_a", ["C", "F"])
@pytest.mark.parametrize("order_out", ["C", "F", "T"])
@pytest.mark.parametrize("alpha,beta", [(1.0, 0.0), (2.0, 0.0), (1.0, 1.0), (-0.5, 0.25)])
def test_cached_calls_match_reference(order_a, order_out, alpha, beta):
    rng = np.random.default_rng(4)
    for _ in range(3):  # the first call decides, the others reuse
        A, B = normal(rng, (11, 7), order=order_a), normal(rng, (7, 5))
        out = normal(rng, (5, 11)).T if order_out == "T" else normal(rng, (11, 5), order=order_out)
        want = ref(A, B, out, alpha, beta)
        got = tsm_core.matmul(A, B, out=out, alpha=alpha, beta=beta)
        assert got is out
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_beta_without_out_is_not_read():
    rng = np.random.default_rng(5)
    A, B = normal(rng, (6, 3)), normal(rng, (3, 4))
    for _ in range(2):
        np.testing.assert_allclose(tsm_core.matmul(A, B, beta=3.0), A @ B, rtol=1e-12)


def test_beta_zero_ignores_nan_in_out_on_hits():
    rng = np.random.default_rng(6)
    A, B = normal(rng, (6, 3)), normal(rng, (3, 4))
    for _ in range(2):
        out = np.full((6, 4), np.nan)
        np.testing.assert_allclose(tsm_core.matmul(A, B, out=out, alpha=2.0), 2 * (A @ B), rtol=1e-12)


def test_same_shape_new_strides_is_a_new_decision():
    rng = np.random.default_rng(7)
    A, B = normal(rng, (8, 8)), normal(rng, (8, 3))
    tsm_core.matmul(A, B)
    n0 = len(api._DECISIONS)
    AF = np.asfortranarray(A)
    np.testing.assert_allclose(tsm_core.matmul(AF, B), A @ B, rtol=1e-12)
    assert len(api._DECISIONS) == n0 + 1
    AT = A.T  # the same strides as AF: the same decision
    np.testing.assert_allclose(tsm_core.matmul(AT, B), A.T @ B, rtol=1e-12)
    assert len(api._DECISIONS) == n0 + 1
    AS = normal(rng, (8, 16))[:, ::2]  # same shape, strided rows
    np.testing.assert_allclose(tsm_core.matmul(AS, B), AS @ B, rtol=1e-12)
    assert len(api._DECISIONS) == n0 + 2


def test_same_shape_new_dtype_is_a_new_decision():
    rng = np.random.default_rng(8)
    A, B = normal(rng, (8, 5)), normal(rng, (5, 3))
    tsm_core.matmul(A, B)
    C = tsm_core.matmul(A.astype(np.float32), B.astype(np.float32))
    assert C.dtype == np.float32
    # mixed dtypes promote on the general path, every time
    for _ in range(2):
        C = tsm_core.matmul(A.astype(np.float32), B)
        assert C.dtype == np.float64
    assert api._DECISIONS[key(A.astype(np.float32), B)].route is None


def test_reused_address_with_new_layout_does_not_reuse_decision():
    # One buffer, viewed twice at the same address with the same shape but other
    # strides: the second call must not take the first call's decision.
    rng = np.random.default_rng(9)
    buf = normal(rng, (64,))
    A1 = buf[:36].reshape(6, 6)
    A2 = np.lib.stride_tricks.as_strided(buf, shape=(6, 6), strides=(8, 48))  # F view, same ptr
    assert A1.__array_interface__["data"][0] == A2.__array_interface__["data"][0]
    B = normal(rng, (6, 2))
    np.testing.assert_allclose(tsm_core.matmul(A1, B), A1 @ B, rtol=1e-12)
    assert key(A1, B) != key(A2, B)
    np.testing.assert_allclose(tsm_core.matmul(A2, B), A2 @ B, rtol=1e-12)


def test_freed_and_reused_memory_keeps_overlap_checks():
    # A decision made with a separate out must not let a later call whose out is a
    # view of A (same properties) through: overlap is checked on every call.
    rng = np.random.default_rng(10)
    A, B = normal(rng, (6, 6)), normal(rng, (6, 6))
    out = np.empty((6, 6))
    tsm_core.matmul(A, B, out=out)
    tsm_core.matmul(A, B, out=out)
    assert key(A, B, out=A) == key(A, B, out=out)
    before = A.copy()
    with pytest.raises(ValueError, match="out shares memory with A"):
        tsm_core.matmul(A, B, out=A)
    with pytest.raises(ValueError, match="out shares memory with B"):
        tsm_core.matmul(A, B, out=B)
    np.testing.assert_array_equal(A, before)
    del out
    out2 = np.empty((6, 6))  # whatever address it gets
    np.testing.assert_allclose(tsm_core.matmul(A, B, out=out2), A @ B, rtol=1e-12)


def test_interleaved_out_goes_to_exact_check():
    # out interleaved with B, no element shared: the hit's conservative range check
    # sends it to the general path, which computes it.
    rng = np.random.default_rng(11)
    A = normal(rng, (5, 5))
    buf = normal(rng, (5, 4))
    B, out = buf[:, 0::2], buf[:, 1::2]
    tsm_core.matmul(A, normal(rng, (5, 2)), out=normal(rng, (5, 2)))  # decide first
    want = A @ B
    np.testing.assert_allclose(tsm_core.matmul(A, B, out=out), want, rtol=1e-12)


def test_errors_never_remembered():
    rng = np.random.default_rng(12)
    A, B = normal(rng, (4, 3)), normal(rng, (4, 2))
    for _ in range(2):
        with pytest.raises(ValueError, match="inner dimensions differ"):
            tsm_core.matmul(A, B)
    assert key(A, B) not in api._DECISIONS
    with pytest.raises(ValueError, match="algorithm must be one of"):
        tsm_core.matmul(A, B.T, algorithm="nope")


def test_read_only_out_refused_after_a_decision():
    rng = np.random.default_rng(13)
    A, B = normal(rng, (4, 3)), normal(rng, (3, 2))
    out = np.empty((4, 2))
    tsm_core.matmul(A, B, out=out)
    out.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        tsm_core.matmul(A, B, out=out)


def test_empty_products_stay_on_general_path():
    for m, k, n in [(0, 3, 2), (3, 0, 2), (3, 2, 0)]:
        for _ in range(2):
            out = np.full((m, n), 5.0)
            C = tsm_core.matmul(np.ones((m, k)), np.ones((k, n)), out=out, beta=2.0)
            np.testing.assert_array_equal(C, np.full((m, n), 10.0 if k == 0 else 5.0))
        assert api._DECISIONS[key(np.ones((m, k)), np.ones((k, n)), out, 1.0, 2.0)].route is None


def test_table_is_bounded(monkeypatch):
    monkeypatch.setattr(api, "DECISIONS_MAX", 4)
    rng = np.random.default_rng(14)
    for m in range(1, 12):
        tsm_core.matmul(normal(rng, (m, 2)), normal(rng, (2, 2)))
        assert len(api._DECISIONS) <= 4


def test_message_names_b_when_out_is_b():
    rng = np.random.default_rng(15)
    A = normal(rng, (6, 6))
    B = normal(rng, (6, 3))
    with pytest.raises(ValueError, match="out shares memory with B"):
        check_operands(A, B, out=B)
    # out is B and also meets A (A a view of the same buffer): B is named.
    buf = normal(rng, (6, 9))
    A2, B2 = buf[:, :6], buf[:, 6:]
    with pytest.raises(ValueError, match="out shares memory with B"):
        check_operands(buf[:, :6][:, :6], B2, out=B2)
    with pytest.raises(ValueError, match="out shares memory with A"):
        check_operands(A2, buf[:6, :3].copy()[:6], out=A2[:, :3])


# --- torch tensors (CPU here; CUDA on the GPU) --------------------------------------


@needs_torch
@pytest.mark.parametrize("alpha,beta", [(1.0, 0.0), (2.0, 0.0), (0.5, -1.5)])
@pytest.mark.parametrize("out_layout", [None, "C", "T"])
def test_torch_route_matches_reference(alpha, beta, out_layout):
    g = torch.Generator().manual_seed(0)
    for _ in range(3):
        A = torch.randn(13, 6, dtype=torch.float64, generator=g)
        B = torch.randn(9, 6, dtype=torch.float64, generator=g).t()  # F-ordered
        out = None
        if out_layout == "C":
            out = torch.randn(13, 9, dtype=torch.float64, generator=g)
        elif out_layout == "T":
            out = torch.randn(9, 13, dtype=torch.float64, generator=g).t()
        want = ref(A.numpy(), B.numpy(), None if out is None else out.numpy().copy(), alpha, beta)
        got = tsm_core.matmul(A, B, out=out, alpha=alpha, beta=beta)
        if out is not None:
            assert got is out
        assert isinstance(got, torch.Tensor) and got.dtype == torch.float64
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-12, atol=1e-12)
    k = key(A, B, out, alpha, beta)
    assert api._DECISIONS[k].route == api._R_TORCH


@needs_torch
def test_torch_grad_refused_after_a_decision():
    A, B = torch.randn(4, 3, dtype=torch.float64), torch.randn(3, 2, dtype=torch.float64)
    tsm_core.matmul(A, B)
    with pytest.raises(TypeError, match="requires grad"):
        tsm_core.matmul(A.requires_grad_(True), B)


@needs_torch
def test_torch_overlap_checked_on_hits():
    A, B = torch.randn(5, 5, dtype=torch.float64), torch.randn(5, 5, dtype=torch.float64)
    out = torch.empty(5, 5, dtype=torch.float64)
    tsm_core.matmul(A, B, out=out)
    tsm_core.matmul(A, B, out=out)
    with pytest.raises(ValueError, match="out shares memory with B"):
        tsm_core.matmul(A, B, out=B)
    with pytest.raises(ValueError, match="out shares memory with A"):
        tsm_core.matmul(A, B, out=A)


@needs_torch
def test_torch_expanded_out_stays_on_general_path():
    A, B = torch.randn(4, 3, dtype=torch.float64), torch.randn(3, 2, dtype=torch.float64)
    out = torch.zeros(1, 2, dtype=torch.float64).expand(4, 2)
    try:
        tsm_core.matmul(A, B, out=out)
    except (ValueError, RuntimeError):
        pass
    d = api._DECISIONS.get(key(A, B, out))
    assert d is None or d.route is None


# --- GPU (skipped without one) ---------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("shape", [(37, 29, 5), (100_000, 64, 4), (50_000, 8, 8), (300, 700, 500)])
@pytest.mark.parametrize("alpha,beta", [(1.0, 0.0), (1.5, 0.0), (0.5, -2.0)])
def test_gpu_cached_calls_cupy(dtype, shape, alpha, beta):
    import cupy as cp

    m, k, n = shape
    rng = np.random.default_rng(20)
    tol = 1e-4 if dtype == "float32" else 1e-11
    for order in ("C", "F"):
        for _ in range(3):
            A = cp.asarray(normal(rng, (m, k), dtype, order))
            B = cp.asarray(normal(rng, (k, n), dtype))
            out0 = normal(rng, (m, n), dtype)
            out = cp.asarray(out0)
            want = ref(cp.asnumpy(A), cp.asnumpy(B), out0, alpha, beta)
            got = tsm_core.matmul(A, B, out=out, alpha=alpha, beta=beta)
            assert got is out
            err = np.linalg.norm(cp.asnumpy(got) - want) / max(np.linalg.norm(want), 1e-300)
            assert err < tol
            C = tsm_core.matmul(A, B, alpha=alpha)
            want2 = ref(cp.asnumpy(A), cp.asnumpy(B), None, alpha)
            err = np.linalg.norm(cp.asnumpy(C) - want2) / max(np.linalg.norm(want2), 1e-300)
            assert err < tol


@pytest.mark.gpu
def test_gpu_cached_calls_torch_cuda():
    if torch is None or not torch.cuda.is_available():
        pytest.skip("torch CUDA")
    g = torch.Generator(device="cuda").manual_seed(0)
    for m, k, n in [(37, 29, 5), (100_000, 64, 4), (300, 700, 500)]:
        for alpha, beta in [(1.0, 0.0), (2.0, 0.5)]:
            for _ in range(3):
                A = torch.randn(m, k, device="cuda", dtype=torch.float64, generator=g)
                B = torch.randn(k, n, device="cuda", dtype=torch.float64, generator=g)
                out = torch.full((m, n), float("nan") if beta == 0 else 1.0, device="cuda",
                                 dtype=torch.float64)
                want = ref(A.cpu().numpy(), B.cpu().numpy(), out.cpu().numpy(), alpha, beta)
                got = tsm_core.matmul(A, B, out=out, alpha=alpha, beta=beta)
                assert got is out
                np.testing.assert_allclose(got.cpu().numpy(), want, rtol=1e-10, atol=1e-10)


@pytest.mark.gpu
def test_gpu_cupy_out_is_b_named_b():
    import cupy as cp

    A = cp.random.standard_normal((37, 37))
    B = cp.random.standard_normal((37, 5))
    for _ in range(2):
        with pytest.raises(ValueError, match="out shares memory with B"):
            tsm_core.matmul(A, B, out=B)


@pytest.mark.gpu
def test_gpu_reused_pointer_new_layout():
    import cupy as cp

    rng = np.random.default_rng(21)
    A = cp.asarray(normal(rng, (512, 64)))
    B = cp.asarray(normal(rng, (64, 4)))
    tsm_core.matmul(A, B)
    ptr = A.data.ptr
    del A
    AF = cp.asfortranarray(cp.asarray(normal(rng, (512, 64))))  # may land at the same address
    want = cp.asnumpy(AF) @ cp.asnumpy(B)
    got = cp.asnumpy(tsm_core.matmul(AF, B))
    np.testing.assert_allclose(got, want, rtol=1e-11)
    assert isinstance(ptr, int)


# --- the random-products bench: generator, harness and JSON on the CPU ------------------


def test_random_products_generator_seeded_and_bounded():
    from tsm_core.bench import _random as R

    ps = R.generate(500, seed=3)
    assert ps == R.generate(500, seed=3)
    assert ps != R.generate(500, seed=4)
    assert len(ps) == 500
    for p in ps:
        m, k, n = p["m"], p["k"], p["n"]
        assert 1 <= min(m, k, n) and max(m, k, n) <= R.DIM_MAX
        assert max(m * k, k * n, m * n) <= R.ELEMS_MAX and p["flops"] == 2 * m * n * k <= R.FLOPS_MAX
        assert p["order_a"] in R.ORDERS and p["order_b"] in R.ORDERS
        assert p["kind"] in ("cupy", "torch") and p["dtype"] in R.DTYPES
        if (p["alpha"], p["beta"]) != (1.0, 0.0):
            assert p["out"]
    # every choice is drawn
    for field, values in (("kind", {"cupy", "torch"}), ("dtype", set(R.DTYPES)),
                          ("order_a", set(R.ORDERS)), ("order_b", set(R.ORDERS)), ("out", {True, False})):
        assert {p[field] for p in ps} == values
    scaled = sum((p["alpha"], p["beta"]) != (1.0, 0.0) for p in ps)
    assert 50 < scaled < 160
    # the sizes span the range (log-uniform)
    assert min(p["m"] for p in ps) <= 3 and max(p["m"] for p in ps) >= 20_000


def test_random_products_tolerance_grows_with_k():
    from tsm_core.bench import _random as R

    assert R.tolerance("float32", 10) == R.TOL["float32"]
    assert R.tolerance("float64", 100_000) == pytest.approx(R.TOL["float64"] * 10)


def test_random_products_time_pair_alternates_and_divides_by_batch():
    from tsm_core.bench import _random as R

    calls = []
    clock = iter(range(10**6)).__next__  # one tick per clock read

    def f():
        calls.append("f")

    def g():
        calls.append("g")

    ts = R.time_pair([f, g], lambda: None, reps=3, sample_s=1e9, clock=lambda: float(clock()))
    assert len(ts) == 2 and all(t > 0 for t in ts)
    timed = calls[8:]  # after 3 warm-up rounds and one calibration round
    batch = R.BATCH_MAX
    assert timed[:batch] == ["f"] * batch and timed[batch:2 * batch] == ["g"] * batch


@pytest.mark.parametrize("with_torch", [False, True])
def test_random_products_cpu_run_writes_json_and_png(tmp_path, with_torch, monkeypatch):
    from tsm_core.bench import _random as R

    if with_torch and torch is None:
        pytest.skip("torch")
    if not with_torch:
        real = R.generate
        monkeypatch.setattr(R, "generate", lambda c, s, cpu=False: [
            dict(p, kind="numpy") for p in real(c, s, cpu=cpu)])
    monkeypatch.setattr(R, "REPS", 1)
    rc = R.main("random-products", ["--cpu", "--count", "12", "--seed", "1", "--out", str(tmp_path)])
    assert rc == 0
    import json

    doc = json.loads((tmp_path / "random_products.json").read_text())
    assert doc["cpu"] is True and doc["count"] == 12 and len(doc["records"]) == 12
    for r in doc["records"]:
        for field in ("m", "k", "n", "order_a", "order_b", "dtype", "kind", "alpha", "beta",
                      "t_tsm_s", "t_base_s", "ratio", "route", "err", "baseline"):
            assert field in r
        assert r["ok"] and r["err"] <= r["tol"]
        assert r["route"] in ("numpy", "torch")
    s = doc["summary"]
    assert set(s["acceptance"]) == {"geomean_per_baseline", "min_ratio", "correctness_failures"}
    assert s["acceptance"]["correctness_failures"]["pass"]
    assert (tmp_path / "random_products.png").stat().st_size > 1000


def test_random_products_summary_and_clean():
    from tsm_core.bench import _random as R

    recs = [dict(i=0, kind="cupy", baseline="cupy.matmul", ratio=1.2, route="cublas", ok=True),
            dict(i=1, kind="cupy", baseline="cupy.matmul", ratio=0.8, route="tsm2r", ok=True),
            dict(i=2, kind="torch", baseline="torch.matmul", ratio=1.1, route="torch", ok=False),
            dict(i=3, kind="torch", baseline="torch.addmm", error="boom", ok=False)]
    for r in recs:
        r.update(m=1, k=1, n=1, dtype="float32", order_a="C", order_b="C", alpha=1.0, beta=0.0,
                 out=True, t_tsm_s=1.0, t_base_s=1.0, err=0.0)
    recs[3].pop("ratio", None)
    s = R.summarize(recs)
    assert s["per_kind"]["cupy"]["geomean"] == pytest.approx(math.sqrt(1.2 * 0.8))
    assert s["per_kind"]["cupy"]["below"] == 1 and s["per_kind"]["torch"]["count"] == 2
    assert s["failures"] == [2, 3]
    assert not s["acceptance"]["min_ratio"]["pass"]
    assert not s["acceptance"]["geomean_per_baseline"]["pass"]
    assert s["worst"][0]["i"] == 1
    assert R._clean({"a": float("nan"), "b": [np.float32(1.5)]}) == {"a": None, "b": [1.5]}


def test_bench_lists_random_products():
    from tsm_core.bench import PLUGINS

    assert PLUGINS["random-products"][0] == "tsm_core.bench._random"


# --- the C++ fast path for torch tensors (built against the installed torch) -----------


def _native_or_skip():
    from tsm_core.tsm2 import fastpath

    if fastpath.get(wait=True) is None:
        pytest.skip(f"the C++ matmul fast path is not built here: {fastpath.status()['error']}")
    return fastpath.get()


@needs_torch
def test_native_fast_path_takes_torch_hits():
    nat = _native_or_skip()
    A, B = torch.randn(7, 5, dtype=torch.float64), torch.randn(5, 3, dtype=torch.float64)
    out = torch.full((7, 3), float("nan"), dtype=torch.float64)
    tsm_core.matmul(A, B, out=out)
    assert nat.size() >= 1 and api._TorchTensor is torch.Tensor
    # a hit: computed in C++ (None would mean the Python path)
    for alpha, beta in [(1.0, 0.0)]:
        out.fill_(float("nan"))
        got = nat.call(A, B, out, alpha, beta, "auto")
        assert got is out
        np.testing.assert_allclose(out.numpy(), (A @ B).numpy(), rtol=1e-12)
    # keys that differ in any property miss
    assert nat.call(A, B, out, 2.0, 0.0, "auto") is None
    assert nat.call(A, B, out, 1.0, 0.0, "cublas") is None
    assert nat.call(A.t().contiguous().t(), B, out, 1.0, 0.0, "auto") is None
    assert nat.call(A.float(), B.float(), out.float(), 1.0, 0.0, "auto") is None
    assert nat.call(A, B, out, np.float64(1.0), 0.0, "auto") is None
    assert nat.call(A, B, out, True, 0.0, "auto") is None
    # overlap: always checked, the Python path words the error
    A2 = torch.randn(5, 5, dtype=torch.float64)
    B2 = torch.randn(5, 5, dtype=torch.float64)
    o2 = torch.empty(5, 5, dtype=torch.float64)
    tsm_core.matmul(A2, B2, out=o2)
    assert nat.call(A2, B2, o2, 1.0, 0.0, "auto") is o2
    assert nat.call(A2, B2, B2, 1.0, 0.0, "auto") is None
    with pytest.raises(ValueError, match="out shares memory with B"):
        tsm_core.matmul(A2, B2, out=B2)


@needs_torch
@pytest.mark.parametrize("alpha,beta", [(1.0, 0.0), (2.0, 0.0), (-0.5, 1.5), (1, 0), (3, 2)])
def test_native_fast_path_results(alpha, beta):
    _native_or_skip()
    g = torch.Generator().manual_seed(1)
    for out_kind in (None, "C", "T"):
        for _ in range(3):
            A = torch.randn(12, 33, dtype=torch.float32, generator=g)
            B = torch.randn(4, 33, dtype=torch.float32, generator=g).t()
            out = None
            if out_kind == "C":
                out = torch.randn(12, 4, generator=g)
            elif out_kind == "T":
                out = torch.randn(4, 12, generator=g).t()
            if out is not None and beta == 0:
                out.fill_(float("nan"))  # not read
            want = ref(A.numpy(), B.numpy(), None if out is None else out.numpy().copy(),
                       alpha, beta)
            got = tsm_core.matmul(A, B, out=out, alpha=alpha, beta=beta)
            if out is not None:
                assert got is out
            assert got.dtype == torch.float32 and got.shape == (12, 4)
            np.testing.assert_allclose(got.numpy(), want, rtol=2e-5, atol=2e-5)


@needs_torch
def test_native_fast_path_bumps_the_version_of_out():
    """Hits skip the dispatcher's autograd and view layers: the in-place write to `out`
    still advances its version counter, as torch.mm(out=) does."""
    nat = _native_or_skip()
    A, B = torch.randn(6, 4, dtype=torch.float64), torch.randn(4, 2, dtype=torch.float64)
    out = torch.empty(6, 2, dtype=torch.float64)
    tsm_core.matmul(A, B, out=out)
    for alpha, beta in ((1.0, 0.0), (2.0, 0.5)):
        tsm_core.matmul(A, B, out=out, alpha=alpha, beta=beta)  # remembered
        v = out._version
        assert nat.call(A, B, out, alpha, beta, "auto") is out
        assert out._version > v
    assert not tsm_core.matmul(A, B).requires_grad


@needs_torch
def test_native_fast_path_refuses_grad_and_reused_storage():
    nat = _native_or_skip()
    A, B = torch.randn(6, 4, dtype=torch.float64), torch.randn(4, 2, dtype=torch.float64)
    tsm_core.matmul(A, B)
    assert nat.call(A, B, None, 1.0, 0.0, "auto") is not None
    A.requires_grad_(True)
    assert nat.call(A, B, None, 1.0, 0.0, "auto") is None
    with pytest.raises(TypeError, match="requires grad"):
        tsm_core.matmul(A, B)
    # a new tensor with the same properties (perhaps at a freed address) is a hit and
    # computes its own data
    del A
    A3 = torch.randn(6, 4, dtype=torch.float64)
    np.testing.assert_allclose(tsm_core.matmul(A3, B).numpy(), (A3 @ B).numpy(), rtol=1e-12)


@needs_torch
def test_native_switched_off_keeps_python_path(monkeypatch):
    from tsm_core.tsm2 import fastpath

    monkeypatch.setenv("TSM_NATIVE", "0")
    fastpath._reset_for_tests()
    api.forget_decisions(unload=True)
    try:
        A, B = torch.randn(6, 4, dtype=torch.float64), torch.randn(4, 2, dtype=torch.float64)
        for _ in range(3):
            np.testing.assert_allclose(tsm_core.matmul(A, B).numpy(), (A @ B).numpy(), rtol=1e-12)
        assert api._native is False and api._TorchTensor is api._NoType
        assert api.route_of(A, B) == "torch"
    finally:
        monkeypatch.delenv("TSM_NATIVE")
        fastpath._reset_for_tests()
        api.forget_decisions(unload=True)


# --- the direct cuBLAS call: flags and leading dimensions from strides alone ------------
#
# gemm_args is checked by running its answer through a column-major gemm written with
# numpy on the flat buffers the operands live in (what cuBLAS does with the pointers).

LAYOUTS = ("C", "F", "Cpad", "Fpad", "loose")


def laid_out(rng, shape, layout, dtype=np.float64):
    """(array, flat buffer, offset in elements) for `shape` stored as `layout`: C, F,
    row / column slices of a wider matrix (Cpad, Fpad), free strides on length-1
    dimensions (loose: C-ordered otherwise), or every other column (strided)."""
    r, c = shape
    if layout == "C":
        st, off = (c, 1), 0
    elif layout == "F":
        st, off = (1, r), 0
    elif layout == "Cpad":
        st, off = (c + 3, 1), 2
    elif layout == "Fpad":
        st, off = (1, r + 2), 1
    elif layout == "loose":
        st, off = (c if r > 1 else 977, 1 if c > 1 else 0), 0
    else:  # strided
        st, off = (2 * c + 1, 2), 0
    size = off + sum((d - 1) * abs(s) for d, s in zip(shape, st)) + 1
    buf = np.asarray(rng.standard_normal(size), dtype=dtype)
    item = buf.itemsize
    x = np.lib.stride_tricks.as_strided(buf[off:], shape, (st[0] * item, st[1] * item))
    return x, buf, off


def colmajor(buf, off, rows, cols, ld):
    item = buf.itemsize
    return np.lib.stride_tricks.as_strided(buf[off:], (rows, cols), (item, ld * item))


def emulate_gemm(args, a, b, c, alpha, beta):
    """The gemm cuBLAS runs for gemm_args' answer, on (buffer, offset) pairs."""
    swap, ta, tb, M, N, K, ld1, ld2, ldc = args
    x, y = (b, a) if swap else (a, b)
    opx = colmajor(*x, K, M, ld1).T if ta else colmajor(*x, M, K, ld1)
    opy = colmajor(*y, N, K, ld2).T if tb else colmajor(*y, K, N, ld2)
    cm = colmajor(*c, M, N, ldc)
    if not (cm.shape == (M, N) and opx.shape == (M, K) and opy.shape == (K, N)):
        raise AssertionError("operand shapes do not chain")
    for ld, rows in ((ld1, opx.shape[0] if not ta else K), (ld2, K if not tb else N), (ldc, M)):
        assert ld >= max(1, rows)  # cuBLAS's rule on leading dimensions
    total = alpha * (opx.astype(np.float64) @ opy.astype(np.float64))
    cm[...] = total + beta * cm if beta != 0 else total


@pytest.mark.parametrize("m,k,n", [(7, 5, 3), (1, 6, 4), (6, 1, 4), (6, 4, 1), (1, 1, 1),
                                   (1, 5, 1), (5, 5, 5), (2, 9, 3)])
def test_gemm_args_computes_the_product_for_every_layout(m, k, n):
    rng = np.random.default_rng(40)
    item = 8
    for la in LAYOUTS:
        for lb in LAYOUTS:
            for lc in LAYOUTS:
                A, abuf, aoff = laid_out(rng, (m, k), la)
                B, bbuf, boff = laid_out(rng, (k, n), lb)
                C, cbuf, coff = laid_out(rng, (m, n), lc)
                args = api.gemm_args(m, k, n, A.strides, B.strides, C.strides, item)
                assert args is not None, (la, lb, lc)
                assert all(type(v) is int for v in args[1:])
                C0 = C.copy()
                emulate_gemm(args, (abuf, aoff), (bbuf, boff), (cbuf, coff), -1.5, 0.5)
                np.testing.assert_allclose(C, -1.5 * (A @ B) + 0.5 * C0, rtol=1e-12, atol=1e-12)


def test_gemm_args_refuses_what_cublas_cannot_read():
    rng = np.random.default_rng(41)
    good = laid_out(rng, (6, 4), "C")[0].strides
    bad = laid_out(rng, (6, 4), "strided")[0].strides
    assert api.gemm_args(6, 4, 4, bad, (32, 8), (32, 8), 8) is None
    assert api.gemm_args(6, 4, 4, good, (32, 8), bad, 8) is None
    assert api.gemm_args(4, 6, 4, (48, 8), laid_out(rng, (6, 4), "strided")[0].strides,
                         (32, 8), 8) is None
    assert api.gemm_args(6, 4, 4, (-32, 8), (32, 8), (32, 8), 8) is None  # negative
    assert api.gemm_args(6, 4, 4, (0, 8), (32, 8), (32, 8), 8) is None  # repeated rows
    assert api.gemm_args(6, 4, 4, (32, 4), (32, 8), (32, 8), 8) is None  # half elements
    assert api.gemm_args(6, 4, 4, (16, 8), (32, 8), (32, 8), 8) is None  # rows overlap
    big = 2**31
    assert api.gemm_args(big, 4, 4, (32, 8), (32, 8), (32, 8), 8) is None  # past 32 bits
    # the answer is a function of sizes and strides only: equal inputs, equal answers
    assert api.gemm_args(6, 4, 4, good, (32, 8), (32, 8), 8) == \
        api.gemm_args(6, 4, 4, good, (32, 8), (32, 8), 8)


def test_gemm_args_c_ordered_is_the_swapped_product():
    # C-ordered everything: cuBLAS computes C^T = B^T A^T without transposing
    assert api.gemm_args(5, 3, 2, (24, 8), (16, 8), (16, 8), 8) == (True, 0, 0, 2, 5, 3, 2, 3, 2)
    # F-ordered A into a C-ordered C: A is read transposed
    assert api.gemm_args(5, 3, 2, (8, 40), (16, 8), (16, 8), 8) == (True, 0, 1, 2, 5, 3, 2, 5, 2)
    # float32 strides count 4-byte elements
    assert api.gemm_args(5, 3, 2, (4, 20), (4, 12), (4, 20), 4) == (False, 0, 0, 5, 2, 3, 5, 3, 5)


# --- the decided direct call, run on the CPU with a stand-in for CuPy -------------------
#
# FakeCupy arrays are numpy arrays with CuPy's `.data.ptr` / `.data.device_id`; the
# stand-in cuBLAS reads them back by address (and alpha, beta from the host buffers the
# call points at), so the decision's flags, each call's pointers and the scalars are what
# is checked.


class _Data:
    def __init__(self, ptr, device_id=0):
        self.ptr, self.device_id = ptr, device_id


class FakeCupy:
    """A numpy array (a view of a flat buffer) standing in for a CuPy array."""

    registry: dict = {}

    def __init__(self, x, buf, off):
        self.x, self.buf, self.off = x, buf, off
        self.shape, self.strides, self.dtype = x.shape, x.strides, x.dtype
        self.itemsize = x.itemsize
        self.flags = x.flags
        self.data = _Data(x.__array_interface__["data"][0])
        FakeCupy.registry[self.data.ptr] = self


def fake_lib(calls, device=0, ctype=1):
    import ctypes

    def empty(shape, dtype):
        buf = np.full(shape[0] * shape[1], np.nan, dtype)
        return FakeCupy(buf.reshape(shape), buf, 0)

    def gemm(handle, ta, tb, M, N, K, pal, p1, ld1, p2, ld2, pbe, pc, ldc):  # cuBLAS's argument order
        assert handle == 7
        f = FakeCupy.registry
        cty = ctypes.c_double if f[pc].dtype == np.float64 else ctypes.c_float
        alpha = cty.from_address(pal).value
        beta = cty.from_address(pbe).value
        calls.append((p1, p2, pc, alpha, beta))
        emulate_gemm((False, ta, tb, M, N, K, ld1, ld2, ldc), (f[p1].buf, f[p1].off),
                     (f[p2].buf, f[p2].off), (f[pc].buf, f[pc].off), alpha, beta)

    return (lambda: device, lambda: 7, lambda dt: ctype, empty, {"f": gemm, "d": gemm},
            {"f": (1, 2), "d": (1, 3)})


def fake(rng, shape, layout, dtype=np.float64):
    return FakeCupy(*laid_out(rng, shape, layout, dtype))


def cupy_key(A, B, out, alpha, beta):
    flags = (out is None, alpha == 1, out is None or beta == 0, "auto")
    props = [(x.shape, x.strides, x.dtype, x.data.device_id) for x in (A, B, out) if x is not None]
    return (*props, flags)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("alpha,beta,with_out", [(1.0, 0.0, False), (2.0, 0.0, False),
                                                 (1.0, 0.0, True), (-0.5, 1.5, True),
                                                 (3.0, 0.0, True)])
def test_direct_gemm_reads_each_calls_pointers_and_scalars(monkeypatch, dtype, alpha, beta,
                                                           with_out):
    calls = []
    monkeypatch.setattr(api, "_GEMM", fake_lib(calls))
    rng = np.random.default_rng(42)
    m, k, n = 9, 6, 4
    tol = 1e-5 if dtype == np.float32 else 1e-12
    for la, lb, lc in [("C", "C", "C"), ("F", "Cpad", "F"), ("Fpad", "F", "Cpad")]:
        d = None
        seen = set()
        for _ in range(3):  # one decision, three calls on new arrays
            A, B = fake(rng, (m, k), la, dtype), fake(rng, (k, n), lb, dtype)
            out = fake(rng, (m, n), lc, dtype) if with_out else None
            if out is not None and beta == 0:
                out.x[...] = np.nan  # never read
            key = cupy_key(A, B, out, alpha, beta)
            if d is None:
                api._remember(key, api._R_CUBLAS, A, B, out)
                d = api._DECISIONS[key]
                assert d.gemm is not None and d.device == 0
                ptrs = {A.data.ptr, B.data.ptr} | ({out.data.ptr} if out is not None else set())
                for v in (d.gemm, d.ext_a, d.ext_b, d.ext_c, d.m, d.n, d.device):
                    assert not (set(v) if isinstance(v, tuple) else {v}) & ptrs
            want = ref(A.x, B.x, None if out is None else out.x.copy(), alpha, beta)
            C = api._gemm_direct(d, A, B, out, alpha, beta)
            if out is not None:
                assert C is out
            else:
                assert C.x.flags.c_contiguous and C.shape == (m, n) and C.dtype == dtype
            np.testing.assert_allclose(C.x, want, rtol=tol, atol=tol)
            p1, p2, pc, a_seen, b_seen = calls[-1]
            assert {p1, p2} == {A.data.ptr, B.data.ptr} and pc == C.data.ptr
            assert a_seen == pytest.approx(alpha) and b_seen == (beta if with_out else 0.0)
            seen.add((p1, p2, pc))
        assert len(seen) == 3  # every call its own arrays' addresses


def test_direct_gemm_declines_other_device_or_compute_type(monkeypatch):
    rng = np.random.default_rng(43)
    A, B = fake(rng, (5, 3), "C"), fake(rng, (3, 2), "F")
    key = cupy_key(A, B, None, 1.0, 0.0)
    api._remember(key, api._R_CUBLAS, A, B, None)
    d = api._DECISIONS[key]
    calls = []
    monkeypatch.setattr(api, "_GEMM", fake_lib(calls, device=1))
    assert api._gemm_direct(d, A, B, None, 1.0, 0.0) is None
    d.direct = None  # the stand-in is read at a decision's first direct call
    monkeypatch.setattr(api, "_GEMM", fake_lib(calls, ctype=4))  # e.g. TF32 asked of CuPy
    assert api._gemm_direct(d, A, B, None, 1.0, 0.0) is None
    assert calls == []
    d.direct = None
    monkeypatch.setattr(api, "_GEMM", fake_lib(calls))
    np.testing.assert_allclose(api._gemm_direct(d, A, B, None, 1.0, 0.0).x, A.x @ B.x, rtol=1e-12)


def test_direct_gemm_not_decided_for_unreadable_strides():
    rng = np.random.default_rng(44)
    A, B = fake(rng, (5, 3), "strided"), fake(rng, (3, 2), "C")
    key = cupy_key(A, B, None, 1.0, 0.0)
    api._remember(key, api._R_CUBLAS, A, B, None)
    d = api._DECISIONS[key]
    assert d.route == api._R_CUBLAS and d.gemm is None  # cupy.matmul then
    out = fake(rng, (5, 2), "strided")
    B2 = fake(rng, (3, 2), "C")
    A2 = fake(rng, (5, 3), "C")
    key = cupy_key(A2, B2, out, 1.0, 0.0)
    api._remember(key, api._R_CUBLAS, A2, B2, out)
    assert api._DECISIONS[key].gemm is None


# --- torch tensors on our kernels: the decided launch, on the CPU with stand-ins ----------
#
# torch CPU tensors stand in for CUDA ones: their data_ptr() are host addresses, so the
# stand-in CuPy views are numpy arrays at those addresses, and the stand-in launchers
# compute there (what the kernels do with the views).


class _Mem:
    def __init__(self, ptr, size, owner, dev):
        assert size > 0 and owner is not None
        self.ptr, self.size, self.owner, self.dev = ptr, size, owner, dev


class _MemPtr:
    def __init__(self, mem, off):
        assert off == 0
        self.ptr, self.size, self.mem = mem.ptr, mem.size, mem


def _view(shape, dtype, memptr, strides):
    import ctypes

    raw = (ctypes.c_char * memptr.size).from_address(memptr.ptr)
    return np.ndarray(shape, dtype, buffer=raw, strides=strides)


class _Stream:
    entered: list = []

    def __init__(self, ptr, dev):
        self.ptr, self.dev = ptr, dev

    def __enter__(self):
        _Stream.entered.append(self.ptr)
        return self

    def __exit__(self, *exc):
        return False


@needs_torch
@pytest.mark.parametrize("route", ["tsm2r", "tsm2l"])
@pytest.mark.parametrize("alpha,beta,out_layout", [(1.0, 0.0, None), (2.0, 0.0, None),
                                                   (1.0, 0.0, "C"), (-0.5, 1.5, "C"),
                                                   (0.5, 2.0, "T")])
def test_torch_tsm_launch_views_and_stream(monkeypatch, route, alpha, beta, out_layout):
    launched = []

    def fake_launch(A, B, C, a, b, cfg=None):
        assert type(a) is float and type(b) is float
        launched.append((route, cfg))
        C[...] = a * (A @ B) + (b * C if b != 0 else 0)

    monkeypatch.setattr(api._tsm2, "launch_tsm2r", fake_launch)
    monkeypatch.setattr(api._tsm2, "launch_tsm2l", fake_launch)
    monkeypatch.setattr(api, "_TORCH_TSM", (lambda: None, lambda dev: 1234, torch.empty, _view,
                                            _Mem, _MemPtr, _Stream))
    r = api._R_TORCH_TSM2R if route == "tsm2r" else api._R_TORCH_TSM2L
    g = torch.Generator().manual_seed(5)
    d = None
    for _ in range(3):
        A = torch.randn(40, 6, dtype=torch.float64, generator=g)
        B = torch.randn(3, 6, dtype=torch.float64, generator=g).t()  # a transposed view
        out = None
        if out_layout == "C":
            out = torch.randn(40, 3, dtype=torch.float64, generator=g)
        elif out_layout == "T":
            out = torch.randn(3, 40, dtype=torch.float64, generator=g).t()
        if out is not None and beta == 0:
            out.fill_(float("nan"))
        key = api.host_key(A, B, out, alpha, beta, "auto")
        if d is None:
            api._remember(key, r, A, B, out)
            d = api._DECISIONS[key]
            assert d.route == r and d.dtype == np.float64
            assert api.route_of(A, B, out, alpha, beta) == route
            assert (d.cfg is not None) == (route == "tsm2l")
        want = ref(A.numpy(), B.numpy(), None if out is None else out.numpy().copy(), alpha, beta)
        _Stream.entered.clear()
        C = api._run_decided(d, A, B, out, alpha, beta)
        assert _Stream.entered == [1234]  # launched on torch's current stream
        if out is not None:
            assert C is out
        else:
            assert C.shape == (40, 3) and C.is_contiguous()
        np.testing.assert_allclose(C.numpy(), want, rtol=1e-12, atol=1e-12)
    assert len(launched) == 3


@needs_torch
def test_torch_tsm_declines_another_current_device(monkeypatch):
    A, B = torch.randn(8, 3, dtype=torch.float64), torch.randn(3, 2, dtype=torch.float64)
    key = api.host_key(A, B, None, 1.0, 0.0, "auto")
    api._remember(key, api._R_TORCH_TSM2R, A, B, None)
    monkeypatch.setattr(api, "_TORCH_TSM", (lambda: 1, None, None, None, None, None, None))
    assert api._run_decided(api._DECISIONS[key], A, B, None, 1.0, 0.0) is None


# --- on the GPU: the direct gemm and torch on our kernels, every route's results ---------


def _cupy_laid_out(cp, rng, shape, layout, dtype):
    """A CuPy array of `shape` as `layout`: C, F, T (the transposed view of a C-ordered
    array), Cpad / Fpad (a slice of a wider C- / F-ordered matrix)."""
    r, c = shape
    if layout == "T":
        return cp.asarray(normal(rng, (c, r), dtype)).T
    if layout == "Cpad":
        return cp.asarray(normal(rng, (r, c + 3), dtype))[:, 1:c + 1]
    if layout == "Fpad":
        return cp.asarray(normal(rng, (r + 5, c), dtype, "F"))[2:r + 2]
    return cp.asarray(normal(rng, shape, dtype, layout))


def _rel_err(got, want):
    got = np.asarray(got, np.float64)
    return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-300))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("m,k,n", [(37, 29, 5), (1, 40, 7), (33, 1, 9), (21, 17, 1), (1, 1, 1),
                                   (300, 257, 129)])
def test_gpu_direct_gemm_every_layout(dtype, m, k, n):
    import cupy as cp

    rng = np.random.default_rng(50)
    tol = 2e-5 * max(1.0, math.sqrt(k)) if dtype == "float32" else 1e-12 * max(1.0, math.sqrt(k))
    for la, lb, lc in [("C", "C", "C"), ("F", "F", "F"), ("T", "C", "F"), ("C", "T", "C"),
                       ("Cpad", "Fpad", "Cpad"), ("Fpad", "Cpad", "Fpad"), ("T", "T", None)]:
        for alpha, beta in [(1.0, 0.0), (-1.5, 0.0), (0.5, -2.0)]:
            for call in range(3):  # the first decides, the others hit
                A = _cupy_laid_out(cp, rng, (m, k), la, dtype)
                B = _cupy_laid_out(cp, rng, (k, n), lb, dtype)
                out = None if lc is None else _cupy_laid_out(cp, rng, (m, n), lc, dtype)
                if out is not None and beta == 0:
                    out.fill(float("nan"))  # never read
                want = ref(cp.asnumpy(A), cp.asnumpy(B), None if out is None else cp.asnumpy(out),
                           alpha, beta)
                got = tsm_core.matmul(A, B, out=out, alpha=alpha, beta=beta, algorithm="cublas")
                if out is not None:
                    assert got is out
                else:
                    assert got.flags.c_contiguous and got.shape == (m, n)
                assert _rel_err(cp.asnumpy(got), want) <= tol, (la, lb, lc, alpha, beta, call)
                d = api._DECISIONS[key(A, B, out, alpha, beta, "cublas")]
                assert d.route == api._R_CUBLAS and d.gemm is not None
                ptrs = {A.data.ptr, B.data.ptr, got.data.ptr}
                assert not set(d.gemm) & ptrs


@pytest.mark.gpu
def test_gpu_direct_gemm_on_the_current_stream_and_compute_type():
    import cupy as cp
    from cupy._core import _routines_linalg as rl
    from cupy_backends.cuda.libs import cublas

    rng = np.random.default_rng(51)
    A = cp.asarray(normal(rng, (300, 200), np.float32))
    B = cp.asarray(normal(rng, (200, 100), np.float32))
    want = cp.asnumpy(A).astype(np.float64) @ cp.asnumpy(B).astype(np.float64)
    tsm_core.matmul(A, B, algorithm="cublas")
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        A2 = A * 1  # written on s: the product must follow it
        C = tsm_core.matmul(A2, B, algorithm="cublas")
        assert cublas.getStream(cp.cuda.device.get_cublas_handle()) == s.ptr
    s.synchronize()
    assert _rel_err(cp.asnumpy(C), want) < 1e-5
    # CuPy asked for TF32: the host path hands the call to cupy.matmul (same arithmetic)
    old = rl.get_compute_type(np.float32)
    rl.set_compute_type(np.float32, rl.COMPUTE_TYPE_TF32)
    try:
        d = api._DECISIONS[key(A, B, None, 1.0, 0.0, "cublas")]
        assert api._gemm_direct(d, A, B, None, 1.0, 0.0) is None
        C = tsm_core.matmul(A, B, algorithm="cublas")
        np.testing.assert_allclose(cp.asnumpy(C), cp.asnumpy(cp.matmul(A, B)), rtol=1e-6, atol=1e-6)
    finally:
        rl.set_compute_type(np.float32, old)


@pytest.mark.gpu
@pytest.mark.parametrize("algorithm,m,k,n", [("tsm2r", 10007, 333, 7), ("tsm2r", 4099, 1030, 16),
                                             ("tsm2l", 30011, 13, 11), ("tsm2l", 20000, 40, 9),
                                             ("auto", 80559, 6, 14)])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_gpu_torch_on_our_kernels_hits(algorithm, m, k, n, dtype):
    if torch is None or not torch.cuda.is_available():
        pytest.skip("torch CUDA")
    tdt = torch.float32 if dtype == "float32" else torch.float64
    g = torch.Generator(device="cuda").manual_seed(3)
    tol = 2e-5 * math.sqrt(k) if dtype == "float32" else 1e-12 * math.sqrt(k)

    def make(shape, order):
        if order == "T":
            return torch.randn(shape[::-1], device="cuda", dtype=tdt, generator=g).t()
        x = torch.randn(shape, device="cuda", dtype=tdt, generator=g)
        return x.t().contiguous().t() if order == "F" else x

    for oa, ob, oc in [("C", "C", "C"), ("F", "T", "T"), ("C", "F", None)]:
        for alpha, beta in [(1.0, 0.0), (2.0, -0.5)]:
            for call in range(3):
                A, B = make((m, k), oa), make((k, n), ob)
                out = None if oc is None else make((m, n), oc)
                if out is not None and beta == 0:
                    out.fill_(float("nan"))
                want = ref(A.cpu().numpy(), B.cpu().numpy(),
                           None if out is None else out.cpu().numpy(), alpha, beta)
                got = tsm_core.matmul(A, B, out=out, alpha=alpha, beta=beta, algorithm=algorithm)
                if out is not None:
                    assert got is out
                assert isinstance(got, torch.Tensor) and got.device == A.device
                assert _rel_err(got.cpu().numpy(), want) <= tol, (oa, ob, oc, alpha, beta, call)
            route = api.route_of(A, B, out, alpha, beta, algorithm)
            if algorithm != "auto":
                assert route == algorithm  # decided: no general path on later calls
            else:
                assert route in ("tsm2l", "tsm2r", "torch")


@pytest.mark.gpu
def test_gpu_torch_on_our_kernels_follows_torch_stream_and_new_memory():
    if torch is None or not torch.cuda.is_available():
        pytest.skip("torch CUDA")
    g = torch.Generator(device="cuda").manual_seed(4)
    A = torch.randn(50_000, 24, device="cuda", dtype=torch.float64, generator=g)
    B = torch.randn(24, 12, device="cuda", dtype=torch.float64, generator=g)
    tsm_core.matmul(A, B, algorithm="tsm2l")
    assert api.route_of(A, B, algorithm="tsm2l") == "tsm2l"
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        A2 = A * -3.0  # on s; the launch must follow it on s
        C = tsm_core.matmul(A2, B, algorithm="tsm2l")
    s.synchronize()
    want = -3.0 * (A.cpu().numpy() @ B.cpu().numpy())
    assert _rel_err(C.cpu().numpy(), want) < 1e-12
    # freed memory taken by a new tensor of the same properties: its own data is read
    del A, A2, C
    torch.cuda.synchronize()
    A3 = torch.randn(50_000, 24, device="cuda", dtype=torch.float64, generator=g)
    C3 = tsm_core.matmul(A3, B, algorithm="tsm2l")
    assert _rel_err(C3.cpu().numpy(), A3.cpu().numpy() @ B.cpu().numpy()) < 1e-12


def test_torch_tsm_route_must_win_back_its_host_time(monkeypatch):
    """A TSM2 route verified against cuBLAS in device time is kept for torch tensors
    only where the kernel's gain also covers the extra host time of the launch."""
    from types import SimpleNamespace

    pytest.importorskip("cupy")

    class Cache:
        def __init__(self, t, cub):
            self.hit = {"params": {"algorithm": "tsm2l", "model": "tsm2l", "cublas_s": cub}, "time_s": t}

        def get(self, key):
            return self.hit

    ops = SimpleNamespace(dtype=np.dtype(np.float64), m=80559, k=6, n=14)
    key = (80559, 6, 14, "d", "C", "F", False, 0)
    monkeypatch.setattr(api._autotune, "cache", lambda dev=None: Cache(8e-6, 12e-6))
    assert api._verified(ops, "tsm2l", key) == "tsm2l"  # CuPy: device time decides
    assert api._verified(ops, "tsm2l", key, api.TORCH_LAUNCH_S) == "cublas"
    monkeypatch.setattr(api._autotune, "cache", lambda dev=None: Cache(450e-6, 760e-6))
    assert api._verified(ops, "tsm2l", key, api.TORCH_LAUNCH_S) == "tsm2l"
