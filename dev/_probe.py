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
