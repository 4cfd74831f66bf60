"""k-means|| seeding (Bahmani et al. 2012, "Scalable K-Means++", Algorithm 2), array-module generic.

The algorithm, with row weights w (default 1) and l = oversampling_factor * n_clusters:

1. the first candidate: one row drawn with probability w_i / sum(w) (``random_state``);
2. ``n_rounds`` rounds: with D_i the squared distance of row i to its nearest candidate
   and phi = sum_i w_i D_i, every row joins the candidates independently with
   probability min(1, l w_i D_i / phi) (uniforms from a generator seeded once from
   ``random_state``). A round computes the distances of all rows to its new
   candidates only, and keeps for every row the smaller distance and the index of its
   nearest candidate; it stops early once every row is a candidate or phi is 0;
3. the weight of a candidate: the sum of w_i over the rows nearest to it;
4. the recluster: scikit-learn's greedy k-means++ on the weighted candidates.

Where the rounds leave fewer than n_clusters candidates, the missing ones are drawn in
one batch as k-means++ draws (probability proportional to w_i D_i, without
replacement, from ``random_state``). Only where X has fewer distinct rows of positive
weight than n_clusters does the pool stay smaller; the recluster then repeats centres
as scikit-learn's k-means++ does on duplicate points.

A pool larger than ``max_pool`` (the GPU's recluster keeps an m x m float32 distance
matrix: 256 MB at 8192) is thinned first: ``max_pool`` candidates drawn with
probability proportional to their weights, without replacement (``random_state``);
a dropped candidate's weight moves to the kept candidate nearest to it.

This module holds the steps that the numpy and CuPy paths share (``oversample``
through an ``ops`` object that computes distances on its backend), the host-side
draws of the recluster (``recluster_draws``), and ``greedy_recluster``: the numpy
recluster on a precomputed distance matrix, step for step what the GPU's
``kmeans_recluster`` kernel does.
"""

from __future__ import annotations

import numpy as np

OVERSAMPLING_FACTOR = 0.5
N_ROUNDS = 5
# The GPU's recluster holds the pool's m x m float32 distances (256 MB at 8192) and
# D and w of the pool in one block's shared memory (12 bytes a point).
MAX_POOL = 8192
# Up to this many clusters the pool is thinned to MAX_POOL and reclustered by the
# kernel; above it, the whole pool is reclustered from its coordinates.
MAX_KERNEL_CLUSTERS = MAX_POOL // 2
# Local trials per centre the kernel takes at most (2 + int(log k) <= 16).
MAX_TRIALS = 16


def check_params(n_clusters, oversampling_factor, n_rounds):
    """Raise ValueError for parameters k-means|| cannot run with (before any draw)."""
    if isinstance(n_clusters, bool) or not isinstance(n_clusters, (int, np.integer)) or n_clusters < 1:
        raise ValueError(f"n_clusters must be an integer >= 1; got {n_clusters!r}")
    if isinstance(oversampling_factor, bool) or not isinstance(oversampling_factor, (int, float, np.number)) \
            or not np.isfinite(oversampling_factor) or oversampling_factor <= 0:
        raise ValueError(f"oversampling_factor must be a finite number > 0; got {oversampling_factor!r}")
    if isinstance(n_rounds, bool) or not isinstance(n_rounds, (int, np.integer)) or n_rounds < 1:
        raise ValueError(f"n_rounds must be an integer >= 1; got {n_rounds!r}")


def as_random_state(random_state) -> np.random.RandomState:
    """`random_state` as a numpy RandomState, as scikit-learn's ``check_random_state``
    reads it: an int seeds a new one, None is numpy's global one, a RandomState is
    itself.

    >>> as_random_state(3).randint(100) == np.random.RandomState(3).randint(100)
    True
    >>> as_random_state("3")
    Traceback (most recent call last):
    ...
    ValueError: random_state='3' should be an int, a numpy.random.RandomState or None
    """
    if random_state is None:
        return np.random.mtrand._rand
    if isinstance(random_state, np.random.RandomState):
        return random_state
    if isinstance(random_state, (int, np.integer)) and not isinstance(random_state, bool):
        return np.random.RandomState(random_state)
    raise ValueError(f"random_state={random_state!r} should be an int, a numpy.random.RandomState or None")


def n_trials(n_clusters: int) -> int:
    """scikit-learn's local trials per centre: 2 + int(log(n_clusters))."""
    return 2 + int(np.log(n_clusters))


def oversample(ops, w, n_clusters, random_state, *, oversampling_factor=OVERSAMPLING_FACTOR,
               n_rounds=N_ROUNDS, max_pool=MAX_POOL):
    """Steps 1 to 3 of k-means||: the candidate pool and its weights.

    Parameters
    ----------
    ops : object
        The backend: ``xp`` (numpy or cupy), ``rng(seed)`` (a generator with
        ``random(size)``), ``nearest(idx)`` -> (dist (n,), pos (n,) int) the squared
        distance of every row to the rows ``idx`` (numpy int) and the position in
        ``idx`` of the nearest one (the smaller position on ties), ``cross_nearest(a, b)``
        -> numpy int: for each row ``a[j]``, the position in ``b`` of its nearest row,
        ``segment_weights(near, w, m)`` -> (m,) float64 sums of w by ``near``
        (deterministic), ``to_host(a)`` -> numpy.
    w : xp array of shape (n,), float64
        Row weights (non-negative, positive sum).
    n_clusters : int
    random_state : int, numpy.random.RandomState or None
    oversampling_factor, n_rounds : see ``tsm_core.kmeans_parallel``.
    max_pool : int or None
        The pool is thinned to this many candidates where larger (None: never).

    Returns
    -------
    pool : numpy.ndarray of int64, shape (m,)
        The candidates' rows, in the order they were taken.
    weights : numpy.ndarray of float64, shape (m,)
        Their weights.
    """
    check_params(n_clusters, oversampling_factor, n_rounds)
    random_state = as_random_state(random_state)
    xp = ops.xp
    n = int(w.shape[0])
    first = draw_by_weight(xp, w, random_state)
    seed = int(random_state.randint(np.iinfo(np.int32).max))
    rng = ops.rng(seed)
    ell = float(oversampling_factor) * n_clusters

    parts = [np.array([first], dtype=np.int64)]
    D, near = ops.nearest(parts[0])
    near = near.astype(xp.int32)
    D[first] = 0
    m = 1

    def add(new, D, near, m):
        """Candidates `new` (numpy) join the pool: distances to them only, the min kept."""
        Dn, pos = ops.nearest(new)
        better = Dn < D
        D = xp.where(better, Dn, D)
        near = xp.where(better, pos.astype(xp.int32) + m, near)
        nd = xp.asarray(new)
        # A candidate is its own nearest, whatever the distance's rounding says.
        D[nd] = 0
        near[nd] = xp.arange(m, m + new.size, dtype=xp.int32)
        parts.append(new)
        return D, near, m + new.size

    for _ in range(n_rounds):
        if m >= n:
            break
        wD = w * D
        phi = float(wD.sum())
        if not phi > 0:
            break
        u = rng.random(n)
        new = ops.to_host(xp.flatnonzero(u < wD * (ell / phi))).astype(np.int64)
        if new.size:
            D, near, m = add(new, D, near, m)

    if m < n_clusters:
        p = np.maximum(ops.to_host(w * D).astype(np.float64), 0)
        take = min(n_clusters - m, int(np.count_nonzero(p)))
        if take:
            new = random_state.choice(n, size=take, replace=False, p=p / p.sum()).astype(np.int64)
            D, near, m = add(new, D, near, m)

    pool = np.concatenate(parts)
    weights = np.asarray(ops.to_host(ops.segment_weights(near, w, m)), dtype=np.float64)
    if max_pool is not None and m > max_pool:
        pool, weights = thin(ops, pool, weights, max_pool, random_state)
    return pool, weights


def draw_by_weight(xp, w, random_state) -> int:
    """One index drawn with probability proportional to w, as
    ``random_state.choice(w.size, p=w / w.sum())`` draws it (one uniform from
    `random_state`, the first index whose normalised cumulative weight exceeds it), with
    the cumulative sums on w's own backend: a GPU's weights stay there, one scalar comes
    back. Numpy weights give choice's index exactly."""
    u = random_state.random_sample()
    cdf = xp.cumsum(w / w.sum())
    cdf /= cdf[-1]
    return min(int(xp.searchsorted(cdf, u, side="right")), int(w.shape[0]) - 1)


def thin(ops, pool, weights, max_pool, random_state):
    """`max_pool` of the candidates, drawn by weight without replacement (kept in pool
    order); each dropped candidate's weight goes to its nearest kept one."""
    pos = np.flatnonzero(weights > 0)
    if pos.size > max_pool:
        keep = np.sort(random_state.choice(pos, size=max_pool, replace=False, p=weights[pos] / weights[pos].sum()))
    else:
        keep = pos
    dropped = np.setdiff1d(np.arange(pool.size), keep)
    new_w = weights[keep].copy()
    if dropped.size:
        to = np.asarray(ops.cross_nearest(pool[dropped], pool[keep]), dtype=np.int64)
        np.add.at(new_w, to, weights[dropped])  # in dropped order: deterministic
    return pool[keep], new_w


def recluster_draws(weights, n_clusters, random_state, n_local_trials=None):
    """The random draws of scikit-learn's k-means++ on the weighted pool, in its order.

    Returns (first, u): the first centre (a pool index, drawn with probability
    proportional to the weights) and the (n_clusters - 1, n_local_trials) uniforms
    that ``sklearn.cluster.kmeans_plusplus`` would draw, one row per centre (its draws
    do not depend on the data, so they can be made before the steps).
    """
    if n_local_trials is None:
        n_local_trials = n_trials(n_clusters)
    w = np.asarray(weights, dtype=np.float64)
    first = int(random_state.choice(w.size, p=w / w.sum()))
    u = random_state.uniform(size=(n_clusters - 1) * n_local_trials).reshape(n_clusters - 1, n_local_trials)
    return first, u


def greedy_recluster(Dmat, weights, first, u):
    """scikit-learn's greedy k-means++ on a pool given by its squared distances.

    The same steps as the GPU's ``kmeans_recluster`` kernel (``init.cu``): D starts as
    ``Dmat[first]``; per centre c, with pot = sum w D and cum its prefix sums (float64),
    candidate t is the first index with cum >= u[c-1, t] * pot (``np.searchsorted``,
    clipped to m - 1), its potential sum w min(D, Dmat[cand]); the candidate of the
    smallest potential (the first on ties) is kept and D = min(D, Dmat[kept]).

    Parameters
    ----------
    Dmat : numpy.ndarray of shape (m, m)
        Squared distances between the pool points (float32 as the GPU's), diagonal 0.
    weights : numpy.ndarray of shape (m,)
        Pool weights.
    first : int
        The first centre.
    u : numpy.ndarray of shape (n_clusters - 1, n_local_trials)
        Uniforms in [0, 1) (``recluster_draws``).

    Returns
    -------
    numpy.ndarray of int, shape (n_clusters,)
        The chosen pool indices.
    """
    m = Dmat.shape[0]
    w = np.asarray(weights, dtype=np.float64)
    k = u.shape[0] + 1
    out = np.empty(k, dtype=int)
    out[0] = first
    D = Dmat[first].copy()
    for c in range(1, k):
        cum = np.cumsum(w * D)
        cand = np.searchsorted(cum, u[c - 1] * cum[-1])
        np.clip(cand, None, m - 1, out=cand)
        T = np.minimum(D[None, :], Dmat[cand])
        pots = T.astype(np.float64) @ w
        best = int(np.argmin(pots))
        D = T[best]
        out[c] = cand[best]
    return out


def pool_sqdist(P):
    """(m, m) float32 squared distances of the pool's rows P (numpy), as the GPU's
    ``kmeans_pool_sqdist``: ||p||^2 - 2 p.q + ||q||^2 in P's dtype, clamped at 0,
    diagonal 0."""
    pn = np.einsum("ij,ij->i", P, P)
    Dm = pn[:, None] - 2 * (P @ P.T) + pn[None, :]
    np.maximum(Dm, 0, out=Dm)
    np.fill_diagonal(Dm, 0)
    return Dm.astype(np.float32)


class NumpyOps:
    """``oversample``'s backend in numpy: X (n, d) on the host, distances in batches.

    The uniforms come from ``numpy.random.default_rng(seed)``: the CPU picks other
    candidates than the GPU (CuPy's Philox generator) from the same seed."""

    xp = np
    BATCH_ELEMS = 1 << 22  # distances per batch

    def __init__(self, X, x_squared_norms=None):
        self.X = X
        self.xx = np.einsum("ij,ij->i", X, X) if x_squared_norms is None else x_squared_norms

    @staticmethod
    def rng(seed):
        return np.random.default_rng(seed)

    @staticmethod
    def to_host(a):
        return np.asarray(a)

    def _nearest(self, A, xa, C):
        """(squared distance, position) of the nearest row of C for each row of A."""
        n, k = A.shape[0], C.shape[0]
        cn = np.einsum("ij,ij->i", C, C)
        dist = np.empty(n, dtype=A.dtype)
        pos = np.empty(n, dtype=np.int32)
        rows = max(1, self.BATCH_ELEMS // max(k, 1))
        for a in range(0, n, rows):
            b = min(n, a + rows)
            G = A[a:b] @ C.T
            G *= -2
            G += cn
            p = np.argmin(G, axis=1)
            best = G[np.arange(b - a), p] + xa[a:b]
            dist[a:b] = np.maximum(best, 0)
            pos[a:b] = p
        return dist, pos

    def nearest(self, idx):
        return self._nearest(self.X, self.xx, self.X[idx])

    def cross_nearest(self, a, b):
        A = self.X[a]
        return self._nearest(A, np.einsum("ij,ij->i", A, A), self.X[b])[1]

    @staticmethod
    def segment_weights(near, w, m):
        return np.bincount(near, weights=w, minlength=m)


def kmeans_parallel_numpy(X, n_clusters, *, random_state, sample_weight=None,
                          oversampling_factor=OVERSAMPLING_FACTOR, n_rounds=N_ROUNDS, x_squared_norms=None):
    """k-means|| in numpy: the CPU path of ``init="k-means||"`` (see ``tsm_core.kmeans_parallel``).

    The pool comes from ``oversample`` with numpy's generator; the recluster is
    ``sklearn.cluster.kmeans_plusplus`` on the weighted pool (``greedy_recluster``
    where the pool is smaller than n_clusters: X has fewer distinct rows).

    Returns
    -------
    centers : numpy.ndarray of shape (n_clusters, d), X's dtype
    indices : numpy.ndarray of int, shape (n_clusters,)
        Their rows in X.

    Examples
    --------
    >>> import numpy as np
    >>> from tsm_core.kmeans.parallel_init import kmeans_parallel_numpy
    >>> X = np.array([[0.0, 0.0], [0.1, 0.0], [9.0, 9.0], [9.1, 9.0]])
    >>> C, idx = kmeans_parallel_numpy(X, 2, random_state=np.random.RandomState(0))
    >>> sorted(int(i) // 2 for i in idx)  # one centre in each pair of close points
    [0, 1]
    """
    check_params(n_clusters, oversampling_factor, n_rounds)
    random_state = as_random_state(random_state)
    n = X.shape[0]
    if n < n_clusters:
        raise ValueError(f"n_samples={n} should be >= n_clusters={n_clusters}.")
    w = np.ones(n, dtype=np.float64) if sample_weight is None else np.asarray(sample_weight, dtype=np.float64)
    ops = NumpyOps(X, x_squared_norms)
    small = n_clusters <= MAX_KERNEL_CLUSTERS
    pool, pw = oversample(ops, w, n_clusters, random_state, oversampling_factor=oversampling_factor,
                          n_rounds=n_rounds, max_pool=MAX_POOL if small else None)
    P = X[pool]
    if pool.size >= n_clusters:
        from sklearn.cluster import kmeans_plusplus

        _, chosen = kmeans_plusplus(P, n_clusters, sample_weight=pw, random_state=random_state)
    else:
        first, u = recluster_draws(pw, n_clusters, random_state)
        chosen = greedy_recluster(pool_sqdist(P), pw, first, u)
    return P[chosen], pool[chosen]
