"""Batched GEMM in float32 on uniform batches of large problems: kernel version 1
(the paper's five tile types, three blocks per SM) against versions 3 (plus 128 x 64
tiles of 8 x 4 outputs a thread, three blocks per SM) and 4 (plus 128 x 128 tiles of
8 x 8, two blocks per SM), through ``prepare_batched``, beside ``torch.bmm`` (cuBLAS's strided batched SGEMM, TF32
off). Device time (``tsm_core.runtime.timing.time_fn``), seeded; checks each result
against the float64 product.

    python benchmarks/batched_wide_probe.py [--out DIR] [--seed S]

Prints a table and writes DIR/batched_wide_probe.json. (The batched bench proper,
``python -m tsm_core.bench batched``, runs the paper's irregular sweep and records
versions 3 and 4 there.)
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# (M, N, K, batch)
CASES = [(1024, 1024, 256, 32), (512, 512, 512, 64), (1000, 1000, 200, 32), (256, 256, 256, 256),
         (640, 640, 128, 64)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp"))
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    from tsm_core import has_gpu

    if not has_gpu():
        print("batched_wide_probe: no CUDA GPU found; nothing to time")
        return 1
    import torch

    from tsm_core.batched import api as _batched
    from tsm_core.runtime import timing as _timing

    torch.backends.cuda.matmul.allow_tf32 = False
    dev = torch.device("cuda")
    rows = []
    for m, n, k, b in CASES:
        g = torch.Generator(device=dev)
        g.manual_seed(args.seed * 1000003 + m * 7919 + n * 31 + k * 7 + b)
        A = torch.randn(b, m, k, device=dev, generator=g)
        B = torch.randn(b, k, n, device=dev, generator=g)
        C = torch.empty(b, m, n, device=dev)
        ref = A.double() @ B.double()
        As, Bs, Cs = list(A.unbind(0)), list(B.unbind(0)), list(C.unbind(0))
        flops = 2.0 * m * n * k * b
        row = dict(m=m, n=n, k=k, batch=b)
        runs = {f"v{v}": _batched.prepare_batched(As, Bs, Cs, version=v).run for v in (1, 3, 4)}
        runs["bmm"] = lambda: torch.bmm(A, B, out=C)
        for name, fn in runs.items():
            C.fill_(float("nan"))
            fn()
            torch.cuda.synchronize()
            row[f"{name}_err"] = ((C.double() - ref).abs().max() / ref.abs().max()).item()
            t = _timing.time_fn(fn, reps=20)
            row[f"{name}_ms"] = t.median_s * 1e3
            row[f"{name}_tflops"] = flops / t.median_s / 1e12
        row["v3_over_v1"] = row["v1_ms"] / row["v3_ms"]
        row["v4_over_v1"] = row["v1_ms"] / row["v4_ms"]
        row["v4_of_bmm"] = row["bmm_ms"] / row["v4_ms"]
        rows.append(row)
        print(f"{m:5d} x {n:5d} x {k:4d} x {b:3d}: v1 {row['v1_tflops']:5.1f}  v3 "
              f"{row['v3_tflops']:5.1f}  v4 {row['v4_tflops']:5.1f}  bmm {row['bmm_tflops']:5.1f} "
              f"TFLOP/s  v3/v1 {row['v3_over_v1']:.2f}  v4/v1 {row['v4_over_v1']:.2f}  v4 of bmm "
              f"{row['v4_of_bmm']:.2f}  err {max(row[f'{x}_err'] for x in ('v1', 'v3', 'v4', 'bmm')):.1e}",
              flush=True)
    doc = dict(probe="batched_wide_probe", command="python benchmarks/batched_wide_probe.py",
               gpu=torch.cuda.get_device_name(), seed=args.seed, rows=rows)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "batched_wide_probe.json")
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
