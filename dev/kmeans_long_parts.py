"""Where "float32" spends an assignment on long rows (uniform data, centres one Lloyd
step on), ms (CUDA events, median of 5):

- long-row route: the whole run, the TF32 pass alone ("tf32" on the same route), and
  the shares of rows listed, decided between two centres and against all in float64;
- fused mma.sync route: the whole run, "tf32" on it, and the pair and full decision
  kernels alone on the rows the margin rule listed.

    python dev/kmeans_long_parts.py [n,d,k ...]
"""
import os

import numpy as np

from tsm_core.kmeans.decide import FD_KERNEL_KD, FD_ROWS, _kernel, _sms, decide_full
from tsm_core.kmeans.tensor import TensorAssign
from tsm_core.runtime import timing
from _probe import assignment_case, lloyd_step_centres, shapes


def ms(fn, reps=5):
    return timing.event_median(fn, warmup=1, reps=reps) * 1e3


def route(n, d, k, C, X, lab, md, ch, long):
    """The "float32" workspace on the route TSM_KMEANS_LONG=long, its ms and tf32's."""
    os.environ["TSM_KMEANS_LONG"] = long
    out = []
    for prec in ("float32", "tf32"):
        ta = TensorAssign(n, d, k, prec)
        ta.prepare(C)
        out += [ta, ms(lambda: ta.run(X, lab, md, ch, None))]
    return out[0], out[1], out[3]


for n, d, k in shapes([(2_000_000, 512, 256), (1_000_000, 256, 64), (500_000, 1024, 64), (100_000, 4096, 1024),
                       (1_000_000, 256, 256)]):
    X, C, lab, md, ch = assignment_case(n, d, k)
    C = lloyd_step_centres(X, C)
    out = []
    la, whole, tf = route(n, d, k, C, X, lab, md, ch, "1")
    L = la.long
    m, pairs, full = (int(v) for v in L.counts.get())
    out.append(f"long: whole {whole:.3f} | tf32 pass {tf:.3f} | split pass and decisions {whole - tf:.3f} "
               f"(listed {m / n:.1%}, pairs {pairs / n:.2%}, full {full / n:.2%})")
    fa, whole, tf = route(n, d, k, C, X, lab, md, ch, "0")
    pairs, fulls = (int(v) for v in fa.counts.get())
    sms = _sms()
    ldx = X.strides[0] // 4

    def pair():
        _kernel("kmeans_pair_decide")((min(-(-n // 8), 4 * sms),), (256,), (
            X, np.int64(ldx), np.int32(d), C, fa.lists, fa.counts, np.int32(n), lab, md, np.uint64(0), ch))

    def fullk():
        if k * d <= FD_KERNEL_KD:
            _kernel("kmeans_full_decide")((min(-(-n // FD_ROWS), 2 * sms),), (256,), (
                X, np.int64(ldx), np.int32(d), C, np.int32(k), fa.lists, fa.counts, np.int32(n), lab, md, np.uint64(0), ch,
                fa.list_counts))
        elif fulls:
            decide_full(X, fa.lists[3 * n: 3 * n + fulls], C, lab, md, ch, None)

    tp, tfu = ms(pair), ms(fullk)
    out.append(f"fused: whole {whole:.3f} | tf32 {tf:.3f} | pair kernel {tp:.3f} ({pairs / n:.1%}) | "
               f"full {'kernel' if k * d <= FD_KERNEL_KD else 'cuBLAS'} {tfu:.3f} ({fulls / n:.1%})")
    print(f"({n}, {d}, {k}) " + " || ".join(out), flush=True)
