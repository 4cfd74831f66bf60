"""Benchmark of TSMKMeans's Lloyd iteration against its targets, one seeded command.

    python -m tsm_apps.kmeans.bench --out DIR [--quick] [--sweep]

Writes DIR/kmeans.json and DIR/kmeans.png and prints a table last. Measured in one
run, with the same data (uniform [0, 1) float32, as ``torch.rand``), the same
initial centres (k distinct rows of X) and the same iteration count:

- ours: ``tsm_core.kmeans_lloyd(X, C0, max_iter=it, tol=0)`` (default routes) bracketed by CUDA
  events; per iteration = time / n_iter (the final assignment pass, the per-iteration
  convergence check and its host round trip included), and the marginal cost of
  an iteration, (T(it2) - T(it1)) / (it2 - it1); then each assignment route and each
  centroid-update route forced, and one pass of each alone ("assign_ms" includes the
  ||x||^2 pass that a fit does once, for the tile and cuBLAS routes).
- torch + cuBLAS: the reference Lloyd iteration in torch (``lloyd_torch``)
  (distances by GEMM, argmin, index_add, bincount), TF32 off, CUDA events, same it.
- scikit-learn KMeans (lloyd, all CPU cores) at (100000, 256, 64): fit time / n_iter_
  from the same C0, max_iter fixed, tol=0.
- streamed: X in host memory (32 GB, or 4 GB with --quick), GPU budget 4 GB (0.5 GB
  with --quick); a streamed fit's time per pass over X against the time of the
  host-to-device copies of X alone (same chunks, same pinned source).
- fast-pytorch-kmeans: timed only if importable, else recorded as not available.

    python -m tsm_apps.kmeans.bench --cpu-vs-sklearn [--out DIR] [--repeat R] [--quick]

needs no GPU: full ``fit()`` of ``TSMKMeans(device="cpu")`` against
``sklearn.cluster.KMeans(algorithm="lloyd")`` with the same parameters (k-means++,
n_init "auto" and 1, one case with init="random" and its 10 runs, max_iter=300,
tol=1e-4, the same random_state) on the same seeded Gaussian blobs, float32 and
float64, the two fits alternated R times (medians, the median of the pairs' ratios,
the ratio of the fastest fits and of process CPU times; every time kept), and one fit of
ours on the numpy engine (``TSM_KMEANS_CPU=numpy``) for its time and its distance
from the default engine's result. Writes DIR/cpu_sklearn.json and .png (command,
date, git commit, threads and BLAS recorded).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

import numpy as np

from tsm_apps._cli import gpu_or_exit_status

SHAPES = ((100_000, 4096, 16), (1_000_000, 256, 64), (1_000_000, 64, 1024))
SKLEARN_SHAPE = (100_000, 256, 64)
TARGETS = {(100_000, 4096, 16): 3.0, (1_000_000, 256, 64): 2.0, (1_000_000, 64, 1024): 1.0}


def lloyd_torch(X, C, iters):
    """The reference Lloyd iteration in torch + cuBLAS: distances by one GEMM, argmin,
    index_add_ and bincount (kept exactly as the baseline figures were measured)."""
    import torch

    xx = (X * X).sum(1, keepdim=True)
    for _ in range(iters):
        d = xx - 2 * (X @ C.T) + (C * C).sum(1)
        lab = d.argmin(1)
        S = torch.zeros_like(C).index_add_(0, lab, X)
        cnt = torch.bincount(lab, minlength=C.shape[0]).clamp_min(1).unsqueeze(1)
        C = S / cnt
    return C


def _events_ms(fn, warm=1, rep=3):
    """(median ms over `rep` runs of fn() between two CUDA events, fn's last result):
    ``tsm_core.runtime.timing.call_ms``, whose events bracket the host's work too,
    as a fit's per-iteration host round trip belongs to its time."""
    from tsm_core.runtime import timing

    out = [None]

    def call():
        out[0] = fn()

    ms = timing.call_ms(call, warm=warm, rep=rep)
    return ms, out[0]


def bench_shape(n, d, k, it, seed, sweep=False):
    import cupy as cp
    import torch

    import tsm_core

    torch.backends.cuda.matmul.allow_tf32 = False
    X = cp.random.default_rng(seed).random((n, d), dtype=cp.float32)  # uniform [0, 1)
    idx = np.random.default_rng(seed).choice(n, k, replace=False)
    C0 = X[cp.asarray(idx)].copy()
    row = dict(n=n, d=d, k=k, iters=it)
    ms, res = _events_ms(lambda: tsm_core.kmeans_lloyd(X, C0, max_iter=it, tol=0.0))
    row["ours_fit_ms"] = ms
    row["ours_n_iter"] = res[3]
    row["ours_ms_per_iter"] = ms / res[3]
    it2 = 2 * it
    ms2, res2 = _events_ms(lambda: tsm_core.kmeans_lloyd(X, C0, max_iter=it2, tol=0.0), warm=0)
    if res2[3] > res[3]:
        row["ours_ms_per_iter_marginal"] = (ms2 - ms) / (res2[3] - res[3])
    # One pass of each kernel group (assignment, centroid update), for the breakdown,
    # and the fit with each centroid-update route forced (TSM_KMEANS_UPDATE).
    from tsm_core.runtime.timing import time_fn

    labels, _ = tsm_core.kmeans_assign(X, C0)
    row["assign_ms"] = time_fn(lambda: tsm_core.kmeans_assign(X, C0), reps=10).median_s * 1e3
    for route in ("direct", "sorted"):
        os.environ["TSM_KMEANS_UPDATE"] = route
        try:
            row[f"update_ms_{route}"] = time_fn(
                lambda: tsm_core.kmeans_centroid_sums(X, labels, k, check_labels=False), reps=10).median_s * 1e3
            msr, resr = _events_ms(lambda: tsm_core.kmeans_lloyd(X, C0, max_iter=it, tol=0.0), warm=1, rep=1)
            row[f"ours_ms_per_iter_{route}"] = msr / resr[3]
        except ValueError as exc:  # k too large for the direct route
            row[f"update_ms_{route}"] = repr(exc)[:100]
        finally:
            del os.environ["TSM_KMEANS_UPDATE"]
    row["update_ms"] = min(v for key, v in row.items() if key.startswith("update_ms_") and isinstance(v, float))
    if k > 32:  # the assignment routes for k > 32: tiled SIMT GEMM + argmin, or cuBLAS + argmin
        for m in ("tile", "gemm"):
            row[f"assign_ms_{m}"] = time_fn(lambda: tsm_core.kmeans_assign(X, C0, method=m), reps=10).median_s * 1e3
            msm, resm = _events_ms(lambda: tsm_core.kmeans_lloyd(X, C0, max_iter=it, tol=0.0, method=m),
                                   warm=1, rep=1)
            row[f"ours_ms_per_iter_{m}"] = msm / resm[3]
    row["x_read_ms_at_3TBps"] = X.nbytes / 3.0e12 * 1e3
    if sweep and k <= 32:
        sw = {}
        for cfg in ("8,4,2", "4,4,2", "8,2,2", "16,4,2", "8,4,1", "4,4,4", "8,2,4"):
            os.environ["TSM_KMEANS_FUSED"] = cfg
            try:
                sw[cfg] = time_fn(lambda: tsm_core.kmeans_assign(X, C0, method="fused"), reps=10).median_s * 1e3
            except Exception as exc:  # a configuration that does not fit (shared memory, registers)
                sw[cfg] = repr(exc)[:120]
            finally:
                del os.environ["TSM_KMEANS_FUSED"]
        gm = time_fn(lambda: tsm_core.kmeans_assign(X, C0, method="gemm"), reps=10).median_s * 1e3
        sw["gemm"] = gm
        row["assign_sweep_ms"] = sw
    # torch + cuBLAS on the same memory (DLPack view), the same C0 and iterations.
    Xt = torch.from_dlpack(X)
    Ct = torch.from_dlpack(C0).clone()
    ms_t, _ = _events_ms(lambda: lloyd_torch(Xt, Ct, it))
    row["torch_ms_per_iter"] = ms_t / it
    row["speedup_vs_torch"] = row["torch_ms_per_iter"] / row["ours_ms_per_iter"]
    row["target_speedup"] = TARGETS.get((n, d, k))
    if row["target_speedup"] is not None:
        row["meets_target"] = bool(row["speedup_vs_torch"] >= row["target_speedup"])
    return row


def bench_sklearn(seed, it):
    import cupy as cp
    from sklearn.cluster import KMeans

    import tsm_core

    n, d, k = SKLEARN_SHAPE
    Xh = np.random.default_rng(seed).random((n, d), dtype=np.float32)
    C0 = Xh[np.random.default_rng(seed).choice(n, k, replace=False)].copy()
    t = time.perf_counter()
    km = KMeans(k, init=C0, n_init=1, max_iter=it, tol=0, algorithm="lloyd").fit(Xh)
    el = time.perf_counter() - t
    X = cp.asarray(Xh)
    ms, res = _events_ms(lambda: tsm_core.kmeans_lloyd(X, cp.asarray(C0), max_iter=it, tol=0.0))
    row = dict(n=n, d=d, k=k, iters=it, sklearn_ms_per_iter=1e3 * el / km.n_iter_, sklearn_n_iter=int(km.n_iter_),
               cpu_threads=os.cpu_count(), ours_ms_per_iter=ms / res[3], ours_n_iter=res[3],
               sklearn_inertia=float(km.inertia_), ours_inertia=float(res[1]))
    row["speedup_vs_sklearn"] = row["sklearn_ms_per_iter"] / row["ours_ms_per_iter"]
    row["meets_target"] = bool(row["speedup_vs_sklearn"] >= 25.0)
    return row


def bench_streamed(quick, seed, it):
    import cupy as cp

    import tsm_core
    from tsm_datasets import synthetic

    d, k = 256, 64
    nbytes = 4e9 if quick else 32e9
    budget = int(0.5e9 if quick else 4e9)
    n = int(nbytes // (d * 4))
    t = time.perf_counter()
    Xh = synthetic.uniform(n, d, seed=seed, dtype=np.float32)
    gen_s = time.perf_counter() - t
    C0 = Xh[np.random.default_rng(seed).choice(n, k, replace=False)].copy()
    row = dict(n=n, d=d, k=k, x_bytes=Xh.nbytes, budget_bytes=budget, iters=it, quick=quick, gen_s=gen_s)
    t = time.perf_counter()
    with tsm_core.kmeans_source(Xh, max_gpu_memory=budget, n_clusters=k) as src:
        row["register_s"] = time.perf_counter() - t
        row["chunks"] = len(src.starts)
        row["chunk_bytes"] = src.max_rows * d * 4
        row["pinned_in_place"] = bool(src.registered)

        def copy_only():
            for _ in src.chunks():
                pass
            return None

        ms_copy, _ = _events_ms(copy_only, warm=1, rep=3)
        row["h2d_ms_per_pass"] = ms_copy
        row["h2d_GBps"] = Xh.nbytes / ms_copy / 1e6
        ms_fit, res = _events_ms(lambda: tsm_core.kmeans_lloyd(src, C0, max_iter=it, tol=0.0), warm=0, rep=1)
        passes = res[3] + 1  # the final assignment is one more pass over X
        row["fit_ms"] = ms_fit
        row["n_iter"] = res[3]
        row["ms_per_pass"] = ms_fit / passes
        row["ratio_to_copy"] = row["ms_per_pass"] / ms_copy
        row["meets_target"] = bool(row["ratio_to_copy"] <= 1.4)
    cp.get_default_memory_pool().free_all_blocks()
    if not quick:
        row["note"] = "host RAM 128 GiB: X (32 GB) lives in host memory, page-locked in place for the DMA"
    return row


def bench_fast_pytorch_kmeans(it):
    try:
        from fast_pytorch_kmeans import KMeans as FKM  # noqa: F401
    except Exception as exc:
        return dict(available=False, reason=f"not importable: {exc!r}"[:200])
    import torch

    rows = []
    for n, d, k in SHAPES[:2]:
        X = torch.rand(n, d, device="cuda")
        km = FKM(n_clusters=k, max_iter=it, tol=-1, mode="euclidean", verbose=0)
        km.fit_predict(X)
        torch.cuda.synchronize()
        t = time.perf_counter()
        km.fit_predict(X)
        torch.cuda.synchronize()
        rows.append(dict(n=n, d=d, k=k, ms_per_iter=1e3 * (time.perf_counter() - t) / it))
        del X
    return dict(available=True, rows=rows)


PRECISION_SHAPES = ((100_000, 4096, 16), (1_000_000, 256, 64), (1_000_000, 64, 1024), (4_000_000, 128, 1024),
                    (10_000_000, 32, 8), (10_000_000, 32, 256), (1_000_000, 128, 8192), (100_000, 4096, 1024),
                    (2_000_000, 512, 256), (500_000, 1024, 64), (3_000_000, 96, 2048), (100_000, 2048, 4096))


MODES = ("float32", "tf32", "bfloat16", "float16", "simt")


def _label_agreement(Xp, X, C, prec, kw):
    """The share of rows whose label under `prec` (an assignment of the mode's final
    centres C in that mode) differs from a float64 evaluation of the same centres, and
    for those rows the float64 distance gap between the two centres in units of
    float32's eps of ||x||^2 + ||c||^2: a gap of a few units is a tie float32 itself
    cannot resolve. Rows in chunks of at most 2^24 elements of X."""
    import cupy as cp

    import tsm_core

    n, d = X.shape
    C64 = C.astype(cp.float64)
    cn = (C64 * C64).sum(1)
    step = max(1, (1 << 24) // max(d, 1))
    differ, worst = 0, 0.0
    for a in range(0, n, step):
        b = min(n, a + step)
        mine = tsm_core.kmeans_assign(Xp[a:b], C, **kw)[0]
        x64 = X[a:b].astype(cp.float64)
        ref = tsm_core.kmeans_assign(x64, C64, precision="float64")[0]
        idx = cp.nonzero(mine != ref)[0]
        differ += int(idx.size)
        if idx.size:
            xi = x64[idx]
            da = ((xi - C64[mine[idx]]) ** 2).sum(1)
            db = ((xi - C64[ref[idx]]) ** 2).sum(1)
            scale = (xi * xi).sum(1) + cp.maximum(cn[mine[idx]], cn[ref[idx]])
            worst = max(worst, float(((da - db) / scale).max()) / 2.0 ** -23)
    return {f"{prec}_label_diff_share": differ / n, f"{prec}_label_diff_gap_eps32": worst}


def marginal_ms(ms_it: float, n_it: int, ms_2it: float, n_2it: int):
    """ms per Lloyd iteration from two fits of different lengths: (t2 - t1) / (n2 - n1),
    which leaves out what a fit pays once (setup, conversions, the final assignment
    and exact distances); None where the longer fit ran no more iterations.

    >>> marginal_ms(30.0, 5, 50.0, 10)
    4.0
    >>> marginal_ms(30.0, 5, 31.0, 5) is None
    True
    """
    return (ms_2it - ms_it) / (n_2it - n_it) if n_2it > n_it else None


# The pipe each mode multiplies on and its products per element and centre, and the
# bytes of X an element a pass reads: for the floor (flash-kmeans's fp32 run
# multiplies in TF32). "float32" is three bfloat16 products (the default split).
FLOOR_PIPES = {"float32": ("bfloat16", 3), "tf32": ("tf32", 1), "bfloat16": ("bfloat16", 1),
               "float16": ("float16", 1), "simt": ("fp32", 1), "flash_float32": ("tf32", 1),
               "flash_float16": ("float16", 1)}
X_BYTES = {"float32": 4, "tf32": 4, "bfloat16": 2, "float16": 2, "simt": 4, "flash_float32": 4,
           "flash_float16": 2}
FLOOR_WITHIN = 1.3  # the target: every mode within this many times its floor


def measure_rates(size: int = 8192, seed: int = 0) -> dict:
    """The rates the floors use, measured on this GPU: the read bandwidth
    (``runtime.timing.read_bandwidth``, bytes/s) and cuBLAS's dense rate (torch,
    size^3 products, 2 size^3 / median seconds) in TF32, bfloat16, float16 and float32
    with TF32 off (the FMA pipe)."""
    import torch

    from tsm_core.runtime import timing

    rates = {"read_bw": timing.read_bandwidth(seed=seed)["read_bw"]}
    g = torch.Generator(device="cuda").manual_seed(seed)
    old = torch.backends.cuda.matmul.allow_tf32
    try:
        for name, dt, tf32 in (("tf32", torch.float32, True), ("bfloat16", torch.bfloat16, False),
                               ("float16", torch.float16, False), ("fp32", torch.float32, False)):
            torch.backends.cuda.matmul.allow_tf32 = tf32
            A = torch.randn(size, size, device="cuda", generator=g).to(dt)
            B = torch.randn(size, size, device="cuda", generator=g).to(dt)
            Cm = torch.empty(size, size, device="cuda", dtype=dt)
            t = timing.event_median(lambda: torch.mm(A, B, out=Cm), warmup=3, reps=7)
            rates[name] = 2.0 * size ** 3 / t
            del A, B, Cm
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old
        torch.cuda.empty_cache()
    return rates


def floors(row: dict, rates: dict) -> dict:
    """Each mode's floor at one shape of the sweep: the larger of X's bytes at the read
    bandwidth and its products (2 n k d each) at its pipe's rate, in ms, and its
    measured ms per iteration (marginal where the row has it) over that floor.

    >>> r = {"n": 1000, "d": 10, "k": 100, "tf32_ms_per_iter": 0.004}
    >>> f = floors(r, {"read_bw": 4e12, "tf32": 2e14, "bfloat16": 4e14, "float16": 4e14, "fp32": 5e13})
    >>> round(f["tf32_floor_ms"], 6), round(f["tf32_floor_ratio"], 2)
    (1e-05, 400.0)
    """
    n, d, k = row["n"], row["d"], row["k"]
    out = {}
    for mode, (pipe, mult) in FLOOR_PIPES.items():
        floor = max(n * d * X_BYTES[mode] / rates["read_bw"], mult * 2.0 * n * k * d / rates[pipe]) * 1e3
        out[f"{mode}_floor_ms"] = floor
        t = row.get(f"{mode}_ms_per_iter_marginal", row.get(f"{mode}_ms_per_iter"))
        if isinstance(t, float):
            out[f"{mode}_floor_ratio"] = t / floor
    return out


def bench_precision(shapes, it, seed, marginal=False, rates=None):
    """Per Lloyd iteration (tol off, `it` iterations, same X and initial centres):
    ``kmeans_lloyd`` in each precision against flash-kmeans's ``batch_kmeans_Euclid``
    (float32 and float16 X, warmed up first: its first call at a shape compiles), and
    the exact SIMT routes of float32 ("simt"). "float16" is given X in float16 (made
    once, outside the timing, as flash-kmeans's float16 run is); "bfloat16" converts
    float32 X in each fit. Also each mode's inertia relative to a float64 run from the
    same start, and the share of its labels that differ from a float64 evaluation of
    its final centres (`_label_agreement`). `marginal`: also fits of 2 `it` iterations,
    for ms per iteration without what a fit pays once (`marginal_ms`), both sides alike."""
    import cupy as cp
    import torch

    import tsm_core
    try:
        from flash_kmeans import batch_kmeans_Euclid
    except Exception as e:  # noqa: BLE001 - any import failure means "not available"
        batch_kmeans_Euclid = None
        flash_err = repr(e)[:200]
    rows = []
    for n, d, k in shapes:
        X = cp.random.default_rng(seed).random((n, d), dtype=cp.float32)
        C0 = X[cp.asarray(np.random.default_rng(seed).choice(n, k, replace=False))].copy()
        r = dict(n=n, d=d, k=k, iters=it, x_read_ms_at_3TBps=n * d * 4 / 3e9)
        for prec in MODES:
            kw = dict(precision="float32", method="fused" if k <= 32 and d >= 512 else "tile") if prec == "simt" \
                else dict(precision=prec)
            Xp = X.astype(cp.float16) if prec == "float16" else X
            try:
                ms, out = _events_ms(lambda kw=kw, Xp=Xp: tsm_core.kmeans_lloyd(Xp, C0, max_iter=it, tol=0.0, **kw),
                                     warm=1, rep=3)
                r[f"{prec}_ms_per_iter"] = ms / out[3]
                r[f"{prec}_inertia"] = out[1]
                if marginal:
                    ms2, out2 = _events_ms(lambda kw=kw, Xp=Xp: tsm_core.kmeans_lloyd(
                        Xp, C0, max_iter=2 * it, tol=0.0, **kw), warm=0, rep=3)
                    r[f"{prec}_ms_per_iter_marginal"] = marginal_ms(ms, out[3], ms2, out2[3])
                r.update(_label_agreement(Xp, X, out[2], prec, kw))
            except Exception as e:  # noqa: BLE001 - recorded, not hidden
                r[f"{prec}_ms_per_iter"] = repr(e)[:200]
            del Xp
            cp.get_default_memory_pool().free_all_blocks()
        if n * d * 8 <= 8 << 30:
            X64 = X.astype(cp.float64)
            r["float64_inertia"] = tsm_core.kmeans_lloyd(X64, C0.astype(cp.float64), max_iter=it, tol=0.0)[1]
            del X64
            for prec in MODES:
                if isinstance(r.get(f"{prec}_inertia"), float):
                    r[f"{prec}_inertia_rel"] = r[f"{prec}_inertia"] / r["float64_inertia"] - 1
        if batch_kmeans_Euclid is not None:
            Xt = torch.as_tensor(X, device="cuda")[None]
            Ct = torch.as_tensor(C0, device="cuda")[None]
            for name, dt in (("flash_float32", torch.float32), ("flash_float16", torch.float16)):
                Xd, Cd = Xt.to(dt), Ct.to(dt)
                try:
                    batch_kmeans_Euclid(Xd, k, max_iters=2, tol=0.0, init_centroids=Cd.clone())  # compile
                    ms, _ = _events_ms(lambda Xd=Xd, Cd=Cd: batch_kmeans_Euclid(
                        Xd, k, max_iters=it, tol=0.0, init_centroids=Cd.clone()), warm=1, rep=3)
                    r[f"{name}_ms_per_iter"] = ms / it
                    if marginal:
                        ms2, _ = _events_ms(lambda Xd=Xd, Cd=Cd: batch_kmeans_Euclid(
                            Xd, k, max_iters=2 * it, tol=0.0, init_centroids=Cd.clone()), warm=0, rep=3)
                        r[f"{name}_ms_per_iter_marginal"] = marginal_ms(ms, it, ms2, 2 * it)
                except Exception as e:  # noqa: BLE001
                    r[f"{name}_ms_per_iter"] = repr(e)[:200]
                del Xd, Cd
            del Xt, Ct
            torch.cuda.empty_cache()
        else:
            r["flash"] = "not available: " + flash_err
        del X
        cp.get_default_memory_pool().free_all_blocks()
        if rates is not None:
            r.update(floors(r, rates))
        print(json.dumps(r), flush=True)
        rows.append(r)
    return rows


FIT_SHAPE = (4_000_000, 128, 1024)
FIT_PRECISIONS = ("float32", "tf32", "bfloat16")


def _fit_seconds(fn, rep):
    """(median wall seconds of fn() over `rep` calls after one warm-up, the device
    synchronised after each, fn's last result): a whole fit as its caller waits for it."""
    import cupy as cp

    out, ts = None, []
    for i in range(rep + 1):
        cp.cuda.Device().synchronize()
        t0 = time.perf_counter()
        out = fn()
        cp.cuda.Device().synchronize()
        if i:
            ts.append(time.perf_counter() - t0)
    return float(np.median(ts)), out


def bench_fit(shape, it, seed, rep=3):
    """Whole fits, initialisation included: ``TSMKMeans(init="k-means||", n_init=1,
    max_iter=it, tol=0)`` per precision against ``flash_kmeans.FlashKMeans(niter=it,
    tol=-1).fit`` (its own random initial centres; `tol=-1` so that it runs every
    iteration), X float32 already on the GPU for both. Also k-means|| alone
    (``tsm_core.kmeans_parallel``) against `it` Lloyd iterations of the default precision
    from the same centres, and each fit's inertia (its centres evaluated alike: float32
    labels and distances, float64 sums)."""
    import cupy as cp
    import torch

    import tsm_core
    from tsm_apps.kmeans import TSMKMeans

    n, d, k = shape
    X = cp.random.default_rng(seed).random((n, d), dtype=cp.float32)

    def inertia(C):  # the same evaluation of every method's centres: float32 labels, float64 sum
        _, mind = tsm_core.kmeans_assign(X, cp.ascontiguousarray(cp.asarray(C, dtype=cp.float32)),
                                         precision="float32")
        return float(mind.astype(cp.float64).sum())

    r = dict(n=n, d=d, k=k, iters=it, init="k-means||", n_init=1, rep=rep)
    for prec in FIT_PRECISIONS:
        est = TSMKMeans(n_clusters=k, init="k-means||", n_init=1, max_iter=it, tol=0.0, random_state=seed,
                        precision=prec)
        s, est = _fit_seconds(lambda est=est: est.fit(X), rep)
        r[f"ours_{prec}_fit_s"] = s
        r[f"ours_{prec}_n_iter"] = int(est.n_iter_)
        r[f"ours_{prec}_inertia"] = inertia(est.cluster_centers_)
    s, (C0, _) = _fit_seconds(lambda: tsm_core.kmeans_parallel(X, k, random_state=seed), rep)
    r["init_s"] = s
    s, out = _fit_seconds(lambda: tsm_core.kmeans_lloyd(X, C0, max_iter=it, tol=0.0), rep)
    r["iter_s"] = s / out[3]
    r["init_in_iterations"] = r["init_s"] / r["iter_s"]
    try:
        from flash_kmeans import FlashKMeans
    except Exception as e:  # noqa: BLE001 - any import failure means "not available"
        r["flash"] = "not available: " + repr(e)[:200]
        FlashKMeans = None
    if FlashKMeans is not None:
        Xt = torch.as_tensor(X, device="cuda")
        try:
            FlashKMeans(d=d, k=k, niter=2, tol=-1.0, seed=seed).fit(Xt)  # its first call compiles
            s, fk = _fit_seconds(lambda: FlashKMeans(d=d, k=k, niter=it, tol=-1.0, seed=seed).fit(Xt), rep)
            r["flash_fit_s"] = s
            r["flash_inertia"] = inertia(cp.asarray(fk.centroids_b[0].float().contiguous()))
            for prec in FIT_PRECISIONS:
                r[f"ours_{prec}_speedup"] = s / r[f"ours_{prec}_fit_s"]
        except Exception as e:  # noqa: BLE001 - recorded, not hidden
            r["flash"] = repr(e)[:200]
        del Xt
        torch.cuda.empty_cache()
    del X
    cp.get_default_memory_pool().free_all_blocks()
    return r


def plot_precision(rows, path, device="GPU"):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r['n']:.0e}\n{r['d']}\n{r['k']}" for r in rows]
    keys = [("float32", "ours float32"), ("tf32", "ours tf32"), ("bfloat16", "ours bfloat16"),
            ("float16", "ours float16 (X in float16)"), ("simt", "ours exact SIMT"),
            ("flash_float32", "flash-kmeans fp32"), ("flash_float16", "flash-kmeans fp16")]
    # The marginal figures (a fit's one-off costs left out, both sides alike) where the
    # run has them.
    suffix = "_ms_per_iter_marginal" if any(isinstance(r.get("float32_ms_per_iter_marginal"), float)
                                            for r in rows) else "_ms_per_iter"
    # A second panel, each mode's time over its floor, where the run measured the rates.
    floors = any(isinstance(r.get("float32_floor_ratio"), float) for r in rows)
    fig, axes = plt.subplots(2 if floors else 1, 1, figsize=(13, 8 if floors else 4.5), squeeze=False)
    w = 0.11
    x = np.arange(len(rows))
    for ax, what in zip(axes[:, 0], (suffix, "_floor_ratio")):
        for i, (k, name) in enumerate(keys):
            vals = [r.get(f"{k}{what}") for r in rows]
            vals = [v if isinstance(v, float) else np.nan for v in vals]
            ax.bar(x + (i - 3) * w, vals, w, label=name)
        ax.set_yscale("log")
        ax.set_xticks(x)
        ax.set_xticklabels(labels, fontsize=7)
        ax.set_xlabel("n / d / k")
    ax = axes[0, 0]
    ax.set_ylabel("ms per Lloyd iteration" + (" (marginal)" if suffix.endswith("marginal") else ""))
    ax.legend(fontsize=7, ncol=3)
    ax.set_title(f"k-means per iteration by precision, against flash-kmeans ({device})")
    if floors:
        ax = axes[1, 0]
        from matplotlib.ticker import NullFormatter, ScalarFormatter

        ax.set_ylim(0.9, None)
        ax.yaxis.set_major_formatter(ScalarFormatter())
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set_yticks([1, 1.3, 2, 3, 5, 10])
        ax.axhline(1.3, color="k", lw=0.8, ls="--")
        ax.text(len(rows) - 0.5, 1.3, " 1.3x", fontsize=7, va="bottom", ha="right")
        ax.set_ylabel("time / floor")
        ax.set_title("over each mode's floor: X read once at the measured bandwidth, or 2nkd at the "
                     "measured rate of its pipe", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot(res, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = res["shapes"]
    labels = [f"({r['n']:.0e}, {r['d']}, {r['k']})" for r in rows]
    x = np.arange(len(rows))
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.bar(x - 0.2, [r["torch_ms_per_iter"] for r in rows], 0.4, label="torch + cuBLAS")
    ax.bar(x + 0.2, [r["ours_ms_per_iter"] for r in rows], 0.4, label="TSMKMeans (tsm_core)")
    for i, r in enumerate(rows):
        ax.text(i + 0.2, r["ours_ms_per_iter"], f"{r['speedup_vs_torch']:.2f}x", ha="center", va="bottom")
    ax.set_xticks(x, labels)
    ax.set_yscale("log")
    ax.set_ylabel("ms per Lloyd iteration (fp32)")
    ax.set_xlabel("(n, d, k)")
    ax.set_title(f"k-means per iteration on {res['device']}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


CPU_CASES = ((200_000, 32, 16), (100_000, 128, 64), (1_000_000, 16, 8), (200_000, 32, 256))


def _blobs(n, d, k, dtype, seed):
    """n rows around k Gaussian centres (spread 1.5, unit noise: overlapping, so that Lloyd iterates), seeded."""
    rng = np.random.default_rng(seed)
    centres = 1.5 * rng.standard_normal((k, d))
    return (rng.standard_normal((n, d)) + centres[rng.integers(0, k, n)]).astype(dtype)


def _provenance():
    """The git commit of this checkout and whether its tree differs from it."""
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]

    def git(*args):
        try:
            r = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10)
            return r.stdout.strip() if r.returncode == 0 else None
        except (OSError, subprocess.SubprocessError):
            return None

    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain")
    return dict(git_commit=commit, git_dirty=None if commit is None else bool(status))


def bench_cpu_case(n, d, k, dtype, seed, repeat, init="k-means++", n_init="auto", with_numpy=True):
    """Full fits of TSMKMeans (device="cpu") and sklearn.cluster.KMeans (lloyd) with the
    same parameters on the same data, alternated `repeat` times; medians and spreads.
    With `with_numpy`, one more fit of ours on the numpy engine (its time, and how
    far its centres and inertia are from the default engine's)."""
    from sklearn.cluster import KMeans

    from tsm_apps.kmeans import TSMKMeans, _cpu

    X = _blobs(n, d, k, dtype, seed)
    kw = dict(n_clusters=k, init=init, n_init=n_init, max_iter=300, tol=1e-4, random_state=seed)
    ts, to, cs, co = [], [], [], []
    sk = ours = None
    for i in range(repeat):  # alternated, first one then the other: the load of a shared machine falls on both
        for who in ((0, 1) if i % 2 == 0 else (1, 0)):
            t0, c0 = time.perf_counter(), time.process_time()
            if who == 0:
                sk = KMeans(algorithm="lloyd", **kw).fit(X)
                ts.append(time.perf_counter() - t0)
                cs.append(time.process_time() - c0)
            else:
                ours = TSMKMeans(device="cpu", **kw).fit(X)
                to.append(time.perf_counter() - t0)
                co.append(time.process_time() - c0)
    r = dict(n=n, d=d, k=k, dtype=np.dtype(dtype).name, init=init, n_init=n_init, engine=_cpu.engine(n * d * k),
             repeat=repeat, ours_s=float(np.median(to)), sklearn_s=float(np.median(ts)),
             ours_s_all=[round(t, 4) for t in to], sklearn_s_all=[round(t, 4) for t in ts],
             ours_n_iter=int(ours.n_iter_), sklearn_n_iter=int(sk.n_iter_),
             ours_inertia=float(ours.inertia_), sklearn_inertia=float(sk.inertia_))
    r["speedup_vs_sklearn"] = r["sklearn_s"] / r["ours_s"]
    # Robust to slow drifts of the load: the median of the ratios of each pair of fits,
    # and the ratio of the process CPU times (all threads).
    r["speedup_pairs_median"] = float(np.median(np.array(ts) / np.array(to)))
    # The fastest fit of each: the one least disturbed by other processes.
    r["speedup_best"] = min(ts) / min(to)
    r["ours_cpu_s"], r["sklearn_cpu_s"] = float(np.median(co)), float(np.median(cs))
    r["speedup_cpu_time"] = r["sklearn_cpu_s"] / r["ours_cpu_s"]
    r["ours_ms_per_iter"] = 1e3 * r["ours_s"] / r["ours_n_iter"]
    r["sklearn_ms_per_iter"] = 1e3 * r["sklearn_s"] / r["sklearn_n_iter"]
    r["meets_target"] = r["speedup_vs_sklearn"] >= 1.0
    if with_numpy:
        from tsm_core.runtime import config

        old = config.raw("TSM_KMEANS_CPU")
        os.environ["TSM_KMEANS_CPU"] = "numpy"
        try:
            t0 = time.perf_counter()
            ref = TSMKMeans(device="cpu", **kw).fit(X)
            r["numpy_engine_s"] = time.perf_counter() - t0
        finally:
            if old is None:
                del os.environ["TSM_KMEANS_CPU"]
            else:
                os.environ["TSM_KMEANS_CPU"] = old
        r["numpy_engine_n_iter"] = int(ref.n_iter_)
        r["numpy_engine_inertia_rel_diff"] = abs(ref.inertia_ - ours.inertia_) / ref.inertia_
        r["numpy_engine_same_labels"] = bool(np.array_equal(ref.labels_, ours.labels_))
        scale = float(np.abs(ref.cluster_centers_).max())
        r["numpy_engine_centre_max_rel_diff"] = float(
            np.abs(ref.cluster_centers_.astype(np.float64) - ours.cluster_centers_).max() / scale)
    return r


def plot_cpu(res, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = res["cases"]
    labels = [f"({r['n']:.0e}, {r['d']}, {r['k']})\n{r['dtype']} {r['init']} n_init={r['n_init']}" for r in rows]
    x = np.arange(len(rows))
    fig, ax = plt.subplots(figsize=(max(8, 1.2 * len(rows)), 4.8))
    ax.bar(x - 0.2, [r["sklearn_s"] for r in rows], 0.4, label="sklearn KMeans (lloyd)")
    ax.bar(x + 0.2, [r["ours_s"] for r in rows], 0.4, label="TSMKMeans device='cpu'")
    for i, r in enumerate(rows):
        ax.text(i + 0.2, r["ours_s"], f"{r['speedup_vs_sklearn']:.2f}x", ha="center", va="bottom", fontsize=7)
    ax.set_xticks(x, labels, fontsize=6)
    ax.set_yscale("log")
    ax.set_ylabel("fit() seconds (median)")
    ax.set_title(f"k-means fit on the CPU, {res['n_threads']} threads ({res['host']})")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main_cpu(prog, argv, a) -> int:
    """``--cpu-vs-sklearn``: TSMKMeans on the CPU against scikit-learn's KMeans, full fits."""
    import sklearn
    import threadpoolctl
    from sklearn.utils._openmp_helpers import _openmp_effective_n_threads

    from tsm_apps.kmeans import _cpu

    out = a.out or os.path.join("benchmarks", "results", "cpu")
    os.makedirs(out, exist_ok=True)
    res = dict(command=" ".join([prog, *argv]), host=platform.node(), cpu_count=os.cpu_count(),
               n_threads=_openmp_effective_n_threads(), engine=_cpu.engine(), numpy=np.__version__,
               sklearn=sklearn.__version__, threadpools=[
                   {k: i.get(k) for k in ("internal_api", "version", "num_threads", "architecture")}
                   for i in threadpoolctl.threadpool_info()],
               repeat=a.repeat, seed=a.seed, date=time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
               **_provenance())
    cases = [(n, d, k, dt, "k-means++", "auto") for n, d, k in (CPU_CASES[:1] if a.quick else CPU_CASES)
             for dt in ("float32", "float64")]
    cases.append((CPU_CASES[0][0], CPU_CASES[0][1], CPU_CASES[0][2], "float32", "k-means++", 1))
    cases.append((CPU_CASES[0][0] // 4, CPU_CASES[0][1], CPU_CASES[0][2], "float32", "random", "auto"))
    res["cases"] = []
    for n, d, k, dt, init, n_init in cases:
        r = bench_cpu_case(n, d, k, dt, a.seed, a.repeat, init=init, n_init=n_init, with_numpy=not a.no_numpy)
        print(json.dumps(r), flush=True)
        res["cases"].append(r)
    res["meets_target"] = all(r["meets_target"] for r in res["cases"])
    with open(os.path.join(out, "cpu_sklearn.json"), "w") as f:
        json.dump(res, f, indent=1)
    plot_cpu(res, os.path.join(out, "cpu_sklearn.png"))
    print(f"\nTSMKMeans (device='cpu', engine {res['engine']}) against sklearn KMeans, fit() seconds, "
          f"median of {a.repeat}, {res['n_threads']} threads")
    print(f"{'(n, d, k)':>22} {'dtype':>8} {'init':>10} {'n_init':>6} {'ours':>8} {'sklearn':>8} {'speedup':>8}"
          f" {'pairs':>6} {'best':>6} {'cpu':>6} {'iters o/s':>10} {'numpy eng':>9}")
    for r in res["cases"]:
        ne = f"{r['numpy_engine_s']:9.3f}" if "numpy_engine_s" in r else f"{'-':>9}"
        print(f"{str((r['n'], r['d'], r['k'])):>22} {r['dtype']:>8} {r['init']:>10} {str(r['n_init']):>6} "
              f"{r['ours_s']:8.3f} {r['sklearn_s']:8.3f} {r['speedup_vs_sklearn']:7.2f}x "
              f"{r['speedup_pairs_median']:5.2f}x {r['speedup_best']:5.2f}x {r['speedup_cpu_time']:5.2f}x "
              f"{r['ours_n_iter']:>4}/{r['sklearn_n_iter']:<5} {ne}  {'OK' if r['meets_target'] else 'MISS'}")
    return 0


def main(command=None, argv=None) -> int:
    """The benchmark's command line; returns the exit status (2: no GPU).

    Parameters
    ----------
    command : str or None
        "kmeans" when run as ``python -m tsm_core.bench kmeans``; None when run as
        ``python -m tsm_apps.kmeans.bench`` (the command recorded in the JSON).
    argv : list of str, optional
        The options (default: ``sys.argv[1:]``).

    Returns
    -------
    int
        0, or 2 where no CUDA GPU (or no CuPy) is found.

    Examples
    --------
    >>> from tsm_apps.kmeans import bench
    >>> import tsm_core
    >>> tsm_core.has_gpu() or bench.main("kmeans", ["--out", "/nonexistent"]) == 2
    True
    """
    prog = f"python -m tsm_core.bench {command}" if command else "python -m tsm_apps.kmeans.bench"
    argv = sys.argv[1:] if argv is None else list(argv)
    p = argparse.ArgumentParser(prog=prog, description="k-means Lloyd iterations against torch + cuBLAS "
                                "and scikit-learn; writes OUT/kmeans.json and OUT/kmeans.png")
    p.add_argument("--out", default=None, help="default benchmarks/results/h100 (benchmarks/results/cpu "
                   "with --cpu-vs-sklearn)")
    p.add_argument("--quick", action="store_true", help="streamed case at 4 GB instead of 32 GB")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sweep", action="store_true", help="also time fused-kernel configurations")
    p.add_argument("--skip-streamed", action="store_true")
    p.add_argument("--precision-sweep", action="store_true",
                   help="only the precision sweep against flash-kmeans: OUT/kmeans_precision.json and .png")
    p.add_argument("--shapes", default=None,
                   help="precision sweep: comma-separated indices into its 12 shapes (default: all)")
    p.add_argument("--marginal", action="store_true",
                   help="precision sweep: also fits of twice the iterations, for ms per iteration "
                   "without a fit's one-off costs (every method alike)")
    p.add_argument("--fit-vs-flash", action="store_true",
                   help="only whole fits (k-means|| included) against flash-kmeans's FlashKMeans.fit at "
                   "(4e6, 128, 1024) or --fit-shape: OUT/kmeans_fit.json")
    p.add_argument("--fit-shape", default=None, help="--fit-vs-flash: n,d,k")
    p.add_argument("--cpu-vs-sklearn", action="store_true",
                   help="only TSMKMeans on the CPU against sklearn KMeans (full fits, no GPU needed): "
                   "OUT/cpu_sklearn.json and .png")
    p.add_argument("--repeat", type=int, default=5, help="--cpu-vs-sklearn: fits of each, alternated")
    p.add_argument("--no-numpy", action="store_true", help="--cpu-vs-sklearn: skip the numpy-engine fit")
    a = p.parse_args(argv)
    if a.cpu_vs_sklearn:
        return main_cpu(prog, argv, a)
    a.out = a.out or "benchmarks/results/h100"
    status = gpu_or_exit_status(prog)
    if status is not None:
        return status
    import cupy as cp
    import sklearn
    import torch

    os.makedirs(a.out, exist_ok=True)
    from tsm_core.runtime import device
    res = dict(command=" ".join([prog, *argv]),
               device=device.query(0, measure_peaks=False).name,
               host=platform.node(), cpu_count=os.cpu_count(), cupy=cp.__version__, torch=torch.__version__,
               sklearn=sklearn.__version__, iters=a.iters, seed=a.seed,
               date=time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()))
    if a.fit_vs_flash:
        shape = FIT_SHAPE if a.fit_shape is None else tuple(int(float(v)) for v in a.fit_shape.split(","))
        res["fit"] = bench_fit(shape, a.iters, a.seed)
        with open(os.path.join(a.out, "kmeans_fit.json"), "w") as f:
            json.dump(res, f, indent=1)
        r = res["fit"]
        print(f"\nwhole fits at {shape}, {a.iters} iterations, init k-means|| ({res['device']}), seconds")
        for prec in FIT_PRECISIONS:
            print(f"  ours {prec:9s} {r[f'ours_{prec}_fit_s']:.4f}  inertia {r[f'ours_{prec}_inertia']:.6g}"
                  + (f"  {r[f'ours_{prec}_speedup']:.2f}x flash-kmeans" if f"ours_{prec}_speedup" in r else ""))
        if "flash_fit_s" in r:
            print(f"  flash-kmeans   {r['flash_fit_s']:.4f}  inertia {r['flash_inertia']:.6g}")
        else:
            print(f"  flash-kmeans: {r.get('flash')}")
        print(f"  k-means|| {r['init_s'] * 1e3:.1f} ms = {r['init_in_iterations']:.2f} Lloyd iterations "
              f"({r['iter_s'] * 1e3:.2f} ms each)")
        return 0
    if a.precision_sweep:
        shapes = PRECISION_SHAPES if a.shapes is None else [PRECISION_SHAPES[int(i)] for i in a.shapes.split(",")]
        res["rates"] = measure_rates(seed=a.seed)
        res["shapes"] = bench_precision(shapes, a.iters, a.seed, marginal=a.marginal, rates=res["rates"])
        with open(os.path.join(a.out, "kmeans_precision.json"), "w") as f:
            json.dump(res, f, indent=1)
        plot_precision(res["shapes"], os.path.join(a.out, "kmeans_precision.png"), res["device"])
        print(f"\nk-means ms per Lloyd iteration ({a.iters} iterations, {res['device']})")
        cols = (*MODES, "flash_float32", "flash_float16")
        print(f"{'(n, d, k)':>22} " + " ".join(f"{c:>13}" for c in cols))
        for suffix, title in (("", "whole fit / iterations"), ("_marginal", "marginal")):
            if suffix and not a.marginal:
                continue
            print(f"  {title}")
            for r in res["shapes"]:
                vals = [r.get(f"{c}_ms_per_iter{suffix}") for c in cols]
                print(f"{str((r['n'], r['d'], r['k'])):>22} " + " ".join(
                    f"{v:13.3f}" if isinstance(v, float) else f"{'err':>13}" for v in vals))
        rt = res["rates"]
        print(f"  times over the floor (target <= {FLOOR_WITHIN}; read {rt['read_bw'] / 1e12:.2f} TB/s, "
              + ", ".join(f"{p} {rt[p] / 1e12:.0f}" for p in ("tf32", "bfloat16", "float16", "fp32"))
              + " TFLOP/s)")
        for r in res["shapes"]:
            vals = [r.get(f"{c}_floor_ratio") for c in cols]
            print(f"{str((r['n'], r['d'], r['k'])):>22} " + " ".join(
                f"{v:13.2f}" if isinstance(v, float) else f"{'-':>13}" for v in vals))
        return 0
    res["shapes"] = []
    for n, d, k in SHAPES:
        r = bench_shape(n, d, k, a.iters, a.seed, sweep=a.sweep)
        cp.get_default_memory_pool().free_all_blocks()  # this shape's X is gone
        torch.cuda.empty_cache()
        print(json.dumps(r), flush=True)
        res["shapes"].append(r)
    res["sklearn"] = bench_sklearn(a.seed, a.iters)
    print(json.dumps(res["sklearn"]), flush=True)
    res["fast_pytorch_kmeans"] = bench_fast_pytorch_kmeans(a.iters)
    if not a.skip_streamed:
        res["streamed"] = bench_streamed(a.quick, a.seed, 3)
        print(json.dumps(res["streamed"]), flush=True)
    with open(os.path.join(a.out, "kmeans.json"), "w") as f:
        json.dump(res, f, indent=1)
    plot(res, os.path.join(a.out, "kmeans.png"))

    print(f"\nk-means, ms per Lloyd iteration (fp32, {a.iters} iterations, {res['device']})")
    print(f"{'(n, d, k)':>22} {'ours':>9} {'torch':>9} {'speedup':>8} {'target':>7}  assign / update ms")
    for r in res["shapes"]:
        print(f"{str((r['n'], r['d'], r['k'])):>22} {r['ours_ms_per_iter']:9.3f} {r['torch_ms_per_iter']:9.3f} "
              f"{r['speedup_vs_torch']:7.2f}x {r['target_speedup']:6.1f}x  {r['assign_ms']:.3f} / {r['update_ms']:.3f}"
              f"  {'OK' if r['meets_target'] else 'MISS'}")
    for r in res["shapes"]:
        if "ours_ms_per_iter_tile" in r:
            print(f"{str((r['n'], r['d'], r['k'])):>22} assignment routes, ms/iter: tile "
                  f"{r['ours_ms_per_iter_tile']:.3f}, cuBLAS {r['ours_ms_per_iter_gemm']:.3f}")
    s = res["sklearn"]
    print(f"{str(SKLEARN_SHAPE):>22} {s['ours_ms_per_iter']:9.3f} sklearn {s['sklearn_ms_per_iter']:.2f} ms "
          f"({s['cpu_threads']} threads): {s['speedup_vs_sklearn']:.1f}x (target 25x) "
          f"{'OK' if s['meets_target'] else 'MISS'}")
    fk = res["fast_pytorch_kmeans"]
    print("fast-pytorch-kmeans:", fk["rows"] if fk["available"] else "not available")
    if "streamed" in res:
        st = res["streamed"]
        print(f"streamed {st['x_bytes'] / 1e9:.1f} GB, budget {st['budget_bytes'] / 1e9:.1f} GB: "
              f"{st['ms_per_pass']:.1f} ms per pass vs H2D copy {st['h2d_ms_per_pass']:.1f} ms "
              f"({st['h2d_GBps']:.1f} GB/s): {st['ratio_to_copy']:.2f}x (target <= 1.4x) "
              f"{'OK' if st['meets_target'] else 'MISS'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(None, sys.argv[1:]))
