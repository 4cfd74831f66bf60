"""Launching a planned batch: kernel lookups, the driver's launch, streams, the C++ path.

- Kernels: `name_expr` names the instantiation of ``batched.cu`` for a dtype and
  version; `kernel_regs` and `func_attrs` read its registers (from the compiled
  kernel on a GPU, else NVRTC, else the planner's table).
- Streams: a call launches on the caller's current stream: torch's for torch
  tensors (`torch_stream`, `torch_raw_stream`), CuPy's otherwise (`cupy_stream`);
  `stream_from_ptr` wraps a raw handle for CuPy's own kernel call.
- Launch: `build_launch` resolves everything one launch needs into a `Launch`
  (kernel handle, grid, device metadata, split-K workspace), which launches with
  ``cuLaunchKernel`` through the C++ fast path where it is loaded, else through
  CuPy's driver binding (`driver_launch`), else CuPy's kernel call.
- The C++ fast path (``fastpath.cpp``, built by ``native.py``): `connect_native`
  hands it the stream getters, lets it read torch's device and stream through c10
  (`use_c10_streams`), and switches its one-node CUDA graphs on or off
  (``TSM_BATCHED_GRAPHS``, `graphs_default`).
"""

from __future__ import annotations

import functools
import os

import numpy as np

from tsm_core.batched.checks import describe
from tsm_core.batched.plan import (BLOCK_THREADS, DEFAULT_VERSION, DYNAMIC_SMEM, FAMILY,
                                   META_STRIDE, _F32, regs_fallback, smem_bytes)
from tsm_core.runtime import arrays as _arrays
from tsm_core.runtime import compile as _compile
from tsm_core.runtime import config as _config
from tsm_core.runtime import device as _device
from tsm_core.runtime.launch import func_ptr

# ------------------------------------------------------------------ kernels


def name_expr(dtype, version: int = DEFAULT_VERSION) -> str:
    """The name expression of kernel `version` for `dtype` in ``batched.cu``."""
    return f"tsm_batched_gemm<{_compile.ctype(dtype)}, {int(version)}>"


@functools.lru_cache(maxsize=None)
def _regs_nvrtc(dtype_name: str, version: int) -> int:
    return _compile.compile_report(FAMILY, name_expr(np.dtype(dtype_name), version)).registers


def kernel_regs(dtype, version: int = DEFAULT_VERSION) -> int:
    """Registers per thread of the kernel for `dtype` (GPU, else NVRTC, else a table)."""
    dtype = np.dtype(dtype)
    if _arrays.has_gpu():
        return func_attrs(name_expr(dtype, version))[0]
    try:
        return _regs_nvrtc(dtype.name, int(version))
    except Exception:  # no NVRTC here: the table is what sm_90 compiles to
        return regs_fallback(dtype, int(version))


@functools.lru_cache(maxsize=None)
def func_attrs(name_expr: str):
    """(registers, static shared bytes) of the compiled kernel on the current GPU."""
    from cupy.cuda import driver

    f = _compile.get_kernel(FAMILY, name_expr)
    if hasattr(f, "num_regs"):  # CuPy 14: RawModule.get_function gives a RawKernel
        return int(f.num_regs), int(f.shared_size_bytes)
    # CUfunction_attribute: 4 = NUM_REGS, 1 = SHARED_SIZE_BYTES
    return driver.funcGetAttribute(4, f.ptr), driver.funcGetAttribute(1, f.ptr)


def tensor_cores_ok(dev: int) -> bool:
    """Whether GPU `dev` runs versions 2 and 5 (tensor cores, cp.async: compute
    capability 8.0 or later)."""
    return _device.attribute("ComputeCapabilityMajor", dev) >= 8


def wgmma_ok() -> bool:
    """Whether the current device runs version 6 (wgmma: compute capability 9.0)."""
    return (_device.attribute("ComputeCapabilityMajor") == 9
            and _device.attribute("ComputeCapabilityMinor") == 0)


# ------------------------------------------------------------------ streams

_streams: dict = {}


def stream_from_ptr(ptr):
    """A CuPy stream object for a raw handle (cached: building one costs microseconds)."""
    import cupy

    s = _streams.get(ptr)
    if s is None:
        import warnings

        with warnings.catch_warnings():  # CuPy 14 deprecates it; 13 has no replacement
            warnings.simplefilter("ignore", DeprecationWarning)
            s = _streams[ptr] = cupy.cuda.ExternalStream(ptr)
    return s


_RAW_STREAM: list = []


def torch_raw_stream():
    """A function of a device index giving torch's current stream on that device as
    a raw cudaStream_t (torch's C entry point where it has one: 0.1 us a call
    against 0.7 us through torch.cuda)."""
    if not _RAW_STREAM:
        import torch

        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        if raw is None:
            def raw(dev):
                return torch.cuda.current_stream(dev).cuda_stream
        _RAW_STREAM.append(raw)
    return _RAW_STREAM[0]


_CUR_DEVICE: list = []


def torch_stream():
    """torch's current stream on the current device, as a raw cudaStream_t."""
    if not _CUR_DEVICE:
        import torch

        _CUR_DEVICE.append(getattr(torch._C, "_cuda_getDevice", torch.cuda.current_device))
    return torch_raw_stream()(_CUR_DEVICE[0]())


def cupy_stream():
    """CuPy's current stream, as a raw cudaStream_t."""
    import cupy

    return cupy.cuda.get_current_stream().ptr


# ------------------------------------------------------------------ the C++ fast path

# [module or None] once looked up (``tsm_core.batched.api._native``). Where it is
# loaded, a torch batch is matched by every tensor's pointer, sizes, strides,
# dtype and device, read from torch's C++ objects (12-16 ns a tensor against 0.2 us
# for the identity key in Python), and launched in the same call.
_NATIVE: list = []
_C10_STREAMS: list = []  # [True] where call reads device and stream through c10
_GRAPHS: list = []  # [True] where hits launch through one-node CUDA graphs


def graphs_default() -> bool:
    """Whether the C++ fast path launches a remembered batch through a one-node CUDA
    graph (fastpath.cpp, graph_launch) rather than cuLaunchKernel
    (``TSM_BATCHED_GRAPHS=0`` turns it off; on by default)."""
    return _config.flag("TSM_BATCHED_GRAPHS")


def connect_native(mod, torch):
    """Give the loaded fast path `mod` torch's stream getters (c10's where they
    agree with torch's Python ones) and the graph switch."""
    torch_stream()  # fills _CUR_DEVICE and _RAW_STREAM
    mod.set_stream_getters(_CUR_DEVICE[0], _RAW_STREAM[0])
    _C10_STREAMS[:] = [use_c10_streams(mod, torch)]
    _GRAPHS[:] = [mod.use_graphs(graphs_default())]  # (False: not found)


def use_c10_streams(mod, torch) -> bool:
    """Let `mod.call` read torch's current device and stream through c10's C++
    functions (0.1 us against about 0.6 us through torch's Python getters on our
    H100's host) if it finds them in the loaded libc10_cuda and they give what the
    Python getters give, on the default stream and inside ``torch.cuda.stream``;
    else it keeps the Python getters. True if enabled."""
    lib = os.path.join(os.path.dirname(torch.__file__), "lib", "libc10_cuda.so")
    if not mod.use_c10(lib):
        return False
    try:
        dev = _CUR_DEVICE[0]()
        before = _RAW_STREAM[0](dev)
        ok = mod.current() == (dev, before)
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            ok = ok and side.cuda_stream != before and mod.current() == (dev, side.cuda_stream)
        ok = ok and mod.current() == (dev, before)
    except Exception:
        ok = False
    if not ok:
        mod.use_c10("")
    return ok


def launch_failed(r):
    """Raise the CUDA driver's error for a fast-path launch that returned r != 0."""
    import cupy

    if r == 3:
        raise RuntimeError("tsm: the C++ fast path found no cuLaunchKernel (no CUDA driver)")
    raise cupy.cuda.driver.CUDADriverError(-r)


# ------------------------------------------------------------------ the launch


def meta_rows(As, Bs, Cs, kind, shapes):
    """(P, META_STRIDE) int64: pointers, sizes and element strides of every problem."""
    P = len(As)
    meta = np.empty((P, META_STRIDE), dtype=np.int64)
    meta[:, 3:6] = shapes
    meta[:, 12:] = 0  # split-K's workspace and counters (split_workspace)
    for i in range(P):
        for j, (x, col) in enumerate(((As[i], 6), (Bs[i], 8), (Cs[i], 10))):
            _, _, st, ptr = describe(x, kind)
            if None in st:
                raise ValueError("strides must be whole numbers of elements")
            meta[i, j] = ptr
            meta[i, col:col + 2] = st
    return meta


def alloc_outputs(shapes, dtype, kind, like):
    """Fresh C-ordered outputs, carved out of one allocation (one pool request, not P)."""
    sizes = [int(m) * int(n) for m, n, _ in shapes]
    total = max(1, sum(sizes))
    if kind == "torch":
        import torch

        tdt = torch.float32 if dtype == _F32 else torch.float64
        buf = torch.empty(total, dtype=tdt, device=like.device)
        parts = torch.split(buf[:sum(sizes)], sizes) if sum(sizes) else [buf[:0]] * len(sizes)
        return [p.view(int(m), int(n)) for p, (m, n, _) in zip(parts, shapes)]
    import cupy

    buf = cupy.empty(total, dtype=dtype)
    out, o = [], 0
    for s, (m, n, _) in zip(sizes, shapes):
        out.append(buf[o:o + s].reshape(int(m), int(n)))
        o += s
    return out


# cuLaunchKernel straight from Python (CuPy's driver binding): [False] after it once
# failed (then CuPy's RawKernel call is used). The convolution family launches
# through these two as well.
_DIRECT = [True]
_launch_kernel: list = []


def driver_launch():
    """CuPy's binding of cuLaunchKernel."""
    if not _launch_kernel:
        from cupy.cuda import driver

        _launch_kernel.append(driver.launchKernel)
    return _launch_kernel[0]


class Launch:
    """Everything one launch needs, resolved: kernel, grid, device metadata.

    Launched with ``cuLaunchKernel`` on a raw stream handle, its argument block
    built once per (alpha, beta): CuPy's RawKernel call costs several microseconds
    of argument packing and stream lookup, a tenth of a small batch's whole time.
    """

    __slots__ = ("kern", "fptr", "grid", "meta", "tiles", "ctype", "plan", "dev", "version",
                 "shmem", "ws", "_ab", "_args", "_go", "_native_args")

    def _pack(self, alpha, beta):
        import ctypes

        c = ctypes.c_float if self.ctype is np.float32 else ctypes.c_double
        vals = (ctypes.c_void_p(self.meta.data.ptr), ctypes.c_void_p(self.tiles.data.ptr),
                c(alpha), c(beta))
        ptrs = (ctypes.c_void_p * 4)(*[ctypes.addressof(v) for v in vals])
        self._args = (vals, ptrs, ctypes.addressof(ptrs))
        self._ab = (alpha, beta)
        # cuLaunchKernel with all but the stream bound: one C call per launch.
        self._go = functools.partial(driver_launch(), self.fptr, self.grid, 1, 1, BLOCK_THREADS,
                                     1, 1, self.shmem)

    def __call__(self, alpha, beta, stream_ptr):
        if self.grid == 0:
            return
        # Through the C++ fast path's cuLaunchKernel where it is loaded (TSM_NATIVE;
        # `api._use_native(None)` sends launches to CuPy's binding below).
        nat = _NATIVE[0] if _NATIVE else None
        if nat is not None:
            f, g, b, sm, m, t, d = self._native_args
            r = nat.launch(f, g, b, sm, stream_ptr, m, t, alpha, beta, d)
            if r == 0:
                return
            if r != 3:  # 3: no driver found; CuPy's binding below says what is wrong
                launch_failed(r)
        if _DIRECT[0]:
            try:
                if self._ab != (alpha, beta):
                    self._pack(alpha, beta)
                self._go(stream_ptr, self._args[2], 0)
                return
            except Exception:  # an older CuPy without it: its RawKernel call from now on
                _DIRECT[0] = False
        with stream_from_ptr(stream_ptr):
            self.kern((self.grid,), (BLOCK_THREADS,),
                      (self.meta, self.tiles, self.ctype(alpha), self.ctype(beta)),
                      shared_mem=self.shmem)


def build_launch(plan, tiles, rows, dtype, version):
    """The `Launch` of `plan` (its tile list already on the device as `tiles`) for
    the batch whose metadata rows are `rows`, on the current device."""
    import cupy

    L = Launch()
    L.plan = plan
    L.version = version
    L.dev = cupy.cuda.runtime.getDevice()
    L.kern = _compile.get_kernel(FAMILY, name_expr(dtype, version))
    L.shmem = smem_bytes(dtype, version) if version in DYNAMIC_SMEM else 0
    if L.shmem > 48 * 1024 and getattr(L.kern, "max_dynamic_shared_size_bytes", 0) < L.shmem:
        L.kern.max_dynamic_shared_size_bytes = L.shmem
    L.fptr = func_ptr(L.kern)
    L.grid = plan.n_tiles
    L.tiles = tiles
    L.ctype = np.float32 if dtype == _F32 else np.float64
    L.ws = None
    if plan.split_problems:
        L.ws = split_workspace(plan, rows, dtype)
    L.meta = cupy.asarray(rows) if plan.n_tiles else None
    L._ab = None
    L._native_args = (L.fptr, L.grid, BLOCK_THREADS, L.shmem,
                      L.meta.data.ptr if L.grid else 0, L.tiles.data.ptr if L.grid else 0,
                      L.ctype is np.float64)
    return L


def split_workspace(plan, rows, dtype):
    """Device workspace and counters of a split-K plan, their pointers written into
    `rows` (meta columns 12 and 13); returned so the launch keeps them alive. The
    counters start at zero and the kernel leaves them so. One launch at a time may
    use them: a launch of the same batch on another stream at once would race (it
    would race on the outputs anyway)."""
    import cupy

    woff, coff, nw, nc, on = plan.workspace()
    ws = cupy.empty(max(1, nw), dtype=dtype)
    cnt = cupy.zeros(max(1, nc), dtype=np.int32)
    item = np.dtype(dtype).itemsize
    rows[:, 12] = np.where(on, ws.data.ptr + woff * item, 0)
    rows[:, 13] = np.where(on, cnt.data.ptr + coff * 4, 0)
    return ws, cnt


# ------------------------------------------------------------------ the cuBLAS route


def blas_ready(x, kind) -> bool:
    """Whether cuBLAS reads or writes 2-D `x` in place: for CuPy, C- or F-contiguous
    (``cupy.matmul`` copies anything else); for torch, one unit stride and the other
    at least the extent of that dimension (torch's cuBLAS call takes it as a leading
    dimension)."""
    if kind == "cupy":
        return x.flags.c_contiguous or x.flags.f_contiguous
    r, c = x.shape
    s0, s1 = x.stride()
    return (s1 == 1 and s0 >= max(1, c)) or (s0 == 1 and s1 >= max(1, r))


class CublasLaunch:
    """A batch of one problem handed to one cuBLAS call on the caller's stream:
    ``cupy.matmul`` / ``cupy.cublas.gemm`` for CuPy arrays, ``torch.mm`` /
    ``Tensor.addmm_`` for torch tensors (their current streams: the ones a
    `Launch` would take). Remembered in the batch's cache like a `Launch`; the
    caller runs it with `run`, which needs the arrays (a cache entry holds no
    reference to them)."""

    __slots__ = ("dev", "kind", "version", "plan")
    VERSION = "cublas"

    def __init__(self, dev, kind):
        self.dev = dev
        self.kind = kind
        self.version = self.VERSION
        self.plan = None

    def run(self, As, Bs, Cs, alpha, beta):
        """Cs[0] = alpha * As[0] @ Bs[0] + beta * Cs[0] (beta == 0: Cs[0] not read),
        every operand `blas_ready`."""
        A, B, C = As[0], Bs[0], Cs[0]
        if self.kind == "torch":
            import torch

            if alpha == 1 and beta == 0:
                torch.mm(A, B, out=C)
            else:  # beta == 0: C is not read (addmm's rule, BLAS's)
                C.addmm_(A, B, beta=beta, alpha=alpha)
            return
        import cupy

        if alpha == 1 and beta == 0:
            cupy.matmul(A, B, out=C)
        else:
            import cupy.cublas  # a submodule: not loaded by `import cupy`

            cupy.cublas.gemm("N", "N", A, B, out=C, alpha=alpha, beta=beta)
