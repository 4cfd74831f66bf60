"""Where a packed iteration's time goes (ms, CUDA events, median of 9): the packed
kernel labels-only and with the sums (kernel alone, and with the row blocks'
reduction), the reduction alone, and the direct update of the same labels."""
import cupy as cp
import numpy as np

from tsm_core.kmeans import configs
from tsm_core.kmeans.assign import storage_rows
from tsm_core.kmeans.launch import _kernel
from tsm_core.kmeans.update import _Sums, packed_assign
from tsm_core.runtime import timing


def ms(fn, reps=9):
    """Median ms of fn() between CUDA events, after one untimed call."""
    return timing.event_median(fn, warmup=1, reps=reps) * 1e3


rng = np.random.default_rng(0)
for n, d, k in ((10_000_000, 32, 8), (10_000_000, 16, 8), (5_000_000, 64, 16), (2_000_000, 128, 16)):
    X = cp.asarray(rng.uniform(-1, 1, (n, d)).astype(np.float32))
    C = X[:k].copy()
    for prec in ("float32", "bfloat16"):
        st = configs.storage_dtype(prec)
        Xs = storage_rows(X, "float32", prec)
        cfg = configs.packed_config(k, d, st)
        if cfg is None:
            continue
        lab = cp.empty(n, dtype=cp.int32)
        md = cp.empty(n, dtype=cp.float32)
        ch = cp.zeros(1, dtype=cp.int32)
        work = _Sums(n, d, k, st)
        S, W = cp.empty((k, d)), cp.empty(k)
        nrb = -(-n // configs.ROW_BLOCK)
        part = cp.empty((nrb * k, d))
        wpart = cp.empty(nrb * k)
        t_lab = ms(lambda: packed_assign(Xs, st, C, lab, md, ch))
        t_kern = ms(lambda: packed_assign(Xs, st, C, lab, md, ch, part=part, wpart=wpart))
        t_red = ms(lambda: _kernel("kmeans_reduce_rb<double>")((-(-(k * (d + 1)) // 8),), (256,), (
            part, wpart, np.int32(nrb), np.int32(k), np.int32(d), np.int32(0), S, W)))
        t_both = ms(lambda: work.packed(Xs, C, lab, md, ch, None, None, S, W))
        t_dir = ms(lambda: work.run(Xs, lab, None, S, W))
        gb = Xs.nbytes / 1e9
        print(f"({n}, {d}, {k}) {prec} cfg={cfg[:4]} route={work.route}: labels-only {t_lab:.3f} "
              f"({gb / t_lab:.2f} TB/s) | kernel+sums {t_kern:.3f} | reduce_rb {t_red:.3f} | packed() {t_both:.3f} "
              f"| direct update {t_dir:.3f}", flush=True)
    del X
