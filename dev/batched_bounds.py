"""Upper bounds on the batched bench's headline geomeans, from a committed run:

    python dev/batched_bounds.py [benchmarks/results/h100/batched.json] [--out F]

No GPU needed: it reads the run's per-cell times and asks how far each geometric mean
could go if our kernel were perfect. Per cell, our call takes at least

- its host time (``ours_host_ms``: Python checking the arrays and enqueueing the
  launch, measured in the same run; the GPU cannot start before it), and
- the FLOPs at the H100's float32 FMA peak (132 SMs x 128 FMA x 2 x 1.98 GHz =
  66.9 TFLOP/s), the least device time any float32 kernel needs (tensor cores
  excepted: 3xTF32 is not float32 FMA);

so the speedup over a baseline is at most baseline_ms / max(host, peak time). The
same for the prepared batch (``ours_prepared_host_ms``). The baselines are the run's
own: the Python loop of cuBLAS calls and the best of cuBLAS's grouped call and the
loop captured in a CUDA graph (`tsm_core.bench._batched`).
"""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

PEAK_FP32 = 132 * 128 * 2 * 1.98e9  # FLOP/s: H100 SXM, float32 FMA at its boost clock


def _geomean(xs):
    xs = list(xs)
    return math.exp(sum(map(math.log, xs)) / len(xs))


def bounds(rows, peak=PEAK_FP32):
    """Geometric means over the cells of baseline / our time under each assumption."""
    out = {}
    for path, host in (("per_call", "ours_host_ms"), ("prepared", "ours_prepared_host_ms")):
        for base in ("loop", "best"):
            def b(r):
                return r["loop_ms"] if base == "loop" else min(r["graph_ms"], r["grouped_ms"])

            peak_ms = [r["gflop"] * 1e9 / peak * 1e3 for r in rows]
            out[f"{path}_vs_{base}"] = {
                "measured": _geomean(b(r) / r["ours_ms" if path == "per_call" else "ours_prepared_ms"]
                                     for r in rows),
                "device_free": _geomean(b(r) / r[host] for r in rows),
                "host_free_peak_device": _geomean(b(r) / p for r, p in zip(rows, peak_ms)),
                "bound": _geomean(b(r) / max(r[host], p) for r, p in zip(rows, peak_ms)),
            }
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("run", nargs="?", default="benchmarks/results/h100/batched.json")
    ap.add_argument("--out", default=None, help="write the bounds as JSON here")
    args = ap.parse_args(argv)
    d = json.loads(Path(args.run).read_text())
    rows = d["rows"]
    res = {"run": args.run, "cells": len(rows), "peak_fp32_tflops": PEAK_FP32 / 1e12,
           "targets": {"per_call_vs_loop": 15.0, "per_call_vs_best": 3.0,
                       "prepared_vs_loop": 15.0, "prepared_vs_best": 3.0},
           "geomeans": bounds(rows)}
    print(f"{len(rows)} cells of {args.run}; float32 peak {PEAK_FP32 / 1e12:.1f} TFLOP/s")
    print(f"{'geomean':<22}{'target':>8}{'measured':>10}{'device free':>13}"
          f"{'host free':>11}{'bound':>8}")
    for k, v in res["geomeans"].items():
        print(f"{k:<22}{res['targets'][k]:>8.1f}{v['measured']:>10.2f}{v['device_free']:>13.2f}"
              f"{v['host_free_peak_device']:>11.2f}{v['bound']:>8.2f}")
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
