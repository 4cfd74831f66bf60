"""Probe: "float32" on the warpgroup kernel as one TF32 product (margin rule) against
three bfloat16 products (TSM_KMEANS_SPLIT=bf16x3), and "tf32": ms per assignment
(decisions included), the shares of rows re-decided, and labels against float64 on
the first rows. Uniform data, centres drawn from the rows (as the precision sweep).

    python dev/kmeans_split_probe.py [n,d,k ...]
"""
import os

import cupy as cp

from tsm_core.kmeans.tensor import TensorAssign
from tsm_core.runtime.timing import time_fn
from _probe import assignment_case, shapes as probe_shapes

SHAPES = [(4_000_000, 128, 1024), (1_000_000, 64, 1024), (10_000_000, 32, 256), (1_000_000, 128, 4096),
          (2_000_000, 96, 2048)]


def check(X, C, labels, rows=20000):
    Xs = X[:rows].astype(cp.float64)
    C64 = C.astype(cp.float64)
    D = (Xs * Xs).sum(1)[:, None] - 2 * Xs @ C64.T + (C64 * C64).sum(1)[None]
    lab = labels[:rows].astype(cp.int64)
    dl = D[cp.arange(len(D)), lab]
    scale = (Xs * Xs).sum(1) + (C64 * C64).sum(1).max()
    return int(((dl - D.min(1)) > 1e-12 * scale).sum())


def probe(n, d, k):
    X, C, labels, mind, changed = assignment_case(n, d, k)
    out = []
    for name, prec, split in (("tf32", "tf32", "tf32"), ("f32/tf32", "float32", "tf32"),
                              ("f32/bf16x3", "float32", "bf16x3")):
        os.environ["TSM_KMEANS_SPLIT"] = split
        tc = TensorAssign(n, d, k, prec)
        tc.prepare(C)
        ms = time_fn(lambda: tc.run(X, labels, mind, changed, labels), reps=10).median_s * 1e3
        st = tc.stats
        bad = check(X, C, labels) if prec == "float32" else -1
        out.append(f"{name} {ms:7.2f} ms (wg={int(tc.wg)} tin={tc.tin} pairs {st['pairs'] / max(st['rows'], 1):.4f} "
                   f"full {st['full'] / max(st['rows'], 1):.4f} bad {bad})")
    print(f"{n},{d},{k}: " + " | ".join(out), flush=True)


if __name__ == "__main__":
    os.environ.setdefault("TSM_KMEANS_WGMMA", "1")
    shapes = probe_shapes(SHAPES)
    for s in shapes:
        probe(*s)
