import os, sys
os.environ["TSM_KMEANS_WGMMA"] = "1"
import cupy as cp, numpy as np
from tsm_core.kmeans.tensor import TensorAssign
from tsm_core.kmeans.assign import storage_rows
n, d, k = 2000003, 32, 8
X = cp.random.default_rng(0).random((n, d), dtype=cp.float32)
C = X[cp.asarray(np.random.default_rng(0).choice(n, k, replace=False))].copy()
for split in ("bf16x3", "tf32"):
    os.environ["TSM_KMEANS_SPLIT"] = split
    res = {}
    for form, ws in (("tile", "0"), ("ws", "1")):
        os.environ["TSM_KMEANS_WS"] = ws; os.environ["TSM_KMEANS_PERSIST"] = "0"
        tc = TensorAssign(n, d, k, "float32"); tc.prepare(C)
        outs = []
        for rep in range(3):
            lab = cp.full(n, -7, dtype=cp.int32); md = cp.full(n, cp.nan, dtype=cp.float32)
            tc.run(X, lab, md, cp.zeros(1, dtype=cp.int32), None)
            outs.append((lab.get(), md.get()))
        res[form] = outs
        print(split, form, "tin", tc.tin, "ws", tc.ws, "stats", tc.stats)
    t = res["tile"][0]
    for rep, (l, m) in enumerate(res["ws"]):
        bad = np.nonzero((l != t[0]) | (m != t[1]))[0]
        print(split, "rep", rep, "diff rows", bad.size, "pos%128", np.bincount(bad % 128, minlength=128).nonzero()[0][:40],
              "tiles", (bad // 128)[:10], "ws-tile dist", (m[bad] - t[1][bad])[:6], "labs", l[bad][:6], t[0][bad][:6])
    tt = res["tile"]
    print(split, "tile run-to-run same", all((a[0] == tt[0][0]).all() and (a[1] == tt[0][1]).all() for a in tt))
