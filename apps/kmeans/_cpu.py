"""The CPU path of TSMKMeans: the steps of Lloyd's algorithm in vectorised numpy.

The loop is tsm_core's (``tsm_core.kmeans.lloyd.lloyd``, which runs the GPU path
too); these are its numpy steps (``CpuSteps``), as in scikit-learn's
``_kmeans_single_lloyd``: assign with ``||c||^2 - 2 x.c`` (the argmin does not need
``||x||^2``), update the centres from weighted sums (float64), relocate empty
clusters to the farthest points. Rows are processed in batches so that the n x k
distance block stays bounded.
"""

from __future__ import annotations

import numpy as np

from tsm_core.kmeans.lloyd import lloyd as lloyd_loop
from tsm_core.kmeans.parallel_init import kmeans_parallel_numpy

BATCH_ELEMS = 1 << 22  # distances per batch (32 MiB in float64)


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


def inertia(X, sample_weight, centers, labels):
    """sum_i w_i ||x_i - c_{label_i}||^2, computed from the differences (float64)."""
    tot = 0.0
    for a, b in _batches(X.shape[0], X.shape[1]):
        diff = X[a:b] - centers[labels[a:b]]
        tot += float(np.einsum("ij,ij->i", diff, diff) @ sample_weight[a:b].astype(np.float64))
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

    Attributes
    ----------
    centers : numpy.ndarray, shape (k, d)
        The current centres.
    labels : numpy.ndarray, shape (n,), int32
        The current assignment (-1 before the first pass).
    """

    def __init__(self, X, sample_weight, centers_init):
        self.X, self.w = X, sample_weight
        self.centers = np.array(centers_init, dtype=X.dtype, order="C", copy=True)
        self.k = self.centers.shape[0]
        self.xx = row_sqnorms(X)
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


def lloyd(X, sample_weight, centers_init, *, max_iter=300, tol=0.0, verbose=0, progress=None):
    """One k-means run from `centers_init` through the one Lloyd loop.

    Returns (labels, inertia, centers, n_iter); the inertia is computed from the
    differences to the final centres (float64)."""
    steps = CpuSteps(X, sample_weight, centers_init)
    n_iter = lloyd_loop(steps, max_iter=max_iter, tol=tol, verbose=verbose, progress=progress)
    return steps.labels, inertia(X, sample_weight, steps.centers, steps.labels), steps.centers, n_iter


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

    def sqdist(P):
        D = x_squared_norms[None, :] - 2 * (P @ X.T) + row_sqnorms(P)[:, None]
        return np.maximum(D, 0)

    center_id = random_state.choice(n, p=sample_weight / sample_weight.sum())
    centers[0] = X[center_id]
    indices[0] = center_id
    closest = sqdist(centers[0:1])
    current_pot = closest @ w
    for c in range(1, n_clusters):
        rand_vals = random_state.uniform(size=n_local_trials) * current_pot
        cand = np.searchsorted(np.cumsum(w * closest), rand_vals)
        np.clip(cand, None, closest.size - 1, out=cand)
        dc = np.minimum(closest, sqdist(X[cand]))
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
