"""Regular GEMM and Strassen's algorithm fused into it (tiled/gemm.cu).

Kernels (the optimisation ladder, each checked against the same float64 reference):

- v1 ``gemm_tiled``: 128 x 128 block tile (float64: 64 x 64), 256 threads, an 8 x 8
  (4 x 4) register block per thread, global -> registers -> k-major shared tiles
  (a k-contiguous operand is transposed on the way), two shared buffers, one
  barrier per k-step. The fastest plain kernel on full waves, and the base of the
  fused Strassen products.
  Its wide form (``wn = 4``, float32): 128 x 256, 8 x 16 per thread, one block per
  SM, 5% faster on full waves.
- v2 ``gemm_async``: the same outer products on a 4-stage cp.async pipeline, each
  operand copied in its own layout. Measured slower than v1 at 128 x 128 (H100: 37
  against 43 TFLOP/s), faster at 64 x 64 on problems too small to fill the GPU.

``gemm`` picks among v1 (128 x 128 or 128 x 256) and v2 (64 x 64) by a wave model
(``plan_plain``); a last partial tile row or column of at most 1/8 of a tile goes to
TSM2R (``plan_peel``); v1 is given aligned copies of operands whose leading
dimension is not 16-byte aligned when the product is large enough
(``REALIGN_RATIO``), and splits the tiles of a partial last wave (or of a problem
under half a wave) along k (``plan_tail_split``): no cliff at 1025, 2049 or 4097,
none at 2560 or 3072 from the wave count. ``strassen`` runs one or two levels of
Strassen's algorithm (by default only where a model fitted to measurements predicts
a gain over cuBLAS, ``plan.strassen_levels``; cuBLAS elsewhere) in which every
product is one launch of v1 (or, for float32, of gemm_pipe / gemm_ws) in its fused
form (the paper's ``M = (X + dY)(V + eW); D += g0 M; E += g1 M``, generalised to the
Kronecker product of two levels: up to 4 terms per operand and 4 destinations).

Scheduling and races. Products that add into a common block of C never run at
the same time: the products are split into rounds whose destination sets are
disjoint (greedy colouring), the rounds run in stream order, and each round is
one launch per operand signature (``blockIdx.z`` picks the product). No atomics;
the result is deterministic. The first product to reach a block of C stores into
it (the rest accumulate), so ``out`` is never read and needs no clearing.

Odd sizes: dynamic peeling. Strassen runs on the leading (m', k', n') part, each a
multiple of 2**levels * V (V = 4 float32 or 2 float64 elements: 16-byte blocks); the
remaining rows, columns and the k-remainder are finished by the plain kernels (a
rank-(k - k') update with beta = 1, plus the thin strips of C).

Memory orders: A and B may each be C- or F-ordered or strided with one unit stride;
the kernel reads both layouts directly (a k-contiguous operand is transposed on
its way into shared memory), so nothing is copied. A view with no unit stride is
copied once to C order. ``out`` may have any strides.

The family's modules: ``configs`` (the tuning space and the switches, as data),
``plan`` (pure planning: kernel choice, peeling, split tails, Strassen's products,
rounds and descriptors), ``kernels`` (name expressions, shared-memory sizes, the
instantiation list), ``launch`` (the plain kernels' launches, PDL), ``strassen``
(Strassen's launches) and this one, the public functions.
"""

from __future__ import annotations

import numpy as np

from tsm_core.runtime import arrays as _arrays
from tsm_core.runtime.checks import check_operands
from tsm_core.tiled import configs
from tsm_core.tiled.launch import _plain
from tsm_core.tiled.plan import _strassen_cpu
from tsm_core.tiled.strassen import _launch_strassen, auto_levels

__all__ = ["gemm", "strassen"]


def _empty_cases(ops, xp):
    """Handle m, n or k == 0; returns C or None if there is work for the kernel."""
    m, k, n = ops.m, ops.k, ops.n
    C = ops.out if ops.out is not None else xp.empty((m, n), dtype=ops.dtype)
    if m == 0 or n == 0:
        return C
    if k == 0:
        if ops.out is None or ops.beta == 0.0:
            C.fill(0)
        elif ops.beta != 1.0:
            C *= ops.beta
        return C
    return None


def gemm(A, B, *, out=None, alpha=1.0, beta=0.0):
    """``alpha * A @ B + beta * out`` with tsm_core's tiled GEMM kernel.

    A has shape (M, K), B (K, N), out (M, N). float32 and float64 (mixed inputs
    promote as numpy does); any memory order.

    Parameters
    ----------
    A : array of shape (M, K)
        numpy, CuPy or torch (CPU or CUDA).
    B : array of shape (K, N)
        The same kind as A.
    out : array of shape (M, N), optional
        Written in place; with ``beta == 0`` its old contents are never read (NaN
        in it does not propagate).
    alpha, beta : float
        Scalars of ``C = alpha * A @ B + beta * C``.

    Returns
    -------
    array of shape (M, N), the caller's kind
        ``out`` itself when it was given.

    Raises
    ------
    TypeError
        Operands of different kinds (numpy and CuPy, say), a dtype other than
        float32 / float64, or alpha / beta that are not real numbers.
    ValueError
        Shapes that do not chain (A's K against B's), an ``out`` of the wrong shape,
        dtype or device, a read-only ``out``, or operands on different GPUs.

    Notes
    -----
    numpy inputs (and torch CPU tensors) are computed on the CPU with numpy.
    float64 runs on the FP64 SIMT units; cuBLAS's DGEMM uses the FP64 tensor cores
    (DMMA) on the H100 and is several times faster.

    Examples
    --------
    >>> import numpy as np, tsm_core
    >>> A = np.arange(6.0).reshape(2, 3); B = np.ones((3, 2))
    >>> tsm_core.gemm(A, B, alpha=2.0)
    array([[ 6.,  6.],
           [24., 24.]])
    >>> C = np.ones((2, 2))
    >>> tsm_core.gemm(A, B, out=C, beta=1.0) is C
    True

    On a GPU the same call takes CuPy (or torch CUDA) arrays and returns their kind:

    >>> import cupy as cp  # doctest: +SKIP
    >>> tsm_core.gemm(cp.asarray(A), cp.asarray(B))  # doctest: +SKIP
    array([[ 3.,  3.],
           [12., 12.]])
    """
    ops = check_operands(A, B, out=out, alpha=alpha, beta=beta)
    if ops.xp is np:
        from tsm_core.runtime.cpu import matmul_cpu

        return _arrays.wrap(matmul_cpu(ops), ops.kind, like=out)
    C = _empty_cases(ops, ops.xp)
    if C is None:
        C = ops.out if ops.out is not None else ops.xp.empty((ops.m, ops.n), dtype=ops.dtype)
        beta = ops.beta if ops.out is not None else 0.0
        _plain(ops.A, ops.B, C, ops.alpha, beta)
    return _arrays.wrap(C, ops.kind, like=out)


def strassen(A, B, *, levels="auto", out=None):
    """``A @ B`` by Strassen's algorithm, fused into tsm_core's GEMM kernel, where it
    is faster than cuBLAS; by cuBLAS elsewhere (``levels="auto"``, the default).

    A has shape (M, K), B (K, N), the result (M, N). Each of the 7**levels products
    adds its result into its blocks of C from registers. One level forms its operand
    sums while loading tiles: no workspace (on the H100, two of its products read
    their B sums from blocks of the output not yet written, see SCRATCH1). Two
    levels run as the paper's hybrid for float32 with B contiguous along N and
    16-byte aligned operands: the operand sums of both levels are formed in a
    workspace of (MK + KN) * 9/8 elements (two sets of buffers, so that the sums of
    the next top-level product run beside this one's products); otherwise, or where
    the workspace cannot be allocated, two levels are fused too (no workspace).

    Parameters
    ----------
    A : array of shape (M, K)
        numpy, CuPy or torch (CPU or CUDA); float32 or float64.
    B : array of shape (K, N)
        The same kind as A.
    levels : {"auto", 0, 1, 2}, default="auto"
        Levels of recursion: 7 products of (M/2, K/2, N/2) or 49 of (M/4, K/4, N/4);
        0 is the vendor library's product (``cupy.matmul``: cuBLAS; ``numpy.matmul``
        on the CPU). ``"auto"`` picks 0, 1 or 2 by a model fitted to measurements on
        the H100 (``tiled.plan.strassen_levels``): Strassen only for aligned,
        row-major float32 products where a level measured at least 5% faster than
        cuBLAS (on the H100: two levels from min(M, K, N) = 8192, one from 6144);
        cuBLAS otherwise, and always on other GPUs, for float64, and for numpy.
    out : array of shape (M, N), optional
        Overwritten (never read).

    Returns
    -------
    array of shape (M, N), the caller's kind
        ``out`` itself when it was given.

    Raises
    ------
    ValueError
        ``levels`` other than "auto", 0, 1 or 2; shapes that do not chain, or an
        ``out`` of the wrong shape, dtype or device.
    TypeError
        Operands of different kinds, or a dtype other than float32 / float64.

    Notes
    -----
    Sizes that are not multiples of 2**levels are peeled: Strassen computes the
    leading multiple-of-2**levels part and ``gemm`` the rest. Strassen's rounding
    error grows with the levels (each level adds operand sums: about 1.4x cuBLAS's
    relative error at one level, 2x at two); the benchmark reports it next to plain
    GEMM's. numpy inputs run the same schedule on the CPU for ``levels`` 1 and 2.

    Examples
    --------
    >>> import numpy as np, tsm_core
    >>> rng = np.random.default_rng(0)
    >>> A = rng.standard_normal((6, 5)); B = rng.standard_normal((5, 7))
    >>> bool(np.allclose(tsm_core.strassen(A, B, levels=1), A @ B))
    True
    >>> bool(np.allclose(tsm_core.strassen(A, B, levels=2), A @ B))
    True
    >>> bool(np.array_equal(tsm_core.strassen(A, B), A @ B))  # "auto": numpy's product here
    True

    With a GPU, float32 CuPy arrays run the fused kernels where they win:

    >>> if tsm_core.has_gpu():
    ...     import cupy as cp
    ...     X = cp.random.standard_normal((8192, 8192), dtype=cp.float32)
    ...     C = tsm_core.strassen(X, X)  # two levels on the H100
    ... else:
    ...     C = tsm_core.strassen(A, B)
    """
    if isinstance(levels, (bool, np.bool_)) or not (
            (isinstance(levels, str) and levels == "auto")
            or (isinstance(levels, (int, np.integer)) and levels in (0, 1, 2))):
        raise ValueError(f"levels must be 'auto', 0, 1 or 2; got {levels!r}")
    ops = check_operands(A, B, out=out)
    xp = ops.xp
    C = _empty_cases(ops, xp)
    if C is not None:
        return _arrays.wrap(C, ops.kind, like=out)
    m, k, n = ops.m, ops.k, ops.n
    A, B = ops.A, ops.B
    gpu = xp is not np
    if isinstance(levels, str):
        levels = auto_levels(A, B, ops.out) if gpu else 0
    if levels == 0:  # the vendor library's product, as tsm_core.matmul hands it over
        return _arrays.wrap(xp.matmul(A, B, out=ops.out), ops.kind, like=out)
    C = ops.out if ops.out is not None else xp.empty((m, n), dtype=ops.dtype)
    # Peel to multiples of 2**levels * V (V = elements per 16-byte vector): every
    # block of A, B and C then starts 16-byte aligned when the matrix does, so the
    # fused kernels keep their vector loads (and there are fewer variants).
    f = (1 << levels) * configs.VEC[np.dtype(ops.dtype).itemsize]
    m2, k2, n2 = m - m % f, k - k % f, n - n % f
    mm = _plain if gpu else (lambda X, Y, Z, al, be: _cpu_gemm(X, Y, Z, be))
    if min(m2, k2, n2) == 0:
        mm(A, B, C, 1.0, 0.0)
        return _arrays.wrap(C, ops.kind, like=out)
    if gpu:
        _launch_strassen(A[:m2, :k2], B[:k2, :n2], C[:m2, :n2], levels)
    else:
        _strassen_cpu(A[:m2, :k2], B[:k2, :n2], C[:m2, :n2], levels)
    # Peeling: the k-remainder as a rank-(k - k2) update, then the strips of C.
    if k2 < k:
        mm(A[:m2, k2:], B[k2:, :n2], C[:m2, :n2], 1.0, 1.0)
    if n2 < n:
        mm(A[:m2, :], B[:, n2:], C[:m2, n2:], 1.0, 0.0)
    if m2 < m:
        mm(A[m2:, :], B, C[m2:, :], 1.0, 0.0)
    return _arrays.wrap(C, ops.kind, like=out)


def _cpu_gemm(A, B, C, beta):
    if beta == 0.0:
        np.matmul(A, B, out=C)
    else:
        C += A @ B
