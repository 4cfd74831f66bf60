"""``python -m tsm_core.bench random-products``: ``tsm_core.matmul`` against the vendor's
matmul on seeded random products, per call, host time included.

Each product draws m, k and n log-uniform over [1, 1e5] (redrawn until A, B and C
each hold at most 2^27 elements and 2 m n k <= 2^37), a memory order for A and for B
(C-ordered, F-ordered, or the transposed view of a C-ordered array), a dtype
(float32 or float64), alpha and beta (the defaults four times in five, else
others, always with ``out``), whether ``out`` is given, and the kind: CuPy arrays
(baseline ``cupy.matmul``, or ``cupy.cublas.gemm`` with alpha and beta) or torch
CUDA tensors (baseline ``torch.matmul``, or ``torch.addmm(out, A, B, beta=, alpha=,
out=out)``). Both methods get the same operands and the same output policy (both
with the same preallocated C-ordered ``out``, or both without).

How a number is made: after warm-up (three calls each; ``matmul``'s first call
decides its route, and where the model picks a TSM kernel times it against cuBLAS
once), a batch size is chosen so that a batch takes about 2 ms; then 21 samples
per method, the methods alternating, each ``synchronize; t0; batch of calls;
synchronize; t1`` with the host clock: the time per call includes everything the
host does. The figure is the median per call; ratio = baseline time / matmul time
(above 1: matmul faster). Each result is checked once against the baseline's: the
relative Frobenius difference must be below ``tol`` (float32 1e-4, float64 1e-12,
times sqrt(k / 1000) above k = 1000).

Writes ``random_products.json`` (every product and the summary) and
``random_products.png`` (ratio against FLOPs, coloured by route, a geomean line per
baseline), prints the geomean per baseline and the worst products. Acceptance:
geomean >= 1.0 against each baseline and no product below 0.95.

``--cpu`` runs the same harness on numpy arrays and torch CPU tensors at tiny sizes
(baselines ``np.matmul`` and ``torch.matmul`` / ``addmm``): a check of the harness,
not a measurement anyone should quote.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import statistics
import sys
import time
from pathlib import Path

import numpy as np

DIM_MAX = 100_000
ELEMS_MAX = 1 << 27  # per operand and output
FLOPS_MAX = 1 << 37  # 2 m n k
CPU_DIM_MAX = 64
CPU_ELEMS_MAX = 1 << 12
CPU_FLOPS_MAX = 1 << 18
ORDERS = ("C", "F", "T")
DTYPES = ("float32", "float64")
ALPHA_BETA = ((2.0, 0.0), (-0.5, 1.0), (1.0, 1.0), (0.75, 0.5), (1.5, -2.0))
TOL = {"float32": 1e-4, "float64": 1e-12}
GEOMEAN_MIN = 1.0
RATIO_MIN = 0.95
SAMPLE_S = 2e-3
REPS = 21
BATCH_MAX = 500


def _log_uniform(rng, hi):
    return max(1, min(hi, int(round(math.exp(rng.uniform(0.0, math.log(hi)))))))


def generate(count: int = 500, seed: int = 0, *, cpu: bool = False) -> list[dict]:
    """The products of a run: a list of dicts (i, m, k, n, flops, order_a, order_b,
    dtype, kind, alpha, beta, out, seed), the same for the same arguments.

    ``cpu`` draws tiny products (dimensions up to 64) for numpy and torch CPU inputs.
    """
    rng = np.random.default_rng(seed)
    dim_max, elems_max, flops_max = ((CPU_DIM_MAX, CPU_ELEMS_MAX, CPU_FLOPS_MAX) if cpu
                                     else (DIM_MAX, ELEMS_MAX, FLOPS_MAX))
    kinds = ("numpy", "torch-cpu") if cpu else ("cupy", "torch")
    products = []
    for i in range(count):
        while True:
            m, k, n = (_log_uniform(rng, dim_max) for _ in range(3))
            if max(m * k, k * n, m * n) <= elems_max and 2 * m * n * k <= flops_max:
                break
        scaled = rng.random() < 0.2
        alpha, beta = ALPHA_BETA[int(rng.integers(len(ALPHA_BETA)))] if scaled else (1.0, 0.0)
        products.append(dict(
            i=i, m=m, k=k, n=n, flops=2 * m * n * k,
            order_a=ORDERS[int(rng.integers(3))], order_b=ORDERS[int(rng.integers(3))],
            dtype=DTYPES[int(rng.integers(2))], kind=kinds[int(rng.integers(2))],
            alpha=alpha, beta=beta, out=bool(scaled or rng.random() < 0.7),
            seed=int(rng.integers(2**30))))
    return products


def tolerance(dtype: str, k: int) -> float:
    """The relative difference allowed between matmul's result and the baseline's."""
    return TOL[dtype] * max(1.0, math.sqrt(k / 1000))


# ---------------------------------------------------------------- backends


class _Backend:
    """Arrays, baseline and synchronisation of one kind."""

    def __init__(self, kind: str):
        self.kind = kind
        if kind in ("cupy",):
            import cupy

            self.xp = cupy
        elif kind in ("torch", "torch-cpu"):
            import torch

            self.torch = torch

    def make(self, shape, dtype, order, seed):
        """A random signed array of `shape` in `order` (C, F or the transposed view of
        a C-ordered array), made where it will live (CuPy's and torch's generators on
        the GPU: a host generator would take minutes over a run)."""
        stored = shape[::-1] if order == "T" else shape
        if self.kind == "numpy":
            x = np.random.default_rng(seed).standard_normal(stored).astype(dtype)
            asf = np.asfortranarray
        elif self.kind == "cupy":
            x = self.xp.random.RandomState(seed).standard_normal(stored, dtype=dtype)
            asf = self.xp.asfortranarray
        else:
            torch = self.torch
            dev = "cuda" if self.kind == "torch" else "cpu"
            g = torch.Generator(device=dev).manual_seed(seed)
            x = torch.randn(stored, generator=g, device=dev, dtype=getattr(torch, dtype))

            def asf(t):
                return t.t().contiguous().t()
        if order == "T":
            return x.T
        return asf(x) if order == "F" else x

    def empty(self, m, n, dtype):
        if self.kind == "numpy":
            return np.empty((m, n), dtype=dtype)
        if self.kind == "cupy":
            return self.xp.empty((m, n), dtype=dtype)
        dev = "cuda" if self.kind == "torch" else "cpu"
        return self.torch.empty((m, n), dtype=getattr(self.torch, dtype), device=dev)

    def copy_into(self, dst, src):
        if self.kind in ("numpy", "cupy"):
            dst[...] = src
        else:
            dst.copy_(src)

    def baseline(self, alpha, beta, has_out):
        """(name, fn(A, B, out)) of the vendor call for this product."""
        plain = alpha == 1.0 and beta == 0.0
        if self.kind == "numpy":
            if plain:
                return "np.matmul", (lambda A, B, out: np.matmul(A, B, out=out))

            def np_scaled(A, B, out):
                AB = np.matmul(A, B)
                AB *= alpha
                out *= beta
                out += AB
                return out
            return "np.matmul+axpby", np_scaled
        if self.kind == "cupy":
            cupy = self.xp
            if plain:
                return "cupy.matmul", (lambda A, B, out: cupy.matmul(A, B, out=out))
            import cupy.cublas  # a submodule: not loaded by `import cupy`

            return "cupy.cublas.gemm", (
                lambda A, B, out: cupy.cublas.gemm("N", "N", A, B, out=out, alpha=alpha, beta=beta))
        torch = self.torch
        if plain:
            if has_out:
                return "torch.matmul", (lambda A, B, out: torch.matmul(A, B, out=out))
            return "torch.matmul", (lambda A, B, out: torch.matmul(A, B))
        return "torch.addmm", (
            lambda A, B, out: torch.addmm(out, A, B, beta=beta, alpha=alpha, out=out))

    def sync(self):
        if self.kind == "cupy":
            self.xp.cuda.runtime.deviceSynchronize()
        elif self.kind == "torch":
            self.torch.cuda.synchronize()

    def rel_diff(self, C, ref) -> float:
        """||C - ref||_F / ||ref||_F in float64, computed where the arrays live."""
        if self.kind == "numpy":
            return rel_diff(C, ref)
        if self.kind == "cupy":
            xp = self.xp
            C, ref = C.astype(xp.float64), ref.astype(xp.float64)
            den = float(xp.linalg.norm(ref.ravel()))
            return float(xp.linalg.norm((C - ref).ravel())) / (den if den > 0 else 1.0)
        C, ref = C.double(), ref.double()
        den = float(self.torch.linalg.vector_norm(ref))
        return float(self.torch.linalg.vector_norm(C - ref)) / (den if den > 0 else 1.0)

    def to_numpy(self, x):
        if self.kind == "numpy":
            return np.asarray(x)
        if self.kind == "cupy":
            return self.xp.asnumpy(x)
        return x.detach().cpu().numpy()

    def free(self):
        if self.kind == "cupy":
            self.xp.get_default_memory_pool().free_all_blocks()
        elif self.kind == "torch":
            self.torch.cuda.empty_cache()


def rel_diff(C, ref) -> float:
    """||C - ref||_F / ||ref||_F in float64 (NaN where C holds NaN)."""
    C = np.asarray(C, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    den = float(np.linalg.norm(ref))
    return float(np.linalg.norm(C - ref)) / (den if den > 0 else 1.0)


def time_pair(fns, sync, *, reps=REPS, sample_s=SAMPLE_S, clock=time.perf_counter) -> list[float]:
    """Per-call times (median over `reps` batches, host clock around a synchronise)
    of each function in `fns`, the functions alternating sample by sample."""
    for _ in range(3):
        for f in fns:
            f()
    sync()
    t0 = clock()
    for f in fns:
        f()
    sync()
    one = max((clock() - t0) / len(fns), 1e-7)
    batch = max(1, min(BATCH_MAX, int(sample_s / one)))
    samples = [[] for _ in fns]
    for _ in range(reps):
        for j, f in enumerate(fns):
            sync()
            t0 = clock()
            for _ in range(batch):
                f()
            sync()
            samples[j].append((clock() - t0) / batch)
    return [statistics.median(s) for s in samples]


def measure(p: dict, backend: _Backend, *, reps=REPS, sample_s=SAMPLE_S) -> dict:
    """Time one product (both methods) and check matmul's result against the baseline's."""
    import tsm_core
    from tsm_core.tsm2 import api as _api

    m, k, n, dtype, seed = p["m"], p["k"], p["n"], p["dtype"], p["seed"]
    alpha, beta = p["alpha"], p["beta"]
    name, base = backend.baseline(alpha, beta, p["out"])
    rec = dict(p, baseline=name)
    arrays = {}
    try:
        A = arrays["A"] = backend.make((m, k), dtype, p["order_a"], seed)
        B = arrays["B"] = backend.make((k, n), dtype, p["order_b"], seed + 1)
        out0 = out_t = out_b = None
        if p["out"]:
            out0 = arrays["out0"] = backend.make((m, n), dtype, "C", seed + 2)
            out_t = arrays["out_t"] = backend.empty(m, n, dtype)
            out_b = arrays["out_b"] = backend.empty(m, n, dtype)
            # The check: both from the same out contents.
            backend.copy_into(out_t, out0)
            backend.copy_into(out_b, out0)
        C_t = tsm_core.matmul(A, B, out=out_t, alpha=alpha, beta=beta)
        C_b = base(A, B, out_b)
        backend.sync()
        rec["err"] = backend.rel_diff(C_t, C_b)
        rec["tol"] = tolerance(dtype, k)
        rec["ok"] = bool(rec["err"] <= rec["tol"])
        del C_t, C_b
        t_t, t_b = time_pair(
            [lambda: tsm_core.matmul(A, B, out=out_t, alpha=alpha, beta=beta),
             lambda: base(A, B, out_b)], backend.sync, reps=reps, sample_s=sample_s)
        rec.update(t_tsm_s=t_t, t_base_s=t_b, ratio=t_b / t_t,
                   route=_api.route_of(A, B, out_t, alpha, beta))
    except Exception as exc:  # one product failing must not lose the run
        rec.update(error=f"{type(exc).__name__}: {exc}", ok=False)
    finally:
        arrays.clear()
        A = B = out0 = out_t = out_b = None
        backend.free()
    return rec


# ---------------------------------------------------------------- summary and output


def geomean(values):
    v = [x for x in values if x is not None and x > 0 and math.isfinite(x)]
    return math.exp(sum(map(math.log, v)) / len(v)) if v else None


def summarize(records: list[dict]) -> dict:
    """Geomean and worst ratio per baseline family (by kind), failures, acceptance."""
    by_kind = {}
    for r in records:
        by_kind.setdefault(r["kind"], []).append(r)
    per = {}
    for kind, rs in sorted(by_kind.items()):
        ratios = [r["ratio"] for r in rs if r.get("ratio") is not None]
        per[kind] = dict(count=len(rs), geomean=geomean(ratios),
                         min=min(ratios) if ratios else None,
                         below=sum(1 for x in ratios if x < RATIO_MIN),
                         baselines=sorted({r["baseline"] for r in rs}))
    routes = {}
    for r in records:
        routes.setdefault(r.get("route") or "none", []).append(r.get("ratio"))
    timed = [r for r in records if r.get("ratio") is not None]
    worst = sorted(timed, key=lambda r: r["ratio"])[:10]
    failures = [r["i"] for r in records if not r.get("ok")]
    accept = {
        "geomean_per_baseline": dict(
            op=">=", threshold=GEOMEAN_MIN,
            value={k: v["geomean"] for k, v in per.items()},
            **{"pass": all(v["geomean"] is not None and v["geomean"] >= GEOMEAN_MIN
                           for v in per.values())}),
        "min_ratio": dict(op=">=", threshold=RATIO_MIN,
                          value=min((r["ratio"] for r in timed), default=None),
                          **{"pass": bool(timed) and all(r["ratio"] >= RATIO_MIN for r in timed)}),
        "correctness_failures": dict(op="<=", threshold=0, value=len(failures),
                                     **{"pass": not failures}),
    }
    return dict(per_kind=per,
                per_route={k: dict(count=len(v), geomean=geomean(v)) for k, v in sorted(routes.items())},
                worst=[_brief(r) for r in worst], failures=failures, acceptance=accept)


def _brief(r: dict) -> dict:
    keys = ("i", "m", "k", "n", "dtype", "kind", "order_a", "order_b", "alpha", "beta", "out",
            "route", "baseline", "t_tsm_s", "t_base_s", "ratio", "err")
    return {k: r.get(k) for k in keys}


def _clean(x):
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if isinstance(x, np.generic):
        return _clean(x.item())
    return x


def write_json(path: Path, doc: dict) -> Path:
    """Write the document as JSON (non-finite numbers as null), whole or not at all."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(_clean(doc), indent=1, sort_keys=False) + "\n")
    os.replace(tmp, path)
    return path


def plot(doc: dict, path: Path) -> Path | None:
    """ratio against FLOPs, coloured by route, a geomean line per kind of baseline."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        return None
    recs = [r for r in doc["records"] if r.get("ratio")]
    fig = Figure(figsize=(9, 5.5))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    routes = sorted({r.get("route") or "none" for r in recs})
    marks = {k: m for k, m in zip(sorted({r["kind"] for r in recs}), "o^sD")}
    for j, route in enumerate(routes):
        for kind, mk in marks.items():
            rs = [r for r in recs if (r.get("route") or "none") == route and r["kind"] == kind]
            if rs:
                ax.scatter([r["flops"] for r in rs], [r["ratio"] for r in rs], s=12, marker=mk,
                           color=f"C{j}", alpha=0.7, label=f"{route} ({kind})")
    styles = iter(("--", ":", "-."))
    for kind, v in doc["summary"]["per_kind"].items():
        if v["geomean"]:
            ax.axhline(v["geomean"], color="k", ls=next(styles, "--"), lw=1,
                       label=f"geomean vs {'/'.join(v['baselines'])}: {v['geomean']:.3f}")
    ax.axhline(RATIO_MIN, color="r", lw=0.8, label=f"floor {RATIO_MIN}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("FLOPs (2 m n k)")
    ax.set_ylabel("baseline time / tsm_core.matmul time (per call, host included)")
    ax.set_title(f"tsm_core.matmul on {len(recs)} random products "
                 f"({doc['environment'].get('gpu', 'CPU')})")
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return Path(path)


def format_report(doc: dict) -> str:
    s = doc["summary"]
    lines = []
    for kind, v in s["per_kind"].items():
        g = "n/a" if v["geomean"] is None else f"{v['geomean']:.3f}"
        mn = "n/a" if v["min"] is None else f"{v['min']:.3f}"
        lines.append(f"{kind:10s} vs {'/'.join(v['baselines'])}: {v['count']} products, "
                     f"geomean {g}, min {mn}, {v['below']} below {RATIO_MIN}")
    for route, v in s["per_route"].items():
        g = "n/a" if v["geomean"] is None else f"{v['geomean']:.3f}"
        lines.append(f"  route {route:16s} {v['count']:4d} products, geomean {g}")
    lines.append("worst products:")
    for r in s["worst"]:
        lines.append(f"  #{r['i']:<4d} {r['m']}x{r['k']}x{r['n']} {r['dtype']} {r['kind']} "
                     f"{r['order_a']}{r['order_b']} a={r['alpha']} b={r['beta']} out={r['out']} "
                     f"route={r['route']}: {1e6 * r['t_tsm_s']:.1f} us vs {r['baseline']} "
                     f"{1e6 * r['t_base_s']:.1f} us, ratio {r['ratio']:.3f}")
    if s["failures"]:
        lines.append(f"FAILED (error or result off): products {s['failures'][:20]}")
    for name, a in s["acceptance"].items():
        lines.append(f"acceptance {name}: {'PASS' if a['pass'] else 'FAIL'} "
                     f"({a['value']} {a['op']} {a['threshold']})")
    return "\n".join(lines)


# ---------------------------------------------------------------- command line


def _parser(command):
    p = argparse.ArgumentParser(
        prog=f"python -m tsm_core.bench {command}",
        description="tsm_core.matmul against cupy.matmul / torch.matmul / addmm on seeded "
                    "random products, per call with host time included")
    p.add_argument("--count", type=int, default=500)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="output directory (default benchmarks/results/<gpu>)")
    p.add_argument("--quick", action="store_true", help="100 products, fewer samples")
    p.add_argument("--cpu", action="store_true",
                   help="numpy and torch CPU inputs at tiny sizes (checks the harness)")
    p.add_argument("--no-plot", action="store_true")
    return p


def _environment(cpu: bool) -> dict:
    import platform

    env = dict(python=platform.python_version(), numpy=np.__version__,
               cupy_tf32=os.environ.get("CUPY_TF32", "0"))
    try:
        import torch

        env["torch"] = torch.__version__
        env["torch_allow_tf32"] = bool(torch.backends.cuda.matmul.allow_tf32)
    except ImportError:
        pass
    if not cpu:
        import cupy

        from tsm_core.bench import _environment as gpu_env

        env.update(gpu_env(cupy))
    return env


def main(command: str, argv: list[str]) -> int:
    """Run the bench; 0 = ran and every result agreed, 1 = a product failed or
    disagreed, 2 = no GPU (without ``--cpu``)."""
    args = _parser(command).parse_args(argv)
    if not args.cpu:
        from tsm_core.runtime.arrays import has_gpu

        if not has_gpu():
            print("tsm_core.bench needs a CUDA GPU; found none (--cpu checks the harness)",
                  file=sys.stderr)
            return 2
        if os.environ.get("CUPY_TF32", "0") not in ("", "0"):
            print("CUPY_TF32 is set: cuBLAS would not be plain FP32; unset it", file=sys.stderr)
            return 1
    count = 100 if args.quick and args.count == 500 else args.count
    reps = 3 if args.quick or args.cpu else REPS
    sample_s = 2e-4 if args.cpu else SAMPLE_S
    products = generate(count, args.seed, cpu=args.cpu)
    kinds = sorted({p["kind"] for p in products})
    backends = {}
    for kind in kinds:
        try:
            backends[kind] = _Backend(kind)
        except ImportError as exc:
            print(f"skipping {kind} products: {exc}", file=sys.stderr)
    if not args.cpu and "torch" in backends:
        backends["torch"].torch.backends.cuda.matmul.allow_tf32 = False
    if "torch" in backends:
        # The steady state a program reaches: matmul's C++ path for torch tensors
        # (built in the background on first use; here waited for before timing).
        from tsm_core.tsm2 import fastpath

        fastpath.get(wait=True)
    env = _environment(args.cpu)
    if args.out:
        out_dir = Path(args.out)
    else:
        out_dir = Path("benchmarks/results") / ("cpu" if args.cpu else env.get("gpu_slug", "gpu"))
    t0 = time.perf_counter()
    records = []
    for p in products:
        if p["kind"] not in backends:
            continue
        r = measure(p, backends[p["kind"]], reps=reps, sample_s=sample_s)
        records.append(r)
        if "ratio" in r:
            print(f"[{p['i'] + 1}/{len(products)}] {p['m']}x{p['k']}x{p['n']} {p['dtype']} "
                  f"{p['kind']} {p['order_a']}{p['order_b']} route={r['route']}: "
                  f"ratio {r['ratio']:.3f} err {r['err']:.1e}", flush=True)
        else:
            print(f"[{p['i'] + 1}/{len(products)}] {p['m']}x{p['k']}x{p['n']}: "
                  f"{r.get('error')}", flush=True)
    doc = dict(sweep="random_products", command=shlex.join(
        ["python", "-m", "tsm_core.bench", command, *argv]), environment=env,
        cpu=bool(args.cpu), seed=args.seed, count=count,
        limits=dict(dim_max=CPU_DIM_MAX if args.cpu else DIM_MAX,
                    elems_max=CPU_ELEMS_MAX if args.cpu else ELEMS_MAX,
                    flops_max=CPU_FLOPS_MAX if args.cpu else FLOPS_MAX),
        timing=dict(reps=reps, sample_s=sample_s, clock="host perf_counter around a synchronize"),
        elapsed_s=time.perf_counter() - t0, records=records, summary=summarize(records))
    path = write_json(out_dir / "random_products.json", doc)
    print(f"wrote {path}")
    if not args.no_plot:
        png = plot(doc, out_dir / "random_products.png")
        if png:
            print(f"wrote {png}")
    print(format_report(doc))
    return 0 if doc["summary"]["acceptance"]["correctness_failures"]["pass"] else 1
