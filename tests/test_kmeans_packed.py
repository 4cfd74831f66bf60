"""The packed route (``kmeans_assign_sums_packed``): short rows against few centres,
several rows a warp, the assignment and in a fit the centroid sums in one pass over
X. CPU: where it applies and what it is called. GPU (`gpu` marker): labels and
distances against float64 on rows with near ties, every output written (poisoned
first), the changed flag; sums bit-identical to the direct update's of the same
labels, chunk by chunk; fits equal across the overlapped and plain loops, streamed
and in memory, and close to the other routes' fits."""

from __future__ import annotations

import numpy as np
import pytest

from tsm_core.kmeans import configs

gpu = pytest.mark.gpu
U = 2.0 ** -24


# ------------------------------------------------------------------ CPU


def test_where_the_packed_route_applies(monkeypatch):
    monkeypatch.delenv("TSM_KMEANS_PACKED", raising=False)
    monkeypatch.delenv("TSM_KMEANS_ASSIGN", raising=False)
    assert configs.choose_route(8, 32, "float32") == "packed"
    assert configs.choose_route(16, 48, "tf32") == "packed"
    assert configs.choose_route(8, 32, "bfloat16") == "packed"
    assert configs.choose_route(16, 65, "float32") == "mma"  # by default d <= 64
    assert configs.choose_route(9, 32, "float16") == "mma"  # 16-bit rows: by default k <= 8
    assert configs.choose_route(17, 32, "float32") == "mma"  # k above the default's 16
    assert configs.choose_route(8, 32, "float64") == configs.choose_method(8, 32)
    monkeypatch.setenv("TSM_KMEANS_PACKED", "1")
    assert configs.choose_route(16, 128, "tf32") == "packed"
    assert configs.choose_route(16, 256, "bfloat16") == "packed"
    assert configs.choose_route(16, 129, "float32") == "mma"  # two slices of float32 rows
    assert configs.choose_route(32, 64, "float32") == "packed"
    assert configs.choose_route(33, 64, "float32") == "mma"
    assert configs.choose_route(32, 64, "float16") == "mma"  # the direct update's accumulators do not fit
    monkeypatch.setenv("TSM_KMEANS_PACKED", "0")
    assert configs.choose_route(8, 32, "float32") == "mma"
    monkeypatch.setenv("TSM_KMEANS_ASSIGN", "packed")
    assert configs.choose_route(8, 32, "bfloat16") == "packed"
    assert configs.choose_route(8, 300, "bfloat16") == "mma"  # forced only where it applies


@pytest.mark.parametrize("xdtype", ["float32", "float16", "bfloat16"])
def test_packed_config_fits_one_slice_and_the_direct_update(xdtype):
    vec = 16 // configs.x_itemsize(xdtype)
    for k in (1, 5, 8, 9, 16, 17, 32):
        for d in (1, 7, 32, 33, 64, 100, 32 * vec):
            cfg = configs.packed_config(k, d, xdtype)
            full = configs.direct_config(k, d, xdtype, vec)
            assert (cfg is None) == (full is None or full[0] != vec)
            if cfg is None:
                assert k > 16 and vec == 8  # 16-bit rows: k <= 16
                continue
            v, w, lpr, kp, smem = cfg
            assert v == vec and d <= lpr * v and k <= kp and kp in configs.PACKED_KP
            assert (v, w) == configs.direct_config(k, d, xdtype, vec)[:2]
            assert smem <= configs.SMEM_MAX
            assert configs.packed_name(cfg, xdtype) in configs.all_names(xdtype)
        assert configs.packed_config(k, 32 * vec + 1, xdtype) is None
    assert configs.packed_config(33, 8, xdtype) is None


# ------------------------------------------------------------------ GPU helpers


def _data(rng, n, d, k):
    """Centres, and rows of which half lie almost exactly between two centres."""
    C = (rng.standard_normal((k, d)) + 0.5).astype(np.float32)
    a, b = rng.integers(0, k, n), rng.integers(0, k, n)
    t = 0.5 + rng.uniform(-1e-4, 1e-4, n)[:, None]
    mid = C[a] * t + C[b] * (1 - t)
    X = np.where(rng.random(n)[:, None] < 0.5, mid, C[a] + 0.3 * rng.standard_normal((n, d)))
    return X.astype(np.float32), C


def _stored(X, prec):
    """(X as the kernel reads it on the GPU: float32, float16 or bfloat16 words,
    rows 16-byte aligned; the same values as float64 on the host)."""
    import cupy as cp

    from tsm_core.kmeans.assign import storage_rows

    Xs = storage_rows(cp.asarray(X), "float32", prec)
    if prec == "bfloat16":
        vals = (cp.asnumpy(Xs).astype(np.uint32) << 16).view(np.float32)
    else:
        vals = cp.asnumpy(Xs)
    return Xs, vals.astype(np.float64)


SHAPES = [(1, 1, 1), (2, 3, 2), (1023, 8, 5), (1025, 32, 8), (5003, 31, 16), (4099, 33, 7), (70001, 64, 3),
          (20011, 128, 16), (3001, 100, 32), (2000003, 32, 8)]
PRECS = ["float32", "tf32", "bfloat16", "float16"]


@gpu
@pytest.mark.parametrize("n,d,k", SHAPES)
@pytest.mark.parametrize("prec", PRECS)
def test_labels_and_distances_against_float64(n, d, k, prec, monkeypatch):
    """Every row written (outputs poisoned first); labels float64's for "float32"
    (rows within float32's bound decided again in float64), else within float32's
    rounding bound of the best; distances from the differences, to float32 rounding;
    bit-identical on a second run; the changed flag against prev."""
    import cupy as cp

    from tsm_core.kmeans.update import packed_assign

    monkeypatch.setenv("TSM_KMEANS_PACKED", "1")
    storage = configs.storage_dtype(prec)
    if configs.packed_config(k, d, storage) is None:
        pytest.skip("rows longer than one slice")
    rng = np.random.default_rng(n + 7 * d + k)
    X, C = _data(rng, n, d, k)
    Xs, X64 = _stored(X, prec)
    Cg = cp.asarray(C)
    runs = []
    for _ in range(2):
        labels = cp.full(n, -7, dtype=cp.int32)
        mind = cp.full(n, np.nan, dtype=cp.float32)
        ch = cp.zeros(1, dtype=cp.int32)
        packed_assign(Xs, storage, Cg, labels, mind, ch, exact=prec == "float32")
        runs.append((cp.asnumpy(labels), cp.asnumpy(mind), int(ch[0])))
    lab, md, _ = runs[0]
    np.testing.assert_array_equal(runs[1][0], lab)
    np.testing.assert_array_equal(runs[1][1], md)
    assert ((lab >= 0) & (lab < k)).all() and np.isfinite(md).all()
    rows = np.arange(n)
    best = np.full(n, np.inf)
    for j in range(k):  # float64 distances, a centre at a time (n x k may be large)
        best = np.minimum(best, ((X64 - C[j].astype(np.float64)) ** 2).sum(1))
    mine = ((X64 - C[lab].astype(np.float64)) ** 2).sum(1)
    if prec == "float32":
        assert (mine - best <= 1e-12 * (mine + best + 1e-300)).all()
    else:
        assert (mine - best <= 2 * (d + 8) * U * (mine + best) + 1e-30).all()
    assert (np.abs(md - mine) <= 2 * (d + 8) * U * mine + 1e-30).all()
    # The changed flag: none against the same labels, set by one changed row.
    prev = cp.asarray(lab)
    ch = cp.zeros(1, dtype=cp.int32)
    packed_assign(Xs, storage, Cg, cp.empty(n, dtype=cp.int32), cp.empty(n, dtype=cp.float32), ch, prev,
                  exact=prec == "float32")
    assert int(ch[0]) == 0
    if k > 1:
        prev[rows[-1]] = (lab[-1] + 1) % k
        packed_assign(Xs, storage, Cg, cp.empty(n, dtype=cp.int32), cp.empty(n, dtype=cp.float32), ch, prev,
                      exact=prec == "float32")
        assert int(ch[0]) == 1


@gpu
@pytest.mark.parametrize("n,d,k", [(1, 3, 2), (1025, 32, 8), (5003, 31, 16), (70001, 64, 3), (3001, 100, 32),
                                   (300007, 17, 5)])
@pytest.mark.parametrize("prec", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("weights", [False, True])
def test_sums_equal_the_direct_update_of_the_same_labels(n, d, k, prec, weights, monkeypatch):
    """The pass's sums and weights bit-identical to kmeans_sums_direct's of the labels
    it wrote, overwritten (poisoned first) and over two chunks of whole row blocks;
    and within float64 summation of a float64 reference."""
    import cupy as cp

    from tsm_core.kmeans.update import _Sums

    monkeypatch.setenv("TSM_KMEANS_PACKED", "1")
    monkeypatch.setenv("TSM_KMEANS_UPDATE", "direct")
    storage = configs.storage_dtype(prec)
    if configs.packed_config(k, d, storage) is None:
        pytest.skip("rows longer than one slice")
    rng = np.random.default_rng(3 * n + d + k)
    X, C = _data(rng, n, d, k)
    Xs, X64 = _stored(X, prec)
    w = cp.asarray(rng.uniform(0.5, 2.0, n).astype(np.float32)) if weights else None
    work = _Sums(n, d, k, storage)
    assert work.route == "direct"
    labels = cp.full(n, -7, dtype=cp.int32)
    mind = cp.empty(n, dtype=cp.float32)
    sums = cp.full((k, d), np.nan)
    wsum = cp.full(k, np.nan)
    work.packed(Xs, cp.asarray(C), labels, mind, cp.zeros(1, dtype=cp.int32), None, w, sums, wsum)
    ref_s, ref_w = cp.full((k, d), np.nan), cp.full(k, np.nan)
    work.run(Xs, labels, w, ref_s, ref_w)
    if d % (16 // Xs.itemsize) == 0:  # else the direct update reads narrower vectors: another order
        np.testing.assert_array_equal(cp.asnumpy(sums), cp.asnumpy(ref_s))
        np.testing.assert_array_equal(cp.asnumpy(wsum), cp.asnumpy(ref_w))
    lab = cp.asnumpy(labels)
    w64 = cp.asnumpy(w).astype(np.float64) if weights else np.ones(n)
    exp = np.zeros((k, d))
    np.add.at(exp, lab, X64 * w64[:, None])
    scale = np.zeros((k, d))
    np.add.at(scale, lab, np.abs(X64) * w64[:, None])
    assert (np.abs(cp.asnumpy(sums) - exp) <= 4e-5 * scale + 1e-30).all()  # float accumulators, <= 256 rows a warp
    np.testing.assert_allclose(cp.asnumpy(wsum), np.bincount(lab, w64, minlength=k), rtol=1e-4)
    # Two chunks of whole row blocks give the one pass's bits.
    cut = (n // 2) // configs.ROW_BLOCK * configs.ROW_BLOCK
    if 0 < cut < n:
        s2, w2 = cp.full((k, d), np.nan), cp.full(k, np.nan)
        for a, b in ((0, cut), (cut, n)):
            work.packed(Xs[a:b], cp.asarray(C), cp.empty(b - a, dtype=cp.int32), cp.empty(b - a, dtype=cp.float32),
                        cp.zeros(1, dtype=cp.int32), None, w[a:b] if weights else None, s2, w2, acc=a > 0)
        np.testing.assert_array_equal(cp.asnumpy(s2), cp.asnumpy(sums))
        np.testing.assert_array_equal(cp.asnumpy(w2), cp.asnumpy(wsum))


def _blobs(rng, n, d, k):
    centres = rng.uniform(-10, 10, (k, d))
    y = rng.integers(0, k, n)
    return (centres[y] + rng.standard_normal((n, d))).astype(np.float32)


@gpu
@pytest.mark.parametrize("prec", PRECS)
@pytest.mark.parametrize("n,d,k", [(200003, 32, 8), (50001, 7, 16), (30011, 128, 5), (40009, 64, 3)])
def test_fits_equal_across_loops_and_close_to_other_routes(prec, n, d, k, monkeypatch):
    """A packed fit: the overlapped loop, the plain loop and a streamed fit give the
    same labels, centres and iterations bit for bit; the mma route's fit from the
    same start ends at the same inertia (to 1e-5; 1e-4 in 16 bits, whose products
    round more)."""
    import cupy as cp

    import tsm_core

    rng = np.random.default_rng(n + d + k)
    X = _blobs(rng, n, d, k)
    C0 = X[rng.choice(n, k, replace=False)]
    monkeypatch.setenv("TSM_KMEANS_PACKED", "1")
    assert configs.choose_route(k, d, prec) == "packed"
    # A budget that streams X in chunks of whole row blocks (as the sums need to equal
    # one pass's): smaller budgets give chunks of fewer rows than a row block.
    from tsm_core.kmeans.sources import stream_chunk_rows

    mem = next(int(X.nbytes * f) for f in (0.3, 0.5, 1.0)
               if stream_chunk_rows(n, d, np.float32, k, int(X.nbytes * f)) >= 2 * configs.ROW_BLOCK)
    assert stream_chunk_rows(n, d, np.float32, k, mem) < n
    out = {}
    for name, env, Xin, mem in (("overlap", "1", cp.asarray(X), None), ("plain", "0", cp.asarray(X), None),
                                ("streamed", "1", X, mem)):
        monkeypatch.setenv("TSM_KMEANS_OVERLAP", env)
        lab, inertia, C, it = tsm_core.kmeans_lloyd(Xin, C0, max_iter=30, precision=prec, max_gpu_memory=mem)
        out[name] = (cp.asnumpy(lab), inertia, cp.asnumpy(C), it)
    for name in ("plain", "streamed"):
        msg = f"{name}: {out[name][3]} iterations, {out['overlap'][3]} overlapped"
        np.testing.assert_array_equal(out[name][0], out["overlap"][0], err_msg=msg)
        np.testing.assert_array_equal(out[name][2], out["overlap"][2], err_msg=msg)
        assert (out[name][1], out[name][3]) == (out["overlap"][1], out["overlap"][3]), name
    monkeypatch.setenv("TSM_KMEANS_OVERLAP", "1")
    monkeypatch.setenv("TSM_KMEANS_PACKED", "0")
    _, inertia_mma, _, _ = tsm_core.kmeans_lloyd(cp.asarray(X), C0, max_iter=30, precision=prec)
    assert abs(out["overlap"][1] - inertia_mma) <= (1e-4 if prec in ("bfloat16", "float16") else 1e-5) * inertia_mma
    # The reported inertia is X's own: that of its labels and centres in float64.
    X64 = X.astype(np.float64)
    lab, inertia, C = out["overlap"][:3]
    exact = float(((X64 - C[lab].astype(np.float64)) ** 2).sum())
    assert abs(inertia - exact) <= 1e-5 * exact


@gpu
@pytest.mark.parametrize("prec", ["float32", "bfloat16"])
def test_empty_clusters_are_relocated_with_weights(prec):
    """Duplicate initial centres leave clusters empty: relocated as on the other
    routes (each takes a farthest point), none empty at the end."""
    import cupy as cp

    import tsm_core

    rng = np.random.default_rng(5)
    X = _blobs(rng, 40009, 12, 6)
    C0 = np.repeat(X[:3], [3, 3, 2], axis=0)  # 8 centres, only 3 distinct
    w = rng.uniform(0.1, 3.0, len(X)).astype(np.float32)
    lab, inertia, C, it = tsm_core.kmeans_lloyd(cp.asarray(X), C0, sample_weight=cp.asarray(w), max_iter=50,
                                                precision=prec)
    lab = cp.asnumpy(lab)
    assert len(np.unique(lab)) == 8
    assert np.isfinite(inertia) and inertia > 0


@gpu
def test_estimator_labels_equal_predict():
    import cupy as cp

    from tsm_apps.kmeans import TSMKMeans

    rng = np.random.default_rng(2)
    X = cp.asarray(_blobs(rng, 30001, 24, 7))
    est = TSMKMeans(n_clusters=7, random_state=0, n_init=1).fit(X)
    assert configs.choose_route(7, 24, "float32") == "packed"
    np.testing.assert_array_equal(cp.asnumpy(est.predict(X)), cp.asnumpy(est.labels_))
