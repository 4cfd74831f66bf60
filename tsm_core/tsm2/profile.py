"""The TSM2L launch profile: a fixed cost and a streaming efficiency, measured once
per GPU, dtype, order of A and k bucket, and cached on disk (the planner's
"offline profiling", as the paper profiles t1).

Why: a TSM2L launch moves little data per row, and below about a million rows its
time is mostly a fixed cost (the launch, then a chain of memory round trips and
sums that nothing overlaps when each block has one tile) that no bandwidth term
describes: the Little's-law model missed by up to 42% at m = 1e4 - 1e5 on the H100
(docs/NOTES.md, session 6). Over the whole range the measured times follow

    t(m) = fixed + bytes(m) / (eff x peak_bw)

within about 10% (the committed H100 sweep, m = 1e4 ... 1e7, all eight dtype /
order / k cases), so two launches of the launcher's own default configuration
determine both figures: a small one (A of 512 KiB, inputs cycled so that they miss
L2) and a large one (A of 256 MiB). Neither is a benchmark shape; k = n = the k
bucket (k rounded up to a power of two, at most 32).

``tsm2l_profile(spec, dtype, a_order, k)`` returns the cached figures, measures them
(about a second, one line on stderr) when the current GPU is the one `spec`
describes, and returns None otherwise (a spec from the table, no GPU, a CUDA tool
such as compute-sanitizer attached, a busy GPU, or ``TSM_PROFILE=0``): the planner
then keeps its Little's-law model.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np

from tsm_core.runtime import device as _device

SMALL_A_BYTES = 2**19
LARGE_A_BYTES = 2**28
PROFILE_VERSION = 1
# A profile whose large launch streams below this share of the bandwidth is not
# cached (another process on the GPU): the H100 measures 0.88-0.95.
MIN_EFF = 0.25

_memo: dict = {}


def enabled() -> bool:
    return os.environ.get("TSM_PROFILE", "1") != "0"


def k_bucket(k: int) -> int:
    kb = 1
    while kb < k:
        kb *= 2
    return kb


def _path(gpu_name: str):
    return _device.cache_dir() / f"profile-{_device._sanitise(gpu_name)}.json"


def _key(dtype, a_order: str, kb: int) -> str:
    from tsm_core.runtime import compile as _compile

    return f"tsm2l|{np.dtype(dtype).name}|{a_order}|k{kb}|v{PROFILE_VERSION}|{_compile.source_hash('tsm2l')}"


def _load(path) -> dict:
    try:
        data = json.loads(path.read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _current_gpu_is(spec) -> bool:
    if getattr(spec, "source", None) != "measured":
        return False
    try:
        import cupy

        dev = cupy.cuda.runtime.getDevice()
        name = cupy.cuda.runtime.getDeviceProperties(dev)["name"]
        name = name.decode() if isinstance(name, bytes) else name
    except Exception:  # no CuPy, no GPU
        return False
    return name == spec.name


def fit(small: tuple[float, float], large: tuple[float, float], peak_bw: float) -> tuple[float, float]:
    """(fixed_s, eff) of the line through two (bytes, seconds) points: the time at
    zero bytes, and the slope as a fraction of peak_bw (clamped to (0.05, 1])."""
    (b0, t0), (b1, t1) = small, large
    if not (b1 > b0 > 0 and t1 > 0 and t0 > 0):
        raise ValueError(f"profile points must grow in bytes and be timed: {small}, {large}")
    slope = (t1 - t0) / (b1 - b0)  # seconds per byte
    eff = min(1.0, max(0.05, 1.0 / (slope * peak_bw))) if slope > 0 else 1.0
    fixed = max(0.0, t0 - b0 / (eff * peak_bw))
    return fixed, eff


def _time_launch(m: int, kb: int, dtype, a_order: str, seed: int) -> tuple[int, float]:
    """(bytes, median seconds) of the default TSM2L launch on (m, kb) @ (kb, kb)."""
    import cupy

    from tsm_core.tsm2 import launch as _tsm2
    from tsm_core.runtime import timing as _timing

    nbytes = (m * kb + kb * kb + m * kb) * np.dtype(dtype).itemsize
    sets = _timing.operand_sets(m, kb, kb, dtype, a_order, seed)

    def call(A, B, C):
        _tsm2.launch_tsm2l(A, B, C, 1.0, 0.0, None, tuned=False)

    t = _timing.time_fn(_timing.cycling(call, sets), reps=15)
    del sets
    cupy.get_default_memory_pool().free_all_blocks()
    return nbytes, t.median_s


def measure(spec, dtype, a_order: str, kb: int) -> dict:
    item = np.dtype(dtype).itemsize
    m_small = max(1, SMALL_A_BYTES // (kb * item))
    m_large = max(m_small * 2, LARGE_A_BYTES // (kb * item))
    print(f"tsm_core: profiling TSM2L on {spec.name} ({np.dtype(dtype).name}, A {a_order}-ordered, "
          f"k = n = {kb}; once, cached in {_path(spec.name)}) ...", file=sys.stderr, flush=True)
    small = _time_launch(m_small, kb, dtype, a_order, seed=1)
    large = _time_launch(m_large, kb, dtype, a_order, seed=2)
    fixed, eff = fit(small, large, spec.peak_bw)
    if eff < MIN_EFF:
        raise RuntimeError(f"the large launch streamed at {eff:.0%} of the bandwidth: the GPU is busy")
    return dict(fixed_s=fixed, eff=eff, m_small=m_small, m_large=m_large, k=kb, n=kb,
                small=list(small), large=list(large), peak_bw=spec.peak_bw)


def tsm2l_profile(spec, dtype, a_order: str, k: int) -> dict | None:
    """{"fixed_s", "eff", ...} of TSM2L for this GPU, dtype, order of A and k bucket,
    measured on first use; None where it cannot be (see the module docstring)."""
    if not enabled() or k > 32 or k < 1:
        return None
    kb = k_bucket(k)
    mkey = (spec, np.dtype(dtype).name, a_order, kb)
    if mkey in _memo:
        return _memo[mkey]
    if not _current_gpu_is(spec) or os.environ.get("CUDA_INJECTION64_PATH"):
        return None  # not this GPU, or timed under a tool (compute-sanitizer, Nsight)
    path, key = _path(spec.name), _key(dtype, a_order, kb)
    prof = _load(path).get(key)
    if prof is None:
        try:
            prof = measure(spec, dtype, a_order, kb)
        except Exception as exc:  # out of memory, say: plan without it
            print(f"tsm_core: TSM2L profile failed ({type(exc).__name__}: {exc}); "
                  "using the Little's-law model", file=sys.stderr, flush=True)
            _memo[mkey] = None
            return None
        data = _load(path)  # re-read: another process may have added keys
        data[key] = prof
        try:
            _device._write_json(path, data)
        except OSError:  # a read-only cache only costs measuring again next time
            pass
    _memo[mkey] = prof
    return prof
