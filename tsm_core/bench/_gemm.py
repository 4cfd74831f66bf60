"""``python -m tsm_core.bench gemm|strassen``: tsm_core's tiled GEMM and fused Strassen
against cuBLAS SGEMM (TF32 off).

- ``gemm``: square N = 256 ... 16384 (with 1023/1025-style neighbours to expose
  cliffs) and a few rectangular shapes: TFLOP/s of ``tsm_core.gemm`` and of
  ``cupy.matmul`` (cuBLAS), their ratio, the cliff check over 1024 <= N <= 4096;
- ``strassen``: square N = 1024 ... 16384 and an odd size: cuBLAS, ``gemm``,
  ``strassen(levels=1)`` and ``strassen(levels=2)``: effective TFLOP/s (2 N^3 / t,
  as the paper counts), speedup over cuBLAS, the crossover N, and the relative
  error of each method against a float64 reference;
- ``strassen --acceptance``: the default, ``strassen(levels="auto")``, against cuBLAS
  at N in {1024, 2048, 3000, 4096, 5001, 8192, 12288, 16384} and three rectangular
  shapes, float32 and float64, with levels 0, 1 and 2 beside it and the level the
  model picked: pass if auto is never below 0.98x of cuBLAS and float32 reaches
  1.10x at 16384. Writes ``strassen_acceptance.json`` and ``.png``.

How a number is made: random signed normal operands (seeded), C-ordered; small
problems cycle through several operand sets so that they are not timed from L2;
every method writes a preallocated out; each method's result is checked once against
the float64 reference with out NaN-poisoned first; times are CUDA-event medians
(``_timing.time_fn``). FLOPs = 2 m n k. cuBLAS is ``cupy.matmul`` with CUPY_TF32 unset
or 0 (cuBLAS then computes in plain FP32, CUBLAS_COMPUTE_32F); the run refuses
CUPY_TF32=1. Writes ``<out>/<command>.json`` and a PNG, prints a table last.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from pathlib import Path

import numpy as np

SQUARE = [256, 512, 768, 1023, 1024, 1025, 1536, 2047, 2048, 2049, 2560, 3072, 3583, 3584,
          4095, 4096, 4097, 6144, 8192, 12288, 16384]
SQUARE_QUICK = [512, 1024, 1025, 2047, 2048, 4096, 8192]
RECT = [(8192, 1024, 8192), (1024, 8192, 1024), (16384, 2048, 4096), (3000, 5000, 7000),
        (4096, 16384, 512)]
STRASSEN_N = [1024, 2048, 4096, 6144, 8192, 8191, 12288, 16384]
STRASSEN_QUICK = [2048, 4096, 8192, 16384]
ACCEPT_N = [1024, 2048, 3000, 4096, 5001, 8192, 12288, 16384]
ACCEPT_RECT = [(8192, 2048, 16384), (16384, 8192, 16384), (12288, 16384, 8192)]
ACCEPT_FLOOR = 0.98   # auto never below this fraction of cuBLAS's speed
ACCEPT_16384 = 1.10   # and float32 at least this at N = 16384
TOL = {"float32": 1e-4, "float64": 1e-12}
GEMM_FRAC = 0.85  # acceptance: gemm >= 85% of cuBLAS at N >= 2048
CLIFF = 0.15  # no size in [1024, 4096] more than 15% below its neighbours


def _parser(command):
    p = argparse.ArgumentParser(prog=f"python -m tsm_core.bench {command}")
    p.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    p.add_argument("--sizes", type=int, nargs="+", help="square sizes (default: the sweep's)")
    p.add_argument("--no-rect", action="store_true", help="gemm: skip the rectangular shapes")
    p.add_argument("--quick", action="store_true", help="a reduced list of sizes")
    p.add_argument("--reps", type=int, default=15)
    p.add_argument("--out", default=None, help="output directory (default benchmarks/results/<gpu>)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-plot", action="store_true")
    p.add_argument("--variants", action="store_true",
                   help="also time each tile kernel alone, and Strassen at one block per SM")
    if command == "strassen":
        p.add_argument("--acceptance", action="store_true",
                       help="levels='auto' (the default) vs cuBLAS and levels 0/1/2 at the "
                            "acceptance sizes, float32 and float64 (--dtype ignored; --sizes "
                            "replaces the square sizes, --no-rect drops the rectangular ones)")
        p.add_argument("--dtypes", nargs="+", choices=("float32", "float64"),
                       default=["float32", "float64"], help="--acceptance: the dtypes")
    return p


def _rel_err(cupy, C, ref) -> float:
    d = C.astype(cupy.float64) - ref
    den = float(cupy.linalg.norm(ref.ravel()))
    return float(cupy.linalg.norm(d.ravel())) / (den if den > 0 else 1.0)


def _measure(cupy, timing, m, k, n, dtype, methods, seed, reps):
    """Check each method once (out poisoned) against float64, then time it."""
    rng = cupy.random.default_rng(seed)
    item = np.dtype(dtype).itemsize
    per_set = (m * k + k * n + m * n) * item
    nsets = timing.sets_needed(per_set, timing.l2_size())

    def make(_):
        A = rng.standard_normal((m, k), dtype=np.float64).astype(dtype)
        B = rng.standard_normal((k, n), dtype=np.float64).astype(dtype)
        return A, B, cupy.empty((m, n), dtype=dtype)

    sets = [make(i) for i in range(nsets)]
    A0, B0, C0 = sets[0]
    ref = cupy.matmul(A0.astype(cupy.float64), B0.astype(cupy.float64))
    rec = dict(m=m, k=k, n=n, dtype=dtype, flops=2 * m * n * k, sets=nsets, methods={})
    for name, fn in methods.items():
        r = {}
        try:
            C0.fill(cupy.nan)
            fn(A0, B0, C0)
            r["rel_err"] = _rel_err(cupy, C0, ref)
            r["correct"] = bool(r["rel_err"] <= TOL[dtype])
            if not r["correct"]:
                print(f"!! WRONG RESULT {name} {m}x{k}x{n}: {r['rel_err']:.3g}", file=sys.stderr)
            t = timing.time_fn(timing.cycling(fn, sets), reps=reps, max_time_s=2.0)
            r.update(t.to_dict())
            r["tflops"] = 2 * m * n * k / t.median_s / 1e12
        except Exception as e:  # one failing method must not cost the rest
            r["error"] = f"{type(e).__name__}: {e}"
            print(f"!! {name} {m}x{k}x{n}: {r['error']}", file=sys.stderr, flush=True)
        rec["methods"][name] = r
    del sets, A0, B0, C0, ref
    cupy.get_default_memory_pool().free_all_blocks()
    return rec


def _gemm_methods(cupy, variants):
    import tsm_core
    from tsm_core.tiled import configs as _configs, launch as _launch

    ms = {"gemm": lambda A, B, C: tsm_core.gemm(A, B, out=C),
          "cublas": lambda A, B, C: cupy.matmul(A, B, out=C)}
    if variants:  # each tile kernel alone on the whole problem: no peeling, no split-K
        ms["tiled_v1"] = lambda A, B, C: _launch._launch_gemm(A, B, C, 1.0, 0.0, split=False)
        ms["wide_v1"] = lambda A, B, C: _launch._launch_gemm(
            A, B, C, 1.0, 0.0, bk=16 if A.shape[1] >= _configs.WIDE_BK16_MIN_K else 8, wn=4, split=False)
        ms["a64x64"] = lambda A, B, C: _launch._launch_async(A, B, C, 1.0, 0.0, _configs.SMALL_TILE)
    return ms


def _strassen_methods(cupy, variants):
    import tsm_core
    from tsm_core.tiled import configs as _configs, launch as _launch

    ms = {"cublas": lambda A, B, C: cupy.matmul(A, B, out=C),
          "gemm": lambda A, B, C: tsm_core.gemm(A, B, out=C),
          "strassen1": lambda A, B, C: tsm_core.strassen(A, B, levels=1, out=C),
          "strassen2": lambda A, B, C: tsm_core.strassen(A, B, levels=2, out=C)}
    if variants:
        def occ1(levels):
            def f(A, B, C):
                old = _configs.FUSED_OCC
                _configs.FUSED_OCC = 1
                try:
                    tsm_core.strassen(A, B, levels=levels, out=C)
                finally:
                    _configs.FUSED_OCC = old
            return f
        ms["strassen1_occ1"] = occ1(1)
        ms["strassen2_occ1"] = occ1(2)
    return ms


def _acceptance_methods(cupy):
    import tsm_core

    return {"cublas": lambda A, B, C: cupy.matmul(A, B, out=C),
            "auto": lambda A, B, C: tsm_core.strassen(A, B, out=C),
            "levels0": lambda A, B, C: tsm_core.strassen(A, B, levels=0, out=C),
            "strassen1": lambda A, B, C: tsm_core.strassen(A, B, levels=1, out=C),
            "strassen2": lambda A, B, C: tsm_core.strassen(A, B, levels=2, out=C)}


def _acceptance_summary(recs):
    def ratio(r, name):
        x, y = r["methods"].get(name, {}), r["methods"].get("cublas", {})
        return y["median_s"] / x["median_s"] if x.get("median_s") and y.get("median_s") else None

    s = {"correctness_failures": [f"{n} {r['m']}x{r['k']}x{r['n']} {r['dtype']}" for r in recs
                                  for n, mr in r["methods"].items() if not mr.get("correct")],
         "floor": ACCEPT_FLOOR, "target_16384": ACCEPT_16384, "by_dtype": {}}
    ok = not s["correctness_failures"]
    for dt in sorted({r["dtype"] for r in recs}):
        rows = [r for r in recs if r["dtype"] == dt]
        table = [dict(shape=[r["m"], r["k"], r["n"]], auto_levels=r.get("auto_levels"),
                      **{f"{n}_vs_cublas": ratio(r, n) for n in r["methods"] if n != "cublas"})
                 for r in rows]
        autos = [(t["shape"], t["auto_vs_cublas"]) for t in table]
        worst = min(autos, key=lambda x: x[1] if x[1] is not None else -1, default=None)
        at = [t["auto_vs_cublas"] for t in table if t["shape"] == [16384] * 3]
        d = dict(rows=table, worst_auto=worst,
                 floor_pass=bool(autos) and all(x is not None and x >= ACCEPT_FLOOR for _, x in autos),
                 auto_16384=at[0] if at else None)
        if dt == "float32":  # float64 Strassen runs on the SIMT units: cuBLAS by design
            d["target_16384_pass"] = bool(at and at[0] is not None and at[0] >= ACCEPT_16384)
            ok = ok and d["target_16384_pass"]
        ok = ok and d["floor_pass"]
        s["by_dtype"][dt] = d
    s["pass"] = bool(ok)
    return s


def _acceptance_plot(doc, out_dir: Path):
    from matplotlib.figure import Figure

    dts = list(doc["summary"]["by_dtype"])
    fig = Figure(figsize=(10, 4 * len(dts)))
    for i, dt in enumerate(dts, 1):
        ax = fig.add_subplot(len(dts), 1, i)
        rows = doc["summary"]["by_dtype"][dt]["rows"]
        labels = ["x".join(map(str, t["shape"])) if len(set(t["shape"])) > 1 else str(t["shape"][0])
                  for t in rows]
        x = np.arange(len(rows))
        names = ["auto", "levels0", "strassen1", "strassen2"]
        w = 0.8 / len(names)
        for j, nm in enumerate(names):
            ax.bar(x + (j - 1.5) * w, [t.get(f"{nm}_vs_cublas") or 0 for t in rows], w, label=nm)
        for xi, t in zip(x, rows):
            ax.annotate(f"L{t['auto_levels']}", (xi - 1.5 * w, (t.get("auto_vs_cublas") or 0) + 0.02),
                        ha="center", fontsize=7)
        ax.axhline(ACCEPT_FLOOR, color="k", lw=0.8, ls="--")
        ax.axhline(1.0, color="gray", lw=0.5)
        ax.set_xticks(x)
        ax.set_xticklabels(labels, rotation=20, fontsize=7)
        ax.set_ylim(0, 1.4)
        ax.set_ylabel("speed vs cuBLAS")
        ax.set_title(f"strassen(levels='auto') vs cuBLAS, {dt}, {doc['environment'].get('gpu', '')}")
        ax.legend(fontsize=7, ncol=4)
    fig.tight_layout()
    p = out_dir / "strassen_acceptance.png"
    fig.savefig(p, dpi=120)
    return p


def _summary(command, recs):
    def ratio(r, a, b="cublas"):
        x, y = r["methods"].get(a, {}), r["methods"].get(b, {})
        return x["tflops"] / y["tflops"] if x.get("tflops") and y.get("tflops") else None

    s = {"correctness_failures": [f"{n} {r['m']}x{r['k']}x{r['n']}" for r in recs
                                  for n, mr in r["methods"].items() if not mr.get("correct")]}
    sq = sorted((r for r in recs if r["m"] == r["k"] == r["n"]), key=lambda r: r["m"])
    if command == "gemm":
        big = [(r["m"], ratio(r, "gemm")) for r in sq if r["m"] >= 2048]
        worst = min((x for x in big if x[1] is not None), key=lambda x: x[1], default=None)
        s["gemm_vs_cublas_min_N_ge_2048"] = worst
        s["gemm_pass"] = bool(worst and worst[1] >= GEMM_FRAC)
        mid = [r for r in sq if 1024 <= r["m"] <= 4096 or r["m"] in (768, 6144)]
        cliffs = []
        for i in range(1, len(mid) - 1):
            t = [mid[j]["methods"]["gemm"].get("tflops") for j in (i - 1, i, i + 1)]
            if None in t or not 1024 <= mid[i]["m"] <= 4096:
                continue
            below = 1 - t[1] / ((t[0] + t[2]) / 2)
            cliffs.append((mid[i]["m"], below))
        s["cliffs"] = cliffs
        s["cliff_pass"] = bool(cliffs) and all(b <= CLIFF for _, b in cliffs)
    else:
        for name in ("strassen1", "strassen2", "gemm"):
            sp = [(r["m"], ratio(r, name)) for r in sq]
            s[f"{name}_speedup"] = sp
            cross = None
            for N, x in sp:  # the smallest N from which every larger N is faster than cuBLAS
                if x is not None and x > 1 and cross is None:
                    cross = N
                elif x is None or x <= 1:
                    cross = None
            s[f"{name}_crossover_N"] = cross
        s["strassen1_pass_N_ge_8192"] = all(x and x > 1 for N, x in s["strassen1_speedup"]
                                            if N >= 8192)
        at = dict(s["strassen2_speedup"]).get(16384)
        s["strassen2_speedup_16384"] = at
        s["strassen2_pass"] = bool(at and at >= 1.10)
        s["rel_err"] = {r["m"]: {n: mr.get("rel_err") for n, mr in r["methods"].items()}
                        for r in sq}
    return s


def _table(command, doc) -> str:
    names = list(doc["records"][0]["methods"]) if doc["records"] else []
    lines = [f"{'m':>6} {'k':>6} {'n':>6} " + " ".join(f"{n:>14}" for n in names)
             + "   (TFLOP/s; x = vs cuBLAS; err)"]
    for r in doc["records"]:
        cb = r["methods"].get("cublas", {}).get("tflops")
        cells = []
        for n in names:
            mr = r["methods"].get(n, {})
            t = mr.get("tflops")
            cells.append(f"{t:6.1f} x{t / cb:4.2f}" if t and cb and n != "cublas"
                         else (f"{t:14.1f}" if t else f"{'ERR':>14}"))
        errs = " ".join(f"{mr.get('rel_err', float('nan')):.1e}" for mr in r["methods"].values())
        lines.append(f"{r['m']:6d} {r['k']:6d} {r['n']:6d} " + " ".join(f"{c:>14}" for c in cells)
                     + f"   {errs}")
    s = doc["summary"]
    lines.append("summary: " + json.dumps({k: v for k, v in s.items() if k not in ("rel_err", "by_dtype")}))
    return "\n".join(lines)


def _plot(command, doc, out_dir: Path):
    from matplotlib.figure import Figure

    sq = sorted((r for r in doc["records"] if r["m"] == r["k"] == r["n"]), key=lambda r: r["m"])
    fig = Figure(figsize=(8, 4.5))
    ax = fig.add_subplot(111)
    for name in sq[0]["methods"] if sq else []:
        pts = [(r["m"], r["methods"][name].get("tflops")) for r in sq
               if r["methods"][name].get("tflops")]
        if pts:
            ax.plot(*zip(*pts), marker="o", ms=3, label=name)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("N (square)")
    ax.set_ylabel("TFLOP/s (2 N^3 / t)")
    ax.set_title(f"{command} vs cuBLAS SGEMM (TF32 off), {doc['environment'].get('gpu', '')}")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    p = out_dir / f"{command}_tflops.png"
    fig.savefig(p, dpi=120)
    return p


def main(command: str, argv: list[str]) -> int:
    """Run ``gemm`` or ``strassen``; 0 = ran and every result correct, 1 = a method
    failed or was wrong, 2 = no GPU."""
    args = _parser(command).parse_args(argv)
    if os.environ.get("CUPY_TF32", "0") not in ("", "0"):
        print("CUPY_TF32 is set: cuBLAS would not be plain FP32; unset it", file=sys.stderr)
        return 1
    from tsm_core.runtime import arrays as _arrays

    if not _arrays.has_gpu():
        print("tsm_core.bench needs a CUDA GPU; found none", file=sys.stderr)
        return 2
    import cupy

    from tsm_core.bench import _environment, gpu_slug


    from tsm_core.runtime import timing as _timing

    env = _environment(cupy)
    out_dir = Path(args.out) if args.out else Path("benchmarks/results") / gpu_slug(env["gpu"])
    out_dir.mkdir(parents=True, exist_ok=True)
    if command == "gemm":
        sizes = args.sizes or (SQUARE_QUICK if args.quick else SQUARE)
        shapes = [(s, s, s) for s in sizes] + ([] if args.no_rect or args.sizes else RECT)
        methods = _gemm_methods(cupy, args.variants)
    elif getattr(args, "acceptance", False):
        sizes = args.sizes or ACCEPT_N
        shapes = [(s, s, s) for s in sizes] + ([] if args.no_rect else ACCEPT_RECT)
        methods = _acceptance_methods(cupy)
    else:
        sizes = args.sizes or (STRASSEN_QUICK if args.quick else STRASSEN_N)
        shapes = [(s, s, s) for s in sizes]
        methods = _strassen_methods(cupy, args.variants)
    acceptance = command == "strassen" and args.acceptance
    dtypes = args.dtypes if acceptance else [args.dtype]
    t0 = time.perf_counter()
    recs = []
    runs = [(dt, sh) for dt in dtypes for sh in shapes]
    for i, (dt, (m, k, n)) in enumerate(runs, 1):
        seed = int(np.random.SeedSequence([args.seed, m, k, n]).generate_state(1)[0])
        rec = _measure(cupy, _timing, m, k, n, dt, methods, seed, args.reps)
        if acceptance:  # what the model picked for these C-ordered operands (as strassen does)
            from tsm_core.tiled.launch import _cc
            from tsm_core.tiled.plan import strassen_levels

            item = np.dtype(dt).itemsize
            rec["auto_levels"] = strassen_levels(m, k, n, item, cc=_cc(),
                                                 aligned=(k * item) % 16 == 0 and (n * item) % 16 == 0)
        recs.append(rec)
        cb = rec["methods"].get("cublas", {}).get("tflops")
        print(f"[{i}/{len(runs)}] {command} {m}x{k}x{n} {dt}: " + ", ".join(
            f"{nm} {mr.get('tflops', float('nan')):.1f}" for nm, mr in rec["methods"].items())
            + (f" TFLOP/s (cuBLAS {cb:.1f})" if cb else "")
            + (f"; auto picked {rec['auto_levels']} levels" if acceptance else ""), flush=True)
    doc = dict(sweep=command, environment=env, cupy_tf32=os.environ.get("CUPY_TF32"),
               command=shlex.join(["python", "-m", "tsm_core.bench", command, *argv]),
               seed=args.seed, elapsed_s=time.perf_counter() - t0, records=recs)
    if acceptance:
        doc["summary"] = _acceptance_summary(recs)
        path = out_dir / "strassen_acceptance.json"
        path.write_text(json.dumps(doc, indent=1, default=float))
        print(f"wrote {path}")
        if not args.no_plot:
            try:
                print(f"wrote {_acceptance_plot(doc, out_dir)}")
            except ImportError as e:
                print(f"no figure ({e})", file=sys.stderr)
        print(_table(command, doc), flush=True)
        print("acceptance: " + json.dumps({dt: dict(worst_auto=d["worst_auto"], floor_pass=d["floor_pass"],
                                                   auto_16384=d["auto_16384"])
                                           for dt, d in doc["summary"]["by_dtype"].items()})
              + f" pass={doc['summary']['pass']}", flush=True)
        return 0 if doc["summary"]["pass"] else 1
    doc["summary"] = _summary(command, recs)
    path = out_dir / f"{command}.json"
    path.write_text(json.dumps(doc, indent=1, default=float))
    print(f"wrote {path}")
    if not args.no_plot:
        try:
            print(f"wrote {_plot(command, doc, out_dir)}")
        except ImportError as e:
            print(f"no figure ({e})", file=sys.stderr)
    print(_table(command, doc), flush=True)
    return 0 if not doc["summary"]["correctness_failures"] else 1
