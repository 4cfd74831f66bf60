"""Run one TSM2R row-major case twice, for Nsight Compute (developer tool):
    ncu --section WarpStateStats --section SchedulerStats -k regex:tsm2r_v3r -c 2 \
        python dev/ncu_probe.py"""
import sys

if any(a in ("-h", "--help") for a in sys.argv[1:]):
    print(__doc__)
    raise SystemExit(0)

from tsm_core import has_gpu  # noqa: E402

if not has_gpu():
    print("ncu_probe: no CUDA GPU found")
    raise SystemExit(2)

import cupy as cp
import numpy as np

import tsm_core

dt = np.float64 if "f64" in sys.argv else np.float32
m, n = 20480, 16
rng = np.random.default_rng(0)
A = cp.asarray(rng.standard_normal((m, m)), dtype=dt)
B = cp.asarray(rng.standard_normal((m, n)), dtype=dt)
C = cp.empty((m, n), dt)
for _ in range(2):
    tsm_core.tsm2r(A, B, out=C)
cp.cuda.Device().synchronize()
