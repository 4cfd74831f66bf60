"""Seeding on the GPU: scikit-learn's greedy k-means++ (the same draws) and k-means||
(``kmeans_parallel``; the algorithm in ``parallel_init``, its recluster in ``init.cu``)."""

from __future__ import annotations

import numpy as np

from tsm_core.kmeans import parallel_init as _par
from tsm_core.kmeans.assign import _assign
from tsm_core.kmeans.launch import _cp
from tsm_core.kmeans.sources import _DeviceSource, _HostSource, kmeans_source
from tsm_core.kmeans.tensor import TensorAssign, aligned_copy, ready
from tsm_core.runtime import compile as _compile
from tsm_core.runtime import config
from tsm_core.runtime.arrays import to_backend

INIT_FAMILY = "kmeans_init"
RECLUSTER_THREADS = 1024


def kmeans_plusplus(X, n_clusters, *, random_state, sample_weight=None, n_local_trials=None,
                    max_gpu_memory=None):
    """scikit-learn's greedy k-means++ seeding with the distances computed on the GPU.

    The random draws come from `random_state` in the same order as
    ``sklearn.cluster.kmeans_plusplus``, so the same seed picks the same points (up to
    rounding of the potentials).

    Parameters
    ----------
    X : cupy.ndarray, torch.Tensor (CUDA), numpy.ndarray or kmeans_source, shape (n, d)
        The rows; numpy X is moved to the GPU once, or streamed when it does not fit.
    n_clusters : int
        The number of centres to pick.
    random_state : int, numpy.random.RandomState or None
        The source of the random draws.
    sample_weight : array of shape (n,), optional
        Weights of the rows (default: all ones).
    n_local_trials : int, optional
        Candidates tried per centre (default ``2 + int(log(n_clusters))``).
    max_gpu_memory : int, optional
        Bytes of GPU memory it may use (default: 70% of the free memory).

    Returns
    -------
    centers : cupy.ndarray of shape (n_clusters, d)
        The chosen rows, X's dtype.
    indices : numpy.ndarray of shape (n_clusters,), int
        Their indices in X.

    Raises
    ------
    RuntimeError
        No CUDA GPU (CuPy's error).

    Examples
    --------
    >>> import numpy as np, tsm_core
    >>> X = np.array([[0.0, 0.0], [0.1, 0.0], [9.0, 9.0], [9.1, 9.0]])
    >>> if tsm_core.has_gpu():
    ...     C, idx = tsm_core.kmeans_plusplus(X, 2, random_state=np.random.RandomState(0))
    ... else:  # scikit-learn's, which draws the same points
    ...     from sklearn.cluster import kmeans_plusplus
    ...     C, idx = kmeans_plusplus(X, 2, random_state=np.random.RandomState(0))
    >>> sorted(int(i) // 2 for i in idx)  # one centre in each pair of close points
    [0, 1]
    """
    random_state = _par.as_random_state(random_state)
    cp = _cp()
    own = not isinstance(X, (_DeviceSource, _HostSource))
    src = kmeans_source(X, max_gpu_memory=max_gpu_memory, n_clusters=n_clusters)
    try:
        n, d = src.n, src.d
        if sample_weight is None:
            w = cp.ones(n, dtype=cp.float64)
        else:
            w = cp.asarray(to_backend(sample_weight, "sample_weight") if not isinstance(sample_weight, np.ndarray)
                           else sample_weight).astype(cp.float64)
        if n_local_trials is None:
            n_local_trials = 2 + int(np.log(n_clusters))
        w_host = cp.asnumpy(w)
        centers = cp.empty((n_clusters, d), dtype=src.dtype)
        indices = np.full(n_clusters, -1, dtype=int)

        def dist_to(P):
            """(p, n) float64 squared distances of the rows P (p, d) to every row of X."""
            Pc = cp.ascontiguousarray(P)
            pn = (Pc.astype(cp.float64) ** 2).sum(1)
            out = cp.empty((Pc.shape[0], n), dtype=cp.float64)
            for a, Xc in src.chunks():
                b = a + Xc.shape[0]
                g = cp.matmul(Pc, Xc.T).astype(cp.float64)
                xx = src.xx(a, Xc).astype(cp.float64)
                out[:, a:b] = cp.maximum(pn[:, None] - 2 * g + xx[None, :], 0)
            return out

        center_id = random_state.choice(n, p=w_host / w_host.sum())
        first = src.rows([center_id])
        centers[0] = first[0]
        indices[0] = center_id
        closest = dist_to(first)[0]
        current_pot = float(closest @ w)
        for c in range(1, n_clusters):
            rand_vals = random_state.uniform(size=n_local_trials) * current_pot
            cum = cp.cumsum(w * closest)
            cand = cp.asnumpy(cp.searchsorted(cum, cp.asarray(rand_vals)))
            np.clip(cand, None, n - 1, out=cand)
            rows = src.rows(cand)
            dc = cp.minimum(closest[None, :], dist_to(rows))
            pots = cp.asnumpy(dc @ w)
            best = int(np.argmin(pots))
            current_pot = float(pots[best])
            closest = dc[best]
            centers[c] = rows[best]
            indices[c] = int(cand[best])
        return centers, indices
    finally:
        if own:
            src.close()


def _weights(sample_weight, n):
    """Row weights as a CuPy float64 array (n,) (all ones when None)."""
    cp = _cp()
    if sample_weight is None:
        return cp.ones(n, dtype=cp.float64)
    w = sample_weight if isinstance(sample_weight, np.ndarray) else to_backend(sample_weight, "sample_weight")
    w = cp.asarray(w).astype(cp.float64)
    if w.shape != (n,):
        raise ValueError(f"sample_weight has shape {w.shape}; expected ({n},)")
    return w


def _bucket(p: int) -> int:
    """p rounded up to a multiple of max(64, the power of two at or below p / 8): the
    candidate counts of the rounds fall into few shapes (the assignment's route is
    measured once per shape), at most 12.5% of padding."""
    if p <= 64:
        return 1 << (p - 1).bit_length()
    step = max(64, 1 << (p.bit_length() - 4))
    return -(-p // step) * step


class _GpuOps:
    """``parallel_init.oversample``'s backend on the GPU: distances by the assignment
    kernels over the source's chunks (streamed X included), uniforms from CuPy's
    Philox generator. float32 rows' distances to the round's candidates come from the
    TF32 tensor cores, clamped at 0: the sampling needs them to a few parts in 1e3, not
    exact (``TSM_KMEANS_INIT_TF32=0``: the exact kernels)."""

    def __init__(self, src, unit_weights: bool):
        self.xp = _cp()
        self.src = src
        self.unit = unit_weights
        self.tf32 = (src is not None and str(src.dtype) == "float32"
                     and config.flag("TSM_KMEANS_INIT_TF32") is not False)

    def rng(self, seed):
        cp = self.xp
        return cp.random.Generator(cp.random.Philox4x3210(seed))

    def to_host(self, a):
        return self.xp.asnumpy(a)

    def _nearest(self, chunks, n, C):
        cp = self.xp
        cn = (C.astype(cp.float64) ** 2).sum(1).astype(C.dtype)
        dist = cp.empty(n, dtype=C.dtype)
        pos = cp.empty(n, dtype=cp.int32)
        changed = cp.zeros(1, dtype=cp.int32)
        for a, Xc in chunks:
            b = a + Xc.shape[0]
            _assign(Xc, C, cn, pos[a:b], dist[a:b], changed, method="auto")
        return dist, pos

    def _nearest_tf32(self, chunks, n, C):
        """_nearest on the TF32 tensor cores (float32 rows): distances clamped at 0."""
        cp = self.xp
        dist = cp.empty(n, dtype=cp.float32)
        pos = cp.empty(n, dtype=cp.int32)
        changed = cp.zeros(1, dtype=cp.int32)
        tc = TensorAssign(self.src.max_rows, C.shape[1], C.shape[0], "tf32")
        Cc = C if C.data.ptr % 16 == 0 else C.copy()
        tc.prepare(Cc)
        for a, Xc in chunks:
            b = a + Xc.shape[0]
            tc.run(Xc if ready(Xc) else aligned_copy(Xc), pos[a:b], dist[a:b], changed, None)
        cp.maximum(dist, 0, out=dist)
        return dist, pos

    def nearest(self, idx):
        """Distances of every row to the rows `idx`, the candidates padded (by repeats
        of the last one) to few shapes; a label past the real ones names the last."""
        cp = self.xp
        p = int(idx.size)
        padded = np.concatenate([idx, np.full(_bucket(p) - p, idx[-1], dtype=idx.dtype)])
        C = cp.ascontiguousarray(self.src.rows(padded))
        find = self._nearest_tf32 if self.tf32 else self._nearest
        dist, pos = find(self.src.chunks(), self.src.n, C)
        cp.minimum(pos, p - 1, out=pos)
        return dist, pos

    def cross_nearest(self, a, b):
        cp = self.xp
        A = cp.ascontiguousarray(self.src.rows(a))
        B = cp.ascontiguousarray(self.src.rows(b))
        return cp.asnumpy(self._nearest([(0, A)], A.shape[0], B)[1])

    def segment_weights(self, near, w, m):
        """Sums of w by candidate in a fixed order: exact counts for unit weights, else
        a stable sort by candidate and prefix sums (no floating-point atomics)."""
        cp = self.xp
        if self.unit:
            return cp.bincount(near, minlength=m).astype(cp.float64)
        order = cp.argsort(near)
        cw = cp.concatenate([cp.zeros(1, dtype=cp.float64), cp.cumsum(w[order])])
        ends = cp.searchsorted(near[order], cp.arange(m, dtype=near.dtype), side="right")
        cum = cw[ends]
        return cum - cp.concatenate([cp.zeros(1, dtype=cp.float64), cum[:-1]])


def _pool_sqdist(P):
    """(m, m) float32 squared distances between the pool's rows P (CuPy, X's dtype):
    one GEMM, then ||p||^2 - 2 p.q + ||q||^2 clamped at 0 with a zero diagonal."""
    cp = _cp()
    m = P.shape[0]
    G = cp.matmul(P, P.T)
    pn = (P.astype(cp.float64) ** 2).sum(1).astype(P.dtype)
    D = cp.empty((m, m), dtype=cp.float32)
    kern = _compile.get_kernel(INIT_FAMILY, f"kmeans_pool_sqdist<{_compile.ctype(P.dtype)}>")
    blocks = max(1, min(4096, -(-(m * m) // 256)))
    kern((blocks,), (256,), (G, pn, np.int32(m), D))
    return D


def _recluster(Dmat, weights, first, u):
    """The greedy k-means++ steps of ``parallel_init.greedy_recluster`` in one launch of
    ``kmeans_recluster`` (one block). Dmat: CuPy (m, m) float32; weights (m,); u the
    (k - 1, trials) uniforms. Returns the chosen pool indices (numpy int)."""
    cp = _cp()
    m = Dmat.shape[0]
    k = u.shape[0] + 1
    trials = u.shape[1]
    if trials > _par.MAX_TRIALS:
        raise ValueError(f"at most {_par.MAX_TRIALS} local trials per centre; got {trials}")
    if m > _par.MAX_POOL:
        raise ValueError(f"a pool of at most {_par.MAX_POOL} points; got {m}")
    kern = _compile.get_kernel(INIT_FAMILY, f"kmeans_recluster<{RECLUSTER_THREADS}, {_par.MAX_TRIALS}>")
    smem = m * (8 + 4)
    if smem > 48 * 1024:
        kern.max_dynamic_shared_size_bytes = smem
    out = cp.empty(k, dtype=cp.int32)
    ud = cp.asarray(np.ascontiguousarray(u, dtype=np.float64).ravel() if u.size else np.zeros(1))
    wd = cp.ascontiguousarray(cp.asarray(weights, dtype=cp.float64))
    kern((1,), (RECLUSTER_THREADS,), (cp.ascontiguousarray(Dmat), np.int32(m), wd, ud, np.int32(k),
                                      np.int32(trials), np.int32(first), out), shared_mem=smem)
    return cp.asnumpy(out).astype(int)


def kmeans_parallel(X, n_clusters, *, random_state, sample_weight=None,
                    oversampling_factor=_par.OVERSAMPLING_FACTOR, n_rounds=_par.N_ROUNDS, max_gpu_memory=None):
    """k-means|| seeding (Bahmani et al. 2012, scalable k-means++) on the GPU.

    A few passes over X instead of k-means++'s n_clusters: ``n_rounds`` rounds each
    take about l = ``oversampling_factor * n_clusters`` candidate rows at once (each row
    with probability proportional to its weighted squared distance to the candidates so
    far), then scikit-learn's greedy k-means++ picks n_clusters centres among the
    candidates, weighted by the rows nearest to each. For large k, where k-means++ costs
    n_clusters passes over X.

    The algorithm is in ``tsm_core.kmeans.parallel_init``. A round computes the
    distances of all rows to its new candidates only (the assignment kernels, over the
    source's chunks: streamed X works) and keeps every row's nearest candidate, so the
    candidates' weights need no further pass. Up to 4096 clusters the recluster runs as
    one kernel (one block, all steps on the device) on the pool's distance matrix; the
    pool is thinned to 8192 candidates where larger. Above 4096 clusters the pool is
    reclustered by ``kmeans_plusplus`` from its coordinates (a host round trip per
    centre).

    The round's uniforms come from CuPy's Philox generator seeded once from
    `random_state`: the CPU path (``kmeans_parallel_numpy``, numpy's generator) picks
    other candidates from the same seed.

    Parameters
    ----------
    X : cupy.ndarray, torch.Tensor (CUDA), numpy.ndarray or kmeans_source, shape (n, d)
        The rows; numpy X is moved to the GPU once, or streamed when it does not fit.
    n_clusters : int
        The number of centres to pick.
    random_state : int, numpy.random.RandomState or None
        The source of the random draws: the first candidate, the seed of the rounds'
        generator, the recluster's draws (in scikit-learn's order).
    sample_weight : array of shape (n,), optional
        Weights of the rows (default: all ones). A row of weight 0 is never a candidate.
    oversampling_factor : float, default=0.5
        l / n_clusters: the expected number of candidates a round takes, per cluster.
    n_rounds : int, default=5
        Rounds of oversampling (passes over X); the pool holds about
        1 + n_rounds * l candidates.
    max_gpu_memory : int, optional
        Bytes of GPU memory X and the per-row state may use (default: 70% of the free
        memory); the recluster's distance matrix (at most 256 MB) comes on top.

    Returns
    -------
    centers : cupy.ndarray of shape (n_clusters, d)
        The chosen rows, X's dtype.
    indices : numpy.ndarray of shape (n_clusters,), int
        Their indices in X.

    Raises
    ------
    ValueError
        n_clusters < 1 or above the number of rows, oversampling_factor <= 0,
        n_rounds < 1 (before any draw from `random_state`).
    RuntimeError
        No CUDA GPU (CuPy's error).

    Examples
    --------
    >>> import numpy as np, tsm_core
    >>> X = np.array([[0.0, 0.0], [0.1, 0.0], [9.0, 9.0], [9.1, 9.0]])
    >>> if tsm_core.has_gpu():
    ...     C, idx = tsm_core.kmeans_parallel(X, 2, random_state=np.random.RandomState(0))
    ... else:  # the same algorithm in numpy
    ...     from tsm_core.kmeans.parallel_init import kmeans_parallel_numpy
    ...     C, idx = kmeans_parallel_numpy(X, 2, random_state=np.random.RandomState(0))
    >>> sorted(int(i) // 2 for i in idx)  # one centre in each pair of close points
    [0, 1]
    """
    _par.check_params(n_clusters, oversampling_factor, n_rounds)
    random_state = _par.as_random_state(random_state)
    cp = _cp()
    own = not isinstance(X, (_DeviceSource, _HostSource))
    src = kmeans_source(X, max_gpu_memory=max_gpu_memory, n_clusters=n_clusters)
    try:
        n = src.n
        if n < n_clusters:
            raise ValueError(f"n_samples={n} should be >= n_clusters={n_clusters}.")
        w = _weights(sample_weight, n)
        # Unit weights: the candidates' weights are exact counts (no sort).
        ops = _GpuOps(src, unit_weights=sample_weight is None or bool((w == 1).all()))
        small = n_clusters <= _par.MAX_KERNEL_CLUSTERS
        pool, pw = _par.oversample(ops, w, n_clusters, random_state, oversampling_factor=oversampling_factor,
                                   n_rounds=n_rounds, max_pool=_par.MAX_POOL if small else None)
        P = cp.ascontiguousarray(src.rows(pool))
        if small:
            first, u = _par.recluster_draws(pw, n_clusters, random_state)
            chosen = _recluster(_pool_sqdist(P), pw, first, u)
        else:
            _, chosen = kmeans_plusplus(P, n_clusters, random_state=random_state, sample_weight=pw)
        return P[cp.asarray(chosen)], pool[chosen].astype(int)
    finally:
        if own:
            src.close()
