"""Run tsm_core.gemm and cuBLAS (cupy.matmul) twice each on one float32 square, for
Nsight Compute (developer tool):

    ncu --section WarpStateStats --section SchedulerStats --section InstructionStats \
        -k regex:'gemm_tiled|gemm_async|gemm_pipe|gemm_ws|sgemm|xmma' -c 4 \
        python dev/gemm_ncu_probe.py [N] [--old OLD.cu] [--pipe BKxSTAGES]
        python dev/gemm_ncu_probe.py [N] --strassen LEVELS

--old runs tsm_core.gemm on the gemm.cu given instead of the tree's (see
gemm_probes.py ab); --pipe runs gemm_pipe with that configuration
(``tiled.configs.PipeConfig(BK, STAGES)``, through ``tiled.launch._launch_pipe``)
instead; --strassen runs tsm_core.strassen (twice) instead of gemm."""
import sys

if any(a in ("-h", "--help") for a in sys.argv[1:]):
    print(__doc__)
    raise SystemExit(0)

from pathlib import Path

import cupy as cp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import contextlib  # noqa: E402

import tsm_core  # noqa: E402
from tsm_core.runtime import compile as _compile  # noqa: E402

if not tsm_core.has_gpu():
    print("gemm_ncu_probe: no CUDA GPU found")
    raise SystemExit(2)

args = sys.argv[1:]
old = None
if "--old" in args:
    i = args.index("--old")
    old = args[i + 1]
    del args[i:i + 2]
pipe = levels = None
if "--strassen" in args:
    i = args.index("--strassen")
    levels = int(args[i + 1])
    del args[i:i + 2]
if "--pipe" in args:
    i = args.index("--pipe")
    pipe = tuple(int(x) for x in args[i + 1].split("x"))
    del args[i:i + 2]
n = int(args[0]) if args else 8192
rng = np.random.default_rng(0)
A = cp.asarray(rng.standard_normal((n, n), dtype=np.float32))
B = cp.asarray(rng.standard_normal((n, n), dtype=np.float32))
C = cp.empty((n, n), np.float32)
ctx = _compile.source_from("gemm", old, {}) if old else contextlib.nullcontext()
with ctx:
    for _ in range(2):
        if levels:
            tsm_core.strassen(A, B, levels=levels, out=C)
        elif pipe:
            from tsm_core.tiled import configs as tconfigs
            from tsm_core.tiled import launch as tlaunch

            tlaunch._launch_pipe(A, B, C, 1.0, 0.0, tconfigs.PipeConfig(*pipe))
        else:
            tsm_core.gemm(A, B, out=C)
for _ in range(2):
    cp.matmul(A, B, out=C)
cp.cuda.Device().synchronize()
