"""Probe of the margin rule's cost ("float32" against "tf32" on the tensor cores):
per assignment, the main kernel, the pair and full decisions, and the share of rows
each decision takes, on uniform data with centres drawn from the rows (as the
precision sweep).

    python dev/kmeans_margin_probe.py [n,d,k ...]
"""

import cupy as cp
import numpy as np

from tsm_core.kmeans.decide import FD_ROWS, _kernel, _sms
from tsm_core.kmeans.tensor import TensorAssign
from tsm_core.runtime.timing import time_fn
from _probe import assignment_case, shapes as probe_shapes

SHAPES = [(4_000_000, 128, 1024), (1_000_000, 64, 1024), (100_000, 4096, 1024), (1_000_000, 256, 64),
          (10_000_000, 32, 256)]


def probe(n, d, k):
    X, C, labels, mind, changed = assignment_case(n, d, k)
    row = {"shape": (n, d, k)}
    for prec in ("tf32", "float32"):
        tc = TensorAssign(n, d, k, prec)
        tc.prepare(C)
        row[prec] = time_fn(lambda: tc.run(X, labels, mind, changed, labels), reps=10).median_s * 1e3
    st = tc.stats
    row["pairs"] = st["pairs"] / st["rows"]
    row["full"] = st["full"] / st["rows"]
    sms = _sms()
    pv = labels
    pair = _kernel("kmeans_pair_decide")
    full = _kernel("kmeans_full_decide")
    row["pair_ms"] = time_fn(lambda: pair((min(-(-n // 8), 4 * sms),), (256,), (
        X, np.int64(d), np.int32(d), tc.C, tc.lists, tc.counts, np.int32(n), labels, mind, pv, changed)),
        reps=10).median_s * 1e3
    row["full_ms"] = time_fn(lambda: full((min(-(-n // FD_ROWS), 2 * sms),), (256,), (
        X, np.int64(d), np.int32(d), tc.C, np.int32(k), tc.lists, tc.counts, np.int32(n), labels, mind, pv,
        changed, tc.list_counts)), reps=10).median_s * 1e3
    print(f"{str(row['shape']):>22} tf32 {row['tf32']:8.3f}  float32 {row['float32']:8.3f}  "
          f"pairs {row['pairs']:.3f} ({row['pair_ms']:.3f} ms)  full {row['full']:.4f} ({row['full_ms']:.3f} ms)",
          flush=True)


if __name__ == "__main__":
    shapes = probe_shapes(SHAPES)
    for s in shapes:
        probe(*s)
        cp.get_default_memory_pool().free_all_blocks()
