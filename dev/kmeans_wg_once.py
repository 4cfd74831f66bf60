"""One tensor-core assignment (after a warm-up call) for profiling with ncu:

    ncu -k regex:kmeans_assign --launch-skip 1 -c 1 python dev/kmeans_wg_once.py N D K PREC
"""
import sys

import cupy as cp
import numpy as np

from tsm_core.kmeans.tensor import TensorAssign

n, d, k = (int(float(v)) for v in sys.argv[1:4])
prec = sys.argv[4] if len(sys.argv) > 4 else "tf32"
X = cp.random.default_rng(0).random((n, d), dtype=cp.float32)
C = X[cp.asarray(np.random.default_rng(0).choice(n, k, replace=False))].copy()
if prec in ("float16",):
    X = X.astype(cp.float16)
labels = cp.empty(n, dtype=cp.int32)
mind = cp.empty(n, dtype=cp.float32)
changed = cp.zeros(1, dtype=cp.int32)
tc = TensorAssign(n, d, k, prec)
tc.prepare(C)
for _ in range(2):
    tc.run(X, labels, mind, changed, labels)
cp.cuda.runtime.deviceSynchronize()
print("wg" if tc.wg else "mma.sync", tc.k_main)
