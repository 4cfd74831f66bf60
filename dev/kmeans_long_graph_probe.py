"""Whether the long-row route's TF32 pass gains from blocks small enough to stay in L2
once the per-call host cost is gone: "tf32" on the route (one pass, no host reads),
launched directly and as one captured CUDA graph, at several block sizes. ms per
assignment (CUDA events, median of 5), uniform rows, centres one Lloyd step on.

    python dev/kmeans_long_graph_probe.py [n,d,k ...]
"""
import os

import cupy as cp

from tsm_core.kmeans import longrows
from tsm_core.kmeans.tensor import TensorAssign
from tsm_core.runtime import timing
from _probe import assignment_case, lloyd_step_centres, shapes


def ms(fn, reps=5):
    return timing.event_median(fn, warmup=1, reps=reps) * 1e3


os.environ["TSM_KMEANS_LONG"] = "1"
for n, d, k in shapes([(2_000_000, 512, 256), (1_000_000, 256, 64), (100_000, 4096, 1024)]):
    X, C, lab, md, ch = assignment_case(n, d, k)
    C = lloyd_step_centres(X, C)
    line = [f"({n}, {d}, {k})"]
    for rows in (2048, 8192, 32768, 0):
        if rows:  # blocks of exactly `rows`
            longrows.MIN_BLOCK = rows
            longrows.BLOCK_BYTES = rows * 4 * max(-(-d // 4) * 4, k)
        else:
            longrows.MIN_BLOCK, longrows.BLOCK_BYTES = 4096, 256 << 20
        ta = TensorAssign(n, d, k, "tf32")
        ta.prepare(C)
        direct = ms(lambda: ta.run(X, lab, md, ch, None))
        s = cp.cuda.Stream(non_blocking=True)
        with s:
            ta.run(X, lab, md, ch, None)  # cuBLAS's first call outside the capture
            s.synchronize()
            s.begin_capture()
            ta.run(X, lab, md, ch, None)
            g = s.end_capture()
            graph = ms(lambda: g.launch(s))
        line.append(f"block {ta.long.block}: direct {direct:.3f}, graph {graph:.3f}")
    print(" | ".join(line), flush=True)
