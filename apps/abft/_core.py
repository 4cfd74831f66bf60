"""Checksum weights, encoding, and the fault-tolerant product ft_matmul."""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass, field

import numpy as np

import tsm_core
from tsm_core import arrays
from tsm_core.arrays import check_operands

from tsm_core import row_checksums

MAX_C = 4  # checksums per row the fused verification kernel supports
SIDES = ("row", "col", "both")
BOUNDS = ("probabilistic", "worst-case")


class ABFTError(RuntimeError):
    """The checksums found damage they cannot locate or correct.

    Attributes
    ----------
    report : ABFTReport
        What was detected, what was corrected, and why the rest was not.
    C : array
        The product as it stands (corrections that did succeed are applied).
    """

    def __init__(self, message, report, C):
        super().__init__(message)
        self.report = report
        self.C = C


# ------------------------------------------------------------------ weights


def _check_c(c):
    if isinstance(c, (bool, np.bool_)) or not isinstance(c, (int, np.integer)):
        raise TypeError(f"c must be an int, not {type(c).__name__}")
    if not 1 <= int(c) <= MAX_C:
        raise ValueError(f"c must be between 1 and {MAX_C} (checksums per row or column), got {c}")
    return int(c)


@functools.lru_cache(maxsize=64)
def _weights_np(n, c):
    x = np.arange(1, n + 1, dtype=np.float64) / n
    W = np.empty((n, c), dtype=np.float64)
    W[:, 0] = 1.0
    for q in range(1, c):
        W[:, q] = W[:, q - 1] * x
    W.flags.writeable = False
    return W


def weights(n, c=2, dtype=np.float64):
    """The (n, c) checksum weight matrix W.

    ``W[:, 0] = 1`` (plain sums) and, for q >= 1, ``W[j, q] = x_j ** q`` with
    ``x_j = (j + 1) / n``: the usual "ones and 1..n" pair, scaled into (0, 1] so
    that the checksums do not grow with n (``||W[:, q]||_2 <= sqrt(n)``). The ratio
    of the q = 1 and q = 0 mismatches of a single error at column j is x_j, which
    names j; columns q >= 2 (Vandermonde rows) must agree with it, which rejects
    rows with several errors that c = 2 would mistake for one.

    Parameters
    ----------
    n : int
        Rows of W (the columns of the matrix being checksummed), n >= 1.
    c : int, default=2
        Checksums per row, 1 <= c <= 4.
    dtype : numpy dtype, default=numpy.float64
        The dtype of the result.

    Returns
    -------
    W : numpy.ndarray of shape (n, c)
        A new array of `dtype`.

    Raises
    ------
    TypeError
        c is not an int.
    ValueError
        n < 1, or c outside [1, 4].

    Examples
    --------
    >>> from tsm_apps import abft
    >>> abft.weights(4, 2).tolist()
    [[1.0, 0.25], [1.0, 0.5], [1.0, 0.75], [1.0, 1.0]]
    """
    n = int(n)
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    c = _check_c(c)
    return _weights_np(n, c).astype(dtype)


# ------------------------------------------------------------------ encode


def _float_backend(A, name="A"):
    kind = arrays.kind_of(A, name)
    dt = arrays.numpy_dtype(A)
    if dt is None or dt not in (np.dtype(np.float32), np.dtype(np.float64)):
        raise TypeError(f"{name} has dtype {arrays.dtype_name(A)}; ABFT supports float32 and float64 only")
    if A.ndim != 2:
        raise ValueError(f"{name} must be 2-D, got shape {tuple(A.shape)}")
    return kind, arrays.to_backend(A, name), dt


def encode(A, c=2, side="row"):
    """Checksums of A through the tall-and-skinny kernels (TSM2R).

    A has shape (M, N). ``side="row"``: row checksums ``A @ W`` with W =
    ``weights(N, c)``, shape (M, c); ``side="col"``: column checksums ``W.T @ A``
    with W = ``weights(M, c)``, shape (c, N), computed as ``(A.T @ W).T`` where
    ``A.T`` of a C-ordered A is an F-ordered view that TSM2R reads in place (no
    transposed copy); ``side="both"``: the pair (row, col). Weights are cast to A's
    dtype. numpy inputs are computed on the CPU.

    Parameters
    ----------
    A : numpy.ndarray, cupy.ndarray or torch.Tensor, shape (M, N)
        float32 or float64.
    c : int, default=2
        Checksums per row (or column), 1 <= c <= 4.
    side : {"row", "col", "both"}, default="row"
        Which checksums.

    Returns
    -------
    array or tuple of arrays
        ``A @ W`` of shape (M, c), ``W.T @ A`` of shape (c, N), or both (row first),
        in A's kind and dtype.

    Raises
    ------
    TypeError
        A is not float32 or float64, or c is not an int.
    ValueError
        A is not 2-D, c is outside [1, 4], or an unknown `side`.

    Examples
    --------
    >>> import numpy as np
    >>> from tsm_apps import abft
    >>> A = np.arange(12.0).reshape(3, 4)
    >>> abft.encode(A, c=2)[:, 0].tolist()            # row sums
    [6.0, 22.0, 38.0]
    >>> abft.encode(A, c=1, side="col").tolist()      # column sums
    [[12.0, 15.0, 18.0, 21.0]]
    """
    if side not in SIDES:
        raise ValueError(f"side must be one of {SIDES}, not {side!r}")
    c = _check_c(c)
    kind, Ab, dt = _float_backend(A)
    m, n = Ab.shape
    xp = np if isinstance(Ab, np.ndarray) else _cupy()

    def tsm(X, p):
        W = xp.asarray(weights(p, c, dt))
        if X.shape[0] == 0 or p == 0:
            return xp.zeros((X.shape[0], c), dtype=dt) if p == 0 else xp.empty((0, c), dtype=dt)
        return tsm_core.tsm2r(X, W)

    out = []
    if side in ("row", "both"):
        out.append(tsm(Ab, n))
    if side in ("col", "both"):
        out.append(tsm(Ab.T, m).T)
    out = [arrays.wrap(o, kind) for o in out]
    return out[0] if len(out) == 1 else tuple(out)


def _cupy():
    import cupy

    return cupy


# ------------------------------------------------------------------ report


@dataclass(frozen=True)
class Correction:
    """One element of C that was changed: where, from what, to what, and how."""

    row: int
    col: int
    old: float
    new: float
    method: str  # "checksum" (from the checksum difference) or "recompute" (row recomputed)


@dataclass(repr=False)
class ABFTReport:
    """What ``ft_matmul`` checked, found and did.

    ``print(report)`` and ``repr(report)`` give a few lines (verdict, counts, the
    largest ratio, the corrections); ``report.details()`` gives everything,
    thresholds included.

    Attributes
    ----------
    shape : (m, k, n)
    dtype : str
    c : int
        Checksums per row.
    bound, confidence : str, float
        The round-off bound used (see ``ft_matmul``).
    max_ratio : float
        ``max |d| / tau`` over all rows and checksums: below 1 means no mismatch
        above the round-off threshold (clean). A clean product typically sits at
        1e-3 or below: the margin against false alarms.
    thresholds : array, shape (m, c)
        tau, the per-row, per-checksum threshold (numpy or CuPy array).
    detected_rows : tuple of int
        Rows whose checksums mismatched above the threshold.
    corrections : list of Correction
    uncorrectable : dict row -> reason
        Rows the checksums could not repair (and that were not recomputed).
    recomputed_rows : tuple of int
    """

    shape: tuple
    dtype: str
    c: int
    bound: str
    confidence: float
    max_ratio: float = 0.0
    thresholds: object = None
    detected_rows: tuple = ()
    corrections: list = field(default_factory=list)
    uncorrectable: dict = field(default_factory=dict)
    recomputed_rows: tuple = ()

    @property
    def detected(self) -> bool:
        """Whether any checksum mismatched above its threshold."""
        return bool(self.detected_rows)

    @property
    def clean(self) -> bool:
        return not self.detected_rows

    @property
    def corrected(self) -> bool:
        """Whether every detected row was repaired (by checksums or recomputation)."""
        return self.detected and not self.uncorrectable

    def limits(self, row, col):
        """The error magnitudes at (row, col) that these checksums resolve.

        Returns ``{"flag": a, "locate": b}``: an error e with ``|e| > a`` at that
        element is always detected (its mismatch exceeds tau plus the largest
        round-off the bound allows); with ``|e| > b`` it is also located from the
        checksums alone (no other column is consistent with the mismatches) and
        corrected. Below tau / max_q W[col, q] an error is at round-off level:
        reported as nothing (undetectable), never "corrected". b is inf for c = 1.
        """
        tau = np.asarray(_to_host(self.thresholds[row]), dtype=np.float64)
        n = self.shape[2]
        W = _weights_np(n, self.c)
        w = W[col]
        flag = float(np.min(2 * tau / w))
        if self.c == 1 or n == 1:
            return {"flag": flag, "locate": math.inf if n > 1 else flag}
        # Column j' is excluded when |e| |W[col,q] - W[j',q]| > 2 (tau_q + W[j',q] tau_0)
        # for some q >= 1 (see _diagnose_row).
        with np.errstate(divide="ignore"):
            need = 2 * (tau[None, 1:] + W[:, 1:] * tau[0]) / np.abs(w[None, 1:] - W[:, 1:])
        per_col = need.min(axis=1)
        per_col[col] = 0.0
        return {"flag": flag, "locate": max(flag, float(per_col.max()))}

    def verdict(self) -> str:
        """'clean', 'corrected' (every flagged row repaired) or 'uncorrectable'."""
        if self.clean:
            return "clean"
        return "corrected" if self.corrected else "uncorrectable"

    def __repr__(self) -> str:
        m, k, n = self.shape
        lines = [f"ABFTReport({self.verdict()}: {m}x{k} @ {k}x{n} {self.dtype}, c={self.c}, "
                 f"max |d|/tau = {self.max_ratio:.3g})"]
        if not self.clean:
            lines.append(f"  {len(self.detected_rows)} row(s) flagged, {len(self.corrections)} element(s) corrected, "
                         f"{len(self.recomputed_rows)} row(s) recomputed, {len(self.uncorrectable)} uncorrectable")
            shown = self.corrections[:3]
            for fix in shown:
                lines.append(f"  C[{fix.row}, {fix.col}]: {fix.old:.6g} -> {fix.new:.6g} ({fix.method})")
            if len(self.corrections) > len(shown):
                lines.append(f"  ... {len(self.corrections) - len(shown)} more: report.details()")
        return "\n".join(lines)

    __str__ = __repr__

    def details(self) -> str:
        """Everything in the report as text: the summary, each correction and each
        uncorrectable row, and the per-row thresholds tau (shape (m, c)).

        Returns
        -------
        str
            Many lines for a tall product: one per row of the thresholds.

        Examples
        --------
        >>> import numpy as np
        >>> from tsm_apps import abft
        >>> A = np.ones((3, 4)); B = np.ones((4, 2))
        >>> C, rep = abft.ft_matmul(A, B)
        >>> print(rep.details().splitlines()[0])
        ft_matmul 3x4 @ 4x2 float64, c=2: max |d|/tau = 0, clean
        """
        lines = [self.summary(), f"bound {self.bound!r}, confidence {self.confidence}",
                 f"detected rows {list(self.detected_rows)}, recomputed rows {list(self.recomputed_rows)}"]
        if self.thresholds is not None:
            lines.append("thresholds tau (row: per checksum):")
            tau = np.asarray(_to_host(self.thresholds))
            lines += [f"  {i}: " + " ".join(f"{t:.3g}" for t in row) for i, row in enumerate(tau)]
        return "\n".join(lines)

    def summary(self) -> str:
        """The verdict line, with a line per correction and per uncorrectable row."""
        m, k, n = self.shape
        head = (f"ft_matmul {m}x{k} @ {k}x{n} {self.dtype}, c={self.c}: "
                f"max |d|/tau = {self.max_ratio:.3g}")
        if self.clean:
            return head + ", clean"
        lines = [head + f", {len(self.detected_rows)} row(s) flagged"]
        for fix in self.corrections:
            lines.append(f"  corrected C[{fix.row}, {fix.col}]: {fix.old!r} -> {fix.new!r} ({fix.method})")
        for row, why in self.uncorrectable.items():
            lines.append(f"  row {row}: not corrected: {why}")
        return "\n".join(lines)


def _to_host(x):
    return x if isinstance(x, np.ndarray) else x.get()


# ------------------------------------------------------------------ thresholds


def _unit_roundoff(dtype, gpu):
    u = float(np.finfo(dtype).eps) / 2
    # CuPy's TF32 mode rounds float32 GEMM inputs to 10-bit mantissas.
    if gpu and np.dtype(dtype) == np.float32 and os.environ.get("CUPY_TF32", "0") == "1":
        u = 2.0**-11
    return u


def _coefficients(m, k, n, dtype, bound, lam, gpu):
    """(kg, kcn, kck, under) of the threshold formula in ft_matmul's docstring."""
    u = _unit_roundoff(dtype, gpu)
    uc = 2.0**-53  # the checksum passes accumulate in float64

    def gamma(p, uu):
        return p * uu / (1 - p * uu) if p * uu < 1 else math.inf

    if bound == "probabilistic":
        kg = lam * u * math.sqrt(2 * k)
        kcn = lam * uc * math.sqrt(2 * n)
        kck = lam * uc * math.sqrt(2 * k)
    else:
        kg = gamma(k, u) * math.sqrt(n)
        kcn = gamma(n, uc)
        kck = gamma(k, uc)
    under = 2.0 * (k + n) * float(np.finfo(dtype).smallest_subnormal)
    return kg, kcn, kck, under


_RATIO_SRC = r"""
const double ga = sqrt(ga2);
tau = ga * (kg * bw + 2.0 * kcn * wn * bf + kck * bn) + und * w1;
const double d = s - t;
if (!isfinite(tau)) r = tau - tau;                                   // NaN: cannot bound
else if (!isfinite(d)) r = __longlong_as_double(0x7ff0000000000000LL); // +inf: flagged
else r = fabs(d) / tau;
"""
_ratio_kernel = None


def _ratios(xp, s, t, ga2, bw, bn, wn, w1, bf, coef):
    """(tau, |s - t| / tau), both (m, c); r is +inf where d is not finite, NaN where tau is not."""
    kg, kcn, kck, under = coef
    if xp is np:
        with np.errstate(all="ignore"):
            ga = np.sqrt(ga2)
            tau = ga * (kg * bw + 2.0 * kcn * wn * bf + kck * bn) + under * w1
            d = s - t
            r = np.abs(d) / tau
            r = np.where(np.isfinite(d), r, np.inf)
            r = np.where(np.isfinite(tau), r, np.nan)
        return tau, r
    global _ratio_kernel
    if _ratio_kernel is None:
        _ratio_kernel = xp.ElementwiseKernel(
            "float64 s, float64 t, float64 ga2, float64 bw, float64 bn, float64 wn, "
            "float64 w1, float64 bf, float64 kg, float64 kcn, float64 kck, float64 und",
            "float64 tau, float64 r", _RATIO_SRC, "tsm_abft_ratio")
    return _ratio_kernel(s, t, ga2, bw, bn, wn, w1, bf, kg, kcn, kck, under)


# ------------------------------------------------------------------ ft_matmul


@dataclass
class _Pending:
    """Device state between enqueueing a verified product and reading its verdict."""

    ops: object
    c: int
    bound: str
    lam: float
    C: object
    s: object
    t: object
    tau: object
    r: object
    rmax: object


_norms: dict = {}


def _weight_norms(xp, n, c):
    """(||W_q||_2, ||W_q||_1) for q < c, as xp arrays; cached on the device, because a
    host-to-device copy of pageable memory would block the host until the GEMM ends."""
    key = (xp.__name__, xp.cuda.Device().id if xp is not np else -1, n, c)
    got = _norms.get(key)
    if got is None:
        W = _weights_np(n, c)
        got = _norms[key] = (xp.asarray(np.sqrt((W * W).sum(axis=0))), xp.asarray(W.sum(axis=0)))
    return got


def _check_args(c, bound, confidence, inject):
    c = _check_c(c)
    if bound not in BOUNDS:
        raise ValueError(f"bound must be one of {BOUNDS}, not {bound!r}")
    if isinstance(confidence, bool) or not isinstance(confidence, (int, float, np.floating, np.integer)):
        raise TypeError(f"confidence must be a real number, not {type(confidence).__name__}")
    if not (confidence >= 1.0 and math.isfinite(confidence)):
        raise ValueError(f"confidence (lambda) must be finite and >= 1, got {confidence}")
    if inject is not None and not callable(inject):
        raise TypeError("inject must be a callable taking the product C (or None)")
    return c, float(confidence)


# Large float64 products run as two GEMMs launched together on two streams: rows
# [0, M - band) on the caller's stream and the last ``band`` rows beside them, so the
# band fills the first part's last wave. The first part's C pass can then start
# while the band's GEMM runs, instead of after the whole product: only the band's C
# pass (3/32 of C) follows the product. Measured on the H100, 2026-11-23 (N = 8192,
# float64, runs interleaved with the plain GEMM): band = 3/32 of M (768 rows)
# +1.42-1.45% overhead against +2.14-2.36% for one GEMM in the same run; 512 or 1024
# rows +1.5-1.8%; 256 rows +2.1-2.5%; the band on a high-priority stream +2.2-2.5%.
# float32 gained nothing (+0.7-0.8% against +0.6%), so it keeps one GEMM. The band is
# computed by its own cuBLAS call, so the product can differ from one cuBLAS call in
# the last bits (round-off of another kernel: 3e-12 relative at N = 8192).
BAND_FRACTION = 3 / 32
BAND_ROW_STEP = 128         # cuBLAS's DGEMM tile height: the split stays on a tile row
BAND_MIN_ROWS = 4096
BAND_MIN_FLOPS = 2.0**39    # 2 M N K; N = 8192 is 2^40


def band_rows(m, k, n, dtype, gpu=True):
    """Rows of C that ``ft_matmul`` computes as a separate band (0: one GEMM).

    >>> band_rows(8192, 8192, 8192, "float64"), band_rows(8192, 8192, 8192, "float32")
    (768, 0)
    """
    if not gpu or np.dtype(dtype) != np.float64 or m < BAND_MIN_ROWS or 2.0 * m * n * k < BAND_MIN_FLOPS:
        return 0
    return max(BAND_ROW_STEP, int(round(m * BAND_FRACTION / BAND_ROW_STEP)) * BAND_ROW_STEP)


def _banded_product(xp, A, B, dt, band, main, plan):
    """C = A @ B as rows [0, m - band) on ``main`` and the band on a side stream, both
    launched now; returns (C, event after the first part, event after the band)."""
    m, n = A.shape[0], B.shape[1]
    m1 = m - band
    C = xp.empty((m, n), dtype=dt)
    bs = plan.streams[1]
    bs.wait_event(main.record(_event()))
    _gemm(A[:m1], B, C[:m1], plan.direct[0])
    first = main.record(_event())
    with bs:
        _gemm(A[m1:], B, C[m1:], plan.direct[1])
        last = bs.record(_event())
    return C, first, last


def _gemm(A, B, C, direct):
    """C = A @ B: ``cupy.matmul`` itself where ``tsm_core.matmul`` would hand this
    product to cuBLAS (``direct``: decided once per call plan), else ``tsm_core.matmul``."""
    if direct:
        import cupy

        cupy.matmul(A, B, out=C)
    else:
        tsm_core.matmul(A, B, out=C)


@dataclass(frozen=True)
class _CallPlan:
    """What ``_enqueue`` would otherwise work out on every call, for one problem:
    the threshold's coefficients, the band, whether each GEMM goes straight to
    cuBLAS, the weight norms and the side streams (GPU only). Events stay per call:
    a shared one re-recorded by a caller on another stream (another thread) before
    this call's wait is enqueued would order the wait against the wrong work."""

    coef: tuple
    band: int
    direct: tuple   # per GEMM (the product, or its first rows and the band)
    norms: tuple    # (||W_q||_2, ||W_q||_1) on the device
    streams: tuple  # (checks, band, C pass): side streams of the device


_plans: dict = {}
PLAN_CACHE_SIZE = 64


def _event():
    import cupy

    return cupy.cuda.Event(disable_timing=True)  # ordering only: no timestamp to take


def _order(X):
    # As the planner names memory orders (tsm_core.arrays.order_of): "F" for rows
    # contiguous along m, else "C".
    return "F" if X.ndim == 2 and X.strides[0] == X.itemsize and X.shape[1] > 1 else "C"


def _to_cublas(m, k, n, dt, order):
    """True where ``tsm_core.matmul`` runs this product as cuBLAS (its plan says so;
    a kernel it would check against cuBLAS is left to it)."""
    if not (m and k and n):
        return False
    return tsm_core.plan(m, k, n, dt, order).algorithm == "cublas"


def _call_plan(ops, c, bound, lam):
    """The `_CallPlan` of a GPU problem, made on its first call and kept (per shape,
    strides, dtype, device, c, bound and confidence: everything it depends on; a
    pointer is not part of it, so freed and reused memory changes nothing)."""
    A, B = ops.A, ops.B
    dev = A.data.device_id
    key = (ops.m, ops.k, ops.n, ops.dtype.char, A.strides, B.strides, dev, c, bound, lam)
    plan = _plans.get(key)
    if plan is not None:
        return plan
    xp = ops.xp
    m, k, n, dt = ops.m, ops.k, ops.n, ops.dtype
    coef = _coefficients(m, k, n, dt, bound, lam, True)
    # Row slices of a C-ordered A are matrices cuBLAS reads in place; of any other
    # layout they are not (cupy.matmul would copy them), so only C-ordered A is banded.
    band = band_rows(m, k, n, dt, True) if A.flags.c_contiguous else 0
    order = (_order(A), _order(B))
    with xp.cuda.Device(dev):
        if band:
            direct = (_to_cublas(m - band, k, n, dt, order), _to_cublas(band, k, n, dt, order))
        else:
            direct = (_to_cublas(m, k, n, dt, order),)
        streams = tuple(arrays.side_stream(p) for p in ("abft-checks", "abft-band", "abft-cpass"))
        norms = _weight_norms(xp, n, c)
    plan = _CallPlan(coef, band, direct, norms, streams)
    if len(_plans) >= PLAN_CACHE_SIZE:
        _plans.clear()
    _plans[key] = plan
    return plan


def _enqueue(A, B, *, c=2, inject=None, bound="probabilistic", confidence=8.0, overlap=True):
    """Validate, then launch the product and its verification; nothing waits for the GPU.

    On the GPU the product is launched as early as the host can: the checks that
    cost host time and depend only on the problem (the threshold's coefficients, the
    band, the GEMM's route, the weight norms, the streams) are made once per problem
    (`_call_plan`)."""
    c, lam = _check_args(c, bound, confidence, inject)
    ops = check_operands(A, B)
    xp = ops.xp
    m, k, n, dt = ops.m, ops.k, ops.n, ops.dtype
    gpu = xp is not np

    def checks_on_operands():
        # b = B W and the squares that bound its round-off: one pass over B;
        # t = A b and A's row norms: one pass over A. Neither needs C, so on the
        # GPU they run on a side stream while the GEMM runs.
        b, zb = row_checksums(ops.B, c=c, weighted_squares=True)
        t, za = row_checksums(ops.A, V=b)
        bw = xp.sqrt(zb.sum(axis=0))            # ||B diag(W[:, q])||_F
        bf = bw[0]                               # ||B||_F  (W[:, 0] = 1)
        bn = xp.sqrt((b * b).sum(axis=0))        # ||B W[:, q]||_2
        return t, za, bw, bf, bn

    if not gpu:
        C = tsm_core.matmul(ops.A, ops.B)
        if inject is not None:
            inject(C)
        if m == 0 or n == 0:
            return _Pending(ops, c, bound, lam, C, None, None, None, None, None)
        t, za, bw, bf, bn = checks_on_operands()
        s, _ = row_checksums(C, c=c)
        wn, w1 = _weight_norms(xp, n, c)
        tau, r = _ratios(xp, s, t, za, bw, bn, wn, w1, bf, _coefficients(m, k, n, dt, bound, lam, False))
        return _Pending(ops, c, bound, lam, C, s, t, tau, r, r.max())

    plan = _call_plan(ops, c, bound, lam)
    band = plan.band
    main = xp.cuda.get_current_stream()

    def product():
        if band:
            return _banded_product(xp, ops.A, ops.B, dt, band, main, plan)
        C = xp.empty((m, n), dtype=dt)
        if m and n:
            _gemm(ops.A, ops.B, C, plan.direct[0])  # k == 0: tsm_core.matmul's zeros
        return C, None, None

    if overlap and m and n and k:
        side = plan.streams[0]
        side.wait_event(main.record(_event()))
        C, first, last = product()  # launched first: the GEMM takes the SMs it wants
        with side:
            t, za, bw, bf, bn = checks_on_operands()
            done = side.record(_event())
        if band and inject is None:
            m1 = m - band
            cs = plan.streams[2]
            cs.wait_event(first)
            with cs:
                s1, _ = row_checksums(C[:m1], c=c)  # beside the band's GEMM
                s1_done = cs.record(_event())
            main.wait_event(last)
            s2, _ = row_checksums(C[m1:], c=c)
            main.wait_event(s1_done)
            s = xp.concatenate([s1, s2])
        else:
            if band:
                main.wait_event(last)
            if inject is not None:
                inject(C)
            s, _ = row_checksums(C, c=c)
        main.wait_event(done)
    else:
        C, _, last = product()
        if band:
            main.wait_event(last)
        if inject is not None:
            inject(C)
        if m == 0 or n == 0:
            return _Pending(ops, c, bound, lam, C, None, None, None, None, None)
        t, za, bw, bf, bn = checks_on_operands()
        s, _ = row_checksums(C, c=c)
    wn, w1 = plan.norms
    tau, r = _ratios(xp, s, t, za, bw, bn, wn, w1, bf, plan.coef)
    rmax = r.max()
    return _Pending(ops, c, bound, lam, C, s, t, tau, r, rmax)


def ft_matmul(A, B, *, c=2, correct=True, recompute=False, inject=None,
              bound="probabilistic", confidence=8.0, overlap=True):
    """``C = A @ B`` verified by row checksums; a corrupted element is located and corrected.

    A has shape (M, K), B (K, N); C has shape (M, N). The product is computed by
    ``tsm_core.matmul`` (cuBLAS for square GEMMs); then, with W = ``weights(N, c)``,
    three memory-bound passes each read one operand once (the fused kernel
    ``tsm_core/abft/abft.cu``, float64 accumulation): ``b = B @ W`` (K, c),
    ``t = A @ b`` (M, c) and ``s = C @ W`` (M, c), together with the row norms of A
    and ``||B diag(W[:, q])||_F``. The encoded product is never materialised:
    the checksum relation ``C W = A (B W)`` is checked row by row, ``d = s - t``.
    On the GPU, large float64 products with a C-ordered A (``_core.band_rows``:
    M >= 4096, 2MNK >= 2^39) are two ``matmul`` calls launched together, the last
    3/32 of the rows on a second stream, so that most of the C pass runs beside the
    GEMM of that band; the band's rows may then differ from a single cuBLAS call's
    in the last bits.

    Threshold (from the operands only, so that a corrupted C cannot inflate it;
    the round-off of s uses ``||C_i|| <= ||A_i|| ||B||_F``). Row i, checksum q is
    flagged when ``|d[i, q]| > tau[i, q]`` with ::

        tau[i,q] = kg  ||A_i|| ||B diag(W_q)||_F        (the GEMM's round-off)
                 + 2 kcn ||W_q|| ||A_i|| ||B||_F         (s = C W and b = B W)
                 + kck ||A_i|| ||b_q||                   (t = A b)
                 + 2 (K + N) eta ||W_q||_1               (underflow)

    where ``||.||`` is the 2-norm, u the dtype's unit round-off (2^-24, 2^-53;
    2^-11 for float32 under CUPY_TF32=1), uc = 2^-53 that of the float64
    checksums, eta the dtype's smallest subnormal, lambda = ``confidence`` and

    - ``bound="probabilistic"`` (default): kg = lambda u sqrt(2K),
      kcn = lambda uc sqrt(2N), kck = lambda uc sqrt(2K). Rounding errors taken as
      independent, zero-mean and bounded by u (Higham and Mary, SIAM J. Sci.
      Comput. 41(5), 2019); each partial sum of a dot product bounded by
      Cauchy-Schwarz; Hoeffding's inequality over the <= 2KN rounding errors
      behind d[i, q] then gives a false-alarm probability <= 2 exp(-lambda^2 / 2)
      per check (1e-14 at lambda = 8), before the slack of Cauchy-Schwarz.
    - ``bound="worst-case"``: kg = gamma_K(u) sqrt(N), kcn = gamma_N(uc),
      kck = gamma_K(uc), gamma_p(u) = p u / (1 - p u): rigorous, no false alarm
      ever, but errors must be about sqrt(K N) times larger to be seen.

    Location and correction (``correct=True``): in a flagged row, a single error e
    at column j gives ``d[:, q] = e W[j, q]`` up to round-off, so the columns
    consistent with the c mismatches (``|d_q - d_0 W[j,q]| <= tau_q + W[j,q] tau_0``
    for every q >= 1) name j; a non-finite element is its own locator. A unique
    candidate is corrected from the row checksum, ``C[i,j] = t[i,0] - sum_{l != j}
    C[i,l]`` (valid for Inf and NaN too), and the row re-verified. No consistent
    column means several errors in the row; several mean the error is too small to
    locate (``ABFTReport.limits`` gives both magnitudes). Such rows are recomputed
    from A and B with ``recompute=True``, else ``ABFTError`` is raised (it carries
    the report and C). Errors below tau are at round-off level and are reported as
    nothing at all: never "corrected".

    Parameters
    ----------
    A, B : numpy.ndarray, cupy.ndarray or torch.Tensor, float32 or float64
        Finite values. numpy inputs are computed on the CPU, the others on their GPU.
    c : int, 1 <= c <= 4
        Checksums per row. c = 1 detects only; c = 2 locates one error per row;
        c >= 3 adds consistency checks against rows with several errors.
    correct : bool
        Repair what is located (False: detect, locate and report only; the
        report's corrections then list what would have been changed, C is untouched).
    recompute : bool
        Recompute rows the checksums cannot repair instead of raising.
    inject : callable, optional
        ``inject(C)`` is called on the backend array (numpy or CuPy) between the
        GEMM and the verification: the fault-injection hook (see ``BitFlip``).
    bound : {"probabilistic", "worst-case"}
    confidence : float
        lambda above, >= 1.
    overlap : bool
        GPU: verify A and B on a side stream while the GEMM runs (and, for a
        banded product, C's first rows while the band's GEMM runs). The product
        is computed the same way either way.

    Returns
    -------
    C : array of the caller's kind, (M, N)
    report : ABFTReport

    Raises
    ------
    ABFTError
        Damage the checksums cannot locate or correct (and ``recompute=False``).
    ValueError, TypeError
        Bad shapes, dtypes, c, or non-finite inputs (nothing is modified).

    Examples
    --------
    >>> import numpy as np
    >>> from tsm_apps import abft
    >>> rng = np.random.default_rng(0)
    >>> A, B = rng.standard_normal((300, 200)), rng.standard_normal((200, 100))
    >>> C, rep = abft.ft_matmul(A, B, inject=abft.BitFlip(7, 42, bit=60))
    >>> [(f.row, f.col) for f in rep.corrections]
    [(7, 42)]
    >>> bool(np.allclose(C, A @ B))
    True
    """
    pending = _enqueue(A, B, c=c, inject=inject, bound=bound, confidence=confidence, overlap=overlap)
    return _finish(pending, correct=correct, recompute=recompute)


def _finish(p, *, correct=True, recompute=False):
    ops = p.ops
    m, k, n = ops.m, ops.k, ops.n
    rep = ABFTReport(shape=(m, k, n), dtype=str(np.dtype(ops.dtype)), c=p.c, bound=p.bound,
                     confidence=p.lam, thresholds=p.tau)
    C = p.C
    if p.rmax is None:  # empty product: nothing to check
        rep.thresholds = ops.xp.zeros((m, p.c))
        return arrays.wrap(C, ops.kind), rep
    rmax = float(p.rmax)  # the one device-to-host wait of a clean call
    if math.isnan(rmax):
        raise ValueError("ft_matmul needs finite A and B (the round-off bound of a product "
                         "with Inf or NaN, or with values whose squares overflow, is undefined)")
    rep.max_ratio = rmax
    if rmax <= 1.0:
        return arrays.wrap(C, ops.kind), rep

    xp = ops.xp
    rows_d = xp.nonzero((p.r > 1.0).any(axis=1))[0]
    rows = [int(i) for i in _to_host(rows_d)]
    rep.detected_rows = tuple(rows)
    Crows = _to_host(C[rows_d])
    d = _to_host(p.s[rows_d]) - _to_host(p.t[rows_d])
    tau = _to_host(p.tau[rows_d])
    t = _to_host(p.t[rows_d])
    W = _weights_np(n, p.c)
    failed = []
    for idx, i in enumerate(rows):
        j, v = _diagnose_row(Crows[idx], d[idx], tau[idx], t[idx], W)
        if j is None:
            failed.append(i)
            rep.uncorrectable[i] = v
            continue
        new = np.asarray(v, dtype=ops.dtype)[()]
        if correct:
            C[i, j] = new
        rep.corrections.append(Correction(i, j, Crows[idx][j].item(), new.item(), "checksum"))
    if failed and correct and recompute:
        idx = xp.asarray(failed)
        Cr = tsm_core.matmul(ops.A[idx], ops.B)
        old = _to_host(C[idx])
        new_rows = _to_host(Cr)
        # The recomputed rows must satisfy the same checks (the fault may strike again).
        where = [rows.index(i) for i in failed]
        ok = np.all(np.abs(new_rows.astype(np.float64) @ W - t[where]) <= tau[where], axis=1)
        if ok.all():
            C[idx] = Cr
            for a, i in enumerate(failed):
                del rep.uncorrectable[i]
                changed = np.nonzero(~(np.abs(new_rows[a].astype(np.float64) - old[a]) <= tau[where[a], 0]))[0]
                for j in changed:
                    rep.corrections.append(Correction(i, int(j), old[a][j].item(), new_rows[a][j].item(),
                                                      "recompute"))
            rep.recomputed_rows = tuple(failed)
            failed = []
        else:
            for a in np.nonzero(~ok)[0]:
                rep.uncorrectable[failed[a]] += "; the recomputed row failed its checksums too"
    rep.corrections.sort(key=lambda f: (f.row, f.col))
    if failed and correct:
        raise ABFTError(
            f"ft_matmul: {len(failed)} corrupted row(s) could not be corrected from {p.c} checksum(s) "
            f"(first: row {failed[0]}: {rep.uncorrectable[failed[0]]}); pass recompute=True to "
            "recompute such rows from A and B", rep, arrays.wrap(C, ops.kind))
    return arrays.wrap(C, ops.kind), rep


def _diagnose_row(row, d, tau, t, W):
    """Locate and repair the single error of a flagged row.

    Returns (column, corrected value) or (None, reason). Two stages: the columns
    whose weights are consistent with the c mismatches (``|d_q - d_0 W[j,q]| <=
    tau_q + W[j,q] tau_0``, widened by the round-off of summing this row as it
    is: a huge corrupted element makes the computed checksums inexact), then,
    for each such column, the repair the row checksum implies, ``v = t_0 - sum_{l
    != j} C[i,l]``, must satisfy every checksum within tau. Sums that leave the
    suspect out are free of its magnitude, so the second test is as sharp as
    the threshold itself.
    """
    n, c = W.shape
    bad = np.nonzero(~np.isfinite(row))[0]
    if bad.size > 1:
        return None, f"{bad.size} non-finite elements"
    with np.errstate(invalid="ignore"):
        r64 = row.astype(np.float64)
    if bad.size == 1:
        cand = bad
    elif c == 1:
        return None, "c = 1 detects errors but cannot locate them"
    else:
        big = float(np.max(np.abs(r64)))
        rn = big * float(np.linalg.norm(r64 / big)) if big > 0 else 0.0
        wn = np.sqrt((W * W).sum(axis=0))
        slack = 2.0 * n * 2.0**-53 * rn * wn  # summing this row in float64, on either side
        with np.errstate(all="ignore"):
            if np.all(np.isfinite(d)):
                dev = np.abs(d[None, 1:] - d[0] * W[:, 1:])
                tol = (tau[None, 1:] + slack[None, 1:]) + W[:, 1:] * (tau[0] + slack[0])
                cand = np.nonzero(np.all(dev <= tol, axis=1))[0]
            else:  # the checksum overflowed: the huge element is the only suspect
                cand = np.array([int(np.argmax(np.abs(r64)))])
    if cand.size > 64:
        return None, f"error too small to locate: {cand.size} columns consistent with the mismatches"
    found = []
    for j in cand.tolist():
        rest = np.delete(r64, j)
        v = t[0] - rest.sum()
        res = np.abs(rest @ np.delete(W, j, axis=0) + v * W[j] - t)
        if np.all(res <= tau):
            found.append((j, v))
    if len(found) == 1:
        return found[0]
    if not found:
        return None, "mismatches inconsistent with a single error (several corrupted elements)"
    return None, f"error too small to locate: {len(found)} columns consistent with the mismatches"
