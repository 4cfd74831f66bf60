"""Per-call time of ``tsm_core.matmul``'s host path against the vendor calls (us):

    python dev/hostpath_probe.py              # the table (GPU)
    python dev/hostpath_probe.py --steps      # also the host cost of each step (GPU)
    python dev/hostpath_probe.py --host-only  # the steps that run without a GPU

For about twenty small and tall-and-skinny products (the cuBLAS route and the TSM2R /
TSM2L routes, CuPy arrays and torch CUDA tensors, float32 and float64, plain and
with alpha / beta, with and without ``out=``), each repeated call is timed as the
random-products bench times it (host clock around a synchronise, batches of calls,
the three functions alternating sample by sample, median of 7): ``tsm_core.matmul``
on the row's kind of array, ``cupy.matmul`` (``cupy.cublas.gemm`` where alpha /
beta are not the defaults) on CuPy views of the same memory, and ``torch.mm`` /
``Tensor.addmm_`` on torch views. Columns: the three times, each vendor's time over
ours (above 1: ours is faster), the route ``matmul`` took (``route_of``) and the
relative error of ours against a float64 numpy product.

``--steps`` adds, for three plain products, the host time of each step of a hit
with the GPU left running behind (no synchronise inside the loop): the key, the
table lookup, the direct gemm call, ``cupy.empty``, ``cupy.matmul``, ``torch.mm``.
``--host-only`` times what needs no GPU: the key of numpy and torch CPU operands,
``gemm_args``, and the Python around a direct gemm (``_gemm_direct`` with a cuBLAS
that returns at once).
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

# (m, k, n, dtype, order of A, order of B, alpha, beta, out given, kind); orders as the
# random-products bench draws them: C, F, or T (the transposed view of a C-ordered array).
CASES = [
    # the cuBLAS route; the first five are the bench's worst CuPy rows of 2026-11-27
    (48993, 1, 8, "float64", "C", "C", 1.0, 0.0, True, "cupy"),
    (36, 135, 13652, "float32", "T", "T", 1.0, 0.0, True, "cupy"),
    (1, 2, 2480, "float64", "T", "F", 1.0, 0.0, True, "cupy"),
    (60, 1539, 2392, "float32", "F", "C", 1.0, 0.0, True, "cupy"),
    (339, 11955, 12, "float32", "F", "C", 1.0, 1.0, True, "cupy"),
    (8, 8, 8, "float32", "C", "C", 1.0, 0.0, False, "cupy"),
    (64, 64, 64, "float64", "C", "C", 1.0, 0.0, False, "cupy"),
    (256, 256, 256, "float32", "C", "F", 2.0, 0.0, False, "cupy"),
    (512, 512, 512, "float64", "F", "F", -0.5, 0.25, True, "cupy"),
    (1024, 1024, 1024, "float32", "C", "C", 1.0, 0.0, True, "cupy"),
    (8, 8, 8, "float32", "C", "C", 1.0, 0.0, False, "torch"),
    (64, 64, 64, "float64", "T", "C", 1.0, 0.0, True, "torch"),
    (512, 512, 512, "float32", "C", "C", 1.5, 0.5, True, "torch"),
    # TSM2R and TSM2L (the route is the verified dispatch's: cuBLAS where it was faster)
    (84027, 1092, 13, "float32", "C", "T", 1.0, 0.0, True, "cupy"),
    (18870, 3696, 14, "float32", "C", "T", 1.0, 0.0, False, "cupy"),
    (1_000_000, 8, 8, "float64", "C", "C", 1.0, 0.0, True, "cupy"),
    (80559, 6, 14, "float64", "C", "T", 1.0, 0.0, True, "torch"),
    (64659, 1967, 15, "float32", "C", "C", 1.0, 0.0, True, "torch"),
    (1_000_000, 16, 16, "float32", "C", "C", 2.0, 1.0, True, "torch"),
    (2_000_000, 8, 4, "float32", "F", "C", 1.0, 0.0, False, "torch"),
    (200_000, 2048, 8, "float64", "C", "C", 1.0, 0.0, False, "torch"),
]


def _make(cupy, shape, dtype, order, seed):
    """A signed random CuPy array of `shape` in `order` (C, F or T)."""
    rng = cupy.random.default_rng(seed)
    stored = shape[::-1] if order == "T" else shape
    x = rng.standard_normal(stored, dtype=np.float64).astype(dtype)
    if order == "T":
        return x.T
    return cupy.asfortranarray(x) if order == "F" else x


def _views(torch, cupy, xs):
    """torch views of CuPy arrays (same memory)."""
    return [None if x is None else torch.from_dlpack(x) for x in xs]


def table(reps: int, sample_s: float) -> list[dict]:
    import cupy
    import cupy.cublas  # a submodule: not loaded by `import cupy`
    import torch

    import tsm_core
    from tsm_core.bench._random import time_pair
    from tsm_core.tsm2 import api

    def sync():
        cupy.cuda.Device().synchronize()

    rows = []
    for i, (m, k, n, dtype, oa, ob, alpha, beta, has_out, kind) in enumerate(CASES):
        A = _make(cupy, (m, k), dtype, oa, 2 * i)
        B = _make(cupy, (k, n), dtype, ob, 2 * i + 1)
        out0 = _make(cupy, (m, n), dtype, "C", 99) if has_out else None
        outs = [None if out0 is None else out0.copy() for _ in range(3)]
        At, Bt = _views(torch, cupy, (A, B))
        outs_t = _views(torch, cupy, outs)
        ours = (A, B, outs[0]) if kind == "cupy" else (At, Bt, outs_t[0])
        want = alpha * (cupy.asnumpy(A).astype(np.float64) @ cupy.asnumpy(B).astype(np.float64))
        if has_out and beta != 0:
            want += beta * cupy.asnumpy(out0).astype(np.float64)
        for _ in range(2):  # the first call decides, the second is a hit: the one checked
            if has_out:
                outs[0][...] = out0
            C = tsm_core.matmul(*ours[:2], out=ours[2], alpha=alpha, beta=beta)
        got = cupy.asnumpy(cupy.from_dlpack(C) if kind == "torch" else C).astype(np.float64)
        err = float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-300))

        plain = alpha == 1.0 and beta == 0.0

        def f_ours():
            tsm_core.matmul(ours[0], ours[1], out=ours[2], alpha=alpha, beta=beta)

        def f_cupy():
            if plain:
                cupy.matmul(A, B, out=outs[1])
            else:
                C1 = outs[1] if outs[1] is not None else cupy.empty((m, n), dtype)
                cupy.cublas.gemm("N", "N", A, B, out=C1, alpha=alpha,
                                 beta=beta if has_out else 0.0)

        def f_torch():
            o = outs_t[2]
            if plain:
                torch.mm(At, Bt) if o is None else torch.mm(At, Bt, out=o)
            elif o is None:
                torch.empty((m, n), dtype=At.dtype, device=At.device).addmm_(
                    At, Bt, beta=0.0, alpha=alpha)
            else:
                o.addmm_(At, Bt, beta=beta, alpha=alpha)

        t_o, t_c, t_t = time_pair([f_ours, f_cupy, f_torch], sync, reps=reps, sample_s=sample_s)
        rows.append(dict(m=m, k=k, n=n, dtype=dtype, orders=oa + ob, alpha=alpha, beta=beta,
                         out=has_out, kind=kind, t_ours=t_o, t_cupy=t_c, t_torch=t_t,
                         route=api.route_of(*ours[:2], ours[2], alpha, beta), err=err))
    return rows


def print_table(rows) -> None:
    head = (f"{'m x k x n':>22} {'dt':>3} {'ord':>3} {'a,b':>9} {'out':>3} {'kind':>5} "
            f"{'ours':>8} {'cupy':>8} {'torch':>8} {'cupy/ours':>9} {'torch/ours':>10} "
            f"{'route':>14} {'err':>8}")
    print(head)
    print("-" * len(head))
    for r in rows:
        us = 1e6
        print(f"{r['m']:>8}x{r['k']:>6}x{r['n']:>6} {r['dtype'][-2:]:>3} {r['orders']:>3} "
              f"{r['alpha']:>4g},{r['beta']:<4g} {'yes' if r['out'] else 'no':>3} {r['kind']:>5} "
              f"{r['t_ours'] * us:8.2f} {r['t_cupy'] * us:8.2f} {r['t_torch'] * us:8.2f} "
              f"{r['t_cupy'] / r['t_ours']:9.3f} {r['t_torch'] / r['t_ours']:10.3f} "
              f"{str(r['route']):>14} {r['err']:8.1e}")
    for base, kinds in (("cupy", ("cupy",)), ("torch", ("torch",)), ("cupy", ("torch",)),
                        ("torch", ("cupy",))):
        rs = [r[f"t_{base}"] / r["t_ours"] for r in rows if r["kind"] in kinds]
        if rs:
            g = float(np.exp(np.mean(np.log(rs))))
            print(f"{kinds[0]} rows against {base}: geomean {g:.3f}, min {min(rs):.3f}, "
                  f"{sum(x < 0.95 for x in rs)} below 0.95")


def _host_us(fn, n=2000, loops=5) -> float:
    """Host microseconds per call, best of `loops` loops of `n` calls (nothing synchronised
    inside a loop)."""
    for _ in range(50):
        fn()
    best = []
    for _ in range(loops):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        best.append((time.perf_counter() - t0) / n * 1e6)
    return min(best)


def steps() -> None:
    import cupy
    import torch

    import tsm_core
    from tsm_core.tsm2 import api

    print("\nhost us per call, the GPU running behind (best of 5 loops; queue drained between)")
    print(f"{'product':>22} {'key':>6} {'lookup':>6} {'empty':>6} {'direct':>7} {'matmul':>7} "
          f"{'cupy.mm':>7} {'torch.mm':>8}")
    for m, k, n, dtype in [(8, 8, 8, "float32"), (48993, 1, 8, "float64"),
                           (256, 256, 256, "float32")]:
        A = _make(cupy, (m, k), dtype, "C", 1)
        B = _make(cupy, (k, n), dtype, "C", 2)
        At, Bt = _views(torch, cupy, (A, B))
        tsm_core.matmul(A, B)
        key = api.host_key(A, B, None, 1.0, 0.0, "auto")
        d = api._DECISIONS[key]

        def drained(fn):
            r = _host_us(fn)
            cupy.cuda.Device().synchronize()
            return r

        t_key = drained(lambda: api.host_key(A, B, None, 1.0, 0.0, "auto"))
        t_get = drained(lambda: api._DECISIONS.get(key))
        t_empty = drained(lambda: cupy.empty((m, n), dtype))
        t_direct = drained(lambda: api._gemm_direct(d, A, B, None, 1.0, 0.0)) \
            if d.gemm is not None else float("nan")
        t_ours = drained(lambda: tsm_core.matmul(A, B))
        t_cupy = drained(lambda: cupy.matmul(A, B))
        t_torch = drained(lambda: torch.mm(At, Bt))
        print(f"{m:>8}x{k:>6}x{n:>6} {t_key:6.2f} {t_get:6.2f} {t_empty:6.2f} {t_direct:7.2f} "
              f"{t_ours:7.2f} {t_cupy:7.2f} {t_torch:8.2f}   route {api.route_of(A, B)}")


def host_only() -> None:
    from tsm_core.tsm2 import api

    print("host us per call, no GPU (best of 5 loops)")
    A, B = np.ones((8, 8), np.float32), np.ones((8, 8), np.float32)
    t = _host_us(lambda: api.host_key(A, B, None, 1.0, 0.0, "auto"))
    print(f"  host_key, numpy operands:        {t:6.3f}")
    try:
        import torch

        At, Bt = torch.ones(8, 8), torch.ones(8, 8)
        print(f"  host_key, torch CPU operands:    "
              f"{_host_us(lambda: api.host_key(At, Bt, None, 1.0, 0.0, 'auto')):6.3f}")
    except ImportError:
        pass
    key = api.host_key(A, B, None, 1.0, 0.0, "auto")
    table_ = {key: 1}
    print(f"  table lookup (dict.get):         {_host_us(lambda: table_.get(key)):6.3f}")
    print(f"  gemm_args (once per key):        "
          f"{_host_us(lambda: api.gemm_args(8, 8, 8, (32, 4), (32, 4), (32, 4), 4)):6.3f}")

    class Data:
        ptr, device_id = 1 << 40, 0

    class Arr:  # what _gemm_direct reads of a CuPy array
        data = Data()

    lib = (lambda: 0, lambda: 7, lambda dt: 1, lambda shape, dtype: Arr(),
           {"f": lambda *a: None, "d": lambda *a: None}, {"f": (1,), "d": (1,)})
    d = api._Decision(api._R_CUBLAS, m=8, n=8, dtype=np.dtype(np.float32),
                      gemm=api.gemm_args(8, 8, 8, (32, 4), (32, 4), (32, 4), 4), device=0)
    saved = api._GEMM
    api._GEMM = lib
    try:
        a = Arr()
        print(f"  _gemm_direct around a no-op gemm and allocation: "
              f"{_host_us(lambda: api._gemm_direct(d, a, a, None, 1.0, 0.0)):6.3f}")
        d.scaled = True
        print(f"  the same with alpha, beta:       "
              f"{_host_us(lambda: api._gemm_direct(d, a, a, a, 2.0, 0.5)):6.3f}")
    finally:
        api._GEMM = saved


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", action="store_true", help="also the host cost of each step")
    ap.add_argument("--host-only", action="store_true", help="only the steps that need no GPU")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--sample-s", type=float, default=0.002)
    args = ap.parse_args(argv)
    if args.host_only:
        host_only()
        return 0
    from tsm_core import has_gpu

    if not has_gpu():
        print("hostpath_probe: no CUDA GPU found (--host-only runs without one)")
        return 2
    from tsm_core.tsm2 import fastpath

    fastpath.get(wait=True)  # torch's cuBLAS route through the C++ fast path from the start
    rows = table(args.reps, args.sample_s)
    print_table(rows)
    if args.steps:
        steps()
    return 0


if __name__ == "__main__":
    sys.exit(main())
