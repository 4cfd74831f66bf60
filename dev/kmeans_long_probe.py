"""Long rows (d > 128 float32 words): the fused mma.sync route against the long-row
route (cuBLAS's products, longrows.py).

ms per assignment (CUDA events, median of 5) with centres one Lloyd step from drawn
rows (uniform data): tf32 and "float32" TensorAssign on the fused mma.sync kernel
(TSM_KMEANS_LONG=0, with the margin rule's pair and full counts) and on the long-row
route (=1, with its listed and float64-decided counts), and whether the "float32"
labels of the two agree.

    python dev/kmeans_long_probe.py [n,d,k ...]
"""
import os


from tsm_core.kmeans.tensor import TensorAssign
from tsm_core.runtime import timing
from _probe import assignment_case, lloyd_step_centres, shapes


def ms(fn, reps=5):
    return timing.event_median(fn, warmup=1, reps=reps) * 1e3


for n, d, k in shapes([(100_000, 4096, 1024), (2_000_000, 512, 256), (1_000_000, 256, 64),
                       (100_000, 2048, 4096), (500_000, 1024, 64), (1_000_000, 256, 1024), (300_000, 300, 500)]):
    X, C, lab, md, ch = assignment_case(n, d, k)
    C = lloyd_step_centres(X, C)
    line = [f"({n}, {d}, {k})"]
    labs = {}
    for prec in ("tf32", "float32"):
        for long in ("0", "1"):
            os.environ["TSM_KMEANS_LONG"] = long
            ta = TensorAssign(n, d, k, prec)
            ta.prepare(C)
            t_ms = ms(lambda: ta.run(X, lab, md, ch, None))
            s0 = ta.stats
            ta.run(X, lab, md, ch, None)
            s1 = ta.stats
            labs[prec, long] = lab.copy()
            extra = ""
            if prec == "float32":
                got = {kk: (s1[kk] - s0[kk]) / n for kk in s1 if kk != "rows"}
                extra = " (" + ", ".join(f"{kk} {v:.1%}" for kk, v in got.items() if v) + ")"
            line.append(f"{prec} {'long' if long == '1' else 'fused'} {t_ms:.3f}{extra}")
    same = float((labs["float32", "0"] == labs["float32", "1"]).mean())
    tf = float((labs["tf32", "1"] == labs["float32", "1"]).mean())
    print(" | ".join(line) + f" | float32 labels equal {same:.6f}; tf32 long = float32 {tf:.4f} | "
          f"TF32 at 400 TF/s {2.0 * n * k * d / 4e11:.3f}", flush=True)
