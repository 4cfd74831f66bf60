"""Plan variants of the batched GEMM, device time only: for each cell of the sweep,
versions 1, 3 and 5 x split-K on and off x TLP_FRACTION (the fine-tuning loop's
threshold, a fraction of one full wave) over a few values, each through
``prepare_batched`` on the bench's seeded batches and checked against the float64
product. What a search over plans (by tsm_core.batched.cost.plan_cost) could gain over
the call's default plan: dev/batched_cost_fit.py reads this file's JSON
(``--variants``).

    python dev/batched_variants_probe.py [--out DIR] [--seed S] [--quick]
        [--fractions 0.5,1,2] [--versions 1,3,5]

Writes DIR/batched_variants_probe.json: per cell, ``dev_ms[f"v{v}_s{split}_f{frac}"]``.
"""

import argparse
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def variant_key(v, split, frac):
    return f"v{v}_s{int(bool(split))}_f{frac:g}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp"))
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--versions", default="1,3,5")
    ap.add_argument("--fractions", default="0.5,1,2")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--max-time", type=float, default=0.15)
    args = ap.parse_args(argv)
    from tsm_core import has_gpu

    if not has_gpu():
        print("batched_variants_probe: no CUDA GPU found; nothing to time")
        return 2
    import torch

    from tsm_core.batched import api as _batched
    from tsm_core.batched import plan as _plan
    from tsm_core.runtime import timing as _timing
    from tsm_core.bench._batched import _cells, cell_tensors, checked_run

    versions = [int(v) for v in args.versions.split(",")]
    fractions = [float(f) for f in args.fractions.split(",")]
    torch.backends.cuda.matmul.allow_tf32 = False
    default_frac = _plan.TLP_FRACTION
    rows, bad = [], 0

    def default_key(row):  # the call's own plan: its version, split-K on, the default fraction
        return variant_key(row["auto_version"], True, default_frac)

    try:
        for mn, mk, bs, shapes in _cells(argparse.Namespace(quick=args.quick, seed=args.seed)):
            As, Bs, Cs = cell_tensors(torch, mn, mk, bs, shapes, args.seed)
            refs = [a.double() @ b.double() for a, b in zip(As, Bs)]
            row = dict(max_mn=mn, max_k=mk, batch=bs, dev_ms={}, tiles={})
            for frac in fractions:
                _plan.TLP_FRACTION = frac
                _batched._plans.clear()  # plans are cached per layout, not per knob
                for split in (True, False):
                    for v in versions:
                        key = variant_key(v, split, frac)
                        prep = _batched.prepare_batched(As, Bs, Cs, version=v, split_k=split)
                        bad += not checked_run(torch, prep, Cs, refs, key)[1]
                        t = _timing.time_fn(prep.run, reps=args.reps, max_time_s=args.max_time)
                        row["dev_ms"][key] = t.median_s * 1e3
                        row["tiles"][key] = prep.plan.n_tiles
            _plan.TLP_FRACTION = default_frac
            _batched._plans.clear()
            row["auto_version"] = _batched.prepare_batched(As, Bs, Cs)._launch.version
            rows.append(row)
            d = row["dev_ms"]
            best = min(d, key=d.get)
            base = default_key(row)
            vs = (f"default {base} {d[base]:.4f}  " if base in d else
                  f"default {base} not timed (--versions, --fractions)  ")
            print(f"{mn:5d} {mk:4d} {bs:4d} {vs}best {best} {d[best]:.4f}"
                  + (f" ({d[base] / d[best]:.3f}x)" if base in d else ""), flush=True)
    finally:
        _plan.TLP_FRACTION = default_frac
        _batched._plans.clear()

    def gm(xs):
        xs = list(xs)
        return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")

    timed = [r for r in rows if default_key(r) in r["dev_ms"]]
    summary = dict(failures=bad, cells_with_default_timed=len(timed), default_over_best=gm(
        r["dev_ms"][default_key(r)] / min(r["dev_ms"].values()) for r in timed))
    print(json.dumps(summary, indent=1))
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "batched_variants_probe.json"), "w") as f:
        json.dump(dict(command="python dev/batched_variants_probe.py "
                       + " ".join(argv or sys.argv[1:]), seed=args.seed, fractions=fractions,
                       versions=versions, default_fraction=default_frac, rows=rows,
                       summary=summary), f, indent=1)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
