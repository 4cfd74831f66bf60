"""The TSM2L launch profile: a fixed cost and a streaming efficiency per GPU, dtype,
order of A and k bucket, kept on disk (the planner's "offline profiling", as the
paper profiles t1). This module stores and reads the figures; it launches nothing:
``tsm_core.tsm2.autotune.measure_tsm2l_profile`` measures them.

Why: a TSM2L launch moves little data per row, and below about a million rows its
time is mostly a fixed cost (the launch, then a chain of memory round trips and
sums that nothing overlaps when each block has one tile) that no bandwidth term
describes: the Little's-law model missed by up to 42% at m = 1e4 - 1e5 on the H100
(measured on 2026-11-23). Over the whole range the measured times follow

    t(m) = fixed + bytes(m) / (eff x peak_bw)

within about 10% (an H100 sweep of m = 1e4 ... 1e7, all eight dtype / order / k
cases), so two launches of the launcher's own default configuration determine
both figures: a small one (A of 512 KiB, inputs cycled so that they miss L2) and a
large one (A of 256 MiB). Neither is a benchmark shape; k = n = the k bucket (k
rounded up to a power of two, at most 32).

``tsm2l_profile(spec, dtype, a_order, k, measure=...)`` returns the stored figures,
measures them with ``measure`` (about a second, one log line) where none are
stored and the current GPU is the one `spec` describes, and returns None otherwise
(a spec from the table, no GPU, a CUDA tool such as compute-sanitizer attached, a
busy GPU, no ``measure`` given, or ``TSM_PROFILE=0``): the planner then keeps its
Little's-law model.

Examples
--------
>>> from tsm_core.tsm2 import profile
>>> [profile.k_bucket(k) for k in (1, 3, 9, 32)]
[1, 4, 16, 32]
>>> fixed, eff = profile.fit((1e6, 4e-6), (2e8, 7.6e-5), 3.35e12)
>>> round(fixed * 1e6, 2), round(eff, 3)
(3.64, 0.825)
"""

from __future__ import annotations

import os

import numpy as np

from tsm_core.runtime import compile as _compile
from tsm_core.runtime import config
from tsm_core.runtime import device as _device
from tsm_core.runtime.cache import JsonStore, cache_dir
from tsm_core.runtime.log import get_logger

SMALL_A_BYTES = 2**19
LARGE_A_BYTES = 2**28
PROFILE_VERSION = 1
# A profile whose large launch streams below this share of the bandwidth is not
# cached (another process on the GPU): the H100 measures 0.88-0.95.
MIN_EFF = 0.25

_log = get_logger(__name__)
_memo: dict = {}


def enabled() -> bool:
    """Whether the planner uses measured TSM2L profiles (``TSM_PROFILE``)."""
    return bool(config.flag("TSM_PROFILE"))


def k_bucket(k: int) -> int:
    """k rounded up to a power of two: profiles are kept per bucket."""
    kb = 1
    while kb < k:
        kb *= 2
    return kb


def store(gpu_name: str) -> JsonStore:
    """The on-disk store of one GPU's profiles (``profile-<gpu>.json``)."""
    return JsonStore(cache_dir() / f"profile-{_device._sanitise(gpu_name)}.json")


def _key(dtype, a_order: str, kb: int) -> str:
    return f"tsm2l|{np.dtype(dtype).name}|{a_order}|k{kb}|v{PROFILE_VERSION}|{_compile.source_hash('tsm2l')}"


def _current_gpu_is(spec) -> bool:
    if getattr(spec, "source", None) != "measured":
        return False
    try:
        return _device.name() == spec.name
    except Exception:  # no CuPy, no GPU
        return False


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


def sizes(dtype, kb: int) -> tuple[int, int]:
    """(m_small, m_large): the rows of the two profiled launches."""
    item = np.dtype(dtype).itemsize
    m_small = max(1, SMALL_A_BYTES // (kb * item))
    m_large = max(m_small * 2, LARGE_A_BYTES // (kb * item))
    return m_small, m_large


def tsm2l_profile(spec, dtype, a_order: str, k: int, *, measure=None) -> dict | None:
    """{"fixed_s", "eff", ...} of TSM2L for this GPU, dtype, order of A and k bucket;
    None where there is none (see the module docstring).

    Parameters
    ----------
    spec : DeviceSpec
        The GPU planned for; only a measured spec of the current GPU has a profile.
    dtype : numpy dtype
        float32 or float64.
    a_order : {"C", "F"}
        The memory order of A.
    k : int
        The inner dimension (1 to 32).
    measure : callable, optional
        ``measure(spec, dtype, a_order, k_bucket) -> dict``, called where nothing is
        stored yet; without it only stored figures are returned.
    """
    if not enabled() or k > 32 or k < 1:
        return None
    kb = k_bucket(k)
    mkey = (spec, np.dtype(dtype).name, a_order, kb)
    if mkey in _memo:
        return _memo[mkey]
    if not _current_gpu_is(spec) or os.environ.get("CUDA_INJECTION64_PATH"):
        return None  # not this GPU, or timed under a tool (compute-sanitizer, Nsight)
    key = _key(dtype, a_order, kb)
    prof = store(spec.name).get(key)
    if prof is None:
        if measure is None:
            return None
        try:
            prof = measure(spec, dtype, a_order, kb)
        except Exception as exc:  # out of memory, say: plan without it
            _log.warning("TSM2L profile failed (%s: %s); using the Little's-law model",
                         type(exc).__name__, exc)
            _memo[mkey] = None
            return None
        try:
            store(spec.name).update({key: prof})
        except OSError:  # a read-only cache only costs measuring again next time
            pass
    _memo[mkey] = prof
    return prof
