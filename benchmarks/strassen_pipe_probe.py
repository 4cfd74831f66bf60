"""Fused Strassen on gemm_pipe with several configurations of its fused products
(`_gemm.PIPE_FUSED`: one level, and the two-level products that are not the hybrid's),
against cuBLAS and tsm_core.gemm, in one run (issue 6, session 15):

    PYTHONPATH=$PWD python benchmarks/strassen_pipe_probe.py [--out DIR] [--levels L]
        [--configs 16x3,16x4] [--overlap] [N ...]

float32, C-ordered, seed 0; three interleaved rounds of 10-rep medians (CUDA events);
the figure is the median over rounds, in TFLOP/s counted as 2 N^3 (Strassen does
fewer flops: its figure is an effective rate). Each result is checked against a
float64 product first (max error relative to max |C|). --overlap (two levels): the
hybrid with its operand sums beside the products (`_gemm.HYBRID2_OVERLAP`) and without,
each configuration."""
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
    from tsm_core.tiled import api as _gemm
    from tsm_core.runtime.timing import interleaved_medians

    ap = argparse.ArgumentParser()
    ap.add_argument("sizes", nargs="*", type=int, default=[4096, 8192])
    ap.add_argument("--levels", type=int, default=1)
    ap.add_argument("--configs", default="16x3,16x4",
                    help="PipeConfig fields joined by x: BK x STAGES [x UNROLL x ORDER x MIDBAR]")
    ap.add_argument("--overlap", action="store_true")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    configs = [(c, _gemm.PipeConfig(*map(int, c.split("x")))) for c in args.configs.split(",")]
    kept = _gemm.PIPE_FUSED, _gemm.HYBRID2_OVERLAP
    rng = np.random.default_rng(0)
    rows = []
    for n in args.sizes:
        A = cp.asarray(rng.standard_normal((n, n), dtype=np.float32))
        B = cp.asarray(rng.standard_normal((n, n), dtype=np.float32))
        C = cp.empty((n, n), np.float32)
        ref = A.astype(cp.float64) @ B.astype(cp.float64)
        scale = float(cp.abs(ref).max())
        del ref

        def with_cfg(cfg, overlap=True):
            def run():
                _gemm.PIPE_FUSED = cfg
                _gemm.HYBRID2_OVERLAP = overlap
                tsm_core.strassen(A, B, levels=args.levels, out=C)
            return run

        methods = {"cublas": lambda: cp.matmul(A, B, out=C),
                   "gemm": lambda: tsm_core.gemm(A, B, out=C)}
        for label, cfg in configs:
            methods[f"strassen_{label}"] = with_cfg(cfg)
            if args.overlap:
                methods[f"strassen_{label}_serial"] = with_cfg(cfg, False)
        err = {}
        for name, fn in methods.items():
            C.fill(np.nan)
            fn()
            ref = A.astype(cp.float64) @ B.astype(cp.float64)
            err[name] = float(cp.abs(C - ref).max()) / scale
            del ref
        f = 2 * n**3 / 1e12
        tf = {name: f / t for name, t in interleaved_medians(methods, reps=10).items()}
        row = {"n": n, "levels": args.levels, "tflops": tf, "max_rel_err": err,
               "of_cublas": {k: v / tf["cublas"] for k, v in tf.items()}}
        rows.append(row)
        print(f"N={n} levels={args.levels}: " + "  ".join(
            f"{k} {v:.1f} ({row['of_cublas'][k]:.3f}, err {err[k]:.0e})" for k, v in tf.items()),
            flush=True)
    _gemm.PIPE_FUSED, _gemm.HYBRID2_OVERLAP = kept
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / f"strassen_pipe_probe_l{args.levels}.json").write_text(
            json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
