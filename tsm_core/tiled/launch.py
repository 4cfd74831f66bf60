"""Launches of the plain GEMM kernels (gemm_tiled, gemm_async, gemm_pipe, gemm_ws) on
CuPy arrays: operand layouts, the planner's kernel with peeled strips and realigned
copies, the split-K tail and its reduction, and programmatic dependent launches
(PDL) through the driver.
"""

from __future__ import annotations

import functools

import numpy as np

from tsm_core.runtime import arrays as _arrays
from tsm_core.runtime import compile as _compile
from tsm_core.runtime import device as _device
from tsm_core.runtime.launch import func_ptr
from tsm_core.runtime.log import get_logger
from tsm_core.tiled import configs
from tsm_core.tiled.kernels import (async_name, gemm_name, pipe_name, pipe_smem, reduce_name,
                                    ws_name, ws_smem)
from tsm_core.tiled.plan import _tile_of, plan_peel, plan_plain, plan_tail_split
from tsm_core.tsm2.launch import a_layout, launch_tsm2r

_log = get_logger(__name__)


def _operand(X, transposed: bool):
    """(contiguous-along-k, leading dimension, 16-byte vectors ok, array to read).

    A (m, k) is passed as is; B (k, n) as B.T (n, k), so that for both the question
    is whether the second axis (k) is the contiguous one."""
    lay, X2 = a_layout(X.T if transposed else X)
    arr = X2.T if transposed else X2
    v = configs.VEC[X.itemsize]
    return (not lay.col), lay.lda, lay.vec == v, arr


def _grid(m, n, item, nz=1, wn=2):
    bm, bn = configs.TILE[item]
    bn = bn * wn // 2
    return (-(-m // bm) * -(-n // bn), 1, nz)


def _launch_gemm(A, B, C, alpha, beta, bk=None, wn=2, split=None):
    """C = alpha A @ B + beta C on CuPy arrays (checked; m, n, k >= 1).

    ``split``: None plans a split-K tail (``plan_tail_split``), False never splits,
    (t1, S) forces one (tests)."""
    m, k = A.shape
    n = B.shape[1]
    A0, B0 = A, B
    a_k, lda, va, A = _operand(A, False)
    b_k, ldb, vb, B = _operand(B, True)
    item = A.itemsize
    T = np.float32 if item == 4 else np.float64
    # The wide tile's whole tiles run on gemm_pipe where both operands have vectors
    # (the same tile and tile order; the split-K tail stays on gemm_tiled).
    pipe = wn == 4 and item == 4 and va and vb and configs.USE_PIPE
    bk = bk or configs.DEFAULT_BK[item]
    if wn == 4 and bk == 16 and not (va and vb):
        bk = 8  # scalar loads at BK = 16 need more than 255 registers (ptxas spills)
    rs, cs = (s // item for s in C.strides)
    bm, bn = configs.TILE[item][0], configs.TILE[item][1] * wn // 2
    tiles = -(-m // bm) * -(-n // bn)
    if split is None:
        occ = configs.PLAIN_OCC if wn == 2 else configs.WIDE_OCC
        split = plan_tail_split(tiles, _device.sm_count(C.data.device_id) * occ, k, bk)
    t1, S = split if split else (tiles, 1)
    common = (A, B, C, np.int32(m), np.int32(n), np.int32(k), np.int64(lda), np.int64(ldb),
              np.int64(rs), np.int64(cs), T(alpha), T(beta), np.uint64(0))

    def launch(grid, split_variant, tail_args):
        # (a small problem split whole never compiles the unsplit variant)
        kern = _compile.get_kernel("gemm", gemm_name(A.dtype, a_k, b_k, va, vb, bk, wn=wn,
                                                     split=split_variant))
        kern((grid,), (configs.THREADS,), common + tail_args, shared_mem=_dynamic_smem(kern, item, bk, wn))

    if t1 > 0 and pipe:
        _launch_pipe(A0, B0, C, alpha, beta, tiles=t1)
    elif t1 > 0:
        launch(t1, False, (np.int32(0), np.int32(1), np.int32(k), np.uint64(0)))
    if t1 < tiles:
        import cupy

        rem = tiles - t1
        kchunk = -(-(-(-k // S)) // bk) * bk  # whole k-tiles per range
        S = -(-k // kchunk)  # rounding kchunk up can leave the last range(s) empty
        W = cupy.empty(rem * S * bm * bn, dtype=A.dtype)
        launch(rem * S, True, (np.int32(t1), np.int32(S), np.int32(kchunk), W))
        red = _compile.get_kernel("gemm", reduce_name(A.dtype, bm, bn))
        blocks = min(-(-(rem * bm * bn) // configs.THREADS), 8 * _device.sm_count(C.data.device_id))
        red((blocks,), (configs.THREADS,), (W, np.int32(S), np.int32(t1), np.int32(rem), C, np.int32(m),
                                    np.int32(n), np.int64(rs), np.int64(cs), T(alpha), T(beta)))


def _dynamic_smem(kern, item, bk, wn):
    """Bytes of dynamic shared memory gemm_tiled takes (0: its static buffers fit)."""
    bm, bn = configs.TILE[item]
    v = configs.VEC[item]
    need = 2 * bk * (bm + v + bn * wn // 2 + v) * item
    if need <= configs.SMEM_DEFAULT:
        return 0
    if getattr(kern, "max_dynamic_shared_size_bytes", 0) < need:
        kern.max_dynamic_shared_size_bytes = need
    return need


def _realigned(X, stream):
    """X's values in a fresh buffer whose leading dimension is a multiple of 16 bytes
    (the same layout). The buffer comes from the current stream's pool; the copy runs
    on ``stream``. gemm_tiled's edge blocks read the padding (a vector that starts
    inside the matrix may end there; what it produces is not stored), so the copy
    kernel (``realign_copy``) zeroes it: a read of uninitialized memory would be
    flagged by compute-sanitizer's initcheck and could carry NaN through registers
    for nothing."""
    import cupy

    if X.strides[0] == X.itemsize and X.shape[1] > 1:  # column-major: pad the columns
        return _realigned(X.T, stream).T
    v, item = configs.VEC[X.itemsize], X.itemsize
    rows, cols = X.shape
    ld = X.strides[0] // item if rows > 1 else cols
    buf = cupy.empty((rows, -(-cols // v) * v), dtype=X.dtype)
    kern = _compile.get_kernel("gemm", f"realign_copy<{_compile.ctype(X.dtype)}>")
    groups = buf.shape[1] // v
    grid = (-(-groups // configs.THREADS), min(rows, 65535))
    with stream:
        kern(grid, (configs.THREADS,), (X, np.int64(ld), buf, np.int64(buf.shape[1]), np.int32(rows),
                                np.int32(cols)))
    return buf[:, :cols]


def _plain(A, B, C, alpha, beta):
    """The planner's plain kernel for C = alpha A @ B + beta C (CuPy, m, n, k >= 1)."""
    m, k = A.shape
    n = B.shape[1]
    kind, cfg = plan_plain(m, n, A.itemsize, _device.sm_count(C.data.device_id), k)
    bm, bn = _tile_of(kind, cfg, A.itemsize)
    pm, pn = plan_peel(m, n, A.itemsize, (bm, bn))
    realign = kind != "async" and m * n * k >= configs.REALIGN_RATIO * (m * k + k * n)
    if pm or pn or (realign and not (_aligned(A) and _aligned(B.T))):
        return _launch_peeled(A, B, C, alpha, beta, pm, pn, kind, cfg, realign)
    return _launch_kind(kind, cfg, A, B, C, alpha, beta)


def _aligned(X):
    """True if the kernels can read X (as A: (rows, k)) with 16-byte vectors."""
    item = X.itemsize
    s0, s1 = X.strides
    ld = s0 // item if s1 == item else (s1 // item if s0 == item else 0)
    return ld > 0 and ld % configs.VEC[item] == 0 and X.data.ptr % 16 == 0


def _launch_kind(kind, cfg, A, B, C, alpha, beta):
    if kind == "async":
        return _launch_async(A, B, C, alpha, beta, cfg)
    if kind == "wide":
        bk = 16 if A.shape[1] >= configs.WIDE_BK16_MIN_K else 8
        return _launch_gemm(A, B, C, alpha, beta, bk=bk, wn=4)
    return _launch_gemm(A, B, C, alpha, beta)


def _launch_peeled(A, B, C, alpha, beta, pm, pn, kind="tiled", cfg=None, realign=False):
    """The planner's kernel on the whole tiles of C, TSM2R on the last pm rows and pn
    columns (none if both are 0), the strips on a second stream while the tiles run.

    The three pieces of C are disjoint, so each takes alpha and beta as they are.
    With ``realign``, an operand whose leading dimension is not 16-byte aligned is
    first copied into an aligned buffer for the tile kernel (B on the second stream,
    A on the caller's, at the same time); the strips read the operands as they are.
    Every buffer is allocated on the caller's stream, and that stream waits for the
    second one before anything after this call, so the memory pool hands no buffer
    to later work while a copy or a strip still uses it."""
    import cupy

    m, n = A.shape[0], B.shape[1]
    mm, nn = m - pm, n - pn
    main = cupy.cuda.get_current_stream()
    side = _arrays.side_stream("gemm-strips")
    v = configs.VEC[A.itemsize]
    At, Bt = A, B  # what the tile kernel reads
    if realign:
        lay, At = a_layout(A)  # (A itself, or its C-ordered copy if no axis is contiguous)
        if lay.vec != v:
            At = _realigned(At, main)
        lay, Btt = a_layout(B.T)
        Bt = Btt.T if lay.vec == v else None
    side.wait_event(main.record())
    if Bt is None:
        Bt = _realigned(Btt.T, side)
    b_ready = side.record()
    with side:
        if pn:
            launch_tsm2r(A[:mm], B[:, nn:], C[:mm, nn:], alpha, beta)
        if pm:  # the full last rows, corner included: C[mm:]^T = B^T A[mm:]^T
            launch_tsm2r(B.T, A[mm:].T, C[mm:].T, alpha, beta)
        done = side.record()
    main.wait_event(b_ready)
    _launch_kind(kind, cfg, At[:mm], Bt[:, :nn], C[:mm, :nn], alpha, beta)
    main.wait_event(done)


def _launch_async(A, B, C, alpha, beta, cfg=None):
    """C = alpha A @ B + beta C with gemm_async, or gemm_tiled where gemm_async has
    no register-clean variant (A and B both contiguous along k).

    C-ordered A and B (A contiguous along k, B along n) run as C^T = B^T A^T: the
    kernel then reads B^T along its rows and A^T along k, the variant that fits in 128
    registers (the direct one needs ~147). The price is a scattered store of C^T in
    the epilogue, once per block."""
    m, k = A.shape
    n = B.shape[1]
    a_k, lda, va, A2 = _operand(A, False)
    b_k, ldb, vb, B2 = _operand(B, True)
    if a_k and not b_k:
        return _launch_async(B.T, A.T, C.T, alpha, beta, cfg)
    if a_k and b_k:
        return _launch_gemm(A, B, C, alpha, beta)
    item = A2.itemsize
    cfg = cfg or configs.ASYNC_TILES[item][0]
    T = np.float32 if item == 4 else np.float64
    kern = _compile.get_kernel("gemm", async_name(A2.dtype, a_k, b_k, va, vb, cfg))
    rs, cs = (s // item for s in C.strides)
    v = configs.VEC[item]
    st_a = cfg.bm * (cfg.bk + v) if a_k else cfg.bk * (cfg.bm + v)
    st_b = cfg.bn * (cfg.bk + v) if b_k else cfg.bk * (cfg.bn + v)
    smem = cfg.stages * (st_a + st_b) * item
    if smem > configs.SMEM_LIMIT:
        raise ValueError(f"gemm_async tile {cfg} needs {smem} bytes of shared memory; "
                         f"at most {configs.SMEM_LIMIT} (fewer stages or a smaller tile)")
    if smem > configs.SMEM_DEFAULT and getattr(kern, "max_dynamic_shared_size_bytes", 0) < smem:
        kern.max_dynamic_shared_size_bytes = smem
    grid = (-(-m // cfg.bm) * -(-n // cfg.bn), 1, 1)
    kern(grid, (configs.THREADS,),
         (A2, B2, C, np.int32(m), np.int32(n), np.int32(k), np.int64(lda), np.int64(ldb),
          np.int64(rs), np.int64(cs), T(alpha), T(beta)), shared_mem=smem)


def _pipe_kernel(name, smem):
    kern = _compile.get_kernel("gemm", name)
    if getattr(kern, "max_dynamic_shared_size_bytes", 0) < smem:
        kern.max_dynamic_shared_size_bytes = smem
    return kern


def ws_ok(item, a_k, b_k, k, sig=(1, 1, 1), device_id=None, fused=False):
    """True if gemm_ws can run this product: float32, A contiguous along k, at most two
    terms an operand, a compute capability 9.0 device; the plain product B in either
    layout and any K (its last k-tile zero-filled), a fused one B contiguous along n
    and K % 16 == 0 (with the zero fill its producers spill: those stay on gemm_pipe).
    A contiguous along m stays on gemm_pipe (a gemm_ws path for it spilled)."""
    lay_ok = a_k and (not b_k or not fused)  # A along m: gemm_pipe (see tiled/gemm.cu)
    return (item == 4 and lay_ok and (k % 16 == 0 or not fused) and max(sig[:2]) <= 2
            and _cc(device_id) == 90 and _ws_builds())


@functools.lru_cache(maxsize=None)
def _ws_builds() -> bool:
    """True if this CuPy's NVRTC builds gemm_ws (sm_90a); else a warning, once, and
    gemm_pipe in its place."""
    try:
        _compile.get_kernel("gemm", ws_name())
    except Exception as exc:  # noqa: BLE001 (an NVRTC without sm_90a, say)
        _log.warning("gemm_ws does not build here (%s: %s); tsm_core.gemm and strassen "
                     "use gemm_pipe instead", type(exc).__name__, exc)
        return False
    return True


def _launch_ws(A, B, C, alpha, beta, tiles=None):
    """C = alpha A @ B + beta C with gemm_ws (``ws_ok`` holds; 16-byte vectors)."""
    m, k = A.shape
    n = B.shape[1]
    a_k, lda, va, A2 = _operand(A, False)
    b_k, ldb, vb, B2 = _operand(B, True)
    if not (va and vb and ws_ok(A2.itemsize, a_k, b_k, k, device_id=C.data.device_id)):
        raise ValueError("gemm_ws needs float32 operands with 16-byte vectors and a "
                         "compute capability 9.0 device")
    smem = ws_smem()
    _launch_wide(_pipe_kernel(ws_name(k=k, b_k=b_k), smem), configs.WS_THREADS, smem,
                 A2, B2, C, (m, n, k), lda, ldb, alpha, beta, tiles)


def _launch_wide(kern, threads, smem, A2, B2, C, mnk, lda, ldb, alpha, beta, tiles):
    """One plain launch of a 128 x 256 tile kernel (gemm_pipe, gemm_ws) on tiles
    [0, tiles) of C (all by default); A2, B2, lda, ldb as `_operand` gives them."""
    m, n, k = mnk
    rs, cs = (s // 4 for s in C.strides)
    bm, bn = configs.PIPE_TILE
    grid = (tiles if tiles is not None else -(-m // bm) * -(-n // bn), 1, 1)
    kern(grid, (threads,),
         (A2, B2, C, np.int32(m), np.int32(n), np.int32(k), np.int64(lda), np.int64(ldb),
          np.int64(rs), np.int64(cs), np.float32(alpha), np.float32(beta), np.uint64(0)),
         shared_mem=smem)


def _launch_pipe(A, B, C, alpha, beta, cfg=None, tiles=None):
    """C = alpha A @ B + beta C with gemm_pipe (float32; both operands 16-byte
    aligned, see ``_aligned``), on tiles [0, tiles) of C (all by default)."""
    cfg = cfg or configs.PIPE
    m, k = A.shape
    n = B.shape[1]
    a_k, lda, va, A2 = _operand(A, False)
    b_k, ldb, vb, B2 = _operand(B, True)
    if not (va and vb) or A2.itemsize != 4:
        raise ValueError("gemm_pipe needs float32 operands with 16-byte vectors")
    if configs.WS_PLAIN and cfg is configs.PIPE and ws_ok(4, a_k, b_k, k, device_id=C.data.device_id):
        smem, threads = ws_smem(), configs.WS_THREADS
        kern = _pipe_kernel(ws_name(k=k, b_k=b_k), smem)
    else:
        smem, threads = pipe_smem(cfg, a_k, b_k), configs.THREADS
        kern = _pipe_kernel(pipe_name(a_k, b_k, cfg), smem)
    _launch_wide(kern, threads, smem, A2, B2, C, (m, n, k), lda, ldb, alpha, beta, tiles)


def _pipe_fills(tiles, device_id):
    return tiles >= configs.PIPE_MIN_WAVE * _device.sm_count(device_id)


_PDL: list = []  # [cuLaunchKernelEx, config struct type, attribute struct type] or [None]


def _cc(device_id=None) -> int:
    """Compute capability of `device_id` (default: the current device), as 90 for 9.0.
    gemm_ws (sm_90a) runs on 90 only."""
    return (10 * _device.attribute("ComputeCapabilityMajor", device_id)
            + _device.attribute("ComputeCapabilityMinor", device_id))


def _cc_major(device_id=None) -> int:
    """Compute capability major of `device_id` (default: the current device). PDL
    (griddepcontrol) needs 9 (Hopper) or later."""
    return _cc(device_id) // 10


@functools.lru_cache(maxsize=None)
def _pdl_structs():
    """ctypes mirrors of cuda.h's CUlaunchConfig and CUlaunchAttribute (12.x, 13.x)."""
    import ctypes

    class Attr(ctypes.Structure):  # CUlaunchAttribute: id, pad to 8, a 64-byte union
        _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4),
                    ("value", ctypes.c_int * 16)]

    class Config(ctypes.Structure):  # CUlaunchConfig
        _fields_ = [("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint),
                    ("gridDimZ", ctypes.c_uint), ("blockDimX", ctypes.c_uint),
                    ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
                    ("sharedMemBytes", ctypes.c_uint), ("hStream", ctypes.c_void_p),
                    ("attrs", ctypes.POINTER(Attr)), ("numAttrs", ctypes.c_uint)]

    return Config, Attr


def _pdl_api():
    if not _PDL:
        import ctypes

        try:
            fn = ctypes.CDLL("libcuda.so.1").cuLaunchKernelEx
        except (OSError, AttributeError):
            _PDL.append(None)
            return None
        Config, Attr = _pdl_structs()
        fn.argtypes = [ctypes.POINTER(Config), ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        fn.restype = ctypes.c_int
        _PDL.extend([fn, Config, Attr])
    return _PDL[0] and _PDL


def _launch_pdl(kern, grid, smem, stream, args, threads=None):
    """Launch gemm_pipe `kern` with the PDL attribute on `stream` (a CuPy stream); args
    as for a fused gemm_pipe launch (arrays, then scalars as numpy values). False if
    the driver has no cuLaunchKernelEx (the caller launches normally)."""
    import ctypes

    api = _pdl_api()
    if not api or _cc_major() < 9:  # the launch goes to the current device
        return False
    fn, Config, Attr = api
    vals = []
    for a in args:
        if hasattr(a, "data") and hasattr(a.data, "ptr"):
            vals.append(ctypes.c_void_p(a.data.ptr))
        elif isinstance(a, np.int32):
            vals.append(ctypes.c_int32(int(a)))
        elif isinstance(a, np.int64):
            vals.append(ctypes.c_int64(int(a)))
        elif isinstance(a, np.float32):
            vals.append(ctypes.c_float(float(a)))
        else:
            raise TypeError(f"_launch_pdl: argument of type {type(a).__name__}")
    params = (ctypes.c_void_p * len(vals))(*[ctypes.addressof(v) for v in vals])
    attr = Attr()
    attr.id = 6  # CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
    attr.value[0] = 1
    cfg = Config(grid[0], grid[1], grid[2], threads or configs.THREADS, 1, 1, smem, stream.ptr,
                 ctypes.pointer(attr), 1)
    err = fn(ctypes.byref(cfg), func_ptr(kern), params, None)
    if err != 0:
        raise RuntimeError(f"cuLaunchKernelEx failed with CUresult {err}")
    return True
