"""Compare the headline figures of two sets of benchmark results (JSON files of
``python -m tsm_core.bench FAMILY``), family by family.

    python dev/compare_headlines.py OLD_DIR NEW_DIR [--tolerance 0.02]

Each figure is oriented so that higher is better (a ratio of times is inverted
where lower is better); ``new / old`` below ``1 - tolerance`` is flagged. Exits 0
always: the table is for reading, not a gate.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path


def _geo(xs):
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else None


def _tsm(d, prefix):
    s = d["summary"]
    out = {f"{prefix} geomean speedup {dt}": v for dt, v in s["geomean_speedup"].items()}
    return out


def _dispatch(d):
    s = d["summary"]
    return {"dispatch 1/geomean(ours/cupy)": 1 / s["geomean_ratio"],
            "dispatch 1/max(ours/cupy)": 1 / s["max_ratio"]}


def _gemm(d):
    s = d["summary"]
    return {"gemm min(ours/cuBLAS) N>=2048": s["gemm_vs_cublas_min_N_ge_2048"][1]}


def _strassen(d):
    s = d["summary"]
    one = dict(map(tuple, s["strassen1_speedup"]))
    two = dict(map(tuple, s["strassen2_speedup"]))
    return {"strassen 1 level N=16384": one.get(16384), "strassen 2 levels N=16384": two.get(16384),
            "strassen 1 level N=8192": one.get(8192), "strassen 2 levels N=8192": two.get(8192)}


def _batched(d):
    s = d["summary"]
    keys = ("geomean_speedup_vs_loop", "geomean_speedup_vs_best_grouped_or_graph",
            "geomean_prepared_vs_loop", "geomean_prepared_vs_best", "geomean_dev_speedup_vs_best")
    out = {f"batched {k}": s[k] for k in keys}
    # Our own times (1 / geomean ms), apart from the baselines' host speed.
    for k in ("ours_ms", "ours_prepared_ms", "ours_dev_ms", "loop_ms", "grouped_ms"):
        g = _geo([r.get(k) for r in d["rows"] if isinstance(r.get(k), (int, float))])
        if g:
            out[f"batched 1/geomean {k}"] = 1 / g
    return out


def _kmeans(d):
    out = {}
    for r in d["shapes"]:
        tag = f"{r['n']}x{r['d']}x{r['k']}"
        out[f"kmeans {tag} 1/ms per iteration"] = 1 / r["ours_ms_per_iter"]
        out[f"kmeans {tag} speedup vs torch"] = r.get("speedup_vs_torch")
    st = d.get("streamed") or {}
    if st.get("ratio_to_copy"):
        out["kmeans streamed copy/pass"] = 1 / st["ratio_to_copy"]
    return out


def _abft(d):
    out = {}
    for r in d["overhead"]:
        out[f"abft gemm/ft_matmul {r['dtype']} N={r['N']}"] = r["gemm_ms"] / r["ft_ms"]
    for dt in ("float32", "float64"):
        sp = [r["speedup"] for r in d["encode"] if r["dtype"] == dt]
        out[f"abft encode geomean speedup {dt}"] = _geo(sp)
    return out


def _inception(d):
    s = d["summary"]
    out = {f"inception geomean speedup batch {b}": v for b, v in s["geomean_speedup"].items()}
    for b in sorted({r["batch"] for r in d["blocks"]}):
        for k in ("ours_ms", "ours_device_ms", "cudnn_ms"):
            g = _geo([r[k] for r in d["blocks"] if r["batch"] == b])
            out[f"inception batch {b} 1/geomean {k}"] = 1 / g if g else None
    return out


FAMILIES = {
    "tsm2r": lambda d: _tsm(d, "tsm2r"),
    "tsm2l": lambda d: _tsm(d, "tsm2l"),
    "ablation": lambda d: _tsm(d, "ablation v3"),
    "dispatch": _dispatch,
    "gemm": _gemm,
    "strassen": _strassen,
    "batched": _batched,
    "kmeans": _kmeans,
    "abft": _abft,
    "inception": _inception,
}


def figures(folder: Path) -> dict:
    out = {}
    for fam, fn in FAMILIES.items():
        p = folder / f"{fam}.json"
        if p.exists():
            try:
                out.update(fn(json.loads(p.read_text())))
            except (KeyError, TypeError, ZeroDivisionError) as e:
                out[f"{fam} (unreadable: {e!r})"] = None
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old", type=Path)
    ap.add_argument("new", type=Path)
    ap.add_argument("--tolerance", type=float, default=0.02)
    a = ap.parse_args(argv)
    old, new = figures(a.old), figures(a.new)
    print(f"{'figure':<58} {'old':>9} {'new':>9} {'new/old':>8}")
    for k in list(old) + [k for k in new if k not in old]:
        o, n = old.get(k), new.get(k)
        r = n / o if o and n else None
        flag = "" if r is None or r >= 1 - a.tolerance else "  <-- below"
        f = lambda x: "-" if x is None else f"{x:9.4f}"  # noqa: E731
        print(f"{k:<58} {f(o)} {f(n)} {'-' if r is None else f'{r:8.3f}'}{flag}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
