"""The one GPU timer: CUDA events, warm-up, medians, and inputs that miss L2.

Every timed sample is ``spin; start event; fn() x batch; stop event`` on the current
stream. The spin kernel holds the GPU a little longer than the host needs to enqueue
the batch, so the two events bracket device work that runs back to back: what is
timed is the kernels (and the gaps the GPU itself leaves between them), not Python's
launch overhead, which would otherwise be a tenth of a 0.3 ms kernel's time. The
host's cost per call is measured too and reported apart (``Timing.host_s``).

:func:`event_median` is the plain form (warm-up, then the median of single calls
between two events, host time included), used where a figure must be comparable
with one taken that way before: the device measurement (``runtime.device.measure``)
and ``matmul``'s one-time check of a kernel against cuBLAS.

Pure helpers (`summarize`, `sets_needed`, `cycling`) need no GPU; the rest import
CuPy when called.
"""

from __future__ import annotations

import itertools
import math
import statistics
import time
from dataclasses import asdict, dataclass

import numpy as np

GIB = 2**30

# Holds the stream for `ns` nanoseconds, so that launches queued behind it run back
# to back on the GPU however slowly the host issues them. It waits on %globaltimer
# (nanoseconds), so its length does not depend on the SM clock. One thread of one
# block: it occupies nothing but the stream's order.
SPIN_SRC = r"""
extern "C" __global__ void tsm_spin(unsigned long long ns) {
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < ns);
}
"""

# Read stream: sum of a float32 buffer through 16-byte loads in a grid-stride loop.
# Four independent loads per thread per iteration keep enough bytes in flight per SM
# to cover the DRAM latency (Little's law) with one wave of resident threads.
_READ_SRC = r"""
extern "C" __global__ void tsm_bench_read(const float4* __restrict__ x, long long n4,
                                          float* __restrict__ out) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    float acc = 0.f;
    for (; i + 3 * stride < n4; i += 4 * stride) {
        const float4 a = x[i], b = x[i + stride], c = x[i + 2 * stride], d = x[i + 3 * stride];
        acc += ((a.x + a.y) + (a.z + a.w)) + ((b.x + b.y) + (b.z + b.w))
             + ((c.x + c.y) + (c.z + c.w)) + ((d.x + d.y) + (d.z + d.w));
    }
    for (; i < n4; i += stride) {
        const float4 a = x[i];
        acc += (a.x + a.y) + (a.z + a.w);
    }
    // The sum only keeps the loads from being optimised away: one atomic per warp.
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_down_sync(0xffffffffu, acc, o);
    if ((threadIdx.x & 31) == 0) atomicAdd(out, acc);
}
"""

SPIN_MAX_S = 0.05  # longest preroll; a fn that synchronises inside cannot be helped


@dataclass(frozen=True)
class Timing:
    """Per-call device times of one function, in seconds."""

    median_s: float
    min_s: float
    max_s: float
    q1_s: float
    q3_s: float
    reps: int  # samples taken
    batch: int  # calls per sample; every time here is per call
    host_s: float  # host time to enqueue one call (Python and launch), median

    @property
    def iqr_s(self) -> float:
        return self.q3_s - self.q1_s

    def to_dict(self) -> dict:
        return dict(asdict(self), iqr_s=self.iqr_s)


def summarize(samples_s, *, batch: int = 1, host_s: float = float("nan")) -> Timing:
    """The `Timing` of per-sample times, each sample covering `batch` calls."""
    per = sorted(s / batch for s in samples_s)
    if not per:
        raise ValueError("summarize() needs at least one sample")
    if len(per) >= 2:
        q1, _, q3 = statistics.quantiles(per, n=4, method="inclusive")
    else:
        q1 = q3 = per[0]
    return Timing(median_s=statistics.median(per), min_s=per[0], max_s=per[-1], q1_s=q1,
                  q3_s=q3, reps=len(per), batch=batch, host_s=host_s)


def _cupy():
    import cupy

    return cupy


_kernels: dict = {}


def _kernel(name: str):
    """A RawKernel of this module, compiled once per process."""
    if name not in _kernels:
        cupy = _cupy()
        src = {"tsm_spin": SPIN_SRC, "tsm_bench_read": _READ_SRC}[name]
        _kernels[name] = cupy.RawKernel(src, name)
    return _kernels[name]


def _spin(seconds: float) -> None:
    """Hold the current stream for `seconds` (RawKernel launches on the current stream)."""
    _kernel("tsm_spin")((1,), (1,), (np.uint64(int(seconds * 1e9)),))


def _sample(fn, batch: int, spin_s: float, stream, start, stop) -> tuple[float, float]:
    """(device seconds, host seconds) of `batch` calls of fn, behind a spin of spin_s."""
    cupy = _cupy()
    _spin(spin_s)
    start.record(stream)
    h = time.perf_counter()
    for _ in range(batch):
        fn()
    h = time.perf_counter() - h
    stop.record(stream)
    stop.synchronize()
    return cupy.cuda.get_elapsed_time(start, stop) * 1e-3, h


def batch_sample(fn, batch: int, spin_s: float) -> float:
    """Device seconds of ``batch`` back-to-back calls of fn on the current stream,
    queued behind a spin of ``spin_s`` seconds (one sample of :func:`time_fn`)."""
    cupy = _cupy()
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    return _sample(fn, batch, spin_s, cupy.cuda.get_current_stream(), start, stop)[0]


def time_fn(fn, *, warmup: int = 3, reps: int = 20, min_time_s: float = 0.01,
            max_time_s: float = 1.5, min_sample_s: float = 100e-6,
            max_batch: int = 100) -> Timing:
    """Time ``fn()`` on the current stream with CUDA events; times are per call.

    1. Warm-up: one call, synchronised (module load, NVRTC compile, cuBLAS
       heuristics, memory-pool growth), then one timed call to estimate the cost
       t and the host time per call, then ``warmup - 1`` more calls unless t says
       they would be slow.
    2. Calls per sample: enough that a sample lasts ``min_sample_s`` (short kernels;
       CUDA events resolve about half a microsecond), at most ``max_batch``.
    3. Samples: ``reps``; more (up to 2 x reps) until ``min_time_s`` of samples is
       reached; fewer (at least one) where reps samples would pass ``max_time_s``,
       so that a slow kernel (TSM2R v0) costs seconds, not minutes.

    fn must launch its work on the current stream and must not allocate new device
    memory in steady state (pass preallocated outputs).
    """
    cupy = _cupy()
    stream = cupy.cuda.get_current_stream()
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()

    fn()
    stream.synchronize()
    # The host time of a call is not known yet: the longest spin covers it.
    t, h = _sample(fn, 1, SPIN_MAX_S, stream, start, stop)
    host = [h]
    t = max(t, 1e-7)

    def spin_for(batch):
        # Twice the typical host time: a hiccup (GC) costs its own sample only,
        # and the median over samples absorbs it.
        return min(SPIN_MAX_S, 2 * batch * statistics.median(host) + 20e-6)

    samples = []
    if t * warmup < max_time_s / 4:
        for _ in range(warmup - 1):
            fn()
        stream.synchronize()
    batch = max(1, min(max_batch, math.ceil(min_sample_s / t)))
    if batch == 1:
        samples.append(t)  # a valid hot sample already
    n = reps
    if t * batch * n < min_time_s:
        n = min(2 * reps, math.ceil(min_time_s / (t * batch)))
    if t * batch * n > max_time_s:
        n = max(1, int(max_time_s // (t * batch)))
    while len(samples) < n:
        d, h = _sample(fn, batch, spin_for(batch), stream, start, stop)
        samples.append(d)
        host.append(h / batch)
    return summarize(samples, batch=batch, host_s=statistics.median(host))


def event_median(fn, *, warmup: int = 2, reps: int = 7) -> float:
    """Median seconds of ``fn()`` over ``reps`` runs, each between two CUDA events on
    the current stream, after ``warmup`` untimed runs (host time included where the
    GPU waits for the host)."""
    cupy = _cupy()
    for _ in range(warmup):
        fn()
    cupy.cuda.Device().synchronize()
    ts = []
    for _ in range(reps):
        start, stop = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        ts.append(cupy.cuda.get_elapsed_time(start, stop) * 1e-3)
    return statistics.median(ts)


# ---------------------------------------------------------------- inputs


def interleaved_medians(methods: dict, *, rounds: int = 3, reps: int = 15) -> dict:
    """Seconds per call of each of ``methods`` (name -> fn): ``rounds`` rounds that
    time every method once in turn (``time_fn``, ``reps`` samples), so that a drift of
    the machine's speed reaches every method alike; the median over the rounds."""
    times: dict = {name: [] for name in methods}
    for _ in range(rounds):
        for name, fn in methods.items():
            times[name].append(time_fn(fn, reps=reps).median_s)
    return {name: float(np.median(t)) for name, t in times.items()}


def random_normal(size: int, dtype, seed: int):
    """A 1-D CuPy array of `size` standard-normal values: signed, never zeros (zeros
    hide unwritten outputs and can run faster than real data)."""
    cupy = _cupy()
    return cupy.random.default_rng(seed).standard_normal(int(size), dtype=dtype)


def l2_size(device: int = 0) -> int:
    """The L2 cache size in bytes, as the device reports it."""
    return int(_cupy().cuda.runtime.getDeviceProperties(device)["l2CacheSize"])


def sets_needed(bytes_per_set: int, l2_bytes: int, *, factor: float = 2.0,
                max_sets: int = 16384) -> int:
    """The fewest input sets whose round-robin touches more than factor x L2 bytes
    (at most max_sets; 1 where one set is already that large)."""
    if bytes_per_set <= 0:
        raise ValueError("bytes_per_set must be positive")
    return int(min(max_sets, math.floor(factor * l2_bytes / bytes_per_set) + 1))


def rotating_inputs(make, bytes_per_set: int, l2_bytes: int | None = None) -> list:
    """``[make(0), make(1), ...]``: enough input sets (`sets_needed`) that cycling
    through them reads more than twice the L2 between two uses of one set, so a
    small problem is timed from DRAM, not from cache. `make(i)` builds set i."""
    if l2_bytes is None:
        l2_bytes = l2_size()
    return [make(i) for i in range(sets_needed(bytes_per_set, l2_bytes))]


def operand_sets(m: int, k: int, n: int, dtype, order: str, seed: int, l2_bytes: int | None = None) -> list:
    """(A, B, C) sets of a (m, k) @ (k, n) product carved from one random pool
    (`random_normal`): A and B in `order` ("C" or "F"), C C-ordered, each operand
    256-byte aligned like a fresh allocation; as many sets as `rotating_inputs`
    needs to miss L2."""
    item = _cupy().dtype(dtype).itemsize
    align = 256 // item
    spans = [-(-s // align) * align for s in (m * k, k * n, m * n)]
    per_set = sum(spans)
    if l2_bytes is None:
        l2_bytes = l2_size()
    pool = random_normal(sets_needed(per_set * item, l2_bytes) * per_set, dtype, seed)

    def matrix(offset, rows, cols, o):
        flat = pool[offset:offset + rows * cols]
        return flat.reshape(rows, cols) if o == "C" else flat.reshape(cols, rows).T

    def make(i):
        base = i * per_set
        return (matrix(base, m, k, order), matrix(base + spans[0], k, n, order),
                matrix(base + spans[0] + spans[1], m, n, "C"))

    return rotating_inputs(make, per_set * item, l2_bytes)


def cycling(fn, sets):
    """A no-argument function calling ``fn(*set)`` on each set in turn."""
    it = itertools.cycle(sets)
    return lambda: fn(*next(it))


# ---------------------------------------------------------------- ceilings


def _free_all():
    _cupy().get_default_memory_pool().free_all_blocks()


def read_bandwidth(nbytes: int = 2 * GIB, *, seed: int = 0, reps: int = 20) -> dict:
    """The device's read bandwidth: a sum over `nbytes` of float32 (16-byte loads,
    grid-stride loop, one full wave of resident threads), bytes read / median time.

    Returns ``{"read_bw": bytes/s, "read_bytes": ..., "read_timing": {...}}``.
    """
    cupy = _cupy()
    dev = cupy.cuda.Device()
    props = cupy.cuda.runtime.getDeviceProperties(dev.id)
    free, _ = cupy.cuda.runtime.memGetInfo()
    nbytes = min(int(nbytes), int(free * 0.8)) // 16 * 16
    x = random_normal(nbytes // 4, cupy.float32, seed)
    out = cupy.zeros(1, dtype=cupy.float32)
    threads = 256
    grid = props["multiProcessorCount"] * max(1, props["maxThreadsPerMultiProcessor"] // threads)
    n4 = nbytes // 16
    kern = _kernel("tsm_bench_read")
    t = time_fn(lambda: kern((grid,), (threads,), (x, np.int64(n4), out)), reps=reps)
    del x, out
    _free_all()
    return dict(read_bw=nbytes / t.median_s, read_bytes=nbytes, read_timing=t.to_dict())


def copy_bandwidth(nbytes: int = GIB, *, seed: int = 0, reps: int = 20) -> dict:
    """Device-to-device copy bandwidth of `nbytes` (CuPy copy), counting bytes read
    plus bytes written. Returns ``{"copy_bw": bytes/s, "copy_bytes": ..., ...}``."""
    cupy = _cupy()
    src = random_normal(int(nbytes) // 4, cupy.float32, seed)
    dst = cupy.empty_like(src)
    t = time_fn(lambda: cupy.copyto(dst, src), reps=reps)
    moved = 2 * src.nbytes
    del src, dst
    _free_all()
    return dict(copy_bw=moved / t.median_s, copy_bytes=moved, copy_timing=t.to_dict())


def call_ms(fn, *, warm: int = 3, rep: int = 20) -> float:
    """Median milliseconds of one ``fn()`` between two torch CUDA events on torch's
    current stream, host time included: the clock of the vendor-library baselines the
    benchmarks compare against, for comparisons made with figures taken that way."""
    import torch

    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(rep):
        s = torch.cuda.Event(enable_timing=True)
        e = torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        ts.append(s.elapsed_time(e))
    return statistics.median(ts)
