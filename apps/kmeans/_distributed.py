"""``TSMKMeans(distributed=True).fit``: the fit of the union of the ranks' shards.

The estimator's own steps and seedings (``_cpu``, ``tsm_core.kmeans``) run on each
rank's shard; ``tsm_core.kmeans.distributed`` makes them global (one allreduce per
Lloyd iteration) and ``tsm_core.distributed.Comm`` checks the shards against each
other before any work, so that every rank raises the same error. Imported only
when ``distributed=True``: a single-process fit never imports torch.distributed.
"""

from __future__ import annotations

import warnings
import zlib

import numpy as np
from sklearn.exceptions import ConvergenceWarning
from sklearn.utils import check_random_state

from tsm_core.arrays import to_backend, wrap
from tsm_core.distributed import Comm
from tsm_core.kmeans import distributed as dk

from tsm_apps.kmeans import _cpu

_DEVICE_KINDS = ("cupy", "torch")


def _xp(a):
    if isinstance(a, np.ndarray):
        return np
    import cupy

    return cupy


def _host(a):
    return a if isinstance(a, np.ndarray) else a.get()


def _kind(a):
    from tsm_apps.kmeans._estimator import _kind

    return _kind(a)


def _fingerprint(est, rs_state):
    """The parameters every rank must share, as bytes (compared by CRC-32)."""
    init = est.init
    if callable(init):
        init = "callable"
    elif not isinstance(init, str):
        kind = _kind(init)
        host = to_backend(init, "init") if kind != "numpy" else np.asarray(init)
        init = zlib.crc32(np.ascontiguousarray(_host(host), dtype=np.float64).tobytes())
    return repr((est.n_clusters, init, est.n_init, est.max_iter, float(est.tol), bool(est.verbose),
                 est.device, est.precision, rs_state)).encode()


def _random_state(est, comm):
    """The same RandomState on every rank: an int seeds it; None takes rank 0's seed;
    an instance must be in the same state everywhere (compared by fingerprint)."""
    rs = est.random_state
    if rs is None:
        seed = np.array([np.random.randint(np.iinfo(np.int32).max)], dtype=np.int64)
        comm.broadcast(seed, what="k-means: seed")
        return np.random.RandomState(int(seed[0])), "seed from rank 0"
    rs = check_random_state(rs)
    _, keys, pos, *_ = rs.get_state()
    return rs, (zlib.crc32(np.ascontiguousarray(keys).tobytes()), int(pos))


def _moments(comm, agr, X, shift):
    """Sums of (X - shift) and of its squares over all ranks (float64, in row blocks)."""
    xp = _xp(X)
    d = agr.d
    s = np.zeros(2 * d)
    if X.shape[0]:
        sh = xp.asarray(shift)
        s1, s2 = xp.zeros(d), xp.zeros(d)
        step = max(1, (1 << 24) // d)
        for a in range(0, X.shape[0], step):
            y = X[a:a + step].astype(xp.float64) - sh
            s1 += y.sum(0)
            s2 += (y * y).sum(0)
        s[:d], s[d:] = _host(s1), _host(s2)
    comm.allreduce(s, what="k-means: moments")
    return s[:d], s[d:]


def _tolerance(est, comm, agr, X, shift):
    """scikit-learn's tol * mean variance of the union (about `shift`, float64)."""
    if est.tol == 0:
        return 0.0
    s1, s2 = _moments(comm, agr, X, shift)
    m = s1 / agr.n
    return float(np.mean(s2 / agr.n - m * m)) * est.tol


def _same_clustering(comm, l1, l2, k):
    """Whether two labelings of the union are the same partition (labels permuted)."""
    a, b = _host(l1).astype(np.int64), _host(l2).astype(np.int64)
    mx, mn = np.full(k, -1, dtype=np.int64), np.full(k, k, dtype=np.int64)
    np.maximum.at(mx, a, b)
    np.minimum.at(mn, a, b)
    buf = np.concatenate([mx, -mn])
    comm.allreduce(buf, op="max", what="k-means: runs compared")
    mx, mn = buf[:k], -buf[k:]
    present = mx >= 0
    return bool((mx[present] == mn[present]).all()) and np.unique(mx[present]).size == int(present.sum())


def _global_inertia(comm, local):
    return float(comm.allreduce(np.array([float(local)]), what="k-means: inertia")[0])


def fit_distributed(est, X, sample_weight):
    """The body of ``TSMKMeans.fit`` with ``distributed=True`` (parameters validated)."""
    comm = Comm(timeout=est.timeout)
    err, Xb, w, gpu, finite, n, d, dtype = None, None, None, False, True, 0, 0, np.float64
    kind = _kind(X)
    try:
        gpu = est._on_gpu(kind)
        Xb, kind = est._check_X(X, reset=True, copy=est.copy_x and not gpu, distributed=True)
        if not gpu and not isinstance(Xb, np.ndarray):
            Xb = Xb.get()
        n, d = Xb.shape
        dtype = Xb.dtype
        finite = bool(_xp(Xb).isfinite(Xb).all())
        if finite and n:
            w = est._weights(sample_weight, Xb)
        elif finite:  # no rows: scikit-learn's check refuses weights that sum to 0
            if sample_weight is not None and np.ndim(sample_weight) == 1 and len(sample_weight):
                raise ValueError(f"sample_weight.shape == ({len(sample_weight)},), expected (0,)!")
            w = _xp(Xb).zeros(0, dtype=Xb.dtype)
    except (ValueError, TypeError, RuntimeError) as e:
        err = str(e)
    rs, rs_state = _random_state(est, comm) if est.random_state is not None else (None, "none")
    agr = comm.agree(n=n, d=d, dtype=dtype, finite=finite, device="gpu" if gpu else "cpu", error=err,
                     fingerprint=_fingerprint(est, rs_state))
    if rs is None:
        rs, _ = _random_state(est, comm)
    if agr.n < est.n_clusters:
        raise ValueError(f"n_samples={agr.n} (all ranks) should be >= n_clusters={est.n_clusters}.")
    n_init = est._n_init_for()
    init_is_array = not isinstance(est.init, str) and not callable(est.init)
    if init_is_array and n_init != 1:
        warnings.warn("Explicit initial center position passed: performing only one init in "
                      f"{type(est).__name__} instead of n_init={n_init}.", RuntimeWarning, stacklevel=3)
        n_init = 1
    est._n_init = n_init
    say = print if comm.rank == 0 else (lambda *a, **k: None)
    run = _fit_gpu if gpu else _fit_cpu
    labels, inertia, centers, n_iter = run(est, comm, agr, Xb, X, w, rs, init_is_array, say)

    counts = np.bincount(_host(labels).astype(np.int64), minlength=est.n_clusters).astype(np.float64)
    distinct = int(np.count_nonzero(comm.allreduce(counts, what="k-means: cluster sizes")))
    if distinct < est.n_clusters:
        warnings.warn(f"Number of distinct clusters ({distinct}) found smaller than n_clusters "
                      f"({est.n_clusters}). Possibly due to duplicate points in X.", ConvergenceWarning, stacklevel=3)
    if kind in _DEVICE_KINDS and isinstance(centers, np.ndarray):
        import cupy as cp

        centers, labels = cp.asarray(centers), cp.asarray(labels)
    if kind not in _DEVICE_KINDS and not isinstance(centers, np.ndarray):
        centers, labels = centers.get(), labels.get()
    est.cluster_centers_ = wrap(centers, kind)
    est.labels_ = wrap(labels, kind)
    est.inertia_ = float(inertia)
    est.n_iter_ = int(n_iter)
    est._n_features_out = est.n_clusters
    return est


def _initial(est, comm, agr, ops, X, Xcaller, w, rs, init, recluster, xp):
    """One run's initial centres (k, d), X's dtype, the same on every rank."""
    k = est.n_clusters
    if init is not None:
        c0 = init
    elif est.init == "k-means++":
        c0 = dk.kmeans_plusplus_distributed(comm, agr, ops, k, rs, w)[0]
    elif est.init == "k-means||":
        c0 = dk.kmeans_parallel_distributed(comm, agr, ops, k, rs, w, recluster=recluster)[0]
    elif isinstance(est.init, str):  # "random": k rows drawn by the weights
        c0 = dk.choice_without_replacement(comm, agr, ops, w.astype(xp.float64), k, rs)[1]
    else:  # a callable, called on every rank's shard; rank 0's centres are kept
        c0 = est._callable_init(Xcaller, rs, X.dtype, xp)
        est._validate_center_shape(X, c0)
    c0 = xp.ascontiguousarray(xp.asarray(c0, dtype=X.dtype))
    return comm.broadcast(c0, what="k-means: initial centres")


def _best(comm, k, runs):
    best = None
    for labels, inertia, centers, n_iter in runs:
        if best is None or (inertia < best[1] and not _same_clustering(comm, labels, best[0], k)):
            best = (labels, inertia, centers, n_iter)
    return best


def _fit_cpu(est, comm, agr, X, Xcaller, w, rs, init_is_array, say):
    s = np.zeros(agr.d + 1)
    s[:agr.d] = X.sum(axis=0, dtype=np.float64) if X.shape[0] else 0.0
    comm.allreduce(s, what="k-means: mean")
    # Centre X on the union's mean, as the single-process fit centres on X's.
    X_mean = (s[:agr.d] / agr.n).astype(X.dtype)
    X -= X_mean
    init = est._init_array(X, np) - X_mean if init_is_array else None
    try:
        tol = _tolerance(est, comm, agr, X, np.zeros(agr.d))
        ops = dk.NumpyInitOps(X, _cpu.row_sqnorms(X))

        def runs():
            for _ in range(est._n_init):
                c0 = _initial(est, comm, agr, ops, X, X, w, rs, init, dk.recluster_numpy, np)
                if est.verbose:
                    say("Initialization complete")
                steps = _cpu.CpuSteps(X, w, c0)
                n_iter = dk.lloyd_distributed(steps, comm, agr, gpu=False, max_iter=est.max_iter, tol=tol,
                                              verbose=est.verbose, progress=print)
                inertia = _global_inertia(comm, _cpu.inertia(X, w, steps.centers, steps.labels))
                yield steps.labels, inertia, steps.centers, n_iter

        labels, inertia, centers, n_iter = _best(comm, est.n_clusters, runs())
    finally:
        if not est.copy_x:
            X += X_mean
    return labels, inertia, centers + X_mean, n_iter


def _fit_gpu(est, comm, agr, X, Xcaller, w, rs, init_is_array, say):
    import cupy as cp

    import tsm_core

    init = est._init_array(X, cp) if init_is_array else None
    w = cp.asarray(w)  # numpy X streamed from host memory: its weights on the GPU all the same
    mean = np.zeros(agr.d + 1)
    if X.shape[0]:
        mean[:agr.d] = _host(X.sum(axis=0, dtype=_xp(X).float64))
    comm.allreduce(mean, what="k-means: mean")
    tol = _tolerance(est, comm, agr, X, mean[:agr.d] / agr.n)
    wk = None if bool((w == 1).all()) else w
    src = tsm_core.kmeans_source(X, max_gpu_memory=est.max_gpu_memory, n_clusters=est.n_clusters) \
        if X.shape[0] else None
    try:
        ops = dk.GpuInitOps(src, agr.d, X.dtype, unit_weights=wk is None)

        def runs():
            for _ in range(est._n_init):
                c0 = _initial(est, comm, agr, ops, X, Xcaller, w, rs, init, dk.recluster_gpu, cp)
                if est.verbose:
                    say("Initialization complete")
                yield dk.kmeans_lloyd_distributed(
                    src if src is not None else X, c0, comm, agr, sample_weight=wk, max_iter=est.max_iter,
                    tol=tol, verbose=est.verbose, max_gpu_memory=est.max_gpu_memory, progress=print,
                    precision=est._gpu_precision(X))

        return _best(comm, est.n_clusters, runs())
    finally:
        if src is not None:
            src.close()
