"""Probe of the packed route (TSM_KMEANS_PACKED): ms per Lloyd iteration (fits of 5
and 10 iterations, tolerance 0, the difference / 5) with the packed kernel against
the default routes without it, uniform data; and the labels' agreement of the two
fits' final assignments."""
import os
import sys

import cupy as cp
import numpy as np

import tsm_core

SHAPES = [(10_000_000, 32, 8), (10_000_000, 16, 8), (5_000_000, 64, 16), (2_000_000, 128, 16),
          (10_000_000, 32, 16), (4_000_000, 100, 5), (1_000_000, 256, 8), (3_000_000, 48, 12)]
PRECS = sys.argv[1].split(",") if len(sys.argv) > 1 else ["float32", "tf32", "bfloat16", "float16"]


def fit_ms(X, C0, it, prec, reps=3):
    ts = []
    for _ in range(reps):
        a, b = cp.cuda.Event(), cp.cuda.Event()
        a.record()
        lab, inertia, C, n = tsm_core.kmeans_lloyd(X, C0, max_iter=it, tol=-1.0, precision=prec)
        b.record()
        b.synchronize()
        ts.append(cp.cuda.get_elapsed_time(a, b))
    return float(np.median(ts)), n, inertia


rng = np.random.default_rng(0)
for n, d, k in SHAPES:
    X = cp.asarray(rng.uniform(-1, 1, (n, d)).astype(np.float32))
    C0 = X[:k].copy()
    line = [f"({n}, {d}, {k})"]
    for prec in PRECS:
        if prec in ("bfloat16", "float16") and d > 256 or prec in ("float32", "tf32") and d > 128:
            continue
        Xp = X.astype(cp.float16) if prec == "float16" else X
        res = {}
        for sw in ("0", "1"):
            os.environ["TSM_KMEANS_PACKED"] = sw
            fit_ms(Xp, C0, 2, prec, reps=1)  # compile, warm
            t5, n5, _ = fit_ms(Xp, C0, 5, prec)
            t10, n10, inertia = fit_ms(Xp, C0, 10, prec)
            res[sw] = ((t10 - t5) / max(1, n10 - n5), inertia, n10)
        r0, r1 = res["0"], res["1"]
        line.append(f"{prec} {r0[0]:.3f}->{r1[0]:.3f} ({r0[0] / r1[0]:.2f}x, inertia rel {r1[1] / r0[1] - 1:+.1e}, it {r1[2]})")
    os.environ.pop("TSM_KMEANS_PACKED", None)
    print(" | ".join(line), flush=True)
    del X
