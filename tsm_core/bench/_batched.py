"""``python -m tsm_core.bench batched --out DIR``: batched irregular GEMM against cuBLAS.

The sweep of the batched-GEMM paper (datasets/irregular.py): twelve (Max_MN, Max_K)
range sets x batch sizes 8 .. 256, float32, seeded; C-ordered torch CUDA tensors,
A (M, K), B (K, N), C (M, N), preallocated outputs, TF32 off. Methods, all on the
same arrays:

- ``loop``: a Python loop of ``torch.mm(a, b, out=c)`` (cuBLAS; the paper's baseline);
- ``graph``: that loop captured once in a CUDA graph, replayed;
- ``grouped``: ``cublasSgemmGroupedBatched`` through ctypes, one group per problem,
  called as ``../shared/anchors/measure_grouped.py`` does (size arrays built per call,
  device pointer arrays prebuilt); ``grouped_prebuilt``: every argument built once;
- ``ours``: ``tsm_core.batched_matmul(As, Bs, Cs)``, the public per-call path (its
  caches are warm after the warm-up, as cuBLAS's heuristics are), with the C++ fast
  path (``tsm_core.batched.native``) where it builds; ``ours_python``: the same call on
  the Python path (identity key, CuPy's launch binding);
- ``ours_prepared``: ``prepare_batched(...).run()``, the batch bound once;
  ``ours_v0_prepared``: the same with kernel version 0 (the ladder's base);
  ``ours_v3_prepared``: version 3 (the five types plus 128 x 64 tiles; ``wide_share``:
  their fraction of the FLOPs); ``ours_v5_prepared``: version 5 (cp.async rings, 128 x
  128 tiles of K >= 128 on the tensor cores, two blocks per SM). The call takes version
  1, 3 or 5 by the cost model of their plans (``model_us``: its time of each);
  ``v3_pays`` / ``v5_pays``: the share rules that chose before the cost model;
  ``ours_v4_prepared``: version 4 (plus 128 x 128 tiles, on request only;
  ``xl_share``: their fraction of the FLOPs);
  ``ours_v2_prepared``: version 2 (float32's tiles of 32 rows or more with K >= 128 on the
  tensor cores, 3xTF32), compared with ``ours_v1_prepared`` in
  ``summary.geomean_dev_v2_vs_v1`` (device time; ``_tc_cells``: the cells where
  ``tc_share`` >= 0.5, those where ``TSM_BATCHED_TC=1`` makes the call choose it).

Two clocks. ``*_ms``: the anchors' method, CUDA events around one call after 3
warm-ups, median of 20, host time included (the GPU idles while Python issues the
work, which is what a caller of a loop or of the grouped call pays); this is the
acceptance figure. ``*_dev_ms``: device time only (``_timing.time_fn``: a spin kernel
holds the stream while the host enqueues, so the events bracket the GPU's own work).

Every method's outputs are checked against a float64 torch product (relative error
per problem, max over the batch). Occupancy, per cell for the version the call
runs: theoretical, from the kernel's registers and shared memory through
``cuOccupancyMaxActiveBlocksPerMultiprocessor`` (every warp of a block counted
alive), and the plan's estimate of the first wave (128-thread tiles retire half
their warps); achieved occupancy needs Nsight Compute (``--only-ours`` runs just our
kernel, for ``ncu``).

``--accuracy`` runs `accuracy_main` instead: the error sweep against cuBLAS and
the batch of one against a graph-replayed ``torch.matmul``.
"""

from __future__ import annotations

import argparse
import ctypes
import glob
import json
import math
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

TOL = 1e-4  # float32 against the float64 product: relative error per problem
ACCEPT = {
    "geomean_speedup_vs_loop": (">=", 15.0),
    "geomean_speedup_vs_best_grouped_or_graph": (">=", 3.0),
    "correctness_failures": ("<=", 0),
}


def build_parser():
    p = argparse.ArgumentParser(prog="python -m tsm_core.bench batched",
                                description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/h100"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true",
                   help="four range sets x batch 8, 64, 256 (a smoke run)")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--no-device-times", action="store_true",
                   help="skip the device-only clock (halves the run time)")
    p.add_argument("--only-ours", action="store_true",
                   help="run only batched_matmul, a few times per cell (for ncu)")
    p.add_argument("--accuracy", action="store_true",
                   help="instead of the sweep: error against cuBLAS's at K up to 8192 "
                        "(float32, float64; every kernel version) and a batch of one "
                        "against a CUDA-graph-replayed torch.matmul (batched_accuracy.json, "
                        "batched_accuracy.png)")
    return p


def _bench(torch, fn, warm=3, rep=20):
    """The anchors' clock: events around one call, median of `rep`, ms."""
    from tsm_core.runtime.timing import call_ms

    return call_ms(fn, warm=warm, rep=rep)


def _cublas():
    """libcublas as loaded by torch (from /proc/self/maps), else from nvidia's wheels."""
    cands = []
    try:
        for line in open("/proc/self/maps"):
            path = line.split()[-1]
            if "libcublas.so" in path and "Lt" not in os.path.basename(path):
                cands.append(path)
    except OSError:
        pass
    try:
        import nvidia

        for p in nvidia.__path__:
            cands += glob.glob(os.path.join(p, "**", "libcublas.so*"), recursive=True)
    except Exception:
        pass
    for c in dict.fromkeys(c for c in cands if "Lt" not in os.path.basename(c)):
        try:
            lib = ctypes.CDLL(c)
            lib.cublasSgemmGroupedBatched  # CUDA 12.5+
            return lib, c
        except Exception:
            continue
    return None, None


class _Grouped:
    """cublasSgemmGroupedBatched for row-major C = A @ B, one group per problem.

    cuBLAS is column-major: row-major C (M, N) is column-major C^T (N, M) = B^T A^T,
    so each problem is called as m = N, n = M, k = K with B first (ld N), A second
    (ld K), C with ld N.
    """

    def __init__(self, torch, lib, As, Bs, Cs):
        self.lib = lib
        self.handle = ctypes.c_void_p(torch.cuda.current_blas_handle())
        lib.cublasSetStream_v2(self.handle, ctypes.c_void_p(torch.cuda.current_stream().cuda_stream))
        self.ms = [c.shape[1] for c in Cs]  # cuBLAS m = our N
        self.ns = [c.shape[0] for c in Cs]  # cuBLAS n = our M
        self.ks = [a.shape[1] for a in As]
        dev = As[0].device
        self.pa = torch.tensor([b.data_ptr() for b in Bs], dtype=torch.int64, device=dev)
        self.pb = torch.tensor([a.data_ptr() for a in As], dtype=torch.int64, device=dev)
        self.pc = torch.tensor([c.data_ptr() for c in Cs], dtype=torch.int64, device=dev)
        self.args = self._args()

    def _args(self):
        g = len(self.ms)
        I = lambda xs: (ctypes.c_int * len(xs))(*xs)  # noqa: E731
        F = lambda xs: (ctypes.c_float * len(xs))(*xs)  # noqa: E731
        return (self.handle, I([0] * g), I([0] * g), I(self.ms), I(self.ns), I(self.ks),
                F([1.0] * g), ctypes.c_void_p(self.pa.data_ptr()), I(self.ms),
                ctypes.c_void_p(self.pb.data_ptr()), I(self.ks), F([0.0] * g),
                ctypes.c_void_p(self.pc.data_ptr()), I(self.ms), ctypes.c_int(g), I([1] * g))

    def per_call(self):
        st = self.lib.cublasSgemmGroupedBatched(*self._args())
        if st != 0:
            raise RuntimeError(f"cublasSgemmGroupedBatched returned {st}")

    def prebuilt(self):
        st = self.lib.cublasSgemmGroupedBatched(*self.args)
        if st != 0:
            raise RuntimeError(f"cublasSgemmGroupedBatched returned {st}")


def _rel_err(torch, Cs, refs):
    worst = 0.0
    for c, r in zip(Cs, refs):
        d = torch.linalg.vector_norm(c.double() - r) / max(torch.linalg.vector_norm(r).item(), 1e-300)
        worst = max(worst, float(d))
    return worst


def _cells(args):
    from tsm_datasets.irregular import BATCH_SIZES, RANGE_SETS, irregular_shapes

    sets, batches = RANGE_SETS, BATCH_SIZES
    if args.quick:
        sets = ((128, 128), (512, 128), (512, 512), (1024, 256))
        batches = (8, 64, 256)
    return [(mn, k, b, irregular_shapes(mn, k, b, seed=args.seed)) for mn, k in sets
            for b in batches]


def cell_tensors(torch, mn, mk, bs, shapes, seed=0):
    """One cell's operands as the bench makes them (seeded per cell, C-ordered float32
    torch CUDA tensors) and its outputs poisoned with NaN: As, Bs, Cs. Other
    measurements use it, so that they time the bench's own batches."""
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev)
    gen.manual_seed(seed * 1000003 + mn * 7919 + mk * 31 + bs)
    As = [torch.randn(m, k, device=dev, generator=gen) for m, n, k in shapes]
    Bs = [torch.randn(k, n, device=dev, generator=gen) for m, n, k in shapes]
    Cs = [torch.full((m, n), float("nan"), device=dev) for m, n, k in shapes]
    return As, Bs, Cs


def checked_run(torch, prep, Cs, refs, label):
    """One run of a prepared batch on outputs poisoned with NaN, checked against the
    float64 products `refs`: (relative error, whether within TOL); prints a WRONG line
    when not. Other measurements use it before timing a batch."""
    for c in Cs:
        c.fill_(float("nan"))
    prep.run()
    torch.cuda.synchronize()
    err = _rel_err(torch, Cs, refs)
    ok = err <= TOL
    if not ok:
        print(f"  WRONG: {label} rel err {err:.2e}", flush=True)
    return err, ok


def _geomean(xs):
    xs = [x for x in xs if x and x > 0 and math.isfinite(x)]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def main(command: str, argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    from tsm_core.runtime.arrays import has_gpu

    if not has_gpu():
        print("tsm_core.bench batched needs a CUDA GPU; found none", file=sys.stderr)
        return 2
    if args.accuracy:
        return accuracy_main(args, argv)
    import cupy
    import torch

    import tsm_core
    from tsm_core.batched import api as _batched
    from tsm_core.batched import cost as _cost
    from tsm_core.batched import launch as _launch
    from tsm_core.batched import plan as _plan
    from tsm_core.runtime import compile as _compile
    from tsm_core.runtime import device as _device
    from tsm_core.runtime import timing as _timing
    from tsm_core.runtime.launch import func_ptr

    torch.backends.cuda.matmul.allow_tf32 = False
    lib, libpath = _cublas()
    kern = _compile.get_kernel(_plan.FAMILY, _launch.name_expr(np.float32))
    regs, smem = _launch.func_attrs(_launch.name_expr(np.float32))
    from cupy.cuda import driver

    blocks = driver.occupancyMaxActiveBlocksPerMultiprocessor(func_ptr(kern), 256, 0)
    max_warps = _device.attribute("MaxThreadsPerMultiProcessor", 0) // 32
    theo = blocks * 8 / max_warps
    print(f"kernel: {regs} registers, {smem} B shared, {blocks} blocks/SM -> theoretical "
          f"occupancy {theo:.0%}; cuBLAS grouped: {libpath}", flush=True)

    occ_by_version = {}
    # The C++ fast path of torch calls (tsm_core.batched.native), built here if needed,
    # before any timing; `ours_python` times the per-call path without it.
    native = [_batched._native()]
    from tsm_core.batched import native as _native

    native_status = dict(_native.status(), c10_streams=bool(_launch._C10_STREAMS
                                                            and _launch._C10_STREAMS[0]),
                         graphs=bool(_launch._GRAPHS and _launch._GRAPHS[0]))
    print(f"C++ fast path: {'loaded' if native[0] is not None else native_status['error']}"
          f" (device and stream through c10: {native_status['c10_streams']}; launches through"
          f" CUDA graphs: {native_status['graphs']})", flush=True)

    def occupancy(launch):
        """Theoretical occupancy of a launch's kernel (its dynamic shared memory too)."""
        v = launch.version
        if v not in occ_by_version:
            b = driver.occupancyMaxActiveBlocksPerMultiprocessor(launch.fptr, 256, launch.shmem)
            occ_by_version[v] = b * 8 / max_warps
        return occ_by_version[v]

    rows, failures = [], 0
    for mn, mk, bs, shapes in _cells(args):
        As, Bs, Cs = cell_tensors(torch, mn, mk, bs, shapes, args.seed)
        flops = sum(2 * m * n * k for m, n, k in shapes)
        plan = _batched.plan_batched(shapes, np.float32)
        row = dict(max_mn=mn, max_k=mk, batch=bs, gflop=flops / 1e9, tiles=plan.n_tiles,
                   tile_types=plan.histogram(), tlp_steps=len(plan.history) - 1,
                   wave_occupancy_est=plan.wave_occupancy, theoretical_occupancy=theo)
        ours = lambda: tsm_core.batched_matmul(As, Bs, Cs)  # noqa: E731
        if args.only_ours:
            for _ in range(3):
                ours()
            torch.cuda.synchronize()
            rows.append(row)
            continue
        refs = [a.double() @ b.double() for a, b in zip(As, Bs)]
        prep = _batched.prepare_batched(As, Bs, Cs)
        loop = lambda: [torch.mm(a, b, out=c) for a, b, c in zip(As, Bs, Cs)]  # noqa: E731
        prep0 = _batched.prepare_batched(As, Bs, Cs, version=0)  # the ladder's base
        prep1 = _batched.prepare_batched(As, Bs, Cs, version=1)
        prep2 = _batched.prepare_batched(As, Bs, Cs, version=2)  # tensor cores (K >= 128)
        prep3 = _batched.prepare_batched(As, Bs, Cs, version=3)  # with 128 x 64 tiles
        prep4 = _batched.prepare_batched(As, Bs, Cs, version=4)  # and 128 x 128
        prep5 = _batched.prepare_batched(As, Bs, Cs, version=5)  # tensor cores, cp.async
        row["ours_version"] = prep._launch.version
        # The plan and occupancy of the version the call runs.
        row.update(tiles=prep.plan.n_tiles, tile_types=prep.plan.histogram(),
                   tlp_steps=len(prep.plan.history) - 1,
                   wave_occupancy_est=prep.plan.wave_occupancy,
                   theoretical_occupancy=occupancy(prep._launch))
        row["split_problems"] = prep.plan.split_problems  # problems split in k
        row["wide_share"] = _cost.plan_type_share(prep3.plan, _plan.WIDE_TYPE)
        row["v3_pays"] = bool(_cost.wide_pays(prep3.plan))
        row["v5_pays"] = bool(_cost.tc3_pays(prep5.plan))
        row["xl_share"] = _cost.plan_type_share(prep4.plan, _plan.XL_TYPE)
        row["tc_share"] = _cost.tc_share(shapes)
        row["model_us"] = {v: _cost.plan_cost(p.plan) for v, p in ((1, prep1), (3, prep3),
                                                                    (5, prep5))}
        methods = {"ours": ours, "ours_prepared": prep.run, "ours_v0_prepared": prep0.run,
                   "ours_v1_prepared": prep1.run, "ours_v2_prepared": prep2.run,
                   "ours_v3_prepared": prep3.run, "ours_v4_prepared": prep4.run,
                   "ours_v5_prepared": prep5.run, "loop": loop}
        if native[0] is not None:  # timed with the fast path switched off (below)
            methods["ours_python"] = ours
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(2):
                loop()
        torch.cuda.current_stream().wait_stream(s)
        with torch.cuda.graph(g):
            loop()
        methods["graph"] = g.replay
        if lib is not None:
            grp = _Grouped(torch, lib, As, Bs, Cs)
            methods["grouped"] = grp.per_call
            methods["grouped_prebuilt"] = grp.prebuilt
        for name, fn in methods.items():
            for c in Cs:
                c.fill_(float("nan"))
            if name == "ours_python":  # the per-call path without the C++ fast path
                _batched._use_native(None)
            try:
                fn()
                torch.cuda.synchronize()
                err = _rel_err(torch, Cs, refs)
                row[f"{name}_err"] = err
                if not err <= TOL:
                    failures += 1
                    print(f"  WRONG: {name} rel err {err:.2e}", flush=True)
                row[f"{name}_ms"] = _bench(torch, fn, rep=args.reps)
                if not args.no_device_times:
                    t = _timing.time_fn(fn, reps=args.reps, max_time_s=0.5)
                    row[f"{name}_dev_ms"] = t.median_s * 1e3
                    row[f"{name}_host_ms"] = t.host_s * 1e3
            except Exception as exc:  # a baseline that fails is reported, not fatal
                row[f"{name}_error"] = f"{type(exc).__name__}: {exc}"
                print(f"  {name} failed: {row[f'{name}_error']}", flush=True)
                if name.startswith("ours"):
                    failures += 1
            finally:
                if name == "ours_python":
                    _batched._use_native(native[0])
        best = min(row.get(k, math.inf) for k in ("graph_ms", "grouped_ms"))
        row["speedup_vs_loop"] = row["loop_ms"] / row["ours_ms"]
        row["speedup_vs_best"] = best / row["ours_ms"]
        row["ours_gflops"] = flops / row["ours_ms"] / 1e6
        if "ours_prepared_dev_ms" in row:
            row["ours_dev_gflops"] = flops / row["ours_prepared_dev_ms"] / 1e6
            bestd = min(row.get(k, math.inf) for k in ("graph_dev_ms", "grouped_prebuilt_dev_ms"))
            row["dev_speedup_vs_best"] = bestd / row["ours_prepared_dev_ms"]
        rows.append(row)
        # One line per cell as it completes: a run cut short still leaves its cells.
        args.out.mkdir(parents=True, exist_ok=True)
        with open(args.out / "batched.partial.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")
        print(f"MN<={mn:4d} K<={mk:3d} bs={bs:3d} {flops / 1e9:6.2f} GFLOP  ours "
              f"{row['ours_ms']:.3f} ms ({row['ours_gflops']:.0f} GFLOP/s) py "
              f"{row.get('ours_python_ms', float('nan')):.3f} prep "
              f"{row.get('ours_prepared_ms', float('nan')):.3f}  loop {row['loop_ms']:.3f} graph "
              f"{row['graph_ms']:.3f} grouped {row.get('grouped_ms', float('nan')):.3f} "
              f"({row.get('grouped_prebuilt_ms', float('nan')):.3f})  x{row['speedup_vs_loop']:.1f}"
              f" / x{row['speedup_vs_best']:.2f}"
              + (f"  dev: ours {row.get('ours_prepared_dev_ms', 0):.3f} (host "
                 f"{row.get('ours_host_ms', 0):.3f}) grp "
                 f"{row.get('grouped_prebuilt_dev_ms', float('nan')):.3f} graph "
                 f"{row.get('graph_dev_ms', 0):.3f}" if not args.no_device_times else ""),
              flush=True)
        del As, Bs, Cs, refs, prep, prep0, prep1, prep2, prep3, prep4, prep5, g, methods
    summary = {}
    if not args.only_ours:
        summary = dict(
            cells=len(rows),
            geomean_speedup_vs_loop=_geomean([r["speedup_vs_loop"] for r in rows]),
            geomean_speedup_vs_best_grouped_or_graph=_geomean([r["speedup_vs_best"] for r in rows]),
            geomean_speedup_vs_grouped=_geomean([r["grouped_ms"] / r["ours_ms"] for r in rows
                                                 if "grouped_ms" in r]),
            geomean_speedup_vs_graph=_geomean([r["graph_ms"] / r["ours_ms"] for r in rows]),
            # The per-call path without the C++ fast path.
            geomean_python_path_vs_loop=_geomean([r["loop_ms"] / r["ours_python_ms"]
                                                  for r in rows if "ours_python_ms" in r]),
            geomean_python_path_vs_best=_geomean([min(r.get("graph_ms", math.inf),
                                                      r.get("grouped_ms", math.inf))
                                                  / r["ours_python_ms"]
                                                  for r in rows if "ours_python_ms" in r]),
            geomean_prepared_vs_best=_geomean([min(r.get("graph_ms", math.inf),
                                                   r.get("grouped_ms", math.inf))
                                               / r["ours_prepared_ms"] for r in rows]),
            geomean_prepared_vs_loop=_geomean([r["loop_ms"] / r["ours_prepared_ms"] for r in rows]),
            min_speedup_vs_best=min(r["speedup_vs_best"] for r in rows),
            geomean_dev_speedup_vs_best=_geomean([r.get("dev_speedup_vs_best") for r in rows]),
            ours_gflops_max=max(r["ours_gflops"] for r in rows),
            # Version 2 (tensor cores where K >= 128) against version 1, both prepared,
            # device time: over every cell, and over the cells where it would be chosen.
            geomean_dev_v2_vs_v1=_geomean([r.get("ours_v1_prepared_dev_ms", math.nan)
                                           / r.get("ours_v2_prepared_dev_ms", math.nan)
                                           for r in rows]),
            geomean_dev_v2_vs_v1_tc_cells=_geomean(
                [r.get("ours_v1_prepared_dev_ms", math.nan) / r.get("ours_v2_prepared_dev_ms", math.nan)
                 for r in rows if r["tc_share"] >= 0.5]),
            # Versions 3 (with 128 x 64 tiles) and 4 (and 128 x 128) against version 1,
            # the same way; for 3, also the cells where the call chose it.
            geomean_dev_v3_vs_v1=_geomean([r.get("ours_v1_prepared_dev_ms", math.nan)
                                           / r.get("ours_v3_prepared_dev_ms", math.nan)
                                           for r in rows]),
            geomean_dev_v4_vs_v1=_geomean([r.get("ours_v1_prepared_dev_ms", math.nan)
                                           / r.get("ours_v4_prepared_dev_ms", math.nan)
                                           for r in rows]),
            geomean_dev_v5_vs_v1=_geomean([r.get("ours_v1_prepared_dev_ms", math.nan)
                                           / r.get("ours_v5_prepared_dev_ms", math.nan)
                                           for r in rows]),
            # Version 5 where the call chose it, against the version it would have
            # taken before (3 where wide_pays, else 1).
            geomean_dev_v5_chosen_vs_before=_geomean(
                [r.get("ours_v3_prepared_dev_ms" if r.get("v3_pays") else "ours_v1_prepared_dev_ms",
                       math.nan) / r.get("ours_v5_prepared_dev_ms", math.nan)
                 for r in rows if r.get("ours_version") == 5]),
            geomean_dev_v3_vs_v1_chosen=_geomean(
                [r.get("ours_v1_prepared_dev_ms", math.nan) / r.get("ours_v3_prepared_dev_ms", math.nan)
                 for r in rows if r.get("ours_version") == 3]),
            correctness_failures=failures,
        )
        acc = {}
        for k, (op, thr) in ACCEPT.items():
            v = summary[k]
            acc[k] = dict(value=v, op=op, threshold=thr,
                          **{"pass": bool(v >= thr if op == ">=" else v <= thr)})
        summary["acceptance"] = acc
        # The same thresholds for the prepared batch (bound once, launched per call):
        # the like-for-like form against the graph (captured once, replayed) and the
        # grouped call (its device pointer arrays built once). The per-call path
        # above also re-checks every array of the batch on every call.
        summary["acceptance_prepared"] = {
            k: dict(value=v, op=">=", threshold=thr, **{"pass": bool(v >= thr)})
            for k, v, thr in (("geomean_prepared_vs_loop", summary["geomean_prepared_vs_loop"],
                               ACCEPT["geomean_speedup_vs_loop"][1]),
                              ("geomean_prepared_vs_best", summary["geomean_prepared_vs_best"],
                               ACCEPT["geomean_speedup_vs_best_grouped_or_graph"][1]))}
    doc = dict(sweep="batched", command="python -m tsm_core.bench batched " + " ".join(argv),
               environment=dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__,
                                cupy=cupy.__version__, python=platform.python_version(),
                                cublas=libpath, native_fast_path=native_status,
                                when=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())),
               kernel=dict(registers=regs, smem_bytes=smem, blocks_per_sm=blocks,
                           theoretical_occupancy=theo,
                           theoretical_occupancy_by_version=occ_by_version,
                           note="registers, shared memory and theoretical occupancy of "
                                "version 1; by version: of each version the call ran "
                                "(cuOccupancyMaxActiveBlocksPerMultiprocessor), not measured; "
                                "rows: the version the call ran"),
               tolerance=TOL, rows=rows, summary=summary)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "batched.json"
    path.write_text(json.dumps(doc, indent=1))
    print(f"wrote {path}")
    if rows and not args.only_ours:
        for p in plot(doc, args.out):
            print(f"wrote {p}")
        for title, key in (("acceptance (per call)", "acceptance"),
                           ("the same for the prepared batch", "acceptance_prepared")):
            print(f"== {title} ==")
            for k, a in summary[key].items():
                print(f"{k}: {a['value']:.3f} {a['op']} {a['threshold']}  "
                      f"{'PASS' if a['pass'] else 'FAIL'}")
    return 0 if failures == 0 else 1


def plot(doc, out_dir) -> list[Path]:
    """batched_speedup.png (speedup over the loop and over the best of grouped/graph,
    per range set against batch size) and batched_gflops.png."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    rows = doc["rows"]
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    sets = sorted({(r["max_mn"], r["max_k"]) for r in rows})
    paths = []
    fig = Figure(figsize=(12, 4.5))
    FigureCanvasAgg(fig)
    axs = fig.subplots(1, 3)
    for mn, mk in sets:
        rs = sorted((r for r in rows if (r["max_mn"], r["max_k"]) == (mn, mk)),
                    key=lambda r: r["batch"])
        b = [r["batch"] for r in rs]
        axs[0].plot(b, [r["speedup_vs_loop"] for r in rs], marker="o", label=f"{mn}/{mk}")
        axs[1].plot(b, [r["speedup_vs_best"] for r in rs], marker="o", label=f"{mn}/{mk}")
        axs[2].plot(b, [r["ours_gflops"] for r in rs], marker="o", label=f"{mn}/{mk}")
    for ax, t in zip(axs, ("speedup over cuBLAS loop", "speedup over best(grouped, graph)",
                           "batched_matmul GFLOP/s (host incl.)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("batch size")
        ax.set_title(t, fontsize=10)
        ax.grid(alpha=0.3)
    axs[0].set_yscale("log")
    axs[1].axhline(3.0, color="k", lw=0.8, ls="--")
    axs[0].axhline(15.0, color="k", lw=0.8, ls="--")
    axs[2].legend(fontsize=6, title="Max_MN/Max_K", title_fontsize=7)
    fig.suptitle(f"Batched irregular GEMM, fp32, {doc['environment'].get('gpu', '')}")
    fig.tight_layout()
    p = Path(out_dir) / "batched_speedup.png"
    fig.savefig(p, dpi=110)
    paths.append(p)
    return paths


# ------------------------------------------------------------------ --accuracy

ACC_K = (64, 256, 1024, 4096, 8192)
ACC_SAMPLE = 48  # rows and columns of each C checked against the extended-precision product
ACC_ACCEPT = 2.0  # our error at most this multiple of cuBLAS's, problem by problem (floor: eps)
ONE_ROUNDS = 5  # alternated rounds of the batch-of-one timings
# The batch of one against a graph-replayed torch.mm: where both are the same cuBLAS
# call, what is measured is the clock's resolution: replays of one kernel differed by
# up to 1% between separate timings on the H100 (0.991-1.003 on 2026-11-28, same
# kernel both sides), so "never slower" is read as not below 0.99.
ONE_ACCEPT = 0.99
ONE_SHAPES = ((64, 64, 64), (700, 700, 300), (1000, 64, 4096), (2048, 2048, 2048),
              (4096, 4096, 4096))


def accuracy_shapes(K, rng):
    """Mixed problems of one K: eight of M, N log-uniform over [1, 1024], a 512 x 512,
    and at K = 4096 the 4096 x 4096 one (the case measured at 12x cuBLAS's error)."""
    mn = np.exp(rng.uniform(0, math.log(1024), size=(8, 2))).astype(int) + 1
    shapes = [(int(m), int(n), K) for m, n in mn] + [(512, 512, K)]
    if K == 4096:
        shapes.append((4096, 4096, 4096))
    return shapes


def sampled_error(C, A, B, rows, cols):
    """max |C - ref| / max |ref| over the sampled rows x cols of C, ref in long double
    (numpy's extended precision: 64-bit significands on x86, so that float64
    results are measured against something more precise than themselves)."""
    a = A[rows].astype(np.longdouble)
    b = B[:, cols].astype(np.longdouble)
    ref = a @ b
    d = np.abs(C[np.ix_(rows, cols)].astype(np.longdouble) - ref).max()
    scale = np.abs(ref).max()
    return float(d / scale) if scale else float(d)


def accuracy_main(args, argv) -> int:
    """``--accuracy``: per dtype and K, our max relative error (the automatic choice
    and every kernel version) against cuBLAS's on the same data; a batch of one
    against a graph-replayed ``torch.matmul``. Writes batched_accuracy.json and .png."""
    import cupy
    import torch

    import tsm_core
    from tsm_core.batched import api as _batched
    from tsm_core.batched import launch as _launch
    from tsm_core.batched import plan as _plan
    from tsm_core.runtime import timing as _timing

    torch.backends.cuda.matmul.allow_tf32 = False
    rng = np.random.default_rng(args.seed)
    dev = cupy.cuda.runtime.getDevice()
    rows = []
    for dtype in (np.float32, np.float64):
        versions = ["auto", 1, 2]
        if dtype == np.float32:
            versions += [3, 4]
            if _launch.tensor_cores_ok(dev):
                versions.append(5)
            if _launch.wgmma_ok():
                versions.append(6)
        for K in ACC_K:
            shapes = accuracy_shapes(K, rng)
            As = [rng.standard_normal((m, k)).astype(dtype) for m, n, k in shapes]
            Bs = [rng.standard_normal((k, n)).astype(dtype) for m, n, k in shapes]
            picks = [(rng.choice(m, min(m, ACC_SAMPLE), replace=False),
                      rng.choice(n, min(n, ACC_SAMPLE), replace=False)) for m, n, _ in shapes]
            dA = [cupy.asarray(a) for a in As]
            dB = [cupy.asarray(b) for b in Bs]

            def errors(Cs):
                return [sampled_error(cupy.asnumpy(c), a, b, r, q)
                        for c, a, b, (r, q) in zip(Cs, As, Bs, picks)]

            theirs = errors([cupy.matmul(a, b) for a, b in zip(dA, dB)])
            row = dict(dtype=np.dtype(dtype).name, K=K, shapes=shapes, cublas_err=theirs,
                       cublas_max=max(theirs), versions={})
            for v in versions:
                dC = [cupy.full((m, n), np.nan, dtype) for m, n, _ in shapes]
                if v == "auto":
                    tsm_core.batched_matmul(dA, dB, dC)
                    chosen = _batched._lru_get(_batched._metas,
                                               _batched._key(dA, dB, dC, "cupy")).version
                else:
                    _batched.prepare_batched(dA, dB, dC, version=v).run()
                    chosen = v
                ours = errors(dC)
                # Per problem, errors below one unit of round-off of max |C| (eps)
                # count as one unit: there a factor of 2 is chance (at K = 64, a
                # problem's cuBLAS error can be a tenth of a unit).
                unit = float(np.finfo(dtype).eps)
                ratio = [o / max(t, unit) for o, t in zip(ours, theirs)]
                row["versions"][str(v)] = dict(err=ours, max=max(ours), ratio=ratio,
                                               max_ratio=max(ratio), version=chosen)
                print(f"{row['dtype']} K={K} version {v} ({chosen}): max err {max(ours):.2e} "
                      f"(cuBLAS {max(theirs):.2e}), worst ratio {max(ratio):.2f}", flush=True)
            rows.append(row)
            del dA, dB
            cupy.get_default_memory_pool().free_all_blocks()

    # A batch of one against torch.matmul, both captured in a CUDA graph and replayed
    # (device time of the work itself), and per call (host included).
    ones = []
    for m, n, k in ONE_SHAPES:
        A = torch.randn(m, k, device="cuda")
        B = torch.randn(k, n, device="cuda")
        C = torch.empty(m, n, device="cuda")

        def mm():
            torch.mm(A, B, out=C)

        def ours():
            tsm_core.batched_matmul([A], [B], [C])

        graphs = {}
        for name, fn in (("cublas", mm), ("ours", ours)):
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for _ in range(3):
                    fn()
            torch.cuda.current_stream().wait_stream(s)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                fn()
            graphs[name] = g
        key = _batched._key([A], [B], [C], "torch")
        L = _batched._lru_get(_batched._metas, key)
        # Alternated rounds (each a median of args.reps), the median round: a drift
        # of the clock or a neighbour's burst falls on both alike.
        t = {name: [] for name in ("graph_cublas_ms", "graph_ours_ms", "call_cublas_ms",
                                   "call_ours_ms")}
        for _ in range(ONE_ROUNDS):
            t["graph_cublas_ms"].append(_timing.call_ms(graphs["cublas"].replay, rep=args.reps))
            t["graph_ours_ms"].append(_timing.call_ms(graphs["ours"].replay, rep=args.reps))
            t["call_cublas_ms"].append(_timing.call_ms(mm, rep=args.reps))
            t["call_ours_ms"].append(_timing.call_ms(ours, rep=args.reps))
        r = dict(shape=(m, n, k), route=str(getattr(L, "version", "fast path")),
                 **{name: float(np.median(v)) for name, v in t.items()})
        r["graph_speedup"] = r["graph_cublas_ms"] / r["graph_ours_ms"]
        r["call_speedup"] = r["call_cublas_ms"] / r["call_ours_ms"]
        ones.append(r)
        print(f"batch of one {m}x{n}x{k} ({r['route']}): graph {r['graph_speedup']:.3f}x, "
              f"per call {r['call_speedup']:.3f}x of torch.mm", flush=True)
        torch.cuda.empty_cache()

    auto = [r["versions"]["auto"]["max_ratio"] for r in rows]
    summary = dict(
        worst_ratio_auto=max(auto),
        worst_ratio_by_version={str(v): max(r["versions"][str(v)]["max_ratio"] for r in rows
                                            if str(v) in r["versions"])
                                for v in ("auto", 1, 2, 3, 4, 5, 6)
                                if any(str(v) in r["versions"] for r in rows)},
        min_graph_speedup_one=min(o["graph_speedup"] for o in ones),
        acceptance=dict(
            error_vs_cublas=dict(value=max(auto), op="<=", threshold=ACC_ACCEPT,
                                 **{"pass": max(auto) <= ACC_ACCEPT}),
            batch_of_one_graph=dict(value=min(o["graph_speedup"] for o in ones), op=">=",
                                    threshold=ONE_ACCEPT,
                                    **{"pass": min(o["graph_speedup"] for o in ones) >= ONE_ACCEPT})))
    doc = dict(sweep="batched_accuracy", command="python -m tsm_core.bench batched " +
               " ".join(argv),
               environment=dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__,
                                cupy=cupy.__version__, python=platform.python_version(),
                                when=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())),
               method=("per problem, max |C - ref| / max |ref| over a sample of "
                       f"{ACC_SAMPLE} rows x {ACC_SAMPLE} columns, ref in numpy long double; "
                       "cuBLAS: cupy.matmul on the same arrays (TF32 off); ratio: ours / "
                       "cuBLAS's per problem; batch of one: torch CUDA graphs of one call "
                       "each, replay timed (median of reps), and per call with host time"),
               rows=rows, batch_of_one=ones, summary=summary,
               kernel_versions=dict(tc3=_plan.TC3_VERSION, wgmma=_plan.WG3_VERSION))
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "batched_accuracy.json"
    path.write_text(json.dumps(doc, indent=1, default=int))
    print(f"wrote {path}")
    print(f"wrote {plot_accuracy(doc, args.out)}")
    for k, a in summary["acceptance"].items():
        print(f"{k}: {a['value']:.3f} {a['op']} {a['threshold']}  "
              f"{'PASS' if a['pass'] else 'FAIL'}")
    return 0


def plot_accuracy(doc, out_dir) -> Path:
    """batched_accuracy.png: per dtype, the worst ratio of our error to cuBLAS's against
    K for each version; the batch of one's speed over torch.matmul."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(13, 4.2))
    FigureCanvasAgg(fig)
    axs = fig.subplots(1, 3)
    for ax, dt in zip(axs, ("float32", "float64")):
        rs = sorted((r for r in doc["rows"] if r["dtype"] == dt), key=lambda r: r["K"])
        vs = sorted({v for r in rs for v in r["versions"]}, key=str)
        for v in vs:
            pts = [(r["K"], r["versions"][v]["max_ratio"]) for r in rs if v in r["versions"]]
            ax.plot(*zip(*pts), marker="o", lw=2.5 if v == "auto" else 1,
                    label=f"version {v}")
        ax.axhline(ACC_ACCEPT, color="k", lw=0.8, ls="--")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("K")
        ax.set_ylabel("our error / cuBLAS's (worst problem)")
        ax.set_title(f"{dt}: error against cuBLAS's", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    ones = doc["batch_of_one"]
    x = np.arange(len(ones))
    axs[2].bar(x - 0.2, [o["graph_speedup"] for o in ones], 0.4, label="graph replay")
    axs[2].bar(x + 0.2, [o["call_speedup"] for o in ones], 0.4, label="per call (host incl.)")
    axs[2].axhline(1.0, color="k", lw=0.8, ls="--")
    axs[2].set_xticks(x, ["x".join(map(str, o["shape"])) for o in ones], rotation=30,
                      fontsize=7)
    axs[2].set_title("batch of one: speed over torch.mm", fontsize=10)
    axs[2].legend(fontsize=7)
    fig.suptitle(f"batched_matmul accuracy and the batch of one, {doc['environment']['gpu']}")
    fig.tight_layout()
    p = Path(out_dir) / "batched_accuracy.png"
    fig.savefig(p, dpi=110)
    return p
