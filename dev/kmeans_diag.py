"""Diagnostics of GPU fits by init and precision on blobs (inertia, iterations)."""
import cupy as cp
import numpy as np
from sklearn.datasets import make_blobs

from tsm_apps.kmeans import TSMKMeans
import tsm_core

X, y = make_blobs(30000, 16, centers=40, cluster_std=1.0, center_box=(-50, 50), random_state=2)
X = X.astype(np.float32)
for init in ("k-means++", "k-means||"):
    for prec in ("float32", "tf32", "float64"):
        Xi = X.astype(np.float64) if prec == "float64" else X
        g = TSMKMeans(40, init=init, random_state=0, max_iter=50, precision=prec).fit(cp.asarray(Xi))
        print(init, prec, g.inertia_, g.n_iter_, flush=True)
c = TSMKMeans(40, init="k-means++", random_state=0, max_iter=50, device="cpu").fit(X)
print("cpu k-means++", c.inertia_, c.n_iter_)
# one assignment: float32 precision labels vs float64 from the same centres
rng = np.random.default_rng(11)
centers = rng.standard_normal((300, 24)) * 4
X2 = (centers[rng.integers(0, 300, 60000)] + rng.standard_normal((60000, 24))).astype(np.float32)
C0 = X2[:300].copy()
for prec in ("float32", "tf32", "float64"):
    Xi = X2.astype(np.float64) if prec == "float64" else X2
    for it in (1, 2, 15):
        lab, inertia, C, n_it = tsm_core.kmeans_lloyd(Xi, C0.astype(Xi.dtype), max_iter=it, precision=prec)
        print(prec, it, inertia, n_it, flush=True)
lab, inertia, C, n_it = tsm_core.kmeans_lloyd(X2, C0, max_iter=15, precision="float32", method="tile")
print("float32 simt", 15, inertia, n_it)
