"""Batched GEMM kernel versions on the paper's sweep, device time only: by default
version 1 (the paper's five types), 3 (plus 128 x 64 tiles) and 5 (cp.async rings,
128 x 128 tiles on the tensor cores where K >= 128), each through ``prepare_batched``
on the bench's seeded batches (C-ordered torch CUDA tensors, float32), each result
checked against the float64 product; ``auto_version`` is the call's own choice.

    python dev/batched_versions_probe.py [--out DIR] [--seed S] [--versions 1,3,5]
        [--quick] [--min-mn M]

It was also run, on 2026-11-24, on trees with three more versions since folded or
removed (docs/lab/batched.md).

Prints a table (device ms per version, ratios) and writes DIR/batched_versions_probe.json.
"""

import argparse
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--versions", default="1,3,5")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--min-mn", type=int, default=0, help="only cells with Max_MN >= this")
    ap.add_argument("--reps", type=int, default=10)
    args = ap.parse_args(argv)
    from tsm_core import has_gpu

    if not has_gpu():
        print("batched_versions_probe: no CUDA GPU found; nothing to time")
        return 2
    import torch

    from tsm_core.batched import api as _batched
    from tsm_core.runtime import timing as _timing
    from tsm_core.bench._batched import _cells, cell_tensors, checked_run

    versions = [int(v) for v in args.versions.split(",")]
    torch.backends.cuda.matmul.allow_tf32 = False
    rows, bad = [], 0
    for mn, mk, bs, shapes in _cells(argparse.Namespace(quick=args.quick, seed=args.seed)):
        if mn < args.min_mn:
            continue
        As, Bs, Cs = cell_tensors(torch, mn, mk, bs, shapes, args.seed)  # the bench's
        refs = [a.double() @ b.double() for a, b in zip(As, Bs)]
        flops = sum(2 * m * n * k for m, n, k in shapes)
        row = dict(max_mn=mn, max_k=mk, batch=bs, gflop=flops / 1e9)
        auto = _batched.prepare_batched(As, Bs, Cs)
        row["auto_version"] = auto._launch.version
        for v in versions:
            prep = _batched.prepare_batched(As, Bs, Cs, version=v)
            row[f"v{v}_err"], ok = checked_run(torch, prep, Cs, refs, f"v{v}")
            bad += not ok
            t = _timing.time_fn(prep.run, reps=args.reps, max_time_s=0.3)
            row[f"v{v}_dev_ms"] = t.median_s * 1e3
        rows.append(row)
        print(f"{mn:5d} {mk:4d} {bs:4d} " + " ".join(f"v{v} {row[f'v{v}_dev_ms']:.4f}"
                                                      for v in versions), flush=True)

    def gm(xs):
        xs = list(xs)
        return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")

    summary = {}
    for a, b in ((1, 3), (1, 5), (3, 5), (4, 5), (5, 6)):
        if a in versions and b in versions:
            summary[f"v{b}_over_v{a}"] = gm(r[f"v{a}_dev_ms"] / r[f"v{b}_dev_ms"] for r in rows)
            summary[f"v{b}_over_v{a}_min"] = min(r[f"v{a}_dev_ms"] / r[f"v{b}_dev_ms"] for r in rows)
    summary["failures"] = bad
    print(json.dumps(summary, indent=1))
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "batched_versions_probe.json"), "w") as f:
        json.dump(dict(command="python dev/batched_versions_probe.py " + " ".join(argv or sys.argv[1:]),
                       seed=args.seed, rows=rows, summary=summary), f, indent=1)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
