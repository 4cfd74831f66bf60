"""Fit the batched GEMM's per-tile cost model to measured device times (no GPU).

The model (tsm_core.batched.cost.plan_cost): a tile of class c with n k-steps of 16
costs a[c] * n + b[c] microseconds on one block slot; the tiles go, in the plan's
order (blockIdx), to the first free of the SM count x blocks-per-SM slots; the
plan's time is the latest slot's finish plus t0. Classes: the tile type, and for
version 5 its 128 x 128 tiles on the tensor cores (K >= TC_MIN_K) apart from
those on the FMA path.

Fit, per kernel version: simulate with the current costs, take each cell's
critical slot (whose finish is the makespan: linear in the costs), solve the
non-negative least squares of the relative error over all cells, repeat until the
costs settle. Inputs: the JSON of ``dev/batched_versions_probe.py`` (one
per seed: the seed's cells are regenerated here from tsm_datasets/irregular.py).

    python dev/batched_cost_fit.py FIT.json [FIT.json ...] [--check CHECK.json ...]

Prints the costs (to paste into the batched planner's TILE_COSTS), the fit's
error per version, and, on the --check files (seeds not fitted), how the model's
choice of version compares with the call's current rule and with the fastest.
"""

import argparse
import json
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def load(paths):
    from tsm_datasets.irregular import irregular_shapes

    cells = []
    for p in paths:
        d = json.load(open(p))
        seed = d.get("seed")
        if seed is None:  # older probe JSON: the seed is in its command (the bench's: 0)
            words = str(d.get("command", "")).split()
            seed = int(words[words.index("--seed") + 1]) if "--seed" in words else 0
        for r in d["rows"]:
            if "ours_version" in r:  # the bench's JSON (tsm_core.bench batched)
                r = dict(r, auto_version=r["ours_version"],
                         **{f"v{v}_dev_ms": r[f"ours_v{v}_prepared_dev_ms"] for v in range(6)
                            if f"ours_v{v}_prepared_dev_ms" in r})
            shapes = irregular_shapes(r["max_mn"], r["max_k"], r["batch"], seed=seed)
            cells.append(dict(r, seed=seed, shapes=shapes))
    return cells


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("fit", nargs="+")
    ap.add_argument("--check", nargs="*", default=[])
    ap.add_argument("--versions", default="1,3,5")
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--margin", type=float, default=0.0,
                    help="leave the first version only for a predicted gain above this")
    ap.add_argument("--margins", type=lambda s: [float(x) for x in s.split(",")], default=[],
                    help="also report the choice at these margins")
    ap.add_argument("--out", default=None, help="write the fit and checks as JSON here")
    args = ap.parse_args(argv)
    from scipy.optimize import nnls

    from tsm_core.batched import api as tb
    from tsm_core.batched import cost as tcost

    versions = [int(v) for v in args.versions.split(",")]
    fit, check = load(args.fit), load(args.check)
    plans = {}

    def plan(cell, v):
        key = (cell["seed"], cell["max_mn"], cell["max_k"], cell["batch"], v)
        if key not in plans:
            plans[key] = tb.plan_batched(cell["shapes"], np.float32, version=v)
        return plans[key]

    costs, report = {}, {}
    for v in versions:
        ncls = tcost.N_COST_CLASSES
        theta = np.array(tcost.TILE_COSTS[v], dtype=np.float64).reshape(-1)  # a, b.., t0
        for it in range(args.iters):
            X, y = [], []
            for c in fit:
                p = plan(c, v)
                f = tcost.plan_cost_features(p, theta[:2 * ncls].reshape(2, ncls))
                X.append(np.append(f, 1.0))
                y.append(c[f"v{v}_dev_ms"] * 1e3)
            X, y = np.array(X), np.array(y)
            w = 1.0 / y  # relative error
            used = X[:, :-1].any(axis=0)
            cols = np.append(np.flatnonzero(used), X.shape[1] - 1)
            sol, _ = nnls(X[:, cols] * w[:, None], y * w)
            new = np.zeros_like(theta)
            new[:2 * ncls] = theta[:2 * ncls] * ~used  # classes unseen keep their prior
            new[cols] = sol
            moved = np.nanmax(np.abs(new - theta) / np.maximum(np.abs(theta), 1e-3))
            theta = new
            if moved < 1e-3:
                break
        pred = X @ np.nan_to_num(theta)  # NaN: classes this version has no tiles of
        err = pred / y
        costs[v] = theta
        report[v] = dict(iters=it + 1, geo_err=float(np.exp(np.mean(np.abs(np.log(err))))),
                         worst=float(np.max(np.abs(np.log(err)))))
        a, b = theta[:ncls], theta[ncls:2 * ncls]
        print(f"v{v}: {it + 1} iterations, mean |log err| -> x{report[v]['geo_err']:.3f}, "
              f"worst x{math.exp(report[v]['worst']):.2f}")
        print(f"   a (us / k-step) {np.round(a, 4).tolist()}")
        print(f"   b (us / tile)   {np.round(b, 3).tolist()}   t0 {theta[-1]:.2f} us")

    def choose(cell, theta_of, margin=0.0):
        t = {v: tcost.plan_cost(plan(cell, v), theta_of[v]) for v in versions}
        bv = min(t, key=t.get)
        base = versions[0]
        return bv if t[bv] * (1 + margin) < t[base] else base

    out = dict(costs={v: [None if math.isnan(x) else round(float(x), 5) for x in costs[v]]
                      for v in versions}, fit=report)
    for name, cells in (("fit", fit), ("check", check)):
        if not cells:
            continue
        gm = lambda xs: math.exp(sum(map(math.log, xs)) / len(xs))  # noqa: E731
        model, rule, oracle = [], [], []
        for m in args.margins:
            r = [c[f"v{choose(c, costs, m)}_dev_ms"] / min(c[f"v{v}_dev_ms"] for v in versions)
                 for c in cells]
            print(f"  {name}, margin {m}: model {gm(r):.4f} (worst {max(r):.2f})")
        for c in cells:
            t = {v: c[f"v{v}_dev_ms"] for v in versions}
            o = min(t.values())
            model.append(t[choose(c, costs, args.margin)] / o)
            rule.append(t[c["auto_version"]] / o if c["auto_version"] in t else float("nan"))
            oracle.append(t[1] / o)
        print(f"{name}: {len(cells)} cells; time / fastest of {versions}: model "
              f"{gm(model):.4f} (worst {max(model):.2f}), current rule {gm(rule):.4f} "
              f"(worst {max(rule):.2f}), version 1 always {gm(oracle):.4f}")
        out[name] = dict(cells=len(cells), model=gm(model), rule=gm(rule), v1=gm(oracle),
                         model_worst=max(model), rule_worst=max(rule))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
