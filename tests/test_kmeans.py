"""TSMKMeans on the CPU path: scikit-learn's estimator checks, hand-computed cases,
agreement with sklearn.cluster.KMeans from the same initial centres, invalid input.
No GPU needed (device="cpu")."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.cluster import KMeans
from sklearn.utils.estimator_checks import parametrize_with_checks

from tsm_apps.kmeans import TSMKMeans
from tsm_apps.kmeans import _cpu

# The same expected failure as sklearn's own KMeans (its PER_ESTIMATOR_XFAIL_CHECKS):
# k-means++ draws depend on the rows, so weights != repeated rows.
XFAIL = {"check_sample_weight_equivalence_on_dense_data":
         "sample_weight is not equivalent to removing/repeating samples."}


@parametrize_with_checks([TSMKMeans(device="cpu")], expected_failed_checks=lambda est: XFAIL)
def test_sklearn_estimator_checks(estimator, check):
    check(estimator)


def _same_partition(a, b):
    """Labels equal up to a permutation of the cluster ids."""
    a, b = np.asarray(a), np.asarray(b)
    pairs = set(zip(a.tolist(), b.tolist()))
    return len(pairs) == len(set(a.tolist())) == len(set(b.tolist()))


# ------------------------------------------------------------------ hand-computed


def test_two_clusters_by_hand():
    X = np.array([[0.0], [1.0], [10.0], [11.0]])
    km = TSMKMeans(2, init=np.array([[0.0], [10.0]]), device="cpu").fit(X)
    # Iteration 0 moves the centres to the means 0.5 and 10.5; iteration 1 changes
    # no label: strict convergence after 2 iterations.
    np.testing.assert_array_equal(km.cluster_centers_, [[0.5], [10.5]])
    np.testing.assert_array_equal(km.labels_, [0, 0, 1, 1])
    assert km.labels_.dtype == np.int32
    assert km.inertia_ == pytest.approx(4 * 0.25)
    assert km.n_iter_ == 2
    np.testing.assert_allclose(km.transform(np.array([[2.5]])), [[2.0, 8.0]])
    assert km.score(X) == pytest.approx(-1.0)
    np.testing.assert_array_equal(km.predict(np.array([[-3.0], [7.0]])), [0, 1])


def test_weighted_mean_by_hand():
    X = np.array([[0.0, 0.0], [4.0, 8.0], [100.0, 100.0]])
    w = np.array([3.0, 1.0, 2.0])
    km = TSMKMeans(2, init=X[[0, 2]], device="cpu").fit(X, sample_weight=w)
    np.testing.assert_allclose(km.cluster_centers_, [[1.0, 2.0], [100.0, 100.0]])
    # 3 * (1^2 + 2^2) + 1 * (3^2 + 6^2) = 15 + 45
    assert km.inertia_ == pytest.approx(60.0)


def test_tie_goes_to_the_smaller_index():
    labels, mind = _cpu.assign(np.array([[1.0]]), np.array([[0.0], [2.0]]))
    assert labels.tolist() == [0] and mind.tolist() == [1.0]


# ------------------------------------------------------------------ against sklearn


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("init", ["array", "k-means++", "random"])
def test_matches_sklearn(rng, dtype, init):
    X = rng.standard_normal((701, 13)).astype(dtype)
    X[:300] += 4.0
    w = rng.uniform(0.5, 2.0, X.shape[0]).astype(dtype)
    k = 6
    init_arg = X[rng.choice(X.shape[0], k, replace=False)] if init == "array" else init
    kw = dict(init=init_arg, max_iter=100, tol=1e-4, random_state=7)
    ours = TSMKMeans(k, device="cpu", **kw).fit(X, sample_weight=w)
    ref = KMeans(k, **kw).fit(X, sample_weight=w)
    assert _same_partition(ours.labels_, ref.labels_)
    assert ours.n_iter_ == ref.n_iter_
    rtol = 1e-10 if dtype == np.float64 else 1e-5
    assert ours.inertia_ == pytest.approx(ref.inertia_, rel=rtol)
    np.testing.assert_allclose(ours.cluster_centers_, ref.cluster_centers_, rtol=rtol * 10, atol=rtol * 10)
    assert ours.cluster_centers_.dtype == dtype


def test_tol_zero_and_tol_scaling_match_sklearn(rng):
    X = rng.standard_normal((500, 5)) * np.array([1.0, 10.0, 0.1, 3.0, 1.0])
    for tol in (0.0, 1e-2, 1.0):
        kw = dict(init=X[:4].copy(), tol=tol, max_iter=200)
        ours = TSMKMeans(4, device="cpu", **kw).fit(X)
        ref = KMeans(4, n_init=1, **kw).fit(X)
        assert ours.n_iter_ == ref.n_iter_, tol
        assert _same_partition(ours.labels_, ref.labels_)


def test_empty_cluster_relocated_like_sklearn(rng):
    X = rng.standard_normal((200, 3))
    init = np.vstack([X[:3], [[1e3, 1e3, 1e3]]])  # the last centre attracts nothing
    ours = TSMKMeans(4, init=init, max_iter=30, device="cpu").fit(X)
    ref = KMeans(4, init=init, n_init=1, max_iter=30).fit(X)
    assert len(set(ours.labels_.tolist())) == 4
    assert _same_partition(ours.labels_, ref.labels_)
    assert ours.inertia_ == pytest.approx(ref.inertia_, rel=1e-10)


def test_n_init_auto_and_best_of_runs(rng):
    X = rng.standard_normal((300, 4))
    assert TSMKMeans(3, init="random", device="cpu").fit(X)._n_init == 10
    assert TSMKMeans(3, device="cpu").fit(X)._n_init == 1
    with pytest.warns(RuntimeWarning, match="performing only one init"):
        km = TSMKMeans(3, init=X[:3], n_init=4, device="cpu").fit(X)
    assert km._n_init == 1
    many = TSMKMeans(3, init="random", n_init=5, random_state=0, device="cpu").fit(X)
    ref = KMeans(3, init="random", n_init=5, random_state=0).fit(X)
    assert many.inertia_ == pytest.approx(ref.inertia_, rel=1e-10)


def test_copy_x_false_restores_x(rng):
    X = rng.standard_normal((100, 3)) + 5
    X0 = X.copy()
    TSMKMeans(3, copy_x=False, random_state=0, device="cpu").fit(X)
    np.testing.assert_allclose(X, X0, rtol=0, atol=1e-12)


def test_verbose_prints_each_iteration(rng, capsys):
    X = rng.standard_normal((100, 3))
    km = TSMKMeans(3, verbose=1, random_state=0, device="cpu").fit(X)
    out = capsys.readouterr().out
    assert out.count("Iteration ") == km.n_iter_


def test_callable_init(rng):
    X = rng.standard_normal((60, 2))
    km = TSMKMeans(2, init=lambda X, k, random_state: X[:k], n_init=1, device="cpu").fit(X)
    ref = KMeans(2, init=X[:2], n_init=1).fit(X)
    assert km.inertia_ == pytest.approx(ref.inertia_, rel=1e-12)


def test_batches_bound_memory(rng, monkeypatch):
    # Force many row batches: the result must not change.
    X = rng.standard_normal((257, 5))
    a = TSMKMeans(4, init=X[:4], device="cpu").fit(X)
    monkeypatch.setattr(_cpu, "BATCH_ELEMS", 13)
    b = TSMKMeans(4, init=X[:4], device="cpu").fit(X)
    np.testing.assert_array_equal(a.labels_, b.labels_)
    assert a.inertia_ == pytest.approx(b.inertia_, rel=1e-12)


# ------------------------------------------------------------------ invalid input


def test_invalid_inputs_raise_like_sklearn(rng):
    X = rng.standard_normal((10, 3))
    with pytest.raises(ValueError, match="should be >= n_clusters"):
        TSMKMeans(11, device="cpu").fit(X)
    Xn = X.copy()
    Xn[2, 1] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        TSMKMeans(2, device="cpu").fit(Xn)
    km = TSMKMeans(2, device="cpu", random_state=0).fit(X)
    with pytest.raises(ValueError, match="features"):
        km.predict(X[:, :2])
    with pytest.raises(ValueError, match="sample_weight"):
        TSMKMeans(2, device="cpu").fit(X, sample_weight=np.ones(9))
    with pytest.raises(ValueError, match="Negative values"):
        TSMKMeans(2, device="cpu").fit(X, sample_weight=-np.ones(10))
    with pytest.raises(ValueError, match="initial centers"):
        TSMKMeans(2, init=X[:3], device="cpu").fit(X)
    with pytest.raises(ValueError, match="initial centers"):
        TSMKMeans(2, init=X[:2, :2], device="cpu").fit(X)
    for bad in (dict(n_clusters=0), dict(max_iter=0), dict(tol=-1.0), dict(init="kmeans"),
                dict(device="tpu"), dict(n_init=0)):
        with pytest.raises(ValueError):
            TSMKMeans(**{"n_clusters": 2, "device": "cpu", **bad}).fit(X)
    # A failed fit leaves the caller's data untouched.
    X0 = X.copy()
    with pytest.raises(ValueError):
        TSMKMeans(2, device="cpu", copy_x=False).fit(X, sample_weight=np.ones(3))
    np.testing.assert_array_equal(X, X0)


def test_main_job_runs(capsys):
    from tsm_apps.kmeans.__main__ import run

    km = run(["--dataset", "iris", "--n-clusters", "3", "--device", "cpu", "--verbose"])
    out = capsys.readouterr().out
    assert "inertia" in out and "Iteration 0" in out
    assert km.cluster_centers_.shape == (3, 4)


def test_docstring_examples_run():
    import doctest

    import tsm_apps._cli
    import tsm_apps.kmeans
    import tsm_apps.kmeans.__main__
    import tsm_apps.kmeans._estimator
    import tsm_apps.kmeans.bench
    import tsm_core.kmeans.assign
    import tsm_core.kmeans.configs
    import tsm_core.kmeans.init
    import tsm_core.kmeans.lloyd
    import tsm_core.kmeans.sources
    import tsm_core.kmeans.update
    import tsm_datasets.real
    import tsm_datasets.synthetic

    for mod in (tsm_apps.kmeans, tsm_apps.kmeans._estimator, tsm_apps.kmeans.__main__, tsm_apps.kmeans.bench,
                tsm_apps._cli, tsm_core.kmeans.assign, tsm_core.kmeans.configs, tsm_core.kmeans.init,
                tsm_core.kmeans.lloyd, tsm_core.kmeans.sources, tsm_core.kmeans.update,
                tsm_datasets.real, tsm_datasets.synthetic):
        result = doctest.testmod(mod, optionflags=doctest.ELLIPSIS)
        assert result.attempted > 0 and result.failed == 0, mod.__name__


def test_main_job_progress_and_quiet(capsys):
    from tsm_apps.kmeans.__main__ import main

    assert main(["--dataset", "iris", "--n-clusters", "3", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "Initialization complete" in out and "Iteration 0" in out and "Converged" in out
    main(["--dataset", "iris", "--n-clusters", "3", "--device", "cpu", "--quiet"])
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 3 and out[1].startswith("inertia ")


def test_cpu_and_gpu_share_one_lloyd_loop(rng, monkeypatch):
    # The CPU path runs tsm_core's loop over its numpy steps (sklearn's results).
    from tsm_core.kmeans import lloyd as _lloyd

    calls = []
    real = _lloyd.lloyd
    monkeypatch.setattr(_cpu, "lloyd_loop", lambda *a, **k: calls.append(1) or real(*a, **k))
    X = rng.standard_normal((300, 4))
    km = TSMKMeans(5, init=X[:5], device="cpu").fit(X)
    ref = KMeans(5, init=X[:5], n_init=1).fit(X)
    assert calls == [1]
    assert km.n_iter_ == ref.n_iter_ and km.inertia_ == pytest.approx(ref.inertia_, rel=1e-12)


def test_lloyd_loop_progress_lines():
    from tsm_core.kmeans.lloyd import lloyd

    X = np.array([[0.0], [1.0], [10.0], [11.0]])
    lines = []
    steps = _cpu.CpuSteps(X, np.ones(4), X[[0, 1]])
    n = lloyd(steps, max_iter=10, verbose=1, progress=lines.append)
    assert n == 3 and lines[-1] == "Converged at iteration 2: strict convergence."
    assert [ln.split(",")[0] for ln in lines[:-1]] == ["Iteration 0", "Iteration 1", "Iteration 2"]
    steps = _cpu.CpuSteps(X, np.ones(4), X[[0, 1]])
    assert lloyd(steps, max_iter=1) == 1  # max_iter reached: a final assignment follows
    assert steps.labels.tolist() == [0, 0, 1, 1]


def _one_stderr_line(text):
    lines = text.strip().splitlines()
    assert len(lines) == 1, text
    return lines[0]


def test_bench_without_gpu_exits_2(tmp_path, monkeypatch, capsys):
    from tsm_apps.kmeans import bench
    from tsm_core.runtime import arrays

    monkeypatch.setattr(arrays, "has_gpu", lambda: False)
    assert bench.main("kmeans", ["--out", str(tmp_path)]) == 2
    cap = capsys.readouterr()
    assert "needs a CUDA GPU" in _one_stderr_line(cap.err) and cap.out == ""
    assert not any(tmp_path.iterdir())


def test_bench_floors_take_the_larger_of_bytes_and_products():
    # The precision sweep's floors: X's bytes at the read bandwidth, or the mode's
    # products at its pipe's rate, whichever is larger; the ratio uses the marginal
    # time where there is one; "float32" counts its three bfloat16 products.
    from tsm_apps.kmeans import bench

    rates = {"read_bw": 4e12, "tf32": 4e14, "bfloat16": 8e14, "float16": 8e14, "fp32": 5e13}
    row = {"n": 10**7, "d": 32, "k": 8, "tf32_ms_per_iter": 2.0, "tf32_ms_per_iter_marginal": 0.64,
           "bfloat16_ms_per_iter": "RuntimeError()"}
    f = bench.floors(row, rates)
    assert f["tf32_floor_ms"] == pytest.approx(10**7 * 32 * 4 / 4e12 * 1e3)  # bytes: 0.32 ms
    assert f["tf32_floor_ratio"] == pytest.approx(2.0)
    assert f["bfloat16_floor_ms"] == pytest.approx(0.16) and "bfloat16_floor_ratio" not in f
    row = {"n": 10**6, "d": 128, "k": 4096, "float32_ms_per_iter": 12.0}
    f = bench.floors(row, rates)
    flops = 2.0 * 10**6 * 4096 * 128
    assert f["float32_floor_ms"] == pytest.approx(3 * flops / 8e14 * 1e3)
    assert f["simt_floor_ms"] == pytest.approx(flops / 5e13 * 1e3)
    assert f["float32_floor_ratio"] == pytest.approx(12.0 / f["float32_floor_ms"])


@pytest.mark.parametrize("with_floors", [False, True])
def test_bench_precision_plot_draws_a_floor_panel_where_measured(tmp_path, with_floors):
    # The sweep's figure: the times, and under them each mode's time over its floor
    # where the run measured the rates (a taller figure); failed entries left out.
    pytest.importorskip("matplotlib")
    from matplotlib.image import imread

    from tsm_apps.kmeans import bench

    rows = []
    for i, (n, d, k) in enumerate([(10**5, 4096, 16), (10**6, 64, 1024)]):
        row = {"n": n, "d": d, "k": k}
        for m in ("float32", "tf32", "bfloat16", "float16", "simt", "flash_float32", "flash_float16"):
            row[f"{m}_ms_per_iter"] = 1.0 + i
            row[f"{m}_ms_per_iter_marginal"] = 0.8 + i
        row["flash_float16_ms_per_iter_marginal"] = "RuntimeError()"
        if with_floors:
            row.update(bench.floors(row, {"read_bw": 4e12, "tf32": 4e14, "bfloat16": 8e14, "float16": 8e14,
                                          "fp32": 5e13}))
        rows.append(row)
    path = tmp_path / "p.png"
    bench.plot_precision(rows, str(path), "NVIDIA H200")
    h, w = imread(str(path)).shape[:2]
    assert w == 13 * 120 and h == (8 if with_floors else 4.5) * 120


@pytest.mark.parametrize("cmd", [["tsm_apps.kmeans.bench"], ["tsm_core.bench", "kmeans"]])
def test_bench_without_cupy_exits_2(tmp_path, cmd):
    # A fresh process in which CuPy cannot be imported: one line on stderr, status 2.
    import subprocess
    import sys

    code = ("import runpy, sys; sys.modules['cupy'] = None; "
            f"runpy.run_module({cmd[0]!r}, run_name='__main__', alter_sys=True)")
    r = subprocess.run([sys.executable, "-c", code, *cmd[1:], "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert "CuPy is not installed" in _one_stderr_line(r.stderr)
