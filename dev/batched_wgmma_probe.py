"""Version 6's wgmma tiles: correctness of the tree's kernel and of variants of its
operand conventions, on one device call (developer tool).

    python dev/batched_wgmma_probe.py [--variants tree,swap_lbo_sbo,...]
        [--time tree,stages4,hi_only,no_lo_b_pass] [--min-mn 512]

Each variant is batched/batched.cu with a text substitution (the descriptor's two
byte offsets swapped, A's fragment registers in another order, only hi(A) hi(B)),
compiled apart (`_compile.source_from`) and run as version 6 on a batch whose large
problems have 128 x 128 tensor-core tiles (K >= 128, edges in every dimension) and
whose small ones take the FMA tiles. Prints, per variant, the largest relative error
against the float64 product over the tensor-core problems and over the others: the
tree must read about 1e-6 (3xTF32), a wrong layout about 1, hi-only about 1e-3.
"""

import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

VARIANTS = {
    "tree": [],
    "swap_lbo_sbo": [("wg_desc(bhi_s + k8 * 2 * LBO, LBO, SBO)", "wg_desc(bhi_s + k8 * 2 * LBO, SBO, LBO)"),
                     ("wg_desc(blo_s + k8 * 2 * LBO, LBO, SBO)", "wg_desc(blo_s + k8 * 2 * LBO, SBO, LBO)")],
    "a_order_0213": [('"r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3])',
                      '"r"(a[0]), "r"(a[2]), "r"(a[1]), "r"(a[3])')],
    "hi_only": [("            wgmma_tf32_m64n128k8(acc, al[k8], dh);\n"
                 "            wgmma_tf32_m64n128k8(acc, ah[k8], dl);\n", "")],
    # Timing only (--time): other ring depths, and bounds with work removed (wrong
    # results by design: what each part costs).
    "stages4": [("#define TSM_BATCHED_TC3_STAGES 3", "#define TSM_BATCHED_TC3_STAGES 4")],
    "no_lo_b_pass": [("                *reinterpret_cast<float4*>(blo + w) = y;", "")],
}
# Python-side constants a variant needs (the dynamic shared memory it asks for),
# set on tsm_core.batched.plan, where smem_bytes reads them.
CONSTANTS = {"stages4": {"TC3_STAGES": 4}}
WRONG_BY_DESIGN = ("swap_lbo_sbo", "a_order_0213", "hi_only", "no_lo_b_pass")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", default="tree,swap_lbo_sbo,a_order_0213,hi_only")
    ap.add_argument("--time", default="",
                    help="variants to time as version 6 against version 5 (the tree's) on the "
                         "bench's cells of Max_MN >= --min-mn, device time")
    ap.add_argument("--min-mn", type=int, default=512)
    args = ap.parse_args(argv)
    from tsm_core import has_gpu

    if not has_gpu():
        print("batched_wgmma_probe: no CUDA GPU found")
        return 2
    import cupy
    import numpy as np

    from tsm_core.batched import api as tb
    from tsm_core.batched import memo as tmemo
    from tsm_core.batched import plan as tplan
    from tsm_core.runtime import compile as _compile

    rng = np.random.default_rng(3)
    big = [(256, 256, 256), (300, 200, 130), (1000, 700, 513), (128, 128, 128), (129, 257, 200),
           (640, 384, 1024)] * 6  # enough work that the planner keeps 128 x 128 tiles
    small = [(17, 33, 5), (70, 3, 129), (64, 64, 64), (1, 1, 1)] * 8
    shapes = big + small
    As = [rng.standard_normal((m, k)).astype(np.float32) for m, n, k in shapes]
    Bs = [rng.standard_normal((k, n)).astype(np.float32) for m, n, k in shapes]
    refs = [a.astype(np.float64) @ b.astype(np.float64) for a, b in zip(As, Bs)]
    dA = [cupy.asarray(a) for a in As]
    dB = [cupy.asarray(b) for b in Bs]
    tree = _compile.kernel_path("batched").read_text()

    def prepared(name, As, Bs, Cs, version=6):
        """prepare_batched of `version` compiled from variant `name` (None: not built)."""
        text = tree
        for a, b in VARIANTS[name]:
            if a not in text:
                print(f"{name}: substitution not found: {a[:60]!r}")
                return None
            text = text.replace(a, b)
        saved = {k: getattr(tplan, k) for k in CONSTANTS.get(name, {})}
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "batched.cu")
            with open(path, "w") as f:
                f.write(text)
            try:
                for k, v in CONSTANTS.get(name, {}).items():
                    setattr(tplan, k, v)
                with _compile.source_from("batched", path):
                    tmemo.plans.clear()
                    return tb.prepare_batched(As, Bs, Cs, version=version, split_k=False)
            except Exception as exc:  # report and go on to the next variant
                print(f"{name}: {type(exc).__name__}: {str(exc)[:300]}", flush=True)
                return None
            finally:
                for k, v in saved.items():
                    setattr(tplan, k, v)

    for name in [v for v in args.variants.split(",") if v]:
        dC = [cupy.full((m, n), np.nan, dtype=np.float32) for m, n, _ in shapes]
        prep = prepared(name, dA, dB, dC)
        if prep is None:
            continue
        prep.run()
        cupy.cuda.Device().synchronize()
        tc = prep.plan.tiles[:, 3] == tplan.XL_TYPE
        errs = [float(np.abs(cupy.asnumpy(c) - r).max() / max(np.abs(r).max(), 1e-30))
                for c, r in zip(dC, refs)]
        tc_probs = sorted(set(prep.plan.tiles[tc, 0].tolist()))
        other = [i for i in range(len(shapes)) if i not in tc_probs]
        worst = max((errs[i] for i in tc_probs), default=float("nan"))
        print(f"{name:14s} {len(tc_probs)} problems with tensor-core tiles: max rel err "
              f"{worst:.2e}; the {len(other)} others {max(errs[i] for i in other):.2e}", flush=True)

    timed = [v for v in args.time.split(",") if v]
    if timed:
        import math

        import torch

        from tsm_core.runtime import timing as _timing
        from tsm_core.bench._batched import _cells, cell_tensors

        ratios = {v: [] for v in timed}
        for mn, mk, bs, cshapes in _cells(argparse.Namespace(quick=False, seed=0)):
            if mn < args.min_mn:
                continue
            As, Bs, Cs = cell_tensors(torch, mn, mk, bs, cshapes, 0)
            t5 = _timing.time_fn(tb.prepare_batched(As, Bs, Cs, version=5, split_k=False).run,
                                 reps=10, max_time_s=0.3).median_s
            line = f"{mn:5d} {mk:4d} {bs:4d} v5 {t5 * 1e3:.4f}"
            for v in timed:
                prep = prepared(v, As, Bs, Cs)
                if prep is None:
                    continue
                t = _timing.time_fn(prep.run, reps=10, max_time_s=0.3).median_s
                ratios[v].append(t5 / t)
                line += f"  {v} {t * 1e3:.4f}"
            print(line, flush=True)
        for v, r in ratios.items():
            if r:
                g = math.exp(sum(map(math.log, r)) / len(r))
                note = " (wrong by design: a bound)" if v in WRONG_BY_DESIGN else ""
                print(f"v6 {v}: geomean {g:.3f}x of version 5's speed, {min(r):.3f}-{max(r):.3f}{note}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
