"""k-means++ seeding on the GPU: scikit-learn's greedy variant, the same draws."""

from __future__ import annotations

import numpy as np

from tsm_core.kmeans.launch import _cp
from tsm_core.kmeans.sources import _DeviceSource, _HostSource, kmeans_source
from tsm_core.runtime.arrays import to_backend


def kmeans_plusplus(X, n_clusters, *, random_state, sample_weight=None, n_local_trials=None,
                    max_gpu_memory=None):
    """scikit-learn's greedy k-means++ seeding with the distances computed on the GPU.

    The random draws come from `random_state` (a numpy RandomState) in the same order
    as ``sklearn.cluster.kmeans_plusplus``, so the same seed picks the same points
    (up to rounding of the potentials).

    Parameters
    ----------
    X : CuPy array, torch CUDA tensor, numpy array or `kmeans_source`, shape (n, d)
    n_clusters : int
    random_state : numpy.random.RandomState
    sample_weight : (n,) array of the same kind, optional

    Returns
    -------
    centers : (n_clusters, d) CuPy array (X's dtype); indices : (n_clusters,) numpy int

    Examples
    --------
    >>> import cupy as cp, numpy as np, tsm_core                      # doctest: +SKIP
    >>> X = cp.random.standard_normal((500, 3))                       # doctest: +SKIP
    >>> C, idx = tsm_core.kmeans_plusplus(X, 4, random_state=np.random.RandomState(0))  # doctest: +SKIP
    >>> C.shape                                                       # doctest: +SKIP
    (4, 3)
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
