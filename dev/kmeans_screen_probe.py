""""float32" as a TF32 screen (TSM_KMEANS_SCREEN) against the three-product kernel and
plain TF32: ms per assignment (CUDA events, median of 7), the share of rows the
screen lists, and whether its labels equal the unscreened kernel's; then the screen's
parts: the TF32 pass alone, the gather of the listed rows, their "float32" pass, the
scatter of their labels and distances.

    python dev/kmeans_screen_probe.py [n,d,k ...]
"""

from tsm_core.kmeans.tensor import TensorAssign
from tsm_core.runtime import timing
from _probe import assignment_case, shapes


def ms(fn, reps=7):
    """Median ms of fn() between CUDA events, after one untimed call."""
    return timing.event_median(fn, warmup=1, reps=reps) * 1e3


for n, d, k in shapes([(4_000_000, 128, 1024), (1_000_000, 64, 1024), (10_000_000, 32, 256),
                       (1_000_000, 128, 8192), (3_000_000, 96, 2048), (1_000_000, 128, 64)]):
    X, C, lab, md, ch = assignment_case(n, d, k)
    out = {}
    for name, prec, screen in (("tf32", "tf32", False), ("float32", "float32", False),
                               ("screen", "float32", True)):
        tc = TensorAssign(n, d, k, prec, screen=screen)
        tc.prepare(C)
        t = ms(lambda: tc.run(X, lab, md, ch, None))
        out[name] = (t, lab.copy(), tc)
    share = out["screen"][2].stats["screened"] / max(1, out["screen"][2].stats["rows"])
    same = bool((out["screen"][1] == out["float32"][1]).all())
    print(f"({n}, {d}, {k}) mode {out['screen'][2].mode}: tf32 {out['tf32'][0]:.3f} | float32 "
          f"{out['float32'][0]:.3f} | screen {out['screen'][0]:.3f} (listed {share:.2%}, labels equal: {same})",
          flush=True)
    sc = out["screen"][2]
    full = sc._screened
    sc._screened = lambda *a: None
    t_main = ms(lambda: sc.run(X, lab, md, ch, None))
    sc._screened = full
    m = int(sc.counts[0].get())
    idx = sc.lists[:m]
    cap = sc.xf.shape[0]
    c = min(m, cap)
    xf = sc.xf[:c, :d]

    def gather():
        sc._gather(X, idx[:c], None)

    def scatter():
        lab[idx[:c]] = sc.lab_f[:c]
        md[idx[:c]] = sc.md_f[:c]

    t_g = ms(gather)
    t_x = ms(lambda: sc.exact.run(xf, sc.lab_f[:c], sc.md_f[:c], ch, None))
    t_s = ms(scatter)
    print(f"    parts: tf32 pass {t_main:.3f} | gather {t_g:.3f} | float32 pass on {c} rows {t_x:.3f} | "
          f"scatter {t_s:.3f} | sum {t_main + t_g + t_x + t_s:.3f}", flush=True)
