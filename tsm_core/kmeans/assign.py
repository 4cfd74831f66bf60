"""The assignment step: the nearest centre of every row and its squared distance.

Three routes (``configs.choose_method``): the fused kernel (k <= 32, d >= 512), the
SIMT GEMM tile kernel with the argmin in its epilogue, and cuBLAS dot products in
row batches plus ``kmeans_argmin_rows``. Between the last two the choice is
measured once per shape and process (``auto_method``).
"""

from __future__ import annotations

import warnings

import numpy as np

from tsm_core.kmeans.configs import (FUSED_KMAX, GEMM_BATCH_BYTES, PACKED_KP, choose_method, choose_route,
                                     fused_config, fused_name, packed_config, resolve_precision, storage_dtype,
                                     tile_config, tile_name, tile_needs_xx, tile_version, x_itemsize)
from tsm_core.kmeans.launch import FAMILY, NULL, _c_rows, _cp, _kernel, _vec_for
from tsm_core.kmeans.tensor import (TensorAssign, aligned_copy, bfloat16_to_float32, ready,
                                    to_bfloat16_words)
from tsm_core.kmeans.update import half_view, packed_assign
from tsm_core.runtime import compile as _compile
from tsm_core.runtime import config, timing
from tsm_core.runtime.arrays import kind_of, to_backend, wrap
from tsm_core.runtime.log import get_logger
from tsm_core.runtime.tune import Tuner

_log = get_logger(__name__)


# The tile / cuBLAS choice, once per process and key (k, d, dtype, vector width, tile
# version): measured on the caller's data, so not kept on disk.
_TUNER = Tuner(FAMILY, persistent=False)


def auto_method(X, C, cn, xx=None) -> str:
    """choose_method, with the 'tile' / 'gemm' choice measured once per (k, d, dtype)
    on up to 2^17 rows of X (`xx`: their squared norms, made there when None), like
    the dispatcher's check against cuBLAS: the tile kernel is used where it is faster
    and agrees with cuBLAS (distances to rounding, labels on >= 99% of the rows: they
    may differ on near-ties); otherwise cuBLAS, with a warning when they disagree.
    ``TSM_KMEANS_ASSIGN`` forces a method."""
    k, d = C.shape
    m = choose_method(k, d)
    if m != "tile":
        return m
    forced = config.text("TSM_KMEANS_ASSIGN")
    if forced in ("tile", "gemm"):
        return forced
    key = (k, d, X.dtype.str, _vec_for(X, X.itemsize), tile_version())
    choice = _TUNER.lookup(key)
    if choice is None:
        choice = _tune_tile(X, C, cn, xx)
        _TUNER.remember(key, choice)
    return choice


def _tune_tile(X, C, cn, xx=None) -> str:
    """'tile' or 'gemm' for X's shape: cuBLAS where the tile kernel disagrees with it
    (warned) or is slower (``timing.time_fn``, median of 3 samples each)."""
    cp = _cp()
    rows = min(X.shape[0], 1 << 17)
    Xs = X[:rows]
    xs = xx[:rows] if xx is not None else _row_sqnorm(Xs, cp.empty(rows, dtype=X.dtype))
    out, runs = {}, {}
    for m in ("gemm", "tile"):
        labels = cp.empty(rows, dtype=cp.int32)
        mind = cp.empty(rows, dtype=X.dtype)
        ch = cp.zeros(1, dtype=cp.int32)

        def run(m=m, labels=labels, mind=mind, ch=ch):
            _assign(Xs, C, cn, labels, mind, ch, method=m, xx=xs)

        run()  # compile, and the result to compare
        runs[m] = run
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
    ms = {m: timing.time_fn(fn, warmup=1, reps=3).median_s for m, fn in runs.items()}
    choice = "tile" if ms["tile"] <= ms["gemm"] else "gemm"
    _log.debug("assignment route for k=%d, d=%d, %s: %s (tile %.3g ms, cuBLAS %.3g ms)",
               C.shape[0], C.shape[1], X.dtype, choice, 1e3 * ms["tile"], 1e3 * ms["gemm"])
    return choice


def _row_sqnorm(X, out):
    """||x||^2 of every row of X into `out` (n,), X's dtype."""
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


def _assign(X, C, cn, labels, mind, changed, *, prev=None, method="auto", xx=None, dbuf=None, tc=None):
    """Launch the assignment of X's rows (CuPy, C rows) to centres C (k, d) contiguous.

    labels (int32) and mind (X.dtype) have n entries; `prev` (may be `labels`) feeds the
    changed flag (int32, one element, set to 1 when a label differs). `xx` (row norms) and
    `dbuf` (dot-product block) serve the cuBLAS route (and v1 of the tile kernel) and are
    made here when None; v2 of the tile kernel sums ||x||^2 itself. `tc`: the
    prepared ``tensor.TensorAssign`` of the "mma" route."""
    cp = _cp()
    n, d = X.shape
    k = C.shape[0]
    if n == 0:
        return
    if method == "mma":
        tc.run(X, labels, mind, changed, prev)
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
    if method == "tile" and not tile_needs_xx():
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


def kmeans_assign(X, C, *, method="auto", precision=None):
    """Nearest centre of each row of X and the squared distance to it, on the GPU.

    X has shape (n, d) and C (k, d); both stay on the GPU. Ties go to the smaller
    centre index.

    Parameters
    ----------
    X : cupy.ndarray or torch.Tensor (CUDA), shape (n, d)
        The rows, float32 or float64 (any row stride; a unit column stride is
        needed, else X is copied once).
    C : cupy.ndarray or torch.Tensor (CUDA), shape (k, d)
        The centres, same kind and dtype as X.
    method : {"auto", "fused", "tile", "gemm", "mma", "packed"}, default="auto"
        "fused": one kernel reads X once and keeps the distances in registers
        (k <= 32); "tile": a SIMT GEMM tile kernel with the argmin in its epilogue
        (any k); "gemm": cuBLAS dot products in row batches, then an argmin kernel;
        "mma": the tensor cores, the argmin fused (precisions other than float64);
        "packed": several short rows a warp (d <= 128 in float32, 256 in 16 bits)
        against k <= 32 centres, distances from the differences in float32 (any
        precision but float64; in a fit the centroid sums come in the same pass).
        "auto" picks by (k, d, precision) and, for float64 between tile and gemm, by
        a measurement made once per shape in the process (``TSM_KMEANS_ASSIGN``
        forces one).
    precision : {"float32", "tf32", "bfloat16", "float16", "float64"}, optional
        How the distances are computed (default: X's dtype). "float32": labels
        as trustworthy as exact float32 evaluation (tensor-core products, and rows
        whose two best centres lie within the products' error bound decided again in
        float64); "tf32": tensor-core products only (near ties may differ);
        "bfloat16" / "float16": X held in 16 bits (converted once if it is not),
        float32 accumulation; "float64": float64 rows, exact. See the k-means guide.

    Returns
    -------
    labels : array of shape (n,), int32, X's kind
        The index of the nearest centre.
    mind : array of shape (n,), X's kind
        ``||x - c_label||^2``, computed as ``||x||^2 - 2 x.c + ||c||^2`` (from the
        differences on the packed route): float64 for precision "float64", else
        float32.

    Raises
    ------
    TypeError
        X and C are not both CuPy arrays or both torch CUDA tensors, or not
        floating point.
    ValueError
        X is not 2-D, C's shape does not match, an unknown `method` or
        `precision`, a precision X's dtype cannot give, "fused" with k > 32, or
        "packed" with k > 32 or longer rows.

    See Also
    --------
    kmeans_lloyd : the whole Lloyd iteration.

    Examples
    --------
    >>> import numpy as np, tsm_core
    >>> X = np.array([[0.0, 0.0], [5.0, 5.0], [0.2, 0.0]])
    >>> C = np.array([[0.0, 0.0], [5.0, 5.0]])
    >>> if tsm_core.has_gpu():
    ...     import cupy as cp
    ...     labels, d2 = tsm_core.kmeans_assign(cp.asarray(X), cp.asarray(C))
    ...     labels, d2 = labels.get(), d2.get()
    ... else:  # the same result from numpy
    ...     D = ((X[:, None, :] - C[None]) ** 2).sum(-1)
    ...     labels, d2 = D.argmin(1), D.min(1)
    >>> labels.tolist(), np.round(d2, 6).tolist()
    ([0, 1, 0], [0.0, 0.0, 0.04])
    """
    cp = _cp()
    kind = kind_of(X, "X")
    if kind_of(C, "C") != kind or kind not in ("cupy", "torch"):
        raise TypeError("kmeans_assign computes on the GPU: X and C must both be CuPy arrays or torch CUDA tensors")
    Xb, xdt = device_rows(X, "X")
    Xb = _c_rows(Xb)
    Cb, _ = device_rows(C, "C")
    if Cb.ndim != 2 or Cb.shape[1] != Xb.shape[1]:
        raise ValueError(f"C must have shape (k, {Xb.shape[1]}); got {Cb.shape}")
    precision = resolve_precision(precision, xdt)
    n, d = Xb.shape
    k = Cb.shape[0]
    route = choose_route(k, d, precision) if method == "auto" else method
    if route not in ("fused", "tile", "gemm", "mma", "packed"):
        raise ValueError(f"method must be 'auto', 'fused', 'tile', 'gemm', 'mma' or 'packed'; got {method!r}")
    tensor = route in ("mma", "packed")
    if tensor and precision == "float64" or not tensor and precision in ("bfloat16", "float16"):
        raise ValueError(f"method={route!r} does not compute in precision {precision!r}")
    if route == "packed" and packed_config(k, d, storage_dtype(precision), sums=False) is None:
        raise ValueError(f"method='packed' takes k <= {PACKED_KP[-1]} centres and rows of one slice "
                         f"(d <= {32 * 16 // x_itemsize(storage_dtype(precision))} in {storage_dtype(precision)}); "
                         f"got k={k}, d={d}")
    labels = cp.empty(n, dtype=cp.int32)
    changed = cp.zeros(1, dtype=cp.int32)
    if route == "packed":
        Xs = storage_rows(Xb, xdt, precision)
        mind = cp.empty(n, dtype=cp.float32)
        packed_assign(Xs, storage_dtype(precision), _centres32(Cb), labels, mind, changed,
                      exact=precision == "float32")
        return wrap(labels, kind), wrap(mind, kind)
    if route == "mma":
        Xs = storage_rows(Xb, xdt, precision)
        C32 = _centres32(Cb)
        mind = cp.empty(n, dtype=cp.float32)
        tc = TensorAssign(n, d, k, precision)
        tc.prepare(C32)
        _assign(Xs, C32, None, labels, mind, changed, method="mma", tc=tc)
        return wrap(labels, kind), wrap(mind, kind)
    # The exact SIMT routes: float64 rows, or float32 rows (float32 / tf32).
    if precision == "float64" and Cb.dtype != Xb.dtype:
        raise TypeError(f"X and C must both be float32 or both float64; got {xdt}, {Cb.dtype}")
    Xs = Xb if precision == "float64" or xdt == "float32" else Xb.astype(np.float32)
    Cs = cp.ascontiguousarray(Cb, dtype=Xs.dtype)
    if Cs.data.ptr % 16:  # the kernels read C in 16-byte vectors
        Cs = Cs.copy()
    cn = (Cs.astype(np.float64) ** 2).sum(1).astype(Cs.dtype)
    mind = cp.empty(n, dtype=Xs.dtype)
    # float64's "auto" measures tile against cuBLAS (auto_method) on the way.
    _assign(Xs, Cs, cn, labels, mind, changed, method=method if precision == "float64" else route)
    return wrap(labels, kind), wrap(mind, kind)


def _centres32(C):
    """C (k, d) as float32, C order, 16-byte aligned (16-bit words become float32)."""
    cp = _cp()
    if C.dtype == cp.uint16:  # bfloat16 words
        C = bfloat16_to_float32(C)
    C = cp.ascontiguousarray(C, dtype=cp.float32)
    if C.data.ptr % 16:
        C = C.copy()
    return C


def device_rows(X, name="X"):
    """(CuPy array, dtype name) of a CuPy array or torch CUDA tensor; torch bfloat16
    becomes its uint16 words (CuPy has no bfloat16), named "bfloat16"
    (``update.half_view``)."""
    Xh, t = half_view(X)
    Xb = to_backend(Xh, name)
    return (Xb.view(np.uint16) if t == "bfloat16" else Xb), t


def storage_rows(Xb, xdt: str, precision: str):
    """X in the storage `precision` needs, rows 16-byte aligned (converted or copied
    once where they are not): float32 words for float32/tf32, uint16 bfloat16
    words or float16 for the 16-bit precisions."""
    cp = _cp()
    want = storage_dtype(precision)
    if want == xdt:
        Xs = Xb
    elif want == "float32":
        Xs = Xb.astype(cp.float32)
    elif want == "bfloat16":
        Xs = to_bfloat16_words(Xb if xdt != "float16" else Xb.astype(cp.float32))
    else:  # float16
        Xs = (bfloat16_to_float32(Xb) if xdt == "bfloat16" else Xb).astype(cp.float16)
    if not ready(Xs):
        Xs = aligned_copy(Xs)
    return Xs
