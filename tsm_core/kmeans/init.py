"""k-means++ seeding on the GPU: scikit-learn's greedy variant, the same draws."""

from __future__ import annotations

import numpy as np

from tsm_core.kmeans.launch import _cp
from tsm_core.kmeans.sources import _DeviceSource, _HostSource, kmeans_source
from tsm_core.runtime.arrays import to_backend


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
    random_state : numpy.random.RandomState
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
