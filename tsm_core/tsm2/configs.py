"""Kernel rules and tuning spaces of TSM2R and TSM2L, as data.

What both the performance model (``model.py``) and the launchers (``launch.py``)
need to agree on, and the candidate values the autotuner (``autotune.py``) times.
This module imports nothing of tsm_core, so any of them may import it.

Examples
--------
>>> from tsm_core.tsm2 import configs
>>> configs.TSM2L_KMAX, configs.V3D_N2_MIN_ELEMS == 2**26
(32, True)
"""

# TSM2L opt1 keeps all of k in one shared-memory tile (tsm2/tsm2l.cu): k at most this.
TSM2L_KMAX = 32

# float64 TSM2R on row-major A with n <= 2 runs on the FP64 tensor cores (tsm2r_v3d)
# from this many elements of A, on the FMA kernel (tsm2r_v3r) below. Measured on the
# H100 on 2026-11-23, fraction of the read bandwidth, n = 2, FMA -> DMMA with
# stream-K: m = k = 10240 / 20480 / 30720 0.89 / 0.91 / 0.92 -> 0.93 / 0.97 / 0.98,
# but m = k = 4096 0.82 -> 0.78.
V3D_N2_MIN_ELEMS = 2**26

# The autotuner's search: split-K counts tried besides the launcher's own (each
# split at least 4 k-steps deep), and TSM2L thread count factors.
SPLITS_TRIED = (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16, 20, 24, 32)
TCF_TRIED = (1, 2, 4, 8, 16, 32, 64)

# tsm2l_opt1w (row-major A, short rows): load instructions per warp step tried.
# float64 stops at 4: its B slice and two register sets of A leave no room for 8.
OPT1W_U_TRIED = {4: (1, 2, 4, 8), 8: (1, 2, 4)}

# tsm2l_opt1d (column-major A read straight into registers): block shapes (threads,
# rows per thread; 0 = the widest A's alignment and the register budget allow),
# C staged per warp (1) or stored directly (-1), and thread count factors tried.
# Small blocks and few rows per thread give mid-sized m (1e4 .. 1e6) more blocks
# than SMs; tcf > 1 gives large m the prefetch across tiles.
OPT1D_SHAPES_TRIED = ((128, 0), (64, 0), (256, 0), (128, 2), (128, 1))
OPT1D_STAGE_TRIED = (1, -1)
OPT1D_TCF_TRIED = (1, 2, 4, 8)
