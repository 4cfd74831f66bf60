"""row_checksums(): the fused checksum + sum-of-squares pass of ABFT (abft/abft.cu).

One read of a matrix X (m, p) gives, per row, c checksums ``X @ V`` and the sums
of squares a round-off bound needs, both accumulated in float64. apps/abft's
``ft_matmul`` verifies a product with three such passes (over B, A and C); the
sums of squares ride along with the checksums instead of costing three more passes.

The checksum weights, when not given, are generated inside the kernel from the
column index (no memory traffic): ``W[j, 0] = 1``, ``W[j, q] = W[j, q-1] * x_j``
with ``x_j = (j + 1) / p``; ``checksum_weights`` builds the same numbers on the host.
"""

from __future__ import annotations

import numpy as np

from tsm_core.runtime import arrays as _arrays
from tsm_core.runtime import compile as _compile

MAX_C = 4  # checksums per row: R * 2c float64 partial sums per thread stay in registers
_NT = 256  # threads per block, as in abft/abft.cu


def checksum_weights(p: int, c: int, xp=np):
    """The (p, c) float64 weights the checksum kernel generates: ones, then powers of (j+1)/p.

    Column 0 is all ones (plain sums); column q >= 1 is ``x_j ** q`` computed as
    repeated products, with ``x_j = (j + 1) / p`` in (0, 1]: distinct per column
    index (so that one mismatch locates its column) and never larger than 1 (no
    growth of the checksums with p).

    Parameters
    ----------
    p : int
        Rows of the weight matrix (the columns of the matrix being checksummed).
    c : int
        Weight columns (checksums per row).
    xp : module, default=numpy
        The array module to build them with (numpy or cupy).

    Returns
    -------
    W : array of shape (p, c), float64
        The weights, an array of `xp`.

    Raises
    ------
    ValueError
        p or c is negative.

    Examples
    --------
    >>> from tsm_core.abft.checksums import checksum_weights
    >>> checksum_weights(4, 3).tolist()
    [[1.0, 0.25, 0.0625], [1.0, 0.5, 0.25], [1.0, 0.75, 0.5625], [1.0, 1.0, 1.0]]
    """
    p, c = int(p), int(c)
    if p < 0 or c < 0:
        raise ValueError(f"p and c must be >= 0; got p={p}, c={c}")
    x = xp.arange(1, p + 1, dtype=xp.float64) / p
    W = xp.empty((p, c), dtype=xp.float64)
    W[:, 0] = 1.0
    for q in range(1, c):
        W[:, q] = W[:, q - 1] * x
    return W


def _rows_for(c: int) -> int:
    # Rows per block: each row holds 2c float64 partial sums per thread (acc and
    # squares); 4 rows keep 16 loads in flight per thread, and reuse each weight
    # 4 times, without spilling for c <= MAX_C (tests/test_abft.py compiles them all).
    return 4


def kernel_name(dtype, c: int, mode: int) -> str:
    """The instantiation of abft_rows for X's dtype, c checksums and a weight mode
    (0: V given, 1: generated, 2: generated with weighted squares)."""
    return f"abft_rows<{_compile.ctype(dtype)}, {int(c)}, {int(mode)}, {_rows_for(c)}>"


def _row_major(X):
    """X itself if its rows are contiguous (unit column stride, row stride >= p), else a C-ordered copy."""
    item = X.itemsize
    m, p = X.shape
    if p <= 1 or X.strides[1] == item:
        rs = X.strides[0]
        if m <= 1 or (rs % item == 0 and rs // item >= p):
            return X, (rs // item if m > 1 else max(p, 1))
    import cupy

    X = cupy.ascontiguousarray(X)
    return X, p


def row_checksums(X, *, V=None, c=None, weighted_squares=False):
    """Row checksums and sums of squares of X in one pass, in float64.

    X has shape (M, P). With ``V`` (shape (P, C)) given: ``Y = X @ V`` (M, C) and
    ``Z[:, 0] = sum_j X[:, j]**2`` (M, 1). With ``c`` given instead, V is
    ``checksum_weights(P, c)``, generated on the fly; Z is then (M, 1) as before,
    or, with ``weighted_squares=True``, ``Z = (X * X) @ (V * V)`` (M, c). numpy
    inputs are computed on the CPU, CuPy and torch CUDA inputs by one kernel launch.

    Parameters
    ----------
    X : numpy.ndarray, cupy.ndarray or torch.Tensor, shape (M, P)
        float32 or float64. Rows should be contiguous (C order, or a row slice of
        one); any other layout is copied once to C order.
    V : array of X's kind, shape (P, C), optional
        Weights, 1 <= C <= 4. Cast to float64.
    c : int, optional
        Number of generated weight columns, 1 <= c <= 4 (exactly one of V and c).
    weighted_squares : bool, default=False
        Only with ``c``: weight the squares by the squared weights.

    Returns
    -------
    Y : array of shape (M, C), float64
        The checksums ``X @ V``; X's kind (numpy for numpy and torch CPU inputs).
    Z : array of shape (M, 1) or (M, c), float64
        The sums of squares, same kind as Y.

    Raises
    ------
    TypeError
        X is not float32 or float64, V is another kind of array than X, or c is
        not an int.
    ValueError
        X is not 2-D, V's shape does not match, both or neither of V and c are
        given, `weighted_squares` with V, or more than 4 checksums.

    Examples
    --------
    >>> import numpy as np
    >>> from tsm_core.abft.checksums import row_checksums, checksum_weights
    >>> X = np.arange(6.0).reshape(2, 3)
    >>> Y, Z = row_checksums(X, c=2)
    >>> bool(np.allclose(Y, X @ checksum_weights(3, 2))), Z.ravel().tolist()
    (True, [5.0, 50.0])
    """
    kind = _arrays.kind_of(X, "X")
    Xb = _arrays.to_backend(X, "X")
    if Xb.ndim != 2:
        raise ValueError(f"X must be 2-D, got shape {tuple(Xb.shape)}")
    dt = np.dtype(Xb.dtype)
    if dt not in (np.dtype(np.float32), np.dtype(np.float64)):
        raise TypeError(f"X must be float32 or float64, not {dt}")
    if (V is None) == (c is None):
        raise ValueError("give exactly one of V (weights) and c (number of generated weight columns)")
    m, p = Xb.shape
    if V is not None:
        if weighted_squares:
            raise ValueError("weighted_squares needs generated weights (c=...), not V")
        Vb = _arrays.to_backend(V, "V")
        if type(Vb) is not type(Xb):
            raise TypeError("V must be the same kind of array as X")
        if Vb.ndim != 2 or Vb.shape[0] != p:
            raise ValueError(f"V must have shape ({p}, C); got {tuple(Vb.shape)}")
        nc, mode = int(Vb.shape[1]), 0
    else:
        if isinstance(c, bool) or not isinstance(c, (int, np.integer)):
            raise TypeError(f"c must be an int, not {type(c).__name__}")
        nc, mode = int(c), (2 if weighted_squares else 1)
    if not 1 <= nc <= MAX_C:
        raise ValueError(f"the number of checksums must be between 1 and {MAX_C}, got {nc}")
    nz = nc if mode == 2 else 1

    if isinstance(Xb, np.ndarray):
        W = np.asarray(Vb, dtype=np.float64) if mode == 0 else checksum_weights(p, nc)
        with np.errstate(over="ignore", invalid="ignore"):  # Inf and NaN, as the kernel gives
            X64 = Xb.astype(np.float64, copy=False)
            Y = X64 @ W if p else np.zeros((m, nc))
            X2 = X64 * X64
            Z = X2 @ (W * W) if mode == 2 else X2.sum(axis=1, keepdims=True)
        return _wrap(Y, kind), _wrap(Z, kind)

    import cupy

    Y = cupy.empty((m, nc), dtype=cupy.float64)
    Z = cupy.empty((m, nz), dtype=cupy.float64)
    if m == 0:
        return _wrap(Y, kind), _wrap(Z, kind)
    if p == 0:
        Y.fill(0)
        Z.fill(0)
        return _wrap(Y, kind), _wrap(Z, kind)
    Xr, ld = _row_major(Xb)
    Vd = cupy.ascontiguousarray(Vb, dtype=cupy.float64) if mode == 0 else Y  # Y: unused pointer
    R = _rows_for(nc)
    kern = _compile.get_kernel("abft", kernel_name(dt, nc, mode))
    grid = (m + R - 1) // R
    kern((grid,), (_NT,), (Xr, np.int64(m), np.int64(p), np.int64(ld), Vd, Y, Z))
    return _wrap(Y, kind), _wrap(Z, kind)


def _wrap(x, kind):
    return _arrays.wrap(x, kind) if kind.startswith("torch") else x
