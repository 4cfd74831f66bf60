"""Variants of version 5's tensor-core tiles against the tree's, device time
(developer tool).

    python dev/batched_tc3_variants_probe.py [--min-mn 256]
        [--variants group2,group4,tree] [--out DIR]

Variants of batched/batched.cu (text substitutions, below), each compiled apart
(`_compile.source_from`) and run as version 5 through ``prepare_batched`` on the
bench's seeded cells (C-ordered torch CUDA tensors), each result checked against
the float64 product before it is timed. The last variant named is the base of the
ratios (``tree``: the kernel as it is):

- ``group2`` / ``group4``: the three 3xTF32 passes of each k8 step over the
  accumulators of 2 (4) fragment rows at a time, instead of one: 8 (16) independent
  MMAs between two into the same accumulator instead of 4 (Nsight Compute on the
  H100, 2026-11-27: the tensor pipe 44% busy, one eligible warp a scheduler of four).

(Copy-map variants, A's copies in 2 x 16 blocks, are in git at commit dc29371
as benchmarks/batched_tc3_map_probe.py.)

Prints each cell's device ms and the geomean ratio of each variant to the base;
writes DIR/batched_tc3_variants_probe.json.
"""

import argparse
import json
import math
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

TREE_LOOP = """#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    unsigned al[4];
#pragma unroll
                    for (int c = 0; c < 4; ++c) al[c] = tf32_low(__uint_as_float(ah[mt][c]));
#pragma unroll
                    for (int nt = 0; nt < NT8; ++nt) mma_tf32_16x8x8(acc[mt][nt], al, bh[nt][0], bh[nt][1]);
#pragma unroll
                    for (int nt = 0; nt < NT8; ++nt)
                        mma_tf32_16x8x8(acc[mt][nt], ah[mt], bl[nt][0], bl[nt][1]);
#pragma unroll
                    for (int nt = 0; nt < NT8; ++nt)
                        mma_tf32_16x8x8(acc[mt][nt], ah[mt], bh[nt][0], bh[nt][1]);
                }"""


def group(G):
    """The k8 step's loop over groups of G fragment rows (see the module's docstring)."""
    return f"""#pragma unroll
                for (int mp = 0; mp < MT; mp += {G}) {{
                    unsigned al[{G}][4];
#pragma unroll
                    for (int u = 0; u < {G}; ++u)
#pragma unroll
                        for (int c = 0; c < 4; ++c) al[u][c] = tf32_low(__uint_as_float(ah[mp + u][c]));
#pragma unroll
                    for (int u = 0; u < {G}; ++u)
#pragma unroll
                        for (int nt = 0; nt < NT8; ++nt)
                            mma_tf32_16x8x8(acc[mp + u][nt], al[u], bh[nt][0], bh[nt][1]);
#pragma unroll
                    for (int u = 0; u < {G}; ++u)
#pragma unroll
                        for (int nt = 0; nt < NT8; ++nt)
                            mma_tf32_16x8x8(acc[mp + u][nt], ah[mp + u], bl[nt][0], bl[nt][1]);
#pragma unroll
                    for (int u = 0; u < {G}; ++u)
#pragma unroll
                        for (int nt = 0; nt < NT8; ++nt)
                            mma_tf32_16x8x8(acc[mp + u][nt], ah[mp + u], bh[nt][0], bh[nt][1]);
                }}"""


VARIANTS = {
    "tree": [],
    "group2": [(TREE_LOOP, group(2))],
    "group4": [(TREE_LOOP, group(4))],
}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--min-mn", type=int, default=256)
    ap.add_argument("--variants", default="group2,group4,tree")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp"))
    args = ap.parse_args(argv)
    from tsm_core import has_gpu

    if not has_gpu():
        print("batched_tc3_variants_probe: no CUDA GPU found")
        return 2
    import torch

    from tsm_core.batched import api as tb
    from tsm_core.batched import memo as tmemo
    from tsm_core.runtime import compile as _compile
    from tsm_core.runtime import timing as _timing
    from tsm_core.bench._batched import _cells, cell_tensors, checked_run

    names = [v for v in args.variants.split(",") if v]
    tree = _compile.kernel_path("batched").read_text()
    texts = {}
    for name in names:
        text = tree
        for a, b in VARIANTS[name]:
            if a not in text:
                raise SystemExit(f"{name}: substitution not found: {a[:70]!r}")
            text = text.replace(a, b)
        texts[name] = text

    tmp = tempfile.mkdtemp()
    modules = {name: {} for name in names}  # each variant compiled once

    def prepared(name, As, Bs, Cs):
        path = os.path.join(tmp, f"{name}.cu")
        if not os.path.exists(path):
            with open(path, "w") as f:
                f.write(texts[name])
        with _compile.source_from("batched", path, modules[name]):
            tmemo.plans.clear()
            return tb.prepare_batched(As, Bs, Cs, version=5)

    rows, wrong = [], 0
    for mn, mk, bs, shapes in _cells(argparse.Namespace(quick=False, seed=0)):
        if mn < args.min_mn:
            continue
        As, Bs, Cs = cell_tensors(torch, mn, mk, bs, shapes, 0)
        refs = [a.double() @ b.double() for a, b in zip(As, Bs)]
        row = dict(max_mn=mn, max_k=mk, batch=bs)
        for name in names:
            prep = prepared(name, As, Bs, Cs)
            err, ok = checked_run(torch, prep, Cs, refs, f"{name} {mn}/{mk}/{bs}")
            wrong += not ok
            row[f"{name}_err"] = err
            row[f"{name}_ms"] = _timing.time_fn(prep.run, reps=args.reps, max_time_s=0.3).median_s * 1e3
        rows.append(row)
        print(f"{mn:5d} {mk:4d} {bs:4d} " + "  ".join(f"{n} {row[n + '_ms']:.4f}" for n in names),
              flush=True)
    base = names[-1]
    summary = {}
    for name in names:
        r = [row[base + "_ms"] / row[name + "_ms"] for row in rows]
        g = math.exp(sum(map(math.log, r)) / len(r))
        big = [row[base + "_ms"] / row[name + "_ms"] for row in rows if row["max_mn"] >= 512]
        gb = math.exp(sum(map(math.log, big)) / len(big)) if big else float("nan")
        summary[name] = dict(geomean_speedup_vs_base=g, geomean_512_up=gb, min=min(r), max=max(r))
        print(f"{name}: {g:.3f}x of {base}'s speed (cells of 512 rows and more {gb:.3f}x), "
              f"{min(r):.3f}-{max(r):.3f}")
    print(f"wrong results: {wrong}")
    out = os.path.join(args.out, "batched_tc3_variants_probe.json")
    with open(out, "w") as f:
        json.dump(dict(base=base, rows=rows, summary=summary, wrong=wrong), f, indent=1)
    print(f"wrote {out}")
    return 1 if wrong else 0


if __name__ == "__main__":
    raise SystemExit(main())
