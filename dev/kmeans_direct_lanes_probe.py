"""Probe: the direct centroid update with short rows packed into a warp
(TSM_KMEANS_DIRECT_LANES=1: 32 / LPR rows a warp step) against one row a warp: ms per
call (events, interleaved rounds), the X read rate, and the largest difference of the
two sums. Signed normal rows, 90% of them in cluster 0 (the skew the tests use).

    python dev/kmeans_direct_lanes_probe.py [n,d,k ...]
"""
import os
import sys

import cupy as cp
import numpy as np

from tsm_core.kmeans.update import _Sums
from tsm_core.runtime.timing import time_fn

SHAPES = [(10_000_000, 32, 8), (10_000_000, 16, 8), (4_000_000, 64, 16), (10_000_000, 3, 5), (2_000_000, 100, 4)]


def probe(n, d, k):
    rng = np.random.default_rng(0)
    lab = rng.integers(0, k, n)
    lab[rng.random(n) < 0.9] = 0
    labels = cp.asarray(lab.astype(np.int32))
    line = f"{n},{d},{k}:"
    for t in ("float32", "float16"):
        X = cp.random.default_rng(0).standard_normal((n, d), dtype=cp.float32).astype(t)
        work = _Sums(n, d, k, t)
        out = {}
        for flag in ("0", "1"):
            sums, wsum = cp.empty((k, d)), cp.empty(k)
            os.environ["TSM_KMEANS_DIRECT_LANES"] = flag
            work.run(X, labels, None, sums, wsum)
            out[flag] = (sums, wsum)
        ms = {"0": [], "1": []}
        for _ in range(3):
            for flag in ("0", "1"):
                os.environ["TSM_KMEANS_DIRECT_LANES"] = flag
                s, w = out[flag]
                ms[flag].append(time_fn(lambda: work.run(X, labels, None, s, w), reps=10).median_s * 1e3)
        a, b = min(ms["0"]), min(ms["1"])
        diff = float(cp.abs(out["0"][0] - out["1"][0]).max())
        line += (f" | {t} {work.route} {a:.3f} -> {b:.3f} ms ({a / b:.2f}x, "
                 f"{X.nbytes / b / 1e6:.0f} GB/s, max diff {diff:.2e})")
    print(line, flush=True)


if __name__ == "__main__":
    shapes = [tuple(int(float(v)) for v in a.split(",")) for a in sys.argv[1:]] or SHAPES
    for s in shapes:
        probe(*s)
