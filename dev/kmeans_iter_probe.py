"""Probe of one Lloyd iteration's parts on the GPU, per precision: the assignment
alone, the assignment with the centroid sums, and the finalize (new centres and
status), on uniform data with centres drawn from the rows (as the precision sweep).

    PRECS=tf32,float32,float16,bfloat16 python dev/kmeans_iter_probe.py [n,d,k ...]

Each part's route is printed beside its time (tensor kernel: wg, wgp or mma; sums:
direct/sorted).
"""
import os

import cupy as cp
import numpy as np

from tsm_core.kmeans.lloyd import _GpuSteps
from tsm_core.kmeans.sources import kmeans_source
from tsm_core.runtime.timing import time_fn
from _probe import shapes as probe_shapes

SHAPES = [(4_000_000, 128, 1024), (1_000_000, 64, 1024), (1_000_000, 256, 64), (10_000_000, 32, 256)]


def probe(n, d, k):
    X = cp.random.default_rng(0).random((n, d), dtype=cp.float32)
    C = X[cp.asarray(np.random.default_rng(0).choice(n, k, replace=False))].copy()
    X16 = X.astype(cp.float16)
    line = f"{str((n, d, k)):>22}"
    for prec in os.environ.get("PRECS", "tf32,float32,float16").split(","):
        Xp = X16 if prec == "float16" else X
        src = kmeans_source(Xp, n_clusters=k)
        st = _GpuSteps(src, C.copy(), None, "auto", prec)
        tc = st.tc
        kind = st.method if tc is None else ("wgp" if tc.persist else "wg" if tc.wg else "mma")
        line += f" | {prec} [{kind}/{st.work.route}]"
        a = time_fn(lambda: st.pass_over(False), reps=5).median_s * 1e3
        au = time_fn(lambda: st.pass_over(True), reps=5).median_s * 1e3
        f = time_fn(lambda: st.finalize(st.C, st.C_new, st.cn_new, wait=False), reps=5).median_s * 1e3
        line += f" assign {a:.2f} +sums {au - a:.2f} final {f:.2f}"
        del st, src
        cp.get_default_memory_pool().free_all_blocks()
    print(line, flush=True)


if __name__ == "__main__":
    shapes = probe_shapes(SHAPES)
    for s in shapes:
        probe(*s)
