"""Two questions about the batched planner, answered in device time on the H100
(developer tool; session 18). Seeded batches of the paper's sweep (torch CUDA
tensors, float32), launched through ``prepare_batched`` with the call's own choice of
kernel version:

    python benchmarks/batched_planner_probe.py tlp [--fractions 1,0.5,0.25,0.125] [--max-batch 256]
        [--no-split-k]
    python benchmarks/batched_planner_probe.py splitk [--splits 1,2,4,8] [--max-batch 64]

tlp: the fine-tuning loop's threshold scaled by each fraction (``_batched.TLP_FRACTION``;
1 is the paper's), plans and metadata rebuilt for each.
splitk: split-K emulated (as in session 18, before it was implemented; real split-K
off, ``split_k=False``): every problem with K >= 128 becomes s
problems of K / s (s = min(split, K // 64)), each writing its own C (the partial
sums are not added: this bounds what a split-K kernel could gain, before its
reduction), the whole batch planned afresh.
Prints one line per cell: device ms, kernel version and tile count per setting.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=("tlp", "splitk"))
    ap.add_argument("--fractions", default="1,0.5,0.25,0.125")
    ap.add_argument("--splits", default="1,2,4,8")
    ap.add_argument("--max-batch", type=int, default=None)
    ap.add_argument("--no-split-k", action="store_true", help="tlp: plans without split-K")
    args = ap.parse_args(argv)
    from tsm_core import has_gpu

    if not has_gpu():
        print("batched_planner_probe: no CUDA GPU found; nothing to time")
        return 1
    import torch

    from tsm_core.batched import api as _batched
    from tsm_core.runtime import timing as _timing
    from tsm_core.bench._batched import _cells, cell_tensors

    dev = torch.device("cuda")
    limit = args.max_batch or (256 if args.what == "tlp" else 64)
    settings = [float(x) for x in (args.fractions if args.what == "tlp" else args.splits).split(",")]
    for mn, mk, bs, shapes in _cells(argparse.Namespace(quick=False, seed=0)):
        if bs > limit:
            continue
        As, Bs, Cs = cell_tensors(torch, mn, mk, bs, shapes)  # the bench's (seed 0)
        out = []
        for x in settings:
            a2, b2, c2 = As, Bs, Cs
            if args.what == "tlp":
                _batched.TLP_FRACTION = x
                _batched._plans.clear()
                _batched._metas.clear()
            else:
                a2, b2, c2 = [], [], []
                for a, b in zip(As, Bs):
                    K = a.shape[1]
                    s = max(1, min(int(x), K // 64))
                    ch = -(-K // s)
                    for k0 in range(0, K, ch):
                        a2.append(a[:, k0:k0 + ch])
                        b2.append(b[k0:k0 + ch])
                        c2.append(torch.empty(a.shape[0], b.shape[1], device=dev))
            # splitk: session 18's frame, no real split-K under the emulation; tlp: the
            # call's own plan (split-K as chosen) unless --no-split-k.
            prep = _batched.prepare_batched(a2, b2, c2, split_k=False if (
                args.what == "splitk" or args.no_split_k) else None)
            t = _timing.time_fn(prep.run, reps=10, max_time_s=0.2)
            out.append((x, t.median_s * 1e3, prep._launch.version, prep.plan.n_tiles))
        tag = "f" if args.what == "tlp" else "s"
        print(f"{mn:5d} {mk:4d} {bs:3d} " + "  ".join(
            f"{tag}{x:g} {ms:.4f} v{v} t{n}" for x, ms, v, n in out), flush=True)
    _batched.TLP_FRACTION = 1.0
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
