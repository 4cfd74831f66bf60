"""gemm_ws (the warp-specialized gemm_pipe, `tiled.configs.WS_PLAIN` /
`tiled.configs.WS_STRASSEN`)
against gemm_pipe and cuBLAS, in one run:

    python dev/gemm_ws_probe.py [--out DIR] [--sizes 4096,8192]
        [--strassen 8192,16384] [--hybrid 16384] [--skip-checks]

float32, C-ordered, seed 0. First the checks: gemm_ws on awkward shapes (M, N not
multiples of its 128 x 256 tile, K a multiple of 16) and with alpha / beta, outputs
poisoned with NaN, against a float64 product (max error relative to max |C|, fails
above 1e-4), and
Strassen (one level, the hybrid) with gemm_ws against the same. Then three
interleaved rounds of 10-rep medians (CUDA events) in TFLOP/s counted as 2 N^3
(Strassen's figure is an effective rate): cuBLAS, tsm_core.gemm on gemm_pipe and on
gemm_ws; one-level Strassen with gemm_pipe's fused products, with gemm_ws's, and with
gemm_ws's and C as scratch (`tiled.configs.SCRATCH1`); the two-level hybrid with each."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TOL = 1e-4


def _rel_err(C, A, B, C0=None, alpha=1.0, beta=0.0):
    import cupy as cp

    ref = alpha * (A.astype(cp.float64) @ B.astype(cp.float64))
    if beta:
        ref += beta * C0.astype(cp.float64)
    return float(cp.abs(C.astype(cp.float64) - ref).max() / cp.abs(ref).max())


def checks(rng) -> list:
    import cupy as cp

    import tsm_core
    from tsm_core.tiled import configs as tconfigs
    from tsm_core.tiled import launch as tlaunch

    out = []
    # (16-byte vectors: N a multiple of 4; K of 16)
    shapes = [(128, 256, 16), (1, 4, 16), (129, 260, 32), (1000, 1000, 1008), (383, 2052, 4096),
              (4096, 4096, 4096)]
    for m, n, k in shapes:
        A = cp.asarray(rng.standard_normal((m, k), dtype=np.float32))
        B = cp.asarray(rng.standard_normal((k, n), dtype=np.float32))
        for alpha, beta in ((1.0, 0.0), (0.5, -2.0)):
            C0 = cp.asarray(rng.standard_normal((m, n), dtype=np.float32))
            C = C0.copy() if beta else cp.full((m, n), np.nan, np.float32)
            tlaunch._launch_ws(A, B, C, alpha, beta)
            e = _rel_err(C, A, B, C0, alpha, beta)
            out.append(dict(what="gemm_ws", m=m, n=n, k=k, alpha=alpha, beta=beta, err=e,
                            ok=bool(e < TOL)))
            print(f"check gemm_ws {m}x{n}x{k} alpha={alpha} beta={beta}: err {e:.1e}", flush=True)
    keep, tconfigs.WS_STRASSEN = tconfigs.WS_STRASSEN, True
    try:
        for n, levels in ((2048, 1), (4096, 1), (8192, 1), (4096, 2), (8192, 2)):
            A = cp.asarray(rng.standard_normal((n, n), dtype=np.float32))
            B = cp.asarray(rng.standard_normal((n, n), dtype=np.float32))
            C = cp.full((n, n), np.nan, np.float32)
            tsm_core.strassen(A, B, levels=levels, out=C)
            e = _rel_err(C, A, B)
            out.append(dict(what=f"strassen{levels}_ws", m=n, n=n, k=n, err=e, ok=bool(e < TOL)))
            print(f"check strassen levels={levels} ws {n}: err {e:.1e}", flush=True)
    finally:
        tconfigs.WS_STRASSEN = keep
    return out


def products(n, stages_list, rcs=(None,)) -> list:
    """One-level Strassen's fused products one at a time (grid of one product) at size
    n (blocks of n / 2), each signature on gemm_pipe and on gemm_ws (at each STAGES of
    `stages_list` and each consumer register count of `rcs`),
    against a plain gemm_ws / gemm_pipe launch of the same size."""
    import cupy as cp

    from tsm_core.runtime.timing import interleaved_medians
    from tsm_core.tiled import configs as tconfigs
    from tsm_core.tiled import kernels as tkernels
    from tsm_core.tiled import launch as tlaunch
    from tsm_core.tiled import plan as tplan

    rng = np.random.default_rng(1)
    A = cp.asarray(rng.standard_normal((n, n), dtype=np.float32))
    B = cp.asarray(rng.standard_normal((n, n), dtype=np.float32))
    C = cp.asarray(rng.standard_normal((n, n), dtype=np.float32))
    h = n // 2
    bs = (h, h, h)
    sa, sb, sc = (n, 1), (n, 1), (n, 1)
    bm, bn = tconfigs.PIPE_TILE
    grid = (-(-h // bm) * -(-h // bn), 1, 1)
    def plain_pipe():
        keep, tconfigs.WS_PLAIN = tconfigs.WS_PLAIN, False  # _launch_pipe takes gemm_ws if set
        try:
            tlaunch._launch_pipe(A[:h, :h], B[:h, :h], C[:h, :h], 1.0, 0.0)
        finally:
            tconfigs.WS_PLAIN = keep

    methods = {
        "plain_pipe": plain_pipe,
        "plain_ws": lambda: tlaunch._launch_ws(A[:h, :h], B[:h, :h], C[:h, :h], 1.0, 0.0)}
    seen = set()
    for p, prod in enumerate(tplan.products(1)):
        sig = tuple(len(x) for x in prod)
        if sig in seen:
            continue
        seen.add(sig)
        dev = cp.asarray(np.asarray(tplan._descriptor(prod, 0, sa, sb, sc, bs), np.int64))
        args = (A, B, C, np.int32(h), np.int32(h), np.int32(h), np.int64(n), np.int64(n),
                np.int64(n), np.int64(1), np.float32(1), np.float32(0), dev)

        def launcher(name, smem, threads, args=args):
            kern = tlaunch._pipe_kernel(name, smem)
            return lambda: kern(grid, (threads,), args, shared_mem=smem)

        tag = "".join(map(str, sig))
        methods[f"M{p + 1}_{tag}_pipe"] = launcher(
            tkernels.pipe_name(True, False, tconfigs.PIPE_FUSED, *sig, fused=True),
            tkernels.pipe_smem(tconfigs.PIPE_FUSED, True, False, sig[0], sig[1]), tconfigs.THREADS)
        for st in stages_list:
            for rc in rcs:
                vt = "" if rc is None else f"_r{rc}"
                methods[f"M{p + 1}_{tag}_ws{st}{vt}"] = launcher(
                    tkernels.ws_name(*sig, fused=True, stages=st, rc=rc),
                    tkernels.ws_smem(sig[1], st), tconfigs.WS_THREADS)
    for rc in sorted({rc for rc in rcs if rc}):
        def plain_rc(rc=rc):
            keep, tconfigs.WS_RC = tconfigs.WS_RC, rc
            try:
                tlaunch._launch_ws(A[:h, :h], B[:h, :h], C[:h, :h], 1.0, 0.0)
            finally:
                tconfigs.WS_RC = keep
        methods[f"plain_ws_r{rc}"] = plain_rc
    # each variant's one-level Strassen against float64 (every fused signature runs)
    errs = {}
    for rc in rcs:
        if rc is None:
            continue
        keep = tconfigs.WS_RC_FUSED, tconfigs.WS_STRASSEN
        tconfigs.WS_RC_FUSED, tconfigs.WS_STRASSEN = rc, True
        try:
            D = cp.full((n, n), np.nan, np.float32)
            import tsm_core

            tsm_core.strassen(A, B, levels=1, out=D)
            errs[f"r{rc}"] = _rel_err(D, A, B)
            D = None
        finally:
            tconfigs.WS_RC_FUSED, tconfigs.WS_STRASSEN = keep
    print(f"variant errors (one level, N={n}): {errs}", flush=True)
    ms = {k: v * 1e3 for k, v in interleaved_medians(methods, reps=10).items()}
    print(f"products at N={n} (ms): " + "  ".join(f"{k} {v:.3f}" for k, v in ms.items()),
          flush=True)
    return [dict(n=n, ms=ms, of_plain_ws={k: v / ms["plain_ws"] for k, v in ms.items()},
                 variant_err=errs, variant_ok=all(e < TOL for e in errs.values()))]


def main(argv=None) -> int:
    import cupy as cp

    import tsm_core
    from tsm_core.runtime.timing import interleaved_medians
    from tsm_core.tiled import configs as tconfigs

    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="4096,8192")
    ap.add_argument("--sizes-bf", default="", help="gemm sizes with B F-ordered (k-contiguous)")
    ap.add_argument("--strassen", default="8192,16384")
    ap.add_argument("--hybrid", default="16384")
    ap.add_argument("--skip-checks", action="store_true")
    ap.add_argument("--products", default="", help="N[,N]: fused products one at a time")
    ap.add_argument("--stages", default="4", help="gemm_ws STAGES for --products")
    ap.add_argument("--rcs", default="", help="RC[,RC]: gemm_ws consumer registers for --products")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    from tsm_core import has_gpu

    if not has_gpu():
        print("gemm_ws_probe: no CUDA GPU found")
        return 2
    ints = lambda s: [int(x) for x in s.split(",") if x]  # noqa: E731
    rng = np.random.default_rng(0)
    doc = {"checks": [] if args.skip_checks else checks(rng), "rows": []}
    failed = [c for c in doc["checks"] if not c["ok"]]
    doc["products"] = [r for n in ints(args.products)
                       for r in products(n, ints(args.stages), ints(args.rcs) or [None])]

    kept = tconfigs.WS_PLAIN, tconfigs.WS_STRASSEN, tconfigs.SCRATCH1

    def flags(plain=False, strassen=False, scratch=False):
        tconfigs.WS_PLAIN, tconfigs.WS_STRASSEN, tconfigs.SCRATCH1 = plain, strassen, scratch

    def run_with(fn, plain=False, strassen=False, scratch=False):
        def run():
            flags(plain, strassen, scratch)
            fn()
        return run

    jobs = [(n, "gemm") for n in ints(args.sizes)] + [(n, "gemmBF") for n in ints(args.sizes_bf)]
    jobs += [(n, "strassen1") for n in ints(args.strassen)]
    jobs += [(n, "strassen2") for n in ints(args.hybrid)]
    for n, what in jobs:
        A = cp.asarray(rng.standard_normal((n, n), dtype=np.float32))
        B = cp.asarray(rng.standard_normal((n, n), dtype=np.float32),
                       order="F" if what == "gemmBF" else "C")
        C = cp.empty((n, n), np.float32)
        methods = {"cublas": run_with(lambda: cp.matmul(A, B, out=C))}
        if what.startswith("gemm"):
            methods["gemm_pipe"] = run_with(lambda: tsm_core.gemm(A, B, out=C))
            methods["gemm_ws"] = run_with(lambda: tsm_core.gemm(A, B, out=C), plain=True)
        else:
            lv = int(what[-1])
            methods[f"{what}_pipe"] = run_with(lambda: tsm_core.strassen(A, B, levels=lv, out=C))
            methods[f"{what}_ws"] = run_with(lambda: tsm_core.strassen(A, B, levels=lv, out=C),
                                             strassen=True)
            if lv == 1:  # one level with C as scratch (SCRATCH1)
                methods[f"{what}_ws_scratch"] = run_with(
                    lambda: tsm_core.strassen(A, B, levels=lv, out=C), strassen=True, scratch=True)
        err = {}
        for name, fn in methods.items():
            C.fill(np.nan)
            fn()
            err[name] = _rel_err(C, A, B)
        f = 2 * n**3 / 1e12
        tf = {name: f / t for name, t in interleaved_medians(methods, reps=10).items()}
        flags(*kept)
        row = {"n": n, "what": what, "tflops": tf, "max_rel_err": err,
               "of_cublas": {k: v / tf["cublas"] for k, v in tf.items()}}
        doc["rows"].append(row)
        print(f"N={n} {what}: " + "  ".join(
            f"{k} {v:.1f} ({row['of_cublas'][k]:.3f}, err {err[k]:.0e})" for k, v in tf.items()),
            flush=True)
        methods = A = B = C = None
        cp.get_default_memory_pool().free_all_blocks()
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "gemm_ws_probe.json").write_text(json.dumps(doc, indent=1))
    print("summary:")
    for r in doc["products"]:
        print(f"  products N={r['n']}: "
              + " ".join(f"{k}={v:.3f}" for k, v in r["of_plain_ws"].items()))
    for r in doc["rows"]:
        print(f"  N={r['n']:6d} {r['what']:10s} " + " ".join(
            f"{k}={v:.3f}" for k, v in r["of_cublas"].items()))
    if failed:
        print(f"FAILED checks: {failed}")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
