"""The floor of a streaming kernel, measured in the same run as the kernels it judges.

TSM2L reads A once and writes C once; nothing it does can take less than

    floor = one empty kernel launch (back to back, timed as the kernels are)
          + (bytes of A + bytes of C) / the measured read bandwidth.

:func:`empty_launch` times a kernel that does nothing, one block of one warp, with
the one timer (``runtime.timing.time_fn``: batched launches behind a spin kernel, so
what is timed is the GPU's own launch-to-launch cost, not Python's). :func:`copy`
is the practical reference: a plain vectorised copy of A's bytes into C (where the
two hold as many bytes, as on every shape of the TSM2L sweep), which pays the same
launch and moves the same bytes with no arithmetic at all.

The pure helpers (:func:`floor_s`, :func:`ratios`) need no GPU.

Examples
--------
>>> from tsm_core.bench import _floor
>>> round(_floor.floor_s(2e-6, 4e6, 2e12) * 1e6, 3)  # 2 us launch + 4 MB at 2 TB/s
4.0
>>> _floor.ratios({"a": 6e-6, "b": None}, 4e-6)
{'a': 1.5, 'b': None}
"""

from __future__ import annotations

import numpy as np

WITHIN = 1.15  # the TSM2L target: at most this many times its floor

# An empty kernel, and a copy through 16-byte vectors in a grid-stride loop with
# four independent loads per thread per iteration (the read-bandwidth kernel's
# shape in runtime/timing.py): enough bytes in flight per SM from the first
# instructions on.
_SRC = r"""
extern "C" __global__ void tsm_bench_empty() {}

extern "C" __global__ void tsm_bench_copy(const float4* __restrict__ src, float4* __restrict__ dst,
                                          long long n4) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + 3 * stride < n4; i += 4 * stride) {
        const float4 a = __ldcs(src + i), b = __ldcs(src + i + stride),
                     c = __ldcs(src + i + 2 * stride), d = __ldcs(src + i + 3 * stride);
        dst[i] = a;
        dst[i + stride] = b;
        dst[i + 2 * stride] = c;
        dst[i + 3 * stride] = d;
    }
    for (; i < n4; i += stride) dst[i] = __ldcs(src + i);
}
"""

_mods: dict = {}
COPY_THREADS = 256


def floor_s(empty_s: float, nbytes: float, read_bw: float) -> float:
    """Seconds of the floor: an empty launch plus `nbytes` at `read_bw` bytes/s."""
    return float(empty_s) + float(nbytes) / float(read_bw)


def ratios(times: dict, floor: float) -> dict:
    """time / floor for each named time (None stays None)."""
    return {k: (None if t is None or not floor else float(t) / floor) for k, t in times.items()}


def _kernel(name: str):
    import cupy

    dev = cupy.cuda.Device().id
    if dev not in _mods:
        _mods[dev] = cupy.RawModule(code=_SRC)
    return _mods[dev].get_function(name)


def empty_launch(reps: int = 20) -> dict:
    """Seconds per launch of an empty kernel (one block of 32 threads), launched back
    to back and timed as the kernels are. Returns ``{"empty_launch_s", "timing"}``."""
    from tsm_core.runtime import timing

    k = _kernel("tsm_bench_empty")
    t = timing.time_fn(lambda: k((1,), (32,), ()), reps=reps)
    return dict(empty_launch_s=t.median_s, timing=t.to_dict())


def copy(sm_count: int):
    """A method ``f(A, B, C)`` copying A's bytes into C through 16-byte vectors (B is
    not read); ``f.applies(A, C)`` says whether it may run: A and C of one size,
    contiguous and 16-byte aligned."""
    k = _kernel("tsm_bench_copy")
    wave = sm_count * (2048 // COPY_THREADS)

    def f(A, B, C):
        n4 = A.nbytes // 16
        grid = max(1, min(wave, -(-n4 // COPY_THREADS)))
        k((grid,), (COPY_THREADS,), (A, C, np.int64(n4)))

    def applies(A, C) -> bool:
        contiguous = (A.flags.c_contiguous or A.flags.f_contiguous) and C.flags.c_contiguous
        return (A.nbytes == C.nbytes and contiguous and A.data.ptr % 16 == 0
                and C.data.ptr % 16 == 0 and A.nbytes % 16 == 0)

    f.applies = applies
    return f
