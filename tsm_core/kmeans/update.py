"""The update step: per-cluster weighted sums of the rows and the clusters' weights.

Deterministic (bit-identical from run to run), without floating-point atomics:
per-warp accumulators in shared memory over row blocks (``direct``, small k) or a
stable counting sort by label and sums per piece of <= PIECE rows (``sorted``);
then the row blocks / pieces are reduced in a fixed order. The route comes from
``configs.update_route``.
"""

from __future__ import annotations

import numpy as np

from tsm_core.kmeans.configs import PIECE, ROW_BLOCK, SORT_RW, SORT_WB, direct_config, partials_name, update_route
from tsm_core.kmeans.launch import NULL, _c_rows, _cp, _kernel, _vec_for
from tsm_core.runtime import compile as _compile
from tsm_core.runtime.arrays import kind_of, to_backend, wrap


class _Sums:
    """Workspace of the deterministic centroid update for chunks of up to `rows` rows.

    Chunks whose row counts are multiples of ROW_BLOCK, summed with ``acc=True``
    after the first, give bit-identical sums to one pass over all rows (direct route)."""

    def __init__(self, rows: int, d: int, k: int, dtype):
        cp = _cp()
        self.d, self.k, self.dtype = d, k, np.dtype(dtype)
        self.route = update_route(k, d, dtype, 16 // self.dtype.itemsize)
        if self.route == "direct":
            nrb = -(-rows // ROW_BLOCK)
            self.part = cp.empty((nrb * k, d), dtype=cp.float64)
            self.wpart = cp.empty(nrb * k, dtype=cp.float64)
        else:
            self.max_pieces = -(-rows // PIECE) + k
            self.part = cp.empty((self.max_pieces, d), dtype=cp.float64)
            self.wpart = cp.empty(self.max_pieces, dtype=cp.float64)
            self.nw_max = -(-rows // SORT_RW)
            self.cnt = cp.empty(k * self.nw_max, dtype=cp.int32)
            self.incl = cp.empty(k * self.nw_max, dtype=cp.int32)
            self.order = cp.empty(rows, dtype=cp.int32)
            self.off = cp.empty(k + 1, dtype=cp.int32)
            self.pstart = cp.empty(k + 1, dtype=cp.int32)

    def run(self, X, labels, w, sums, wsum, acc=False):
        """sums (k, d) and wsum (k,), float64, of X's rows by label: overwritten, or
        added to (``acc``) in row order."""
        n, d = X.shape
        k = self.k
        if n == 0:
            if not acc:
                sums.fill(0)
                wsum.fill(0)
            return
        vec = _vec_for(X, X.itemsize)
        ld = X.strides[0] // X.itemsize if n > 1 else d
        wp = w if w is not None else NULL
        if self.route == "direct":
            v, W, smem = direct_config(k, d, X.dtype, vec)
            nrb = -(-n // ROW_BLOCK)
            ns = -(-d // (32 * v))
            kern = _kernel(f"kmeans_sums_direct<{_compile.ctype(X.dtype)}, {v}, {W}>", smem)
            kern((nrb * ns,), (W * 32,), (X, np.int64(ld), np.int32(n), np.int32(d), labels, wp, np.int32(k),
                                          np.int32(ROW_BLOCK), np.int32(ns), self.part, self.wpart),
                 shared_mem=smem)
            _kernel("kmeans_reduce_rb<double>")((k, -(-d // 256)), (256,), (
                self.part, self.wpart, np.int32(nrb), np.int32(k), np.int32(d), np.int32(acc), sums, wsum))
            return
        cp = _cp()
        nw = -(-n // SORT_RW)
        smem = SORT_WB * k * 4
        grid = (-(-nw // SORT_WB),)
        cnt, incl = self.cnt[: k * nw], self.incl[: k * nw]
        _kernel(f"kmeans_hist<{SORT_WB}>", smem)(grid, (SORT_WB * 32,), (
            labels, np.int32(n), np.int32(k), np.int32(SORT_RW), np.int32(nw), cnt), shared_mem=smem)
        cp.cumsum(cnt, out=incl)
        order = self.order[:n]
        _kernel(f"kmeans_scatter<{SORT_WB}>", smem)(grid, (SORT_WB * 32,), (
            labels, np.int32(n), np.int32(k), np.int32(SORT_RW), np.int32(nw), cnt, incl, order),
            shared_mem=smem)
        _kernel(f"kmeans_offsets<{PIECE}>")((1,), (1024,), (cnt, incl, np.int32(k), np.int32(nw), np.int32(n),
                                                          self.off, self.pstart))
        ns = -(-d // (32 * vec))
        pieces = -(-n // PIECE) + k
        _kernel(partials_name(X.dtype, vec))(
            (pieces * ns,), (256,), (X, np.int64(ld), np.int32(d), np.int32(ns), order, self.off, self.pstart,
                                     np.int32(k), wp, self.part, self.wpart))
        _kernel("kmeans_reduce<double>")((k, -(-d // 256)), (256,), (
            self.part, self.wpart, self.pstart, np.int32(d), np.int32(acc), sums, wsum))


def kmeans_centroid_sums(X, labels, k, sample_weight=None, *, check_labels=True):
    """Weighted sum of the rows of each cluster and the clusters' total weights, on the GPU.

    Deterministic: the same inputs give bit-identical sums from run to run (no
    floating-point atomics; partial sums are reduced in a fixed order).

    Parameters
    ----------
    X : cupy.ndarray or torch.Tensor (CUDA), shape (n, d)
        The rows, float32 or float64.
    labels : array of shape (n,), same kind as X
        Integers in [0, k): the cluster of each row.
    k : int
        The number of clusters.
    sample_weight : array of shape (n,), same kind as X, optional
        Weights of the rows (default: all ones).
    check_labels : bool, default=True
        Check that every label lies in [0, k) (a reduction and a host round trip;
        out-of-range labels would write out of bounds).

    Returns
    -------
    sums : array of shape (k, d), float64, X's kind
        sum_i w_i x_i over the rows of each cluster.
    weights : array of shape (k,), float64, X's kind
        sum_i w_i over the rows of each cluster.

    Raises
    ------
    TypeError
        X is not a CuPy array or a torch CUDA tensor.
    ValueError
        `labels` or `sample_weight` has the wrong shape, or a label lies outside [0, k).

    Examples
    --------
    >>> import numpy as np, tsm_core
    >>> X = np.arange(6.0).reshape(3, 2)
    >>> labels = np.array([0, 1, 0])
    >>> if tsm_core.has_gpu():
    ...     import cupy as cp
    ...     s, w = tsm_core.kmeans_centroid_sums(cp.asarray(X), cp.asarray(labels), 2)
    ...     s, w = s.get(), w.get()
    ... else:  # the same result from numpy
    ...     s = np.stack([X[labels == j].sum(0) for j in range(2)])
    ...     w = np.bincount(labels, minlength=2).astype(float)
    >>> s.tolist(), w.tolist()
    ([[4.0, 6.0], [2.0, 3.0]], [2.0, 1.0])
    """
    cp = _cp()
    kind = kind_of(X, "X")
    if kind not in ("cupy", "torch"):
        raise TypeError("kmeans_centroid_sums computes on the GPU: pass a CuPy array or a torch CUDA tensor")
    Xb = _c_rows(to_backend(X, "X"))
    lab = cp.ascontiguousarray(to_backend(labels, "labels")).astype(cp.int32, copy=False)
    n, d = Xb.shape
    if lab.shape != (n,):
        raise ValueError(f"labels must have shape ({n},); got {lab.shape}")
    if check_labels and n and (int(lab.min()) < 0 or int(lab.max()) >= k):
        raise ValueError(f"labels must lie in [0, {k})")
    w = None
    if sample_weight is not None:
        w = cp.ascontiguousarray(to_backend(sample_weight, "sample_weight")).astype(Xb.dtype, copy=False)
        if w.shape != (n,):
            raise ValueError(f"sample_weight must have shape ({n},); got {w.shape}")
    sums = cp.empty((k, d), dtype=cp.float64)
    wsum = cp.empty(k, dtype=cp.float64)
    _Sums(n, d, k, Xb.dtype).run(Xb, lab, w, sums, wsum)
    return wrap(sums, kind), wrap(wsum, kind)
