"""What the k-means assignment probes share: the data of one case and the shapes
from the command line (n,d,k arguments, e.g. 4e6,128,1024)."""
import sys

import cupy as cp
import numpy as np


def assignment_case(n, d, k):
    """Uniform float32 rows X (n, d), centres C drawn from them (k rows), and the
    assignment's outputs: labels, mind, the changed flag."""
    X = cp.random.default_rng(0).random((n, d), dtype=cp.float32)
    C = X[cp.asarray(np.random.default_rng(0).choice(n, k, replace=False))].copy()
    return (X, C, cp.empty(n, dtype=cp.int32), cp.empty(n, dtype=cp.float32), cp.zeros(1, dtype=cp.int32))


def shapes(default):
    """The (n, d, k) shapes named on the command line, else `default`."""
    return [tuple(int(float(v)) for v in a.split(",")) for a in sys.argv[1:]] or default


def lloyd_step_centres(X, C):
    """C moved one Lloyd step on X (TF32 labels on the fused route; an empty cluster
    keeps its centre): centres as a fit's later iterations see them."""
    import os

    import cupyx

    from tsm_core.kmeans.tensor import TensorAssign

    n, d = X.shape
    k = C.shape[0]
    old = os.environ.get("TSM_KMEANS_LONG")
    os.environ["TSM_KMEANS_LONG"] = "0"
    t = TensorAssign(n, d, k, "tf32")
    if old is None:
        del os.environ["TSM_KMEANS_LONG"]
    else:
        os.environ["TSM_KMEANS_LONG"] = old
    lab = cp.empty(n, dtype=cp.int32)
    t.prepare(C)
    t.run(X, lab, cp.empty(n, dtype=cp.float32), cp.zeros(1, dtype=cp.int32), None)
    S = cp.zeros((k, d), cp.float32)
    cupyx.scatter_add(S, lab, X)
    cnt = cp.bincount(lab, minlength=k).astype(cp.float32)
    return cp.where(cnt[:, None] > 0, S / cp.maximum(cnt, 1)[:, None], C).astype(cp.float32)
