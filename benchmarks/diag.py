"""Ad-hoc diagnosis of slow dispatch cases (developer tool)."""
import cupy as cp
import numpy as np

import tsm_core


def bench(fn, reps=10):
    fn()
    cp.cuda.Device().synchronize()
    s, e = cp.cuda.Event(), cp.cuda.Event()
    ts = []
    for _ in range(reps):
        s.record(); fn(); e.record(); e.synchronize()
        ts.append(cp.cuda.get_elapsed_time(s, e))
    return float(np.median(ts))


rng = np.random.default_rng(0)
for dt, m, k, n in [(np.float32, 256, 65536, 16), (np.float64, 256, 65536, 1)]:
    A = cp.asfortranarray(cp.asarray(rng.standard_normal((m, k)), dtype=dt))
    B = cp.asfortranarray(cp.asarray(rng.standard_normal((k, n)), dtype=dt))
    C = cp.empty((m, n), dt)
    print(m, k, n, np.dtype(dt).name, "cupy", bench(lambda: cp.matmul(A, B, out=C)))
    for sp in (0, 1, 8, 32, 64):
        print("  splits", sp, bench(lambda: tsm_core.tsm2r(A, B, out=C, splits=sp)))
    print("  v3 t1=64", bench(lambda: tsm_core.tsm2r(A, B, out=C, t1=64)))
for dt, order in [(np.float64, "C"), (np.float32, "C")]:
    m = 20480
    A = cp.asarray(rng.standard_normal((m, m)), dtype=dt, order=order)
    B = cp.asarray(rng.standard_normal((m, 16)), dtype=dt, order=order)
    C = cp.empty((m, 16), dt)
    t = bench(lambda: tsm_core.tsm2r(A, B, out=C))
    print(np.dtype(dt).name, order, "m=20480 n=16", t, "ms", A.nbytes / t / 1e6, "GB/s")
