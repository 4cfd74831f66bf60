"""gemm_pipe's (BK, STAGES) variants against gemm_tiled's wide tile (tsm_core.gemm as
planned) and cuBLAS, float32 squares, in one run (issue 6, session 15):

    PYTHONPATH=$PWD python benchmarks/gemm_pipe_probe.py [--out DIR] [--order C|F] [N ...]

Operands from seed 0 (standard normal), C-ordered unless --order says otherwise (F:
both F-ordered; FC: A F-ordered, B C-ordered); each round times
every method once (15 reps, median, CUDA events), three rounds interleaved; the
figure is the median over rounds, TFLOP/s counted as 2 N^3. Each variant's result
is checked against a float64 product before it is timed (max error relative to
max |C|)."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# (BK, STAGES[, UNROLL[, ORDER]]): see _gemm.PipeConfig.
VARIANTS = [(16, 3), (16, 4), (16, 2), (8, 4), (8, 3), (32, 2), (32, 3)]


def main(argv=None) -> int:
    import cupy as cp

    import tsm_core
    from tsm_core.tiled import api as _gemm
    from tsm_core.runtime.timing import interleaved_medians

    ap = argparse.ArgumentParser()
    ap.add_argument("sizes", nargs="*", type=int, default=[2048, 4096, 8192])
    ap.add_argument("--order", default="C", choices=["C", "F", "FC", "CF"],
                    help="A's order then B's (one letter: both)")
    ap.add_argument("--variants", default=None, help="e.g. 16x3,8x4,16x3x8x2")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    variants = ([tuple(int(x) for x in v.split("x")) for v in args.variants.split(",")]
                if args.variants else VARIANTS)
    rng = np.random.default_rng(0)
    rows = []
    for n in args.sizes:
        A = cp.asarray(rng.standard_normal((n, n), dtype=np.float32), order=args.order[0])
        B = cp.asarray(rng.standard_normal((n, n), dtype=np.float32), order=args.order[-1])
        C = cp.empty((n, n), np.float32)
        ref = A.astype(cp.float64) @ B.astype(cp.float64)
        scale = float(cp.abs(ref).max())
        methods = {"gemm": lambda: tsm_core.gemm(A, B, out=C),
                   "cublas": lambda: cp.matmul(A, B, out=C)}
        for v in variants:
            cfg = _gemm.PipeConfig(*v)
            methods["pipe" + "x".join(map(str, v))] = (
                lambda cfg=cfg: _gemm._launch_pipe(A, B, C, 1.0, 0.0, cfg))
        err = {}
        for name, fn in methods.items():
            C.fill(np.nan)
            fn()
            err[name] = float(cp.abs(C - ref).max()) / scale
        f = 2 * n**3 / 1e12
        tf = {name: f / t for name, t in interleaved_medians(methods, reps=15).items()}
        row = {"n": n, "order": args.order, "tflops": tf, "max_rel_err": err,
               "of_cublas": {k: v / tf["cublas"] for k, v in tf.items()}}
        rows.append(row)
        print(f"N={n} {args.order}: " + "  ".join(
            f"{k} {v:.1f} ({row['of_cublas'][k]:.3f}, err {err[k]:.0e})" for k, v in tf.items()),
            flush=True)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / f"gemm_pipe_probe_{args.order}.json").write_text(
            json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
