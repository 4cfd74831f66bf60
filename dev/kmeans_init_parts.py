"""Where k-means|| spends its time on the GPU: the whole call, then each part timed
(host wall time after a synchronize) by wrapping the pieces of tsm_core.kmeans.init.

    python dev/kmeans_init_parts.py 4e6,128,1024
"""
import time
from collections import defaultdict

import cupy as cp
import numpy as np

import tsm_core
from tsm_core.kmeans import init as I
from tsm_core.kmeans import parallel_init as P
from _probe import shapes

acc = defaultdict(float)
cnt = defaultdict(int)


def timed(name, fn):
    def f(*a, **kw):
        cp.cuda.Device().synchronize()
        t = time.perf_counter()
        r = fn(*a, **kw)
        cp.cuda.Device().synchronize()
        acc[name] += time.perf_counter() - t
        cnt[name] += 1
        return r
    return f


I._GpuOps.nearest = timed("nearest", I._GpuOps.nearest)
I._GpuOps.segment_weights = timed("segment_weights", I._GpuOps.segment_weights)
I._pool_sqdist = timed("pool_sqdist", I._pool_sqdist)
I._recluster = timed("recluster", I._recluster)
I._par.oversample = timed("oversample(all)", P.oversample)

for n, d, k in shapes([(4_000_000, 128, 1024), (1_000_000, 64, 1024), (3_000_000, 96, 2048)]):
    X = cp.random.default_rng(0).standard_normal((n, d), dtype=cp.float32)
    X += cp.asarray(np.random.default_rng(1).standard_normal((1, d)).astype(np.float32)) * 3
    for rep in range(3):
        acc.clear(); cnt.clear()
        cp.cuda.Device().synchronize()
        t = time.perf_counter()
        C, idx = tsm_core.kmeans_parallel(X, k, random_state=rep)
        cp.cuda.Device().synchronize()
        tot = time.perf_counter() - t
    print(f"({n},{d},{k}) total {tot * 1e3:.1f} ms; " +
          "; ".join(f"{a} {v * 1e3:.1f} ms/{cnt[a]}" for a, v in acc.items()), flush=True)
