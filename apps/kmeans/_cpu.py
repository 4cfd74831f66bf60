"""The CPU path of TSMKMeans: the steps of Lloyd's algorithm in vectorised numpy.

The loop is tsm_core's (``tsm_core.kmeans.lloyd.lloyd``, which runs the GPU path
too); these are its numpy steps (``CpuSteps``), as in scikit-learn's
``_kmeans_single_lloyd``: assign with ``||c||^2 - 2 x.c`` (the argmin does not need
``||x||^2``), update the centres from weighted sums (float64), relocate empty
clusters to the farthest points. Rows are processed in batches so that the n x k
distance block stays bounded.

Where scikit-learn's compiled Lloyd iteration imports and passes a check on a small
problem (``TSM_KMEANS_CPU=auto``, the default; ``sklearn`` requires it, ``numpy``
never uses it), the loop runs ``SklearnSteps`` instead: each pass is one call of
``sklearn.cluster._k_means_lloyd.lloyd_iter_chunked_dense`` (assignment and
centroid sums fused, over all cores through OpenMP, BLAS held to one thread as
scikit-learn does), while the loop, its stopping rules and progress lines stay
ours. An iteration that leaves a cluster empty is redone with the numpy sums and
our relocation (scikit-learn's own picks the farthest points in another order), so
relocation is the one documented here on both engines. The differences from the
numpy steps are round-off: the sums are accumulated in X's dtype (float32 for
float32 X, as scikit-learn's), and with more than two threads their reduction
order follows thread timing (as scikit-learn's KMeans), so the last bits of the
centres may differ between runs there. Where several threads would be used, a fit
first times labels-only passes on them and on one thread (``pass_threads``) and
runs on the faster: on a host whose cores are busy, a parallel pass can take five
times as long as a serial one. The count chosen changes the last bits of the
centre sums, not the labels of a pass.
"""

from __future__ import annotations

import contextlib
import os
import time

import numpy as np

from tsm_core.kmeans.lloyd import lloyd as lloyd_loop
from tsm_core.kmeans.parallel_init import kmeans_parallel_numpy
from tsm_core.runtime import config
from tsm_core.runtime.log import get_logger

_log = get_logger(__name__)

BATCH_ELEMS = 1 << 22  # distances per batch (32 MiB in float64)
INERTIA_ELEMS = 1 << 16  # elements of X per batch of the inertia
SMALL_WORK = 1 << 17  # n * d * k below which "auto" keeps the numpy steps


def _batches(n: int, k: int):
    rows = max(1, BATCH_ELEMS // max(k, 1))
    for a in range(0, n, rows):
        yield a, min(n, a + rows)


def row_sqnorms(X):
    return np.einsum("ij,ij->i", X, X)


def assign(X, centers, *, xx=None):
    """(labels int32, squared distance to the nearest centre) of each row of X."""
    n = X.shape[0]
    k = centers.shape[0]
    cn = row_sqnorms(centers)
    labels = np.empty(n, dtype=np.int32)
    mind = np.empty(n, dtype=X.dtype)
    for a, b in _batches(n, k):
        D = X[a:b] @ centers.T
        D *= -2
        D += cn
        lab = np.argmin(D, axis=1)
        labels[a:b] = lab
        best = D[np.arange(b - a), lab]
        best += row_sqnorms(X[a:b]) if xx is None else xx[a:b]
        np.maximum(best, 0, out=best)
        mind[a:b] = best
    return labels, mind


def mean_variance(X):
    """The mean over the features of their variances, for X already centred (float64
    sums over cache-sized chunks: ``sum x^2 / (n d) - mean(m^2)`` with m the column
    means, which centring makes ~0, so nothing cancels)."""
    n, d = X.shape
    s1 = np.zeros(d)
    tot = 0.0
    step = max(1, (1 << 16) // d)
    for a in range(0, n, step):
        y = X[a:a + step].astype(np.float64, copy=False)
        s1 += y.sum(0)
        # einsum's own loop: a BLAS dot per chunk wakes BLAS's threads each time,
        # which costs milliseconds a call on a loaded host.
        tot += float(np.einsum("ij,ij->", y, y))
    m = s1 / n
    return tot / (n * d) - float(np.mean(m * m))


def inertia(X, sample_weight, centers, labels, compiled=False, w64=None):
    """sum_i w_i ||x_i - c_{label_i}||^2, computed from the differences: each row's
    distance in X's dtype, sums in float64. `compiled`, for float64 X: scikit-learn's
    compiled sum (where usable) over chunks of 2^16 elements, one thread each, the
    chunks summed in float64 (it sums in X's dtype: float32 X keeps the numpy sums).
    `w64`: the weights already in float64 (a fit's runs convert them once)."""
    r = sklearn_routines() if compiled and X.dtype == np.float64 else None
    if r is not None and r.inertia is not None and X.flags.c_contiguous:
        w = np.ascontiguousarray(sample_weight, dtype=X.dtype)
        C = np.ascontiguousarray(centers, dtype=X.dtype)
        lab = np.ascontiguousarray(labels, dtype=np.int32)
        rows = max(1, INERTIA_ELEMS // max(1, X.shape[1]))
        return float(sum(float(r.inertia(X[a:a + rows], w[a:a + rows], C, lab[a:a + rows], 1))
                         for a in range(0, X.shape[0], rows)))
    if w64 is None:
        w64 = sample_weight.astype(np.float64, copy=False)
    n, d = X.shape
    tot = 0.0
    # Small batches, so that the temporaries stay in cache, written into buffers made
    # once: a fresh 256 KiB temporary per batch is mapped and faulted in anew each
    # time (about half the time of this sum at 50,000 x 32). The values and the
    # order of the sums are those of the plain expression
    # einsum(einsum(diff, diff -> i).astype(float64), w64) per batch.
    rows = max(1, min(n, INERTIA_ELEMS // max(1, d)))
    same = centers.dtype == X.dtype
    diff = np.empty((rows, d), dtype=X.dtype) if same else None
    row32 = np.empty(rows, dtype=X.dtype)
    row64 = np.empty(rows, dtype=np.float64)
    for a in range(0, n, rows):
        b = min(n, a + rows)
        if same:
            g = diff[:b - a]
            np.take(centers, labels[a:b], axis=0, out=g, mode="clip")
            np.subtract(X[a:b], g, out=g)
        else:
            g = X[a:b] - centers[labels[a:b]]
        r = np.einsum("ij,ij->i", g, g, out=row32[:b - a]) if g.dtype == X.dtype else np.einsum("ij,ij->i", g, g)
        r64 = row64[:b - a]
        r64[...] = r
        tot += float(np.einsum("i,i->", r64, w64[a:b]))
    return tot


def distances(X, centers):
    """Euclidean distances (n, k), as ``KMeans.transform`` returns them."""
    n, k = X.shape[0], centers.shape[0]
    out = np.empty((n, k), dtype=X.dtype)
    cn = row_sqnorms(centers)
    for a, b in _batches(n, k):
        D = X[a:b] @ centers.T
        D *= -2
        D += cn
        D += row_sqnorms(X[a:b])[:, None]
        np.maximum(D, 0, out=D)
        out[a:b] = np.sqrt(D)
    return out


def centroid_sums(X, labels, sample_weight, k):
    """(k, d) weighted sums of each cluster's rows and (k,) weights, in float64."""
    n, d = X.shape
    sums = np.zeros((k, d), dtype=np.float64)
    wsum = np.bincount(labels, weights=sample_weight.astype(np.float64), minlength=k)
    for a, b in _batches(n, max(k, d)):
        # A one-hot (k, rows) weight matrix times the rows: one BLAS call per batch.
        M = np.zeros((k, b - a), dtype=np.float64)
        M[labels[a:b], np.arange(b - a)] = sample_weight[a:b]
        sums += M @ X[a:b].astype(np.float64, copy=False)
    return sums, wsum


def relocate_empty(X, sample_weight, centers_old, labels, sums, wsum):
    """scikit-learn's relocation of empty clusters (``_relocate_empty_clusters_dense``):
    each takes one of the points farthest from their centres, largest first (ties:
    smaller index); the point's weight moves with it."""
    empty = np.flatnonzero(wsum == 0)
    if empty.size == 0:
        return
    diff = X - centers_old[labels]
    dist = np.einsum("ij,ij->i", diff, diff)
    far = np.argsort(-dist, kind="stable")[: empty.size]
    for new_id, idx in zip(empty, far):
        w = float(sample_weight[idx])
        old_id = labels[idx]
        sums[old_id] -= X[idx] * w
        sums[new_id] = X[idx] * w
        wsum[new_id] = w
        wsum[old_id] -= w


class CpuSteps:
    """The numpy steps of ``tsm_core.kmeans.lloyd.lloyd`` (the one Lloyd loop).

    Parameters
    ----------
    X : numpy.ndarray, shape (n, d), float32 or float64
        The rows (C order); read only.
    sample_weight : numpy.ndarray, shape (n,)
        Weights of the rows.
    centers_init : array, shape (k, d)
        Initial centres (copied, in X's dtype).
    workspace : Workspace, optional
        What the runs of one fit share (here ``||x||^2``); default: computed for this run.

    Attributes
    ----------
    centers : numpy.ndarray, shape (k, d)
        The current centres.
    labels : numpy.ndarray, shape (n,), int32
        The current assignment (-1 before the first pass).
    """

    def __init__(self, X, sample_weight, centers_init, workspace=None):
        self.X, self.w = X, sample_weight
        self.centers = np.array(centers_init, dtype=X.dtype, order="C", copy=True)
        self.k = self.centers.shape[0]
        self.xx = row_sqnorms(X) if workspace is None else workspace.xx()
        self.labels = np.full(X.shape[0], -1, dtype=np.int32)
        self.labels_old = self.labels
        self.mind = None
        self.new = None

    def pass_over(self, update):
        self.labels_old = self.labels
        self.labels, self.mind = assign(self.X, self.centers, xx=self.xx)
        if update:
            self.sums, self.wsum = centroid_sums(self.X, self.labels, self.w, self.k)

    def update(self):
        wsum = self.wsum
        safe = np.where(wsum > 0, wsum, 1.0)
        self.new = np.where((wsum > 0)[:, None], self.sums / safe[:, None], self.centers).astype(self.X.dtype)
        shift_tot = float(((self.new.astype(np.float64) - self.centers) ** 2).sum())
        n_empty = int(np.count_nonzero(wsum == 0))
        return shift_tot, n_empty, not np.array_equal(self.labels, self.labels_old)

    def relocate_empty(self, n_empty):
        relocate_empty(self.X, self.w, self.centers, self.labels, self.sums, self.wsum)

    def advance(self):
        self.centers = self.new

    def inertia(self):
        return float(self.mind.astype(np.float64) @ self.w)


# ------------------------------------------------------------------ scikit-learn's compiled iteration

_ROUTINES = {}  # "sk": _Routines or None, once imported and checked; "same": maps_to's compiled check


class _Routines:
    """scikit-learn's compiled dense Lloyd iteration, its thread count and its BLAS limit."""

    def __init__(self):
        from sklearn.cluster._k_means_lloyd import lloyd_iter_chunked_dense
        from sklearn.utils._openmp_helpers import _openmp_effective_n_threads

        try:
            from sklearn.utils.parallel import _get_threadpool_controller

            controller = _get_threadpool_controller()
        except ImportError:
            from threadpoolctl import ThreadpoolController

            controller = ThreadpoolController()
        try:
            from sklearn.cluster._k_means_common import _inertia_dense
        except ImportError:
            _inertia_dense = None
        self.iterate = lloyd_iter_chunked_dense
        self.inertia = _inertia_dense
        self.n_threads = _openmp_effective_n_threads
        self.controller = controller

    def one_blas_thread(self):
        """BLAS at one thread while the OpenMP threads each run their own GEMM
        (scikit-learn's ``limits=1, user_api="blas"`` around its Lloyd loop)."""
        return self.controller.limit(limits=1, user_api="blas")


def _check(r):
    """True if `r` computes what the numpy steps compute on a small weighted problem
    (labels, and centres to round-off), in both dtypes."""
    rng = np.random.default_rng(0)
    for dt in (np.float64, np.float32):
        X = rng.standard_normal((300, 5)).astype(dt)
        X[:100] += 3
        w = rng.uniform(0.5, 2.0, 300).astype(dt)
        C = X[[0, 150, 299]].copy()
        new, wsum = np.zeros_like(C), np.zeros(3, dtype=dt)
        labels, shift = np.full(300, -1, dtype=np.int32), np.zeros(3, dtype=dt)
        r.iterate(X, w, C, new, wsum, labels, shift, 1, True)
        ref_labels, _ = assign(X, C)
        sums, ws = centroid_sums(X, ref_labels, w, 3)
        if not np.array_equal(labels, ref_labels) or not np.allclose(new, sums / ws[:, None], rtol=1e-4, atol=1e-4):
            return False
        if r.inertia is not None:
            d = X - C[labels]
            ref = float(np.einsum("ij,ij->i", d, d) @ w.astype(np.float64))
            if not np.isclose(float(r.inertia(X, w, C, labels, 1)), ref, rtol=1e-4):
                r.inertia = None
    return True


def maps_to(l1, l2, k):
    """Whether the labels `l1` determine `l2` (equal labels in `l1`, equal in `l2`),
    labels in [0, k). scikit-learn's compiled check stops at the first row that
    contradicts the map, where runs that found different clusterings part within a
    few rows; numpy's check reads every row (about 0.4 ms at 50,000 rows).

    Parameters
    ----------
    l1, l2 : numpy.ndarray, shape (n,), integers
        Two labelings of the same rows.
    k : int
        One more than the largest label of either.

    Returns
    -------
    bool

    Examples
    --------
    >>> import numpy as np
    >>> from tsm_apps.kmeans import _cpu
    >>> a = np.array([0, 0, 1, 2], dtype=np.int32)
    >>> _cpu.maps_to(a, np.array([2, 2, 0, 0], dtype=np.int32), 3), _cpu.maps_to(a, a[::-1].copy(), 3)
    (True, False)
    """
    same = _ROUTINES.get("same", 0)
    if same == 0:
        try:
            from sklearn.cluster._k_means_common import _is_same_clustering as same
        except ImportError:
            same = None
        _ROUTINES["same"] = same
    if (same is not None and l1.dtype == l2.dtype == np.int32 and l1.flags.c_contiguous
            and l2.flags.c_contiguous):
        try:
            return bool(same(l1, l2, k))
        except (TypeError, ValueError):  # a changed private signature
            _ROUTINES["same"] = None
    m = np.full(k, -1, dtype=np.int64)
    m[l1] = l2
    return bool(np.array_equal(m[l1], l2))


def sklearn_routines():
    """scikit-learn's compiled Lloyd iteration (a ``_Routines``), or None where it does
    not import or fails ``_check`` (its private API may change between versions).
    Imported and checked once."""
    if "sk" not in _ROUTINES:
        r = None
        try:
            r = _Routines()
            if not _check(r):
                _log.warning("scikit-learn's lloyd_iter_chunked_dense disagrees with the numpy steps; "
                             "TSMKMeans runs the numpy steps on the CPU")
                r = None
        except Exception as e:  # ImportError, or a changed signature (TypeError, ValueError)
            _log.info("scikit-learn's compiled Lloyd iteration is not usable (%s: %s); numpy steps",
                      type(e).__name__, e)
            r = None
        _ROUTINES["sk"] = r
    return _ROUTINES["sk"]


PROBE_TTL_S = 5.0  # how long a measured thread count stands for passes of the same shape
PROBE_MARGIN = 1.25  # one thread only where it measured this much faster
_PROBES = {}  # (n, d, k, dtype) -> (threads, time.monotonic() of the measurement)


def _host_busy() -> bool:
    """Whether other work holds this host's cores: the 1-minute load average at least
    the core count (True where the load average is unknown)."""
    try:
        return os.getloadavg()[0] >= (os.cpu_count() or 1)
    except (AttributeError, OSError):
        return True


def pass_threads(r, X, sample_weight, centers):
    """The OpenMP thread count for the passes of `r.iterate` over X: scikit-learn's
    (``_openmp_effective_n_threads``), or one where a pass on one thread measured faster.

    On a host whose cores are busy with other work, a parallel pass waits at its
    barrier for a thread the scheduler has parked: on a loaded 2-core host a pass of
    50,000 x 32 rows, k = 16, took 24 ms on two threads and 4.8 ms on one (measured
    2026-11-28). So, where scikit-learn would use several threads, two labels-only
    passes (no centre is touched; the labels go to a scratch buffer) are timed on
    each count, alternated, and one thread is chosen where its minimum is at least
    ``PROBE_MARGIN`` times faster (otherwise scikit-learn's count, as before). On a
    host whose load average is below its core count nothing is timed: the probe's four
    passes cost 7-13% of a 0.6 s fit there (measured on the quiet 2-core host,
    2026-11-28) and find scikit-learn's count anyway. The
    answer is remembered for ``PROBE_TTL_S`` seconds per (n, d, k, dtype), so that the
    runs of one fit (n_init) share one measurement. One thread and several give the same labels; the centre
    sums differ in their last bits (the order of the per-thread reduction).

    Parameters
    ----------
    r : _Routines
        scikit-learn's compiled iteration (``sklearn_routines()``).
    X : numpy.ndarray, shape (n, d)
        The rows, C order.
    sample_weight : numpy.ndarray, shape (n,)
        Weights, in X's dtype.
    centers : numpy.ndarray, shape (k, d)
        Centres in X's dtype (read only).

    Returns
    -------
    int
        The thread count, at least 1.

    Examples
    --------
    >>> import numpy as np
    >>> from tsm_apps.kmeans import _cpu
    >>> r = _cpu.sklearn_routines()
    >>> X = np.random.default_rng(0).standard_normal((2000, 4))
    >>> r is None or 1 <= _cpu.pass_threads(r, X, np.ones(2000), X[:3].copy()) <= r.n_threads()
    True
    """
    n_max = int(r.n_threads())
    if n_max <= 1:
        return 1
    if not _host_busy():
        return n_max
    key = (X.shape[0], X.shape[1], centers.shape[0], X.dtype.str)
    now = time.monotonic()
    hit = _PROBES.get(key)
    if hit is not None and now - hit[1] < PROBE_TTL_S:
        return hit[0]
    labels = np.empty(X.shape[0], dtype=np.int32)
    wsum = np.zeros(centers.shape[0], dtype=X.dtype)
    shift = np.zeros(centers.shape[0], dtype=X.dtype)
    best = {n_max: float("inf"), 1: float("inf")}
    with r.one_blas_thread():
        for _ in range(2):
            for t in (n_max, 1):
                t0 = time.perf_counter()
                r.iterate(X, sample_weight, centers, centers, wsum, labels, shift, t, False)
                best[t] = min(best[t], time.perf_counter() - t0)
    threads = 1 if best[1] * PROBE_MARGIN < best[n_max] else n_max
    _PROBES[key] = (threads, time.monotonic())
    return threads


def engine(work=None):
    """The CPU engine of the Lloyd iterations: "sklearn" or "numpy" (``TSM_KMEANS_CPU``).

    Parameters
    ----------
    work : int, optional
        n * d * k of the problem. With the switch at "auto", problems below
        ``SMALL_WORK`` take the numpy steps: an OpenMP parallel region per
        iteration costs more than their whole numpy iteration, and far more on a
        loaded host.

    Returns
    -------
    str
        "sklearn" where scikit-learn's compiled iteration is usable and the switch is
        "sklearn", or "auto" (default) and the problem is not small; "numpy" otherwise.

    Raises
    ------
    ValueError
        The switch is not one of auto, sklearn, numpy.
    RuntimeError
        ``TSM_KMEANS_CPU=sklearn`` where scikit-learn's iteration is not usable.

    Examples
    --------
    >>> from tsm_apps.kmeans import _cpu
    >>> _cpu.engine() in ("sklearn", "numpy")
    True
    """
    mode = (config.text("TSM_KMEANS_CPU") or "auto").lower()
    if mode not in ("auto", "sklearn", "numpy"):
        raise ValueError(f"TSM_KMEANS_CPU={mode!r}: expected auto, sklearn or numpy")
    if mode == "numpy" or mode == "auto" and work is not None and work < SMALL_WORK:
        return "numpy"
    usable = sklearn_routines() is not None
    if mode == "sklearn" and not usable:
        raise RuntimeError("TSM_KMEANS_CPU=sklearn but scikit-learn's compiled Lloyd iteration is not usable")
    return "sklearn" if usable else "numpy"


class Workspace:
    """What the n_init runs of one CPU fit share, made once per fit.

    Without it each run converts the weights, scans them for the relocation test,
    decides its thread count and (numpy steps) computes ``||x||^2`` for itself;
    scikit-learn does its conversions once per fit. A run reads here the values it
    would compute for itself, so its result is the same with or without a workspace
    (the thread count aside, which a busy host may change from run to run without one).

    Parameters
    ----------
    X : numpy.ndarray, shape (n, d), float32 or float64, C order
        The rows (centred by the estimator); read only.
    sample_weight : numpy.ndarray, shape (n,)
        Weights of the rows.
    engine_ : {"sklearn", "numpy"}
        The steps of every run (``engine()``).
    routines : _Routines, optional
        For the "sklearn" engine; default: ``sklearn_routines()``.

    Attributes
    ----------
    engine : str
        `engine_`.
    routines : _Routines or None
        scikit-learn's compiled iteration, for the "sklearn" engine.
    w : numpy.ndarray, shape (n,)
        The weights in X's dtype, C order.
    w64 : numpy.ndarray, shape (n,), float64
        The weights in float64 (the inertia's sums).
    n_threads : int or None
        The OpenMP threads of the passes, decided by the first run (``threads``).

    Raises
    ------
    ValueError
        `engine_` is neither "sklearn" nor "numpy".
    RuntimeError
        The "sklearn" engine where scikit-learn's compiled iteration is not usable.

    Examples
    --------
    >>> import numpy as np
    >>> from tsm_apps.kmeans import _cpu
    >>> X = np.random.default_rng(0).standard_normal((500, 3))
    >>> ws = _cpu.Workspace(X, np.ones(500), "numpy")
    >>> runs = [_cpu.lloyd(X, ws.w, X[i:i + 4], workspace=ws) for i in range(3)]
    >>> all(r[0].shape == (500,) for r in runs)
    True
    """

    def __init__(self, X, sample_weight, engine_, routines=None):
        if engine_ not in ("sklearn", "numpy"):
            raise ValueError(f"engine_={engine_!r}: expected sklearn or numpy")
        self.X = X
        self.engine = engine_
        self.routines = None
        if engine_ == "sklearn":
            self.routines = routines if routines is not None else sklearn_routines()
            if self.routines is None:
                raise RuntimeError("scikit-learn's compiled Lloyd iteration is not usable")
        self.w = np.ascontiguousarray(sample_weight, dtype=X.dtype)
        self.w64 = np.asarray(sample_weight).astype(np.float64)
        # With positive weights an empty cluster is one without rows (unweighted count).
        self.positive = bool(self.w.min() > 0) if self.w.size else True
        self.w_max = self.w.max() if self.w.size else X.dtype.type(0)
        self.n_threads = None
        self._xx = None

    def xx(self):
        """``||x||^2`` of every row (X's dtype), computed at the first call."""
        if self._xx is None:
            self._xx = row_sqnorms(self.X)
        return self._xx

    def threads(self, centers):
        """The thread count of every pass of this fit: ``pass_threads`` at the first
        call (its probe, where the host is busy, times passes over `centers`), then the
        same answer, so that all runs of a fit take the same count."""
        if self.n_threads is None:
            self.n_threads = pass_threads(self.routines, self.X, self.w, centers)
        return self.n_threads


class SklearnSteps(CpuSteps):
    """The steps of ``tsm_core.kmeans.lloyd.lloyd`` over scikit-learn's compiled iteration.

    Each pass is one ``lloyd_iter_chunked_dense`` call (labels, sums in X's dtype,
    averaged centres); the loop, the stopping rules (our shift, in float64) and the
    progress lines are ours. An iteration whose labels leave a cluster without weight
    is redone from those labels with the numpy sums (float64) and our relocation.

    Parameters
    ----------
    X : numpy.ndarray, shape (n, d), float32 or float64, C order
        The rows; read only.
    sample_weight : numpy.ndarray, shape (n,)
        Weights of the rows (converted to X's dtype).
    centers_init : array, shape (k, d)
        Initial centres (copied, in X's dtype).
    routines : _Routines, optional
        Default: ``sklearn_routines()``; with a `workspace`, the workspace's.
    n_threads : int, optional
        OpenMP threads of each pass. Default: the workspace's (``Workspace.threads``)
        or ``pass_threads`` (scikit-learn's count, or one where a pass measured
        faster on one thread).
    workspace : Workspace, optional
        What the runs of one fit share (weights, routines, thread count); default:
        made for this run.
    """

    def __init__(self, X, sample_weight, centers_init, routines=None, n_threads=None, workspace=None):
        if workspace is None:
            workspace = Workspace(X, sample_weight, "sklearn", routines=routines)
        self.X = X
        self.w = workspace.w
        self.r = workspace.routines
        self.centers = np.array(centers_init, dtype=X.dtype, order="C", copy=True)
        self.k = self.centers.shape[0]
        self.labels = np.full(X.shape[0], -1, dtype=np.int32)
        self.labels_old = np.full(X.shape[0], -1, dtype=np.int32)
        self.new = np.zeros_like(self.centers)
        self.wsum_x = np.zeros(self.k, dtype=X.dtype)
        self.shift = np.zeros(self.k, dtype=X.dtype)
        # Scratch of each iteration's checks (the shift in float64, the changed labels).
        self._diff64 = np.empty(self.centers.shape, dtype=np.float64)
        self._ne = np.empty(X.shape[0], dtype=bool)
        self.positive = workspace.positive
        self.w_max = workspace.w_max
        self.numpy_update = False
        self.n_threads = workspace.threads(self.centers) if n_threads is None else n_threads

    def pass_over(self, update):
        if not update:
            self.r.iterate(self.X, self.w, self.centers, self.centers, self.wsum_x, self.labels, self.shift,
                           self.n_threads, False)
            return
        self.labels, self.labels_old = self.labels_old, self.labels
        self.r.iterate(self.X, self.w, self.centers, self.new, self.wsum_x, self.labels, self.shift,
                       self.n_threads, True)
        # With positive weights, a cluster scikit-learn relocated holds the weight of
        # the one point it moved there (<= the largest weight) and no label: only
        # when some cluster weighs that little do the labels need counting.
        if self.positive and not bool((self.wsum_x <= self.w_max).any()):
            self.numpy_update = False
        else:
            counts = np.bincount(self.labels, weights=None if self.positive else self.w, minlength=self.k)
            self.numpy_update = bool((counts == 0).any())
        if self.numpy_update:
            # scikit-learn relocated by its own rule: redo the update from the labels.
            self.sums, self.wsum = centroid_sums(self.X, self.labels, self.w, self.k)

    def update(self):
        if self.numpy_update:
            return CpuSteps.update(self)
        # ((new in float64 - centers) ** 2).sum() and labels != labels_old, written into
        # buffers: the same values, without three temporaries an iteration.
        diff = np.subtract(self.new, self.centers, out=self._diff64, dtype=np.float64)
        shift_tot = float(np.square(diff, out=diff).sum())
        return shift_tot, 0, bool(np.not_equal(self.labels, self.labels_old, out=self._ne).any())

    def advance(self):
        self.centers, self.new = self.new, self.centers

    def inertia(self):
        return inertia(self.X, self.w, self.centers, self.labels, compiled=True)


def lloyd(X, sample_weight, centers_init, *, max_iter=300, tol=0.0, verbose=0, progress=None, engine_=None,
          workspace=None):
    """One k-means run from `centers_init` through the one Lloyd loop.

    `engine_`: "sklearn" or "numpy" (default: the workspace's, else ``engine()``).
    `workspace`: a ``Workspace`` of X and these weights, shared by the runs of one fit
    (default: one made for this run). Returns (labels, inertia, centers, n_iter); the
    inertia is computed from the differences to the final centres (float64)."""
    if workspace is None:
        workspace = Workspace(X, sample_weight, engine() if engine_ is None else engine_)
    elif engine_ is not None and engine_ != workspace.engine:
        raise ValueError(f"engine_={engine_!r} but the workspace runs {workspace.engine!r}")
    eng = workspace.engine
    if eng == "sklearn":
        steps = SklearnSteps(X, sample_weight, centers_init, workspace=workspace)
        limit = steps.r.one_blas_thread()
    else:
        steps = CpuSteps(X, sample_weight, centers_init, workspace=workspace)
        limit = contextlib.nullcontext()
    with limit:
        n_iter = lloyd_loop(steps, max_iter=max_iter, tol=tol, verbose=verbose, progress=progress)
    return (steps.labels, inertia(X, sample_weight, steps.centers, steps.labels, compiled=eng == "sklearn",
                                  w64=workspace.w64),
            steps.centers, n_iter)


def kmeans_plusplus(X, n_clusters, random_state, sample_weight, x_squared_norms=None, n_local_trials=None):
    """scikit-learn's greedy k-means++ (``_kmeans_plusplus``): the same random draws in
    the same order. Returns (centers, indices)."""
    n, d = X.shape
    if x_squared_norms is None:
        x_squared_norms = row_sqnorms(X)
    if n_local_trials is None:
        n_local_trials = 2 + int(np.log(n_clusters))
    w = sample_weight.astype(np.float64)
    centers = np.empty((n_clusters, d), dtype=X.dtype)
    indices = np.full(n_clusters, -1, dtype=int)

    unit = bool((w == 1).all())

    def sqdist(P):
        # ||x||^2 - 2 x.p + ||p||^2, added in that order, in place (no temporaries);
        # (-2 P) X^T is -2 (P X^T) exactly (a power of two scales every partial sum).
        D = (P * -2) @ X.T
        D += x_squared_norms
        D += row_sqnorms(P)[:, None]
        return np.maximum(D, 0, out=D)

    center_id = random_state.choice(n, p=sample_weight / sample_weight.sum())
    centers[0] = X[center_id]
    indices[0] = center_id
    closest = sqdist(centers[0:1])
    current_pot = closest @ w
    for c in range(1, n_clusters):
        rand_vals = random_state.uniform(size=n_local_trials) * current_pot
        # Unit weights: w * closest is closest in float64, exactly.
        cand = np.searchsorted(np.cumsum(closest, dtype=np.float64) if unit else np.cumsum(w * closest), rand_vals)
        np.clip(cand, None, closest.size - 1, out=cand)
        dc = sqdist(X[cand])
        np.minimum(closest, dc, out=dc)
        pots = dc @ w
        best = int(np.argmin(pots))
        current_pot = pots[best]
        closest = dc[best]
        centers[c] = X[cand[best]]
        indices[c] = cand[best]
    return centers, indices


def kmeans_parallel(X, n_clusters, random_state, sample_weight, x_squared_norms=None):
    """k-means|| (``tsm_core.kmeans.parallel_init``) in numpy, its default oversampling
    (0.5 n_clusters a round, 5 rounds). Returns (centers, indices); numpy's generator
    draws the rounds, so the candidates differ from the GPU's for the same seed."""
    return kmeans_parallel_numpy(X, n_clusters, random_state=random_state, sample_weight=sample_weight,
                                 x_squared_norms=x_squared_norms)
