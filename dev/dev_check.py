"""Developer's quick check on a GPU: correctness of every kernel, then rough timings.

    python dev/dev_check.py [--quick] [--only all|correct|overhead|tsm2r|tsm2l|cfg|l1cfg|prof]

Not the headline benchmark (that is ``python -m tsm_core.bench all``): this is the
fast loop used while tuning kernels. ``correct``: every kernel against a float64
product; ``overhead``: host microseconds of the Python path; ``tsm2r`` / ``tsm2l``:
rough timings and the fraction of the read bandwidth; ``cfg``: TSM2R launch
configurations (threads, rows per thread, stages, k-tile) at m = 10240 and 20480, with
registers and shared memory; ``l1cfg``: TSM2L opt1 configurations at m = 1e7;
``prof``: cProfile of a small TSM2L call. Prints a table last.
"""

import argparse
import json
import os
import sys
import time

import cupy as cp
import numpy as np

import tsm_core
from tsm_core.runtime import compile as _compile

from tsm_core.tsm2 import launch as _tsm2

p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
p.add_argument("--quick", action="store_true", help="fewer sizes and repetitions")
p.add_argument("--only", default="all", help="all, correct, overhead, tsm2r, tsm2l, cfg, l1cfg or prof")
p.add_argument("--json", default=None, help="also write the timings here")
args = p.parse_args()
if not tsm_core.has_gpu():
    print("dev_check: no CUDA GPU found", file=sys.stderr)
    raise SystemExit(2)
rng = np.random.default_rng(0)


def rand(shape, dtype, order="C"):
    x = cp.asarray(rng.standard_normal(shape), dtype=dtype)
    return cp.asfortranarray(x) if order == "F" else cp.ascontiguousarray(x)


def relerr(C, A, B, alpha=1.0, beta=0.0, C0=None):
    ref = alpha * (A.astype(cp.float64) @ B.astype(cp.float64))
    if beta != 0.0:
        ref += beta * C0.astype(cp.float64)
    return float(cp.linalg.norm(C.astype(cp.float64) - ref) / max(cp.linalg.norm(ref), 1e-300))


fails = []
if args.only in ("all", "correct"):
    shapes = [(1, 1, 1), (31, 127, 3), (129, 1025, 17), (1000, 4099, 16), (513, 300, 64), (4097, 8, 8), (7, 5, 2)]
    t0 = time.time()
    for dt in (np.float32, np.float64):
        tol = 1e-5 if dt == np.float32 else 1e-13
        for (m, k, n) in shapes:
            for ao in "CF":
                for bo in "CF":
                    A, B = rand((m, k), dt, ao), rand((k, n), dt, bo)
                    C0 = rand((m, n), dt, "F" if ao == "C" else "C")
                    runs = [("v%d" % v, lambda out, v=v: tsm_core.tsm2r(A, B, out=out, alpha=1.5, beta=-0.5, version=v)) for v in range(4)]
                    runs.append(("v3s1", lambda out: tsm_core.tsm2r(A, B, out=out, alpha=1.5, beta=-0.5, splits=1)))
                    if k <= 32:
                        runs.append(("l1", lambda out: tsm_core.tsm2l(A, B, out=out, alpha=1.5, beta=-0.5, opt=1)))
                    runs.append(("l2", lambda out: tsm_core.tsm2l(A, B, out=out, alpha=1.5, beta=-0.5, opt=2, kt=8)))
                    runs.append(("auto", lambda out: tsm_core.matmul(A, B, out=out, alpha=1.5, beta=-0.5)))
                    for name, fn in runs:
                        out = C0.copy()
                        try:
                            fn(out)
                            e = relerr(out, A, B, 1.5, -0.5, C0)
                        except Exception as ex:  # report and go on
                            e = float("nan")
                            print("EXC", name, m, k, n, ao, bo, repr(ex)[:300])
                        if not (e <= tol * max(1, np.sqrt(k) / 8)):
                            fails.append((name, np.dtype(dt).name, m, k, n, ao, bo, e))
                    # poisoned output, beta = 0: NaN in out must not leak
                    out = cp.full((m, n), cp.nan, dtype=dt)
                    tsm_core.tsm2r(A, B, out=out)
                    e = relerr(out, A, B)
                    if not e <= tol * max(1, np.sqrt(k) / 8):
                        fails.append(("poison", np.dtype(dt).name, m, k, n, ao, bo, e))
    print(f"correctness: {len(fails)} failures ({time.time() - t0:.1f}s)")
    for f in fails[:40]:
        print("  FAIL", f)


def bench(fn, reps=20, warm=3):
    for _ in range(warm):
        fn()
    s, e = cp.cuda.Event(), cp.cuda.Event()
    ts = []
    for _ in range(reps):
        s.record()
        fn()
        e.record()
        e.synchronize()
        ts.append(cp.cuda.get_elapsed_time(s, e) * 1e-3)
    return float(np.median(ts))


def read_bw():
    k = cp.RawKernel(r'''
    extern "C" __global__ void rd(const float4* x, long long n, float* out) {
        float s = 0.f;
        for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
            float4 v = __ldcs(x + i); s += v.x + v.y + v.z + v.w; }
        if (s == 12345.f) out[0] = s; }''', "rd")
    n = (2 << 30) // 16
    x = cp.asarray(rng.standard_normal(n * 4, dtype=np.float32))
    o = cp.zeros(1, cp.float32)
    t = bench(lambda: k((132 * 16,), (256,), (x, np.int64(n), o)), reps=10)
    x = None  # the 2 GiB buffer goes back to the pool (the lambda above holds the name)
    return n * 16 / t


rows = []
if args.only in ("all", "overhead"):
    from tsm_core.runtime.checks import check_operands
    for (m, k, n) in ((10000, 16, 16), (10240, 10240, 8)):
        A, B = rand((m, k), np.float32), rand((k, n), np.float32)
        C = cp.empty((m, n), np.float32)
        def cpu_us(fn, N=2000):
            fn(); cp.cuda.Device().synchronize()
            t = time.perf_counter()
            for _ in range(N):
                fn()
            cp.cuda.Device().synchronize()
            return (time.perf_counter() - t) / N * 1e6
        res = dict(check=cpu_us(lambda: check_operands(A, B, out=C)),
                   layout=cpu_us(lambda: _tsm2.a_layout(A)),
                   matmul=cpu_us(lambda: tsm_core.matmul(A, B, out=C)),
                   cupy=cpu_us(lambda: cp.matmul(A, B, out=C)),
                   tsm2l=cpu_us(lambda: tsm_core.tsm2l(A, B, out=C)) if k <= 32 else 0,
                   tsm2r=cpu_us(lambda: tsm_core.tsm2r(A, B, out=C), 200))
        print("overhead us/call", (m, k, n), {a: round(b, 1) for a, b in res.items()})
        print(tsm_core.plan(m, k, n, np.float32).describe())
if args.only in ("cfg",):
    def cf(lst, kt=0):
        return [dict(t1=32 * w, rpt=r, stages=st, t3=kt) for w, r, st in lst]

    def tc(lst):  # float64 on DMMA (tsm2r_v3d): (warps, 8-row groups, stages, KT)
        return [dict(tc=1, t1=32 * w, rpt=r, stages=st, t3=kt) for w, r, st, kt in lst]
    TC = tc([(8, 2, 2, 64), (8, 2, 1, 64), (8, 1, 2, 64), (4, 4, 2, 64), (8, 4, 2, 64),
             (16, 1, 2, 64), (8, 2, 2, 128), (4, 2, 2, 64)]) + [dict(tc=-1)]
    sweeps = [
        (np.float64, "C", 20480, 16, TC), (np.float64, "C", 10240, 16, TC),
        (np.float64, "C", 30720, 16, TC[:3]), (np.float64, "C", 20480, 8, TC),
        (np.float64, "C", 10240, 8, TC[:4] + TC[-1:]), (np.float64, "C", 20480, 4, TC[:2] + TC[-1:]),
        (np.float64, "C", 20480, 2, TC[:2] + TC[-1:]),
    ]
    if os.environ.get("CFG_ALL"):
        sweeps += [
        (np.float32, "C", 20480, 16, cf([(8, 2, 2), (8, 4, 1), (16, 2, 1), (8, 2, 1), (16, 4, 1)])),
        (np.float64, "C", 20480, 16, cf([(16, 2, 2)], 64) + cf([(8, 2, 1), (16, 2, 1), (8, 1, 2), (8, 1, 1)], 64)
         + cf([(8, 1, 2)])),
        (np.float32, "C", 10240, 16, cf([(8, 2, 2), (8, 4, 1), (16, 2, 1)])),
        (np.float64, "C", 20480, 8, cf([(8, 4, 2), (8, 4, 1), (8, 2, 2), (16, 2, 1)])),
        (np.float64, "C", 20480, 2, cf([(8, 4, 2), (8, 4, 1), (8, 8, 2)])),
    ]
    for (dt, order, m, n, cfgs) in sweeps:
        A, B = rand((m, m), dt, order), rand((m, n), dt, order)
        C = cp.empty((m, n), dt)
        byts = (m * m + 2 * m * n) * A.itemsize
        for cfg in cfgs:
            try:
                t = bench(lambda: tsm_core.tsm2r(A, B, out=C, **cfg), reps=9)
                e = relerr(C, A, B)
                lay, _ = _tsm2.a_layout(A)
                rc = _tsm2.resolve_tsm2r(m, m, n, A.dtype, lay, _tsm2.TSM2RConfig(**cfg))
                regs = _compile.get_kernel("tsm2r", _tsm2.tsm2r_name(rc, A.dtype, lay)).num_regs
                print(f"cfg {np.dtype(dt).name} {order} m={m} n={n} {cfg}: {t*1e3:.3f} ms  {byts/t/1e9:.0f} GB/s "
                      f"err={e:.1e} splits={rc.splits} regs={regs} smem={_tsm2.v3_smem_bytes(rc, A.itemsize, lay)}", flush=True)
            except Exception as ex:
                print("cfg FAIL", cfg, repr(ex)[:200])
        del A, B, C
        cp.get_default_memory_pool().free_all_blocks()
if args.only in ("l1cfg",):
    # TSM2L opt1 configurations at m = 1e7 (the shapes below 0.85 of the bandwidth).
    for dt, order, k in [(np.float32, "C", 8), (np.float32, "C", 16), (np.float64, "F", 16),
                         (np.float64, "C", 8), (np.float32, "F", 16)]:
        m = 10_000_000
        A, B = rand((m, k), dt, order), rand((k, k), dt, order)
        C = cp.empty((m, k), dt)
        byts = (m * k * 2 + k * k) * A.itemsize
        lay, _ = _tsm2.a_layout(A)
        base = _tsm2.resolve_tsm2l(m, k, k, A.dtype, lay, _tsm2.TSM2LConfig())
        cfgs = [dict()]
        for t1 in (64, 128, 256):
            for st in (2, 4, 6):
                for f in (1, 2, 4):
                    cfgs.append(dict(t1=t1, stages=st, tcf=max(1, base.tcf * f * 128 // t1)))
        for cfg in cfgs:
            try:
                t = bench(lambda: _tsm2.launch_tsm2l(A, B, C, 1.0, 0.0, _tsm2.TSM2LConfig(**cfg)), reps=9)
                rc = _tsm2.resolve_tsm2l(m, k, k, A.dtype, lay, _tsm2.TSM2LConfig(**cfg))
                e = relerr(C, A, B)
                print(f"l1cfg {np.dtype(dt).name} {order} k={k} {cfg} -> t1={rc.t1} tcf={rc.tcf} st={rc.stages} "
                      f"vec={rc.vec}: {t*1e3:.3f} ms {byts/t/1e9:.0f} GB/s err={e:.1e}", flush=True)
            except Exception as ex:
                print("l1cfg FAIL", cfg, repr(ex)[:200])
        del A, B, C
        cp.get_default_memory_pool().free_all_blocks()
if args.only in ("prof",):
    import cProfile, pstats
    A, B = rand((10000, 16), np.float32), rand((16, 16), np.float32)
    C = cp.empty((10000, 16), np.float32)
    for fn in (lambda: tsm_core.tsm2l(A, B, out=C), lambda: tsm_core.matmul(A, B, out=C)):
        fn()
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(2000):
            fn()
        pr.disable()
        pstats.Stats(pr).sort_stats("tottime").print_stats(12)
if args.only in ("all", "tsm2r", "tsm2l"):
    bw = read_bw()
    print(f"read bandwidth {bw / 1e9:.0f} GB/s")
if args.only in ("all", "tsm2r"):
    ms = [10240, 30720] if args.quick else [10240, 20480, 30720]
    for dt in (np.float32, np.float64):
        for order in "CF":
            for m in ms:
                A = rand((m, m), dt, order)
                for n in (2, 4, 8, 16):
                    B = rand((m, n), dt, order)
                    C = cp.empty((m, n), dt, order=order)
                    t_ours = bench(lambda: tsm_core.tsm2r(A, B, out=C))
                    err = relerr(C, A, B)
                    t_cub = bench(lambda: cp.matmul(A, B, out=C))
                    byts = (m * m + m * n + m * n) * A.itemsize
                    lay, _ = _tsm2.a_layout(A)
                    cfg = _tsm2.resolve_tsm2r(m, m, n, A.dtype, lay, _tsm2.TSM2RConfig())
                    regs = _compile.get_kernel("tsm2r", _tsm2.tsm2r_name(cfg, A.dtype, lay)).num_regs
                    rows.append(dict(alg="tsm2r", dtype=np.dtype(dt).name, order=order, m=m, k=m, n=n,
                                     ms=t_ours * 1e3, cublas_ms=t_cub * 1e3, frac=byts / t_ours / bw,
                                     speedup=t_cub / t_ours, err=err, splits=cfg.splits, regs=regs))
                    print(rows[-1], flush=True)
                del A, B, C
                cp.get_default_memory_pool().free_all_blocks()
if args.only in ("all", "tsm2l"):
    for dt in (np.float32, np.float64):
        for order in "CF":
            for m in (10**4, 10**5, 10**6, 10**7):
                for kn in (8, 16):
                    A = rand((m, kn), dt, order)
                    B = rand((kn, kn), dt, order)
                    C = cp.empty((m, kn), dt, order=order)
                    res = {}
                    for opt in (1, 2):
                        res[opt] = bench(lambda: tsm_core.tsm2l(A, B, out=C, opt=opt))
                    err = relerr(C, A, B)
                    t_cub = bench(lambda: cp.matmul(A, B, out=C))
                    best = min(res, key=res.get)
                    byts = (m * kn * 2 + kn * kn) * A.itemsize
                    rows.append(dict(alg="tsm2l", dtype=np.dtype(dt).name, order=order, m=m, k=kn, n=kn,
                                     ms=res[best] * 1e3, ms_other=res[3 - best] * 1e3, opt=best,
                                     cublas_ms=t_cub * 1e3, frac=byts / res[best] / bw,
                                     speedup=t_cub / res[best], err=err))
                    print(rows[-1], flush=True)
                    del A, B, C

print()
print(f"{'alg':6s} {'dtype':7s} {'o':1s} {'m':>9s} {'k':>6s} {'n':>3s} {'ms':>8s} {'cuBLAS':>8s} {'frac':>5s} {'x':>5s} {'err':>8s}")
for r in rows:
    print(f"{r['alg']:6s} {r['dtype']:7s} {r['order']:1s} {r['m']:9d} {r['k']:6d} {r['n']:3d} {r['ms']:8.3f} "
          f"{r['cublas_ms']:8.3f} {r['frac']:5.2f} {r['speedup']:5.2f} {r['err']:8.1e}")
if args.json:
    with open(args.json, "w") as f:
        json.dump(dict(rows=rows, fails=[list(map(str, x)) for x in fails]), f, indent=1)
sys.exit(1 if fails else 0)
