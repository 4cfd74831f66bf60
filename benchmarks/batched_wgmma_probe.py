"""Version 6's wgmma tiles: correctness of the tree's kernel and of variants of its
operand conventions, on one device call (developer tool, session 21).

    python benchmarks/batched_wgmma_probe.py [--variants tree,swap_lbo_sbo,...]

Each variant is kernels/batched.cu with a text substitution (the descriptor's two
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
}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", default=",".join(VARIANTS))
    args = ap.parse_args(argv)
    from tsm_core import has_gpu

    if not has_gpu():
        print("batched_wgmma_probe: no CUDA GPU found")
        return 1
    import cupy
    import numpy as np

    from tsm_core import _batched as tb
    from tsm_core import _compile

    rng = np.random.default_rng(3)
    big = [(256, 256, 256), (300, 200, 130), (1000, 700, 513), (128, 128, 128), (129, 257, 200),
           (640, 384, 1024)]
    small = [(17, 33, 5), (70, 3, 129), (64, 64, 64), (1, 1, 1)] * 8
    shapes = big + small
    As = [rng.standard_normal((m, k)).astype(np.float32) for m, n, k in shapes]
    Bs = [rng.standard_normal((k, n)).astype(np.float32) for m, n, k in shapes]
    refs = [a.astype(np.float64) @ b.astype(np.float64) for a, b in zip(As, Bs)]
    dA = [cupy.asarray(a) for a in As]
    dB = [cupy.asarray(b) for b in Bs]
    tree = (_compile.KERNEL_DIR / "batched.cu").read_text()
    for name in args.variants.split(","):
        text = tree
        for a, b in VARIANTS[name]:
            if a not in text:
                print(f"{name}: substitution not found: {a[:60]!r}")
                text = None
                break
            text = text.replace(a, b)
        if text is None:
            continue
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "batched.cu")
            with open(path, "w") as f:
                f.write(text)
            try:
                with _compile.source_from("batched", path):
                    dC = [cupy.full((m, n), np.nan, dtype=np.float32) for m, n, _ in shapes]
                    prep = tb.prepare_batched(dA, dB, dC, version=6, split_k=False)
                    tc = (prep.plan.tiles[:, 3] == tb.XL_TYPE)
                    prep.run()
                    cupy.cuda.Device().synchronize()
            except Exception as exc:  # report and go on to the next variant
                print(f"{name}: {type(exc).__name__}: {str(exc)[:300]}", flush=True)
                continue
        errs = [float(np.abs(cupy.asnumpy(c) - r).max() / max(np.abs(r).max(), 1e-30))
                for c, r in zip(dC, refs)]
        tc_probs = sorted(set(prep.plan.tiles[tc, 0].tolist()))
        other = [i for i in range(len(shapes)) if i not in tc_probs]
        print(f"{name:14s} tensor-core problems {tc_probs}: max rel err "
              f"{max(errs[i] for i in tc_probs):.2e}; others {max(errs[i] for i in other):.2e}",
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
