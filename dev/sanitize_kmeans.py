"""One small, awkward call of each k-means kernel added with the precision modes, for
compute-sanitizer (CuPy's memory pool off, so every array is its own allocation):

    compute-sanitizer --tool memcheck --error-exitcode 2 python dev/sanitize_kmeans.py
    compute-sanitizer --tool racecheck --error-exitcode 2 python dev/sanitize_kmeans.py

Tensor-core assignment in each precision (one centre tile, split centre groups, the
margin rule's pair and full decisions, the TF32 screen of "float32"), the centroid sums (counting and radix sorts,
direct route, 16-bit rows) and k-means|| with its one-block recluster. Exit 1 on a
wrong result.
"""
import os
import sys

os.environ.setdefault("TSM_KMEANS_WGMMA", "1")  # the warpgroup kernel wherever it applies
import cupy as cp
import numpy as np

cp.cuda.set_allocator(None)
cp.cuda.set_pinned_memory_allocator(None)

import tsm_core  # noqa: E402
from tsm_core.kmeans.update import _Sums  # noqa: E402

bad = 0
rng = np.random.default_rng(0)


def report(name, ok):
    global bad
    print(f"{'ok  ' if ok else 'FAIL'} {name}", flush=True)
    bad += not ok


def assign_cases(cases, long, name):
    """Each precision's tensor-core assignment of each (n, d, k) case, TSM_KMEANS_LONG
    set to `long`; "float32" labels checked against float64."""
    os.environ["TSM_KMEANS_LONG"] = long
    for n, d, k in cases:
        X = rng.standard_normal((n, d)).astype(np.float32)
        C = X[rng.integers(0, n, k)] + 1e-3 * rng.standard_normal((k, d)).astype(np.float32)
        D = ((X.astype(np.float64)[:, None] - C.astype(np.float64)[None]) ** 2).sum(-1)
        for prec in ("float32", "tf32", "bfloat16", "float16"):
            lab, md = tsm_core.kmeans_assign(cp.asarray(X), cp.asarray(C), precision=prec, method="mma")
            lab = cp.asnumpy(lab)
            ok = ((lab >= 0) & (lab < k)).all()
            if prec == "float32":
                ok &= (D[np.arange(n), lab] - D.min(1) <= 1e-12 * (D.max() + 1)).all()
            report(f"{name} {prec} {n}x{d}x{k}", bool(ok))
    del os.environ["TSM_KMEANS_LONG"]


# the fused kernels, then the long-row route
assign_cases(((1, 1, 1), (131, 33, 7), (257, 300, 129), (129, 1030, 300)), "0", "mma")
assign_cases(((1, 129, 1), (257, 300, 129), (129, 1030, 300), (7, 4096, 3), (33, 258, 5)), "1", "long rows")

for n, d, k, xd in ((257, 33, 7, "float32"), (1000, 64, 5000, "float32"), (300, 17, 3, "bfloat16"),
                    (301, 40, 2000, "float16"), (9001, 5, 3, "float32"), (5000, 31, 2, "bfloat16")):
    X = rng.standard_normal((n, d)).astype(np.float32)
    lab = rng.integers(0, k, n).astype(np.int32)
    lab[: n // 2] = 0  # a skewed cluster
    if xd == "bfloat16":
        u = X.view(np.uint32)
        Xh = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
        Xr = (Xh.astype(np.uint32) << 16).view(np.float32)
    elif xd == "float16":
        Xh = X.astype(np.float16)
        Xr = Xh.astype(np.float32)
    else:
        Xh = Xr = X
    sums = cp.empty((k, d), dtype=cp.float64)
    wsum = cp.empty(k, dtype=cp.float64)
    _Sums(n, d, k, xd).run(cp.asarray(Xh), cp.asarray(lab), None, sums, wsum)
    ref = np.zeros((k, d))
    np.add.at(ref, lab, Xr.astype(np.float64))
    # the direct route accumulates in float32 per warp (float64 across warps)
    scale = np.zeros((k, d))
    np.add.at(scale, lab, np.abs(Xr.astype(np.float64)))
    ok = np.abs(cp.asnumpy(sums) - ref) <= 1e-5 * scale + 1e-12
    report(f"sums {xd} {n}x{d} k={k}", bool(ok.all()))

# the warpgroup-MMA kernel (k >= one centre tile, rows <= 128 words), the margin rule's
# full decision (every centre nearly equidistant) and a short fit (exact distances)
for n, d, k, tie in ((300, 40, 1500, False), (77, 128, 1100, False), (130, 9, 1030, False),
                     (200, 24, 600, True)):
    X = rng.standard_normal((n, d)).astype(np.float32)
    if tie:
        C = np.repeat(X[:1], k, 0) + 1e-6 * rng.standard_normal((k, d)).astype(np.float32)
    else:
        C = X[rng.integers(0, n, k)] + 1e-3 * rng.standard_normal((k, d)).astype(np.float32)
    D = ((X.astype(np.float64)[:, None] - C.astype(np.float64)[None]) ** 2).sum(-1)
    for prec in ("float32", "tf32"):
        lab, md = tsm_core.kmeans_assign(cp.asarray(X), cp.asarray(C), precision=prec)
        lab = cp.asnumpy(lab)
        ok = ((lab >= 0) & (lab < k)).all()
        if prec == "float32":
            ok &= (D[np.arange(n), lab] - D.min(1) <= 1e-6 * (D.min(1) + 1)).all()
        report(f"auto {prec} {n}x{d}x{k} tie={tie}", bool(ok))
# "float32" as a TF32 screen: the listed rows gathered and assigned again (two batches)
os.environ["TSM_KMEANS_SCREEN"] = "1"
for n, d, k in ((300, 40, 1500), (20011, 24, 1030)):
    X = rng.standard_normal((n, d)).astype(np.float32)
    C = np.repeat(X[:1], k, 0) + 1e-4 * rng.standard_normal((k, d)).astype(np.float32)
    C[k // 2:] = X[rng.integers(0, n, k - k // 2)]
    D = ((X.astype(np.float64)[:, None] - C.astype(np.float64)[None]) ** 2).sum(-1)
    lab, md = tsm_core.kmeans_assign(cp.asarray(X), cp.asarray(C), precision="float32")
    lab = cp.asnumpy(lab)
    ok = ((lab >= 0) & (lab < k)).all() and (D[np.arange(n), lab] - D.min(1) <= 1e-6 * (D.min(1) + 1)).all()
    report(f"screen float32 {n}x{d}x{k}", bool(ok))
os.environ.pop("TSM_KMEANS_SCREEN")
X = rng.standard_normal((2003, 19)).astype(np.float32)
res = tsm_core.kmeans_lloyd(cp.asarray(X), cp.asarray(X[:37]), max_iter=3)
lab, inertia, Cf, it = res
report("lloyd 2003x19 k=37", bool(np.isfinite(float(inertia)) and int(cp.asarray(lab).max()) < 37))

# The packed route (assignment and sums in one pass): awkward sizes, each storage type,
# the float64 re-decision of near ties ("float32"), weights, a fit with relocation.
for n, d, k in ((1, 1, 1), (1031, 33, 5), (2051, 7, 16), (1025, 128, 32)):
    X = rng.standard_normal((n, d)).astype(np.float32)
    C = X[rng.integers(0, n, k)] + 1e-6 * rng.standard_normal((k, d)).astype(np.float32)
    for prec in ("float32", "tf32", "bfloat16", "float16"):
        if prec in ("bfloat16", "float16") and k > 16:
            continue
        os.environ["TSM_KMEANS_PACKED"] = "1"
        lab, md = tsm_core.kmeans_assign(cp.asarray(X), cp.asarray(C), precision=prec, method="packed")
        lab = cp.asnumpy(lab)
        report(f"packed {prec} {n}x{d}x{k}", bool(((lab >= 0) & (lab < k)).all()))
w = cp.asarray(rng.uniform(0.5, 2, 4099).astype(np.float32))
X = rng.standard_normal((4099, 24)).astype(np.float32)
for prec in ("float32", "bfloat16"):
    lab, inertia, Cf, it = tsm_core.kmeans_lloyd(cp.asarray(X), np.repeat(X[:3], 3, axis=0), sample_weight=w,
                                                 max_iter=4, precision=prec)
    report(f"packed lloyd {prec} 4099x24 k=9 (relocation)", bool(np.isfinite(float(inertia))))
os.environ.pop("TSM_KMEANS_PACKED")

X = rng.standard_normal((3001, 12)).astype(np.float32)
C, idx = tsm_core.kmeans_parallel(cp.asarray(X), 64, random_state=np.random.RandomState(0))
report("k-means|| 3001x12 k=64", bool(len(set(idx.tolist())) == 64))
os.environ["TSM_KMEANS_INIT_TF32"] = "1"  # the rounds' distances on the TF32 tensor cores
X = rng.standard_normal((5003, 40)).astype(np.float32)
C, idx = tsm_core.kmeans_parallel(cp.asarray(X), 300, random_state=np.random.RandomState(1))
report("k-means|| tf32 5003x40 k=300", bool(len(set(idx.tolist())) == 300))
os.environ.pop("TSM_KMEANS_INIT_TF32")
sys.exit(1 if bad else 0)
