"""k-means over a torch.distributed group: each rank holds a shard of X (any number
of rows, zero included), the result is that of the union of the shards.

The Lloyd loop is the one loop (``tsm_core.kmeans.lloyd.lloyd``) over
``DistributedSteps``, a wrapper of a rank's own steps (numpy's ``CpuSteps`` or the
GPU's ``_GpuSteps``): each iteration assigns the local rows and forms their
centroid sums as before, then ONE allreduce of k * (d + 1) + 2 float64 (the sums,
the cluster weights, the "a label changed" flag and the inertia) gives every rank
the sums of all rows. Every rank then computes the same new centres, total shift
and empty-cluster count from the same bits, so every decision of the loop (strict
convergence, the tolerance, a relocation) is taken alike everywhere.

Empty clusters are relocated as scikit-learn does on the whole of X: each rank
offers its points farthest from their centres (distance, global row index = the
rank's offset + local index, the row, its weight and label), one allreduce brings
every rank's offers to every rank, and all pick the farthest, ties by the smaller
global index, as a stable sort of the concatenated distances would.

Initialisation draws from the shared ``random_state`` in scikit-learn's order on
every rank (the same draws as a single-process fit of the concatenated shards);
a draw picks its global row by the ranks' prefix sums of the potentials (the rank
whose range holds the target finds the row, one allreduce brings it to all).
k-means|| draws its rounds' uniforms from numpy's PCG64 advanced to the rank's
first row (``PCG64.advance``), so the union sees the stream a single process
would. Where results equal a single-process fit, and to what tolerance, is in
the distributed guide: float64 to the round-off of the reduction order.

Collectives go through ``tsm_core.distributed.comm.Comm`` (timeouts, clear errors
on every rank, arrays of any kind).
"""

from __future__ import annotations

import time

import numpy as np

from tsm_core.kmeans import parallel_init as _par
from tsm_core.kmeans.lloyd import _GpuSteps, _lloyd_overlapped, _say, lloyd
from tsm_core.runtime import config

# ------------------------------------------------------------------ draws across ranks


def _xp(a):
    if isinstance(a, np.ndarray):
        return np
    import cupy

    return cupy


def _host(a):
    return a if isinstance(a, np.ndarray) else a.get()


class _Picker:
    """Global row draws by the ranks' prefix sums of a weight vector (k-means++'s
    potentials, the sample weights): the owner of each target finds its row."""

    def __init__(self, comm, agr, ops, weights):
        xp = ops.xp
        self.comm, self.agr, self.ops = comm, agr, ops
        n = int(weights.shape[0])
        self.cum = xp.cumsum(weights.astype(xp.float64)) if n else None
        last = float(self.cum[-1]) if n else 0.0
        self.tot = comm.slots(np.array([last]), what="k-means init: potentials")[:, 0]
        # prefix[r + 1] = prefix[r] + tot[r], in rank order on every rank (the same bits).
        self.prefix = np.concatenate([[0.0], np.cumsum(self.tot)])
        self.total = float(self.prefix[-1])

    def pick(self, targets, side):
        """(global ids, rows as float64 (t, d)) of the rows whose prefix sums first
        exceed (side "right") or reach (side "left") each target; one allreduce."""
        targets = np.asarray(targets, dtype=np.float64).reshape(-1)
        t, d = targets.size, self.agr.d
        ends = self.prefix[1:]
        has = self.agr.counts > 0
        owner = np.full(t, -1, dtype=np.int64)
        for j, v in enumerate(targets):
            hit = np.flatnonzero(has & ((ends > v) if side == "right" else (ends >= v)))
            # Past the total (round-off): the last row, as numpy's clip to n - 1.
            owner[j] = hit[0] if hit.size else np.flatnonzero(has)[-1]
        buf = np.zeros((t, d + 1), dtype=np.float64)
        mine = np.flatnonzero(owner == self.comm.rank)
        if mine.size:
            xp = self.ops.xp
            n_local = int(self.agr.counts[self.comm.rank])
            local = xp.searchsorted(self.prefix[self.comm.rank] + self.cum, xp.asarray(targets[mine]), side=side)
            local = np.minimum(_host(local).astype(np.int64), n_local - 1)
            buf[mine, 0] = self.agr.offsets[self.comm.rank] + local
            buf[mine, 1:] = _host(self.ops.rows(local)).astype(np.float64)
        self.comm.allreduce(buf, what="k-means init: draw")
        return buf[:, 0].astype(np.int64), buf[:, 1:]


def choice(comm, agr, ops, weights, random_state):
    """``random_state.choice(n, p=w / w.sum())`` over the union of the shards: one
    uniform, the row whose prefix sum first exceeds it. Returns (global id, row)."""
    u = random_state.random_sample()
    p = _Picker(comm, agr, ops, weights)
    ids, rows = p.pick([u * p.total], "right")
    return int(ids[0]), rows[0]


def choice_without_replacement(comm, agr, ops, p, size, random_state):
    """``random_state.choice(n, size, replace=False, p=p / p.sum())`` over the union
    of the shards, step for step numpy's loop (uniforms, zeroed picks, unique).
    Returns (global ids (size,), rows float64 (size, d))."""
    xp = ops.xp
    p = p.astype(xp.float64).copy()
    off, n_local = int(agr.offsets[comm.rank]), int(agr.counts[comm.rank])
    ids, rows = np.empty(0, dtype=np.int64), np.empty((0, agr.d))
    while ids.size < size:
        x = random_state.random_sample(size - ids.size)
        mine = ids[(ids >= off) & (ids < off + n_local)] - off
        if mine.size:
            p[xp.asarray(mine)] = 0
        picker = _Picker(comm, agr, ops, p)
        new, new_rows = picker.pick(x * picker.total, "right")
        _, first = np.unique(new, return_index=True)
        first.sort()
        ids = np.concatenate([ids, new[first]])
        rows = np.concatenate([rows, new_rows[first]])
    return ids, rows


# ------------------------------------------------------------------ initialisation


class NumpyInitOps:
    """A rank's shard on the host, for the distributed seedings: the distances of the
    single-process CPU seedings (``tsm_apps.kmeans._cpu``), row for row.

    Parameters
    ----------
    X : numpy.ndarray of shape (n_local, d)
    x_squared_norms : numpy.ndarray of shape (n_local,), optional
    """

    xp = np

    def __init__(self, X, x_squared_norms=None):
        self.X = X
        self.n = X.shape[0]
        self.base = _par.NumpyOps(X, x_squared_norms)
        self.xx = self.base.xx

    def dist_to(self, P):
        """(p, n_local) squared distances in X's dtype, as the CPU k-means++."""
        P = np.asarray(P, dtype=self.X.dtype)
        D = self.xx[None, :] - 2 * (P @ self.X.T) + np.einsum("ij,ij->i", P, P)[:, None]
        return np.maximum(D, 0)

    def nearest(self, C):
        C = np.ascontiguousarray(np.asarray(C, dtype=self.X.dtype))
        return self.base._nearest(self.X, self.xx, C)

    def rows(self, idx):
        return self.X[np.asarray(idx)]

    @staticmethod
    def segment_weights(near, w, m):
        return np.bincount(near, weights=w, minlength=m)

    @staticmethod
    def from_host(a):
        return a


class GpuInitOps:
    """A rank's shard on the GPU (a ``kmeans_source``, or None for no rows), for the
    distributed seedings: the single-GPU seedings' distance computations (k-means||'s
    rounds on float32 rows on the TF32 tensor cores, as on one GPU)."""

    def __init__(self, src, d, dtype, unit_weights=True):
        from tsm_core.kmeans.init import _GpuOps

        self.src = src
        self.n = 0 if src is None else src.n
        self.d, self.dtype = d, np.dtype(dtype)
        self.base = _GpuOps(src, unit_weights) if src is not None else None
        self.xp = self.base.xp if src is not None else _cupy()

    def dist_to(self, P):
        cp = self.xp
        Pc = cp.ascontiguousarray(cp.asarray(P, dtype=self.dtype))
        out = cp.empty((Pc.shape[0], self.n), dtype=cp.float64)
        if self.n == 0:
            return out
        pn = (Pc.astype(cp.float64) ** 2).sum(1)
        for a, Xc in self.src.chunks():
            b = a + Xc.shape[0]
            g = cp.matmul(Pc, Xc.T).astype(cp.float64)
            xx = self.src.xx(a, Xc).astype(cp.float64)
            out[:, a:b] = cp.maximum(pn[:, None] - 2 * g + xx[None, :], 0)
        return out

    def nearest(self, C):
        from tsm_core.kmeans.init import _bucket

        cp = self.xp
        if self.n == 0:
            return cp.empty(0, dtype=self.dtype), cp.empty(0, dtype=cp.int32)
        C = cp.asarray(C, dtype=self.dtype)
        p = C.shape[0]
        pad = cp.concatenate([C, cp.repeat(C[-1:], _bucket(p) - p, axis=0)])
        find = self.base._nearest_tf32 if self.base.tf32 else self.base._nearest
        dist, pos = find(self.src.chunks(), self.n, cp.ascontiguousarray(pad))
        cp.minimum(pos, p - 1, out=pos)
        return dist, pos

    def rows(self, idx):
        return self.src.rows(np.asarray(idx))

    def segment_weights(self, near, w, m):
        if self.n == 0:
            return self.xp.zeros(m, dtype=self.xp.float64)
        return self.base.segment_weights(near, w, m)

    def from_host(self, a):
        return self.xp.asarray(a)


def _cupy():
    import cupy

    return cupy


def _quiet(line):
    """Progress lines of ranks other than 0: none."""


def kmeans_plusplus_distributed(comm, agr, ops, n_clusters, random_state, sample_weight, n_local_trials=None):
    """scikit-learn's greedy k-means++ over the union of the ranks' shards.

    The same draws in the same order as ``sklearn.cluster.kmeans_plusplus`` on the
    concatenated shards; per centre three small collectives (the ranks' potential
    totals, the candidates' rows, the candidates' potentials), each rank's
    distances computed locally. The candidates' global potentials are summed in
    rank order on every rank, so every rank picks the same one.

    Parameters
    ----------
    comm : tsm_core.distributed.Comm
    agr : tsm_core.distributed.Agreement
        The shards' sizes and offsets (``comm.agree``).
    ops : NumpyInitOps or GpuInitOps
        This rank's shard.
    n_clusters : int
    random_state : numpy.random.RandomState
        The same state on every rank.
    sample_weight : array of shape (n_local,)
        This rank's weights (numpy or CuPy, as ``ops``).
    n_local_trials : int, optional
        Default ``2 + int(log(n_clusters))``.

    Returns
    -------
    centers : numpy.ndarray of shape (n_clusters, d), float64
        The chosen rows (exactly, in float64), the same on every rank.
    indices : numpy.ndarray of int64, shape (n_clusters,)
        Their global row indices.

    Raises
    ------
    tsm_core.distributed.DistributedError
        A collective failed or outlasted the timeout.
    """
    xp = ops.xp
    if n_local_trials is None:
        n_local_trials = 2 + int(np.log(n_clusters))
    w = sample_weight.astype(xp.float64)
    centers = np.empty((n_clusters, agr.d), dtype=np.float64)
    indices = np.full(n_clusters, -1, dtype=np.int64)
    first, row = choice(comm, agr, ops, w, random_state)
    centers[0], indices[0] = row, first
    closest = ops.dist_to(row[None, :])[0]
    pot = comm.slots(np.array([float(closest @ w) if ops.n else 0.0]), what="k-means++: potential")[:, 0]
    current_pot = float(np.sum(pot))
    for c in range(1, n_clusters):
        rand_vals = random_state.uniform(size=n_local_trials) * current_pot
        picker = _Picker(comm, agr, ops, w * closest)
        cand, rows = picker.pick(rand_vals, "left")
        dc = xp.minimum(closest[None, :], ops.dist_to(rows))
        local = _host(dc @ w).astype(np.float64) if ops.n else np.zeros(n_local_trials)
        table = comm.slots(local, what="k-means++: candidates' potentials")
        pots = table.sum(axis=0)  # in rank order: the same bits everywhere
        best = int(np.argmin(pots))
        current_pot = float(pots[best])
        closest = dc[best]
        centers[c], indices[c] = rows[best], cand[best]
    return centers, indices


def kmeans_parallel_distributed(comm, agr, ops, n_clusters, random_state, sample_weight, *,
                                oversampling_factor=_par.OVERSAMPLING_FACTOR, n_rounds=_par.N_ROUNDS,
                                recluster=None):
    """k-means|| (``tsm_core.kmeans.parallel_init``) over the union of the ranks' shards.

    The steps of ``parallel_init.oversample`` with the union as X: the first
    candidate by a global draw, each round's uniforms from numpy's PCG64 seeded
    from `random_state` and advanced to this rank's first row (the stream a single
    process draws over the concatenated rows), each rank's new candidates gathered
    in global row order, the candidates' weights summed by an allreduce; the pool is
    then the same on every rank and is thinned and reclustered there (`recluster`,
    default scikit-learn's k-means++ on the weighted pool, as the CPU path).

    Parameters
    ----------
    comm, agr, ops, n_clusters, random_state, sample_weight
        As `kmeans_plusplus_distributed`.
    oversampling_factor, n_rounds
        As ``tsm_core.kmeans_parallel``.
    recluster : callable, optional
        ``recluster(P, weights, n_clusters, random_state)`` -> chosen pool indices,
        where P is the pool's rows (numpy, X's dtype): `recluster_numpy` (default)
        or `recluster_gpu`.

    Returns
    -------
    centers : numpy.ndarray of shape (n_clusters, d), float64
    indices : numpy.ndarray of int64, shape (n_clusters,)
        Global row indices.

    Raises
    ------
    ValueError
        Invalid parameters, fewer rows than clusters.
    tsm_core.distributed.DistributedError
        A collective failed or outlasted the timeout.
    """
    _par.check_params(n_clusters, oversampling_factor, n_rounds)
    if agr.n < n_clusters:
        raise ValueError(f"n_samples={agr.n} should be >= n_clusters={n_clusters}.")
    xp = ops.xp
    n, rank = agr.n, comm.rank
    off, n_local = int(agr.offsets[rank]), int(agr.counts[rank])
    w = sample_weight.astype(xp.float64)
    first, row = choice(comm, agr, ops, w, random_state)
    seed = int(random_state.randint(np.iinfo(np.int32).max))
    ell = float(oversampling_factor) * n_clusters

    ids, P = [np.array([first])], [row[None, :]]
    D, near = ops.nearest(row[None, :])
    near = near.astype(xp.int32)
    if off <= first < off + n_local:
        D[first - off] = 0
    m = 1

    def add(new_ids, new_rows, D, near, m):
        Dn, pos = ops.nearest(new_rows)
        better = Dn < D
        D = xp.where(better, Dn, D)
        near = xp.where(better, pos.astype(xp.int32) + m, near)
        at = np.flatnonzero((new_ids >= off) & (new_ids < off + n_local))
        if at.size:
            loc = xp.asarray(new_ids[at] - off)
            D[loc] = 0
            near[loc] = xp.asarray((m + at).astype(np.int32))
        ids.append(new_ids)
        P.append(new_rows)
        return D, near, m + new_ids.size

    drawn = 0
    for _ in range(n_rounds):
        if m >= n:
            break
        wD = w * D
        phi = float(comm.slots(np.array([float(wD.sum()) if n_local else 0.0]), what="k-means||: phi")[:, 0].sum())
        if not phi > 0:
            break
        bg = np.random.PCG64(seed)
        bg.advance(drawn + off)  # one 64-bit output per double
        drawn += n
        u = ops.from_host(np.random.Generator(bg).random(n_local))
        new = _host(xp.flatnonzero(u < wD * (ell / phi))).astype(np.int64)
        counts = comm.slots(np.array([new.size]), what="k-means||: candidates")[:, 0]
        tot = int(counts.sum())
        if tot:
            start = int(counts[:rank].sum())
            buf = np.zeros((tot, agr.d + 1), dtype=np.float64)
            if new.size:
                buf[start:start + new.size, 0] = new + off
                buf[start:start + new.size, 1:] = _host(ops.rows(new)).astype(np.float64)
            comm.allreduce(buf, what="k-means||: candidates' rows")
            D, near, m = add(buf[:, 0].astype(np.int64), buf[:, 1:], D, near, m)

    if m < n_clusters:
        p = xp.maximum(w * D, 0)
        nz = int(comm.slots(np.array([int(xp.count_nonzero(p)) if n_local else 0]),
                            what="k-means||: top-up")[:, 0].sum())
        take = min(n_clusters - m, nz)
        if take:
            new_ids, new_rows = choice_without_replacement(comm, agr, ops, p, take, random_state)
            D, near, m = add(new_ids, new_rows, D, near, m)

    pool = np.concatenate(ids)
    Pall = np.concatenate(P)
    weights = np.ascontiguousarray(_host(ops.segment_weights(near, w, m)).astype(np.float64))
    comm.allreduce(weights, what="k-means||: candidates' weights")
    # The pool's rows in X's dtype (exact): the single-process recluster reads X[pool].
    Px = Pall.astype(np.dtype(agr.dtype))
    small = n_clusters <= _par.MAX_KERNEL_CLUSTERS
    if small and m > _par.MAX_POOL:
        keep_pos, weights = _par.thin(_PoolOps(Px), np.arange(m), weights, _par.MAX_POOL, random_state)
        pool, Pall, Px = pool[keep_pos], Pall[keep_pos], Px[keep_pos]
    if recluster is None:
        recluster = recluster_numpy
    chosen = np.asarray(recluster(Px, weights, n_clusters, random_state), dtype=np.int64)
    return Pall[chosen], pool[chosen]


class _PoolOps:
    """``parallel_init.thin``'s ``cross_nearest`` over the pool's rows (positions)."""

    def __init__(self, P):
        self.ops = _par.NumpyOps(P)

    def cross_nearest(self, a, b):
        return self.ops.cross_nearest(a, b)


def recluster_numpy(P, weights, n_clusters, random_state):
    """The CPU path's recluster: scikit-learn's k-means++ on the weighted pool
    (``greedy_recluster`` where the pool is smaller than n_clusters)."""
    if P.shape[0] >= n_clusters:
        from sklearn.cluster import kmeans_plusplus

        return kmeans_plusplus(P, n_clusters, sample_weight=weights, random_state=random_state)[1]
    first, u = _par.recluster_draws(weights, n_clusters, random_state)
    return _par.greedy_recluster(_par.pool_sqdist(P), weights, first, u)


def recluster_gpu(P, weights, n_clusters, random_state):
    """The single-GPU path's recluster (``tsm_core.kmeans_parallel``): the one-block
    kernel on the pool's distances up to 4096 clusters, else ``kmeans_plusplus`` on
    the pool's rows. Every rank runs it on the same pool."""
    from tsm_core.kmeans.init import _pool_sqdist, _recluster, kmeans_plusplus

    cp = _cupy()
    Pd = cp.ascontiguousarray(cp.asarray(P))
    if n_clusters <= _par.MAX_KERNEL_CLUSTERS:
        first, u = _par.recluster_draws(weights, n_clusters, random_state)
        return _recluster(_pool_sqdist(Pd), weights, first, u)
    return kmeans_plusplus(Pd, n_clusters, random_state=random_state, sample_weight=weights)[1]


# ------------------------------------------------------------------ Lloyd


class DistributedSteps:
    """A rank's Lloyd steps made global: ``lloyd``'s steps object over a group.

    Parameters
    ----------
    steps : CpuSteps or _GpuSteps
        This rank's steps over its shard (its ``sums`` and ``wsum`` are replaced by
        the group's after each pass).
    comm : tsm_core.distributed.Comm
    agr : tsm_core.distributed.Agreement
        The shards' sizes and offsets.
    gpu : bool
        Whether `steps` are the GPU's.
    real_rows : bool, default=True
        False for a GPU rank without rows, whose steps run over one row of weight 0:
        it never reports a changed label nor offers a row for a relocation.
    verbose : bool, default=False
        Whether the inertia is formed each iteration (progress lines).
    """

    def __init__(self, steps, comm, agr, *, gpu, real_rows=True, verbose=False):
        self.steps, self.comm, self.agr = steps, comm, agr
        self.gpu, self.real, self.verbose = gpu, real_rows, verbose
        self.fresh = False
        self.changed = True
        self._inertia = 0.0
        self.k = steps.k
        self.d = agr.d
        xp = _cupy() if gpu else np
        self.buf = xp.zeros(self.k * (self.d + 1) + 2, dtype=xp.float64)

    def pass_over(self, update):
        self.steps.pass_over(update)
        self.fresh = update

    def _local_changed(self):
        s = self.steps
        if not self.real:
            return 0.0
        if self.gpu:
            return s.changed  # device int32 (1,), read before finalize resets it
        return float(not np.array_equal(s.labels, s.labels_old))

    def update(self):
        """The group's sums, then the local update from them: (shift, empty, changed)."""
        s, k, d = self.steps, self.k, self.d
        if self.fresh:
            b = self.buf
            b[:k * d] = s.sums.reshape(-1)
            b[k * d:k * d + k] = s.wsum
            b[k * d + k:k * d + k + 1] = self._local_changed()
            b[k * d + k + 1:] = s.inertia() if self.verbose and self.real else 0.0
            self.comm.allreduce(b, what="k-means: centroid sums")
            if self.gpu:  # the kernels' buffers, float64
                s.sums[...] = b[:k * d].reshape(k, d)
                s.wsum[...] = b[k * d:k * d + k]
            else:  # new arrays (numpy's bincount of no rows is int64)
                s.sums = b[:k * d].reshape(k, d).copy()
                s.wsum = b[k * d:k * d + k].copy()
            tail = _host(b[k * d + k:])
            self.changed = bool(tail[0] > 0)
            self._inertia = float(tail[1])
            self.fresh = False
        shift, n_empty, _ = s.update()
        return shift, n_empty, self.changed

    def _offers(self, n_empty, C=None):
        """This rank's farthest points: (dist, global id, weight, old label, row) rows.
        `C`: the centres of the current labels (GPU steps; default their current ones)."""
        s = self.steps
        n_local = int(self.agr.counts[self.comm.rank]) if self.real else 0
        m = min(n_empty, n_local)
        out = np.zeros((n_empty, 5 + self.d), dtype=np.float64)
        if m == 0:
            return out
        if self.gpu:
            cp = _cupy()
            if s.approx_mind:
                s.exact_mind(C)
            far = cp.asnumpy(cp.argsort(-s.mind.astype(cp.float64))[:m])
            dist = cp.asnumpy(s.mind[cp.asarray(far)]).astype(np.float64)
            rows = cp.asnumpy(s.src.rows(far)).astype(np.float64)
            wts = cp.asnumpy(s.w[cp.asarray(far)]).astype(np.float64) if s.w is not None else np.ones(m)
            old = cp.asnumpy(s.labels[cp.asarray(far)])
        else:
            diff = s.X - s.centers[s.labels]
            dist_all = np.einsum("ij,ij->i", diff, diff)
            far = np.argsort(-dist_all, kind="stable")[:m]
            dist = dist_all[far].astype(np.float64)
            rows = s.X[far].astype(np.float64)
            wts = s.w[far].astype(np.float64)
            old = s.labels[far]
        out[:m, 0] = 1.0
        out[:m, 1] = dist
        out[:m, 2] = self.agr.offsets[self.comm.rank] + far
        out[:m, 3] = wts
        out[:m, 4] = old
        out[:m, 5:] = rows
        return out

    def relocate_empty(self, n_empty, C=None):
        """scikit-learn's relocation over the union: the farthest points of all ranks
        (ties: the smaller global index) move to the empty clusters, on every rank alike.
        `C`: as in `_offers`."""
        s = self.steps
        table = self.comm.slots(self._offers(n_empty, C).reshape(-1), what="k-means: relocation")
        offers = table.reshape(-1, 5 + self.d)
        offers = offers[offers[:, 0] > 0]
        order = np.lexsort((offers[:, 2], -offers[:, 1]))[:n_empty]
        wsum = _host(s.wsum)
        empty = np.flatnonzero(wsum == 0)[:n_empty]
        if self.gpu:
            cp = _cupy()
            for new_id, j in zip(empty, order):
                o, new_id = int(offers[j, 4]), int(new_id)
                row, wt = cp.asarray(offers[j, 5:]), float(offers[j, 3])
                s.sums[o] -= row * wt
                s.sums[new_id] = row * wt
                s.wsum[new_id] = wt
                s.wsum[o] -= wt
            return
        for new_id, j in zip(empty, order):
            o, wt = int(offers[j, 4]), float(offers[j, 3])
            row = offers[j, 5:].astype(s.X.dtype)  # X's row, exactly
            s.sums[o] -= row * wt
            s.sums[new_id] = row * wt
            s.wsum[new_id] = wt
            s.wsum[o] -= wt

    def advance(self):
        self.steps.advance()

    def inertia(self):
        """The group's inertia of the last pass (formed with the sums when verbose)."""
        return self._inertia


def lloyd_distributed(steps, comm, agr, *, gpu, real_rows=True, max_iter=300, tol=0.0, verbose=0,
                      progress=None):
    """Lloyd's iterations over the union of the ranks' shards (the one loop, ``lloyd``,
    over ``DistributedSteps``): one allreduce of k * (d + 1) + 2 float64 per
    iteration, progress lines on rank 0 only.

    Parameters
    ----------
    steps : CpuSteps or _GpuSteps
        This rank's steps, from the same initial centres on every rank.
    comm : tsm_core.distributed.Comm
    agr : tsm_core.distributed.Agreement
    gpu : bool
        Whether `steps` are the GPU's.
    real_rows : bool, default=True
        False where the GPU steps run over one stand-in row (a rank without rows).
    max_iter, tol, verbose, progress
        As ``lloyd``; `tol` is absolute (scale it by the variance of the union).

    Returns
    -------
    n_iter : int
        Iterations run, the same on every rank; the centres are ``steps``'s.

    Raises
    ------
    tsm_core.distributed.DistributedError
        A collective failed or outlasted the timeout.

    Examples
    --------
    >>> import os, tempfile
    >>> import numpy as np, torch.distributed as dist
    >>> from tsm_apps.kmeans._cpu import CpuSteps
    >>> from tsm_core.distributed import Comm
    >>> from tsm_core.kmeans.distributed import lloyd_distributed
    >>> store = os.path.join(tempfile.mkdtemp(), "store")
    >>> dist.init_process_group("gloo", init_method="file://" + store, rank=0, world_size=1)
    >>> X = np.array([[0.0], [1.0], [10.0], [11.0]])
    >>> comm = Comm(timeout=10)
    >>> agr = comm.agree(n=4, d=1, dtype=X.dtype)
    >>> steps = CpuSteps(X, np.ones(4), X[[0, 1]])
    >>> lloyd_distributed(steps, comm, agr, gpu=False, max_iter=10)
    3
    >>> steps.centers.ravel().tolist()
    [0.5, 10.5]
    >>> dist.destroy_process_group()
    """
    say = _say(verbose, progress)
    quiet = comm.rank != 0 or say is None
    dsteps = DistributedSteps(steps, comm, agr, gpu=gpu, real_rows=real_rows, verbose=bool(verbose))
    return lloyd(dsteps, max_iter=max_iter, tol=tol, verbose=verbose,
                 progress=(lambda line: None) if quiet else say)


class _LocalSums:
    """The centroid update's workspace (``_Sums``) of `_GroupGpuSteps`: the sums
    buffers it writes hold this rank's rows only, to be reduced before the update
    that reads them (``steps.local``: the ids of those buffers; the packed route
    fills a second buffer ahead of the update that reads the first)."""

    def __init__(self, work, steps):
        self.work, self.steps = work, steps

    def run(self, X, labels, w, sums, wsum, acc=False):
        self.work.run(X, labels, w, sums, wsum, acc=acc)
        self.steps.local.add(id(sums))

    def packed(self, X, C, labels, mind, changed, prev, w, sums, wsum, acc=False, exact=False):
        self.work.packed(X, C, labels, mind, changed, prev, w, sums, wsum, acc=acc, exact=exact)
        self.steps.local.add(id(sums))

    def __getattr__(self, name):
        return getattr(self.work, name)


def _wait_event(ev, comm, what):
    """Wait on the host for CUDA event `ev`, at most ``comm.timeout`` seconds (the
    collective queued before it may never end when a rank died).

    Raises
    ------
    tsm_core.distributed.DistributedError
        The event did not complete within the timeout.
    """
    from tsm_core.distributed import DistributedError

    if ev.done:
        return
    deadline = time.monotonic() + comm.timeout
    while not ev.done:
        if time.monotonic() > deadline:
            raise DistributedError(
                f"rank {comm.rank} of {comm.world}: the {what} collective did not complete within "
                f"{comm.timeout:g} s: another rank may have died or stopped answering")
        time.sleep(50e-6)


class _GroupGpuSteps(_GpuSteps):
    """The single-GPU steps (``_GpuSteps``) of one rank, whose centre update reads the
    group's sums: the kernels, buffers and loops of the single-GPU fit, and one
    allreduce.

    The allreduce is folded into ``finalize``: where the sums hold this rank's rows
    (the update's workspace ran since the last one), the sums, the cluster weights,
    the "a label changed" flag and, when `verbose`, the inertia are packed into one
    float64 buffer, reduced on the current stream (NCCL: queued, the host does not
    wait) and unpacked into the same device buffers, the global flag into the
    device flag that ``kmeans_status`` reads. Every rank then computes the same new
    centres and status from the same bits, and the host reads one status an
    iteration, as the single-GPU fit does; that read is bounded by the group's
    timeout. So X in GPU memory runs the single-GPU overlapped loop
    (``_lloyd_overlapped``: the next assignment queued before the status is read)
    and streamed X the plain loop, unchanged. With one rank the allreduce is the
    identity and nothing is packed: the steps are the single-GPU ones.

    Parameters
    ----------
    src, C, sample_weight, method, precision
        As ``_GpuSteps``.
    comm : tsm_core.distributed.Comm
    agr : tsm_core.distributed.Agreement
    real_rows : bool, default=True
        False where the steps run over one stand-in row of weight 0 (a rank without
        rows): it never reports a changed label nor offers a row for a relocation.
    verbose : bool, default=False
        Whether the group's inertia is formed each iteration (progress lines).
    """

    def __init__(self, src, C, sample_weight, method, precision, *, comm, agr, real_rows=True, verbose=False):
        super().__init__(src, C, sample_weight, method, precision)
        self.comm = comm
        # Relocation of empty clusters over the group, and the reduction's buffer.
        self.group = DistributedSteps(self, comm, agr, gpu=True, real_rows=real_rows, verbose=verbose)
        self.work = _LocalSums(self.work, self)
        self.local = set()  # ids of the sums buffers that hold this rank's rows only

    def _reduce(self):
        """The group's sums, weights and changed flag in place of this rank's."""
        cp = _cupy()
        g = self.group
        self.local.discard(id(self.sums))
        if not g.real:
            self.changed.fill(0)
        if self.comm.world == 1:
            return
        k, d, b = self.k, g.d, g.buf
        b[:k * d] = self.sums.reshape(-1)
        b[k * d:k * d + k] = self.wsum
        b[k * d + k:k * d + k + 1] = self.changed
        if g.verbose and g.real:
            m = self.mind.astype(cp.float64)
            b[k * d + k + 1:] = (m * self.w if self.w is not None else m).sum()
        else:
            b[k * d + k + 1:] = 0.0
        self.comm.allreduce(b, what="k-means: centroid sums", wait=False)
        self.sums[...] = b[:k * d].reshape(k, d)
        self.wsum[...] = b[k * d:k * d + k]
        self.changed[...] = b[k * d + k:k * d + k + 1] > 0

    def finalize(self, C_old, C_new, cn, wait=True):
        """``_GpuSteps.finalize`` from the group's sums (reduced first where they are
        this rank's); the status read waits at most the group's timeout."""
        if id(self.sums) in self.local:
            self._reduce()
        if self.comm.world == 1 or not wait:
            return super().finalize(C_old, C_new, cn, wait)
        super().finalize(C_old, C_new, cn, wait=False)
        return self.status_wait()

    def status_wait(self):
        if self.comm.world > 1:
            _wait_event(self.status_ev, self.comm, "k-means: centroid sums")
        return super().status_wait()

    def relocate_empty(self, n_empty, C=None):
        """scikit-learn's relocation over the group (``DistributedSteps.relocate_empty``)."""
        self.group.relocate_empty(n_empty, C)

    def local_inertia(self) -> float:
        """sum_i w_i mind_i over this rank's rows (0 for a stand-in row)."""
        return super().inertia() if self.group.real else 0.0

    def inertia(self) -> float:
        """The group's inertia of the last reduced pass (progress lines; formed with
        the sums when `verbose`)."""
        if self.comm.world == 1:
            return self.local_inertia()
        return float(self.group.buf[-1])


def kmeans_lloyd_distributed(X, centers, comm, agr, *, sample_weight=None, max_iter=300, tol=0.0, verbose=0,
                             max_gpu_memory=None, method="auto", progress=None, precision=None):
    """Lloyd's k-means of the union of the ranks' shards on their GPUs
    (``kmeans_lloyd`` over a group).

    Parameters
    ----------
    X : cupy.ndarray, torch.Tensor (CUDA), numpy.ndarray or kmeans_source, shape (n_local, d)
        This rank's shard: in GPU memory, moved there once, or streamed from host
        memory (numpy larger than `max_gpu_memory`). May have no rows.
    centers : array of shape (k, d)
        The initial centres, the same on every rank.
    comm : tsm_core.distributed.Comm
    agr : tsm_core.distributed.Agreement
        The shards' sizes (``comm.agree``).
    sample_weight, max_iter, tol, verbose, max_gpu_memory, method, progress, precision
        As ``kmeans_lloyd``; `tol` absolute.

    Returns
    -------
    labels : cupy.ndarray of shape (n_local,), int32
        The local rows' clusters.
    inertia : float
        Of all ranks' rows, the same on every rank.
    centers : cupy.ndarray of shape (k, d)
        The same on every rank.
    n_iter : int

    Raises
    ------
    tsm_core.distributed.DistributedError
        A collective failed or outlasted the timeout.
    RuntimeError
        No CUDA GPU (CuPy's error).
    """
    from tsm_core.kmeans.configs import resolve_precision
    from tsm_core.kmeans.sources import _DeviceSource, _HostSource, kmeans_source
    from tsm_core.runtime.arrays import to_backend

    cp = _cupy()
    k = len(centers)
    n_local = int(agr.counts[comm.rank])
    real = n_local > 0
    own = not isinstance(X, (_DeviceSource, _HostSource))
    w = None
    if sample_weight is not None:
        w = sample_weight if isinstance(sample_weight, np.ndarray) else to_backend(sample_weight, "sample_weight")
    if not real:  # one stand-in row of weight 0: the kernels never see an empty launch
        X, w, own = cp.zeros((1, agr.d), dtype=np.dtype(agr.dtype)), np.zeros(1), True
    elif own and precision in ("float32", "tf32"):
        Xa = X if isinstance(X, np.ndarray) else to_backend(X, "X")
        if Xa.dtype == np.float64:
            X = Xa.astype(np.float32)
    src = kmeans_source(X, max_gpu_memory=max_gpu_memory, n_clusters=k)
    try:
        precision = resolve_precision(precision, src.dtype)
        Cin = centers if isinstance(centers, np.ndarray) else to_backend(centers, "centers")
        C = cp.array(Cin, dtype=src.dtype if precision == "float64" else np.float32, order="C", copy=True)
        if w is not None:
            w = cp.ascontiguousarray(cp.asarray(w), dtype=src.dtype if src.dtype in (np.float32, np.float64)
                                     else np.float32)
        run = _GroupGpuSteps(src, C, w, method, precision, comm=comm, agr=agr, real_rows=real,
                            verbose=bool(verbose))
        say = _say(verbose, progress)
        if comm.rank != 0 and say is not None:
            say = _quiet
        if not src.streamed and config.flag("TSM_KMEANS_OVERLAP"):
            n_iter = _lloyd_overlapped(run, max_iter, tol, say)
        else:
            n_iter = lloyd(run, max_iter=max_iter, tol=tol, verbose=verbose, progress=say)
        if run.approx_mind:
            run.exact_mind()
        local = np.array([run.local_inertia()])
        inertia = float(comm.allreduce(local, what="k-means: inertia")[0])
        labels = run.labels if real else cp.empty(0, dtype=cp.int32)
        return labels, inertia, run.C, n_iter
    finally:
        if own:
            src.close()
