"""Autotuning support of a convolution group (``ConvGroup.autotune``): when a size is
tuned, how candidates are checked against each other, and how a launch is timed."""

from __future__ import annotations

import numpy as np

# Launches of at least this many GEMM columns (N*H*W) are tuned on their first call:
# all of them. The model's pick lost up to 25% of a launch at batch 32 and 128, and
# at batch 1 it lost 2-3x on the second launch (32 x 32 split-K tiles where 64 x 64
# ran 37 us against 120 us; H100). The candidates differ by far more
# than the spread of five timed runs, even for launches of 20 us.
TUNE_MIN_COLUMNS = 1


# autotune: the largest relative difference (max |a - b| / max |b|) a candidate's
# outputs may show against the first candidate's. float32 FMA tiles and 3xTF32 agree
# to about 1e-6; a wrong kernel differs by O(1).
TUNE_AGREE = 1e-4


def rel_diff(a, b) -> float:
    """max |a - b| / max |b| over the elements finite in b; inf where a and b differ in
    which elements are NaN or infinite. NumPy or CuPy arrays."""
    xp = np
    if type(a).__module__.startswith("cupy"):
        import cupy as xp
    if not bool(xp.array_equal(xp.isfinite(a), xp.isfinite(b))) or \
            not bool(xp.array_equal(xp.isnan(a), xp.isnan(b))):
        return float("inf")
    fin = xp.isfinite(b)
    d = float(xp.abs(xp.where(fin, a, 0) - xp.where(fin, b, 0)).max()) if a.size else 0.0
    m = float(xp.abs(xp.where(fin, b, 0)).max()) if b.size else 0.0
    return d / m if m > 0 else d


def launch_ms(launch, stream, reps: int = 5) -> float:
    """Median milliseconds of one ``launch()`` on `stream` (a CuPy stream), between two
    CUDA events, over `reps` runs. A candidate's launch is timed alone, as the group
    runs it (no spin kernel in front: the launches timed are 20 us or longer and the
    candidates differ by far more than this clock's error)."""
    import cupy

    ts = []
    for _ in range(reps):
        e0, e1 = cupy.cuda.Event(), cupy.cuda.Event()
        e0.record(stream)
        launch()
        e1.record(stream)
        e1.synchronize()
        ts.append(cupy.cuda.get_elapsed_time(e0, e1))
    return float(np.median(ts))
