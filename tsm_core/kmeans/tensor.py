"""The assignment on the tensor cores (``mma.cu``) and the margin rule's decisions.

A ``TensorAssign`` holds one workspace for rows of a given count, d and k in one
precision:

- ``"tf32"``: float32 rows, TF32 products (rows truncated, centres rounded to
  10-bit mantissas),
  float32 accumulation; labels may differ from exact ones on near ties.
- ``"float32"``: the same products (on the warpgroup-MMA kernel, three bfloat16
  products of the rows and centres split into bfloat16 pairs: ``TSM_KMEANS_SPLIT``),
  then the margin rule: a row whose best and
  second-best computed distances lie within the products' error bound (``margin``)
  is decided again in float64, between its two best centres when the third is
  clear of the bound, else against every centre. Labels then equal those of a
  float64 evaluation of the same centres except where float64 itself ties.
  From k = SCREEN_MIN_K centres (``TSM_KMEANS_SCREEN`` forces it on or off) the
  warpgroup kernel runs one TF32 product (rows rounded to nearest TF32) keeping
  each row's best and second distance only, and the rows within the TF32 bound of a tie are gathered and
  assigned again as above (the same labels; the other rows' distances carry TF32's
  rounding).
- ``"bfloat16"`` / ``"float16"``: 16-bit rows (CuPy uint16 words holding bfloat16,
  or float16), 16-bit products, float32 accumulation.

Rows longer than the warpgroup kernels take go to ``longrows.LongAssign`` where
``configs.use_long`` says (cuBLAS's products; the same labels contract).

Float32 rows are shifted by the centres' mean as they are read (distances do not
change; the products' rounding, which scales with ||x - mu|| ||c - mu||, shrinks).
"""

from __future__ import annotations

import numpy as np

from tsm_core.kmeans.configs import (MMA_BM, MMA_BN, MMA_KW, MMA_STAGES, WG_STAGES, mma_groups, mma_smem,
                                     use_long, use_persist, use_wg, use_ws, wg_smem, wgp_smem, wgp_stages, ws_smem,
                                     ws_stages)
from tsm_core.kmeans.decide import _cc, _kernel, _sms, decide_full, decide_listed, margin
from tsm_core.kmeans.launch import NULL, _cp
from tsm_core.kmeans.longrows import TIN, LongAssign
from tsm_core.runtime import config

# The TF32 screen's second pass takes the listed rows in batches of rows / SCREEN_SHARE
# (uniform data lists 5-12% at d = 32-128), at least SCREEN_MIN_ROWS and at most
# SCREEN_MAX_ROWS (its workspace: a gathered float32 copy of that many rows).
SCREEN_MIN_ROWS = 8192
SCREEN_MAX_ROWS = 1 << 21
SCREEN_SHARE = 4
# The screen by default from this many centres: below, the three-product kernel is
# near the rows' read time and the second pass costs more than it saves.
SCREEN_MIN_K = 256


def ready(X) -> bool:
    """Whether the kernel can read X's rows as they are: 16-byte copies (row stride
    and address), and whole 4-byte words (16-bit rows of odd length end in half a
    word, which a copy would read past the end of the last row)."""
    ld = X.strides[0] if X.shape[0] > 1 else 16
    return ld % 16 == 0 and X.data.ptr % 16 == 0 and (X.itemsize == 4 or X.shape[1] % 2 == 0)


def aligned_copy(X):
    """X (n, d) in a buffer whose rows start 16 bytes apart (padded past d)."""
    cp = _cp()
    n, d = X.shape
    per = 16 // X.itemsize
    ld = -(-d // per) * per
    buf = cp.zeros((n, ld), dtype=X.dtype)
    buf[:, :d] = X
    return buf[:, :d]


class TensorAssign:
    """Workspace and launches of the tensor-core assignment of up to `rows` rows of d
    elements to k centres in `precision` (see the module docstring)."""

    def __init__(self, rows: int, d: int, k: int, precision: str, screen=None):
        cp = _cp()
        if precision not in TIN:
            raise ValueError(f"no tensor-core assignment in precision {precision!r}")
        self.rows, self.d, self.k, self.precision = rows, d, k, precision
        self.long = None
        if use_long(d, k, _cc(), config.flag("TSM_KMEANS_LONG"), precision):
            # Long rows: cuBLAS's dot products, folded and decided (longrows.py).
            self.long = LongAssign(rows, d, k, precision)
            self.mode, self.wg, self.ws, self.persist, self.G, self.exact = self.long.mode, False, False, False, 1, None
            self.epw = 1 if self.long.tin == 0 else 2
            return
        self.tin = TIN[precision]
        self.marg = precision == "float32"
        # The kernels' MARGIN: 0 none, 1 the margin rule, 2 the TF32 screen (rows
        # within the TF32 bound listed, then assigned by the "float32" kernel: `exact`)
        self.mode = int(self.marg)
        self.exact = None
        epw = 1 if self.tin == 0 else 2
        self.epw = epw
        dw = -(-d // epw)
        self.nk = -(-dw // MMA_KW)
        self.G = mma_groups(k, d, 4 // epw, rows)
        # Short rows on compute capability 9.0: the wgmma kernel (rows in registers);
        # "float32" there as three bfloat16 products where TSM_KMEANS_SPLIT asks.
        switch = config.flag("TSM_KMEANS_WGMMA")
        ws = use_ws(config.flag("TSM_KMEANS_WS"))
        ns = 0
        if screen is None:
            screen = config.flag("TSM_KMEANS_SCREEN")
            screen = k >= SCREEN_MIN_K if screen is None else screen
        if self.G == 1 and self.marg and screen:
            ns = use_wg(d, k, 0, _cc(), switch, ws)
            if ns:
                self.mode = 2
        if self.G == 1 and self.marg and not ns and config.text("TSM_KMEANS_SPLIT") == "bf16x3":
            ns = use_wg(d, k, 3, _cc(), switch, ws)
            if ns:
                self.tin = 3
        if self.G == 1 and not ns:
            ns = use_wg(d, k, self.tin, _cc(), switch, ws)
        self.ldw_c = -(-dw // 4) * 4 if self.tin != 3 else 2 * (-(-d // 8) * 4)
        self.Cs = cp.empty((k, self.ldw_c), dtype=cp.uint32)
        # Whole centre tiles of norms (+inf past k: the wgmma kernel copies tiles).
        self.cn = cp.full(-(-k // MMA_BN) * MMA_BN, np.inf, dtype=cp.float32)
        self.cm2 = cp.zeros(1, dtype=cp.float32)
        self.mu = cp.zeros(self.nk * MMA_KW * epw, dtype=cp.float32)
        if self.G > 1:
            self.part = cp.empty(rows * self.G * 5, dtype=cp.int32)
            self.xsq = cp.empty(rows, dtype=cp.float32)
        else:
            self.part = self.xsq = None
        if self.marg:
            self.lists = cp.empty(4 * max(rows, 1), dtype=cp.int32)
            self.counts = cp.zeros(2, dtype=cp.int32)
        else:
            self.lists = self.counts = None
        self.wg = ns > 0
        self.ea, self.eb = margin(d, split=self.tin == 3, rounded=self.mode == 2) if self.marg else (0.0, 0.0)
        self.ws = self.wg and ws
        self.persist = self.wg and not self.ws and use_persist(d, k, self.tin, config.flag("TSM_KMEANS_PERSIST"))
        self.Ct = None
        self.k_tiles = self.k_wg = None
        if self.ws:
            planes = 2 if self.tin == 3 else 1
            st = ws_stages(ns, planes)
            self.ws_rw = ns * (16 if planes == 2 else 8)  # most row words its buffers take
            self.smem = ws_smem(ns, planes, st)
            self.k_main = _kernel(f"kmeans_assign_ws<{self.tin}, {self.mode}, {ns}, {st}>", self.smem)
            self.Ct = cp.empty(-(-k // 128) * planes * 128 * ns * 8, dtype=cp.uint32)
            self.k_tiles = _kernel(f"kmeans_wg_tiles<{planes}, {ns}>")
            # rows further apart than its buffers take: the per-tile kernel
            self.wg_smem = wg_smem(ns, planes)
            self.k_wg = _kernel(f"kmeans_assign_wg<{self.tin}, {self.mode}, {ns}, {WG_STAGES}>", self.wg_smem)
        elif self.persist:
            planes = 2 if self.tin == 3 else 1
            st = wgp_stages(ns, planes)
            self.smem = wgp_smem(ns, planes, st)
            self.k_main = _kernel(f"kmeans_assign_wgp<{self.tin}, {self.mode}, {ns}, {st}>", self.smem)
        elif self.wg:
            self.smem = wg_smem(ns, 2 if self.tin == 3 else 1)
            self.k_main = _kernel(f"kmeans_assign_wg<{self.tin}, {self.mode}, {ns}, {WG_STAGES}>", self.smem)
        else:
            self.smem = mma_smem(MMA_STAGES)
            self.k_main = _kernel(f"kmeans_assign_mma<{self.tin}, {int(self.marg)}, {MMA_STAGES}>", self.smem)
        self.k_merge = _kernel(f"kmeans_mma_merge<{int(self.marg)}>") if self.G > 1 else None
        self.k_centres = _kernel(f"kmeans_mma_centres<{self.tin}>")
        self.C = None
        self.rows_seen = 0
        self.list_counts = cp.zeros(2, dtype=cp.uint64) if self.marg else None  # pairs, full (device)
        if self.mode == 2:
            # The screened rows go through the "float32" kernel in batches of `cap`:
            # gathered into 16-byte rows, their old labels beside them.
            cap = min(max(rows, 1), max(SCREEN_MIN_ROWS, min(SCREEN_MAX_ROWS, -(-rows // SCREEN_SHARE))))
            self.exact = TensorAssign(cap, d, k, "float32", screen=False)
            self.xf = cp.zeros((cap, -(-d // 4) * 4), dtype=cp.float32)
            self.lab_f = cp.empty(cap, dtype=cp.int32)
            self.md_f = cp.empty(cap, dtype=cp.float32)
            self.prev_f = cp.empty(cap, dtype=cp.int32)
            self.screened = 0

    def prepare(self, C):
        """The centres C (k, d) float32, C order, in the kernel's format: shifted by
        their mean (float32 rows), converted to 16-bit words (16-bit rows), their
        squared norms and the largest of them."""
        if self.long is not None:
            self.long.prepare(C)
            self.C = C
            return
        k, d = self.k, self.d
        if self.tin in (0, 3):
            grid = -(-self.mu.size // 256)
            _kernel("kmeans_mma_mu")((grid,), (256,), (C, np.int32(k), np.int32(d), np.int32(self.mu.size), self.mu))
        self.cm2.fill(0)
        self.k_centres((k,), (128,), (C, np.int32(k), np.int32(d), self.mu, self.Cs, np.int32(self.ldw_c),
                                      self.cn, self.cm2))
        if self.ws:
            ntile = -(-k // 128)
            per = self.Ct.size // ntile // 4  # 16-byte chunks a tile
            self.k_tiles((min(4 * _sms(), -(-ntile * per // 256)),), (256,),
                         (self.Cs, np.int32(self.ldw_c), np.int32(k), np.int32(ntile), self.Ct))
        if self.exact is not None:
            self.exact.prepare(C)
        self.C = C

    def run(self, X, labels, mind, changed, prev=None):
        """Assign the rows of X (float32, or 16-bit words; rows 16-byte aligned: see
        `ready`) to the prepared centres: labels (int32), mind (float32), the
        changed flag against `prev` (may be `labels`)."""
        n = X.shape[0]
        if n == 0:
            return
        if (X.strides[0] if n > 1 else 16) % 16 or X.data.ptr % 16:  # 16-byte row copies
            raise ValueError("rows of X must start 16 bytes apart, 16-byte aligned (see aligned_copy)")
        if n > self.rows:
            raise ValueError(f"workspace made for {self.rows} rows; got {n}")
        if self.long is not None:
            self.long.run(X, labels, mind, changed, prev)
            return
        ldw = (X.strides[0] // 4) if n > 1 else self.ldw_c
        pv = prev if prev is not None else NULL
        lists = self.lists if self.marg else NULL
        counts = self.counts if self.marg else NULL
        if self.marg:
            self.counts.fill(0)
        ws_ldw = self._ws_ldw(X) if self.ws else 0
        if ws_ldw:
            self.k_main((min(-(-n // 128), _sms()),), (384,), (
                X, np.int64(ws_ldw), np.int32(n),
                np.int32(self.d), self.Ct, self.cn, self.mu, np.int32(self.k), np.float32(self.ea),
                np.float32(self.eb), self.cm2, labels, mind, pv, changed, lists, counts, np.int32(n)),
                shared_mem=self.smem)
        elif self.wg:
            tiles = -(-n // 128)
            k_main, smem = (self.k_wg, self.wg_smem) if self.ws else (self.k_main, self.smem)
            k_main((min(tiles, _sms()) if self.persist else tiles,), (256,), (
                X, np.int64(ldw), np.int32(n), np.int32(self.d), self.Cs, np.int32(self.ldw_c), self.cn, self.mu,
                np.int32(self.k), np.float32(self.ea), np.float32(self.eb), self.cm2,
                labels, mind, pv, changed, lists, counts, np.int32(n)), shared_mem=smem)
        else:
            grid = self.G * (-(-n // MMA_BM))
            part = self.part if self.G > 1 else NULL
            xsq = self.xsq if self.G > 1 else NULL
            self.k_main((grid,), (128,), (
                X, np.int64(ldw), np.int32(n), np.int32(self.d), self.Cs, np.int32(self.ldw_c), self.cn, self.mu,
                np.int32(self.k), np.int32(self.G), np.float32(self.ea), np.float32(self.eb), self.cm2,
                labels, mind, pv, changed, lists, counts, np.int32(n), part, xsq), shared_mem=self.smem)
        if self.G > 1:
            self.k_merge((-(-n // 256),), (256,), (
                self.part, self.xsq, np.int32(n), np.int32(self.G), np.float32(self.ea), np.float32(self.eb),
                self.cm2, labels, mind, pv, changed, lists, counts, np.int32(n)))
        if not self.marg:
            return
        if self.mode == 2:
            self._screened(X, labels, mind, changed, prev)
            self.rows_seen += n
            return
        ldx = X.strides[0] // 4 if n > 1 else self.d
        decide_listed(X, ldx, self.C, self.lists, self.counts, n, labels, mind, changed, prev, self.list_counts)
        self.rows_seen += n

    def _screened(self, X, labels, mind, changed, prev):
        """The rows the TF32 screen listed (within its bound of a tie), assigned by the
        "float32" kernel in batches: their labels, distances and the changed flag
        against their old labels (`prev` is read before any is written). Reads the
        list's length (one host round trip a call)."""
        m = int(self.counts[0].get())
        self.screened += m
        cap = self.xf.shape[0]
        d = self.d
        for a in range(0, m, cap):
            idx = self.lists[a:min(m, a + cap)]
            c = idx.size
            self._gather(X, idx, prev)
            pv = self.prev_f[:c] if prev is not None else None
            self.exact.run(self.xf[:c, :d], self.lab_f[:c], self.md_f[:c], changed, pv)
            labels[idx] = self.lab_f[:c]
            mind[idx] = self.md_f[:c]

    def _gather(self, X, idx, prev):
        """Rows idx of X into the first idx.size rows of xf, and prev[idx] into prev_f
        where prev is given."""
        c = idx.size
        ldx = X.strides[0] // 4 if X.shape[0] > 1 else self.d
        _kernel("kmeans_gather_rows")((min(-(-c // 8), 8 * _sms()),), (256,), (
            X, np.int64(ldx), idx, np.int32(c), np.int32(self.d), self.xf, np.int32(self.xf.shape[1]),
            prev if prev is not None else NULL, self.prev_f))

    def _ws_ldw(self, X) -> int:
        """The row stride in words kmeans_assign_ws copies X's rows with, or 0 where it
        cannot: rows more than ws_rw words apart, or the last row's words rounded up to
        16 bytes past X's allocation (its copies are of whole 16-byte units)."""
        n = X.shape[0]
        dw4 = -(-X.shape[1] * X.itemsize // 16) * 4
        ldw = X.strides[0] // 4 if n > 1 else dw4
        if ldw > self.ws_rw:
            return 0
        mem = getattr(X.data, "mem", None)
        end = X.data.ptr + ((n - 1) * ldw + dw4) * 4
        return ldw if mem is not None and end <= mem.ptr + mem.size else 0

    @property
    def stats(self) -> dict:
        """Margin-rule counts over the calls so far ("float32"): rows assigned, rows
        decided between their two best centres, rows decided against every centre
        (reading them waits for the GPU)."""
        if self.long is not None:
            return self.long.stats
        if self.mode == 2:
            ex = self.exact.stats
            return {"rows": self.rows_seen, "screened": self.screened, "pairs": ex["pairs"], "full": ex["full"]}
        pairs, full = (int(v) for v in self.list_counts.get()) if self.marg else (0, 0)
        return {"rows": self.rows_seen, "pairs": pairs, "full": full}


_BF16 = []  # the conversion kernel, made on first use


def to_bfloat16_words(X, out=None):
    """float32/float64 CuPy X as bfloat16 (round to nearest even; NaN stays NaN) in
    uint16 words: one pass over X's float32 words.

    Examples
    --------
    >>> import cupy as cp  # doctest: +SKIP
    >>> to_bfloat16_words(cp.asarray([1.0, -2.5, 1 + 2 ** -9], dtype=cp.float32)).tolist()  # doctest: +SKIP
    [16256, 49184, 16256]
    """
    cp = _cp()
    if not _BF16:
        _BF16.append(cp.ElementwiseKernel(
            "uint32 u", "uint16 r",
            "r = (u & 0x7FFFFFFFu) > 0x7F800000u ? (unsigned short)((u >> 16) | 0x40u)"
            " : (unsigned short)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16)",
            "tsm_kmeans_to_bfloat16"))
    x32 = cp.ascontiguousarray(X, dtype=cp.float32)
    if out is None:
        out = cp.empty(x32.shape, dtype=cp.uint16)
    _BF16[0](x32.view(cp.uint32), out)
    return out


def bfloat16_to_float32(W):
    """uint16 words holding bfloat16 as float32 (exact)."""
    cp = _cp()
    return (W.astype(cp.uint32) << 16).view(cp.float32)


__all__ = ["TensorAssign", "margin", "ready", "aligned_copy", "decide_full", "to_bfloat16_words",
           "bfloat16_to_float32"]
