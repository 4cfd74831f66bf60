"""TSMKMeans's CPU engines: scikit-learn's compiled Lloyd iteration under our loop
(``SklearnSteps``) against the numpy steps (``CpuSteps``) and against
sklearn.cluster.KMeans; the ``TSM_KMEANS_CPU`` switch and the fallback where
scikit-learn's private routine is missing or changed. No GPU needed."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.cluster import KMeans

from tsm_apps.kmeans import TSMKMeans, _cpu
from tsm_core.kmeans.lloyd import lloyd as lloyd_loop

needs_sklearn_engine = pytest.mark.skipif(_cpu.sklearn_routines() is None,
                                          reason="scikit-learn's compiled Lloyd iteration is not usable here")


def _blobs(rng, n, d, k, dtype, spread=2.0):
    C = spread * rng.standard_normal((k, d))
    return (rng.standard_normal((n, d)) + C[rng.integers(0, k, n)]).astype(dtype)


def _run(steps_cls, X, w, C0, **kw):
    steps = steps_cls(X, w, C0)
    n_iter = lloyd_loop(steps, **kw)
    return steps, n_iter


# ------------------------------------------------------------------ the switch


def test_switch_values(monkeypatch):
    monkeypatch.setenv("TSM_KMEANS_CPU", "numpy")
    assert _cpu.engine() == "numpy"
    monkeypatch.setenv("TSM_KMEANS_CPU", "bogus")
    with pytest.raises(ValueError, match="TSM_KMEANS_CPU"):
        _cpu.engine()
    monkeypatch.setenv("TSM_KMEANS_CPU", "auto")
    usable = _cpu.sklearn_routines() is not None
    assert _cpu.engine() == ("sklearn" if usable else "numpy")
    # Small problems keep the numpy steps under "auto", not when sklearn is forced.
    assert _cpu.engine(_cpu.SMALL_WORK - 1) == "numpy"
    if usable:
        monkeypatch.setenv("TSM_KMEANS_CPU", "sklearn")
        assert _cpu.engine(10) == "sklearn"


def test_fallback_without_sklearn_routine(monkeypatch, rng):
    monkeypatch.setitem(_cpu._ROUTINES, "sk", None)  # as if the import had failed
    monkeypatch.setenv("TSM_KMEANS_CPU", "auto")
    assert _cpu.engine() == "numpy"
    monkeypatch.setenv("TSM_KMEANS_CPU", "sklearn")
    with pytest.raises(RuntimeError, match="not usable"):
        _cpu.engine()
    monkeypatch.setenv("TSM_KMEANS_CPU", "auto")
    X = _blobs(rng, 3000, 8, 6, np.float64)
    km = TSMKMeans(6, random_state=0, device="cpu").fit(X)
    ref = KMeans(6, random_state=0, n_init=1).fit(X)
    assert km.n_iter_ == ref.n_iter_
    assert km.inertia_ == pytest.approx(ref.inertia_, rel=1e-10)


def test_changed_routine_is_rejected(monkeypatch):
    class Broken:
        def __init__(self):
            self.inertia = None

        def iterate(self, *args):  # a signature that no longer matches
            raise TypeError("lloyd_iter_chunked_dense() takes 8 positional arguments")

    class Wrong(Broken):
        def iterate(self, X, w, C, new, wsum, labels, shift, n_threads, update):
            labels[:] = 0  # runs, but computes something else

    for cls in (Broken, Wrong):
        monkeypatch.delitem(_cpu._ROUTINES, "sk", raising=False)
        monkeypatch.setattr(_cpu, "_Routines", cls)
        assert _cpu.sklearn_routines() is None
    monkeypatch.delitem(_cpu._ROUTINES, "sk", raising=False)


# ------------------------------------------------------------------ the two engines agree


def test_pass_threads_times_nothing_on_a_quiet_host(monkeypatch):
    r = _TimedRoutines(2, {2: 0.024, 1: 0.0048})
    monkeypatch.setattr(_cpu, "_PROBES", {})
    monkeypatch.setattr(_cpu, "_host_busy", lambda: False)
    assert _cpu.pass_threads(r, np.zeros((10, 3)), np.ones(10), np.ones((4, 3))) == 2
    assert r.calls == []


def test_host_busy_reads_the_load_average(monkeypatch):
    monkeypatch.setattr(_cpu.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(_cpu.os, "getloadavg", lambda: (3.5, 1.0, 1.0))
    assert _cpu._host_busy()
    monkeypatch.setattr(_cpu.os, "getloadavg", lambda: (0.4, 1.0, 1.0))
    assert not _cpu._host_busy()


@needs_sklearn_engine
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("weighted", [False, True])
def test_sklearn_steps_match_numpy_steps(rng, dtype, weighted):
    X = _blobs(rng, 5001, 7, 9, dtype)
    X -= X.mean(0)
    w = rng.uniform(0.5, 2.0, X.shape[0]).astype(dtype) if weighted else np.ones(X.shape[0], dtype)
    C0 = X[rng.choice(X.shape[0], 9, replace=False)]
    tol = 1e-4 * _cpu.mean_variance(X)
    a, na = _run(_cpu.CpuSteps, X, w, C0, max_iter=100, tol=tol)
    b, nb = _run(_cpu.SklearnSteps, X, w, C0, max_iter=100, tol=tol)
    assert na == nb
    np.testing.assert_array_equal(a.labels, b.labels)
    rtol = 1e-12 if dtype == np.float64 else 2e-5
    np.testing.assert_allclose(b.centers, a.centers, rtol=rtol, atol=rtol)
    assert b.centers.dtype == dtype and b.labels.dtype == np.int32


@needs_sklearn_engine
@pytest.mark.parametrize("zero_weights", [False, True])
def test_empty_cluster_takes_our_relocation(rng, monkeypatch, zero_weights):
    # A far centre attracts nothing; with zero weights, a cluster gets rows but no weight.
    X = rng.standard_normal((4000, 3))
    w = np.ones(X.shape[0])
    init = np.vstack([X[:4], [[1e3, 1e3, 1e3]]])
    if zero_weights:
        X[:50] += 40.0
        w[:50] = 0.0
        init[4] = X[0]  # its rows weigh nothing
    calls = []
    real = _cpu.centroid_sums
    monkeypatch.setattr(_cpu, "centroid_sums", lambda *a: calls.append(1) or real(*a))
    a, na = _run(_cpu.CpuSteps, X, w, init, max_iter=50)
    n_numpy = len(calls)
    b, nb = _run(_cpu.SklearnSteps, X, w, init, max_iter=50)
    assert len(calls) > n_numpy  # the relocating iteration was redone in numpy
    assert na == nb
    np.testing.assert_array_equal(a.labels, b.labels)
    np.testing.assert_allclose(b.centers, a.centers, rtol=1e-12, atol=1e-12)


@needs_sklearn_engine
def test_relocation_order_is_ours_not_sklearns(monkeypatch):
    # Two empty clusters and points at distinct distances: the farthest point goes to the
    # first empty cluster (largest first), whatever order argpartition returns.
    X = np.array([[0.0], [0.1], [0.2], [5.0], [9.0], [20.0], [0.05], [0.15]] * 200)
    X = X + np.arange(X.shape[0])[:, None] * 1e-9
    init = np.array([[0.0], [100.0], [200.0]])
    for steps_cls in (_cpu.CpuSteps, _cpu.SklearnSteps):
        s = steps_cls(X, np.ones(X.shape[0]), init)
        s.pass_over(update=True)
        shift, n_empty, changed = s.update()
        if steps_cls is _cpu.SklearnSteps:
            assert s.numpy_update
        assert n_empty == 2
        s.relocate_empty(n_empty)
        s.update()
        if steps_cls is _cpu.CpuSteps:
            expect = s.new.copy()
        else:
            np.testing.assert_array_equal(s.new, expect)


@needs_sklearn_engine
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_estimator_engines_and_sklearn(rng, monkeypatch, dtype):
    X = _blobs(rng, 6000, 10, 8, dtype, spread=1.0)
    w = rng.uniform(0.5, 2.0, X.shape[0]).astype(dtype)
    init = X[rng.choice(X.shape[0], 8, replace=False)]
    kw = dict(init=init, max_iter=200, tol=1e-4)
    monkeypatch.setenv("TSM_KMEANS_CPU", "sklearn")
    ours = TSMKMeans(8, device="cpu", **kw).fit(X, sample_weight=w)
    monkeypatch.setenv("TSM_KMEANS_CPU", "numpy")
    mine = TSMKMeans(8, device="cpu", **kw).fit(X, sample_weight=w)
    ref = KMeans(8, n_init=1, **kw).fit(X, sample_weight=w)
    rtol = 1e-10 if dtype == np.float64 else 1e-5
    for other in (mine, ref):
        assert ours.n_iter_ == other.n_iter_
        np.testing.assert_array_equal(ours.labels_, other.labels_)
        assert ours.inertia_ == pytest.approx(other.inertia_, rel=rtol)
        np.testing.assert_allclose(ours.cluster_centers_, other.cluster_centers_, rtol=10 * rtol, atol=10 * rtol)
    assert ours.cluster_centers_.dtype == dtype


@needs_sklearn_engine
def test_kmeanspp_random_state_deterministic_and_n_init(rng, monkeypatch):
    monkeypatch.setenv("TSM_KMEANS_CPU", "sklearn")
    X = _blobs(rng, 8000, 6, 5, np.float32, spread=1.0)
    a = TSMKMeans(5, random_state=3, device="cpu").fit(X)
    b = TSMKMeans(5, random_state=3, device="cpu").fit(X)
    np.testing.assert_array_equal(a.labels_, b.labels_)
    np.testing.assert_array_equal(a.cluster_centers_, b.cluster_centers_)
    assert a.inertia_ == b.inertia_
    many = TSMKMeans(5, init="random", n_init=4, random_state=1, device="cpu").fit(X)
    ref = KMeans(5, init="random", n_init=4, random_state=1).fit(X)
    assert many.inertia_ == pytest.approx(ref.inertia_, rel=1e-4)


@needs_sklearn_engine
def test_verbose_lines_on_sklearn_engine(rng, monkeypatch, capsys):
    monkeypatch.setenv("TSM_KMEANS_CPU", "sklearn")
    X = _blobs(rng, 3000, 4, 3, np.float64)
    km = TSMKMeans(3, verbose=1, random_state=0, tol=0, device="cpu").fit(X)
    out = capsys.readouterr().out
    assert out.count("Iteration ") == km.n_iter_
    assert "strict convergence" in out
    # The inertia printed for the last iteration is the fit's (labels unchanged).
    last = [ln for ln in out.splitlines() if ln.startswith("Iteration ")][-1]
    assert float(last.split("inertia ")[1].rstrip(".")) == pytest.approx(km.inertia_, rel=1e-12)


def test_blas_threads_restored(rng, monkeypatch):
    from threadpoolctl import threadpool_info

    before = [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]
    monkeypatch.setenv("TSM_KMEANS_CPU", "auto")
    TSMKMeans(4, random_state=0, device="cpu").fit(_blobs(rng, 20000, 8, 4, np.float64))
    assert [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"] == before


# ------------------------------------------------------------------ helpers


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_mean_variance_and_inertia(rng, dtype):
    X = (rng.standard_normal((9000, 7)) * np.arange(1, 8) + 100).astype(dtype)
    X -= X.mean(0)
    assert _cpu.mean_variance(X) == pytest.approx(float(np.var(X.astype(np.float64), axis=0).mean()), rel=1e-12)
    C = X[:5].copy()
    labels = rng.integers(0, 5, X.shape[0]).astype(np.int32)
    w = rng.uniform(0, 2, X.shape[0]).astype(dtype)
    d = X.astype(np.float64) - C[labels].astype(np.float64)
    ref = float(((d * d).sum(1)) @ w.astype(np.float64))
    rtol = 1e-12 if dtype == np.float64 else 1e-6
    assert _cpu.inertia(X, w, C, labels) == pytest.approx(ref, rel=rtol)
    assert _cpu.inertia(X, w, C, labels, compiled=True) == pytest.approx(ref, rel=rtol)


def test_bench_cpu_case(tmp_path):
    from tsm_apps.kmeans import bench

    r = bench.bench_cpu_case(3000, 4, 3, "float32", 0, 1)
    assert r["ours_s"] > 0 and r["sklearn_s"] > 0 and r["numpy_engine_n_iter"] >= 1
    bench.plot_cpu(dict(cases=[r], n_threads=1, host="test"), str(tmp_path / "cpu.png"))
    assert (tmp_path / "cpu.png").stat().st_size > 0


@pytest.mark.parametrize("weighted", [False, True])
def test_kmeanspp_same_draws_as_sklearn_float64(rng, weighted):
    try:
        from sklearn.cluster._kmeans import _kmeans_plusplus
    except ImportError:
        pytest.skip("scikit-learn's private _kmeans_plusplus moved")
    X = _blobs(rng, 4000, 9, 12, np.float64)
    w = rng.uniform(0.1, 2.0, X.shape[0]) if weighted else np.ones(X.shape[0])
    xx = _cpu.row_sqnorms(X)
    ours = _cpu.kmeans_plusplus(X, 12, np.random.RandomState(5), w, xx)
    ref = _kmeans_plusplus(X, 12, xx, w, np.random.RandomState(5))
    np.testing.assert_array_equal(ours[1], ref[1])
    np.testing.assert_array_equal(ours[0], ref[0])


# ------------------------------------------------------------------ the thread count of a pass


class _TimedRoutines:
    """A stand-in for scikit-learn's routines whose labels-only pass takes `cost[t]`
    seconds on t threads (a clock moved by hand), recording each call."""

    def __init__(self, n, cost):
        self.n, self.cost, self.calls, self.now = n, cost, [], 0.0

    def n_threads(self):
        return self.n

    def one_blas_thread(self):
        import contextlib

        return contextlib.nullcontext()

    def iterate(self, X, w, C, new, wsum, labels, shift, n_threads, update):
        assert not update and new is C  # labels only: no centre is written
        self.calls.append(n_threads)
        labels[:] = 0
        self.now += self.cost[n_threads]


@pytest.mark.parametrize("cost, expect", [({2: 0.024, 1: 0.0048}, 1),   # busy host: one thread
                                          ({2: 0.003, 1: 0.005}, 2),    # quiet host: all
                                          ({2: 0.011, 1: 0.010}, 2)])   # within the margin: all
def test_pass_threads_measures_once_per_shape(monkeypatch, cost, expect):
    r = _TimedRoutines(2, cost)
    monkeypatch.setattr(_cpu.time, "perf_counter", lambda: r.now)
    monkeypatch.setattr(_cpu, "_PROBES", {})
    monkeypatch.setattr(_cpu, "_host_busy", lambda: True)
    X = np.zeros((10, 3))
    C = np.ones((4, 3))
    assert _cpu.pass_threads(r, X, np.ones(10), C) == expect
    assert sorted(r.calls) == [1, 1, 2, 2]  # two passes on each count
    assert _cpu.pass_threads(r, X, np.ones(10), C) == expect and len(r.calls) == 4  # remembered
    assert _cpu.pass_threads(r, np.zeros((11, 3)), np.ones(11), C) == expect and len(r.calls) == 8
    np.testing.assert_array_equal(C, 1.0)
    assert _cpu.pass_threads(_TimedRoutines(1, cost), X, np.ones(10), C) == 1  # one thread: no timing


@needs_sklearn_engine
@pytest.mark.parametrize("threads", [1, 2])
def test_sklearn_steps_on_either_thread_count_match_numpy(rng, threads):
    """Forced to one thread or two, the compiled steps give the numpy steps' labels."""
    X = _blobs(rng, 3001, 5, 6, np.float64)
    X -= X.mean(0)
    w = np.ones(X.shape[0])
    C0 = X[rng.choice(X.shape[0], 6, replace=False)]
    a, na = _run(_cpu.CpuSteps, X, w, C0, max_iter=100)
    b = _cpu.SklearnSteps(X, w, C0, n_threads=threads)
    nb = lloyd_loop(b, max_iter=100)
    assert b.n_threads == threads and na == nb
    np.testing.assert_array_equal(a.labels, b.labels)
    np.testing.assert_allclose(b.centers, a.centers, rtol=1e-12, atol=1e-12)
