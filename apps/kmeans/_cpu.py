"""The CPU path of TSMKMeans: Lloyd's algorithm in vectorised numpy.

The same steps as the GPU path (``tsm_core.kmeans_lloyd``) and as scikit-learn's
``_kmeans_single_lloyd``: assign with ``||c||^2 - 2 x.c`` (the argmin does not need
``||x||^2``), update the centres from weighted sums (float64), relocate empty
clusters to the farthest points, stop on unchanged labels or on a total squared
centre shift <= tol, and end with an assignment to the final centres. Rows are
processed in batches so that the n x k distance block stays bounded.
"""

from __future__ import annotations

import numpy as np

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


def lloyd(X, sample_weight, centers_init, *, max_iter=300, tol=0.0, verbose=0):
    """One k-means run from `centers_init`. Returns (labels, inertia, centers, n_iter)."""
    centers = np.array(centers_init, dtype=X.dtype, order="C", copy=True)
    n = X.shape[0]
    k = centers.shape[0]
    labels_old = np.full(n, -1, dtype=np.int32)
    xx = row_sqnorms(X)
    strict = False
    labels = labels_old
    i = 0
    for i in range(max_iter):
        labels, mind = assign(X, centers, xx=xx)
        sums, wsum = centroid_sums(X, labels, sample_weight, k)
        relocate_empty(X, sample_weight, centers, labels, sums, wsum)
        safe = np.where(wsum > 0, wsum, 1.0)
        new = np.where((wsum > 0)[:, None], sums / safe[:, None], centers).astype(X.dtype)
        if verbose:
            print(f"Iteration {i}, inertia {float(mind.astype(np.float64) @ sample_weight)}.")
        shift_tot = float(((new.astype(np.float64) - centers) ** 2).sum())
        centers = new
        if np.array_equal(labels, labels_old):
            if verbose:
                print(f"Converged at iteration {i}: strict convergence.")
            strict = True
            break
        if shift_tot <= tol:
            if verbose:
                print(f"Converged at iteration {i}: center shift {shift_tot} within tolerance {tol}.")
            break
        labels_old = labels
    if not strict:
        labels, _ = assign(X, centers, xx=xx)
    return labels, inertia(X, sample_weight, centers, labels), centers, i + 1


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
