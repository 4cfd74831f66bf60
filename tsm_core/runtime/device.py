"""Device facts in one place: what the planner knows about a GPU (`DeviceSpec`),
and the attributes the launchers size their grids by (`launch_facts`, `sm_count`,
`attribute`, `name`).

Two sources of a `DeviceSpec`:

* `KNOWN_GPUS`: the paper's Table 2 GPUs (K40c, M40, P100, V100) with the peak
  figures exactly as the paper prints them, plus the A100 the paper extrapolates to
  (section 4.2) and the H100 SXM this project runs on. These let the planner run on
  a machine without a GPU (tests, `plan(..., spec=KNOWN_GPUS["H100"])`).
* `query(device_id)`: the figures read off the device through CuPy, with the peaks
  (read bandwidth, FP32/FP64 rate, launch overhead) measured once by `measure()` and
  cached on disk as JSON under ``$TSM_CACHE_DIR`` or ``~/.cache/tsm/``, keyed by GPU
  name, PCI bus id and driver version.

CuPy is imported lazily: this module imports (and `KNOWN_GPUS` works) without it.

Examples
--------
>>> from tsm_core.runtime.device import KNOWN_GPUS, REFERENCE_GPU
>>> spec = KNOWN_GPUS[REFERENCE_GPU]
>>> spec.name, spec.sm_count
('H100 SXM', 132)
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tsm_core.runtime import timing as _timing
from tsm_core.runtime.cache import cache_dir, read_json, write_json
from tsm_core.runtime.log import get_logger
from tsm_core.runtime.timing import SPIN_SRC  # noqa: F401  (re-exported)

__all__ = ["DeviceSpec", "KNOWN_GPUS", "REFERENCE_GPU", "attribute", "cache_dir", "launch_facts",
           "measure", "name", "query", "sm_count"]

_log = get_logger(__name__)

_NO_GPU = ("tsm_core: no CUDA GPU found; the GPU kernels (and device_spec()) are "
           "unavailable, numpy inputs run on the CPU")


@dataclass(frozen=True)
class DeviceSpec:
    """Figures of one GPU that the performance model (planner.py) uses.

    Frozen, hence hashable: plans are memoised per spec.
    """

    name: str
    cc: tuple                  # compute capability (major, minor)
    sm_count: int
    regs_per_sm: int           # 32-bit registers per SM (R_SM of the paper)
    smem_per_sm: int           # shared memory per SM usable by blocks, bytes (S_SM)
    max_threads_per_sm: int    # HW_MAX of the paper
    max_threads_per_block: int
    warp_size: int
    clock_hz: float            # SM (core) clock
    peak_bw: float             # DRAM bandwidth, bytes/s (measured where possible)
    peak_flops_fp32: float     # FLOP/s (an FMA counts 2), CUDA cores
    peak_flops_fp64: float     # FLOP/s, CUDA cores (not the FP64 tensor cores)
    mem_latency_cycles: float  # latency_mem of the paper (section 3.1.8)
    comp_latency_cycles: float # latency_comp: dependent FMA latency
    launch_overhead_s: float   # fixed cost of one kernel launch + tail
    l2_bytes: int
    source: str                # "table", "queried" or "measured"

    def peak_flops(self, dtype) -> float:
        """Peak FLOP/s for float32 or float64."""
        dt = np.dtype(dtype)
        if dt == np.float32:
            return self.peak_flops_fp32
        if dt == np.float64:
            return self.peak_flops_fp64
        raise TypeError(f"tsm_core: no peak rate for dtype {dt}; float32 and float64 only")

    def replace(self, **changes) -> "DeviceSpec":
        """A copy with some fields changed (e.g. a measured bandwidth)."""
        return dataclasses.replace(self, **changes)


# Per-architecture constants that no device attribute reports, keyed by compute
# capability major (minor where it matters).
#   mem_lat:  idle global-memory (DRAM) load latency in SM cycles. Round figures of
#             the order published pointer-chase microbenchmarks report (Jia et al.,
#             "Dissecting the NVIDIA Volta/Turing GPU architecture via
#             microbenchmarking", 2018/2019; Luo et al., "Benchmarking and dissecting
#             the Nvidia Hopper GPU architecture", 2024). The paper obtains this
#             constant "through offline profiling"; we use a documented constant.
#   comp_lat: dependent FFMA latency in cycles (same sources; 9 on Kepler, 6 on
#             Maxwell/Pascal, 4 from Volta on).
#   fp32_lanes: FP32 FMA units per SM (CUDA programming guide, arithmetic
#             instructions throughput table), used only for a figure estimated from
#             attributes when nothing is measured.
_ARCH = {
    3: dict(mem_lat=400, comp_lat=9, fp32_lanes=192),
    5: dict(mem_lat=370, comp_lat=6, fp32_lanes=128),
    6: dict(mem_lat=550, comp_lat=6, fp32_lanes=64),   # 6.0 (P100); 6.1 has 128
    7: dict(mem_lat=450, comp_lat=4, fp32_lanes=64),
    8: dict(mem_lat=470, comp_lat=4, fp32_lanes=64),   # 8.0 (A100); 8.6/8.9 have 128
    9: dict(mem_lat=600, comp_lat=4, fp32_lanes=128),
}
_ARCH_DEFAULT = dict(mem_lat=600, comp_lat=4, fp32_lanes=128)
_FP32_LANES_MINOR = {(6, 1): 128, (6, 2): 128, (8, 6): 128, (8, 7): 128, (8, 9): 128}


def _arch(cc):
    a = dict(_ARCH.get(cc[0], _ARCH_DEFAULT))
    a["fp32_lanes"] = _FP32_LANES_MINOR.get(tuple(cc), a["fp32_lanes"])
    return a


def _table(name, cc, sm, smem, clock_mhz, sp_gflops, dp_gflops, bw_gbs, l2_mib, launch_us):
    a = _arch(cc)
    return DeviceSpec(
        name=name, cc=cc, sm_count=sm, regs_per_sm=65536, smem_per_sm=smem,
        max_threads_per_sm=2048, max_threads_per_block=1024, warp_size=32,
        clock_hz=clock_mhz * 1e6, peak_bw=bw_gbs * 1e9,
        peak_flops_fp32=sp_gflops * 1e9, peak_flops_fp64=dp_gflops * 1e9,
        mem_latency_cycles=a["mem_lat"], comp_latency_cycles=a["comp_lat"],
        launch_overhead_s=launch_us * 1e-6, l2_bytes=int(l2_mib * 2**20), source="table")


# Peak single/double GFLOPS and bandwidth: the paper's Table 2 exactly (K40c, M40,
# P100, V100); A100 as the paper quotes it (section 4.2: 9.7 TFLOPS double, 1555
# GB/s; 19.5 TFLOPS single from the same whitepaper); H100 SXM5 from NVIDIA's
# datasheet (67 TFLOPS FP32, 34 TFLOPS FP64 without tensor cores, 3.35 TB/s).
# Other fields are datasheet / CUDA programming guide values of each architecture:
# 65536 32-bit registers per SM and 2048 resident threads per SM on all six (only
# Turing, cc 7.5, has 1024, and cc 8.6/8.9 have 1536: none of these); shared memory
# per SM as cudaDevAttrMaxSharedMemoryPerMultiprocessor reports it (K40c 48 KiB in
# the 48/16 split, M40 96 KiB, P100 64 KiB, V100 96 KiB, A100 164 KiB, H100 228 KiB);
# SM counts (15, 24, 56, 80, 108, 132); the boost clocks that make the single
# precision peak come out (K40c 875 MHz, M40 1114, P100 1480, V100 1455,
# A100 1410, H100 1980); L2 (1.5, 3, 4, 6, 40, 50 MiB). The launch overheads are
# typical back-to-back launch costs of those generations, not measurements.
KNOWN_GPUS = {
    "K40c": _table("Tesla K40c", (3, 5), 15, 48 * 1024, 875, 5046, 1430, 288, 1.5, 5.0),
    "M40": _table("Tesla M40", (5, 2), 24, 96 * 1024, 1114, 6844, 213, 288, 3, 5.0),
    "P100": _table("Tesla P100", (6, 0), 56, 64 * 1024, 1480, 10600, 4600, 720, 4, 4.0),
    "V100": _table("Tesla V100", (7, 0), 80, 96 * 1024, 1455, 15000, 7500, 900, 6, 4.0),
    "A100": _table("A100", (8, 0), 108, 164 * 1024, 1410, 19500, 9700, 1555, 40, 3.0),
    "H100": _table("H100 SXM", (9, 0), 132, 228 * 1024, 1980, 67000, 34000, 3350, 50, 2.5),
}

# The GPU that plans are made for where no GPU is found (``tsm_core.plan`` and
# ``tsm_core.explain`` on a machine without one): the one this project is measured on.
REFERENCE_GPU = "H100"


def sm_count(device_id: int | None = None) -> int:
    """Streaming multiprocessors of a GPU (the current one by default); cached."""
    return int(attribute("MultiProcessorCount", device_id))


_CC_NAMES = ("ComputeCapabilityMajor", "ComputeCapabilityMinor")


@functools.lru_cache(maxsize=None)
def _attribute(name: str, device_id: int) -> int:
    import cupy

    dev = cupy.cuda.Device(device_id)
    if name in _CC_NAMES:  # not among CuPy's attributes: its compute_capability ("90")
        cc = dev.compute_capability
        return int(cc[:-1]) if name == _CC_NAMES[0] else int(cc[-1])
    return int(dev.attributes[name])


def attribute(name: str, device_id: int | None = None) -> int:
    """One of CuPy's ``Device.attributes`` (e.g. ``"L2CacheSize"``), cached per device."""
    if device_id is None:
        import cupy

        device_id = cupy.cuda.Device().id
    return _attribute(name, int(device_id))


@functools.lru_cache(maxsize=None)
def launch_facts(device_id: int) -> dict:
    """What the launchers size their grids by, read once per device: SM count,
    registers, shared memory (per SM and the per-block opt-in), resident threads per
    SM and the compute capability."""
    import cupy

    props = cupy.cuda.runtime.getDeviceProperties(device_id)
    return {
        "sm_count": props["multiProcessorCount"],
        "regs_per_sm": props["regsPerMultiprocessor"],
        "smem_per_sm": props["sharedMemPerMultiprocessor"],
        "smem_optin": props["sharedMemPerBlockOptin"],
        "threads_per_sm": props["maxThreadsPerMultiProcessor"],
        "cc": (props["major"], props["minor"]),
    }


@functools.lru_cache(maxsize=None)
def _name(device_id: int) -> str:
    import cupy

    n = cupy.cuda.runtime.getDeviceProperties(device_id)["name"]
    return n.decode() if isinstance(n, bytes) else str(n)


def name(device_id: int | None = None) -> str:
    """The name a GPU reports (the current one by default), e.g. "NVIDIA H100 80GB HBM3"."""
    if device_id is None:
        import cupy

        device_id = cupy.cuda.runtime.getDevice()
    return _name(int(device_id))


def _sanitise(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", str(s)).strip("_") or "gpu"


# ---------------------------------------------------------------- the device


def _cupy():
    """CuPy with at least one visible device, or RuntimeError."""
    try:
        import cupy
    except Exception as e:  # ImportError, or a broken CUDA install
        raise RuntimeError(f"{_NO_GPU} (CuPy is not importable: {e})") from e
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # no driver: cudaErrorInsufficientDriver / NoDevice
        raise RuntimeError(f"{_NO_GPU} ({e})") from e
    if count == 0:
        raise RuntimeError(_NO_GPU)
    return cupy


def _attributes(cupy, device_id: int) -> dict:
    rt = cupy.cuda.runtime
    if not 0 <= device_id < rt.getDeviceCount():
        raise ValueError(f"tsm_core: no CUDA device {device_id}; "
                         f"{rt.getDeviceCount()} visible")

    def attr(name, default=None):
        try:
            return rt.deviceGetAttribute(getattr(rt, name), device_id)
        except Exception:
            return default

    props = rt.getDeviceProperties(device_id)
    name = props["name"]
    name = name.decode() if isinstance(name, bytes) else str(name)
    pci = "{:04x}:{:02x}:{:02x}".format(attr("cudaDevAttrPciDomainId", 0),
                                         attr("cudaDevAttrPciBusId", 0),
                                         attr("cudaDevAttrPciDeviceId", 0))
    clock_khz = attr("cudaDevAttrClockRate") or props.get("clockRate", 0)
    return dict(
        name=name,
        cc=(attr("cudaDevAttrComputeCapabilityMajor", props["major"]),
            attr("cudaDevAttrComputeCapabilityMinor", props["minor"])),
        sm_count=attr("cudaDevAttrMultiProcessorCount"),
        regs_per_sm=attr("cudaDevAttrMaxRegistersPerMultiprocessor"),
        smem_per_sm=attr("cudaDevAttrMaxSharedMemoryPerMultiprocessor"),
        max_threads_per_sm=attr("cudaDevAttrMaxThreadsPerMultiProcessor"),
        max_threads_per_block=attr("cudaDevAttrMaxThreadsPerBlock"),
        warp_size=attr("cudaDevAttrWarpSize", 32),
        clock_hz=float(clock_khz) * 1e3,
        l2_bytes=attr("cudaDevAttrL2CacheSize", 0),
        mem_clock_hz=float(attr("cudaDevAttrMemoryClockRate", 0) or 0) * 1e3,
        bus_width_bits=attr("cudaDevAttrGlobalMemoryBusWidth", 0) or 0,
        # FP32:FP64 throughput ratio of the CUDA cores (2 on GP100/GV100/GA100/GH100).
        sp_dp_ratio=attr("cudaDevAttrSingleToDoublePrecisionPerfRatio", 0) or 0,
        pci_bus_id=pci,
        driver=rt.driverGetVersion(),
    )


# Bumped when measure() changes what it measures: older cache files are re-measured.
MEASURE_VERSION = 2


def _measure_path(a: dict) -> Path:
    return cache_dir() / (f"device-{_sanitise(a['name'])}-{_sanitise(a['pci_bus_id'])}"
                          f"-drv{a['driver']}.json")


_READ_BW_SRC = r"""
extern "C" __global__ void tsm_read_bw(const float4* __restrict__ x, long long n4,
                                       float* __restrict__ out) {
    float acc = 0.f;
    const long long stride = (long long)gridDim.x * blockDim.x;
#pragma unroll 4
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += stride) {
        const float4 v = x[i];
        acc += (v.x + v.y) + (v.z + v.w);
    }
    // One atomic per warp: the sum only keeps the loads from being optimised away.
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_down_sync(0xffffffffu, acc, o);
    if ((threadIdx.x & 31) == 0) atomicAdd(out, acc);
}
extern "C" __global__ void tsm_empty() {}
extern "C" __global__ void tsm_copy(const float4* __restrict__ x, float4* __restrict__ y, int n4) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n4) y[i] = x[i];
}
"""


# The smallest read buffer measure() accepts (and at least 4x the L2): below it the
# figure is L2 bandwidth or launch latency, not DRAM bandwidth.
MIN_MEASURE_BYTES = 256 * 2**20


class MeasureUnavailable(RuntimeError):
    """measure() could not measure faithfully now (not enough free GPU memory)."""


# measure() refuses to cache a read bandwidth below this share of the attributes'
# figure (memory clock x bus width): the H100 measures 0.92-0.95 of it.
MIN_BW_SHARE = 0.5


def measure(device_id: int = 0, *, path: Path | None = None) -> dict:
    """Measure the peak figures of one GPU once and cache them on disk as JSON.

    * read bandwidth: a vectorised sum kernel over a float32 array of 1 GiB (less
      only where the GPU has not that much free), bytes read / median time; with
      less than 4 x max(256 MiB, 4 x L2) free (after returning the memory pool's
      unused blocks) it raises MeasureUnavailable instead of caching a figure
      that would be L2 bandwidth or launch latency; likewise under a CUDA tool
      (``CUDA_INJECTION64_PATH`` set: compute-sanitizer, Nsight) or when the figure
      is below MIN_BW_SHARE of memory clock x bus width;
    * FP32 and FP64 rate: ``cupy.matmul`` of 8192^3, 2*m*n*k / median time. TF32 is
      off (CuPy's default, ``CUPY_TF32=0``), so the FP32 figure is the CUDA cores'.
      On cc 8.0 / 9.0 cuBLAS DGEMM runs on the FP64 *tensor* cores, which our FMA
      kernels cannot use: the FP64 peak kept for the model is
      min(DGEMM rate, FP32 rate / cudaDevAttrSingleToDoublePrecisionPerfRatio); the
      raw DGEMM rate is kept in the JSON as ``dgemm_flops``;
    * launch overhead, as the model uses it (the fixed device time of one small
      kernel, launch and memory round trips included): 200 launches of a kernel
      copying 64 KiB, queued behind a spin kernel so that they run back to back
      on the GPU, / 200, median of 5 (``launch_overhead_s``); the host's cost of
      issuing an empty launch is kept as ``host_launch_s``.

    Takes a few seconds; logs one line (INFO) saying so. Returns the dict it writes.
    """
    cupy = _cupy()
    with cupy.cuda.Device(device_id):
        a = _attributes(cupy, device_id)
        path = Path(path) if path is not None else _measure_path(a)
        # What this process's pool holds but does not use counts as free. A buffer
        # that fits in L2, or one so small that launch latency dominates, would give
        # a figure that is wrong for good (it is cached): refuse instead.
        cupy.get_default_memory_pool().free_all_blocks()
        free, _ = cupy.cuda.runtime.memGetInfo()
        nbytes = min(2**30, (free // 4) // 16 * 16)
        need = max(MIN_MEASURE_BYTES, 4 * a["l2_bytes"])
        if nbytes < need:
            raise MeasureUnavailable(
                f"only {free / 2**20:.0f} MiB of GPU memory free; measuring the bandwidth needs "
                f"{4 * need / 2**20:.0f} MiB free")
        _log.info("measuring device %s (once, cached in %s) ...", a["name"], path)
        mod = cupy.RawModule(code=_READ_BW_SRC)
        read_bw, empty = mod.get_function("tsm_read_bw"), mod.get_function("tsm_empty")
        copy = mod.get_function("tsm_copy")

        x = cupy.ones(nbytes // 4, dtype=cupy.float32)
        out = cupy.zeros(1, dtype=cupy.float32)
        # A full GPU of resident threads; the grid-stride loop does the rest.
        grid = a["sm_count"] * max(1, a["max_threads_per_sm"] // 256)
        n4 = np.int64(x.size // 4)
        t = _timing.event_median(lambda: read_bw((grid,), (256,), (x, n4, out)), reps=9)
        bw = int(n4) * 16 / t
        del x, out
        # A figure far below what the memory clock and bus allow is not this GPU's:
        # another process is using it, or a tool instruments every access
        # (compute-sanitizer makes this kernel ~30x slower). Caching it would skew
        # every plan on this GPU for good.
        attr_bw = 2 * a["mem_clock_hz"] * a["bus_width_bits"] / 8
        tool = os.environ.get("CUDA_INJECTION64_PATH")
        if tool or (attr_bw > 0 and bw < MIN_BW_SHARE * attr_bw):
            raise MeasureUnavailable(
                f"the read bandwidth measured {bw / 1e9:.0f} GB/s against {attr_bw / 1e9:.0f} GB/s "
                "from the memory clock and bus width"
                + (f", under a CUDA tool ({tool})" if tool else "")
                + "; not cached")

        rates = {}
        try:
            for dt in (cupy.float32, cupy.float64):
                A = cupy.random.random((8192, 8192)).astype(dt)
                B = cupy.random.random((8192, 8192)).astype(dt)
                C = cupy.empty((8192, 8192), dtype=dt)
                t = _timing.event_median(lambda: cupy.matmul(A, B, out=C), warmup=1, reps=5)
                rates[np.dtype(dt).name] = 2 * 8192**3 / t
                del A, B, C
        except cupy.cuda.memory.OutOfMemoryError as exc:
            raise MeasureUnavailable(f"no room for the 8192^3 GEMMs of the FLOP-rate measurement: {exc}") from None
        finally:
            cupy.get_default_memory_pool().free_all_blocks()

        def launches():
            for _ in range(100):
                empty((1,), (32,), ())
        host_launch = statistics.median(_timing.event_median(launches, warmup=1, reps=1) / 100
                                        for _ in range(5))
        src = cupy.ones(4096 * 4, dtype=cupy.float32)
        dst = cupy.empty_like(src)

        def copy64k():
            copy((16,), (256,), (src, dst, np.int32(4096)))
        copy64k()
        # 200 copies queued behind a spin 1.5 x as long as the host takes to issue them
        spin_s = 200 * max(host_launch, 5e-6) * 1.5
        launch = statistics.median(_timing.batch_sample(copy64k, 200, spin_s) / 200
                                   for _ in range(5))
        del src, dst

        ratio = a["sp_dp_ratio"] or 32
        result = dict(
            name=a["name"], pci_bus_id=a["pci_bus_id"], driver=a["driver"],
            peak_bw=bw, bytes_read=int(n4) * 16,
            peak_flops_fp32=rates["float32"],
            dgemm_flops=rates["float64"],
            peak_flops_fp64=min(rates["float64"], rates["float32"] / ratio),
            launch_overhead_s=launch, host_launch_s=host_launch, version=MEASURE_VERSION,
            cupy=cupy.__version__, tf32=os.environ.get("CUPY_TF32", "0"),
            measured_at=time.strftime("%Y-%m-%dT%H:%M:%S"),
        )
    write_json(path, result)
    return result


_QUERY_CACHE: dict = {}


def _estimated_peaks(a: dict, arch: dict) -> dict:
    """Peaks from attributes alone: memory clock x bus width; FMA lanes x clock."""
    fp32 = a["sm_count"] * arch["fp32_lanes"] * 2 * a["clock_hz"]
    peaks = dict(peak_bw=2 * a["mem_clock_hz"] * a["bus_width_bits"] / 8,
                 peak_flops_fp32=fp32, peak_flops_fp64=fp32 / (a["sp_dp_ratio"] or 32),
                 launch_overhead_s=3e-6, source="queried")
    if peaks["peak_bw"] <= 0:
        raise RuntimeError("tsm_core: this driver reports no memory clock; "
                           "use query(measure_peaks=True) to measure the bandwidth")
    return peaks


def query(device_id: int = 0, *, measure_peaks: bool = True) -> DeviceSpec:
    """The DeviceSpec of CUDA device `device_id`.

    Counts, registers, shared memory, clocks and L2 are read off the device; the
    peak bandwidth, FLOP rates and launch overhead come from `measure()` (run once
    per GPU, then read from its JSON cache). With ``measure_peaks=False`` the peaks
    are estimated from attributes instead (memory clock x bus width; FMA lanes x
    clock), ``source="queried"``. Memoised per process.

    Raises RuntimeError where no CUDA GPU is found.
    """
    key = (device_id, measure_peaks)
    if key in _QUERY_CACHE:
        return _QUERY_CACHE[key]
    cupy = _cupy()
    a = _attributes(cupy, device_id)
    arch = _arch(a["cc"])
    if measure_peaks:
        path = _measure_path(a)
        try:
            m = read_json(path)
            if not isinstance(m, dict) or m.get("version") != MEASURE_VERSION:
                raise ValueError("measured by an older tsm_core")
            m["peak_bw"], m["peak_flops_fp32"], m["peak_flops_fp64"]  # complete?
        except (OSError, ValueError, KeyError):
            try:
                m = measure(device_id, path=path)
            except MeasureUnavailable as exc:
                # Estimated figures for this process only: nothing is cached, the
                # next process measures again.
                _log.warning("%s; using figures estimated from the device's attributes "
                             "until a later run can measure", exc)
                m = None
        if m is not None:
            peaks = dict(peak_bw=m["peak_bw"], peak_flops_fp32=m["peak_flops_fp32"],
                         peak_flops_fp64=m["peak_flops_fp64"],
                         launch_overhead_s=m["launch_overhead_s"], source="measured")
        else:
            peaks = _estimated_peaks(a, arch)
    else:
        peaks = _estimated_peaks(a, arch)
    spec = DeviceSpec(
        name=a["name"], cc=tuple(a["cc"]), sm_count=a["sm_count"],
        regs_per_sm=a["regs_per_sm"], smem_per_sm=a["smem_per_sm"],
        max_threads_per_sm=a["max_threads_per_sm"],
        max_threads_per_block=a["max_threads_per_block"], warp_size=a["warp_size"],
        clock_hz=a["clock_hz"], mem_latency_cycles=arch["mem_lat"],
        comp_latency_cycles=arch["comp_lat"], l2_bytes=a["l2_bytes"], **peaks)
    _QUERY_CACHE[key] = spec
    return spec
