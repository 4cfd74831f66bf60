"""Version 5's tensor-core tiles with A's copies in 2 x 16 blocks (k-contiguous A)
against the 8 x 4 blocks they used before, device time (developer tool, session 22).

    python benchmarks/batched_tc3_map_probe.py [--min-mn 256] [--variants tree,ak0,inline]
        [--out DIR]

Variants of kernels/batched.cu, each compiled apart (`_compile.source_from`) and run
as version 5 through ``prepare_batched`` on the bench's seeded cells (C-ordered torch
CUDA tensors: A contiguous along k), each result checked against the float64
product before it is timed:

- ``tree``: the tree (A's copies in 2 x 16 blocks where ak == 1; the tile out of line);
- ``ak0``: the same with ``TSM_BATCHED_TC3_AK 0`` (8 x 4 blocks, still out of line);
- ``inline``: the tile inlined and one map, as before session 22.

Prints each cell's device ms and the geomean ratio of each variant to ``inline``;
writes DIR/batched_tc3_map_probe.json.
"""

import argparse
import json
import math
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

DISPATCH = """                    } else if (meta[(long long)t.x * TSM_BATCHED_META_STRIDE + 7] == 1) {  // ak
                        tc3_tile<T, TSM_BATCHED_TC3_AK != 0>(meta, t.x, t.y, t.z, alpha, beta, smem, ks);
                    } else {
                        tc3_tile<T, false>(meta, t.x, t.y, t.z, alpha, beta, smem, ks);
                    }"""
VARIANTS = {
    "tree": [],
    "ak0": [("#define TSM_BATCHED_TC3_AK 1", "#define TSM_BATCHED_TC3_AK 0")],
    "inline": [(DISPATCH, """                    } else {
                        tile_gemm_tc3<T, 128, 128>(meta, t.x, t.y, t.z, alpha, beta, smem, ks);
                    }""")],
}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--min-mn", type=int, default=256)
    ap.add_argument("--variants", default="tree,ak0,inline")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp"))
    args = ap.parse_args(argv)
    from tsm_core import has_gpu

    if not has_gpu():
        print("batched_tc3_map_probe: no CUDA GPU found")
        return 1
    import torch

    from tsm_core import _batched as tb
    from tsm_core import _compile
    from tsm_core.bench import _timing
    from tsm_core.bench._batched import _cells, cell_tensors, checked_run

    names = [v for v in args.variants.split(",") if v]
    tree = (_compile.KERNEL_DIR / "batched.cu").read_text()
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
            tb._plans.clear()
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
    out = os.path.join(args.out, "batched_tc3_map_probe.json")
    with open(out, "w") as f:
        json.dump(dict(base=base, rows=rows, summary=summary, wrong=wrong), f, indent=1)
    print(f"wrote {out}")
    return 1 if wrong else 0


if __name__ == "__main__":
    raise SystemExit(main())
