"""Regenerate the headline table of docs/performance.md from the committed bench JSON files.

What it measures: nothing; it reads ``benchmarks/results/h100/<family>.json`` (the
current headline run per family, as written by ``python -m tsm_core.bench FAMILY
--out benchmarks/results/h100``) and prints one Markdown row per family: ours
against the vendor library, with the GPU and the date of the run. No GPU needed.

Run it from the repository root::

    python dev/perf_table.py                 # print the table
    python dev/perf_table.py --write         # replace the table in docs/performance.md
    python dev/perf_table.py --results DIR   # read another results folder

``--write`` replaces the lines between ``<!-- perf-table:begin -->`` and
``<!-- perf-table:end -->`` in docs/performance.md. A family whose JSON is
missing gets a row saying so, so a partial re-measurement still renders.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "h100"
DOC = ROOT / "docs" / "performance.md"
BEGIN = "<!-- perf-table:begin -->"
END = "<!-- perf-table:end -->"

# family -> (json file, vendor baseline, the command that writes the JSON)
FAMILIES = {
    "tsm2r": ("tsm2r.json", "cuBLAS", "python -m tsm_core.bench tsm2r --autotune --out benchmarks/results/h100"),
    "tsm2l": ("tsm2l.json", "cuBLAS", "python -m tsm_core.bench tsm2l --autotune --out benchmarks/results/h100"),
    "ablation": ("ablation.json", "cuBLAS", "python -m tsm_core.bench ablation --out benchmarks/results/h100"),
    "dispatch": ("dispatch.json", "cupy.matmul (cuBLAS)", "python -m tsm_core.bench dispatch --out benchmarks/results/h100"),
    "gemm": ("gemm.json", "cuBLAS SGEMM (TF32 off)", "python -m tsm_core.bench gemm --out benchmarks/results/h100"),
    "strassen": ("strassen.json", "cuBLAS SGEMM (TF32 off)", "python -m tsm_core.bench strassen --out benchmarks/results/h100"),
    "batched": ("batched.json", "cuBLAS (loop, grouped, CUDA graph)", "python -m tsm_core.bench batched --reps 10 --out benchmarks/results/h100"),
    "kmeans": ("kmeans.json", "torch + cuBLAS; scikit-learn (CPU)", "python -m tsm_core.bench kmeans --out benchmarks/results/h100"),
    "abft": ("abft.json", "cuBLAS GEMM", "python -m tsm_core.bench abft --out benchmarks/results/h100"),
    "inception": ("inception.json", "cuDNN (torch)", "python -m tsm_core.bench inception --out benchmarks/results/h100"),
}


def _geomean(values):
    values = [v for v in values if v and v > 0]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def _gpu(d):
    env = d.get("environment") or {}
    return env.get("gpu") or d.get("device") or "?"


def _date(d, path: Path):
    """The run's date from the JSON, else the date of the commit that last wrote the file."""
    for key in ("date_utc", "date"):
        if d.get(key):
            return str(d[key])[:10]
    env = d.get("environment") or {}
    if env.get("when"):
        return str(env["when"])[:10]
    try:
        out = subprocess.run(["git", "log", "-1", "--format=%ad", "--date=short", "--", str(path)],
                             cwd=ROOT, capture_output=True, text=True, check=False).stdout.strip()
    except OSError:
        out = ""
    return f"{out} (commit date)" if out else "?"


def _tsm2r(d):
    s = d["summary"]
    g = s["geomean_speedup"]
    bw = s["acceptance"]["tsm2r_frac_bw_m_ge_20480"]["value"]
    return (f"geomean {g['float32']:.2f}x (float32), {g['float64']:.2f}x (float64) over cuBLAS; "
            f"worst m >= 20480 at {bw:.1%} of read bandwidth")


def _tsm2l(d):
    s = d["summary"]
    g = s["geomean_speedup"]
    acc = s["acceptance"]
    return (f"geomean {acc['tsm2l_geomean_speedup']['value']:.2f}x over cuBLAS "
            f"(float32 {g['float32']:.2f}x, float64 {g['float64']:.2f}x); "
            f"m = 1e7 at >= {acc['tsm2l_frac_bw_m_1e7']['value']:.1%} of read bandwidth")


def _ablation(d):
    gb = d["summary"]["geomean_gbps"]
    return (f"v3 {gb['float32']['tsm2r_v3']:.0f} / {gb['float64']['tsm2r_v3']:.0f} GB/s "
            f"against cuBLAS {gb['float32']['cublas']:.0f} / {gb['float64']['cublas']:.0f} "
            f"(float32 / float64 geomean); v0 {gb['float32']['tsm2r_v0']:.0f} / {gb['float64']['tsm2r_v0']:.0f}")


def _dispatch(d):
    s = d["summary"]
    return (f"worst time ratio to cupy.matmul {s['max_ratio']:.3f} ({s['max_ratio_case']}), "
            f"geomean {s['geomean_ratio']:.3f} over {len(d['records'])} shapes")


def _gemm(d):
    ratios = {}
    for r in d["records"]:
        if r["m"] == r["k"] == r["n"]:
            m = r["methods"]
            ratios[r["m"]] = m["gemm"]["tflops"] / m["cublas"]["tflops"]
    big = {n: v for n, v in ratios.items() if n >= 2048}
    lo = min(big, key=big.get)
    top = max(ratios)
    return (f"square N >= 2048 at {min(big.values()):.2f}-{max(big.values()):.2f} of cuBLAS "
            f"(lowest at N = {lo}); N = {top}: {ratios[top]:.2f}")


def _strassen(d):
    s = d["summary"]
    one = dict(s["strassen1_speedup"])
    two = dict(s["strassen2_speedup"])
    ns = [n for n in (8192, 12288, 16384) if n in one]
    big = d["records"][-1]["methods"]
    return (f"one level {' / '.join(f'{one[n]:.2f}x' for n in ns)}, two levels "
            f"{' / '.join(f'{two[n]:.2f}x' for n in ns)} of cuBLAS at N = {' / '.join(map(str, ns))} "
            f"({big['strassen2']['tflops']:.1f} against {big['cublas']['tflops']:.1f} TFLOP/s at N = {d['records'][-1]['m']})")


def _batched(d):
    s = d["summary"]
    return (f"per call {s['geomean_speedup_vs_loop']:.2f}x over a cuBLAS loop, "
            f"{s['geomean_speedup_vs_best_grouped_or_graph']:.2f}x over the best of grouped and graph; "
            f"prepared batch {s['geomean_prepared_vs_loop']:.2f}x / {s['geomean_prepared_vs_best']:.2f}x "
            f"({s['cells']} cells)")


def _kmeans(d):
    sk = d["sklearn"]
    shapes = ", ".join(f"{sh['speedup_vs_torch']:.2f}x at n={sh['n']:.0e} d={sh['d']} k={sh['k']}".replace("e+0", "e")
                       for sh in d["shapes"])
    return (f"a Lloyd iteration {shapes} over torch + cuBLAS; "
            f"{sk['speedup_vs_sklearn']:.1f}x over scikit-learn ({sk['cpu_threads']} threads)")


def _abft(d):
    over = {o["dtype"]: o for o in d["overhead"]}
    enc = [e["speedup"] for e in d["encode"]]
    parts = [f"{dt} {o['overhead']:+.2%}" for dt, o in sorted(over.items())]
    n = next(iter(over.values()))["N"]
    return (f"fault-tolerant GEMM overhead at N = {n}: {', '.join(parts)}; "
            f"checksum encode {min(enc):.2f}-{max(enc):.2f}x of cuBLAS")


def _inception(d):
    s = d["summary"]
    g = s["geomean_speedup"]
    return (f"geomean {g['1']:.2f}x / {g['32']:.2f}x / {g['128']:.2f}x over cuDNN at batch 1 / 32 / 128; "
            f"{s['blocks_meeting']} of {s['blocks_total']} blocks at target; "
            f"Table 6 {s['table6_meeting']} of {s['table6_total']}")


HEADLINES = {
    "tsm2r": _tsm2r, "tsm2l": _tsm2l, "ablation": _ablation, "dispatch": _dispatch,
    "gemm": _gemm, "strassen": _strassen, "batched": _batched, "kmeans": _kmeans,
    "abft": _abft, "inception": _inception,
}


def rows(results: Path):
    """Yield (family, headline, baseline, gpu, date, command) for every family."""
    for family, (name, baseline, command) in FAMILIES.items():
        path = results / name
        if not path.exists():
            yield family, f"missing: {name}", baseline, "-", "-", command
            continue
        d = json.loads(path.read_text())
        try:
            headline = HEADLINES[family](d)
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            headline = f"cannot read {name}: {exc!r}"
        yield family, headline, baseline, _gpu(d), _date(d, path), command


def table(results: Path) -> str:
    lines = ["| family | ours against | headline | GPU | date | command |",
             "|---|---|---|---|---|---|"]
    for family, headline, baseline, gpu, date, command in rows(results):
        lines.append(f"| {family} | {baseline} | {headline} | {gpu} | {date} | `{command}` |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=RESULTS, help="folder of <family>.json files")
    parser.add_argument("--write", action="store_true", help=f"replace the table in {DOC.relative_to(ROOT)}")
    args = parser.parse_args(argv)
    text = table(args.results)
    if not args.write:
        print(text)
        return 0
    doc = DOC.read_text()
    if BEGIN not in doc or END not in doc:
        print(f"{DOC}: markers {BEGIN} / {END} not found", file=sys.stderr)
        return 1
    head, rest = doc.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    DOC.write_text(f"{head}{BEGIN}\n{text}\n{END}{tail}")
    print(f"wrote {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
