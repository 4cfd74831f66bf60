"""The update step: per-cluster weighted sums of the rows and the clusters' weights.

Deterministic (bit-identical from run to run), without floating-point atomics:
per-warp accumulators in shared memory over row blocks (``direct``, small k) or a
stable sort by label (a counting sort, or ``cupy.argsort`` for large k) and sums
per piece of <= PIECE rows (``sorted``); then the row blocks / pieces are reduced
in a fixed order. The route comes from ``configs.update_route``, the sort from
``configs.sort_method``.

X may be float32, float64, float16 or bfloat16 (named by ``xdtype``: CuPy has no
bfloat16, so such X arrives as a 2-byte integer view of the same memory). Half X is
summed in float32 in registers and shared memory, then in float64 like the rest.
"""

from __future__ import annotations

import numpy as np

from tsm_core.kmeans.configs import (PIECE, ROW_BLOCK, SORT_WB, direct_config, direct_lanes, packed_config,
                                     packed_name, partials_config, partials_name, sort_method, sort_rows_per_warp,
                                     update_route, x_ctype, x_itemsize, x_type)
from tsm_core.kmeans.launch import NULL, _c_rows, _cp, _kernel, _vec_for
from tsm_core.runtime.arrays import kind_of, to_backend, wrap


def acc_dtype(xdtype) -> np.dtype:
    """The weights' dtype for X of type `xdtype`: float32 for half X, X's otherwise.

    Examples
    --------
    >>> from tsm_core.kmeans.update import acc_dtype
    >>> acc_dtype("bfloat16"), acc_dtype("float64")
    (dtype('float32'), dtype('float64'))
    """
    t = x_type(xdtype)
    return np.dtype(np.float64 if t == "float64" else np.float32)


class _Sums:
    """Workspace of the deterministic centroid update for chunks of up to `rows` rows
    of X with element type `dtype` (a numpy dtype, or a name among
    ``configs.X_TYPES``: "bfloat16" for bfloat16 X held in a 2-byte integer array).

    Chunks whose row counts are multiples of ROW_BLOCK, summed with ``acc=True``
    after the first, give bit-identical sums to one pass over all rows on the
    ``direct`` route. On the ``sorted`` route a chunk boundary splits a cluster's
    rows into pieces at other places than one pass does, so chunked sums equal one
    pass up to float64 rounding only (each is still bit-identical from run to run)."""

    def __init__(self, rows: int, d: int, k: int, dtype):
        cp = _cp()
        self.d, self.k, self.rows = d, k, rows
        self.xdtype = x_type(dtype)
        self.ppart = self.pwpart = None  # the packed route's partials where the update is sorted
        self.route = update_route(k, d, self.xdtype, 16 // x_itemsize(self.xdtype))
        if self.route == "direct":
            nrb = -(-rows // ROW_BLOCK)
            self.part = cp.empty((nrb * k, d), dtype=cp.float64)
            self.wpart = cp.empty(nrb * k, dtype=cp.float64)
            return
        self.sort = sort_method(k)
        self.max_pieces = -(-rows // PIECE) + k
        self.part = cp.empty((self.max_pieces, d), dtype=cp.float64)
        self.wpart = cp.empty(self.max_pieces, dtype=cp.float64)
        self.order = cp.empty(max(rows, 1), dtype=cp.int32)
        self.off = cp.empty(k + 1, dtype=cp.int32)
        self.pstart = cp.empty(k + 1, dtype=cp.int32)
        if self.sort == "count":
            self.rw = sort_rows_per_warp(k)
            nw_max = -(-rows // self.rw)  # warps of the counting sort
            nb_max = -(-nw_max // SORT_WB)  # count columns: one a block of SORT_WB warps
            self.cnt = cp.empty(k * nb_max, dtype=cp.int32)
            self.incl = cp.empty(k * nb_max, dtype=cp.int32)

    def packed(self, X, C, labels, mind, changed, prev, w, sums, wsum, acc=False, exact=False):
        """The packed assignment of X's rows to C (``packed_assign``) and, in the same
        pass, sums (k, d) and wsum (k,) of the rows by their new labels, as ``run``
        gives them (overwritten, or added to with ``acc``). X as in ``run``, its rows
        16-byte aligned; `exact` as in ``packed_assign``."""
        cp = _cp()
        if self._nothing_to_sum(X, sums, wsum, acc):
            return
        if self.route == "direct":
            part, wpart = self.part, self.wpart
        else:  # the row blocks' partials, made on first use
            if self.ppart is None:
                nrb = -(-self.rows // ROW_BLOCK)
                self.ppart = cp.empty((nrb * self.k, self.d), dtype=cp.float64)
                self.pwpart = cp.empty(nrb * self.k, dtype=cp.float64)
            part, wpart = self.ppart, self.pwpart
        if w is not None:
            w = cp.ascontiguousarray(w).astype(acc_dtype(self.xdtype), copy=False)
        packed_assign(X, self.xdtype, C, labels, mind, changed, prev, w=w, part=part, wpart=wpart, exact=exact)
        self._reduce_rb(part, wpart, -(-X.shape[0] // ROW_BLOCK), acc, sums, wsum)

    def _nothing_to_sum(self, X, sums, wsum, acc) -> bool:
        """Check X's element size; with no rows, the sums made 0 (unless `acc`): True."""
        if X.itemsize != x_itemsize(self.xdtype):
            raise TypeError(f"X has {X.itemsize}-byte elements; this workspace sums {self.xdtype}")
        if X.shape[0] == 0:
            if not acc:
                sums.fill(0)
                wsum.fill(0)
            return True
        return False

    def _reduce_rb(self, part, wpart, nrb, acc, sums, wsum):
        """sums, wsum (+)= the nrb row blocks' partials, in row-block order."""
        k, d = self.k, self.d
        _kernel("kmeans_reduce_rb<double>")((-(-(k * (d + 1)) // 8),), (256,), (
            part, wpart, np.int32(nrb), np.int32(k), np.int32(d), np.int32(acc), sums, wsum))

    def run(self, X, labels, w, sums, wsum, acc=False):
        """sums (k, d) and wsum (k,), float64, of X's rows by label: overwritten, or
        added to (``acc``) in row order. X: (n, d) with unit column stride, of the
        element size of this workspace's type; labels: int32 (n,), contiguous; w:
        (n,) weights (converted to ``acc_dtype``) or None."""
        n, d = X.shape
        k = self.k
        if self._nothing_to_sum(X, sums, wsum, acc):
            return
        cp = _cp()
        vec = _vec_for(X, X.itemsize)
        ld = X.strides[0] // X.itemsize if n > 1 else d
        if w is not None:
            w = cp.ascontiguousarray(w).astype(acc_dtype(self.xdtype), copy=False)
        wp = w if w is not None else NULL
        c = x_ctype(self.xdtype)
        if self.route == "direct":
            v, W, smem = direct_config(k, d, self.xdtype, vec)
            lpr = direct_lanes(d, v)
            nrb = -(-n // ROW_BLOCK)
            ns = -(-d // (lpr * v))
            kern = _kernel(f"kmeans_sums_direct<{c}, {v}, {W}, {lpr}>", smem)
            kern((nrb * ns,), (W * 32,), (X, np.int64(ld), np.int32(n), np.int32(d), labels, wp, np.int32(k),
                                          np.int32(ROW_BLOCK), np.int32(ns), self.part, self.wpart),
                 shared_mem=smem)
            self._reduce_rb(self.part, self.wpart, nrb, acc, sums, wsum)
            return
        order = self.order[:n]
        if self.sort == "count":
            rw = self.rw
            nw = -(-n // rw)
            smem = SORT_WB * k * 4
            nb = -(-nw // SORT_WB)
            grid = (nb,)
            cnt, incl = self.cnt[: k * nb], self.incl[: k * nb]
            _kernel(f"kmeans_hist<{SORT_WB}>", smem)(grid, (SORT_WB * 32,), (
                labels, np.int32(n), np.int32(k), np.int32(rw), np.int32(nw), cnt), shared_mem=smem)
            cp.cumsum(cnt, out=incl)
            _kernel(f"kmeans_scatter<{SORT_WB}>", smem)(grid, (SORT_WB * 32,), (
                labels, np.int32(n), np.int32(k), np.int32(rw), np.int32(nw), cnt, incl, order),
                shared_mem=smem)
            _kernel(f"kmeans_offsets<{PIECE}>")((1,), (1024,), (
                cnt, incl, np.int32(k), np.int32(nb), np.int32(n), self.off, self.pstart))
        else:
            o64 = cp.argsort(labels).astype(cp.int64, copy=False)  # stable
            _kernel("kmeans_bounds")((-(-n // 256),), (256,), (
                o64, labels, np.int32(n), np.int32(k), order, self.off))
            _kernel(f"kmeans_pieces<{PIECE}>")((1,), (1024,), (self.off, np.int32(k), self.pstart))
        v, lpr, ns = partials_config(d, self.xdtype, vec)
        tasks = (-(-n // PIECE) + k) * ns  # at most; warps past the last piece return at once
        _kernel(partials_name(self.xdtype, v, lpr))((-(-tasks // 8),), (256,), (
            X, np.int64(ld), np.int32(d), np.int32(ns), order, self.off, self.pstart, np.int32(k), wp,
            self.part, self.wpart))
        _kernel("kmeans_reduce<double>")((-(-(k * d) // 256),), (256,), (
            self.part, self.wpart, self.pstart, np.int32(k), np.int32(d), np.int32(acc), sums, wsum))


def packed_assign(X, xdtype, C, labels, mind, changed, prev=None, *, w=None, part=None, wpart=None, exact=False):
    """Launch kmeans_assign_sums_packed over X's n rows (of type `xdtype`, 16-byte
    aligned rows: ``tensor.ready``) against C (k, d) float32, C order: labels (int32),
    mind (float32, ||x - c||^2 from the differences), the changed flag (set where a
    label differs from `prev`, which may be `labels`). With `part` ((nrb * k, d)
    float64) and `wpart` (nrb * k), also the row blocks' weighted sums (`w`: (n,)
    weights in ``acc_dtype``, or None), as kmeans_sums_direct gives them for these
    labels; nrb = ceil(n / ROW_BLOCK). `exact` (precision "float32"): rows whose two
    best distances lie within float32's rounding bound are decided again in float64,
    so that the labels are float64's."""
    n, d = X.shape
    k = C.shape[0]
    sums = part is not None
    cfg = packed_config(k, d, xdtype, sums=sums)
    if cfg is None:
        raise ValueError(f"the packed assignment does not take k={k}, d={d} in {xdtype}")
    if n == 0:
        return
    _, wps, _, _, smem = cfg
    ld = X.strides[0] // X.itemsize if n > 1 else d
    nrb = -(-n // ROW_BLOCK)
    kern = _kernel(packed_name(cfg, xdtype), smem)
    kern((nrb,), (wps * 32,), (X, np.int64(ld), np.int32(n), np.int32(d), C, np.int32(k), labels, mind,
                               prev if prev is not None else NULL, changed, w if w is not None else NULL,
                               np.int32(ROW_BLOCK), part if sums else NULL, wpart if sums else NULL,
                               np.int32(exact)), shared_mem=smem)


def half_view(X, xdtype=None):
    """(X as an array CuPy can take, the name of its element type).

    A torch bfloat16 tensor is viewed as int16 (CuPy has no bfloat16; the kernels
    read the bits), other torch tensors and numpy / CuPy arrays are kept; `xdtype`
    names the type of a 2-byte integer array holding bfloat16 or float16 bits and
    must agree with the element size.

    Examples
    --------
    >>> import numpy as np
    >>> from tsm_core.kmeans.update import half_view
    >>> half_view(np.zeros((2, 3), np.float16))[1]
    'float16'
    >>> v, t = half_view(np.zeros((2, 3), np.uint16), "bfloat16")
    >>> v.dtype, t
    (dtype('uint16'), 'bfloat16')
    """
    mod = type(X).__module__.split(".")[0]
    if mod == "torch":
        t = x_type(X.dtype)
        if xdtype is not None and x_type(xdtype) != t:
            raise TypeError(f"X is a {X.dtype} tensor; xdtype={xdtype!r} disagrees")
        if t == "bfloat16":
            import torch

            X = X.view(torch.int16)
        return X, t
    if xdtype is None:
        return X, x_type(X.dtype)
    t = x_type(xdtype)
    if X.dtype.itemsize != x_itemsize(t) or (X.dtype.kind == "f" and X.dtype.name != t):
        raise TypeError(f"X of dtype {X.dtype} cannot hold {t}")
    return X, t


def kmeans_centroid_sums(X, labels, k, sample_weight=None, *, check_labels=True, xdtype=None):
    """Weighted sum of the rows of each cluster and the clusters' total weights, on the GPU.

    Deterministic: the same inputs give bit-identical sums from run to run (no
    floating-point atomics; partial sums are reduced in a fixed order).

    Parameters
    ----------
    X : cupy.ndarray or torch.Tensor (CUDA), shape (n, d)
        The rows: float32, float64, float16, or bfloat16 (a torch tensor, or a
        2-byte integer CuPy array holding bfloat16 bits with ``xdtype="bfloat16"``).
    labels : array of shape (n,), same kind as X
        Integers in [0, k): the cluster of each row.
    k : int
        The number of clusters.
    sample_weight : array of shape (n,), same kind as X, optional
        Weights of the rows (default: all ones).
    check_labels : bool, default=True
        Check that every label lies in [0, k) (a reduction and a host round trip;
        out-of-range labels would write out of bounds).
    xdtype : str, optional
        X's element type where its dtype does not say it: "bfloat16" (or
        "float16") for a uint16 / int16 array of those bits.

    Returns
    -------
    sums : array of shape (k, d), float64, X's kind
        sum_i w_i x_i over the rows of each cluster.
    weights : array of shape (k,), float64, X's kind
        sum_i w_i over the rows of each cluster.

    Raises
    ------
    TypeError
        X is not a CuPy array or a torch CUDA tensor, or not of a supported type.
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
    X, xt = half_view(X, xdtype)
    Xb = _c_rows(to_backend(X, "X"))
    lab = cp.ascontiguousarray(to_backend(labels, "labels")).astype(cp.int32, copy=False)
    n, d = Xb.shape
    if lab.shape != (n,):
        raise ValueError(f"labels must have shape ({n},); got {lab.shape}")
    if check_labels and n and (int(lab.min()) < 0 or int(lab.max()) >= k):
        raise ValueError(f"labels must lie in [0, {k})")
    w = None
    if sample_weight is not None:
        if type(sample_weight).__module__.split(".")[0] == "torch" and str(sample_weight.dtype) == "torch.bfloat16":
            sample_weight = sample_weight.float()  # CuPy has no bfloat16
        w = cp.ascontiguousarray(to_backend(sample_weight, "sample_weight")).astype(acc_dtype(xt), copy=False)
        if w.shape != (n,):
            raise ValueError(f"sample_weight must have shape ({n},); got {w.shape}")
    sums = cp.empty((k, d), dtype=cp.float64)
    wsum = cp.empty(k, dtype=cp.float64)
    _Sums(n, d, k, xt).run(Xb, lab, w, sums, wsum)
    return wrap(sums, kind), wrap(wsum, kind)
