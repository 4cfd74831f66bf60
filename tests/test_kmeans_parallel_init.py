"""k-means|| seeding (``init="k-means||"``): the numpy path and the shared steps on the
CPU, the recluster against scikit-learn's k-means++, the estimator's option; the GPU
path (kernel recluster against the numpy one, streamed against in-memory, the
estimator on CuPy input) under the `gpu` marker; the kernels' NVRTC compile check."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.cluster import kmeans_plusplus as sk_kmeans_plusplus
from sklearn.datasets import make_blobs

from tsm_apps.kmeans import TSMKMeans
from tsm_apps.kmeans import _cpu
from tsm_core.kmeans import parallel_init as par
from tsm_core.runtime import compile as _compile


def _blobs(n=6000, d=6, k=12, seed=0, dtype=np.float64):
    """Well-separated blobs (unit spread, centres at least ~20 apart) and their labels."""
    X, y = make_blobs(n, d, centers=k, cluster_std=0.5, center_box=(-200, 200), random_state=seed)
    return X.astype(dtype), y


def _pool_dmat64(P):
    pn = (P * P).sum(1)
    D = np.maximum(pn[:, None] - 2 * P @ P.T + pn[None, :], 0)
    np.fill_diagonal(D, 0)
    return D


# ------------------------------------------------------------------ the numpy path


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_one_centre_per_blob(seed, dtype):
    X, y = _blobs(seed=seed, dtype=dtype)
    C, idx = par.kmeans_parallel_numpy(X, 12, random_state=np.random.RandomState(seed))
    assert C.shape == (12, 6) and C.dtype == dtype
    np.testing.assert_array_equal(C, X[idx])
    assert sorted(y[idx]) == list(range(12))


def test_deterministic_for_a_seed():
    X, _ = _blobs(n=3001, d=5, k=7, seed=3)
    a = par.kmeans_parallel_numpy(X, 20, random_state=np.random.RandomState(11))[1]
    b = par.kmeans_parallel_numpy(X, 20, random_state=np.random.RandomState(11))[1]
    c = par.kmeans_parallel_numpy(X, 20, random_state=np.random.RandomState(12))[1]
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    assert len(set(a.tolist())) == 20


@pytest.mark.parametrize("seed", [0, 11])
def test_int_seed_equals_its_random_state(seed):
    """random_state as scikit-learn reads it: an int draws what RandomState(int) draws."""
    X, _ = _blobs(n=2003, d=5, k=7, seed=3)
    a = par.kmeans_parallel_numpy(X, 20, random_state=seed)[1]
    b = par.kmeans_parallel_numpy(X, 20, random_state=np.random.RandomState(seed))[1]
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("bad", ["0", 1.5, True, np.random.default_rng(0)])
def test_bad_random_state_raises(bad):
    X, _ = _blobs(n=100, d=3, k=2)
    with pytest.raises(ValueError, match="random_state"):
        par.kmeans_parallel_numpy(X, 4, random_state=bad)


def test_zero_weight_rows_are_never_candidates():
    X, y = _blobs(n=4000, d=4, k=8, seed=5)
    rng = np.random.default_rng(0)
    w = rng.uniform(0.5, 2.0, X.shape[0])
    zero = (y == 3) | (rng.random(X.shape[0]) < 0.3)  # a whole blob and 30% of the rest
    w[zero] = 0
    for s in range(5):
        pool, pw = par.oversample(par.NumpyOps(X), w, 8, np.random.RandomState(s))
        assert not zero[pool].any()
        assert pw.sum() == pytest.approx(w.sum(), rel=1e-12)  # every row's weight goes to a candidate
        _, idx = par.kmeans_parallel_numpy(X, 8, random_state=np.random.RandomState(s), sample_weight=w)
        assert not zero[idx].any()
        assert 3 not in set(y[idx].tolist())


def test_heavy_rows_attract_centres():
    # Two far groups; all the weight on one: every centre comes from it.
    rng = np.random.default_rng(1)
    X = np.vstack([rng.normal(0, 1, (500, 3)), rng.normal(100, 1, (500, 3))])
    w = np.r_[np.zeros(500), np.ones(500)]
    idx = par.kmeans_parallel_numpy(X, 10, random_state=np.random.RandomState(0), sample_weight=w)[1]
    assert (idx >= 500).all()


def test_one_cluster():
    X, _ = _blobs(n=500, d=3, k=4, seed=2)
    C, idx = par.kmeans_parallel_numpy(X, 1, random_state=np.random.RandomState(0))
    assert C.shape == (1, 3) and idx.shape == (1,) and 0 <= idx[0] < 500
    np.testing.assert_array_equal(C[0], X[idx[0]])


@pytest.mark.parametrize("n", [1, 2, 37])
def test_as_many_clusters_as_rows(n):
    X = np.random.default_rng(n).standard_normal((n, 4))
    C, idx = par.kmeans_parallel_numpy(X, n, random_state=np.random.RandomState(0))
    assert sorted(idx.tolist()) == list(range(n))
    np.testing.assert_array_equal(C, X[idx])


def test_fewer_candidates_than_clusters_are_filled():
    # One round of few candidates leaves the pool short: the fill takes the rest.
    X = np.random.default_rng(4).standard_normal((400, 3))
    pool, pw = par.oversample(par.NumpyOps(X), np.ones(400), 60, np.random.RandomState(0),
                              oversampling_factor=0.05, n_rounds=1)
    assert pool.size == 60 and len(set(pool.tolist())) == 60
    assert pw.sum() == pytest.approx(400)
    idx = par.kmeans_parallel_numpy(X, 60, random_state=np.random.RandomState(0), oversampling_factor=0.05,
                                    n_rounds=1)[1]
    assert len(set(idx.tolist())) == 60


def test_duplicate_points():
    # 3 distinct rows, 5 clusters: 5 centres (some repeated, as scikit-learn's
    # k-means++ does), every distinct row among them.
    base = np.array([[0.0, 0.0], [5.0, 5.0], [-3.0, 8.0]])
    X = base[np.arange(30) % 3]
    C, idx = par.kmeans_parallel_numpy(X, 5, random_state=np.random.RandomState(0))
    assert C.shape == (5, 2)
    np.testing.assert_array_equal(C, X[idx])
    assert {tuple(r) for r in C.tolist()} == {tuple(r) for r in base.tolist()}
    # Duplicates among many distinct points: still distinct centres where possible.
    Y = np.vstack([X, np.random.default_rng(0).standard_normal((50, 2)) * 20])
    C2, idx2 = par.kmeans_parallel_numpy(Y, 20, random_state=np.random.RandomState(1))
    assert len({tuple(r) for r in C2.tolist()}) == 20


def test_thinned_pool_keeps_the_weight():
    X = np.random.default_rng(7).standard_normal((3000, 4))
    w = np.random.default_rng(8).uniform(0.1, 3, 3000)
    full, fw = par.oversample(par.NumpyOps(X), w, 100, np.random.RandomState(0), max_pool=None)
    assert full.size > 150
    pool, pw = par.oversample(par.NumpyOps(X), w, 100, np.random.RandomState(0), max_pool=150)
    again, pw2 = par.oversample(par.NumpyOps(X), w, 100, np.random.RandomState(0), max_pool=150)
    assert pool.size == 150 and set(pool.tolist()) <= set(full.tolist())
    np.testing.assert_array_equal(pool, again)
    np.testing.assert_array_equal(pw, pw2)
    assert pw.sum() == pytest.approx(w.sum(), rel=1e-12)
    # A kept candidate keeps its own weight and gains the dropped ones'.
    where = {int(r): i for i, r in enumerate(full)}
    assert (pw >= fw[[where[int(r)] for r in pool]] - 1e-12).all()


def test_candidate_weights_count_the_nearest_rows():
    # Unit weights: a candidate's weight is the number of rows nearest to it.
    X = np.random.default_rng(9).standard_normal((800, 3))
    pool, pw = par.oversample(par.NumpyOps(X), np.ones(800), 10, np.random.RandomState(2))
    D = ((X[:, None, :] - X[pool][None, :, :]) ** 2).sum(-1)
    np.testing.assert_array_equal(pw, np.bincount(D.argmin(1), minlength=pool.size).astype(float))


@pytest.mark.parametrize("seed", range(6))
def test_first_candidate_drawn_as_numpy_choice(seed):
    """The first candidate: the index and the generator's state after the draw equal
    RandomState.choice's with p = w / w.sum() (zero weights never drawn)."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 3000))
    w = rng.random(n) * (rng.random(n) < 0.6)
    w[rng.integers(0, n)] = 0.5  # a positive weight somewhere
    a, b = np.random.RandomState(seed), np.random.RandomState(seed)
    got = par.draw_by_weight(np, w, a)
    assert got == int(b.choice(n, p=w / w.sum()))
    assert w[got] > 0
    assert a.random_sample() == b.random_sample()


@pytest.mark.parametrize("bad", [dict(oversampling_factor=0), dict(oversampling_factor=-1.0),
                                 dict(oversampling_factor=float("nan")), dict(n_rounds=0),
                                 dict(n_rounds=-2), dict(n_rounds=1.5), dict(n_clusters=0)])
def test_bad_parameters_raise_and_draw_nothing(bad):
    X = np.random.default_rng(0).standard_normal((50, 2))
    rs = np.random.RandomState(0)
    before = rs.get_state()[1].copy(), rs.get_state()[2]
    kw = dict(n_clusters=3, oversampling_factor=0.5, n_rounds=5)
    kw.update(bad)
    k = kw.pop("n_clusters")
    with pytest.raises(ValueError):
        par.kmeans_parallel_numpy(X, k, random_state=rs, **kw)
    with pytest.raises(ValueError):
        par.oversample(par.NumpyOps(X), np.ones(50), k, rs, **kw)
    after = rs.get_state()
    np.testing.assert_array_equal(before[0], after[1])
    assert before[1] == after[2]


def test_more_clusters_than_rows_raise():
    with pytest.raises(ValueError, match="n_clusters"):
        par.kmeans_parallel_numpy(np.zeros((3, 2)), 4, random_state=np.random.RandomState(0))


# ------------------------------------------------------------------ the recluster


@pytest.mark.parametrize("m,k,seed", [(1, 1, 0), (2, 2, 1), (50, 7, 2), (333, 40, 3), (1025, 200, 4)])
def test_greedy_recluster_equals_sklearn(m, k, seed):
    rng = np.random.default_rng(seed)
    P = rng.standard_normal((m, 5)) * rng.uniform(0.5, 3, (m, 1))
    w = rng.uniform(0.1, 4.0, m)
    _, ref = sk_kmeans_plusplus(P, k, sample_weight=w, random_state=np.random.RandomState(seed))
    first, u = par.recluster_draws(w, k, np.random.RandomState(seed))
    assert u.shape == (k - 1, par.n_trials(k))
    np.testing.assert_array_equal(par.greedy_recluster(_pool_dmat64(P), w, first, u), ref)
    # The float32 matrix the GPU builds gives the same picks here (no near ties).
    np.testing.assert_array_equal(par.greedy_recluster(par.pool_sqdist(P), w, first, u), ref)


def test_greedy_recluster_with_zero_weights_and_fewer_points_than_clusters():
    P = np.array([[0.0], [1.0], [5.0]])
    w = np.array([1.0, 0.0, 2.0])
    first, u = par.recluster_draws(w, 5, np.random.RandomState(0))
    out = par.greedy_recluster(par.pool_sqdist(P), w, first, u)
    assert out.shape == (5,) and set(out[:2].tolist()) == {0, 2}
    assert 1 not in out[:2]


# ------------------------------------------------------------------ the estimator


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_estimator_inertia_close_to_kmeans_plusplus(dtype):
    # Separated blobs: both seedings lead Lloyd to the same optimum.
    X, _ = make_blobs(8000, 8, centers=30, cluster_std=1.0, center_box=(-60, 60), random_state=0)
    X = X.astype(dtype)
    par_fit = TSMKMeans(30, init="k-means||", random_state=0, device="cpu").fit(X)
    pp_fit = TSMKMeans(30, init="k-means++", random_state=0, device="cpu").fit(X)
    assert par_fit._n_init == 1
    assert par_fit.cluster_centers_.shape == (30, 8) and par_fit.cluster_centers_.dtype == dtype
    assert par_fit.inertia_ == pytest.approx(pp_fit.inertia_, rel=0.03)


def test_estimator_inertia_on_overlapping_blobs():
    # Overlapping blobs: local optima differ by seed either way (up to ~10% here);
    # over a few seeds k-means|| is on average within a few % of k-means++.
    ratios = []
    for seed in range(3):
        X, _ = make_blobs(8000, 8, centers=30, cluster_std=1.5, random_state=seed)
        a = TSMKMeans(30, init="k-means||", random_state=seed, device="cpu").fit(X).inertia_
        b = TSMKMeans(30, init="k-means++", random_state=seed, device="cpu").fit(X).inertia_
        ratios.append(a / b)
    assert np.mean(ratios) <= 1.03


def test_estimator_weights_and_n_init():
    X, y = _blobs(n=3000, d=4, k=6, seed=1)
    w = np.where(y == 0, 0.0, 1.0)
    km = TSMKMeans(5, init="k-means||", random_state=0, device="cpu", n_init=2).fit(X, sample_weight=w)
    assert km._n_init == 2
    assert TSMKMeans(5, init="k-means||")._n_init_for() == 1
    assert TSMKMeans(5, init="random")._n_init_for() == 10


def test_estimator_rejects_unknown_init():
    with pytest.raises(ValueError):
        TSMKMeans(3, init="k-means|", device="cpu").fit(np.zeros((10, 2)))


def test_cli_accepts_kmeans_parallel(capsys):
    from tsm_apps.kmeans.__main__ import main

    main(["--dataset", "iris", "--n-clusters", "3", "--device", "cpu", "--init", "k-means||", "--quiet"])
    assert "inertia" in capsys.readouterr().out


def test_cpu_module_entry():
    X, y = _blobs(n=2000, d=3, k=5, seed=4)
    C, idx = _cpu.kmeans_parallel(X, 5, np.random.RandomState(0), np.ones(2000))
    assert sorted(y[idx]) == list(range(5))


def test_gpu_helpers_logic_in_numpy():
    # The GPU backend's sorted sums (no atomics) and its candidate padding, run with
    # numpy standing in for CuPy.
    from tsm_core.kmeans import init as _init

    ops = object.__new__(_init._GpuOps)
    ops.xp, ops.unit = np, False
    rng = np.random.default_rng(3)
    near = rng.integers(0, 50, 10007).astype(np.int32)
    near[near == 7] = 8  # a candidate nearest to no row
    w = rng.uniform(0, 3, near.size)
    np.testing.assert_allclose(ops.segment_weights(near, w, 52), np.bincount(near, weights=w, minlength=52),
                               rtol=1e-12, atol=1e-9)
    for p in range(1, 5000):
        b = _init._bucket(p)
        assert p <= b <= max(p + 63, int(p * 1.125)) and (p > 64 or b == 1 << (p - 1).bit_length())
    assert len({_init._bucket(p) for p in range(480, 545)}) <= 3


# ------------------------------------------------------------------ compile check


def _nvrtc_or_skip():
    nvrtc = pytest.importorskip("cupy_backends.cuda.libs.nvrtc", reason="NVRTC (CuPy) is not available")
    try:
        nvrtc.getVersion()
    except Exception as exc:  # the module imports but libnvrtc cannot be loaded
        pytest.skip(f"NVRTC cannot be loaded: {exc}")


@pytest.mark.parametrize("name", ["kmeans_recluster<1024, 16>", "kmeans_pool_sqdist<float>",
                                  "kmeans_pool_sqdist<double>"])
def test_init_kernels_compile_without_spills(name):
    _nvrtc_or_skip()
    from tsm_core.kmeans import init as _init

    if name.startswith("kmeans_recluster"):
        assert name == f"kmeans_recluster<{_init.RECLUSTER_THREADS}, {par.MAX_TRIALS}>"
    rep = _compile.compile_report(_init.INIT_FAMILY, name)
    assert rep.registers > 0, rep.log
    assert not rep.spills, f"{name}: {rep.spill_stores} B spill stores, {rep.spill_loads} B loads"
    assert rep.stack_frame == 0, f"{name}: stack frame {rep.stack_frame} B"


def test_trials_fit_the_kernel():
    # 2 + int(log k) local trials for every k the kernel path takes (and far beyond).
    assert par.n_trials(par.MAX_KERNEL_CLUSTERS) <= par.MAX_TRIALS
    assert par.n_trials(10**6) <= par.MAX_TRIALS
    # D and w of a full pool in one block's shared memory (H100: 227 KiB a block).
    assert par.MAX_POOL * 12 + 8 * 1024 <= 227 * 1024


# ------------------------------------------------------------------ GPU


@pytest.mark.gpu
@pytest.mark.parametrize("m,k,seed", [(1, 1, 0), (5, 5, 1), (7, 3, 2), (1025, 100, 3), (3001, 1024, 4),
                                      (8192, 4096, 5), (40, 60, 6)])
def test_gpu_recluster_kernel_equals_numpy(m, k, seed):
    cp = pytest.importorskip("cupy")
    from tsm_core.kmeans import init as _init

    rng = np.random.default_rng(seed)
    P = (rng.standard_normal((m, 13)) * rng.uniform(0.5, 3, (m, 1))).astype(np.float32)
    w = rng.uniform(0.1, 4.0, m)
    w[rng.random(m) < 0.05] = 0  # zero-weight candidates (duplicates' pool entries)
    if w.sum() == 0:
        w[0] = 1.0
    Dm = _init._pool_sqdist(cp.asarray(P))
    Dh = cp.asnumpy(Dm)
    ref = _pool_dmat64(P.astype(np.float64))
    assert (np.diag(Dh) == 0).all() and (Dh >= 0).all()
    np.testing.assert_allclose(Dh, ref, rtol=1e-4, atol=1e-4 * float(np.abs(ref).max()))
    first, u = par.recluster_draws(w, k, np.random.RandomState(seed))
    want = par.greedy_recluster(Dh, w, first, u)
    got = _init._recluster(Dm, w, first, u)
    np.testing.assert_array_equal(got, want)
    again = _init._recluster(Dm, w, first, u)
    np.testing.assert_array_equal(again, got)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gpu_one_centre_per_blob_and_deterministic(dtype):
    cp = pytest.importorskip("cupy")
    import tsm_core

    X, y = _blobs(n=20011, d=9, k=25, seed=1, dtype=dtype)
    C, idx = tsm_core.kmeans_parallel(cp.asarray(X), 25, random_state=np.random.RandomState(0))
    assert isinstance(C, cp.ndarray) and C.dtype == dtype and C.shape == (25, 9)
    np.testing.assert_array_equal(C.get(), X[idx])
    assert sorted(y[idx]) == list(range(25))
    C2, idx2 = tsm_core.kmeans_parallel(X, 25, random_state=np.random.RandomState(0))
    np.testing.assert_array_equal(idx, idx2)
    np.testing.assert_array_equal(tsm_core.kmeans_parallel(X, 25, random_state=0)[1], idx)  # an int seed
    np.testing.assert_array_equal(tsm_core.kmeans_plusplus(X, 25, random_state=0)[1],
                                  tsm_core.kmeans_plusplus(X, 25, random_state=np.random.RandomState(0))[1])


@pytest.mark.gpu
@pytest.mark.parametrize("streamed", [False, True])
def test_gpu_tf32_rounds(streamed, monkeypatch):
    """TSM_KMEANS_INIT_TF32: the rounds' distances on the TF32 tensor cores still give
    one centre per blob, deterministically, in memory and streamed (odd d: rows
    copied to 16-byte alignment), with the same quality as the exact rounds."""
    cp = pytest.importorskip("cupy")
    import tsm_core

    X, y = _blobs(n=60013, d=9, k=25, seed=2, dtype=np.float32)
    Xin = X if streamed else cp.asarray(X)
    mem = X.nbytes // 3 if streamed else None
    monkeypatch.setenv("TSM_KMEANS_INIT_TF32", "1")
    C, idx = tsm_core.kmeans_parallel(Xin, 25, random_state=0, max_gpu_memory=mem)
    assert sorted(y[idx]) == list(range(25))
    np.testing.assert_array_equal(tsm_core.kmeans_parallel(Xin, 25, random_state=0, max_gpu_memory=mem)[1], idx)
    monkeypatch.setenv("TSM_KMEANS_INIT_TF32", "0")
    _, idx_exact = tsm_core.kmeans_parallel(Xin, 25, random_state=0, max_gpu_memory=mem)

    def inertia(ix):
        D = ((X[:, None, :].astype(np.float64) - X[ix][None].astype(np.float64)) ** 2).sum(-1)
        return D.min(1).sum()

    assert inertia(idx) <= 1.5 * inertia(idx_exact)


@pytest.mark.gpu
def test_gpu_weights_respected():
    cp = pytest.importorskip("cupy")
    import tsm_core

    X, y = _blobs(n=9000, d=5, k=9, seed=2, dtype=np.float32)
    w = np.random.default_rng(0).uniform(0.5, 2, 9000)
    zero = y == 4
    w[zero] = 0
    for s in range(3):
        idx = tsm_core.kmeans_parallel(cp.asarray(X), 8, random_state=np.random.RandomState(s),
                                       sample_weight=cp.asarray(w))[1]
        assert not zero[idx].any()


@pytest.mark.gpu
def test_gpu_segment_weights_equal_bincount():
    cp = pytest.importorskip("cupy")
    from tsm_core.kmeans import init as _init

    rng = np.random.default_rng(3)
    near = rng.integers(0, 777, 100003).astype(np.int32)
    near[near == 5] = 6  # an empty candidate
    w = rng.uniform(0, 3, near.size)
    ops = _init._GpuOps(None, unit_weights=False)
    got = cp.asnumpy(ops.segment_weights(cp.asarray(near), cp.asarray(w), 780))
    np.testing.assert_allclose(got, np.bincount(near, weights=w, minlength=780), rtol=1e-12, atol=1e-9)
    ones = _init._GpuOps(None, unit_weights=True).segment_weights(cp.asarray(near), cp.ones(near.size), 780)
    np.testing.assert_array_equal(cp.asnumpy(ones), np.bincount(near, minlength=780))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gpu_streamed_equals_in_memory(dtype):
    # k = 8: the rounds take about 4 candidates each and d >= 512, so every distance
    # comes from the fused kernel, which computes each row the same way in any chunk.
    cp = pytest.importorskip("cupy")
    import tsm_core

    X, _ = _blobs(n=20011, d=520, k=8, seed=3, dtype=dtype)
    budget = X.nbytes // 3
    with tsm_core.kmeans_source(X, max_gpu_memory=budget, n_clusters=8) as src:
        assert src.streamed and len(src.starts) > 2
        Cs, ids = tsm_core.kmeans_parallel(src, 8, random_state=np.random.RandomState(0))
    Cm, idm = tsm_core.kmeans_parallel(cp.asarray(X), 8, random_state=np.random.RandomState(0))
    np.testing.assert_array_equal(ids, idm)
    np.testing.assert_array_equal(Cs.get(), Cm.get())
    # numpy X with a small budget streams inside the call too.
    Cn, idn = tsm_core.kmeans_parallel(X, 8, random_state=np.random.RandomState(0), max_gpu_memory=budget)
    np.testing.assert_array_equal(idn, idm)


@pytest.mark.gpu
def test_gpu_thinned_pool_and_large_k():
    cp = pytest.importorskip("cupy")
    import tsm_core

    X = np.random.default_rng(5).standard_normal((60000, 8)).astype(np.float32)
    Xd = cp.asarray(X)
    # k = 3500: about 1 + 5 * 1750 candidates, thinned to 8192 for the kernel.
    C, idx = tsm_core.kmeans_parallel(Xd, 3500, random_state=np.random.RandomState(0))
    assert len(set(idx.tolist())) == 3500
    np.testing.assert_array_equal(C.get(), X[idx])
    # k above the kernel's range: the pool is reclustered from its coordinates.
    C, idx = tsm_core.kmeans_parallel(Xd[:20000], par.MAX_KERNEL_CLUSTERS + 4,
                                      random_state=np.random.RandomState(0))
    assert len(set(idx.tolist())) == par.MAX_KERNEL_CLUSTERS + 4
    np.testing.assert_array_equal(C.get(), X[idx])


@pytest.mark.gpu
def test_gpu_bad_parameters_raise_and_draw_nothing():
    cp = pytest.importorskip("cupy")
    import tsm_core

    rs = np.random.RandomState(0)
    state = rs.get_state()[1].copy()
    for kw in (dict(oversampling_factor=0.0), dict(n_rounds=0)):
        with pytest.raises(ValueError):
            tsm_core.kmeans_parallel(cp.zeros((10, 2), dtype=cp.float32), 3, random_state=rs, **kw)
    np.testing.assert_array_equal(rs.get_state()[1], state)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gpu_estimator_kmeans_parallel_on_cupy(dtype):
    cp = pytest.importorskip("cupy")

    X, y = make_blobs(30000, 16, centers=40, cluster_std=1.0, center_box=(-50, 50), random_state=2)
    X = X.astype(dtype)
    g = TSMKMeans(40, init="k-means||", random_state=0, max_iter=50).fit(cp.asarray(X))
    assert isinstance(g.cluster_centers_, cp.ndarray) and g.cluster_centers_.dtype == dtype
    assert len(set(g.labels_.get().tolist())) == 40
    c = TSMKMeans(40, init="k-means++", random_state=0, max_iter=50, device="cpu").fit(X)
    assert g.inertia_ == pytest.approx(c.inertia_, rel=0.03)
