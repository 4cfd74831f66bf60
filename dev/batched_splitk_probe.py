"""Split-K settings of the batched GEMM planner on the paper's sweep, device time only.

Each cell of the bench's seeded batches (C-ordered torch CUDA tensors, float32) is
prepared with the call's own version choice under each setting, checked against the
float64 product and timed (``_timing.time_fn``, device time):

- ``off``: no split (``split_k=False``);
- ``c{C}w{W}``: ``SPLIT_MIN_CHUNK = C``, ``SPLIT_MAX_WAVES = W`` (the planner's rule:
  plans under W waves of tiles cut their longest problems' K into chunks of at least
  C, longest first, until they have W waves).

    python dev/batched_splitk_probe.py [--out DIR] [--settings 128:3,64:3,64:2]
        [--max-batch B] [--quick]

Prints a line per cell and the geometric mean of each setting's speedup over ``off``;
writes DIR/batched_splitk_probe.json.
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
    ap.add_argument("--settings", default="128:3,64:3,64:2")
    ap.add_argument("--max-batch", type=int, default=256)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--reps", type=int, default=10)
    args = ap.parse_args(argv)
    from tsm_core import has_gpu

    if not has_gpu():
        print("batched_splitk_probe: no CUDA GPU found; nothing to time")
        return 2
    import torch

    from tsm_core.batched import api as _batched
    from tsm_core.batched import plan as _plan
    from tsm_core.runtime import timing as _timing
    from tsm_core.bench._batched import _cells, cell_tensors, checked_run

    settings = [tuple(float(x) for x in s.split(":")) for s in args.settings.split(",")]
    names = ["off"] + [f"c{int(c)}w{w:g}" for c, w in settings]
    torch.backends.cuda.matmul.allow_tf32 = False
    keep = (_plan.SPLIT_MIN_CHUNK, _plan.SPLIT_MAX_WAVES)
    rows, bad = [], 0
    for mn, mk, bs, shapes in _cells(argparse.Namespace(quick=args.quick, seed=args.seed)):
        if bs > args.max_batch:
            continue
        As, Bs, Cs = cell_tensors(torch, mn, mk, bs, shapes, args.seed)  # the bench's
        refs = [a.double() @ b.double() for a, b in zip(As, Bs)]
        row = dict(max_mn=mn, max_k=mk, batch=bs, gflop=sum(2 * m * n * k for m, n, k in shapes) / 1e9)
        for name, st in zip(names, [None] + settings):
            _batched._plans.clear()
            if st is not None:
                _plan.SPLIT_MIN_CHUNK, _plan.SPLIT_MAX_WAVES = int(st[0]), st[1]
            try:
                prep = _batched.prepare_batched(As, Bs, Cs, split_k=st is not None)
            finally:
                _plan.SPLIT_MIN_CHUNK, _plan.SPLIT_MAX_WAVES = keep
            err, ok = checked_run(torch, prep, Cs, refs, name)
            bad += not ok
            t = _timing.time_fn(prep.run, reps=args.reps, max_time_s=0.3)
            row[f"{name}_dev_ms"] = t.median_s * 1e3
            row[f"{name}_version"] = prep._launch.version
            row[f"{name}_split_problems"] = prep.plan.split_problems
            row[f"{name}_tiles"] = prep.plan.n_tiles
            row[f"{name}_err"] = err
        _batched._plans.clear()
        rows.append(row)
        print(f"{mn:5d} {mk:4d} {bs:4d} " + "  ".join(
            f"{n} {row[f'{n}_dev_ms']:.4f} v{row[f'{n}_version']} s{row[f'{n}_split_problems']}"
            for n in names), flush=True)

    def gm(xs):
        xs = list(xs)
        return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")

    summary = {"failures": bad}
    for n in names[1:]:
        r = [x["off_dev_ms"] / x[f"{n}_dev_ms"] for x in rows]
        summary[f"{n}_over_off"] = gm(r)
        summary[f"{n}_min"] = min(r)
        summary[f"{n}_max"] = max(r)
        summary[f"{n}_cells_split"] = sum(1 for x in rows if x[f"{n}_split_problems"])
    print(json.dumps(summary, indent=1))
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "batched_splitk_probe.json"), "w") as f:
        json.dump(dict(command="python dev/batched_splitk_probe.py " + " ".join(argv or sys.argv[1:]),
                       rows=rows, summary=summary), f, indent=1)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
