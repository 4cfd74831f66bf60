"""Probe of the tensor-core k-means assignment: correctness against float64 and the
assignment time against the SIMT routes and flash-kmeans's assignment kernel.

    python dev/kmeans_tc_probe.py [--quick]
"""
import sys
import time

import cupy as cp
import numpy as np

import tsm_core
from tsm_core.kmeans.assign import kmeans_assign
from tsm_core.kmeans.tensor import bfloat16_to_float32, to_bfloat16_words
from tsm_core.runtime import timing


def ref64(X, C):
    X64, C64 = X.astype(cp.float64), C.astype(cp.float64)
    mu = C64.mean(0)
    Xs, Cs = X64 - mu, C64 - mu
    D = (Xs * Xs).sum(1)[:, None] - 2 * Xs @ Cs.T + (Cs * Cs).sum(1)[None]
    return D


def check(n, d, k, prec, seed=0):
    rng = cp.random.default_rng(seed)
    X = rng.standard_normal((n, d), dtype=cp.float32) + 0.5
    C = X[cp.asarray(np.random.default_rng(seed).choice(n, k, replace=k > n))] + 0.01 * rng.standard_normal((k, d), dtype=cp.float32)
    if prec in ("bfloat16", "float16"):
        Xr = bfloat16_to_float32(to_bfloat16_words(X)) if prec == "bfloat16" else X.astype(cp.float16).astype(cp.float32)
        Cr = bfloat16_to_float32(to_bfloat16_words(C)) if prec == "bfloat16" else C.astype(cp.float16).astype(cp.float32)
    else:
        Xr, Cr = X, C
    out = []
    for rep in range(2):
        lab, md = kmeans_assign(X, C, precision=prec)
        out.append((lab.copy(), md.copy()))
    lab, md = out[0]
    det = bool((out[0][0] == out[1][0]).all()) and bool((out[0][1] == out[1][1]).all())
    bad_range = int(((lab < 0) | (lab >= k)).sum())
    step = max(1, (256 << 20) // (8 * k))
    diff = 0
    diff_strict = 0
    mderr = 0.0
    for a in range(0, n, step):
        D = ref64(Xr[a:a + step], Cr[a:a + step] if False else Cr)
        l64 = D.argmin(1)
        la = lab[a:a + step]
        dl = D[cp.arange(D.shape[0]), la.astype(cp.int64)]
        dbest = D.min(1)
        scale = (Xr[a:a + step].astype(cp.float64) ** 2).sum(1) + float((Cr.astype(cp.float64) ** 2).sum(1).max())
        diff += int((la != l64).sum())
        # a label differing where float64's own distances differ by more than 1e-12 of the scale
        diff_strict += int(((la != l64) & (dl - dbest > 1e-12 * scale)).sum())
        mderr = max(mderr, float((cp.abs(md[a:a + step].astype(cp.float64) - dl) / scale).max()))
    return dict(n=n, d=d, k=k, prec=prec, det=det, bad_range=bad_range, diff=diff, diff_strict=diff_strict,
                mind_rel_err=mderr)


def time_assign(n, d, k, prec, rep=10):
    rng = cp.random.default_rng(1)
    X = rng.random((n, d), dtype=cp.float32)
    C = X[:k].copy()
    if prec in ("bfloat16", "float16"):
        import torch
        Xt = torch.as_tensor(X, device="cuda")
        Xh = Xt.to(torch.bfloat16 if prec == "bfloat16" else torch.float16)
        Ch = torch.as_tensor(C, device="cuda").to(Xh.dtype)
        fn = lambda: kmeans_assign(Xh, Ch, precision=prec)
    else:
        fn = lambda: kmeans_assign(X, C, precision=prec)
    fn()
    return timing.call_ms(fn, warm=2, rep=rep)


def time_kernel(n, d, k, prec, rep=10):
    """The tensor-core route alone (workspace made and centres prepared once)."""
    from tsm_core.kmeans.assign import storage_rows
    from tsm_core.kmeans.tensor import TensorAssign
    rng = cp.random.default_rng(1)
    X = rng.random((n, d), dtype=cp.float32)
    C = X[:k].copy()
    Xs = storage_rows(X, "float32", prec)
    tc = TensorAssign(n, d, k, prec)
    tc.prepare(C)
    lab = cp.empty(n, dtype=cp.int32)
    md = cp.empty(n, dtype=cp.float32)
    ch = cp.zeros(1, dtype=cp.int32)
    fn = lambda: tc.run(Xs, lab, md, ch, lab)
    fn()
    ms = timing.call_ms(fn, warm=2, rep=rep)
    st = tc.stats
    frac = (st["pairs"] / max(st["rows"], 1), st["full"] / max(st["rows"], 1))
    return ms, frac


def time_flash(n, d, k, half):
    import torch
    from flash_kmeans.assign_euclid_triton import euclid_assign_triton
    g = torch.Generator(device="cuda").manual_seed(1)
    X = torch.rand((1, n, d), device="cuda", generator=g)
    if half:
        X = X.half()
    C = X[:, :k].clone()
    xsq = (X.float() ** 2).sum(-1)
    out = torch.empty((1, n), dtype=torch.int32, device="cuda")
    fn = lambda: euclid_assign_triton(X, C, xsq, out)
    fn()
    return timing.call_ms(fn, warm=2, rep=10)


def main():
    quick = "--quick" in sys.argv
    rows = []
    shapes = [] if quick else [(1, 1, 1), (7, 3, 2), (1000, 3, 7), (5003, 33, 129), (20011, 128, 1024), (3001, 4096, 300),
              (4099, 257, 4099), (100003, 64, 16)]
    for s in shapes:
        for prec in ("float32", "tf32", "bfloat16", "float16"):
            t = time.time()
            r = check(*s, prec)
            r["s"] = round(time.time() - t, 2)
            print(r, flush=True)
            rows.append(r)
    from tsm_core.kmeans import tensor
    tshapes = [(100000, 4096, 16), (1000000, 256, 64), (1000000, 64, 1024), (4000000, 128, 1024),
               (1000000, 128, 8192), (100000, 4096, 1024)]
    print("timing (ms): shape, ours f32, ours tf32, ours bf16, flash f32, flash f16, old route")
    for s in tshapes:
        n, d, k = s
        res = {}
        for prec in ("float32", "tf32", "bfloat16"):
            try:
                ms, frac = time_kernel(n, d, k, prec)
                res[prec] = ms
                if prec == "float32":
                    res["pairs_full"] = tuple(round(f, 4) for f in frac)
            except Exception as e:  # noqa
                res[prec] = repr(e)[:80]
        try:
            res["flash32"] = time_flash(n, d, k, False)
            res["flash16"] = time_flash(n, d, k, True)
        except Exception as e:  # noqa
            res["flash"] = repr(e)[:120]
        X = cp.random.default_rng(1).random((n, d), dtype=cp.float32)
        import os
        os.environ["TSM_KMEANS_ASSIGN"] = ""
        try:
            res["old"] = timing.call_ms(lambda: kmeans_assign(X, X[:k].copy(), precision="float64" if False else None,
                                                              method="tile" if k > 32 else "fused"), warm=1, rep=5)
        except Exception as e:  # noqa
            res["old"] = repr(e)[:80]
        print(s, {a: (round(b, 3) if isinstance(b, float) else b) for a, b in res.items()}, flush=True)


if __name__ == "__main__":
    main()
