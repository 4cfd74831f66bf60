"""Long rows (above the warpgroup kernels' 128 words) with cuBLAS forming the dot
products: float32 rows in "tf32" and "float32", 16-bit rows in "bfloat16" and
"float16" (cuBLAS's 16-bit products of the rows as they are, float32 accumulation,
then the fold of step 1).

The fused ``mma.sync`` kernel runs at a quarter of cuBLAS's TF32 rate on rows of
256-4096 words, and its margin rule sends most rows of d = 2048-4096 to float64
decisions against every centre. Here, in blocks of rows:

1. ``kmeans_long_center`` writes x' = x - mu rounded to nearest TF32 and ||x'||^2;
   cuBLAS (TF32 compute; both operands already TF32, so its conversion is exact)
   forms x'.c' against the centres rounded to nearest TF32, and ``kmeans_long_top``
   folds each row's products into its best centre: "tf32" stops here.
2. "float32": a row whose two best lie within the TF32 bound (``margin(d,
   rounded=True)``) is listed instead. The listed rows are split into bfloat16 pairs
   (``kmeans_long_split``: [xh | xh | xl] against the centres' [ch | cl | ch], so one
   GEMM of depth 3 dp forms xh.ch + xh.cl + xl.ch) and cuBLAS sums that depth in
   chunks of at most SPLIT_CHUNK values (one GEMM a chunk, strided-batched), added in
   order by ``kmeans_long_top``: the accumulation error then grows with the chunk, not
   with 3 d (``margin_chunked``), 4-10 times below the TF32 bound at d = 129-4096.
3. The rows still within that bound are decided in float64, between their two best
   centres where the third is clear of the bound, else against every centre (the
   fused route's decisions, ``tensor.py``).

The labels are therefore those of a float64 evaluation of the same centres except
where float64 itself ties, as on every "float32" route; the distances of rows decided
in step 1 carry TF32's rounding.
"""

from __future__ import annotations

import numpy as np

from tsm_core.kmeans.launch import NULL, _cp
from tsm_core.kmeans.decide import _kernel, _sms, decide_listed, margin

BLOCK_BYTES = 256 << 20  # a block's shifted rows, or its products, at most this
SPLIT_CHUNK = 1536  # most values of one cuBLAS accumulation in the split products
MIN_BLOCK = 4096  # rows a block takes at least (cuBLAS calls cost ~30 us of host time),
MAX_BLOCK_BYTES = 1 << 30  # unless that would pass this


def block_rows(rows: int, per_row: int) -> int:
    """Rows a block takes where each costs `per_row` bytes of workspace: BLOCK_BYTES'
    worth, at least MIN_BLOCK (fewer where MIN_BLOCK would pass MAX_BLOCK_BYTES), at
    most `rows`.

    >>> block_rows(10**6, 4 * 1024), block_rows(10**6, 4 * 16), block_rows(100, 64), block_rows(10**6, 2 << 20)
    (65536, 1000000, 100, 512)
    """
    return max(1, min(rows, max(min(MIN_BLOCK, MAX_BLOCK_BYTES // per_row), BLOCK_BYTES // per_row)))

# cuBLAS constants (cublas_api.h, library_types.h)
_OP_N, _OP_T = 0, 1
_R_32F, _R_16F, _R_16BF = 0, 2, 14
_COMPUTE_32F, _COMPUTE_32F_FAST_TF32 = 68, 77
_ALGO_DEFAULT = -1
_ONE = np.array(1.0, dtype=np.float32)
TIN = {"tf32": 0, "float32": 0, "bfloat16": 1, "float16": 2}  # the operands' word format (mma.cu's TIN)
_ZERO = np.array(0.0, dtype=np.float32)


def chunks(d: int) -> tuple[int, int, int]:
    """(dp, kc, nb) of the split products of rows of d values: each part padded to dp
    values (a multiple of 8), the depth 3 dp cut into nb chunks of kc values (a
    multiple of 8; the last padded with zeros).

    >>> chunks(4096), chunks(256), chunks(129)
    ((4096, 1536, 8), (256, 768, 1), (136, 408, 1))
    """
    dp = -(-d // 8) * 8
    nb = -(-3 * dp // SPLIT_CHUNK)
    kc = -(-(3 * dp) // (8 * nb)) * 8
    return dp, kc, nb


def margin_chunked(d: int) -> tuple[float, float]:
    """(ea, eb) of the bound B = ea cm ||x'|| + eb cm^2 for the split products summed
    in chunks (``chunks``), as ``tensor.margin`` derives it for the warpgroup kernel's
    split: the split drops at most 3.1 2^-16 |x'_l c'_l| of each element's product;
    the products of the bfloat16 parts are exact in float32; a chunk's kc terms are
    added in float32 in any order (cuBLAS may split the depth too), at most kc 2^-23
    of the sum of their magnitudes (round toward zero), and the nb chunk sums added in
    order add at most nb 2^-23 of the same; the terms' magnitudes sum to at most
    1.01 sum |x'_l c'_l|.

    >>> from tsm_core.kmeans.decide import margin
    >>> round(margin(4096, rounded=True)[0] / margin_chunked(4096)[0], 1)
    6.3
    >>> round(margin(256, rounded=True)[0] / margin_chunked(256)[0], 1)
    7.1
    """
    _, kc, nb = chunks(d)
    eps_d = 3.1 * 2.0 ** -16 + (kc + nb) * 2.0 ** -23 * 1.01 ** 2
    ea = 2 * (2 * eps_d + 3.1 * 2.0 ** -23) * 1.25
    eb = 2 * 2.0 ** -22 * 1.25
    return ea, eb


def _gemm(h, m, n, k, A, lda, B, ldb, C, ldc, dtype, compute, batch=1, sa=0, sb=0, sc=0):
    """Column-major C (m, n) = A^T B on cuBLAS: A (k, m) lda apart, B (k, n) ldb
    apart, C ldc apart (pointers); `batch` GEMMs with strides sa, sb, sc elements."""
    from cupy_backends.cuda.libs import cublas

    if batch == 1:
        cublas.gemmEx(h, _OP_T, _OP_N, m, n, k, _ONE.ctypes.data, A, dtype, lda, B, dtype, ldb,
                      _ZERO.ctypes.data, C, _R_32F, ldc, compute, _ALGO_DEFAULT)
    else:
        cublas.gemmStridedBatchedEx(h, _OP_T, _OP_N, m, n, k, _ONE.ctypes.data, A, dtype, lda, sa, B, dtype, ldb,
                                    sb, _ZERO.ctypes.data, C, _R_32F, ldc, sc, batch, compute, _ALGO_DEFAULT)


def _handle():
    """CuPy's cuBLAS handle on the current stream, host pointer mode."""
    from cupy_backends.cuda.libs import cublas

    cp = _cp()
    h = cp.cuda.device.get_cublas_handle()
    cublas.setStream(h, cp.cuda.get_current_stream().ptr)
    cublas.setPointerMode(h, cublas.CUBLAS_POINTER_MODE_HOST)
    return h


class LongAssign:
    """Workspace and launches of the long-row assignment (module docstring) of up to
    `rows` rows of d values to k centres in `precision` ("tf32", "float32",
    "bfloat16", "float16"): the interface of ``tensor.TensorAssign`` (prepare, run,
    stats)."""

    def __init__(self, rows: int, d: int, k: int, precision: str):
        cp = _cp()
        if precision not in TIN:
            raise ValueError(f"no long-row assignment in precision {precision!r}")
        self.rows, self.d, self.k, self.precision = rows, d, k, precision
        self.tin = TIN[precision]
        self.marg = precision == "float32"
        self.mode = 2 if self.marg else 0
        # float32 rows: words of the shifted copy; 16-bit rows: words of the centres
        # (two values each), the rows read as they are
        self.ldxs = -(-d // 4) * 4 if self.tin == 0 else -(-d // 8) * 4
        self.dp, self.kc, self.nb = chunks(d)
        self.kp = self.kc * self.nb  # the split rows' depth, padded
        self.block = block_rows(rows, 4 * max(self.ldxs, k))
        self.Xs = cp.empty((self.block, self.ldxs), dtype=cp.float32) if self.tin == 0 else None
        self.D = cp.empty((self.block, k), dtype=cp.float32)
        self.xx = cp.empty(self.block, dtype=cp.float32)
        self.mu = cp.zeros(max(2 * self.ldxs, self.dp), dtype=cp.float32)  # zero for 16-bit rows
        self.Cs = cp.empty((k, self.ldxs), dtype=cp.uint32)  # c' rounded to TF32, or 16-bit pairs
        self.cn = cp.empty(k, dtype=cp.float32)
        self.cm2 = cp.zeros(1, dtype=cp.float32)
        self.ea, self.eb = margin(d, rounded=True) if self.marg else (0.0, 0.0)
        self.rows_seen = self.screened = 0
        if self.marg:
            self.lists = cp.empty(max(rows, 1), dtype=cp.int32)
            # the split pass's pairs (row, best, second) then its full list, as the
            # fused kernel's margin rule leaves them for kmeans_pair_decide / _full_decide
            self.lists2 = cp.empty(4 * max(rows, 1), dtype=cp.int32)
            self.counts = cp.zeros(3, dtype=cp.int32)  # listed by the TF32 pass; pairs; full
            self.list_counts = cp.zeros(2, dtype=cp.uint64)  # pairs, full (stats)
            self.C3w = cp.empty((k, self.dp), dtype=cp.uint32)  # [ch | cl] words (kmeans_mma_centres<3>)
            self.C3 = cp.zeros((k, self.kp), dtype=cp.uint16)  # [ch | cl | ch | 0]
            self.cn3 = cp.empty(k, dtype=cp.float32)
            self.cm2_3 = cp.zeros(1, dtype=cp.float32)
            self.ea3, self.eb3 = margin_chunked(d)
            # the split rows' batch: its rows [xh | xh | xl] and its nb planes of products
            self.block3 = block_rows(rows, 4 * max(self.kp // 2, k * self.nb))
            self.W = cp.empty((self.block3, self.kp), dtype=cp.uint16)
            self.P = cp.empty((self.nb, self.block3, k), dtype=cp.float32)
            self.xx3 = cp.empty(self.block3, dtype=cp.float32)
        self.C = None

    def prepare(self, C):
        """The centres C (k, d) float32, C order: for float32 rows their mean and
        c' = c - mu rounded to TF32, for 16-bit rows c in 16 bits; their squared
        norms; and ("float32") the bfloat16 split of c'."""
        k, d = self.k, self.d
        if self.tin == 0:
            _kernel("kmeans_mma_mu")((-(-self.mu.size // 256),), (256,),
                                     (C, np.int32(k), np.int32(d), np.int32(self.mu.size), self.mu))
        self.cm2.fill(0)
        _kernel(f"kmeans_mma_centres<{self.tin}>")((k,), (128,), (C, np.int32(k), np.int32(d), self.mu, self.Cs,
                                                                 np.int32(self.ldxs), self.cn, self.cm2))
        if self.marg:
            self.cm2_3.fill(0)
            _kernel("kmeans_mma_centres<3>")((k,), (128,), (C, np.int32(k), np.int32(d), self.mu, self.C3w,
                                                            np.int32(self.dp), self.cn3, self.cm2_3))
            h = self.C3w.view(np.uint16)  # (k, 2 dp): ch then cl
            dp = self.dp
            self.C3[:, :2 * dp] = h
            self.C3[:, 2 * dp:3 * dp] = h[:, :dp]
        self.C = C

    def run(self, X, labels, mind, changed, prev=None):
        """Assign the rows of X (float32, or 16-bit words as ``TensorAssign`` takes them;
        rows 16-byte aligned, as ``TensorAssign.run`` checks) to the prepared centres:
        labels (int32), mind (float32), the changed flag against `prev` (may be
        `labels`). "float32" reads the listed rows' counts (host round trips)."""
        n = X.shape[0]  # checked by TensorAssign.run: 1 <= n <= rows, rows aligned
        ldx = X.strides[0] // 4 if n > 1 else self.ldxs  # words
        h = _handle()
        k, d, sms = self.k, self.d, _sms()
        pv = prev if prev is not None else NULL
        lists = self.lists if self.marg else NULL
        counts = self.counts if self.marg else NULL
        if self.marg:
            self.counts.fill(0)
        top = _kernel(f"kmeans_long_top<{self.mode}>")
        for a in range(0, n, self.block):
            r = min(n, a + self.block) - a
            if self.tin == 0:
                _kernel("kmeans_long_center")((min(-(-r // 8), 8 * sms),), (256,), (
                    X[a:], np.int64(ldx), np.int32(r), np.int32(d), self.mu, self.Xs, np.int32(self.ldxs), self.xx))
                _gemm(h, k, r, d, self.Cs.data.ptr, self.ldxs, self.Xs.data.ptr, self.ldxs, self.D.data.ptr, k,
                      _R_32F, _COMPUTE_32F_FAST_TF32)
            else:
                _kernel(f"kmeans_long_sqnorm<{self.tin}>")((min(-(-r // 8), 8 * sms),), (256,), (
                    X[a:], np.int64(ldx), np.int32(r), np.int32(-(-d // 2)), self.xx))
                _gemm(h, k, r, d, self.Cs.data.ptr, 2 * self.ldxs, X[a:].data.ptr, 2 * ldx, self.D.data.ptr, k,
                      _R_16BF if self.tin == 1 else _R_16F, _COMPUTE_32F)
            top((min(-(-r // 8), 8 * sms),), (256,), (
                self.D, np.int32(1), np.int64(0), np.int32(r), np.int32(k), self.cn, self.xx, NULL, np.int32(a),
                np.float32(self.ea), np.float32(self.eb), self.cm2, labels, mind, pv, changed, lists, counts,
                np.int32(n)))
        self.rows_seen += n
        if not self.marg:
            return
        m = int(self.counts[0].get())
        self.screened += m
        for a in range(0, m, self.block3):
            idx = self.lists[a:min(m, a + self.block3)]
            c = idx.size
            _kernel("kmeans_long_split")((min(-(-c // 8), 8 * sms),), (256,), (
                X, np.int64(ldx), np.int32(d), np.int32(self.dp), idx, np.int32(c), self.mu, self.W,
                np.int32(self.kp), self.xx3))
            _gemm(h, k, c, self.kc, self.C3.data.ptr, self.kp, self.W.data.ptr, self.kp, self.P.data.ptr, k,
                  _R_16BF, _COMPUTE_32F, batch=self.nb, sa=self.kc, sb=self.kc, sc=self.block3 * k)
            _kernel("kmeans_long_top<1>")((min(-(-c // 8), 8 * sms),), (256,), (
                self.P, np.int32(self.nb), np.int64(self.block3 * k), np.int32(c), np.int32(k), self.cn3, self.xx3,
                idx, np.int32(0), np.float32(self.ea3), np.float32(self.eb3), self.cm2_3, labels, mind, pv, changed,
                self.lists2, self.counts[1:], np.int32(n)))
        if not m:
            return
        # The rows still within the bound: in float64 between their two best centres
        # where the third is clear of it, else against every centre.
        decide_listed(X, ldx, self.C, self.lists2, self.counts[1:], n, labels, mind, changed, prev, self.list_counts)

    @property
    def stats(self) -> dict:
        """Rows assigned so far, rows the TF32 pass listed, rows decided in float64
        between two centres and against every centre (reading them waits for the GPU)."""
        pairs, full = (int(v) for v in self.list_counts.get()) if self.marg else (0, 0)
        return {"rows": self.rows_seen, "screened": self.screened, "pairs": pairs, "full": full}
