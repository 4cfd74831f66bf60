"""GPU k-means (Lloyd) on the kernels of ``kmeans/kmeans.cu``.

Public names (re-exported lazily by ``tsm_core``):

- ``kmeans_assign(X, C)``: nearest centre of every row and its squared distance;
- ``kmeans_centroid_sums(X, labels, k, sample_weight=None)``: per-cluster weighted sums
  of the rows and the weights, in float64, in a fixed order (deterministic);
- ``kmeans_plusplus(X, k, random_state=..., sample_weight=None)``: scikit-learn's
  greedy k-means++ seeding, distances on the GPU, random draws from numpy;
- ``kmeans_lloyd(X, centers, ...)``: Lloyd's iterations with scikit-learn's stopping
  rules, in GPU memory or streamed from host memory in chunks;
- ``kmeans_source(X, max_gpu_memory=...)``: X prepared once for several runs.

One Lloyd iteration reads X twice. The assignment: ``kmeans_assign_fused`` (k <= 32,
d >= 512: one read of X, distances in registers), ``kmeans_assign_tile2`` (gemm.cu's
SIMT GEMM tile with the argmin and ||x||^2 in it: one read of X; v1,
``kmeans_assign_tile``, stays selectable with ``TSM_KMEANS_TILE=old``) or cuBLAS dot
products in row batches plus ``kmeans_argmin_rows``; between the last two the choice
is measured once per shape (``auto_method``). The centroid update: per-warp
accumulators in shared memory over rows in their own order (``direct``, small k) or a stable counting sort by label and
sums per piece of <= P rows (``sorted``); then row blocks / pieces in a fixed order.
No floating-point atomics. Streamed X is read from host memory once per iteration:
each chunk is assigned and summed while the next is being copied.

X is used as given (row-major, unit column stride; any other layout is copied once
to C order). The GPU path does not centre X (sklearn does on the CPU): centring a
caller's device array would need a copy of it.
"""

from __future__ import annotations

import numpy as np

from tsm_core.runtime import compile as _compile
from tsm_core.runtime.arrays import kind_of, to_backend, wrap

FAMILY = "kmeans"
NULL = np.uint64(0)  # a null pointer argument
PIECE = 256  # rows per piece of the centroid update
GEMM_BATCH_BYTES = 64 << 20  # dot-product block of the cuBLAS route
FUSED_KMAX = 32  # the fused kernel keeps k <= 32 distances per row in registers
FUSED_DMIN = 512  # below this d the lane-split of d leaves lanes idle (tile route)


def _cp():
    import cupy

    return cupy


# ------------------------------------------------------------------ configurations


def _vec_for(X, itemsize: int) -> int:
    """Widest vector (elements, <= 16 bytes) that d, the row stride and X's address allow."""
    d = X.shape[1]
    ld = X.strides[0] // itemsize if X.shape[0] > 1 else d
    ptr = X.data.ptr
    v = 16 // itemsize
    while v > 1 and (d % v or ld % v or ptr % (v * itemsize)):
        v //= 2
    return v


def fused_config(k: int, dtype, vec: int) -> tuple:
    """(VEC, W, R, KP, KT) of kmeans_assign_fused for k centres.

    R * KP partial sums per lane: 64 keeps float32 at ~124 registers (two blocks of
    256 threads per SM); float64 takes twice the registers, so half the rows.
    ``TSM_KMEANS_FUSED="W,R,STEPS"`` overrides warps, rows per warp and warp steps
    per C tile (for tuning sweeps; such configurations are not compile-checked)."""
    import os

    dtype = np.dtype(dtype)
    kp = 8 if k <= 8 else 16 if k <= 16 else 32
    # At most 4 rows: with R=8 the tile's prefetched X alone is 64 registers (228 in all).
    r = max(1, min(4, 64 // kp))
    if dtype == np.float64:
        r = max(1, r // 2)
    w, steps = 8, 2
    tune = os.environ.get("TSM_KMEANS_FUSED")
    if tune:
        w, r, steps = (int(t) for t in tune.split(","))
    return vec, w, r, kp, steps * 32 * vec


def fused_name(cfg: tuple, dtype) -> str:
    vec, w, r, kp, kt = cfg
    return f"kmeans_assign_fused<{_compile.ctype(dtype)}, {vec}, {w}, {r}, {kp}, {kt}>"


def partials_name(dtype, vec: int) -> str:
    return f"kmeans_partials<{_compile.ctype(dtype)}, {vec}, 8, {PIECE}>"


def all_names(dtype) -> list:
    """Every instantiation the launchers here can pick for `dtype` (compile checks)."""
    item = np.dtype(dtype).itemsize
    names = set()
    vecs = [v for v in (4, 2, 1) if v * item <= 16]
    for vec in vecs:
        for k in (1, 9, 17):
            names.add(fused_name(fused_config(k, dtype, vec), dtype))
        names.add(partials_name(dtype, vec))
        names.add(tile_name(dtype, vec, "v1"))
        names.add(tile_name(dtype, vec, "v2"))
    c = _compile.ctype(dtype)
    names.add(f"kmeans_centres_t<{c}>")
    for vec in vecs:
        for k in (1, 16, 64, 200):
            cfg = direct_config(k, 4096, dtype, vec)
            if cfg is not None:
                names.add(f"kmeans_sums_direct<{c}, {cfg[0]}, {cfg[1]}>")
    names |= {f"kmeans_argmin_rows<{c}>", f"kmeans_row_sqnorm<{c}>", f"kmeans_finalize<{c}>",
              f"kmeans_offsets<{PIECE}>", "kmeans_reduce<double>", "kmeans_reduce_rb<double>",
              f"kmeans_hist<{SORT_WB}>", f"kmeans_scatter<{SORT_WB}>", "kmeans_status<256>"}
    return sorted(names)


# v2 tile kernel: (vector width of the X loads, BK) for each width that X allows, by
# itemsize. Measured with ptxas (sm_90, 128 registers for two blocks of 256 threads
# per SM): these compile without spills; float2 loads with BK = 8 and any BK = 16
# for float spill a few words (the 8 x 8 block leaves no slack), so float2 rows
# take scalar loads (8 per thread and step, next to 512 FFMAs).
TILE2_STEP = {4: {4: (4, 8), 2: (1, 8), 1: (1, 8)}, 8: {2: (2, 16), 1: (1, 8)}}


def tile_version() -> str:
    """'v2' (kmeans_assign_tile2, the default) or 'v1' (kmeans_assign_tile, kept to
    compare on the device: ``TSM_KMEANS_TILE=old``)."""
    import os

    return "v1" if os.environ.get("TSM_KMEANS_TILE", "").lower() in ("old", "v1") else "v2"


def tile_config(dtype, version: str | None = None, vec: int | None = None) -> tuple:
    """(BM, BN, BK, TM, TN) of the tile kernel: rows and centres per block tile, the
    k-depth of a step and each thread's register block.

    v2 (gemm.cu's blocking, 256 threads, two blocks per SM): float 256 x 64 tiles,
    8 x 8 per thread; double 64 x 64, 4 x 4; BK from TILE2_STEP for the vector width
    `vec` that X allows (default the widest). v1: 128 threads, float
    (64, 64, 32, 8, 4) (~145 registers: three blocks per SM), double (32, 64, 16, 4, 4)."""
    version = version or tile_version()
    item = np.dtype(dtype).itemsize
    if version == "v2":
        vec = 16 // item if vec is None else vec
        bk = TILE2_STEP[item][vec][1]
        return (256, 64, bk, 8, 8) if item == 4 else (64, 64, bk, 4, 4)
    return (64, 64, 32, 8, 4) if item == 4 else (32, 64, 16, 4, 4)


def tile_name(dtype, vec: int, version: str | None = None) -> str:
    """The tile kernel's instantiation for X rows that allow `vec`-wide loads."""
    version = version or tile_version()
    bm, bn, bk, tm, tn = tile_config(dtype, version, vec)
    if version == "v2":
        v = TILE2_STEP[np.dtype(dtype).itemsize][vec][0]
        return f"kmeans_assign_tile2<{_compile.ctype(dtype)}, {v}, {bn // tn}, {bk}>"
    return f"kmeans_assign_tile<{_compile.ctype(dtype)}, {vec}, {bm}, {bn}, {bk}, {tm}, {tn}>"


def _tile_needs_xx() -> bool:
    """v1 takes ||x||^2 from a separate pass over X; v2 sums it while X is staged."""
    return tile_version() == "v1"


def choose_method(k: int, d: int) -> str:
    """'fused' where the distances fit in registers and d is long enough to split
    over the lanes (one read of X, at its bandwidth); 'tile' (SIMT GEMM with the
    argmin fused) where one tile of centres covers k or rows are short, so that the
    X tile is re-read per centre tile from L2 only; 'gemm' (cuBLAS dot products in
    row batches, then the argmin) for long rows and many centres."""
    if k <= FUSED_KMAX and d >= FUSED_DMIN:
        return "fused"
    if k <= tile_config(np.float32)[1] or d <= 1024:
        return "tile"
    return "gemm"


_TUNED: dict = {}  # (k, d, dtype, vec, tile version) -> "tile" or "gemm", once per process


def auto_method(X, C, cn, xx=None) -> str:
    """choose_method, with the 'tile' / 'gemm' choice measured once per (k, d, dtype)
    on up to 2^17 rows of X (`xx`: their squared norms, made there when None), like
    the dispatcher's check against cuBLAS: the tile kernel is used where it is faster
    and agrees with cuBLAS (distances to rounding, labels on >= 99% of the rows: they
    may differ on near-ties); otherwise cuBLAS, with a warning when they disagree.
    ``TSM_KMEANS_ASSIGN`` forces a method."""
    import os

    k, d = C.shape
    m = choose_method(k, d)
    if m != "tile":
        return m
    forced = os.environ.get("TSM_KMEANS_ASSIGN")
    if forced in ("tile", "gemm"):
        return forced
    key = (k, d, X.dtype.str, _vec_for(X, X.itemsize), tile_version())
    if key not in _TUNED:
        _TUNED[key] = _tune_tile(X, C, cn, xx)
    return _TUNED[key]


def _tune_tile(X, C, cn, xx=None) -> str:
    import warnings

    cp = _cp()
    rows = min(X.shape[0], 1 << 17)
    Xs = X[:rows]
    xs = xx[:rows] if xx is not None else _row_sqnorm(Xs, cp.empty(rows, dtype=X.dtype))
    out, ms = {}, {}
    for m in ("gemm", "tile"):
        labels = cp.empty(rows, dtype=cp.int32)
        mind = cp.empty(rows, dtype=X.dtype)
        ch = cp.zeros(1, dtype=cp.int32)
        _assign(Xs, C, cn, labels, mind, ch, method=m, xx=xs)  # compile, warm up
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        for _ in range(3):
            _assign(Xs, C, cn, labels, mind, ch, method=m, xx=xs)
        stop.record()
        stop.synchronize()
        ms[m] = cp.cuda.get_elapsed_time(start, stop)
        out[m] = (labels, mind)
    lt = out["tile"][0]
    agree = float((out["gemm"][0] == lt).mean())
    in_range = bool(((lt >= 0) & (lt < C.shape[0])).all())
    # Labels may differ on (near) ties only: the distances must agree to rounding.
    dm = float(cp.abs(out["tile"][1] - out["gemm"][1]).max())
    scale = float(cp.abs(out["gemm"][1]).max()) + float(xs.max()) + 1e-30
    if not in_range or not dm <= 1e-3 * scale or (rows >= 1000 and agree < 0.99):
        warnings.warn(f"{tile_name(X.dtype, _vec_for(X, X.itemsize))} disagreed with cuBLAS (labels equal "
                      f"on {agree:.4%} of rows, distance difference {dm:.3g}); using cuBLAS",
                      RuntimeWarning, stacklevel=3)
        return "gemm"
    return "tile" if ms["tile"] <= ms["gemm"] else "gemm"


def _kernel(name: str, smem: int = 0):
    kern = _compile.get_kernel(FAMILY, name)
    if smem > 48 * 1024:
        kern.max_dynamic_shared_size_bytes = smem
    return kern


def _c_rows(X):
    """X with unit column stride (a C-ordered copy otherwise)."""
    cp = _cp()
    if X.ndim != 2:
        raise ValueError(f"X must be 2-D; got shape {X.shape}")
    if X.shape[1] > 1 and X.strides[1] != X.itemsize or X.strides[0] < 0:
        X = cp.ascontiguousarray(X)
    return X


# ------------------------------------------------------------------ assignment


def _row_sqnorm(X, out):
    n, d = X.shape
    if n == 0:
        return out
    ld = X.strides[0] // X.itemsize
    kern = _kernel(f"kmeans_row_sqnorm<{_compile.ctype(X.dtype)}>")
    kern(((n + 7) // 8,), (256,), (X, np.int64(ld), np.int32(n), np.int32(d), out))
    return out


def _centres_t(C, bn: int):
    """C (k, d) transposed and padded with zeros to (d, bn * ceil(k / bn)): the v2 tile
    kernel copies k-major tiles of it to shared memory with cp.async (16-byte chunks:
    the padded row length keeps them aligned). One small launch (C is k x d)."""
    cp = _cp()
    k, d = C.shape
    ldc = -(-k // bn) * bn
    CT = cp.empty((d, ldc), dtype=C.dtype)
    blocks = min(1024, -(-(d * ldc) // 256))
    _kernel(f"kmeans_centres_t<{_compile.ctype(C.dtype)}>")(
        (blocks,), (256,), (C, np.int32(k), np.int32(d), np.int32(ldc), CT))
    return CT


def _assign(X, C, cn, labels, mind, changed, *, prev=None, method="auto", xx=None, dbuf=None):
    """Launch the assignment of X's rows (CuPy, C rows) to centres C (k, d) contiguous.

    labels (int32) and mind (X.dtype) have n entries; `prev` (may be `labels`) feeds the
    changed flag (int32, one element, set to 1 when a label differs). `xx` (row norms) and
    `dbuf` (dot-product block) serve the cuBLAS route (and v1 of the tile kernel) and are
    made here when None; v2 of the tile kernel sums ||x||^2 itself."""
    cp = _cp()
    n, d = X.shape
    k = C.shape[0]
    if n == 0:
        return
    dtype = X.dtype
    if method == "auto":
        method = choose_method(k, d)
        if method == "tile":
            method = auto_method(X, C, cn, xx)
    pv = prev if prev is not None else NULL
    ld = X.strides[0] // X.itemsize if n > 1 else d
    if method == "fused":
        if k > FUSED_KMAX:
            raise ValueError(f"the fused kernel handles k <= {FUSED_KMAX}; got k={k}")
        vec = _vec_for(X, X.itemsize)
        if d % vec:
            vec = 1
        cfg = fused_config(k, dtype, vec)
        _, w, r, kp, kt = cfg
        smem = 2 * kp * kt * X.itemsize
        kern = _kernel(fused_name(cfg, dtype), smem)
        grid = (n + w * r - 1) // (w * r)
        kern((grid,), (w * 32,), (X, np.int64(ld), C, cn, np.int32(n), np.int32(d), np.int32(k),
                                  labels, mind, pv, changed), shared_mem=smem)
        return
    if method not in ("gemm", "tile"):
        raise ValueError(f"method must be 'auto', 'fused', 'tile' or 'gemm'; got {method!r}")
    if method == "tile" and not _tile_needs_xx():
        vec = _vec_for(X, X.itemsize)
        bm, bn = tile_config(dtype, "v2", vec)[:2]
        CT = _centres_t(C, bn)
        _kernel(tile_name(dtype, vec, "v2"))(
            ((n + bm - 1) // bm,), (256,),
            (X, np.int64(ld), CT, np.int32(CT.shape[1]), cn, np.int32(n), np.int32(d), np.int32(k),
             labels, mind, pv, changed))
        return
    if xx is None:
        xx = _row_sqnorm(X, cp.empty(n, dtype=dtype))
    if method == "tile":
        vec = _vec_for(X, X.itemsize)
        bm, bn, bk, tm, tn = tile_config(dtype, "v1")
        kern = _kernel(tile_name(dtype, vec, "v1"))
        kern(((n + bm - 1) // bm,), ((bm // tm) * (bn // tn),),
             (X, np.int64(ld), C, cn, xx, np.int32(n), np.int32(d), np.int32(k), labels, mind, pv, changed))
        return
    rows = max(1, min(n, GEMM_BATCH_BYTES // (k * X.itemsize)))
    if dbuf is None or dbuf.shape[0] < min(rows, n) or dbuf.shape[1] != k:
        dbuf = cp.empty((min(rows, n), k), dtype=dtype)
    kern = _kernel(f"kmeans_argmin_rows<{_compile.ctype(dtype)}>")
    Ct = C.T
    for a in range(0, n, rows):
        b = min(n, a + rows)
        D = dbuf[: b - a]
        cp.matmul(X[a:b], Ct, out=D)  # cuBLAS, fp32 without TF32 unless CUPY_TF32 is set
        kern((((b - a) + 7) // 8,), (256,),
             (D, np.int32(b - a), np.int32(k), cn, xx[a:b], labels[a:b], mind[a:b],
              pv[a:b] if prev is not None else NULL, changed))


def kmeans_assign(X, C, *, method="auto"):
    """Nearest centre of each row of X and the squared distance to it, on the GPU.

    Parameters
    ----------
    X : CuPy array or torch CUDA tensor, shape (n, d), float32 or float64
    C : same kind and dtype, shape (k, d)
    method : {"auto", "fused", "tile", "gemm"}
        "fused": one kernel reads X once and keeps the distances in registers (k <= 32);
        "tile": a SIMT GEMM tile kernel with the argmin in its epilogue (any k);
        "gemm": cuBLAS dot products in row batches, then an argmin kernel.

    Returns
    -------
    labels : (n,) int32, the index of the nearest centre (smallest index on ties)
    mind : (n,) X.dtype, ``||x - c_label||^2`` computed as ``||x||^2 - 2 x.c + ||c||^2``

    Examples
    --------
    >>> import cupy as cp, tsm_core                                  # doctest: +SKIP
    >>> X = cp.random.standard_normal((1000, 600), dtype=cp.float32)  # doctest: +SKIP
    >>> labels, d2 = tsm_core.kmeans_assign(X, X[:5])                 # doctest: +SKIP
    >>> int(labels[3])                                                # doctest: +SKIP
    3
    """
    cp = _cp()
    kind = kind_of(X, "X")
    if kind_of(C, "C") != kind or kind not in ("cupy", "torch"):
        raise TypeError("kmeans_assign computes on the GPU: X and C must both be CuPy arrays or torch CUDA tensors")
    Xb, Cb = _c_rows(to_backend(X, "X")), to_backend(C, "C")
    if Cb.ndim != 2 or Cb.shape[1] != Xb.shape[1]:
        raise ValueError(f"C must have shape (k, {Xb.shape[1]}); got {Cb.shape}")
    if Xb.dtype != Cb.dtype or Xb.dtype not in (np.float32, np.float64):
        raise TypeError(f"X and C must both be float32 or both float64; got {Xb.dtype}, {Cb.dtype}")
    Cb = cp.ascontiguousarray(Cb)
    if Cb.data.ptr % 16:  # the kernels read C in 16-byte vectors
        Cb = Cb.copy()
    n = Xb.shape[0]
    cn = (Cb.astype(np.float64) ** 2).sum(1).astype(Cb.dtype)
    labels = cp.empty(n, dtype=cp.int32)
    mind = cp.empty(n, dtype=Xb.dtype)
    changed = cp.zeros(1, dtype=cp.int32)
    _assign(Xb, Cb, cn, labels, mind, changed, method=method)
    return wrap(labels, kind), wrap(mind, kind)


# ------------------------------------------------------------------ centroid sums


ROW_BLOCK = 1024  # rows per block of the direct centroid update
DIRECT_SMEM = 74 * 1024  # three blocks per SM (227 KiB of shared memory on sm_90)
SORT_RW = 256  # rows per warp of the counting sort
SORT_WB = 4  # warps per block of the counting sort


def direct_config(k: int, d: int, dtype, vec: int):
    """(VEC, W, shared bytes) of kmeans_sums_direct, or None where k is too large
    for per-warp accumulators (the sorted route then). The widest vector first: it
    reads 32*VEC contiguous elements of a row per warp."""
    item = np.dtype(dtype).itemsize
    v = vec
    while v >= 1:
        for w in (8, 4):
            smem = w * k * (32 * v + 1) * item
            if smem <= DIRECT_SMEM:
                return v, w, smem
        v //= 2
    return None


def update_route(k: int, d: int, dtype, vec: int = 1) -> str:
    """'direct' where eight warps with full 16-byte vectors fit their accumulators in
    shared memory (measured on the H100: at (1e5, 4096, 16) it reads X at ~2.8 TB/s;
    with narrower slices or 4 warps, k=64 d=256, the sorted route was faster, 0.44
    against 0.69 ms); 'sorted' otherwise. ``TSM_KMEANS_UPDATE`` overrides it."""
    import os

    forced = os.environ.get("TSM_KMEANS_UPDATE")
    if forced in ("direct", "sorted"):
        if forced == "direct" and direct_config(k, d, dtype, vec) is None:
            raise ValueError(f"k={k} is too large for the direct centroid update")
        return forced
    cfg = direct_config(k, d, dtype, vec)
    full = cfg is not None and cfg[0] == 16 // np.dtype(dtype).itemsize and cfg[1] == 8
    return "direct" if full else "sorted"


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
    """Weighted sum of the rows of each cluster and the clusters' total weights.

    Parameters
    ----------
    X : CuPy array or torch CUDA tensor, shape (n, d)
    labels : same kind, (n,) integers in [0, k)
    k : int
    sample_weight : same kind, (n,), optional
    check_labels : bool
        Check that every label lies in [0, k) (a reduction and a host round trip;
        out-of-range labels would write out of bounds).

    Returns
    -------
    sums : (k, d) float64;  weights : (k,) float64. Bit-identical from run to run.

    Examples
    --------
    >>> import cupy as cp, tsm_core                                   # doctest: +SKIP
    >>> X = cp.arange(6.0).reshape(3, 2)                              # doctest: +SKIP
    >>> s, w = tsm_core.kmeans_centroid_sums(X, cp.array([0, 1, 0]), 2)  # doctest: +SKIP
    >>> s.tolist(), w.tolist()                                        # doctest: +SKIP
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


# ------------------------------------------------------------------ data sources


class _DeviceSource:
    """X already in GPU memory: one chunk, the whole of it."""

    streamed = False

    def __init__(self, X):
        self.X = _c_rows(X)
        self.n, self.d = self.X.shape
        self.dtype = self.X.dtype
        self.max_rows = self.n
        self._xx = None

    def chunks(self):
        yield 0, self.X

    def rows(self, idx):
        return self.X[_cp().asarray(idx)]

    def xx(self, a, Xc):
        """Row norms of chunk Xc starting at row a: computed once, X does not change."""
        if self._xx is None:
            self._xx = _row_sqnorm(self.X, _cp().empty(self.n, dtype=self.dtype))
        return self._xx[a:a + Xc.shape[0]]

    def close(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class _HostSource:
    """X in host memory, streamed through two device buffers.

    The host array is page-locked in place (cudaHostRegister) so that the copies
    are asynchronous DMA at full link speed without an extra host copy; where that
    is refused, two pinned staging buffers take the copy (the host memcpy of chunk
    i+1 then overlaps the GPU's work on chunk i). The copy of chunk i+1 runs on its
    own stream while chunk i is computed on the current one."""

    streamed = True

    def __init__(self, X: np.ndarray, chunk_rows: int):
        cp = _cp()
        if not X.flags.c_contiguous:
            X = np.ascontiguousarray(X)
        self.X = X
        self.n, self.d = X.shape
        self.dtype = X.dtype
        self.max_rows = max(1, min(self.n, int(chunk_rows)))
        self.starts = list(range(0, self.n, self.max_rows))
        self.bufs = [cp.empty((self.max_rows, self.d), dtype=X.dtype) for _ in range(2)]
        self.copy_stream = cp.cuda.Stream(non_blocking=True)
        self.copied = [cp.cuda.Event(disable_timing=True) for _ in range(2)]
        self.freed = [cp.cuda.Event(disable_timing=True) for _ in range(2)]
        self.staged = [None, None]
        self.registered = False
        try:
            if X.nbytes:
                cp.cuda.runtime.hostRegister(X.ctypes.data, X.nbytes, 0)
                self.registered = True
        except Exception:  # not permitted / not supported: stage through pinned buffers
            import cupyx

            self.staging = [cupyx.empty_pinned((self.max_rows, self.d), dtype=X.dtype) for _ in range(2)]
            self.staged_ev = [None, None]

    def _copy(self, i: int):
        cp = _cp()
        a = self.starts[i]
        b = min(self.n, a + self.max_rows)
        slot = i % 2
        dst = self.bufs[slot]
        nbytes = (b - a) * self.d * self.X.itemsize
        with self.copy_stream:
            self.copy_stream.wait_event(self.freed[slot])
            if self.registered:
                src = self.X.ctypes.data + a * self.d * self.X.itemsize
            else:
                ev = self.staged_ev[slot]
                if ev is not None:
                    ev.synchronize()  # the DMA out of this staging buffer has finished
                np.copyto(self.staging[slot][: b - a], self.X[a:b])
                src = self.staging[slot].ctypes.data
            cp.cuda.runtime.memcpyAsync(dst.data.ptr, src, nbytes, cp.cuda.runtime.memcpyHostToDevice,
                                        self.copy_stream.ptr)
            self.copied[slot].record(self.copy_stream)
            if not self.registered:
                ev = cp.cuda.Event(disable_timing=True)
                ev.record(self.copy_stream)
                self.staged_ev[slot] = ev

    def chunks(self):
        """Yield (first row, device chunk). The caller must enqueue all its work on the
        chunk (on the current stream) before asking for the next one."""
        cp = _cp()
        cs = cp.cuda.get_current_stream()
        m = len(self.starts)
        for slot in range(2):
            self.freed[slot].record(cs)
        self._copy(0)
        for i in range(m):
            if i >= 1:
                self.freed[(i - 1) % 2].record(cs)  # the work on chunk i-1 is enqueued
            if i + 1 < m:
                self._copy(i + 1)
            cs.wait_event(self.copied[i % 2])
            a = self.starts[i]
            b = min(self.n, a + self.max_rows)
            yield a, self.bufs[i % 2][: b - a]
        self.freed[(m - 1) % 2].record(cs)

    def rows(self, idx):
        return _cp().asarray(self.X[np.asarray(idx)])

    def xx(self, a, Xc):
        return _row_sqnorm(Xc, _cp().empty(Xc.shape[0], dtype=self.dtype))

    def close(self):
        cp = _cp()
        cp.cuda.get_current_stream().synchronize()
        self.copy_stream.synchronize()
        if self.registered:
            cp.cuda.runtime.hostUnregister(self.X.ctypes.data)
            self.registered = False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def kmeans_source(X, *, max_gpu_memory=None, n_clusters=8):
    """X prepared for `kmeans_lloyd` / `kmeans_plusplus`: in GPU memory, moved there
    once, or streamed from host memory in chunks. Close it (or use ``with``) to
    release the host pages a streamed X keeps locked.

    Parameters
    ----------
    X : numpy array, CuPy array or torch CUDA tensor, shape (n, d)
    max_gpu_memory : int, optional
        Bytes of GPU memory the fit may use (default: 70% of the free memory).
    n_clusters : int
        Used to size the streamed chunks (the dot-product block grows with k).

    Examples
    --------
    >>> import numpy as np, tsm_core                                   # doctest: +SKIP
    >>> X = np.random.default_rng(0).standard_normal((100000, 64), dtype=np.float32)  # doctest: +SKIP
    >>> with tsm_core.kmeans_source(X, max_gpu_memory=8 << 20) as src:  # doctest: +SKIP
    ...     labels, inertia, C, it = tsm_core.kmeans_lloyd(src, X[:4], max_iter=5)
    """
    if isinstance(X, (_DeviceSource, _HostSource)):
        return X
    if not isinstance(X, np.ndarray):
        X = to_backend(X, "X")
    return make_source(X, max_gpu_memory=max_gpu_memory, k=n_clusters)


def make_source(X, *, max_gpu_memory=None, k=8):
    """The data source for X: GPU-resident, moved once, or streamed in chunks.

    X : numpy (host) or CuPy array. A numpy X larger than about half the budget
    (`max_gpu_memory` bytes, default 70% of the free device memory) is streamed:
    two chunk buffers of about a quarter of the budget each."""
    cp = _cp()
    if isinstance(X, cp.ndarray):
        return _DeviceSource(X)
    free = cp.cuda.runtime.memGetInfo()[0]
    budget = int(max_gpu_memory) if max_gpu_memory is not None else int(0.7 * free)
    n, d = X.shape
    item = X.dtype.itemsize
    per_row_state = 4 + item + 8  # labels, min distance, weight
    if X.nbytes + n * per_row_state <= budget // 2:
        return _DeviceSource(cp.asarray(X))
    avail = max(budget - n * per_row_state, budget // 4)
    # Each chunk: its buffer, the dot products (cuBLAS route), the update's partials.
    per_row = d * item + min(k, 4096) * item + 8 * d / PIECE + 16
    rows = max(1, int(avail / 4 / per_row))
    if rows > ROW_BLOCK:
        rows -= rows % ROW_BLOCK  # chunks of whole row blocks: sums as in memory
    return _HostSource(X, rows)


# ------------------------------------------------------------------ k-means++


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


# ------------------------------------------------------------------ Lloyd


class _Lloyd:
    """State of one Lloyd run over a source: labels, distances, centres, workspace."""

    def __init__(self, src, k: int, sample_weight, method: str):
        cp = _cp()
        self.src, self.k = src, k
        n, d = src.n, src.d
        self.method = choose_method(k, d) if method == "auto" else method
        if method == "auto" and self.method == "tile":
            self.method = None  # tile or cuBLAS: decided on the first chunk (auto_method)
        self.labels = cp.full(n, -1, dtype=cp.int32)
        self.mind = cp.empty(n, dtype=src.dtype)
        self.w = sample_weight  # CuPy (n,) of X's dtype, or None (all ones)
        self.changed = cp.zeros(1, dtype=cp.int32)
        self.sums = cp.empty((k, d), dtype=cp.float64)
        self.wsum = cp.empty(k, dtype=cp.float64)
        self.work = _Sums(src.max_rows, d, k, src.dtype)
        self.shift2 = cp.empty(k, dtype=cp.float64)
        self.status = cp.empty(3, dtype=cp.float64)
        self.status_host = None  # pinned copy of status (finalize with wait=False)
        self.dbuf = None
        c = _compile.ctype(src.dtype)
        self.k_final = _kernel(f"kmeans_finalize<{c}>")
        self.k_status = _kernel("kmeans_status<256>")

    def assign_chunk(self, a, Xc, C, cn, labels, mind, prev):
        """Assign rows a.. of X (the chunk Xc) to C; `labels`, `mind` and `prev` are
        full-length (n,) arrays (`prev` may be `labels`: updated in place)."""
        b = a + Xc.shape[0]
        if self.method is None:
            self.method = auto_method(Xc, C, cn)
        # Row norms: computed once for X in GPU memory, per chunk when streamed;
        # not at all for the fused kernel and v2 of the tile kernel (they sum them).
        need_xx = self.method == "gemm" or (self.method == "tile" and _tile_needs_xx())
        xx = self.src.xx(a, Xc) if need_xx else None
        if self.method == "gemm" and self.dbuf is None:
            rows = max(1, min(self.src.max_rows, GEMM_BATCH_BYTES // (self.k * Xc.itemsize)))
            self.dbuf = _cp().empty((rows, self.k), dtype=Xc.dtype)
        _assign(Xc, C, cn, labels[a:b], mind[a:b], self.changed, prev=prev[a:b], method=self.method,
                xx=xx, dbuf=self.dbuf)

    def pass_over(self, C, cn, update: bool):
        """Assign every row to C (labels, mind, changed flag); with `update`, the sums."""
        # The changed flag is 0 here: made so, and reset by every kmeans_status.
        first = True
        for a, Xc in self.src.chunks():
            b = a + Xc.shape[0]
            self.assign_chunk(a, Xc, C, cn, self.labels, self.mind, self.labels)
            if update:
                w = self.w[a:b] if self.w is not None else None
                # Chunks add to the sums in row order (deterministic).
                self.work.run(Xc, self.labels[a:b], w, self.sums, self.wsum, acc=not first)
            first = False
        if not update:
            self.changed.fill(0)

    def finalize(self, C_old, C_new, cn, wait: bool = True):
        """New centres, their norms and the status [total squared shift, empty clusters,
        changed flag] (the flag is reset). `wait`: return the status (a host round
        trip); else its copy to host memory is queued, `status_wait` returns it."""
        cp = _cp()
        k, d = C_old.shape
        threads = 1 << max(5, min(10, (d - 1).bit_length()))
        self.k_final((k,), (threads,), (self.sums, self.wsum, C_old, np.int32(d), C_new, cn, self.shift2))
        self.k_status((1,), (256,), (self.shift2, self.wsum, np.int32(k), self.changed, self.status))
        if wait:
            return self.status.get()
        if self.status_host is None:
            import cupyx

            self.status_host = cupyx.empty_pinned(3, dtype=np.float64)
            self.status_ev = cp.cuda.Event(disable_timing=True)
        stream = cp.cuda.get_current_stream()
        cp.cuda.runtime.memcpyAsync(self.status_host.ctypes.data, self.status.data.ptr, self.status.nbytes,
                                    cp.cuda.runtime.memcpyDeviceToHost, stream.ptr)
        self.status_ev.record(stream)
        return None

    def status_wait(self):
        self.status_ev.synchronize()
        return self.status_host.copy()

    def relocate_empty(self, n_empty: int):
        """sklearn's relocation: each empty cluster takes one of the points farthest
        from their centres (the largest first, the smaller index on ties); the point's
        weight moves from its old cluster to the empty one. Rare: done with CuPy ops."""
        cp = _cp()
        empty = cp.asnumpy(cp.nonzero(self.wsum == 0)[0])[:n_empty]
        # argsort is a stable radix sort: equal distances keep the smaller index first.
        far = cp.asnumpy(cp.argsort(-self.mind.astype(cp.float64))[: len(empty)])
        rows = self.src.rows(far).astype(cp.float64)
        wts = self.w[cp.asarray(far)].astype(cp.float64) if self.w is not None else cp.ones(len(far))
        old = cp.asnumpy(self.labels[cp.asarray(far)])
        for i, new_id in enumerate(empty):
            o = int(old[i])
            self.sums[o] -= rows[i] * wts[i]
            self.sums[int(new_id)] = rows[i] * wts[i]
            self.wsum[int(new_id)] = wts[i]
            self.wsum[o] -= wts[i]

    def inertia(self) -> float:
        cp = _cp()
        m = self.mind.astype(cp.float64)
        if self.w is not None:
            m = m * self.w.astype(cp.float64)
        return float(m.sum())


def _lloyd_overlapped(run, C, cn, C_new, cn_new, max_iter, tol, verbose):
    """The Lloyd loop of `kmeans_lloyd` for X in GPU memory, without an idle GPU
    while the host reads each iteration's status.

    The assignment to the new centres is queued right after the update, before the
    host waits for the status, into a second label / distance buffer (prev = the
    current labels, so the changed flag means the same). Depending on the status it
    is the next iteration's assignment, or the final assignment that the loop would
    run after a tolerance stop or at max_iter; on strict convergence it is dropped
    and the current buffers are returned; when a cluster is empty the centres are
    redone after the relocation and the assignment queued again. Same results (bit
    for bit) as the plain loop and the same passes over X, but for one assignment
    more on strict convergence. Returns (centres, last iteration)."""
    cp = _cp()
    X = run.src.X
    lab = [run.labels, cp.empty_like(run.labels)]
    md = [run.mind, cp.empty_like(run.mind)]
    cur = 0
    run.assign_chunk(0, X, C, cn, lab[0], md[0], lab[0])
    i = 0
    for i in range(max_iter):
        run.labels, run.mind = lab[cur], md[cur]  # relocate_empty and inertia read these
        run.work.run(X, lab[cur], run.w, run.sums, run.wsum)
        run.finalize(C, C_new, cn_new, wait=False)
        nxt = 1 - cur
        run.assign_chunk(0, X, C_new, cn_new, lab[nxt], md[nxt], lab[cur])
        shift_tot, n_empty, changed = run.status_wait()
        if n_empty > 0:
            run.relocate_empty(int(n_empty))
            # The flag was read by the first finalize: keep that value. The second
            # resets the one the speculative assignment set; the redone one sets it again.
            shift_tot, _, _ = run.finalize(C, C_new, cn_new)
            run.assign_chunk(0, X, C_new, cn_new, lab[nxt], md[nxt], lab[cur])
        if verbose:
            print(f"Iteration {i}, inertia {run.inertia()}.")
        C, C_new = C_new, C
        cn, cn_new = cn_new, cn
        if not changed:
            if verbose:
                print(f"Converged at iteration {i}: strict convergence.")
            break  # labels of this iteration (lab[cur]), as the plain loop returns
        cur = nxt
        if shift_tot <= tol:
            if verbose:
                print(f"Converged at iteration {i}: center shift {shift_tot} within tolerance {tol}.")
            break
    run.labels, run.mind = lab[cur], md[cur]
    return C, i


def kmeans_lloyd(X, centers, *, sample_weight=None, max_iter=300, tol=0.0, verbose=0,
                 max_gpu_memory=None, method="auto"):
    """Lloyd's k-means from `centers`, with scikit-learn's stopping rules, on the GPU.

    Each iteration assigns every row to its nearest centre and moves every centre to
    the weighted mean of its rows (empty clusters take the farthest points, as in
    scikit-learn). It stops when no label changed ("strict convergence") or when the
    sum of squared centre shifts is <= `tol` (an absolute tolerance: scale it as
    scikit-learn does before calling), or after `max_iter` iterations; unless it
    stopped on unchanged labels, a last assignment makes the labels match the
    returned centres. With X in GPU memory the next assignment is queued before the
    host reads an iteration's status, so the GPU does not wait for the host
    (``TSM_KMEANS_OVERLAP=0``: the plain loop, same results).

    Parameters
    ----------
    X : CuPy array or torch CUDA tensor (in GPU memory), numpy array (moved to the
        GPU once, or streamed in chunks when larger than the memory budget), or a
        `kmeans_source` (reused across runs); (n, d)
    centers : (k, d) array (any kind), the initial centres
    sample_weight : (n,) array, optional
    max_iter : int;  tol : float;  verbose : int (a line per iteration)
    max_gpu_memory : int, optional. Bytes of GPU memory the fit may use (default 70%
        of the free memory); a numpy X that does not fit is streamed.
    method : {"auto", "fused", "tile", "gemm"}, see `kmeans_assign`.

    Returns
    -------
    labels : (n,) CuPy int32;  inertia : float;  centers : (k, d) CuPy;  n_iter : int

    Examples
    --------
    >>> import cupy as cp, tsm_core                                   # doctest: +SKIP
    >>> X = cp.random.standard_normal((10000, 600), dtype=cp.float32) # doctest: +SKIP
    >>> labels, inertia, C, n_iter = tsm_core.kmeans_lloyd(X, X[:8], max_iter=20)  # doctest: +SKIP
    """
    import os

    cp = _cp()
    own = not isinstance(X, (_DeviceSource, _HostSource))
    src = kmeans_source(X, max_gpu_memory=max_gpu_memory, n_clusters=len(centers))
    try:
        Cin = centers if isinstance(centers, np.ndarray) else to_backend(centers, "centers")
        C = cp.array(Cin, dtype=src.dtype, order="C", copy=True)
        k = C.shape[0]
        if C.ndim != 2 or C.shape[1] != src.d:
            raise ValueError(f"centers must have shape (k, {src.d}); got {C.shape}")
        w = None
        if sample_weight is not None:
            w = cp.ascontiguousarray(cp.asarray(
                sample_weight if isinstance(sample_weight, np.ndarray) else to_backend(sample_weight, "sample_weight")),
                dtype=src.dtype)
        run = _Lloyd(src, k, w, method)
        cn = (C.astype(cp.float64) ** 2).sum(1).astype(src.dtype)
        C_new = cp.empty_like(C)
        cn_new = cp.empty_like(cn)
        if not src.streamed and os.environ.get("TSM_KMEANS_OVERLAP", "1") != "0":
            C, i = _lloyd_overlapped(run, C, cn, C_new, cn_new, max_iter, tol, verbose)
            return run.labels, run.inertia(), C, i + 1
        strict = False
        i = 0
        for i in range(max_iter):
            run.pass_over(C, cn, update=True)
            shift_tot, n_empty, changed = run.finalize(C, C_new, cn_new)
            if n_empty > 0:
                run.relocate_empty(int(n_empty))
                # The flag was read (and reset) by the first finalize: keep that value.
                shift_tot, _, _ = run.finalize(C, C_new, cn_new)
            if verbose:
                print(f"Iteration {i}, inertia {run.inertia()}.")
            C, C_new = C_new, C
            cn, cn_new = cn_new, cn
            if not changed:
                if verbose:
                    print(f"Converged at iteration {i}: strict convergence.")
                strict = True
                break
            if shift_tot <= tol:
                if verbose:
                    print(f"Converged at iteration {i}: center shift {shift_tot} within tolerance {tol}.")
                break
        if not strict:
            run.pass_over(C, cn, update=False)
        return run.labels, run.inertia(), C, i + 1
    finally:
        if own:
            src.close()
