"""Probe of the warp-specialised warpgroup kernel (TSM_KMEANS_WS) against the
per-tile and persistent forms (all forced on with TSM_KMEANS_WGMMA=1): ms per
assignment, decisions included, and whether the labels agree, on uniform data with
centres drawn from the rows (as the precision sweep).

    PRECS=tf32,float32,bfloat16 python dev/kmeans_ws_probe.py [n,d,k ...]
"""
import os

os.environ["TSM_KMEANS_WGMMA"] = "1"
import cupy as cp  # noqa: E402

from tsm_core.kmeans.assign import storage_rows  # noqa: E402
from tsm_core.kmeans.tensor import TensorAssign  # noqa: E402
from tsm_core.runtime.timing import time_fn  # noqa: E402
from _probe import assignment_case, shapes as probe_shapes  # noqa: E402

SHAPES = [(4_000_000, 128, 1024), (1_000_000, 128, 8192), (10_000_000, 32, 256), (1_000_000, 64, 1024),
          (10_000_000, 32, 8), (2_000_000, 96, 2048)]
FORMS = {"tile": ("0", "0"), "persist": ("0", "1"), "ws": ("1", "0")}


def probe(n, d, k):
    X, C, labels, mind, changed = assignment_case(n, d, k)
    line = f"{str((n, d, k)):>22}"
    for prec in os.environ.get("PRECS", "tf32,float32,bfloat16").split(","):
        Xs = storage_rows(X, "float32", prec)
        ms, labs = {}, {}
        for form, (ws, persist) in FORMS.items():
            os.environ["TSM_KMEANS_WS"], os.environ["TSM_KMEANS_PERSIST"] = ws, persist
            tc = TensorAssign(n, d, k, prec)
            if not tc.wg:
                break
            tc.prepare(C)
            ms[form] = time_fn(lambda: tc.run(Xs, labels, mind, changed, labels), reps=7).median_s * 1e3
            labs[form] = (labels.copy(), mind.copy())
            del tc
        if not ms:
            continue
        diff = {f: (int((labs[f][0] != labs["tile"][0]).sum()), int((labs[f][1] != labs["tile"][1]).sum()))
                for f in labs if f != "tile"}
        same = not any(a or b for a, b in diff.values())
        note = "" if same else f", labels/distances differ from tile: {diff}"
        line += (f" | {prec} tile {ms['tile']:.2f} persist {ms['persist']:.2f} ws {ms['ws']:.2f} "
                 f"({ms['tile'] / ms['ws']:.2f}x, {2 * n * k * d / ms['ws'] / 1e9:.0f} TF/s{note})")
        del Xs
        cp.get_default_memory_pool().free_all_blocks()
    print(line, flush=True)


if __name__ == "__main__":
    shapes = probe_shapes(SHAPES)
    for s in shapes:
        probe(*s)
