"""The deterministic centroid update (tsm_core.kmeans.update): its routes and
configurations on the CPU; on the GPU, sums and weights against a float64 numpy
reference for float32, float64, float16 and bfloat16 X, k up to 65,536, skewed and
empty clusters, bit-identical runs and sorts, chunked sums."""

import numpy as np
import pytest

from tsm_core.kmeans import configs
from tsm_core.kmeans.update import acc_dtype, half_view

X_TYPES = ("float32", "float64", "float16", "bfloat16")


# ------------------------------------------------------------------ CPU


def test_x_type_names():
    assert configs.x_type(np.float32) == "float32"
    assert configs.x_type(np.dtype(np.float16)) == "float16"
    assert configs.x_type("bfloat16") == "bfloat16"
    assert configs.x_type("torch.bfloat16") == "bfloat16"
    for bad in (np.int32, np.uint16, "int8", np.complex64):
        with pytest.raises(TypeError):
            configs.x_type(bad)
    assert [configs.x_itemsize(t) for t in X_TYPES] == [4, 8, 2, 2]
    assert [configs.acc_itemsize(t) for t in X_TYPES] == [4, 8, 4, 4]
    assert [configs.x_ctype(t) for t in X_TYPES] == ["float", "double", "__half", "__nv_bfloat16"]
    assert [acc_dtype(t) for t in X_TYPES] == [np.float32, np.float64, np.float32, np.float32]


def test_direct_config_fits_float_accumulators():
    # Half X keeps float accumulators: 4 bytes each, 32*VEC per lane-row and label.
    for t in X_TYPES:
        vec = 16 // configs.x_itemsize(t)
        for k in (1, 2, 5, 9, 10, 18, 19, 64, 200, 1024):
            cfg = configs.direct_config(k, 4096, t, vec)
            if cfg is None:
                continue
            v, w, smem = cfg
            assert smem == w * k * (32 * v + 1) * configs.acc_itemsize(t) <= configs.DIRECT_SMEM
    # eight warps of full 16-byte vectors: k <= 9 for half X, 18 for float32, 18 for float64
    kmax = {t: max(k for k in range(1, 100) if configs.update_route(k, 256, t, 16 // configs.x_itemsize(t))
                   == "direct") for t in X_TYPES}
    assert kmax == {"float32": 18, "float64": 18, "float16": 9, "bfloat16": 9}


def test_direct_lanes_pack_short_rows(monkeypatch):
    # TSM_KMEANS_DIRECT_LANES=0: a warp a row. By default: the least of 4, 8, 16, 32
    # lanes that covers d, and a weight accumulator per row group in shared memory.
    monkeypatch.setenv("TSM_KMEANS_DIRECT_LANES", "0")
    assert configs.direct_lanes(16, 4) == 32
    monkeypatch.delenv("TSM_KMEANS_DIRECT_LANES")
    assert [configs.direct_lanes(d, 4) for d in (1, 16, 17, 32, 64, 65, 128, 129, 4096)] == \
        [4, 4, 8, 8, 16, 32, 32, 32, 32]
    assert configs.direct_lanes(32, 1) == 32 and configs.direct_lanes(32, 2) == 16
    for t in X_TYPES:
        vec = 16 // configs.x_itemsize(t)
        for d in (1, 7, 32, 64, 200):
            for k in (1, 5, 9, 18):
                cfg = configs.direct_config(k, d, t, vec)
                if cfg is None:
                    continue
                v, w, smem = cfg
                g = 32 // configs.direct_lanes(d, v)
                assert smem == w * k * (32 * v + g) * configs.acc_itemsize(t) <= configs.DIRECT_SMEM
    assert configs.update_route(17, 32, "float32", 4) == "direct"  # 18: the group weights pass 74 KiB


def test_update_switch(monkeypatch):
    monkeypatch.setenv("TSM_KMEANS_UPDATE", "radix")
    assert configs.update_route(4, 256, "float32", 4) == "sorted"
    assert configs.sort_method(4) == "radix"
    monkeypatch.setenv("TSM_KMEANS_UPDATE", "count")
    assert configs.update_route(4, 256, "float32", 4) == "sorted"
    assert configs.sort_method(4) == "count"
    assert configs.sort_method(configs.SORT_KMAX + 1) == "radix"  # the histogram would not fit
    monkeypatch.setenv("TSM_KMEANS_UPDATE", "direct")
    with pytest.raises(ValueError):
        configs.update_route(65536, 64, "float32", 4)
    monkeypatch.delenv("TSM_KMEANS_UPDATE")
    assert configs.sort_method(configs.SORT_KMAX) == "count"
    assert configs.sort_method(65536) == "radix"


@pytest.mark.parametrize("k", [1, 7, 31, 33, 1024, 4096])
def test_counting_sort_counts_stay_bounded(k):
    # k counts per block of SORT_WB warps of RW rows: at most n / SORT_WB + k (they are
    # written, scanned, read twice).
    rw = configs.sort_rows_per_warp(k)
    assert rw % 32 == 0 and rw >= configs.SORT_RW
    for n in (1, 31, 257, 100003, 4_000_000):
        assert k * -(-n // (rw * configs.SORT_WB)) <= n / configs.SORT_WB + k
    assert configs.SORT_WB * k * 4 <= 227 * 1024  # the histograms fit shared memory


@pytest.mark.parametrize("t", X_TYPES)
@pytest.mark.parametrize("d", [1, 3, 8, 32, 33, 64, 129, 4096])
def test_partials_config_covers_d(t, d):
    vec = 16 // configs.x_itemsize(t)
    while vec > 1 and d % vec:
        vec //= 2  # as launch._vec_for would for a contiguous X
    v, lpr, ns = configs.partials_config(d, t, vec)
    assert v == vec and lpr in configs.PARTIALS_LPR
    sw = lpr * v
    assert ns == -(-d // sw) and (ns - 1) * sw < d <= ns * sw
    if d > v * configs.PARTIALS_LPR[0]:
        assert sw < 2 * d  # no more than half of a warp's columns idle
    assert configs.partials_name(t, v, lpr) in configs.all_names(t if t[-2:] == "16" else np.dtype(t))


def test_half_view_cpu():
    X = np.zeros((3, 4), np.float16)
    assert half_view(X) == (X, "float16")
    raw = np.zeros((3, 4), np.uint16)
    v, t = half_view(raw, "bfloat16")
    assert v is raw and t == "bfloat16"
    with pytest.raises(TypeError):
        half_view(raw)  # a uint16 array does not say what it holds
    with pytest.raises(TypeError):
        half_view(np.zeros((3, 4), np.float32), "bfloat16")
    with pytest.raises(TypeError):
        half_view(X, "bfloat16")  # float16 data is not bfloat16


def test_half_view_torch_cpu():
    torch = pytest.importorskip("torch")
    Xt = torch.arange(12, dtype=torch.float32).reshape(3, 4).to(torch.bfloat16)
    v, t = half_view(Xt)
    assert t == "bfloat16" and v.dtype == torch.int16 and v.shape == (3, 4)
    assert v.data_ptr() == Xt.data_ptr()  # a view, no copy
    # the bits are bfloat16's: the high half of the float32
    back = (v.numpy().astype(np.uint16).astype(np.uint32) << 16).view(np.float32)
    np.testing.assert_array_equal(back, np.arange(12, dtype=np.float32).reshape(3, 4))
    v, t = half_view(torch.zeros(2, 2, dtype=torch.float16))
    assert t == "float16" and v.dtype == torch.float16
    with pytest.raises(TypeError):
        half_view(Xt, "float16")


# ------------------------------------------------------------------ GPU

try:
    import cupy as cp

    HAVE_GPU = cp.cuda.runtime.getDeviceCount() > 0
except Exception:
    HAVE_GPU = False

gpu = pytest.mark.skipif(not HAVE_GPU, reason="needs a CUDA GPU")


def _to_bf16_bits(x32):
    """float32 -> bfloat16 bits (round to nearest even), as uint16."""
    u = np.ascontiguousarray(x32, np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def _from_bf16_bits(b):
    return (b.astype(np.uint32) << 16).view(np.float32)


def _data(n, d, k, t, seed, skew=True):
    """(X for the GPU as a numpy array, its values in float64, labels): signed data,
    90% of the rows in cluster 0, cluster k-1 empty (k > 1)."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((n, d)) * 3).astype(np.float32)
    if t == "bfloat16":
        raw = _to_bf16_bits(x)
        vals = _from_bf16_bits(raw).astype(np.float64)
    else:
        raw = x.astype(t)
        vals = raw.astype(np.float64)
    lab = rng.integers(0, max(1, k - 1), n)
    if skew:
        lab[rng.random(n) < 0.9] = 0
    return raw, vals, lab.astype(np.int32)


def _reference(vals, lab, k, w):
    n, d = vals.shape
    wv = np.ones(n) if w is None else w.astype(np.float64)
    xw = vals * wv[:, None]
    ref = np.stack([np.bincount(lab, weights=xw[:, j], minlength=k) for j in range(d)], 1) if n else np.zeros((k, d))
    absref = np.stack([np.bincount(lab, weights=np.abs(xw[:, j]), minlength=k) for j in range(d)], 1) \
        if n else np.zeros((k, d))
    return ref, absref, np.bincount(lab, weights=wv, minlength=k)


def _run(raw, lab, k, t, w, acc_from=None, chunks=None):
    """_Sums on the GPU into poisoned outputs: (sums, wsum) as numpy."""
    from tsm_core.kmeans.update import _Sums

    n, d = raw.shape
    Xg = cp.asarray(raw)
    labg = cp.asarray(lab)
    wg = None if w is None else cp.asarray(w)
    sums = cp.full((k, d), np.nan)
    wsum = cp.full(k, np.nan)
    bounds = chunks or [(0, n)]
    work = _Sums(max(b - a for a, b in bounds), d, k, t)
    for i, (a, b) in enumerate(bounds):
        work.run(Xg[a:b], labg[a:b], None if wg is None else wg[a:b], sums, wsum, acc=i > 0)
    return sums.get(), wsum.get(), work


def _tol(route, t, absref):
    # The direct route adds <= ROW_BLOCK / W rows per warp in the accumulator type
    # (float for half X), then float64; the sorted route adds exact products in float64.
    eps = np.finfo(np.float64 if t == "float64" else np.float32).eps
    rows = configs.ROW_BLOCK // 4 if route == "direct" else 1
    return 2 * rows * eps * absref + 1e-12 * absref + 1e-300


def _weights(n, t, seed):
    return np.random.default_rng(seed).uniform(0.1, 3, n).astype(acc_dtype(t))


CASES = [(k, d) for k in (1, 7, 1024, 4099, 65536) for d in (1, 3, 32, 33, 64, 129, 4096)
         if k * d <= 65536 * 129]


@gpu
@pytest.mark.parametrize("t", X_TYPES)
@pytest.mark.parametrize("k,d", CASES)
@pytest.mark.parametrize("weighted", [False, True])
def test_sums_against_float64(k, d, t, weighted):
    n = 100003 if d <= 129 else 5003
    raw, vals, lab = _data(n, d, k, t, seed=k + d)
    w = _weights(n, t, 3) if weighted else None
    ref, absref, wref = _reference(vals, lab, k, w)
    s, ws, work = _run(raw, lab, k, t, w)
    assert np.isfinite(s).all() and np.isfinite(ws).all()  # every output written
    assert (np.abs(s - ref) <= _tol(work.route, t, absref)).all()
    np.testing.assert_allclose(ws, wref, rtol=2 * configs.ROW_BLOCK * np.finfo(np.float32).eps
                               if work.route == "direct" else 1e-12)
    s2, ws2, _ = _run(raw, lab, k, t, w)
    assert (s2 == s).all() and (ws2 == ws).all()  # bit-identical run to run


@gpu
@pytest.mark.parametrize("t", X_TYPES)
@pytest.mark.parametrize("n", [1, 257])
@pytest.mark.parametrize("k", [1, 7, 1024, 65536])
def test_small_n_empty_clusters(n, k, t):
    d = 33
    raw, vals, lab = _data(n, d, k, t, seed=n, skew=False)
    ref, absref, wref = _reference(vals, lab, k, None)
    s, ws, work = _run(raw, lab, k, t, None)
    assert (np.abs(s - ref) <= _tol(work.route, t, absref)).all()
    assert (s[wref == 0] == 0).all() and (ws == wref).all()  # counts of unit weights: exact


@gpu
@pytest.mark.parametrize("t", X_TYPES)
@pytest.mark.parametrize("k,d", [(7, 64), (1024, 64), (1024, 33), (4099, 32), (65536, 32), (300, 4096)])
def test_sorts_agree_bitwise(k, d, t, monkeypatch):
    # The counting and radix sorts are both stable: the same order, the same sums.
    n = 100003 if d < 4096 else 3001
    raw, _, lab = _data(n, d, k, t, seed=7)
    w = _weights(n, t, 4)
    monkeypatch.setenv("TSM_KMEANS_UPDATE", "radix")
    s_r, w_r, _ = _run(raw, lab, k, t, w)
    if k <= configs.SORT_KMAX:
        monkeypatch.setenv("TSM_KMEANS_UPDATE", "count")
        s_c, w_c, work = _run(raw, lab, k, t, w)
        assert work.sort == "count"
        assert (s_c == s_r).all() and (w_c == w_r).all()


@gpu
@pytest.mark.parametrize("n,k", [(1, 1), (31, 7), (1024, 300), (1025, 2), (100003, 257), (262147, 1024),
                                 (300007, 4096)])
def test_counting_sort_is_a_stable_sort(n, k, monkeypatch):
    # The counting sort's order and label offsets equal numpy's stable argsort on
    # skewed labels (most rows in one cluster, some clusters empty), with n not a
    # multiple of a warp's or a block's rows; the order buffer poisoned first.
    from tsm_core.kmeans.update import _Sums

    monkeypatch.setenv("TSM_KMEANS_UPDATE", "count")
    rng = np.random.default_rng(n + k)
    lab = rng.integers(0, max(1, k // 2), n).astype(np.int32)  # the upper half empty
    lab[rng.random(n) < 0.9] = k // 3  # one cluster holds about 90% of the rows
    X = cp.asarray(rng.standard_normal((n, 3)).astype(np.float32))
    work = _Sums(n, 3, k, "float32")
    assert work.route == "sorted" and work.sort == "count"
    work.order.fill(-7)
    sums, wsum = cp.empty((k, 3)), cp.empty(k)
    work.run(X, cp.asarray(lab), None, sums, wsum)
    np.testing.assert_array_equal(work.order[:n].get(), np.argsort(lab, kind="stable"))
    np.testing.assert_array_equal(work.off.get(), np.searchsorted(np.sort(lab), np.arange(k + 1)))
    np.testing.assert_array_equal(wsum.get(), np.bincount(lab, minlength=k))


@gpu
@pytest.mark.parametrize("t", X_TYPES)
@pytest.mark.parametrize("k,d", [(5, 96), (1024, 64), (65536, 33)])
def test_chunked_equals_one_pass(k, d, t):
    n = 5 * configs.ROW_BLOCK * 7 + 123
    raw, _, lab = _data(n, d, k, t, seed=9)
    w = _weights(n, t, 5)
    step = 7 * configs.ROW_BLOCK  # chunks of whole row blocks, as sources.py makes them
    chunks = [(a, min(n, a + step)) for a in range(0, n, step)]
    s1, w1, work = _run(raw, lab, k, t, w)
    s2, w2, _ = _run(raw, lab, k, t, w, chunks=chunks)
    if work.route == "direct":
        assert (s1 == s2).all() and (w1 == w2).all()  # bit-identical
    else:  # pieces split at the chunk boundaries: equal up to float64 rounding
        np.testing.assert_allclose(s2, s1, rtol=1e-12, atol=1e-9)
        np.testing.assert_allclose(w2, w1, rtol=1e-12)


@gpu
@pytest.mark.parametrize("t", ["float16", "bfloat16"])
def test_centroid_sums_public_half(t):
    import tsm_core

    n, d, k = 4099, 65, 300
    raw, vals, lab = _data(n, d, k, t, seed=11)
    w = _weights(n, t, 6)
    ref, absref, wref = _reference(vals, lab, k, w)
    if t == "float16":
        s, ws = tsm_core.kmeans_centroid_sums(cp.asarray(raw), cp.asarray(lab), k, sample_weight=cp.asarray(w))
    else:
        s, ws = tsm_core.kmeans_centroid_sums(cp.asarray(raw), cp.asarray(lab), k, sample_weight=cp.asarray(w),
                                              xdtype="bfloat16")
    assert (np.abs(s.get() - ref) <= _tol("sorted", t, absref)).all()
    np.testing.assert_allclose(ws.get(), wref, rtol=1e-12)
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA here")
    if t == "bfloat16":
        Xt = torch.from_numpy(raw.view(np.int16)).cuda().view(torch.bfloat16)
    else:
        Xt = torch.from_numpy(raw).cuda()
    st, wt = tsm_core.kmeans_centroid_sums(Xt, torch.from_numpy(lab).cuda(), k,
                                           sample_weight=torch.from_numpy(w).cuda())
    assert (st.cpu().numpy() == s.get()).all() and (wt.cpu().numpy() == ws.get()).all()


@gpu
@pytest.mark.parametrize("t", X_TYPES)
@pytest.mark.parametrize("d", [1, 33, 4096])
def test_row_sqnorm(t, d):
    from tsm_core.kmeans.launch import _kernel

    n = 1001
    raw, vals, _ = _data(n, d, 1, t, seed=d)
    out = cp.full(n, np.nan, dtype=acc_dtype(t))
    _kernel(f"kmeans_row_sqnorm<{configs.x_ctype(t)}>")(((n + 7) // 8,), (256,), (
        cp.asarray(raw), np.int64(d), np.int32(n), np.int32(d), out))
    ref = (vals ** 2).sum(1)
    eps = np.finfo(acc_dtype(t)).eps
    np.testing.assert_allclose(out.get(), ref, rtol=4 * d * eps / 32 + 4 * eps)


@gpu
@pytest.mark.parametrize("t", X_TYPES)
@pytest.mark.parametrize("k,d", [(1, 1), (7, 3), (5, 16), (7, 32), (9, 33), (4, 64), (3, 100)])
def test_direct_lanes_sums(k, d, t, monkeypatch):
    # Short rows packed into a warp (TSM_KMEANS_DIRECT_LANES): the float64 reference
    # within the direct route's bound, run to run and chunk by chunk bit-identical,
    # and the one-row-a-warp kernel's sums within that bound too.
    n = 5 * configs.ROW_BLOCK * 7 + 123
    raw, vals, lab = _data(n, d, k, t, seed=k * 100 + d)
    w = _weights(n, t, 6)
    ref, absref, wref = _reference(vals, lab, k, w)
    monkeypatch.setenv("TSM_KMEANS_DIRECT_LANES", "0")
    s0, w0, work0 = _run(raw, lab, k, t, w)
    monkeypatch.setenv("TSM_KMEANS_DIRECT_LANES", "1")
    s1, w1, work = _run(raw, lab, k, t, w)
    assert work.route == work0.route == "direct"
    assert np.isfinite(s1).all() and np.isfinite(w1).all()
    tol = _tol("direct", t, absref)
    assert (np.abs(s1 - ref) <= tol).all()
    assert (np.abs(s1 - s0) <= 2 * tol).all()
    np.testing.assert_allclose(w1, wref, rtol=2 * configs.ROW_BLOCK * np.finfo(np.float32).eps)
    s2, w2, _ = _run(raw, lab, k, t, w)
    assert (s2 == s1).all() and (w2 == w1).all()
    step = 7 * configs.ROW_BLOCK
    s3, w3, _ = _run(raw, lab, k, t, w, chunks=[(a, min(n, a + step)) for a in range(0, n, step)])
    assert (s3 == s1).all() and (w3 == w1).all()
