"""Probe: the warpgroup-MMA assignment per tile (one block a 128-row tile) against its
persistent form (TSM_KMEANS_PERSIST=1: one block an SM over the row tiles, the next
tile's rows copied during the current one): ms per assignment (decisions included)
in "tf32", "float32" (three bfloat16 products) and "bfloat16", interleaved rounds, and
whether the two give the same labels. Uniform data, centres drawn from the rows.

    python dev/kmeans_persist_probe.py [n,d,k ...]
"""
import os
import sys

import cupy as cp
import numpy as np

from tsm_core.kmeans.tensor import TensorAssign, to_bfloat16_words
from tsm_core.runtime.timing import time_fn

SHAPES = [(4_000_000, 128, 1024), (1_000_000, 64, 1024), (10_000_000, 32, 256), (1_000_000, 128, 4096),
          (2_000_000, 96, 2048), (1_000_000, 128, 256)]


def probe(n, d, k):
    X = cp.random.default_rng(0).random((n, d), dtype=cp.float32)
    C = X[cp.asarray(np.random.default_rng(0).choice(n, k, replace=False))].copy()
    Xb = to_bfloat16_words(X) if d % 2 == 0 else None
    changed = cp.zeros(1, dtype=cp.int32)
    line = []
    for prec in ("tf32", "float32", "bfloat16"):
        if prec == "bfloat16" and Xb is None:
            continue
        Xp = Xb if prec == "bfloat16" else X
        runs = {}
        for persist in ("0", "1"):
            os.environ["TSM_KMEANS_PERSIST"] = persist
            tc = TensorAssign(n, d, k, prec)
            tc.prepare(C)
            labels = cp.empty(n, dtype=cp.int32)
            mind = cp.empty(n, dtype=cp.float32)
            runs[persist] = (tc, labels, mind)
        ms = {"0": [], "1": []}
        for _ in range(3):  # interleaved rounds
            for persist, (tc, labels, mind) in runs.items():
                ms[persist].append(time_fn(lambda: tc.run(Xp, labels, mind, changed, labels), reps=7).median_s * 1e3)
        same = bool((runs["0"][1] == runs["1"][1]).all())
        a, b = min(ms["0"]), min(ms["1"])
        line.append(f"{prec} {a:7.2f} -> {b:7.2f} ms ({a / b:.2f}x, wg={int(runs['1'][0].wg)} "
                    f"persist={int(runs['1'][0].persist)}, same labels {same})")
    print(f"{n},{d},{k}: " + " | ".join(line), flush=True)


if __name__ == "__main__":
    os.environ.setdefault("TSM_KMEANS_WGMMA", "1")
    os.environ.setdefault("TSM_KMEANS_SPLIT", "bf16x3")
    shapes = [tuple(int(float(v)) for v in a.split(",")) for a in sys.argv[1:]] or SHAPES
    for s in shapes:
        probe(*s)
