"""Batched GEMM in float64: kernel version 1 (FMA) against version 2 (DMMA on the
FP64 tensor cores for tiles of 32 rows or more), both through ``prepare_batched``,
device time (``tsm_core.runtime.timing.time_fn``), on cells of the paper's sweep
(datasets/irregular.py), seeded, and on two squares (a batch of one) beside cuBLAS's
DGEMM. Checks each against the float64 product.

    python dev/batched_f64_probe.py [--out DIR] [--seed S]

Prints a table and writes DIR/batched_f64_probe.json. (The batched bench proper,
``python -m tsm_core.bench batched``, is float32 against cuBLAS.)
"""

import argparse
import json
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CELLS = [(128, 128, 64), (256, 256, 64), (512, 256, 128), (512, 512, 64), (1024, 256, 32),
         (1024, 512, 128), (1024, 512, 256)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp"))
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    from tsm_core import has_gpu

    if not has_gpu():
        print("batched_f64_probe: no CUDA GPU found; nothing to time")
        return 2
    import cupy

    from tsm_datasets.irregular import irregular_shapes
    from tsm_core.batched import api as _batched
    from tsm_core.runtime import timing as _timing

    rng = np.random.default_rng(args.seed)
    rows = []
    for mn, mk, bs in CELLS:
        shapes = irregular_shapes(mn, mk, bs, seed=args.seed)
        As = [rng.standard_normal((m, k)) for m, n, k in shapes]
        Bs = [rng.standard_normal((k, n)) for m, n, k in shapes]
        dA = [cupy.asarray(a) for a in As]
        dB = [cupy.asarray(b) for b in Bs]
        flops = sum(2 * m * n * k for m, n, k in shapes)
        row = dict(max_mn=mn, max_k=mk, batch=bs, gflop=flops / 1e9)
        for v in (1, 2):
            dC = [cupy.full((m, n), np.nan) for m, n, k in shapes]
            prep = _batched.prepare_batched(dA, dB, dC, version=v)
            prep.run()
            cupy.cuda.get_current_stream().synchronize()
            err = max(float(np.abs(cupy.asnumpy(c) - a @ b).max() / max(np.abs(a @ b).max(), 1e-300))
                      for a, b, c in zip(As, Bs, dC))
            t = _timing.time_fn(prep.run, reps=20, max_time_s=0.5)
            row[f"v{v}_dev_ms"] = t.median_s * 1e3
            row[f"v{v}_tflops"] = flops / t.median_s / 1e12
            row[f"v{v}_err"] = err
        row["v2_speedup"] = row["v1_dev_ms"] / row["v2_dev_ms"]
        rows.append(row)
        print(f"MN<={mn:4d} K<={mk:3d} bs={bs:3d}: v1 {row['v1_dev_ms']:.3f} ms "
              f"({row['v1_tflops']:.1f} TFLOP/s)  v2 {row['v2_dev_ms']:.3f} ms "
              f"({row['v2_tflops']:.1f})  x{row['v2_speedup']:.2f}  err {row['v1_err']:.1e} / "
              f"{row['v2_err']:.1e}", flush=True)
    # One big problem as a batch of one: version 2 is then a DMMA DGEMM of 64 x 64
    # tiles; cuBLAS's DGEMM (cupy.matmul, DMMA as well) in the same run for scale.
    for n in (2048, 4096):
        a = cupy.asarray(rng.standard_normal((n, n)))
        b = cupy.asarray(rng.standard_normal((n, n)))
        c = cupy.empty((n, n))
        row = dict(square=n, gflop=2 * n**3 / 1e9)
        for v in (1, 2):
            prep = _batched.prepare_batched([a], [b], [c], version=v)
            t = _timing.time_fn(prep.run, reps=10, max_time_s=1.0)
            row[f"v{v}_dev_ms"] = t.median_s * 1e3
            row[f"v{v}_tflops"] = 2 * n**3 / t.median_s / 1e12
        ref = cupy.matmul(a, b)
        row["v2_err"] = float(cupy.abs(c - ref).max() / cupy.abs(ref).max())
        t = _timing.time_fn(lambda: cupy.matmul(a, b, out=ref), reps=10, max_time_s=1.0)
        row["cublas_dev_ms"] = t.median_s * 1e3
        row["cublas_tflops"] = 2 * n**3 / t.median_s / 1e12
        rows.append(row)
        print(f"square {n}: v1 {row['v1_tflops']:.1f}  v2 {row['v2_tflops']:.1f}  cuBLAS DGEMM "
              f"{row['cublas_tflops']:.1f} TFLOP/s  (v2 vs cuBLAS err {row['v2_err']:.1e})", flush=True)
    rows_cells = [r for r in rows if "v2_speedup" in r]
    gm = math.exp(sum(math.log(r["v2_speedup"]) for r in rows_cells) / len(rows_cells))
    doc = dict(command="python dev/batched_f64_probe.py " + " ".join(argv or sys.argv[1:]),
               device=cupy.cuda.runtime.getDeviceProperties(0)["name"].decode(), seed=args.seed,
               rows=rows, geomean_v2_speedup=gm)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "batched_f64_probe.json"), "w") as f:
        json.dump(doc, f, indent=1)
    print(f"geomean v2 (DMMA) / v1 (FMA), device time: x{gm:.2f}")
    return 0 if all(r.get("v1_err", 0) < 1e-12 and r["v2_err"] < 1e-12 for r in rows) else 2


if __name__ == "__main__":
    sys.exit(main())
