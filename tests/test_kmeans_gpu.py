"""k-means on the GPU: kernels against float64 references, the GPU estimator against
the CPU path, streamed fits against in-memory fits, array kinds in and out."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

cp = pytest.importorskip("cupy")

import tsm_core  # noqa: E402
from tsm_apps.kmeans import TSMKMeans  # noqa: E402
from tsm_datasets import synthetic  # noqa: E402
from tsm_core.kmeans import assign as _kmeans  # noqa: E402
from tsm_core.kmeans import configs as _configs  # noqa: E402


def _ref_dist(X, C):
    X = np.asarray(X, dtype=np.float64)
    C = np.asarray(C, dtype=np.float64)
    return ((X[:, None, :] - C[None, :, :]) ** 2).sum(-1) if X.shape[0] * C.shape[0] * X.shape[1] < 5e7 else \
        (X * X).sum(1)[:, None] - 2 * X @ C.T + (C * C).sum(1)[None, :]


def _check_assign(Xh, Ch, labels, mind, dtype):
    D = _ref_dist(Xh, Ch)
    best = D.min(1)
    got = D[np.arange(len(labels)), labels]
    # Rounding bound of ||x||^2 - 2 x.c + ||c||^2 in the working precision.
    eps = np.finfo(dtype).eps
    scale = (np.asarray(Xh, np.float64) ** 2).sum(1) + (np.asarray(Ch, np.float64) ** 2).sum(1).max()
    tol = 8 * np.sqrt(Xh.shape[1]) * eps * scale + 1e-300
    assert (got - best <= tol).all(), "label is not (up to rounding) the nearest centre"
    np.testing.assert_array_less(np.abs(np.asarray(mind, np.float64) - got), tol + 1e-30)


SHAPES = [(1, 1, 1), (7, 3, 2), (1031, 513, 5), (997, 1000, 16), (333, 4099, 17), (260, 600, 32), (129, 64, 9),
          (1000, 257, 64), (67, 61, 131)]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n,d,k", SHAPES)
@pytest.mark.parametrize("method", ["fused", "tile", "gemm"])
def test_assign_against_float64(n, d, k, dtype, method):
    rng = np.random.default_rng(n * 7 + d * 3 + k)
    Xh = rng.standard_normal((n, d)).astype(dtype)
    Ch = rng.standard_normal((k, d)).astype(dtype)
    X, C = cp.asarray(Xh), cp.asarray(Ch)
    if method == "fused" and k > _configs.FUSED_KMAX:
        pytest.skip("the fused kernel takes k <= 32")
    labels = cp.full(n, -7, dtype=cp.int32)  # poisoned
    mind = cp.full(n, cp.nan, dtype=dtype)
    changed = cp.zeros(1, dtype=cp.int32)
    cn = cp.asarray((Ch.astype(np.float64) ** 2).sum(1).astype(dtype))
    _kmeans._assign(X, C, cn, labels, mind, changed, prev=labels, method=method)
    lab = labels.get()
    assert lab.min() >= 0 and lab.max() < k
    assert not np.isnan(mind.get()).any()
    assert int(changed.get()[0]) == 1  # every label moved off -7
    _check_assign(Xh, Ch, lab, mind.get(), dtype)
    # Same labels again: the flag stays 0.
    changed.fill(0)
    _kmeans._assign(X, C, cn, labels, mind, changed, prev=labels, method=method)
    assert int(changed.get()[0]) == 0


@pytest.mark.parametrize("version", ["v2", "old"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("d", [1, 3, 64, 255, 256, 257])
@pytest.mark.parametrize("k", [1, 7, 64, 65, 200, 1024])
def test_tile_kernel_against_float64(k, d, dtype, version, monkeypatch):
    # Every tile shape the v2 kernel meets: one centre, a partial centre tile, exactly
    # one tile (k = 64), a second tile of one centre, several passes (k = 200, 1024);
    # d below, at and across a k-step; n a non-multiple of both block heights (256, 64)
    # with a last block of 13 rows. "old" is v1 (TSM_KMEANS_TILE=old), the reference
    # for device timings.
    monkeypatch.setenv("TSM_KMEANS_TILE", version)
    n = 2 * 256 + 13
    rng = np.random.default_rng(k * 1000 + d)
    Xh = rng.standard_normal((n, d)).astype(dtype)
    Ch = rng.standard_normal((k, d)).astype(dtype)
    X, C = cp.asarray(Xh), cp.asarray(Ch)
    cn = cp.asarray((Ch.astype(np.float64) ** 2).sum(1).astype(dtype))
    labels = cp.full(n, -7, dtype=cp.int32)
    mind = cp.full(n, cp.nan, dtype=dtype)
    changed = cp.zeros(1, dtype=cp.int32)
    _kmeans._assign(X, C, cn, labels, mind, changed, prev=labels, method="tile")
    lab = labels.get()
    assert lab.min() >= 0 and lab.max() < k
    assert not np.isnan(mind.get()).any()
    assert int(changed.get()[0]) == 1
    _check_assign(Xh, Ch, lab, mind.get(), dtype)
    # Deterministic, and the flag stays 0 when no label moves.
    changed.fill(0)
    mind2 = cp.empty_like(mind)
    _kmeans._assign(X, C, cn, labels, mind2, changed, prev=labels, method="tile")
    assert int(changed.get()[0]) == 0 and (labels.get() == lab).all() and (mind2 == mind).all()
    # One moved label sets it (the flag is OR-ed over a block before it is stored).
    labels[n - 1] = (lab[n - 1] + 1) % k if k > 1 else -1
    _kmeans._assign(X, C, cn, labels, mind2, changed, prev=labels, method="tile")
    assert int(changed.get()[0]) == 1


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("offset", [1, 2])
def test_tile_kernel_narrow_vectors_and_row_stride(dtype, offset):
    # Row stride > d and a start 1 or 2 elements past a 16-byte boundary: the v2
    # kernel's scalar / float2 staging paths and ldx.
    rng = np.random.default_rng(offset)
    big = cp.asarray(rng.standard_normal((700, 140)).astype(dtype))
    X = big[3:, offset:offset + 130]
    C = cp.asarray(rng.standard_normal((90, 130)).astype(dtype))
    labels, mind = tsm_core.kmeans_assign(X, C, method="tile")
    _check_assign(X.get(), C.get(), labels.get(), mind.get(), dtype)


def test_tile_kernel_skips_row_norm_pass(monkeypatch):
    # v2 sums ||x||^2 itself: the tile route launches no kmeans_row_sqnorm (v1 does).
    calls = []
    real = _kmeans._row_sqnorm
    monkeypatch.setattr(_kmeans, "_row_sqnorm", lambda X, out: calls.append(X.shape) or real(X, out))
    X = cp.asarray(np.random.default_rng(0).standard_normal((1000, 64)).astype(np.float32))
    tsm_core.kmeans_assign(X, X[:70], method="tile")
    assert calls == []
    monkeypatch.setenv("TSM_KMEANS_TILE", "old")
    tsm_core.kmeans_assign(X, X[:70], method="tile")
    assert calls == [(1000, 64)]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_assign_strided_and_misaligned_rows(dtype):
    rng = np.random.default_rng(3)
    big = cp.asarray(rng.standard_normal((301, 1030)).astype(dtype))
    X = big[1:, 3:1027]  # row stride 1030, start not 16-byte aligned
    C = cp.asarray(rng.standard_normal((12, 1024)).astype(dtype))
    for method in ("fused", "tile", "gemm"):
        labels, mind = tsm_core.kmeans_assign(X, C, method=method)
        _check_assign(X.get(), C.get(), labels.get(), mind.get(), dtype)


@pytest.mark.parametrize("route", ["direct", "sorted"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n,d,k", [(5003, 77, 9), (1, 1, 2), (4099, 1031, 40)])
def test_centroid_sums_deterministic(n, d, k, dtype, route, monkeypatch):
    monkeypatch.setenv("TSM_KMEANS_UPDATE", route)
    rng = np.random.default_rng(5)
    Xh = rng.standard_normal((n, d)).astype(dtype)
    lab = rng.integers(0, k - 1, n)  # label k-1 stays empty
    lab[: n // 3] = 0  # one big cluster: several pieces / row blocks
    w = rng.uniform(0.1, 3, n).astype(dtype)
    s, ws = tsm_core.kmeans_centroid_sums(cp.asarray(Xh), cp.asarray(lab), k, sample_weight=cp.asarray(w))
    ref = np.zeros((k, d))
    np.add.at(ref, lab, Xh.astype(np.float64) * w[:, None])
    absref = np.zeros((k, d))
    np.add.at(absref, lab, np.abs(Xh.astype(np.float64) * w[:, None]))
    # The direct route adds <= ROW_BLOCK / W rows per warp in X's precision, then
    # float64: error <= (rows per warp) * eps * sum |w x|; the sorted route is float64.
    rows_per_warp = 256 if route == "direct" else 1
    tol = 2 * rows_per_warp * np.finfo(dtype).eps * absref + 1e-12 * absref
    assert (np.abs(s.get() - ref) <= tol + 1e-300).all()
    # Weight totals: the direct route adds a warp's weights in X's precision too.
    wtol = 2 * rows_per_warp * np.finfo(dtype).eps if route == "direct" else 1e-12
    np.testing.assert_allclose(ws.get(), np.bincount(lab, weights=w.astype(np.float64), minlength=k),
                               rtol=wtol)
    s2, _ = tsm_core.kmeans_centroid_sums(cp.asarray(Xh), cp.asarray(lab), k, sample_weight=cp.asarray(w))
    assert (s2 == s).all()  # bit-identical


def _same_partition(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return len(set(zip(a.tolist(), b.tolist()))) == len(set(a.tolist())) == len(set(b.tolist()))


@pytest.mark.parametrize("n,d,k", [(2000, 600, 7), (1500, 48, 40), (3001, 1025, 32)])
def test_gpu_matches_cpu_path_float64(n, d, k):
    rng = np.random.default_rng(k)
    Xh = rng.standard_normal((n, d)) + rng.integers(0, 3, (n, 1)) * 2.0
    w = rng.uniform(0.5, 2, n)
    init = Xh[rng.choice(n, k, replace=False)]
    kw = dict(init=init, max_iter=50, tol=1e-6)
    g = TSMKMeans(k, device="gpu", **kw).fit(cp.asarray(Xh), sample_weight=cp.asarray(w))
    c = TSMKMeans(k, device="cpu", **kw).fit(Xh, sample_weight=w)
    assert g.inertia_ == pytest.approx(c.inertia_, rel=1e-5)
    assert g.n_iter_ == c.n_iter_
    assert _same_partition(g.labels_.get(), c.labels_)
    np.testing.assert_allclose(g.cluster_centers_.get(), c.cluster_centers_, rtol=1e-6, atol=1e-8)


def test_gpu_kmeanspp_matches_cpu_path():
    rng = np.random.default_rng(11)
    Xh = rng.standard_normal((3000, 20)) + rng.integers(0, 5, (3000, 1)) * 3.0
    g = TSMKMeans(6, random_state=2, device="gpu").fit(Xh)
    c = TSMKMeans(6, random_state=2, device="cpu").fit(Xh)
    assert isinstance(g.cluster_centers_, np.ndarray)  # numpy in, numpy out
    assert g.inertia_ == pytest.approx(c.inertia_, rel=1e-5)
    assert _same_partition(g.labels_, c.labels_)


def test_empty_cluster_relocation_on_gpu():
    rng = np.random.default_rng(12)
    Xh = rng.standard_normal((400, 5))
    init = np.vstack([Xh[:3], [[1e3] * 5]])
    g = TSMKMeans(4, init=init, max_iter=30, device="gpu").fit(cp.asarray(Xh))
    c = TSMKMeans(4, init=init, max_iter=30, device="cpu").fit(Xh)
    assert len(set(g.labels_.get().tolist())) == 4
    assert g.inertia_ == pytest.approx(c.inertia_, rel=1e-5)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("d,k", [(700, 5), (96, 12)])
def test_streamed_equals_in_memory(dtype, d, k):
    # Direct centroid update and chunks of whole row blocks: bit-identical sums;
    # the fused and tile assignments compute each row the same way in any chunk.
    n = 20011 if d > 100 else 60013
    Xh = synthetic.blobs(n, d, k, seed=d, dtype=dtype)[0]
    assert _configs.update_route(k, d, dtype, 16 // np.dtype(dtype).itemsize) == "direct"
    init = Xh[:k].copy()
    budget = Xh.nbytes // 3  # forces streaming, several chunks
    with tsm_core.kmeans_source(Xh, max_gpu_memory=budget, n_clusters=k) as src:
        assert src.streamed and len(src.starts) > 2
        ls, is_, cs, ns = tsm_core.kmeans_lloyd(src, init, max_iter=15, tol=0.0)
    lm, im, cm, nm = tsm_core.kmeans_lloyd(cp.asarray(Xh), init, max_iter=15, tol=0.0)
    assert ns == nm
    assert (ls == lm).all()
    assert is_ == pytest.approx(im, rel=1e-6 if dtype == np.float64 else 1e-5)
    np.testing.assert_allclose(cs.get(), cm.get(), rtol=1e-5, atol=1e-5)
    # The estimator takes the same path with a small budget.
    km = TSMKMeans(k, init=init, max_iter=15, tol=0.0, max_gpu_memory=budget, device="gpu").fit(Xh)
    assert (km.labels_ == lm.get()).all()


def test_gpu_fit_deterministic():
    rng = np.random.default_rng(1)
    X = cp.asarray(rng.standard_normal((30000, 1024)).astype(np.float32))
    a = TSMKMeans(16, random_state=0, max_iter=10).fit(X)
    b = TSMKMeans(16, random_state=0, max_iter=10).fit(X)
    assert (a.cluster_centers_ == b.cluster_centers_).all() and a.inertia_ == b.inertia_


def test_kinds_in_and_out():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    rng = np.random.default_rng(2)
    Xh = rng.standard_normal((1000, 600)).astype(np.float32)
    init = Xh[:4].copy()
    results = {}
    for name, X in (("numpy", Xh), ("cupy", cp.asarray(Xh)), ("torch", torch.from_numpy(Xh).cuda())):
        km = TSMKMeans(4, init=init, max_iter=20).fit(X)
        if name == "torch":
            assert isinstance(km.cluster_centers_, torch.Tensor) and km.cluster_centers_.is_cuda
            assert isinstance(km.labels_, torch.Tensor) and km.labels_.dtype == torch.int32
            p = km.predict(X)
            assert isinstance(p, torch.Tensor) and p.is_cuda
            t = km.transform(X)
            assert isinstance(t, torch.Tensor) and tuple(t.shape) == (1000, 4)
            results[name] = (km.labels_.cpu().numpy(), km.inertia_)
        elif name == "cupy":
            assert isinstance(km.cluster_centers_, cp.ndarray) and isinstance(km.predict(X), cp.ndarray)
            assert km.cluster_centers_.dtype == np.float32
            results[name] = (km.labels_.get(), km.inertia_)
        else:
            assert isinstance(km.cluster_centers_, np.ndarray) and isinstance(km.predict(X), np.ndarray)
            results[name] = (km.labels_, km.inertia_)
        assert km.score(X) == pytest.approx(-km.inertia_, rel=1e-4)
    for name in ("cupy", "torch"):
        assert (results[name][0] == results["numpy"][0]).all()
        assert results[name][1] == pytest.approx(results["numpy"][1], rel=1e-6)


def test_device_input_errors():
    X = cp.asarray(np.random.default_rng(0).standard_normal((10, 3)))
    Xn = X.copy()
    Xn[1, 1] = cp.nan
    with pytest.raises(ValueError, match="NaN"):
        TSMKMeans(2).fit(Xn)
    with pytest.raises(ValueError, match="should be >= n_clusters"):
        TSMKMeans(11).fit(X)
    km = TSMKMeans(2, random_state=0).fit(X)
    with pytest.raises(ValueError, match="features"):
        km.predict(X[:, :2])
    with pytest.raises(ValueError, match="sample_weight"):
        TSMKMeans(2).fit(X, sample_weight=cp.ones(9))
    with pytest.raises(ValueError, match="Negative"):
        TSMKMeans(2).fit(X, sample_weight=-cp.ones(10))


@pytest.mark.parametrize("d,k,method", [(40, 12, "gemm"), (33, 50, "tile")])
def test_streamed_close_to_in_memory_sorted_route(monkeypatch, d, k, method):
    # The sorted route sums each chunk's pieces (and cuBLAS may round each chunk
    # differently): equal up to rounding.
    monkeypatch.setenv("TSM_KMEANS_UPDATE", "sorted")
    n = 30011
    Xh = synthetic.blobs(n, d, k, seed=3)[0]
    init = Xh[:k].copy()
    with tsm_core.kmeans_source(Xh, max_gpu_memory=Xh.nbytes // 3, n_clusters=k) as src:
        assert src.streamed and len(src.starts) > 2
        ls, is_, cs, ns = tsm_core.kmeans_lloyd(src, init, max_iter=10, tol=0.0, method=method)
    lm, im, cm, nm = tsm_core.kmeans_lloyd(cp.asarray(Xh), init, max_iter=10, tol=0.0, method=method)
    # A float32 rounding difference moves a centre by ~1e-7 relative, which flips
    # the few points within that distance of a boundary between two centres, and
    # over 10 iterations those flips feed back: a few per thousand (0.12% seen).
    assert float((ls != lm).mean()) < 5e-3
    assert is_ == pytest.approx(im, rel=1e-5)


@pytest.mark.parametrize("method,n,d,k", [("fused", 4000, 520, 24), ("tile", 4000, 520, 24), ("gemm", 4000, 520, 24),
                                          ("tile", 3001, 40, 100), ("gemm", 3001, 40, 100)])
def test_lloyd_methods_agree_float64(method, n, d, k):
    Xh = synthetic.blobs(n, d, k, seed=9, dtype=np.float64)[0]
    init = Xh[:k].copy()
    lg, ig, cg, ng = tsm_core.kmeans_lloyd(cp.asarray(Xh), init, max_iter=30, tol=0.0, method=method)
    c = TSMKMeans(k, init=init, max_iter=30, tol=0.0, device="cpu").fit(Xh)
    assert ig == pytest.approx(c.inertia_, rel=1e-5)
    assert ng == c.n_iter_
    assert _same_partition(lg.get(), c.labels_)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_tile_route_checks_itself_against_cublas(dtype):
    import warnings

    rng = np.random.default_rng(21)
    X = cp.asarray(rng.standard_normal((20000, 257)).astype(dtype))
    C = cp.asarray(rng.standard_normal((70, 257)).astype(dtype))
    cn = (C.astype(cp.float64) ** 2).sum(1).astype(dtype)
    xx = (X.astype(cp.float64) ** 2).sum(1).astype(dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a disagreement would warn
        assert _kmeans._tune_tile(X, C, cn, xx) in ("tile", "gemm")


def test_streamed_through_pinned_staging_when_pinning_in_place_fails(monkeypatch):
    n, d, k = 20011, 96, 12
    Xh = synthetic.blobs(n, d, k, seed=4)[0]
    init = Xh[:k].copy()

    def refuse(*args):
        raise RuntimeError("cudaHostRegister refused (test)")

    monkeypatch.setattr(cp.cuda.runtime, "hostRegister", refuse)
    # One assignment route for both fits: the tile / cuBLAS choice is timed per operand
    # alignment, and the two routes' distances differ in round-off (equal labels, an
    # inertia a few ulps apart), which would hide what this compares.
    monkeypatch.setenv("TSM_KMEANS_ASSIGN", "tile")
    with tsm_core.kmeans_source(Xh, max_gpu_memory=Xh.nbytes // 3, n_clusters=k) as src:
        assert src.streamed and not src.registered and len(src.starts) > 2
        ls, is_, cs, ns = tsm_core.kmeans_lloyd(src, init, max_iter=10, tol=0.0)
    lm, im, cm, nm = tsm_core.kmeans_lloyd(cp.asarray(Xh), init, max_iter=10, tol=0.0)
    assert ns == nm and (ls == lm).all() and is_ == im
