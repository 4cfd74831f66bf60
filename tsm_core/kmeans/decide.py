"""What the tensor-core assignment's routes share (``tensor.py``, ``longrows.py``):
their kernels' family (``mma.cu``), the device's facts, the margin rule's bound and
its float64 decision against every centre."""

from __future__ import annotations

import numpy as np

from tsm_core.kmeans.launch import NULL, _cp
from tsm_core.runtime import compile as _compile

FAMILY = "kmeans_mma"
FD_ROWS = 16  # listed rows a block of kmeans_full_decide takes
FD_KERNEL_KD = 1 << 18  # the full decision's kernel up to k * d of this; cuBLAS above
FULL_BLOCK_BYTES = 256 << 20  # float64 product block of the full decision on cuBLAS


def _cc() -> int:
    from tsm_core.runtime.device import attribute

    return 10 * attribute("ComputeCapabilityMajor") + attribute("ComputeCapabilityMinor")


def _sms() -> int:
    from tsm_core.runtime.device import sm_count

    return sm_count()


def margin(d: int, split: bool = False, rounded: bool = False) -> tuple[float, float]:
    """(ea, eb) of the margin rule's bound B = ea * cm * ||x'|| + eb * cm^2 on twice the
    largest error of a computed distance d_j = ||c'_j||^2 - 2 x'.c'_j, for rows of d
    elements (x' = x - mu, c' = c - mu, cm^2 = max_j ||c'_j||^2).

    The MMA reads x' truncated to TF32 (relative error below 2^-10) and c' rounded to
    nearest TF32 (2^-11), so each product is off by at most (2^-10 + 2^-11 + 2^-21)
    |x'_l c'_l|; float32 accumulation of d terms adds at most
    d 2^-23 sum |x'_l c'_l| (round toward zero, as tensor cores accumulate); by
    Cauchy-Schwarz the dot product is off by eps_d ||x'|| ||c'_j||. The shift, the
    stored ||c'||^2 and the final fused multiply-add add a few float32 roundings,
    each below 2^-23 ||x'|| ||c'|| or 2^-22 ||c'||^2. Twice the largest error over
    the centres bounds the error of a difference of two distances. A 25% allowance
    covers the float32 computation of ||x'|| itself.

    With ``rounded`` (the TF32 screen, which rounds x' to nearest TF32 as it forms
    the fragments) x' is off by at most 2^-11 as well.

    With ``split`` (three bfloat16 products, x' = xh + xl and c' = ch + cl rounded to
    nearest bfloat16, 8-bit significands): |x' - xh - xl| <= 2^-16 |x'| and likewise
    for c', and the dropped xl cl is at most 2^-16 (1 + 2^-8)^2 |x' c'|, so the
    products are off by at most 3.1 2^-16 |x'_l c'_l|; each of the three exact
    products of an element is one more float32 accumulation (3 d 2^-23 in all).

    Examples
    --------
    >>> from tsm_core.kmeans.tensor import margin
    >>> ea, eb = margin(128)
    >>> round(ea, 6), eb < 1e-5
    (0.007405, True)
    >>> round(margin(128)[0] / margin(128, split=True)[0], 1)
    15.8
    >>> round(margin(128, rounded=True)[0] / margin(128)[0], 2)
    0.67
    """
    if split:
        eps_d = 3.1 * 2.0 ** -16 + 3 * d * 2.0 ** -23 * 1.01
    else:
        eps_d = (2.0 ** -11 if rounded else 2.0 ** -10) + 2.0 ** -11 + 2.0 ** -21 + d * 2.0 ** -23 * 1.01
    ea = 2 * (2 * eps_d + 3.1 * 2.0 ** -23) * 1.25
    eb = 2 * 2.0 ** -22 * 1.25
    return ea, eb


def _kernel(name: str, smem: int = 0):
    kern = _compile.get_kernel(FAMILY, name)
    if smem > 48 * 1024:
        kern.max_dynamic_shared_size_bytes = smem
    return kern


def decide_full(X, rows, C, labels, mind, changed, prev=None):
    """Rows `rows` of X assigned in float64 against every centre (shifted by the
    centres' mean; ties to the smaller index), written to labels and mind; the
    changed flag is set where a label differs from `prev` (read before writing)."""
    cp = _cp()
    C64 = C.astype(cp.float64)
    mu = C64.mean(0)
    Cs = C64 - mu
    cn = (Cs * Cs).sum(1)
    k = C.shape[0]
    step = max(1, FULL_BLOCK_BYTES // (8 * max(k, 1)))
    for a in range(0, rows.size, step):
        r = rows[a:a + step]
        old = prev[r] if prev is not None else None
        Xs = X[r].astype(cp.float64) - mu
        D = Xs @ Cs.T
        D *= -2.0
        D += cn[None, :]
        lab = D.argmin(1).astype(cp.int32)
        md = cp.maximum(D[cp.arange(r.size), lab] + (Xs * Xs).sum(1), 0.0)
        labels[r] = lab
        mind[r] = md.astype(mind.dtype)
        if old is not None:
            cp.maximum(changed, (old != lab).any().astype(cp.int32), out=changed)


def decide_listed(X, ldx, C, lists, counts, cap, labels, mind, changed, prev, list_counts):
    """The rows the margin rule listed, decided in float64: the pairs (lists[3 e],
    its best and second centre after it; counts[0]) between those two centres, the
    full list (lists[3 cap + e]; counts[1]) against every centre. Up to k d =
    FD_KERNEL_KD on the kernels, which read the counts on the GPU (no host trip);
    above, float64 products on cuBLAS (the tensor cores' DMMA) beat the kernel's
    float64 FMAs, and the full list's count is read. list_counts (uint64: pairs,
    full) gains both counts."""
    cp = _cp()
    d, k = X.shape[1], C.shape[0]
    sms = _sms()
    pv = prev if prev is not None else NULL
    _kernel("kmeans_pair_decide")((min(-(-cap // 8), 4 * sms),), (256,), (
        X, np.int64(ldx), np.int32(d), C, lists, counts, np.int32(cap), labels, mind, pv, changed))
    if k * d <= FD_KERNEL_KD:
        _kernel("kmeans_full_decide")((min(-(-cap // FD_ROWS), 2 * sms),), (256,), (
            X, np.int64(ldx), np.int32(d), C, np.int32(k), lists, counts, np.int32(cap), labels, mind, pv,
            changed, list_counts))
    else:
        list_counts += counts.astype(cp.uint64)
        full = int(counts[1].get())
        if full:
            decide_full(X, lists[3 * cap: 3 * cap + full], C, labels, mind, changed, prev)
