"""Name expressions and shared-memory sizes of the gemm.cu kernels, and the list of
every instantiation the launchers can pick (``instantiations``, compiled by the CI's
NVRTC checks and warmed by ``precompile``)."""

from __future__ import annotations

import numpy as np

from tsm_core.runtime import compile as _compile
from tsm_core.runtime.log import get_logger
from tsm_core.tiled import configs
from tsm_core.tiled.plan import pipe_fused_ok, products

_log = get_logger(__name__)


def gemm_name(dtype, a_k, b_k, va, vb, bk=None, na=1, nb=1, nc=1, fused=False, occ=None, wn=2,
              split=False):
    """Name expression of one gemm_tiled instantiation (wn = 4: the wide tile; split:
    the split-K tail's variant)."""
    item = np.dtype(dtype).itemsize
    bk = configs.DEFAULT_BK[item] if bk is None else bk
    occ = (configs.FUSED_OCC if fused else (configs.PLAIN_OCC if wn == 2 else configs.WIDE_OCC)) if occ is None else occ
    b = lambda x: "true" if x else "false"  # noqa: E731
    return (f"gemm_tiled<{_compile.ctype(dtype)}, {b(a_k)}, {b(b_k)}, {b(va)}, {b(vb)}, "
            f"{bk}, {na}, {nb}, {nc}, {b(fused)}, {occ}, {wn}, {b(split)}>")


def reduce_name(dtype, bm, bn):
    return f"gemm_splitk_reduce<{_compile.ctype(dtype)}, {bm}, {bn}>"


def async_name(dtype, a_k, b_k, va, vb, cfg: configs.AsyncConfig):
    b = lambda x: "true" if x else "false"  # noqa: E731
    return (f"gemm_async<{_compile.ctype(dtype)}, {b(a_k)}, {b(b_k)}, {b(va)}, {b(vb)}, "
            f"{cfg.bm}, {cfg.bn}, {cfg.bk}, {cfg.stages}, {cfg.occ}>")


def pipe_name(a_k, b_k, cfg: configs.PipeConfig = configs.PIPE, na=1, nb=1, nc=1, fused=False):
    b = lambda x: "true" if x else "false"  # noqa: E731
    return (f"gemm_pipe<{b(a_k)}, {b(b_k)}, {cfg.bk}, {cfg.stages}, {cfg.unroll or cfg.bk}, "
            f"{cfg.order}, {na}, {nb}, {nc}, {b(fused)}, {b(cfg.midbar)}>")


def pipe_smem(cfg: configs.PipeConfig = configs.PIPE, a_k=True, b_k=False, na=1, nb=1):
    """Bytes of shared memory gemm_pipe takes: STAGES stages of both k-major tiles, a
    second buffer for the second term of an operand copied by cp.async."""
    bm, bn = configs.PIPE_TILE
    xa = 2 if (not a_k and na == 2) else 1
    xb = 2 if (not b_k and nb == 2) else 1
    return cfg.stages * cfg.bk * (xa * (bm + 4) + xb * (bn + 4)) * 4


def ws_name(na=1, nb=1, nc=1, fused=False, stages=None, rc=None, k=0, b_k=False):
    """gemm_ws's name expression; k: the product's K (not a multiple of 16: the
    instantiation with a zero-filled last k-tile); b_k: B contiguous along k (the
    plain product only)."""
    rc = rc or (configs.WS_RC_FUSED if fused else configs.WS_RC_BK if b_k else configs.WS_RC)
    b = lambda x: "true" if x else "false"  # noqa: E731
    kpart = b(k % 16 and not fused)  # (fused: K % 16 == 0, ws_ok)
    lay = ", true" if b_k else ""
    return f"gemm_ws<{na}, {nb}, {nc}, {b(fused)}, {stages or configs.WS_STAGES}, {rc}, {kpart}{lay}>"


def ws_smem(nb=1, stages=None):
    """Bytes of shared memory gemm_ws takes: its stages of A (16 x 132 floats) and B
    (16 x 260, twice for a second term of B)."""
    return (stages or configs.WS_STAGES) * 16 * (132 + (2 if nb == 2 else 1) * 260) * 4


def instantiations(dtypes=(np.float32, np.float64), *, plain=True, levels=(1, 2),
                   layouts=((True, False), (False, False), (True, True), (False, True)),
                   vecs=((True, True), (False, False)), occ=None):
    """Name expressions of gemm_tiled: every plain variant (dtype x layout x vector
    flags) and the fused ones of the given Strassen levels, layouts and vector flags."""
    names = []
    for dt in dtypes:
        if plain:
            for a_k in (True, False):
                for b_k in (True, False):
                    for va in (True, False):
                        for vb in (True, False):
                            for split in (False, True):
                                names.append(gemm_name(dt, a_k, b_k, va, vb, split=split))
                                if np.dtype(dt).itemsize == 4:
                                    for bk in ((8, 16) if va and vb else (8,)):
                                        names.append(gemm_name(dt, a_k, b_k, va, vb, bk, wn=4,
                                                               split=split))
            bm, bn = configs.TILE[np.dtype(dt).itemsize]
            names.append(reduce_name(dt, bm, bn))
            if np.dtype(dt).itemsize == 4:
                names.append(reduce_name(dt, bm, 2 * bn))
        if plain:
            item = np.dtype(dt).itemsize
            for cfg in sorted(set(configs.ASYNC_TILES[item]), key=str):
                for a_k, b_k in ((False, False), (False, True)):
                    for va in (True, False):
                        for vb in (True, False):
                            names.append(async_name(dt, a_k, b_k, va, vb, cfg))
        if plain and np.dtype(dt).itemsize == 4:
            for a_k in (True, False):
                for b_k in (True, False):
                    names.append(pipe_name(a_k, b_k))
            names += [ws_name(k=k, b_k=b_k) for k in (0, 1) for b_k in (True, False)]
        sigs = sorted({tuple(len(x) for x in p) for L in levels for p in products(L)})
        for a_k, b_k in layouts:
            for va, vb in vecs:
                for sig in sigs:
                    names.append(gemm_name(dt, a_k, b_k, va, vb, None, *sig, fused=True,
                                           occ=occ))
            if occ is None:
                for sig in sigs:
                    if pipe_fused_ok(np.dtype(dt).itemsize, a_k, b_k, sig):
                        names.append(pipe_name(a_k, b_k, configs.PIPE_FUSED, *sig, fused=True))
                if 2 in levels and pipe_fused_ok(np.dtype(dt).itemsize, a_k, b_k, (1, 1, 4)):
                    for nc in (1, 2, 4):  # the hybrid's products
                        names.append(pipe_name(a_k, b_k, configs.PIPE_HYBRID, 1, 1, nc, fused=True))
                if np.dtype(dt).itemsize == 4 and a_k and not b_k:  # gemm_ws's layout
                    wsigs = {s for s in sigs if max(s[:2]) <= 2}
                    if 2 in levels:
                        wsigs |= {(1, 1, nc) for nc in (1, 2, 4)}
                    names += [ws_name(*s, fused=True) for s in sorted(wsigs)]
        if 2 in levels:
            names.append(f"block_sum<{_compile.ctype(dt)}>")
    return names


def _compile_one(name):
    import cupy

    cupy.RawModule(code=_compile.source("gemm"), options=_compile.options_for(name),
                   name_expressions=[name]).compile()
    return name


def precompile(names, workers=None):
    """Compile `names` in parallel processes into CuPy's on-disk kernel cache, so that
    the first call of each in this process loads it instead of compiling (NVRTC holds
    the GIL: threads would not overlap; a fused two-level kernel takes ~2 s)."""
    import concurrent.futures
    import multiprocessing
    import os

    names = sorted(set(names))
    workers = workers or min(len(names), os.cpu_count() or 1)
    ctx = multiprocessing.get_context("spawn")
    try:
        with concurrent.futures.ProcessPoolExecutor(workers, mp_context=ctx) as ex:
            return list(ex.map(_compile_one, names))
    except Exception as e:  # only a warm-up: each kernel still compiles on first use
        _log.warning("precompile failed (%s: %s); compiling lazily", type(e).__name__, e)
        return []
