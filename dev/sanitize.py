"""Run every kernel once on small, awkward problems and check each result: a sweep for
compute-sanitizer.

    compute-sanitizer --tool memcheck  --error-exitcode 2 python dev/sanitize.py
    compute-sanitizer --tool racecheck --error-exitcode 2 python dev/sanitize.py
    compute-sanitizer --tool initcheck --error-exitcode 2 python dev/sanitize.py
    compute-sanitizer --tool synccheck --error-exitcode 2 python dev/sanitize.py

Covers TSM2R v0, v1, v2, v3 (both layouts of A, aligned and misaligned, split-K, stream-K),
TSM2L opt1 and opt2 (both layouts, several row tiles per block) and matmul's
dispatch, at sizes such as 129 x 257 x 17 that fit no tile. Each case prints one
line; the exit status is 1 if any result is wrong or any call raised (0 otherwise).
Without a sanitizer it runs in seconds; under one, each case stays small enough for
the whole sweep to finish in about a minute.

What makes the sanitizers see something:
- CuPy's memory pool is switched off, so every array is its own cudaMalloc and
  memcheck reports an access past its end (inside a pool chunk it could not).
- With beta == 0, `out` is allocated and never written before the call: initcheck
  then reports a kernel that reads C although beta == 0 (BLAS semantics say it must
  not), and the check below fails on any element the kernel did not write (the
  value would be garbage). The split-K workspace is uninitialised as well, so a
  reduction that reads a partial sum nobody wrote is reported too.
- With beta != 0, out holds finite random values (C0) and is read, as it must be.

Tolerance: |C - ref| <= (gamma_{k+3}(u) + gamma_{k+3}(2**-53)) * (|alpha| |A||B| +
|beta| |C0|) elementwise, the bound of tests/test_cpu_path.py; the reference is
float64 DGEMM on the GPU.

Options: --only SUBSTRING (run the cases whose name contains it), --list.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

F32, F64 = np.float32, np.float64

# (name, function, keyword arguments, (m, k, n), dtype, A kind, B kind, out kind, alpha, beta)
# kinds: C, F, off1 (row-major, start one element past alignment), offF (F-ordered,
# misaligned), step (a [::2, ::3] view: copied), S (out only: a strided view).
CASES = []


def case(name, fn, kw, shape, dtype=F32, a="C", b="C", out="C", alpha=1.0, beta=0.0):
    CASES.append((name, fn, kw, shape, dtype, a, b, out, alpha, beta))


# TSM2R: the paper's ladder.
for v in (0, 1, 2):
    case(f"tsm2r_v{v} C", "tsm2r", dict(version=v), (129, 257, 17), F32, "C", "C")
    case(f"tsm2r_v{v} F", "tsm2r", dict(version=v), (129, 257, 17), F64, "F", "F", out="F")
case("tsm2r_v2 t1=64 t2=2 t3=1", "tsm2r", dict(version=2, t1=64, t2=2, t3=1), (129, 257, 5), F32, "C", "F")
case("tsm2r_v2 beta", "tsm2r", dict(version=2), (129, 257, 17), F32, "C", "C", out="S", alpha=1.5, beta=-0.5)

# TSM2R v3: row-major A (tsm2r_v3x / v3d / v3r) and column-major A (tsm2r_v3).
for dt in (F32, F64):
    tag = "f32" if dt is F32 else "f64"
    case(f"tsm2r_v3 rowA {tag}", "tsm2r", dict(version=3), (129, 257, 17), dt, "C", "C")
    case(f"tsm2r_v3 colA {tag}", "tsm2r", dict(version=3), (129, 257, 17), dt, "F", "C")
    case(f"tsm2r_v3 rowA split3 {tag}", "tsm2r", dict(version=3, splits=3), (129, 1021, 17), dt, "C", "F")
    case(f"tsm2r_v3 colA split3 {tag}", "tsm2r", dict(version=3, splits=3), (129, 1021, 17), dt, "F", "F")
case("tsm2r_v3 1x1x1 rowA", "tsm2r", dict(version=3), (1, 1, 1), F32, "C", "C")
case("tsm2r_v3 1x1x1 colA", "tsm2r", dict(version=3), (1, 1, 1), F64, "F", "F")
case("tsm2r_v3 rowA misaligned", "tsm2r", dict(version=3), (131, 257, 3), F32, "off1", "C")
case("tsm2r_v3 colA misaligned", "tsm2r", dict(version=3), (131, 257, 3), F32, "offF", "C")
case("tsm2r_v3 view copied", "tsm2r", dict(version=3), (67, 129, 9), F64, "step", "step")
case("tsm2r_v3 rowA t2=16 groups=2", "tsm2r", dict(version=3, t2=16, groups=2), (129, 257, 33), F32, "C", "C")
case("tsm2r_v3 rowA t2=16 rgroups=4 split3", "tsm2r", dict(version=3, t2=16, rgroups=4, splits=3), (131, 1021, 33),
     F32, "C", "C")
case("tsm2r_v3 rowA t2=4 rgroups=8 rpt=1", "tsm2r", dict(version=3, t2=4, rgroups=8, rpt=1, tc=-1), (67, 257, 5), F64, "C", "F")
case("tsm2r_v3 rowA t1=64 t2=8 split7", "tsm2r", dict(version=3, t1=64, t2=8, splits=7), (67, 1021, 9), F32, "C", "C")
case("tsm2r_v3 colA t1=64 t2=2 split7", "tsm2r", dict(version=3, t1=64, t2=2, splits=7), (67, 1021, 9), F64, "F", "C")
# float32 row-major A runs tsm2r_v3x (3xTF32) by default; its ring of A, k pieces,
# and the FMA kernel (tc=-1) too.
case("tsm2r_v3x ring stages=2 split3", "tsm2r", dict(version=3, tc=1, stages=2, splits=3), (131, 1021, 17), F32,
     "C", "C")
case("tsm2r_v3x u=1 rpt=2", "tsm2r", dict(version=3, tc=1, u=1, rpt=2), (67, 257, 9), F32, "C", "F")
case("tsm2r_v3r f32 FMA", "tsm2r", dict(version=3, tc=-1), (129, 257, 17), F32, "C", "C")
# stream-K (the float32 default at 16 columns): rows written directly and rows the
# reduction sums, two passes over n, a misaligned A, a beta epilogue.
case("tsm2r_v3x stream-K", "tsm2r", dict(version=3, tc=1, streamk=1), (1031, 3001, 33), F32, "C", "C")
# the large-problem default at 16 columns: one 16-warp block per SM, a 2-stage ring of A
case("tsm2r_v3x stream-K 16 warps ring", "tsm2r", dict(version=3, tc=1, streamk=1, t1=512, stages=2, t3=128),
     (1031, 3000, 33), F32, "C", "C")  # (k even: A must be 16-byte aligned for 16 warps)
case("tsm2r_v3x stream-K misaligned beta", "tsm2r", dict(version=3, tc=1, streamk=1), (131, 2049, 16), F32,
     "off1", "C", out="S", alpha=1.5, beta=-0.5)
case("tsm2r_v3d stream-K", "tsm2r", dict(version=3, tc=1, streamk=1), (1031, 3001, 33), F64, "C", "C")
case("tsm2r_v3d stream-K n=8 beta", "tsm2r", dict(version=3, tc=1, streamk=1), (131, 2049, 8), F64, "C", "C",
     out="S", alpha=1.5, beta=-0.5)
# Column-major A in one wave of one 512-row block per SM (the default launch where
# a split count fills the SMs: _tsm2._col_one_wave), float64 and float32 n <= 4.
case("tsm2r_v3 colA one wave f64", "tsm2r", dict(version=3), (1030, 41011, 9), F64, "F", "C")
case("tsm2r_v3 colA one wave f32 beta", "tsm2r", dict(version=3), (1028, 20011, 3), F32, "F", "F", out="F",
     alpha=1.5, beta=-0.5)
# Row-major A, n <= 2, m * k in _tsm2.SMALL_N2_ELEMS: the FMA kernel, 8 rows per warp, no prefetch.
case("tsm2r_v3r small n2 f64", "tsm2r", dict(version=3), (2048, 8192, 2), F64, "C", "C")
case("tsm2r_v3r small n2 f32 beta", "tsm2r", dict(version=3), (1031, 16384, 1), F32, "C", "F", out="F",
     alpha=1.5, beta=-0.5)
case("tsm2r_v3 rowA beta", "tsm2r", dict(version=3), (129, 257, 17), F32, "C", "F", out="S", alpha=1.5, beta=-0.5)
case("tsm2r_v3 colA split3 beta", "tsm2r", dict(version=3, splits=3), (129, 1021, 17), F64, "F", "C", out="F",
     alpha=0.0, beta=1.0)

# TSM2L: opt1 (k <= 32) and opt2 (any k); tcf=4 walks several row tiles per block.
for dt in (F32, F64):
    tag = "f32" if dt is F32 else "f64"
    case(f"tsm2l_opt1 rowA {tag}", "tsm2l", dict(opt=1), (1021, 31, 17), dt, "C", "C")
    case(f"tsm2l_opt1 colA {tag}", "tsm2l", dict(opt=1), (1021, 31, 17), dt, "F", "C")
    case(f"tsm2l_opt2 rowA {tag}", "tsm2l", dict(opt=2), (1021, 129, 17), dt, "C", "F")
    case(f"tsm2l_opt2 colA {tag}", "tsm2l", dict(opt=2), (1021, 129, 17), dt, "F", "F")
case("tsm2l_opt1 rowA tcf=4", "tsm2l", dict(opt=1, tcf=4), (2053, 16, 16), F32, "C", "C")
case("tsm2l_opt1w f32 k=12 n=5", "tsm2l", dict(opt=1, warp=1), (1021, 12, 5), F32, "C", "C")
case("tsm2l_opt1w f64 k=20 n=13 tcf=3", "tsm2l", dict(opt=1, warp=1, tcf=3), (2053, 20, 13), F64, "C", "C")
case("tsm2l_opt1w beta outF", "tsm2l", dict(opt=1, warp=1), (257, 8, 8), F32, "C", "C", out="F", alpha=1.5, beta=-0.5)
case("tsm2l_opt1 colA tcf=4", "tsm2l", dict(opt=1, tcf=4), (2053, 16, 16), F32, "F", "C", out="F")
case("tsm2l_opt2 colA tcf=4", "tsm2l", dict(opt=2, tcf=4), (2053, 33, 8), F64, "F", "C")
case("tsm2l_opt1 1x1x1", "tsm2l", dict(opt=1), (1, 1, 1), F32, "C", "C")
case("tsm2l_opt1 colA misaligned", "tsm2l", dict(opt=1), (129, 8, 3), F64, "offF", "C")
case("tsm2l_opt1 rowA misaligned", "tsm2l", dict(opt=1), (129, 8, 3), F32, "off1", "C")
case("tsm2l_opt1 beta", "tsm2l", dict(opt=1), (1021, 31, 17), F32, "C", "C", out="S", alpha=1.5, beta=-0.5)
case("tsm2l_opt2 beta n=64", "tsm2l", dict(opt=2), (257, 33, 64), F64, "F", "C", out="F", alpha=1.5, beta=-0.5)

# matmul's dispatch (whatever the planner picks) and forced algorithms.
case("matmul auto tsm2r-like", "matmul", {}, (2053, 257, 8), F32, "C", "C")
case("matmul auto tsm2l-like", "matmul", {}, (4099, 16, 16), F32, "F", "C")
case("matmul tsm2l k>32", "matmul", dict(algorithm="tsm2l"), (257, 65, 5), F64, "C", "C")


# ------------------------------------------------------------------ helpers


def gamma(k, dtype):
    u = np.finfo(dtype).eps / 2
    return k * u / (1 - k * u)


def operand(cp, rng, shape, dtype, kind):
    r, c = shape

    def data(s, order="C"):
        x = cp.asarray(rng.standard_normal(s).astype(dtype))
        return cp.asfortranarray(x) if order == "F" else x

    if kind == "C":
        return data((r, c))
    if kind == "F":
        return data((r, c), "F")
    if kind == "off1":
        return data((r, c + 1))[:, 1:]
    if kind == "offF":
        return data((r + 1, c), "F")[1:, :]
    if kind == "step":
        return data((2 * r, 3 * c))[::2, ::3]
    raise ValueError(kind)


def make_out(cp, rng, m, n, dtype, kind, beta):
    """(out, C0, around): out uninitialised when beta == 0, else finite random C0."""
    if kind == "S":
        big = cp.asarray(rng.standard_normal((2 * m + 1, 3 * n + 2)).astype(dtype))
        out = big[1::2, 2::3]
        keep = cp.ones(big.shape, dtype=bool)
        keep[1::2, 2::3] = False
        return out, (out.copy() if beta != 0.0 else None), (big, keep, big[keep].copy())
    if beta == 0.0:
        return cp.empty((m, n), dtype=dtype, order=kind), None, None
    out = operand(cp, rng, (m, n), dtype, kind)
    return out, out.copy(), None


def check(cp, C, A, B, alpha, beta, C0):
    """max over elements of |C - ref| / bound (inf where C is NaN or the bound is 0 and C is off)."""
    k = A.shape[1]
    A64, B64 = A.astype(cp.float64), B.astype(cp.float64)
    ref = (A64 @ B64) * alpha
    scale = abs(alpha) * (cp.abs(A64) @ cp.abs(B64))
    if beta != 0.0:
        ref += beta * C0.astype(cp.float64)
        scale += abs(beta) * cp.abs(C0.astype(cp.float64))
    tol = (gamma(k + 3, C.dtype) + gamma(k + 3, np.float64)) * scale
    err = cp.abs(C.astype(cp.float64) - ref)
    ratio = cp.where(err <= tol, err / cp.maximum(tol, np.finfo(np.float64).tiny), cp.inf)
    return float(ratio.max())


def run_case(cp, tsm_core, c, rng):
    name, fn, kw, (m, k, n), dtype, ak, bk, ok_, alpha, beta = c
    A = operand(cp, rng, (m, k), dtype, ak)
    B = operand(cp, rng, (k, n), dtype, bk)
    out, C0, around = make_out(cp, rng, m, n, dtype, ok_, beta)
    cp.cuda.Device().synchronize()
    t0 = time.perf_counter()
    res = getattr(tsm_core, fn)(A, B, out=out, alpha=alpha, beta=beta, **kw)
    cp.cuda.Device().synchronize()
    dt = time.perf_counter() - t0
    problems = []
    if res is not out:
        problems.append("out= not returned")
    ratio = check(cp, out, A, B, alpha, beta, C0)
    if not ratio <= 1.0:
        problems.append(f"error/bound {ratio:.3g}")
    if around is not None:
        big, keep, before = around
        if not bool((big[keep] == before).all()):
            problems.append("elements around the strided out were written")
    return ratio, dt, problems


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default="", help="run only the cases whose name contains this")
    ap.add_argument("--list", action="store_true", help="list the cases and exit")
    args = ap.parse_args(argv)
    cases = [c for c in CASES if args.only in c[0]]
    if args.list:
        for c in cases:
            print(f"{c[0]:34} {c[1]:6} {c[2]} {'x'.join(map(str, c[3]))} {np.dtype(c[4]).name} A={c[5]} B={c[6]}")
        return 0

    import cupy as cp

    import tsm_core

    if not tsm_core.has_gpu():
        print("sanitize: no CUDA GPU found", file=sys.stderr)
        return 2
    cp.cuda.set_allocator(None)  # one cudaMalloc per array: memcheck sees every edge
    cp.cuda.set_pinned_memory_allocator(None)
    rng = np.random.default_rng(20240607)
    bad = 0
    t_all = time.perf_counter()
    for c in cases:
        name, fn, kw, (m, k, n), dtype, ak, bk, ok_, alpha, beta = c
        desc = (f"{name:34} {np.dtype(dtype).name:7} A={ak:4} B={bk:4} out={ok_} "
                f"{m}x{k}x{n} alpha={alpha:g} beta={beta:g}")
        try:
            ratio, dt, problems = run_case(cp, tsm_core, c, rng)
        except Exception as exc:  # noqa: BLE001  (report and go on to the next case)
            bad += 1
            print(f"ERROR {desc}: {type(exc).__name__}: {exc}", flush=True)
            continue
        if problems:
            bad += 1
            print(f"WRONG {desc}: {'; '.join(problems)}", flush=True)
        else:
            print(f"ok    {desc}  err/bound {ratio:.2g}  {dt * 1e3:.1f} ms", flush=True)
    print(f"{len(cases) - bad} of {len(cases)} cases ok in {time.perf_counter() - t_all:.1f} s", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
