"""Where the two-level hybrid Strassen's time goes in one run:

    python dev/strassen_hybrid_parts_probe.py [--out DIR] [N]

float32, C-ordered, seed 0, N = 16384 by default. Methods, each timed as
``tsm_core.runtime.timing.interleaved_medians`` (three rounds of 10-rep medians):

- ``cublas``: cupy.matmul;
- ``hybrid``: tsm_core.strassen(levels=2), the hybrid as shipped (sums beside);
  ``hybrid_nopdl``: the same with ``tiled.configs.STRASSEN_PDL`` off;
- ``products``: its 49 bottom-level launches alone, on fixed operand blocks (no
  sums), with their C descriptors (NC = 1 to 4 blocks of C each, first writes);
  ``products_pdl``: the same launched as the hybrid does (PDL within each group of
  seven);
- ``plain49``: 49 plain launches of the same size through ``tiled.launch._launch_pipe``,
  each writing one block of C (alpha = 1, beta = 0): gemm_ws where
  ``tiled.configs.WS_PLAIN`` is on and it takes the shape, as the plain GEMM does;
- ``sums``: the hybrid's operand sums alone, in its order, on one stream;
- ``ncX_store`` / ``ncX_add`` (X = 1, 4): 49 launches of the hybrid's product kernel
  with X blocks of C, every block a first write (stores) or none (read, add, store).

--ncu: instead of timing, one launch each of plain, nc1_store, nc4_store and nc4_add
between cudaProfilerStart/Stop (for ``ncu --profile-from-start off``).

The products' results are not checked (their operands are not Strassen's); the
hybrid's is, against a float64 product (max error relative to max |C|)."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None) -> int:
    import cupy as cp

    import tsm_core
    from tsm_core.runtime.timing import interleaved_medians
    from tsm_core.tiled import configs as tconfigs
    from tsm_core.tiled import kernels as tkernels
    from tsm_core.tiled import launch as tlaunch
    from tsm_core.tiled import plan as tplan
    from tsm_core.tiled import strassen as tstrassen

    ap = argparse.ArgumentParser()
    ap.add_argument("n", nargs="?", type=int, default=16384)
    ap.add_argument("--out", default=None)
    ap.add_argument("--ncu", action="store_true")
    args = ap.parse_args(argv)
    from tsm_core import has_gpu

    if not has_gpu():
        print("strassen_hybrid_parts_probe: no CUDA GPU found")
        return 2
    n = args.n
    rng = np.random.default_rng(0)
    A = cp.asarray(rng.standard_normal((n, n), dtype=np.float32))
    B = cp.asarray(rng.standard_normal((n, n), dtype=np.float32))
    C = cp.empty((n, n), np.float32)
    assert tstrassen.hybrid2_ok(A, B, C.data.device_id), "the hybrid does not take this shape"
    b1, b2 = (n // 2,) * 3, (n // 4,) * 3
    S2 = cp.asarray(rng.standard_normal(b2[:2], dtype=np.float32))
    T2 = cp.asarray(rng.standard_normal(b2[1:], dtype=np.float32))
    SA1, SB1 = cp.empty(b1[:2], np.float32), cp.empty(b1[1:], np.float32)
    SA2, SB2 = cp.empty(b2[:2], np.float32), cp.empty(b2[1:], np.float32)
    sc = tuple(s // 4 for s in C.strides)
    plan = tplan._hybrid2_plan(b2, sc)
    dev = tstrassen._desc_cache(("hybrid2", b2, sc, C.data.device_id), lambda: [d for _, d in plan])
    bm, bn = tconfigs.PIPE_TILE
    grid = (-(-b2[0] // bm) * -(-b2[2] // bn), 1, 1)
    cfg = tconfigs.PIPE_HYBRID
    smem = tkernels.pipe_smem(cfg, True, False)

    def products(pdl=False):
        stream = cp.cuda.get_current_stream()
        for q in range(49):
            nc, _ = plan[q]
            name = tkernels.pipe_name(True, False, cfg, 1, 1, nc, fused=True)
            kern = tlaunch._pipe_kernel(name, smem)
            args = (S2, T2, C, np.int32(b2[0]), np.int32(b2[2]), np.int32(b2[1]), np.int64(b2[1]),
                    np.int64(b2[2]), np.int64(sc[0]), np.int64(sc[1]), np.float32(1),
                    np.float32(0), dev[q * tconfigs.DESC_LEN:])
            if pdl and q % 7 and tlaunch._launch_pdl(kern, grid, smem, stream, args):
                continue
            kern(grid, (tconfigs.THREADS,), args, shared_mem=smem)

    def hybrid_nopdl():
        keep = tconfigs.STRASSEN_PDL
        tconfigs.STRASSEN_PDL = False
        try:
            tsm_core.strassen(A, B, levels=2, out=C)
        finally:
            tconfigs.STRASSEN_PDL = keep

    Cb = C[:b2[0], :b2[2]]

    def plain49():
        for _ in range(49):
            tlaunch._launch_pipe(S2, T2, Cb, 1.0, 0.0)

    def sums():
        S = T = None
        for q in range(49):
            i, j = divmod(q, 7)
            at1, bt1, _ = tplan._S1[i]
            at2, bt2, _ = tplan._S1[j]
            if j == 0:
                S = tstrassen._operand_sum(A, at1, SA1, b1[:2])
                T = tstrassen._operand_sum(B, bt1, SB1, b1[1:])
            tstrassen._operand_sum(S, at2, SA2, b2[:2])
            tstrassen._operand_sum(T, bt2, SB2, b2[1:])

    def fixed(nc, first):
        cs = [(1, (0, 0)), (1, (0, 1)), (1, (1, 0)), (1, (1, 1))][:nc]
        d = tplan._descriptor(([(1, (0, 0))], [(1, (0, 0))], cs), (1 << nc) - 1 if first else 0,
                              (0, 0), (0, 0), sc, b2)
        dd = cp.asarray(np.asarray(d, dtype=np.int64))
        name = tkernels.pipe_name(True, False, cfg, 1, 1, nc, fused=True)
        kern = tlaunch._pipe_kernel(name, smem)

        def run(times=49):
            for _ in range(times):
                kern(grid, (tconfigs.THREADS,),
                     (S2, T2, C, np.int32(b2[0]), np.int32(b2[2]), np.int32(b2[1]),
                      np.int64(b2[1]), np.int64(b2[2]), np.int64(sc[0]), np.int64(sc[1]),
                      np.float32(1), np.float32(0), dd), shared_mem=smem)
        return run

    if args.ncu:
        runs = [lambda: tlaunch._launch_pipe(S2, T2, Cb, 1.0, 0.0), fixed(1, True), fixed(4, True),
                fixed(4, False)]
        for r in runs:  # compiled and warm
            r() if r is runs[0] else r(1)
        cp.cuda.Device().synchronize()
        cp.cuda.profiler.start()
        for r in runs:
            r() if r is runs[0] else r(1)
        cp.cuda.Device().synchronize()
        cp.cuda.profiler.stop()
        return 0

    methods = {"cublas": lambda: cp.matmul(A, B, out=C),
               "hybrid": lambda: tsm_core.strassen(A, B, levels=2, out=C),
               "hybrid_nopdl": hybrid_nopdl, "products": products,
               "products_pdl": lambda: products(True), "plain49": plain49, "sums": sums,
               "nc1_store": fixed(1, True), "nc1_add": fixed(1, False),
               "nc4_store": fixed(4, True), "nc4_add": fixed(4, False)}
    C.fill(np.nan)
    tsm_core.strassen(A, B, levels=2, out=C)
    ref = A.astype(cp.float64) @ B.astype(cp.float64)
    err = float(cp.abs(C - ref).max() / cp.abs(ref).max())
    del ref
    print("cuLaunchKernelEx:", "found" if tlaunch._pdl_api() else "missing (PDL off)", flush=True)
    t = interleaved_medians(methods, reps=10)
    row = {"n": n, "ms": {k: v * 1e3 for k, v in t.items()}, "hybrid_max_rel_err": err,
           "hybrid_of_cublas": t["cublas"] / t["hybrid"],
           "products_of_plain49": t["plain49"] / t["products"]}
    print(f"N={n}: " + "  ".join(f"{k} {v * 1e3:.2f} ms" for k, v in t.items())
          + f"  (hybrid {row['hybrid_of_cublas']:.3f}x of cuBLAS, err {err:.1e}; products at "
          f"{row['products_of_plain49']:.3f} of plain)", flush=True)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "strassen_hybrid_parts.json").write_text(json.dumps(row, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
