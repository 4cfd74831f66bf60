"""One warmed-up call of an app's launch between cudaProfilerStart/Stop, for Nsight
Compute's ``--profile-from-start off`` (developer tool):

    ncu --profile-from-start off --section SpeedOfLight --section ComputeWorkloadAnalysis \\
        --section WarpStateStats --section SchedulerStats --section Occupancy \\
        python dev/ncu_apps_probe.py inception [BATCH]
    ncu --profile-from-start off ... python dev/ncu_apps_probe.py batched

inception: block 3b (module 2), seeded weights and input, batch 32 by default; the
three warm-up calls tune its launches first, so the profiled call runs the tuner's
picks. batched: prepared batches of the 1024 / 512 / 256 cell on kernel version 3 and
the 512 / 512 / 64 cell on version 1 (tsm_datasets.irregular, seed 0); or the cells
given as MN:K:BS:VERSION (``batched 1024:512:256:6 512:512:64:5``)."""
import sys
from pathlib import Path

import cupy as cp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def inception(batch=32):
    from tsm_apps.inception import InceptionBlock

    blk = InceptionBlock(2)
    x = cp.asarray(np.random.default_rng(0).standard_normal((batch, 256, 28, 28), dtype=np.float32))
    for _ in range(3):
        blk(x)
    cp.cuda.Device().synchronize()
    cp.cuda.profiler.start()
    blk(x)
    cp.cuda.Device().synchronize()
    cp.cuda.profiler.stop()


def batched(cases=((1024, 512, 256, 3), (512, 512, 64, 1))):
    from tsm_datasets.irregular import irregular_shapes
    from tsm_core.batched import api as _batched

    for mn, k, bs, v in cases:
        shapes = irregular_shapes(mn, k, bs, seed=0)
        rng = np.random.default_rng(0)
        As = [cp.asarray(rng.standard_normal((m, kk), dtype=np.float32)) for m, n, kk in shapes]
        Bs = [cp.asarray(rng.standard_normal((kk, n), dtype=np.float32)) for m, n, kk in shapes]
        Cs = [cp.empty((m, n), np.float32) for m, n, kk in shapes]
        p = _batched.prepare_batched(As, Bs, Cs, version=v)
        p.run()
        cp.cuda.Device().synchronize()
        cp.cuda.profiler.start()
        p.run()
        cp.cuda.Device().synchronize()
        cp.cuda.profiler.stop()


if __name__ == "__main__":
    if any(a in ("-h", "--help") for a in sys.argv[1:]):
        print(__doc__)
        raise SystemExit(0)
    from tsm_core import has_gpu

    if not has_gpu():
        print("ncu_apps_probe: no CUDA GPU found")
        raise SystemExit(2)
    what = sys.argv[1] if len(sys.argv) > 1 else "inception"
    if what == "inception":
        inception(int(sys.argv[2]) if len(sys.argv) > 2 else 32)
    elif what == "batched" and len(sys.argv) > 2:  # batched MN:K:BS:VERSION ...
        batched([tuple(int(x) for x in c.split(":")) for c in sys.argv[2:]])
    elif what == "batched":
        batched()
    else:
        raise SystemExit(f"unknown probe {what!r}: inception or batched")
