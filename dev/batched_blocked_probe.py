"""Blocked accumulation in the batched kernel: device time and per-problem error of
versions 1 and 5 with it off, only outside the cp.async-ring tiles, everywhere of up
to 8 sums a thread, and also in the ring's 64 x 64 tiles (16 sums),
on cells of the batched sweep and the accuracy bench's batches (one process).

    python dev/batched_blocked_probe.py
"""
import math
import re
import tempfile
from pathlib import Path

import cupy
import numpy as np

from tsm_core.batched import prepare_batched
from tsm_core.bench._batched import accuracy_shapes, sampled_error
from tsm_core.runtime import compile as _compile
from tsm_core.runtime import timing as _timing
from tsm_datasets.irregular import irregular_shapes

SRC = _compile.kernel_path("batched")
VARIANTS = {"off": {"TSM_BATCHED_BLOCKED_MAX": "0"},
            "v1-only": {"TSM_BATCHED_BLOCKED_CP": "0"},
            "all": {},
            "all+64x64": {"TSM_BATCHED_BLOCKED_MAX_CP": "16"}}
CELLS = [(128, 128, 64), (256, 512, 128), (512, 256, 128), (512, 512, 32), (1024, 256, 16),
         (1024, 512, 64), (1024, 512, 256), (1024, 128, 256)]


def variant_file(tmp, name, defs):
    text = SRC.read_text()
    for k, v in defs.items():
        text, n = re.subn(rf"#define {k} \S+", f"#define {k} {v}", text)
        assert n == 1, k
    p = Path(tmp) / f"batched_{name}.cu"
    p.write_text(text)
    return p


def main():
    rng = np.random.default_rng(0)
    cells = []
    for mn, k, b in CELLS:
        shapes = irregular_shapes(mn, k, b, seed=0)
        As = [cupy.asarray(rng.standard_normal((m, kk)), dtype=np.float32) for m, n, kk in shapes]
        Bs = [cupy.asarray(rng.standard_normal((kk, n)), dtype=np.float32) for m, n, kk in shapes]
        cells.append(((mn, k, b), As, Bs, [cupy.empty((m, n), np.float32) for m, n, _ in shapes]))
    acc = []
    for K in (256, 1024, 8192):
        shapes = accuracy_shapes(K, np.random.default_rng(K))
        As = [rng.standard_normal((m, k)).astype(np.float32) for m, n, k in shapes]
        Bs = [rng.standard_normal((k, n)).astype(np.float32) for m, n, k in shapes]
        picks = [(np.arange(min(m, 48)), np.arange(min(n, 48))) for m, n, _ in shapes]
        dA, dB = [cupy.asarray(a) for a in As], [cupy.asarray(b) for b in Bs]
        theirs = [sampled_error(cupy.asnumpy(cupy.matmul(a, b)), A, B, r, q)
                  for a, b, A, B, (r, q) in zip(dA, dB, As, Bs, picks)]
        acc.append((K, shapes, As, Bs, dA, dB, picks, theirs))
    times = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, defs in VARIANTS.items():
            with _compile.source_from("batched", variant_file(tmp, name, defs)):
                for v in (1, 5):
                    for key, As, Bs, Cs in cells:
                        prep = prepare_batched(As, Bs, Cs, version=v)
                        t = min(_timing.event_median(prep.run, warmup=3, reps=25) for _ in range(3))
                        times[(name, v, key)] = t
                    for K, shapes, As, Bs, dA, dB, picks, theirs in acc:
                        dC = [cupy.full((m, n), np.nan, np.float32) for m, n, _ in shapes]
                        prepare_batched(dA, dB, dC, version=v).run()
                        ours = [sampled_error(cupy.asnumpy(c), A, B, r, q)
                                for c, A, B, (r, q) in zip(dC, As, Bs, picks)]
                        unit = float(np.finfo(np.float32).eps)
                        worst = max(o / max(t, unit) for o, t in zip(ours, theirs))
                        print(f"accuracy {name:8s} v{v} K={K}: worst per-problem ratio {worst:.2f}",
                              flush=True)
    print("device ms per cell (min of 3 medians of 25)")
    for v in (1, 5):
        for key, *_ in cells:
            row = [times[(n, v, key)] * 1e3 for n in VARIANTS]
            print(f"v{v} {key}: " + "  ".join(f"{n} {t:.4f}" for n, t in zip(VARIANTS, row))
                  + "  " + "  ".join(f"{n}/off {t / row[0]:.3f}" for n, t in
                                     zip(list(VARIANTS)[1:], row[1:])))
        for n in list(VARIANTS)[1:]:
            g = [math.log(times[(n, v, k)] / times[("off", v, k)]) for k, *_ in cells]
            print(f"v{v} geomean {n}/off {math.exp(np.mean(g)):.3f}")


if __name__ == "__main__":
    main()
