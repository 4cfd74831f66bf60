"""TSMKMeans on the CPU with several runs (n_init): what the runs of a fit share
(``_cpu.Workspace``), the buffered inertia, the compiled comparison of runs. Each is
checked bit for bit against the computation it replaced. No GPU needed."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.utils import check_random_state

from tsm_apps.kmeans import TSMKMeans, _cpu, _estimator

ENGINES = ["numpy"] + (["sklearn"] if _cpu.sklearn_routines() is not None else [])


@pytest.fixture(autouse=True)
def _quiet_host(monkeypatch):
    # The thread count then is scikit-learn's on both sides of every comparison: a
    # probe on a busy host may pick another count, which changes the last bits.
    monkeypatch.setattr(_cpu, "_host_busy", lambda: False)


def _blobs(rng, n, d, k, dtype, spread=1.5):
    C = spread * rng.standard_normal((k, d))
    return (rng.standard_normal((n, d)) + C[rng.integers(0, k, n)]).astype(dtype)


def _plain_inertia(X, sample_weight, centers, labels):
    """The inertia as written before the buffers: one temporary per step and batch."""
    tot = 0.0
    rows = max(1, _cpu.INERTIA_ELEMS // max(1, X.shape[1]))
    for a in range(0, X.shape[0], rows):
        b = min(X.shape[0], a + rows)
        diff = X[a:b] - centers[labels[a:b]]
        tot += float(np.einsum("i,i->", np.einsum("ij,ij->i", diff, diff).astype(np.float64),
                               sample_weight[a:b].astype(np.float64)))
    return tot


def _plain_same(l1, l2):
    """Same partition, by definition: equal labels in one exactly where equal in the other."""
    pairs = {(int(a), int(b)) for a, b in zip(l1, l2)}
    return len(pairs) == len(set(l1.tolist())) == len(set(l2.tolist()))


# ------------------------------------------------------------------ the inertia


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n, d, k", [(0, 3, 2), (1, 3, 1), (2047, 32, 5), (50001, 32, 16), (3001, 70001 // 1000, 9),
                                     (40, 70000, 2)])
def test_inertia_is_the_plain_expression(rng, dtype, n, d, k):
    X = rng.standard_normal((n, d)).astype(dtype)
    C = rng.standard_normal((k, d)).astype(dtype)
    labels = rng.integers(0, k, n).astype(np.int32)
    w = rng.uniform(0.0, 2.0, n).astype(dtype)
    ref = _plain_inertia(X, w, C, labels)
    assert _cpu.inertia(X, w, C, labels) == ref
    assert _cpu.inertia(X, w, C, labels, w64=w.astype(np.float64)) == ref
    # Centres in the other dtype take the unbuffered expression.
    other = C.astype(np.float32 if dtype == np.float64 else np.float64)
    assert _cpu.inertia(X, w, other, labels) == _plain_inertia(X, w, other, labels)


# ------------------------------------------------------------------ runs sharing a workspace


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("weights", ["unit", "positive", "some zero"])
def test_runs_on_one_workspace_equal_runs_on_their_own(rng, engine, dtype, weights):
    X = _blobs(rng, 4001, 7, 6, dtype)
    X -= X.mean(0)
    w = {"unit": np.ones(X.shape[0]), "positive": rng.uniform(0.5, 2.0, X.shape[0]),
         "some zero": np.where(rng.random(X.shape[0]) < 0.1, 0.0, 1.0)}[weights].astype(dtype)
    tol = 1e-4 * _cpu.mean_variance(X)
    starts = [X[rng.choice(X.shape[0], 6, replace=False)] for _ in range(4)]
    far = X[:6].copy()
    far[5] = 1e3  # a centre that attracts nothing: the run relocates an empty cluster
    starts.append(far)
    ws = _cpu.Workspace(X, w, engine)
    for c0 in starts:
        shared = _cpu.lloyd(X, w, c0, max_iter=100, tol=tol, workspace=ws)
        alone = _cpu.lloyd(X, w, c0, max_iter=100, tol=tol, engine_=engine)
        np.testing.assert_array_equal(shared[0], alone[0])
        assert shared[1] == alone[1]
        np.testing.assert_array_equal(shared[2], alone[2])
        assert shared[3] == alone[3]
        assert shared[2].dtype == dtype and shared[0].dtype == np.int32


@pytest.mark.parametrize("engine", ENGINES)
def test_workspace_checks_its_engine(rng, engine):
    X = rng.standard_normal((50, 2))
    ws = _cpu.Workspace(X, np.ones(50), engine)
    other = "numpy" if engine == "sklearn" else "sklearn"
    with pytest.raises(ValueError, match="workspace"):
        _cpu.lloyd(X, np.ones(50), X[:2], workspace=ws, engine_=other)
    with pytest.raises(ValueError, match="expected sklearn or numpy"):
        _cpu.Workspace(X, np.ones(50), "gpu")


@pytest.mark.skipif("sklearn" not in ENGINES, reason="scikit-learn's compiled Lloyd iteration is not usable here")
def test_sklearn_update_is_the_plain_expression(rng):
    X = _blobs(rng, 3000, 5, 4, np.float32)
    w = np.ones(X.shape[0], np.float32)
    steps = _cpu.SklearnSteps(X, w, X[:4])
    with steps.r.one_blas_thread():
        for i in range(3):
            steps.pass_over(update=True)
            shift, n_empty, changed = steps.update()
            if steps.numpy_update:  # an empty cluster: the numpy steps' update, tested elsewhere
                continue
            assert shift == float(((steps.new.astype(np.float64) - steps.centers) ** 2).sum())
            assert n_empty == 0 and changed == (not np.array_equal(steps.labels, steps.labels_old))
            steps.advance()


class _CountingRoutines:
    """Stands in for scikit-learn's routines in the thread decision: its labels-only
    passes cost `cost[t]` seconds on t threads of a hand-moved clock."""

    def __init__(self, cost):
        self.cost, self.calls, self.now = cost, [], 0.0

    def n_threads(self):
        return 2

    def one_blas_thread(self):
        import contextlib

        return contextlib.nullcontext()

    def iterate(self, X, w, C, new, wsum, labels, shift, n_threads, update):
        self.calls.append(n_threads)
        self.now += self.cost[n_threads]


def test_thread_count_is_decided_once_per_fit(monkeypatch):
    r = _CountingRoutines({2: 0.024, 1: 0.0048})
    monkeypatch.setattr(_cpu, "_host_busy", lambda: True)
    monkeypatch.setattr(_cpu, "_PROBES", {})
    monkeypatch.setattr(_cpu.time, "perf_counter", lambda: r.now)
    clock = [0.0]
    monkeypatch.setattr(_cpu.time, "monotonic", lambda: clock[0])
    X = np.zeros((10, 3))
    ws = _cpu.Workspace(X, np.ones(10), "sklearn", routines=r)
    assert ws.threads(np.ones((4, 3))) == 1 and len(r.calls) == 4
    clock[0] += 10 * _cpu.PROBE_TTL_S  # a long fit: the shape's remembered answer has expired
    assert ws.threads(np.ones((4, 3))) == 1 and len(r.calls) == 4  # the fit keeps its count


@pytest.mark.skipif("sklearn" not in ENGINES, reason="scikit-learn's compiled Lloyd iteration is not usable here")
def test_fit_decides_threads_and_weights_once(rng, monkeypatch):
    calls = []
    real = _cpu.pass_threads
    monkeypatch.setattr(_cpu, "pass_threads", lambda *a: calls.append(1) or real(*a))
    X = _blobs(rng, 30000, 5, 4, np.float32)
    TSMKMeans(4, init="random", n_init=6, random_state=0, device="cpu").fit(X)
    assert len(calls) == 1


# ------------------------------------------------------------------ comparing runs


def test_maps_to_and_same_clustering(rng):
    cases = []
    for n, k in ((1, 1), (7, 3), (5000, 16)):
        a = rng.integers(0, k, n).astype(np.int32)
        perm = rng.permutation(k).astype(np.int32)
        b = rng.integers(0, k, n).astype(np.int32)
        merged = np.where(a == a.max(), 0, a).astype(np.int32)  # two clusters of a become one
        late = perm[a].copy()
        late[-1] = (late[-1] + 1) % k  # differs only in the last row
        cases += [(a, perm[a]), (a, b), (a, merged), (merged, a), (a, late)]
    for l1, l2 in cases:
        k = int(max(l1.max(), l2.max())) + 1
        m = np.full(k, -1, dtype=np.int64)
        m[l1] = l2
        expect_map = bool(np.array_equal(m[l1], l2))
        assert _cpu.maps_to(l1, l2, k) == expect_map
        assert _cpu.maps_to(l1.astype(np.int64), l2.astype(np.int64), k) == expect_map  # numpy's check
        assert _estimator._is_same_clustering(l1, l2) == _plain_same(l1, l2)


# ------------------------------------------------------------------ a whole fit, as before


def _fit_as_before(X, w, k, seed, engine, max_iter=300, tol=1e-4):
    """The CPU fit with init="random" as written before the workspace: every run
    converts the weights and decides its threads itself; runs compared by numpy."""
    X = np.array(X, order="C", copy=True)
    w = np.ones(X.shape[0], X.dtype) if w is None else w.astype(X.dtype)
    rs = check_random_state(seed)
    X_mean = X.mean(axis=0)
    X -= X_mean
    tol = tol * _cpu.mean_variance(X)
    best = None
    for _ in range(10):
        seeds = rs.choice(X.shape[0], size=k, replace=False, p=w / w.sum())
        labels, inertia, centers, n_iter = _cpu.lloyd(X, w, X[seeds], max_iter=max_iter, tol=tol, engine_=engine)
        if best is None or (inertia < best[1] and not _plain_same(labels, best[0])):
            best = (labels, inertia, centers, n_iter)
    return best[0], best[1], best[2] + X_mean, best[3]


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("weighted", [False, True])
def test_random_init_fit_is_unchanged(rng, monkeypatch, engine, dtype, weighted):
    monkeypatch.setenv("TSM_KMEANS_CPU", engine)
    X = _blobs(rng, 6007, 9, 7, dtype)
    w = rng.uniform(0.2, 3.0, X.shape[0]) if weighted else None
    for seed in (0, 5):
        km = TSMKMeans(7, init="random", n_init="auto", random_state=seed, device="cpu").fit(X, sample_weight=w)
        labels, inertia, centers, n_iter = _fit_as_before(X, w, 7, seed, engine)
        np.testing.assert_array_equal(km.labels_, labels)
        assert km.inertia_ == inertia
        np.testing.assert_array_equal(km.cluster_centers_, centers)
        assert km.n_iter_ == n_iter
