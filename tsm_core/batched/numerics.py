"""The batched kernels' float32 summation orders, emulated with numpy.

Each function computes ``A @ B`` (A of shape (M, K), B (K, N), float32) in the
order and with the rounding of one of ``batched.cu``'s paths, so that the CPU
tests can compare orders on the same data without a GPU:

- `fma_order`: the FMA tiles of more than eight sums a thread (the 64 x 64 and
  128-row types; every type of version 0) and cuBLAS's SGEMM kernels: one running
  sum per output, one correctly rounded FMA per k (``fmaf``);
- `fma_blocked_order` with ``block=64``: the FMA tiles of up to eight sums a thread
  (versions 1 to 5): 64-k blocks summed by FMAs, each joined to the total by one
  addition (the kernel's blocked accumulation);
- `tc3_order`: the 3xTF32 tensor-core tiles (128 x 128 tiles of versions 5 and 6):
  per k8 step three m16n8k8 MMAs, ``lo(a) hi(b)``, ``hi(a) lo(b)``, ``hi(a) hi(b)``,
  each adding its eight products to an accumulator. ``block=None`` adds them to the
  running total itself (the kernel before blocking); ``block=b`` adds them to a fresh
  partial that joins the total by one IEEE FADD every ``b`` k8 steps (the kernel's
  blocked accumulation);
- `pairwise_order`: float32 pairwise summation of the products (a reference order).

The tensor cores' accumulation is modelled as measured by Fasi, Higham, Mikaitis
and Pranesh ("Numerical behavior of NVIDIA tensor cores", PeerJ Comput. Sci. 7,
2021, section 4): products of TF32 inputs are exact, all addends (the products and
the accumulator) are aligned to the largest one's exponent with the bits below its
float32 unit in the last place dropped, summed exactly, and the sum is normalised to
float32 by truncation (round toward zero). The dropped bits are what makes the
unblocked order's error grow like K instead of sqrt(K): every truncation moves the
sum toward zero, so their errors share a sign while the total keeps its sign.

Pure numpy; no GPU needed.
"""

from __future__ import annotations

import numpy as np

_F32, _F64 = np.float32, np.float64


def tf32_hi(x, rn=False):
    """The high TF32 part of float32 `x`, as float64: its low 13 mantissa bits
    dropped (the MMA's own reading of x: truncation) or, with `rn`, rounded to
    nearest (ties away from zero: ``(bits + 0x1000) & ~0x1fff``)."""
    u = np.ascontiguousarray(x, dtype=_F32).view(np.uint32)
    if rn:
        u = u + np.uint32(0x1000)
    return (u & np.uint32(0xFFFFE000)).view(_F32).astype(_F64)


def tf32_lo(x, rn=False):
    """The low part as the MMA reads it: ``x - tf32_hi(x, rn)`` (exact in float32),
    its bits plus 0x1000, then truncated to TF32 (``tf32_low`` in common.cuh;
    ``tf32_split_rn`` in batched.cu with `rn`), as float64."""
    x = np.ascontiguousarray(x, dtype=_F32)
    d = (x.astype(_F64) - tf32_hi(x, rn)).astype(_F32)  # exact: fewer than 24 bits
    u = d.view(np.uint32) + np.uint32(0x1000)
    return (u & np.uint32(0xFFFFE000)).view(_F32).astype(_F64)


def _trunc_to(x, e):
    """x (float64) with the bits below 2**(e - 24) dropped (toward zero)."""
    q = np.ldexp(1.0, e - 24)
    return np.trunc(x / q) * q


def mma_accumulate(c, prods):
    """The tensor-core model: c (float32 values, float64 array of shape S) plus the
    exact products `prods` (float64, shape S + (8,)): addends aligned to the largest
    exponent with lower bits dropped, summed exactly, normalised to float32 toward
    zero. Returns float64 holding float32 values."""
    terms = np.concatenate([c[..., None], prods], axis=-1)
    big = np.max(np.abs(terms), axis=-1)
    _, e = np.frexp(big)  # big = f * 2**e, 0.5 <= f < 1: float32 ulp is 2**(e - 24)
    s = np.sum(_trunc_to(terms, e[..., None]), axis=-1)  # exact: < 32 significant bits
    _, es = np.frexp(s)
    return np.where(s == 0, 0.0, _trunc_to(s, es))


def fma_order(A, B):
    """A @ B as one running float32 FMA sum per output, k in order.

    The FMA tiles' order and cuBLAS's SGEMM kernels'. An FMA rounds once: the
    product of two float32 is exact in float64, its sum with a float32 rounds once
    to float64 and then to float32 (the same result but for rare double-rounding
    ties).

    Parameters
    ----------
    A : array_like, shape (M, K)
    B : array_like, shape (K, N)

    Returns
    -------
    numpy.ndarray of float32, shape (M, N)

    Examples
    --------
    >>> import numpy as np
    >>> from tsm_core.batched.numerics import fma_order
    >>> fma_order(np.ones((2, 3)), np.full((3, 1), 0.5)).ravel().tolist()
    [1.5, 1.5]
    """
    A = np.asarray(A, _F32).astype(_F64)
    B = np.asarray(B, _F32).astype(_F64)
    acc = np.zeros((A.shape[0], B.shape[1]), _F64)
    for k in range(A.shape[1]):
        acc = (acc + A[:, k, None] * B[None, k, :]).astype(_F32).astype(_F64)
    return acc.astype(_F32)


def tc3_order(A, B, block=None, rn=False):
    """A @ B in the 3xTF32 tiles' order, with the tensor cores' rounding.

    k in steps of 8 (K padded with zeros); per step the three MMAs in the kernel's
    order (lo(a) hi(b), hi(a) lo(b), hi(a) hi(b)), each through `mma_accumulate`.

    Parameters
    ----------
    A : array_like, shape (M, K)
        float32 (converted).
    B : array_like, shape (K, N)
        float32 (converted).
    block : int, optional
        None: the MMAs sum into the running total itself. An int b: into a fresh
        partial, added to the total by a float32 addition (round to nearest) every b
        steps of 8 k. The kernel's tiles of version 5: 1.
    rn : bool, default False
        High parts rounded to nearest (version 5's `tf32_split_rn`) instead of
        truncated (the MMA's own reading of x; versions 2 and 6).

    Returns
    -------
    numpy.ndarray of float32, shape (M, N)

    Examples
    --------
    >>> import numpy as np
    >>> from tsm_core.batched import numerics as nm
    >>> rng = np.random.default_rng(0)
    >>> A = rng.standard_normal((8, 1024)).astype(np.float32)
    >>> B = rng.standard_normal((1024, 8)).astype(np.float32)
    >>> ref = A.astype(np.float64) @ B
    >>> old = nm.max_rel_err(nm.tc3_order(A, B), ref)
    >>> new = nm.max_rel_err(nm.tc3_order(A, B, block=1, rn=True), ref)
    >>> bool(new < old / 3)
    True
    """
    A = np.asarray(A, _F32)
    B = np.asarray(B, _F32)
    M, K = A.shape
    N = B.shape[1]
    Kp = -(-K // 8) * 8
    Ap = np.zeros((M, Kp), _F32)
    Ap[:, :K] = A
    Bp = np.zeros((Kp, N), _F32)
    Bp[:K] = B
    ah, al = tf32_hi(Ap, rn), tf32_lo(Ap, rn)
    bh, bl = tf32_hi(Bp, rn), tf32_lo(Bp, rn)
    total = np.zeros((M, N), _F64)
    part = total if block is None else np.zeros((M, N), _F64)
    for s in range(Kp // 8):
        k = slice(8 * s, 8 * s + 8)
        for a, b in ((al, bh), (ah, bl), (ah, bh)):
            part = mma_accumulate(part, a[:, None, k] * b.T[None, :, k])
        if block is not None and ((s + 1) % block == 0 or s + 1 == Kp // 8):
            total = (total + part).astype(_F32).astype(_F64)  # the FADD (round to nearest)
            part = np.zeros((M, N), _F64)
    return (part if block is None else total).astype(_F32)


def pairwise_order(A, B):
    """A @ B with each output's float32 products summed pairwise (halves summed
    recursively, then added), a reference order whose error grows like log2(K)."""
    A = np.asarray(A, _F32)
    B = np.asarray(B, _F32)
    p = (A[:, :, None].astype(_F64) * B[None, :, :].astype(_F64)).astype(_F32)  # (M, K, N)
    while p.shape[1] > 1:
        if p.shape[1] % 2:
            p = np.concatenate([p, np.zeros_like(p[:, :1])], axis=1)
        p = p[:, 0::2] + p[:, 1::2]
    return p[:, 0]


def max_rel_err(C, ref):
    """max |C - ref| / max |ref| (ref in float64), the accuracy sweep's measure."""
    ref = np.asarray(ref, _F64)
    scale = np.max(np.abs(ref))
    return float(np.max(np.abs(np.asarray(C, _F64) - ref)) / (scale if scale else 1.0))


def fma_blocked_order(A, B, block=8):
    """A @ B with each run of `block` k summed by float32 FMAs into a fresh partial
    that one float32 addition (round to nearest) joins to the total: the blocked
    order in exact float32 arithmetic, the reference for `tc3_order`'s blocking."""
    A = np.asarray(A, _F32).astype(_F64)
    B = np.asarray(B, _F32).astype(_F64)
    K = A.shape[1]
    total = np.zeros((A.shape[0], B.shape[1]), _F64)
    for k0 in range(0, K, block):
        part = np.zeros_like(total)
        for k in range(k0, min(K, k0 + block)):
            part = (part + A[:, k, None] * B[None, k, :]).astype(_F32).astype(_F64)
        total = (total + part).astype(_F32).astype(_F64)
    return total.astype(_F32)


def split_order(A, B, splits, order=fma_order, align=16):
    """A @ B with K cut into `splits` chunks as the planner cuts it (chunks of
    ceil(K / splits) rounded up to `align`, the last one shorter), each chunk summed
    by `order`, the partials added in split order by float32 additions: the batched
    kernels' split-K (the last block of a tile adds the S partials in order).

    Parameters
    ----------
    A : array_like, shape (M, K)
    B : array_like, shape (K, N)
    splits : int
        Chunks of k (1: `order` alone).
    order : callable, default `fma_order`
        The order within a chunk (`fma_order`, or e.g. ``lambda a, b: tc3_order(a,
        b, block=1, rn=True)`` for version 5's tensor-core tiles).
    align : int, default 16
        The kernels' TSM_BATCHED_SPLIT_ALIGN.

    Returns
    -------
    numpy.ndarray of float32, shape (M, N)

    Examples
    --------
    >>> import numpy as np
    >>> from tsm_core.batched import numerics as nm
    >>> rng = np.random.default_rng(0)
    >>> A = rng.standard_normal((8, 2048)).astype(np.float32)
    >>> B = rng.standard_normal((2048, 8)).astype(np.float32)
    >>> ref = A.astype(np.float64) @ B
    >>> one = nm.max_rel_err(nm.split_order(A, B, 1), ref)
    >>> sixteen = nm.max_rel_err(nm.split_order(A, B, 16), ref)
    >>> bool(sixteen < one)
    True
    """
    A = np.asarray(A, _F32)
    B = np.asarray(B, _F32)
    K = A.shape[1]
    S = max(1, int(splits))
    c = -(-(-(-K // S)) // align) * align if S > 1 else K
    total = None
    for k0 in range(0, max(K, 1), max(c, 1)):
        part = np.asarray(order(A[:, k0:k0 + c], B[k0:k0 + c]), _F32)
        total = part if total is None else (total + part).astype(_F32)
    return total


# cuBLAS's order on products with few output tiles, as a model: k in chunks of
# CUBLAS_CHUNK, each one running FMA sum, the partials added in order. Its error
# matched what the H100 measured for cuBLAS (2026-11-28, cupy.matmul, 48 x 48
# samples, in units of the unit roundoff): 202 x 15 x 1024 3.0 (model, median of
# eight seeds: 2.9), 19 x 10 x 4096 4.9 (3.6), float64 65 x 55 x 8192 5.7 (6.1);
# 2 x 24 x 8192 measured 2.3 against 5.3 (a two-row product: cuBLAS's GEMV-like
# kernels reduce in a tree there).
CUBLAS_CHUNK = 64


def cublas_split_order(A, B, chunk=CUBLAS_CHUNK):
    """A @ B in the model of cuBLAS's split-K order (see CUBLAS_CHUNK): chunks of
    `chunk` k summed by FMAs, partials added in order. float32, shape (M, N)."""
    A = np.asarray(A, _F32)
    K = A.shape[1]
    return split_order(A, B, -(-K // chunk) if K else 1, align=1)


def split_ratios(M, N, K, chunks=(128, 256, 512, 1024), seeds=6, sample=48, max_splits=64,
                 order=fma_order):
    """Emulated error of our split order over the cuBLAS model's, per chunk length.

    On signed normal float32 data of min(M, sample) x K and K x min(N, sample) (the
    accuracy bench's samples), for each chunk length c: our order with
    ``min(ceil(K / c), max_splits)`` splits (`split_order`) against
    `cublas_split_order`, max |C - ref| / max |ref| each, ref in float64.

    Parameters
    ----------
    M, N, K : int
        The problem.
    chunks : sequence of int
        Chunk lengths to try.
    seeds : int
        Random data sets (seeds 0 .. seeds - 1).
    sample : int
        Rows and columns kept.
    max_splits : int
        The planner's cap on accuracy splits.
    order : callable
        Our order within a chunk.

    Returns
    -------
    dict
        chunk -> numpy.ndarray of `seeds` ratios (ours / the model's).

    Examples
    --------
    >>> from tsm_core.batched import numerics as nm
    >>> r = nm.split_ratios(20, 10, 1024, chunks=(128, 1024), seeds=2)
    >>> bool(r[128].max() < r[1024].min())
    True
    """
    m, n = min(M, sample), min(N, sample)
    out = {c: [] for c in chunks}
    for seed in range(seeds):
        rng = np.random.default_rng(seed)
        A = rng.standard_normal((m, K)).astype(_F32)
        B = rng.standard_normal((K, n)).astype(_F32)
        ref = A.astype(_F64) @ B.astype(_F64)
        theirs = max_rel_err(cublas_split_order(A, B), ref)
        for c in chunks:
            S = min(-(-K // c), max_splits)
            out[c].append(max_rel_err(split_order(A, B, S, order), ref) / theirs)
    return {c: np.array(v) for c, v in out.items()}
