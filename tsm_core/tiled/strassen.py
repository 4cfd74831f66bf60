"""Strassen's algorithm on the GPU: one or two levels in which every product is one
launch of a fused GEMM kernel (the paper's ``M = (X + dY)(V + eW); D += g0 M;
E += g1 M``), one level with C as scratch on gemm_ws, and two levels as the paper's
hybrid (operand sums in a workspace, the products on gemm_pipe / gemm_ws).

Scheduling and races. Products that add into a common block of C never run at the
same time: the products are split into rounds whose destination sets are disjoint
(``plan.schedule``), the rounds run in stream order, and each round is one launch per
operand signature (``blockIdx.z`` picks the product). No atomics; the result is
deterministic. The first product to reach a block of C stores into it (the rest
accumulate), so ``out`` is never read and needs no clearing.
"""

from __future__ import annotations

import numpy as np

from tsm_core.runtime import arrays as _arrays
from tsm_core.runtime import compile as _compile
from tsm_core.runtime import device as _device
from tsm_core.tiled import configs
from tsm_core.tiled.kernels import gemm_name, pipe_name, pipe_smem, ws_name, ws_smem
from tsm_core.tiled.launch import _grid, _launch_pdl, _operand, _pipe_fills, _pipe_kernel, ws_ok
from tsm_core.tiled.launch import _cc
from tsm_core.tiled.plan import (_S1, _hybrid2_plan, pipe_fused_ok, plan_strassen,
                                 plan_strassen1_scratch, strassen_levels)


def _row_major_aligned(X):
    """True if X (CuPy) is row-major with 16-byte aligned rows and base pointer: the
    layout ``strassen_levels``' measurements were made in."""
    return (X.strides[1] == X.itemsize and X.strides[0] % 16 == 0 and X.data.ptr % 16 == 0)


_AUTO: dict = {}


def auto_levels(A, B, C):
    """``strassen_levels`` for these CuPy operands and output (C None: a new array),
    cached per shape, dtype, alignment and device (the model is pure, the device
    query is not free)."""
    dev = A.data.device_id
    aligned = (_row_major_aligned(A) and _row_major_aligned(B)
               and (C is None or _row_major_aligned(C)))
    m, k = A.shape
    n = B.shape[1]
    key = (m, k, n, A.itemsize, aligned, dev, configs.WS_STRASSEN, configs.SCRATCH1,
           configs.HYBRID2)
    got = _AUTO.get(key)
    if got is None:
        if len(_AUTO) > 1024:
            _AUTO.clear()
        got = _AUTO[key] = strassen_levels(m, k, n, A.itemsize, cc=_cc(dev), aligned=aligned)
    return got


def _scratch1_ok(A, B, C, bs):
    """True if one level can run with C as scratch on gemm_ws (`SCRATCH1`): float32,
    A and B contiguous along k and n with 16-byte vectors, C row-major and aligned, a
    B block fits in a C block (K <= M), gemm_ws runs every signature, and a product
    has 0.75 of a wave of tiles."""
    if not (configs.SCRATCH1 and configs.WS_STRASSEN and C.itemsize == 4):
        return False
    a_k, lda, va, _ = _operand(A, False)
    b_k, ldb, vb, _ = _operand(B, True)
    ms, ks, ns = bs
    rsc, csc = (s // 4 for s in C.strides)
    bm, bn = configs.PIPE_TILE
    dev = C.data.device_id
    if not (a_k and not b_k and va and vb and csc == 1 and rsc % configs.VEC[4] == 0
            and C.data.ptr % 16 == 0 and ks <= ms
            and all(ws_ok(4, a_k, b_k, ks, sig, dev, fused=True)
                    for sig in ((2, 1, 1), (2, 2, 2)))
            and _pipe_fills(-(-ms // bm) * -(-ns // bn), dev)):
        return False
    _, plan = plan_strassen1_scratch(bs, (lda, 1), (ldb, 1), (rsc, csc), configs.VEC[4])
    return all(pva and pvb for _, _, pva, pvb, _ in plan)


def _launch_strassen1_scratch(A, B, C, bs):
    """One level with C as scratch (`plan_strassen1_scratch`), `_scratch1_ok` true."""
    ms, ks, ns = bs
    _, lda, _, A = _operand(A, False)
    _, ldb, _, B = _operand(B, True)
    sc = tuple(s // 4 for s in C.strides)
    sums, plan = plan_strassen1_scratch(bs, (lda, 1), (ldb, 1), sc, configs.VEC[4])
    key = ("scratch1", bs, lda, ldb, sc, C.data.device_id)
    devs = _desc_cache(key, lambda: [d for L in plan for d in L[1]])
    for bt, (i, j) in sums:
        _operand_sum(B, bt, C[i * ms:i * ms + ks, j * ns:(j + 1) * ns], (ks, ns))
    import cupy

    stream = cupy.cuda.get_current_stream()
    bm, bn = configs.PIPE_TILE
    first = 0
    for li, (sig, descs, va, vb, in_c) in enumerate(plan):
        nz = len(descs)
        smem = ws_smem(sig[1])
        kern = _pipe_kernel(ws_name(*sig, fused=True, k=ks), smem)
        grid = (-(-ms // bm) * -(-ns // bn), 1, nz)
        args = (A, C if in_c else B, C, np.int32(ms), np.int32(ns), np.int32(ks), np.int64(lda),
                np.int64(sc[0] if in_c else ldb), np.int64(sc[0]), np.int64(sc[1]),
                np.float32(1), np.float32(0), devs[first * configs.DESC_LEN:])
        first += nz
        # The first launch follows the sums (an ordinary launch); the others PDL.
        if li and configs.STRASSEN_PDL and _launch_pdl(kern, grid, smem, stream, args, configs.WS_THREADS):
            continue
        kern(grid, (configs.WS_THREADS,), args, shared_mem=smem)


def hybrid2_ok(A, B, device_id=0):
    """True if a two-level Strassen on these (CuPy, block-aligned) operands runs as
    the hybrid: float32, 16-byte vectors, B contiguous along n (`pipe_fused_ok`), and
    enough tiles in a product (`PIPE_MIN_WAVE`)."""
    a_k, _, va, _ = _operand(A, False)
    b_k, _, vb, _ = _operand(B, True)
    bm, bn = configs.PIPE_TILE
    tiles = -(-A.shape[0] // (4 * bm)) * -(-B.shape[1] // (4 * bn))
    return (configs.HYBRID2 and va and vb and pipe_fused_ok(A.itemsize, a_k, b_k, (1, 1, 4))
            and _pipe_fills(tiles, device_id))


def _blk(X, r, c, bs):
    return X[r * bs[0]:(r + 1) * bs[0], c * bs[1]:(c + 1) * bs[1]]


def _lines(X):
    """(outer, inner, ld) of a 2-D view with one contiguous axis (elements)."""
    item = X.itemsize
    if X.strides[1] == item:
        return X.shape[0], X.shape[1], X.strides[0] // item
    return X.shape[1], X.shape[0], X.strides[1] // item


def _operand_sum(X, terms, W, bs, small=False):
    """The block of X named by `terms` (one term of coefficient +1: a view), or the sum
    of two blocks into W (block_sum), for Strassen's operand sums X + dY. ``small``:
    the sum runs beside a product (SUM_THREADS-thread blocks, SUM_BLOCKS_PER_SM per
    SM)."""
    (c0, (r0, k0)), *rest = terms
    X0 = _blk(X, r0, k0, bs)
    if c0 != 1 or len(rest) > 1:
        raise AssertionError(f"operand terms {terms}: one or two, the first +1")
    if not rest:
        return X0
    c1, (r1, k1) = rest[0]
    X1 = _blk(X, r1, k1, bs)
    outer, inner, ldx = _lines(X0)
    ldy = _lines(X1)[2]
    ldw = _lines(W)[2]
    kern = _compile.get_kernel("gemm", f"block_sum<{_compile.ctype(X.dtype)}>")
    sms = _device.sm_count(W.data.device_id)
    threads = configs.SUM_THREADS if small else configs.THREADS
    cap = configs.SUM_BLOCKS_PER_SM * sms if small else 4 * sms
    blocks = min(outer, cap)  # whole lines a block
    T = np.float32 if X.itemsize == 4 else np.float64
    kern((blocks,), (threads,), (X0, np.int64(ldx), X1, np.int64(ldy), T(c1), W, np.int64(ldw),
                                 np.int32(outer), np.int32(inner)))
    return W


def _launch_strassen2_hybrid(A, B, C):
    """Two-level hybrid Strassen (see HYBRID2) on CuPy arrays whose dimensions are
    multiples of 4 V (V = elements per 16-byte vector), `hybrid2_ok` true.

    Per top-level product i: its operand sums (top level, then the two-term operands
    of its seven bottom-level products) into buffer set i % 2, then the seven products
    back to back (PDL after the first, `STRASSEN_PDL`). With HYBRID2_OVERLAP the sums
    of top-level product i + 1 run on a side stream during the products of i, after
    those of i - 1 (the last readers of set (i + 1) % 2) are done. Workspace: two sets
    of the top-level sums (mk + kn) / 4 and five bottom-level sums of each operand
    5 (mk + kn) / 16 elements: 9/8 (mk + kn) in all (one set without overlap). The
    caller's stream ends after the last product, which follows every sum, so the
    buffers go back to the pool only when no kernel uses them."""
    import cupy

    m, k = A.shape
    n = B.shape[1]
    A = _operand(A, False)[3]
    B = _operand(B, True)[3]
    order = "C" if A.strides[1] == A.itemsize else "F"  # workspace as the operand's
    b1, b2 = (m // 2, k // 2, n // 2), (m // 4, k // 4, n // 4)
    overlap = configs.HYBRID2_OVERLAP
    nbuf = 2 if overlap else 1
    sets = []
    for _ in range(nbuf):
        sets.append((cupy.empty(b1[:2], A.dtype, order=order), cupy.empty(b1[1:], B.dtype),
                     [cupy.empty(b2[:2], A.dtype, order=order) if len(_S1[j][0]) > 1 else None
                      for j in range(7)],
                     [cupy.empty(b2[1:], B.dtype) if len(_S1[j][1]) > 1 else None
                      for j in range(7)]))
    sc = tuple(s // C.itemsize for s in C.strides)
    plan = _hybrid2_plan(b2, sc)
    dev = _desc_cache(("hybrid2", b2, sc, C.data.device_id),
                      lambda: [d for _, d in plan])
    bm, bn = configs.PIPE_TILE
    grid = (-(-b2[0] // bm) * -(-b2[2] // bn), 1, 1)
    main = cupy.cuda.get_current_stream()
    side = _arrays.side_stream("strassen-sums") if overlap else main

    def sums(i):  # the operands of top-level product i's seven products, on `side`
        SA1, SB1, SA2, SB2 = sets[i % nbuf]
        at1, bt1, _ = _S1[i]
        small = overlap and i > 0  # the first ones run alone: full-sized launches
        S = _operand_sum(A, at1, SA1, b1[:2], small)
        T = _operand_sum(B, bt1, SB1, b1[1:], small)
        return [(_operand_sum(S, _S1[j][0], SA2[j], b2[:2], small),
                 _operand_sum(T, _S1[j][1], SB2[j], b2[1:], small)) for j in range(7)]

    if overlap:
        side.wait_event(main.record())  # the operands (and workspace) are ready
    with side:
        ops = sums(0)
        ready = side.record() if overlap else None
    done = []  # an event after each top-level product's last product (overlap)
    for i in range(7):
        nxt = nxt_ready = None
        if overlap and i + 1 < 7:
            with side:
                if i >= 1:  # set (i + 1) % 2 was last read by top-level product i - 1
                    side.wait_event(done[i - 1])
                nxt = sums(i + 1)
                nxt_ready = side.record()
        if overlap:
            main.wait_event(ready)
        for j in range(7):
            q = 7 * i + j
            Sj, Tj = ops[j]
            a_k, lda, _, Sj = _operand(Sj, False)
            b_k, ldb, _, Tj = _operand(Tj, True)
            nc, _ = plan[q]
            threads = configs.THREADS
            if configs.WS_STRASSEN and ws_ok(4, a_k, b_k, b2[1], device_id=C.data.device_id, fused=True):
                smem, threads = ws_smem(), configs.WS_THREADS
                kern = _pipe_kernel(ws_name(1, 1, nc, fused=True, k=b2[1]), smem)
            else:
                smem = pipe_smem(configs.PIPE_HYBRID, a_k, b_k)
                kern = _pipe_kernel(pipe_name(a_k, b_k, configs.PIPE_HYBRID, 1, 1, nc, fused=True), smem)
            args = (Sj, Tj, C, np.int32(b2[0]), np.int32(b2[2]), np.int32(b2[1]), np.int64(lda),
                    np.int64(ldb), np.int64(sc[0]), np.int64(sc[1]), np.float32(1),
                    np.float32(0), dev[q * configs.DESC_LEN:])
            if j and configs.STRASSEN_PDL and _launch_pdl(kern, grid, smem, main, args, threads):
                continue
            kern(grid, (threads,), args, shared_mem=smem)
        if overlap:
            done.append(main.record())
        if i + 1 < 7:
            if overlap:
                ops, ready = nxt, nxt_ready
            else:
                ops = sums(i + 1)


def _launch_strassen(A, B, C, levels):
    """Fused Strassen on CuPy arrays whose dimensions are multiples of 2**levels."""
    if levels == 2 and hybrid2_ok(A, B, C.data.device_id):
        import cupy

        try:
            return _launch_strassen2_hybrid(A, B, C)
        except cupy.cuda.memory.OutOfMemoryError:
            pass  # no room for the workspace (nothing launched yet): the fused form
    m, k = A.shape
    n = B.shape[1]
    f = 1 << levels
    bs = (m // f, k // f, n // f)
    if levels == 1 and _scratch1_ok(A, B, C, bs):
        return _launch_strassen1_scratch(A, B, C, bs)
    a_k, lda, va0, A = _operand(A, False)
    b_k, ldb, vb0, B = _operand(B, True)
    item = A.itemsize
    sa = (lda, 1) if a_k else (1, lda)
    sb = (1, ldb) if b_k else (ldb, 1)
    sc = tuple(s // item for s in C.strides)
    key = (levels, bs, sa, sb, sc, configs.VEC[item], C.data.device_id)
    launches = _desc_cache(key)
    T = np.float32 if item == 4 else np.float64
    stream = None
    for li, (sig, dev, nz, va, vb, lead_pos) in enumerate(launches):
        bm, bn = configs.PIPE_TILE
        fills = _pipe_fills(nz * -(-bs[0] // bm) * -(-bs[2] // bn), C.data.device_id)
        if pipe_fused_ok(item, a_k, b_k, sig) and va0 and vb0 and va and vb and lead_pos and fills:
            threads = configs.THREADS
            if configs.WS_STRASSEN and ws_ok(item, a_k, b_k, bs[1], sig, C.data.device_id, fused=True):
                smem, threads = ws_smem(sig[1]), configs.WS_THREADS
                kern = _pipe_kernel(ws_name(*sig, fused=True, k=bs[1]), smem)
            else:
                smem = pipe_smem(configs.PIPE_FUSED, a_k, b_k, sig[0], sig[1])
                kern = _pipe_kernel(pipe_name(a_k, b_k, configs.PIPE_FUSED, *sig, fused=True), smem)
            grid = (-(-bs[0] // bm) * -(-bs[2] // bn), 1, nz)
            args = (A, B, C, np.int32(bs[0]), np.int32(bs[2]), np.int32(bs[1]), np.int64(lda),
                    np.int64(ldb), np.int64(sc[0]), np.int64(sc[1]), T(1), T(0), dev)
            if li and configs.STRASSEN_PDL:  # after one of our own launches (see STRASSEN_PDL)
                import cupy

                stream = stream or cupy.cuda.get_current_stream()
                if _launch_pdl(kern, grid, smem, stream, args, threads):
                    continue
            kern(grid, (threads,), args, shared_mem=smem)
            continue
        kern = _compile.get_kernel("gemm", gemm_name(A.dtype, a_k, b_k, va0 and va, vb0 and vb,
                                                     None, *sig, fused=True))
        kern(_grid(bs[0], bs[2], item, nz), (configs.THREADS,),
             (A, B, C, np.int32(bs[0]), np.int32(bs[2]), np.int32(bs[1]), np.int64(lda),
              np.int64(ldb), np.int64(sc[0]), np.int64(sc[1]), T(1), T(0), dev,
              np.int32(0), np.int32(1), np.int32(bs[1]), np.uint64(0)))


_DESC: dict = {}


def _desc_cache(key, build=None):
    """Device arrays of the descriptors, built once per layout (a host-to-device copy
    per call would cost more than a small product); with ``build``, one array of the
    descriptors it returns."""
    got = _DESC.get(key)
    if got is None and build is not None:
        import cupy

        got = cupy.asarray(np.asarray(build(), dtype=np.int64).ravel())
        if len(_DESC) > 256:
            _DESC.clear()
        _DESC[key] = got
    if got is None:
        import cupy

        levels, bs, sa, sb, sc, vec, _ = key
        got = []
        for sig, descs, va, vb in plan_strassen(levels, bs, sa, sb, sc, vec):
            dev = cupy.asarray(np.asarray(descs, dtype=np.int64).ravel())
            # gemm_pipe's fused products take a first term of coefficient +1
            lead_pos = all(d[12] == 1 and d[16] == 1 for d in descs)
            got.append((sig, dev, len(descs), va, vb, lead_pos))
        if len(_DESC) > 256:
            _DESC.clear()
        _DESC[key] = got
    return got
