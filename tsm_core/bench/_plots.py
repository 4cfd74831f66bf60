"""Figures of a sweep's JSON, drawn with matplotlib's Agg canvas (no display, no pyplot).

Saved beside the JSON as ``<sweep>_<what>.png``:

- tsm2r: ``tsm2r_speedup.png``, speedup over cuBLAS against n, one line per m, a
  panel per dtype x order (the paper's Figure 10); ``tsm2r_bandwidth.png``, the
  fraction of the measured read bandwidth against n, TSM2R solid and cuBLAS dashed
  (Figure 11);
- tsm2l: the same two against m, one line per k = n (Figures 13 and 14), using the
  faster of opt1 / opt2 per shape; and ``tsm2l_floor.png``, time / floor of TSM2L
  (tuned where measured), the copy and cuBLAS against m, with the 1.15 target;
- ablation: ``ablation_bandwidth.png``, grouped bars of GB/s per TSM2R version and
  cuBLAS, one group per shape;
- dispatch: ``dispatch_ratio.png``, time(tsm_core.matmul) / time(cupy.matmul) per
  problem against its FLOP count, with the 1.05 line.
"""

from __future__ import annotations

import json
from pathlib import Path

DTYPES = ("float32", "float64")
ORDERS = ("C", "F")


def plot_file(path) -> list[Path]:
    """Draw the figures of the sweep JSON at `path` beside it; return their paths."""
    path = Path(path)
    return plot_document(json.loads(path.read_text()), path.parent)


def plot_document(doc: dict, out_dir) -> list[Path]:
    """Draw the figures of a sweep document into `out_dir`; return their paths."""
    draw = {"tsm2r": _tsm, "tsm2l": _tsm, "ablation": _ablation,
            "dispatch": _dispatch}[doc["sweep"]]
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for what, fig in draw(doc):
        p = out_dir / f"{doc['sweep']}_{what}.png"
        fig.savefig(p, dpi=120)
        paths.append(p)
    return paths


def _gpu(doc) -> str:
    return (doc.get("environment") or {}).get("gpu", "")


def _read_gbps(doc) -> float | None:
    bw = (doc.get("bandwidth") or {}).get("read_bw")
    return bw / 1e9 if bw else None


def _panels(records, title):
    """A Figure with a panel per (dtype, order) present; [(dtype, order, axes, records)]."""
    from matplotlib.figure import Figure

    dtypes = [d for d in DTYPES if any(r["dtype"] == d for r in records)] or ["-"]
    orders = [o for o in ORDERS if any(r["order"] == o for r in records)] or ["-"]
    fig = Figure(figsize=(4.6 * len(orders), 3.6 * len(dtypes)), layout="constrained")
    axes = fig.subplots(len(dtypes), len(orders), squeeze=False)
    fig.suptitle(title)
    panels = []
    for i, d in enumerate(dtypes):
        for j, o in enumerate(orders):
            rs = [r for r in records if r["dtype"] == d and r["order"] == o]
            axes[i][j].set_title(f"{d}, A and B {o}-ordered", fontsize=10)
            panels.append((d, o, axes[i][j], rs))
    return fig, panels


def _lines(records, line_key):
    """Records grouped by `line_key`, in order of its value."""
    groups: dict = {}
    for r in records:
        groups.setdefault(r[line_key], []).append(r)
    return sorted(groups.items())


def _x_axis(ax, key, values):
    if key == "n":
        ax.set_xscale("log", base=2)
        ax.set_xticks(values, labels=[str(v) for v in values])
        ax.minorticks_off()
    else:
        ax.set_xscale("log")
    ax.set_xlabel(key)


def _tsm(doc):
    """Figures 10/11 (tsm2r: against n, a line per m) or 13/14 (tsm2l: against m,
    a line per k)."""
    sweep, recs = doc["sweep"], doc["records"]
    x_key, line_key = ("n", "m") if sweep == "tsm2r" else ("m", "k")
    line_name = "m" if sweep == "tsm2r" else "k = n"
    name = sweep.upper()
    xs_all = sorted({r[x_key] for r in recs})

    fig, panels = _panels(recs, f"{name} speedup over cuBLAS ({_gpu(doc)})")
    for _, _, ax, rs in panels:
        for j, (lv, group) in enumerate(_lines(rs, line_key)):
            pts = sorted((r[x_key], r["speedup"]) for r in group if r.get("speedup"))
            if pts:
                ax.plot(*zip(*pts), marker="o", color=f"C{j}", label=f"{line_name} = {lv}")
        ax.axhline(1.0, color="grey", ls=":", lw=1)
        _x_axis(ax, x_key, xs_all)
        ax.set_ylabel("speedup over cuBLAS")
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=8)
    out = [("speedup", fig)]

    read = _read_gbps(doc)
    fig, panels = _panels(recs, f"{name} and cuBLAS, fraction of the measured read bandwidth"
                          + (f" ({read:.0f} GB/s)" if read else ""))
    for _, _, ax, rs in panels:
        for j, (lv, group) in enumerate(_lines(rs, line_key)):
            for field, ls, who in (("frac_read_bw", "-", name), ("cublas_frac_read_bw", "--",
                                                                   "cuBLAS")):
                pts = sorted((r[x_key], r[field]) for r in group if r.get(field))
                if pts:
                    ax.plot(*zip(*pts), ls=ls, marker="o" if ls == "-" else "x",
                            color=f"C{j}", label=f"{who}, {line_name} = {lv}")
        ax.axhline(1.0, color="grey", ls=":", lw=1)
        _x_axis(ax, x_key, xs_all)
        ax.set_ylabel("fraction of read bandwidth")
        top = max([r.get(f) or 0 for r in rs for f in ("frac_read_bw", "cublas_frac_read_bw")],
                  default=0)
        ax.set_ylim(0, max(1.1, 1.05 * top))
        ax.legend(fontsize=7, ncol=2)
    out.append(("bandwidth", fig))
    if sweep == "tsm2l" and any(r.get("floor_ratio") for r in recs):
        out.append(("floor", _tsm2l_floor(doc, xs_all)))
    return out


def _tsm2l_floor(doc, xs_all):
    """time / floor against m (floor: an empty launch plus A and C at the read
    bandwidth): ours (tuned where measured) solid, the copy dotted, cuBLAS dashed,
    a line colour per k; the 1.15 target marked."""
    recs = doc["records"]
    fl = ((doc.get("summary") or {}).get("floor") or {})
    acc = ((doc.get("summary") or {}).get("acceptance") or {}).get("tsm2l_within_1_15") or {}
    head = (f"within 1.15: {fl.get('n_within')}/{fl.get('n')} shapes, worst "
            f"{fl['max_ratio']:.2f} ({fl.get('max_ratio_case')})" if fl.get("max_ratio") else "")
    tag = {True: "PASS", False: "FAIL"}.get(acc.get("pass"), "")
    fig, panels = _panels(recs, f"TSM2L time / floor ({_gpu(doc)})\n{tag} {head}".rstrip())
    for _, _, ax, rs in panels:
        for j, (lv, group) in enumerate(_lines(rs, "k")):
            for field, ls, who in (("ours_floor_ratio", "-", "TSM2L"), ("copy_floor_ratio", ":", "copy"),
                                   ("cublas_floor_ratio", "--", "cuBLAS")):
                pts = sorted((r["m"], r[field]) for r in group if r.get(field))
                if pts:
                    ax.plot(*zip(*pts), ls=ls, marker="o" if ls == "-" else "x", color=f"C{j}",
                            label=f"{who}, k = n = {lv}")
        ax.axhline(1.15, color="red", ls="--", lw=1, label="1.15")
        ax.axhline(1.0, color="grey", ls=":", lw=1)
        _x_axis(ax, "m", xs_all)
        ax.set_ylabel("time / floor")
        ax.set_ylim(bottom=0.9)
        ax.legend(fontsize=6, ncol=3)
    return fig


def _ablation(doc):
    """Grouped bars: GB/s of v0..v3 and cuBLAS, one group per (m, n)."""
    recs = doc["records"]
    names = [f"tsm2r_v{v}" for v in range(4)] + ["cublas"]
    labels = ["v0", "v1", "v2", "v3", "cuBLAS"]
    read = _read_gbps(doc)
    fig, panels = _panels(recs, f"TSM2R optimisation ladder: GB/s ({_gpu(doc)})")
    width = 0.8 / len(names)
    for _, _, ax, rs in panels:
        rs = sorted(rs, key=lambda r: (r["m"], r["n"]))
        for j, (nm, lab) in enumerate(zip(names, labels)):
            xs = [i + (j - (len(names) - 1) / 2) * width for i in range(len(rs))]
            ys = [r["methods"].get(nm, {}).get("gbps") or 0.0 for r in rs]
            ax.bar(xs, ys, width, label=lab, color="grey" if nm == "cublas" else f"C{j}")
        if read:
            ax.axhline(read, color="black", ls="--", lw=1, label="read BW")
        ax.set_xticks(range(len(rs)), labels=[f"m={r['m']}\nn={r['n']}" for r in rs],
                      fontsize=7)
        ax.set_yscale("log")
        ax.set_ylim(top=4 * max([read or 0] + [b.get_height() for b in ax.patches]))
        ax.set_ylabel("GB/s (A, B, C once)")
        ax.legend(fontsize=7, ncol=6, loc="upper center")
    return [("bandwidth", fig)]


def _dispatch(doc):
    """Scatter of time(matmul) / time(cupy.matmul) against 2 m n k, 1.05 marked."""
    from matplotlib.figure import Figure

    recs = [r for r in doc["records"] if r.get("ratio")]
    fig = Figure(figsize=(8, 4.8), layout="constrained")
    ax = fig.subplots()
    algos = sorted({str(r.get("algorithm")) for r in recs})
    for a_i, algo in enumerate(algos):
        for dtype, marker in (("float32", "o"), ("float64", "s")):
            for order in ORDERS:
                rs = [r for r in recs if str(r.get("algorithm")) == algo
                      and r["dtype"] == dtype and r["order"] == order]
                if not rs:
                    continue
                color = f"C{a_i}"
                ax.scatter([2 * r["m"] * r["n"] * r["k"] for r in rs], [r["ratio"] for r in rs],
                           marker=marker, s=28, edgecolors=color,
                           facecolors=color if order == "C" else "none",
                           label=f"{algo}, {dtype}, {order}")
    ax.axhline(1.05, color="red", ls="--", lw=1, label="1.05")
    ax.axhline(1.0, color="grey", ls=":", lw=1)
    if recs:
        worst = max(recs, key=lambda r: r["ratio"])
        ax.annotate(f"{worst['m']}x{worst['k']}x{worst['n']} {worst['dtype']} {worst['order']}",
                    (2 * worst["m"] * worst["n"] * worst["k"], worst["ratio"]),
                    textcoords="offset points", xytext=(5, 5), fontsize=7)
        ax.set_xscale("log")
    ax.set_xlabel("FLOP (2 m n k)")
    ax.set_ylabel("time(tsm_core.matmul) / time(cupy.matmul)")
    mx = (doc.get("summary") or {}).get("max_ratio")
    ax.set_title(f"dispatch: tsm_core.matmul against cupy.matmul ({_gpu(doc)})"
                 + (f", max ratio {mx:.3f}" if mx else ""), fontsize=10)
    ax.legend(fontsize=7, ncol=2)
    return [("ratio", fig)]
