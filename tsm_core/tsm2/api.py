"""The public entry points of TSM2R and TSM2L: matmul(), tsm2r(), tsm2l(), plan(),
explain() and device_spec().

Every call goes the same way: check the operands (nothing is touched if they are
refused), compute on the CPU for numpy inputs, else plan and launch on the GPU,
and hand the result back as the caller's kind of array. The API asks the model
(``model.py``) and the tuner (``autotune.py``) and hands their choice to the
launcher (``launch.py``), which imports neither.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import struct
import threading
from dataclasses import replace

import numpy as np

from tsm_core.runtime import arrays as _arrays
from tsm_core.runtime import compile as _compile
from tsm_core.runtime import config
from tsm_core.runtime import device as _device
from tsm_core.runtime import timing as _timing
from tsm_core.runtime.checks import _byte_extent, check_operands
from tsm_core.runtime.cpu import matmul_cpu
from tsm_core.tsm2 import autotune as _autotune
from tsm_core.tsm2 import launch as _tsm2
from tsm_core.tsm2 import model as _model
from tsm_core.tsm2.model import Plan

__all__ = ["Plan", "device_spec", "explain", "matmul", "plan", "tsm2l", "tsm2r"]

# Default launches take the autotuner's configuration where it kept one.
_tsm2.use_tuner(_autotune.tuned)

ALGORITHMS = ("auto", "tsm2r", "tsm2l", "cublas")

_axpby = None


def _cupy_axpby(T, C, alpha, beta):
    """C = alpha * T + beta * C in one pass (C not read when beta == 0)."""
    global _axpby
    import cupy

    if _axpby is None:
        _axpby = cupy.ElementwiseKernel(
            "T t, T alpha, T beta", "T c",
            "c = (beta == (T)0) ? alpha * t : alpha * t + beta * c", "tsm_axpby")
    st = C.dtype.type
    _axpby(T, st(alpha), st(beta), C)


def _prepare(ops):
    """Allocate C (or use out) and settle the empty cases. Returns (C, done)."""
    import cupy

    m, k, n = ops.m, ops.k, ops.n
    C = ops.out if ops.out is not None else cupy.empty((m, n), dtype=ops.dtype)
    if m == 0 or n == 0:
        return C, True
    if k == 0:  # A @ B is all zeros; alpha * 0 is 0 unless alpha is NaN/Inf
        if ops.out is None or ops.beta == 0.0:
            C.fill(ops.alpha * 0.0)
        else:
            C *= ops.beta
            if ops.alpha * 0.0 != 0.0:
                C += ops.alpha * 0.0
        return C, True
    return C, False


def _contiguous(x) -> bool:
    return x.flags.c_contiguous or x.flags.f_contiguous


def _cublas(ops, C):
    """C = alpha * A @ B + beta * C through cuBLAS: ``cupy.matmul`` for the plain
    product, one ``cupy.cublas.gemm`` with alpha and beta where A, B and C are C- or
    F-contiguous (cuBLAS reads them in place), else a product and one axpby pass."""
    import cupy

    beta = ops.beta if ops.out is not None else 0.0
    if ops.alpha == 1.0 and beta == 0.0:
        cupy.matmul(ops.A, ops.B, out=C)
    elif _contiguous(ops.A) and _contiguous(ops.B) and _contiguous(C):
        import cupy.cublas  # a submodule: not loaded by `import cupy`

        cupy.cublas.gemm("N", "N", ops.A, ops.B, out=C, alpha=ops.alpha, beta=beta)
    elif beta == 0.0:
        cupy.matmul(ops.A, ops.B, out=C)
        C *= ops.alpha
    else:
        _cupy_axpby(cupy.matmul(ops.A, ops.B), C, ops.alpha, beta)


def _result(C, ops, out):
    """C as the caller's kind: their own `out` object when they passed one (C is then
    its backend view, whatever its shape: an empty (0, n) torch tensor's data
    pointer differs from its numpy view's, so the views are not compared)."""
    if out is not None and C is ops.out:
        return out
    if ops.kind == "cupy":
        return C
    return _arrays.wrap(C, ops.kind, out)


_order = _arrays.order_of


_algo_cache: dict = {}

# matmul(algorithm="auto") checks the model's choice once per problem: where the
# plan picks TSM2R or TSM2L, both that kernel and cuBLAS are timed on the caller's
# operands (a scratch output, a few runs) and the faster is kept, in memory and on
# disk (autotune.TuneCache, keyed by GPU, kernel sources and the exact problem).
# The model alone cannot promise "never slower than cuBLAS": cuBLAS's own kernel
# choice is outside it. TSM_VERIFY_DISPATCH=0 turns the check off.
VERIFY_MARGIN = 0.98  # the TSM kernel must be at least 2% faster to be kept
# torch tensors reach our kernels through CuPy views made per call: a launch costs
# about this much more host time than torch's own mm (H100, 2026-11-28: 32.7 us a call
# against 14.4 us for torch.matmul on an 80559 x 6 x 14 float64 product), which a
# short kernel must win back.
TORCH_LAUNCH_S = 20e-6


def _algorithm_for(ops):
    """The algorithm for this problem: the planner's, checked against cuBLAS."""
    import cupy

    key = (ops.m, ops.k, ops.n, ops.dtype.char, _order(ops.A), _order(ops.B), ops.beta != 0.0,
           cupy.cuda.runtime.getDevice())
    ckey = key + (ops.kind == "torch",)
    algo = _algo_cache.get(ckey)
    if algo is None:
        algo = _plan_for(ops).algorithm
        if algo != "cublas" and config.flag("TSM_VERIFY_DISPATCH"):
            algo = _verified(ops, algo, key, TORCH_LAUNCH_S if ops.kind == "torch" else 0.0)
        _algo_cache[ckey] = algo
    return algo


def _verified(ops, algo, key, host_extra=0.0):
    """`algo` if it beats cuBLAS on these operands (measured once, cached on disk) by
    more than `host_extra`, the extra host time a launch of it costs the caller."""
    import cupy

    cache = _autotune.cache(key[-1])
    dkey = (f"dispatch|{ops.dtype.name}|{key[4]}{key[5]}|beta{int(key[6])}|"
            f"m{ops.m}|k{ops.k}|n{ops.n}|{_compile.source_hash()}")
    hit = cache.get(dkey)
    if hit is not None:
        won = hit["params"]["algorithm"]
        t_cub = hit["params"].get("cublas_s")
        if won != "cublas" and host_extra and t_cub is not None:
            if hit["time_s"] + host_extra > VERIFY_MARGIN * t_cub:
                return "cublas"
        return won
    scratch = cupy.empty((ops.m, ops.n), dtype=ops.dtype)
    scratch.fill(1)

    def run_tsm():
        if algo == "tsm2r":
            _tsm2.launch_tsm2r(ops.A, ops.B, scratch, ops.alpha, ops.beta)
        else:
            _launch_tsm2l_any(ops, scratch)

    def run_cublas():
        _cublas(ops, scratch)

    # three interleaved rounds, the best median of each: a clock drift or a neighbour's
    # burst during one round cannot decide a route for microsecond kernels
    ts, tc = [], []
    for _ in range(3):
        ts.append(_timing.event_median(run_tsm, warmup=1, reps=5))
        tc.append(_timing.event_median(run_cublas, warmup=1, reps=5))
    t_tsm, t_cub = min(ts), min(tc)
    winner = algo if t_tsm <= VERIFY_MARGIN * t_cub else "cublas"
    if not os.environ.get("CUDA_INJECTION64_PATH"):  # under a CUDA tool: not kept
        try:
            cache.put(dkey, {"algorithm": winner, "model": algo, "cublas_s": t_cub}, t_tsm)
        except OSError:  # a read-only cache directory only costs the re-measurement
            pass
    if winner != "cublas" and t_tsm + host_extra > VERIFY_MARGIN * t_cub:
        return "cublas"
    return winner


def _plan_for(ops):
    return plan(ops.m, ops.k, ops.n, ops.dtype, (_order(ops.A), _order(ops.B)), beta=ops.beta)


def plan(m: int, k: int, n: int, dtype, order=("C", "C"), *, spec=None, algorithm=None,
         beta: float = 0.0) -> Plan:
    """What ``matmul`` would run for A (m, k) @ B (k, n), and why: TSM2R, TSM2L or
    cuBLAS, with the kernel's parameters and the model's predicted time.

    A has shape (m, k), B (k, n), C (m, n). The paper's performance model
    (section 3.1.8, Algorithm 5) picks t2 and t3, occupancy picks t1, and TSM2R's
    split-K factor fills the GPU; on the current GPU, TSM2L's time comes from a
    line measured once per dtype, order of A and k bucket. See
    ``tsm_core.tsm2.model.plan`` for the rules.

    Parameters
    ----------
    m, k, n : int
        The problem's dimensions (non-negative).
    dtype : str or numpy dtype
        "float32" or "float64".
    order : (str, str)
        The memory orders of A and B: "C" (row-major) or "F" (column-major).
    spec : tsm_core.runtime.device.DeviceSpec, optional
        The GPU to plan for (e.g. ``KNOWN_GPUS["A100"]``). Default: the current
        GPU; where no GPU is found, the reference GPU (an H100 SXM), and the plan
        says so (``Plan.note``, first lines of ``describe()``).
    algorithm : {None, "auto", "tsm2r", "tsm2l", "cublas"}
        Force one kernel's model (None or "auto": the automatic choice).
    beta : float
        Whether C is read (beta != 0) changes the bytes counted.

    Returns
    -------
    Plan
        Frozen; ``describe()`` puts it in words (``explain`` prints that).

    Raises
    ------
    TypeError
        If dtype is not float32 or float64.
    ValueError
        For a negative dimension, an unknown order or algorithm, or TSM2L forced
        with k > 32.

    Examples
    --------
    >>> import tsm_core
    >>> from tsm_core.runtime.device import KNOWN_GPUS
    >>> p = tsm_core.plan(1_000_000, 1024, 16, "float32", spec=KNOWN_GPUS["H100"])
    >>> p.algorithm, p.spec_name
    ('tsm2r', 'H100 SXM')
    >>> tsm_core.plan(10**7, 8, 8, "float64", spec=KNOWN_GPUS["H100"]).algorithm
    'tsm2l'
    >>> p = tsm_core.plan(1_000_000, 1024, 16, "float32")  # this machine's GPU, or the H100
    >>> p.spec_name if tsm_core.has_gpu() else p.note.split(":")[0]  # doctest: +SKIP
    'No CUDA GPU was found'
    """
    return _model.plan(m, k, n, dtype, order, spec=spec, algorithm=algorithm, beta=beta,
                       profile=_autotune.tsm2l_profile)


def device_spec(device_id: int = 0, *, measure_peaks: bool = True):
    """What the performance model knows of a GPU: counts, registers, shared memory,
    clocks, and peaks (read bandwidth, FP32/FP64 rate, launch overhead).

    The peaks are measured once per GPU (a few seconds, one log line) and kept on
    disk under ``$TSM_CACHE_DIR`` (or ~/.cache/tsm).

    Parameters
    ----------
    device_id : int
        The CUDA device.
    measure_peaks : bool
        False estimates the peaks from attributes (memory clock x bus width; FMA
        lanes x clock) instead of measuring them.

    Returns
    -------
    tsm_core.runtime.device.DeviceSpec

    Raises
    ------
    RuntimeError
        Where no CUDA GPU is found (``tsm_core.has_gpu()`` is False).
    ValueError
        For a device id that does not exist.

    Examples
    --------
    >>> import tsm_core
    >>> from tsm_core.runtime.device import KNOWN_GPUS
    >>> KNOWN_GPUS["H100"].sm_count     # the table needs no GPU
    132
    >>> spec = tsm_core.device_spec()   # doctest: +SKIP
    >>> spec.source                     # doctest: +SKIP
    'measured'
    """
    return _device.query(device_id, measure_peaks=measure_peaks)


def matmul(A, B, *, out=None, alpha=1.0, beta=0.0, algorithm="auto"):
    """``alpha * A @ B + beta * out``, by the fastest of TSM2R, TSM2L and cuBLAS.

    A has shape (M, K), B (K, N); the result has shape (M, N).

    Parameters
    ----------
    A, B : numpy.ndarray, cupy.ndarray or torch.Tensor
        float32 or float64, any memory order (C, F or a strided view). Mixed
        float32/float64 promote to float64 as in numpy. numpy (and torch CPU)
        inputs are computed on the CPU; CuPy arrays and torch CUDA tensors on
        their GPU, with no copies.
    out : array of the same kind, shape (M, N) and result dtype, optional
        Written in place and returned. Must not overlap A or B.
    alpha, beta : float
        Scale factors. ``out`` is read only when beta != 0 (BLAS semantics).
    algorithm : {"auto", "tsm2r", "tsm2l", "cublas"}
        "auto" follows ``tsm_core.plan``: TSM2R when B is tall and skinny, TSM2L
        when A is tall and skinny and B small, cuBLAS otherwise; a TSM choice is
        timed against cuBLAS once per problem and kept only if faster (cached on
        disk; ``TSM_VERIFY_DISPATCH=0`` skips the check). "tsm2l" runs opt1 for
        K <= 32 and opt2 (any K) above.

    Returns
    -------
    array of the caller's kind
        ``out`` itself when given (also when M, N or K is 0), else a new (M, N)
        array.

    Notes
    -----
    The first call with a given set of array properties (types, shapes, strides,
    dtypes, devices, whether out is given and alpha / beta are the defaults) runs
    every check and chooses the route; later calls with the same properties check
    only that out shares no memory with A or B and go straight to it: for the
    cuBLAS route one ``sgemm`` / ``dgemm`` call through CuPy's cuBLAS wrapper for
    CuPy arrays stored row- or column-major (``cupy.matmul`` / ``cupy.cublas.gemm``
    for other strides) and ``torch.mm`` / ``Tensor.addmm_`` for torch tensors
    (through a small C++ extension built on first use; ``TSM_NATIVE=0`` keeps it in
    Python); for TSM2R and TSM2L the launch, on torch's current stream for torch
    tensors.

    Raises
    ------
    TypeError
        Unsupported array types, mixed kinds, integer or half dtypes, an ``out`` of
        the wrong dtype, or a torch tensor that requires grad.
    ValueError
        Shapes that do not chain, an ``out`` of the wrong shape, read-only or
        overlapping A or B, operands on different GPUs, or an unknown algorithm.

    Examples
    --------
    >>> import numpy as np, tsm_core
    >>> A = np.random.default_rng(0).standard_normal((1000, 300))
    >>> B = np.random.default_rng(1).standard_normal((300, 4))
    >>> C = tsm_core.matmul(A, B)
    >>> C.shape
    (1000, 4)
    >>> bool(np.allclose(C, A @ B))
    True
    >>> out = np.ones((1000, 4))
    >>> tsm_core.matmul(A, B, out=out, alpha=2.0, beta=1.0) is out
    True
    >>> import cupy                                          # doctest: +SKIP
    >>> C = tsm_core.matmul(cupy.asarray(A), cupy.asarray(B))  # on the GPU  # doctest: +SKIP
    """
    if type(A) is _TorchTensor:  # torch on the cuBLAS route: the C++ fast path's keys
        r = _native_call(A, B, out, alpha, beta, algorithm)
        if r is not None:
            return r
    try:
        key = host_key(A, B, out, alpha, beta, algorithm)
    except Exception:  # an object whose attributes raise: the general path says why
        key = None
    if key is not None:
        d = _DECISIONS.get(key)
        if d is not None:
            if d.route is not None and (out is None or not _overlaps(d, A, B, out)):
                C = _run_decided(d, A, B, out, alpha, beta)
                if C is not None:
                    return C
            return _general(A, B, out, alpha, beta, algorithm)[0]
    C, route = _general(A, B, out, alpha, beta, algorithm)
    if key is not None:
        _remember(key, route, A, B, out)
        if route == _R_TORCH and _DECISIONS[key].route == _R_TORCH:
            _native_remember(A, B, out, alpha, beta, algorithm)
    return C


def _torch_product(A, B, out, alpha, beta):
    """alpha A @ B (+ beta out) with torch's own calls, as the host path runs torch CPU
    tensors."""
    import torch

    if alpha == 1 and beta == 0:
        return torch.mm(A, B) if out is None else torch.mm(A, B, out=out)
    if out is None:
        C = torch.empty((A.shape[0], B.shape[1]), dtype=A.dtype, device=A.device)
        return C.addmm_(A, B, beta=0.0, alpha=alpha)
    return out.addmm_(A, B, beta=beta, alpha=alpha)


def _caller_stream(kind):
    """For torch CUDA tensors, torch's current stream as CuPy's for the call (the
    launches then follow the caller's work on that stream, under
    ``torch.cuda.stream(s)`` or a graph capture too); else nothing."""
    if kind != "torch":
        return contextlib.nullcontext()
    import cupy
    import torch

    st = torch.cuda.current_stream()
    return cupy.cuda.ExternalStream(st.cuda_stream, st.device.index)


def _general(A, B, out, alpha, beta, algorithm):
    """The full path: every check, then the computation. Returns (result, route), the
    route being what a later call with the same key may take directly (None: this
    path every time)."""
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {ALGORITHMS}, not {algorithm!r}")
    ops = check_operands(A, B, out=out, alpha=alpha, beta=beta)
    if ops.out is None and ops.beta != 0.0:
        ops = replace(ops, beta=0.0)  # out is read only when given (BLAS semantics)
    if ops.xp is np:
        if (ops.kind == "torch-cpu" and A.dtype == B.dtype and (out is None or out.dtype == A.dtype)
                and not (A.requires_grad or B.requires_grad)):
            # torch's own product, as later calls with this key run it (the same bits)
            return _torch_product(A, B, out, ops.alpha, ops.beta), _R_TORCH
        C = _result(matmul_cpu(ops), ops, out)
        return C, (_R_NUMPY if ops.kind == "numpy" else _R_TORCH)
    with _caller_stream(ops.kind):
        C, done = _prepare(ops)
        algo = None
        if not done:
            algo = algorithm
            if algo == "auto":
                algo = _algorithm_for(ops)
            if algo == "tsm2r":
                _tsm2.launch_tsm2r(ops.A, ops.B, C, ops.alpha, ops.beta)
            elif algo == "tsm2l":
                _launch_tsm2l_any(ops, C)
            else:
                _cublas(ops, C)
    route = None
    if algo == "cublas":
        route = _R_TORCH if ops.kind == "torch" else _R_CUBLAS
    elif algo in ("tsm2r", "tsm2l") and ops.kind == "cupy":
        route = _R_TSM2R if algo == "tsm2r" else _R_TSM2L
    elif algo in ("tsm2r", "tsm2l") and ops.kind == "torch":
        route = _R_TORCH_TSM2R if algo == "tsm2r" else _R_TORCH_TSM2L
    return _result(C, ops, out), route


# ------------------------------------------------------------------ the host path
#
# A repeated call is recognised by a key of what its route depends on (types, shapes,
# strides, dtypes, devices, whether alpha and beta are the defaults, whether out is
# given, the algorithm asked for): never by data pointers or object identity, so a
# freed and reused allocation, or a new array of another layout at the same address,
# cannot meet a decision made for something else. The first call with a key goes the
# general path (every check, the model, the one-time timing against cuBLAS) and
# leaves a decision; later calls with that key check only what the key cannot hold
# (that out shares no memory with A or B: pointers, every call) and go straight to
# the backend: for CuPy on the cuBLAS route, one ``sgemm`` / ``dgemm`` through CuPy's
# thin cuBLAS wrapper with the transposition flags and leading dimensions worked out
# once from the strides (``gemm_args``; the pointers are read on every call), else
# ``cupy.matmul`` / ``cupy.cublas.gemm``; ``torch.mm`` / ``Tensor.addmm_`` for torch
# tensors, ``np.matmul`` for numpy, the TSM2R / TSM2L launch for CuPy arrays and for
# torch CUDA tensors (on torch's current stream) on ours. A key the general path did
# not settle (empty operands, mixed dtypes) keeps the general path.

_R_NUMPY, _R_TORCH, _R_CUBLAS, _R_TSM2R, _R_TSM2L, _R_TORCH_TSM2R, _R_TORCH_TSM2L = range(7)
ROUTE_NAMES = ("numpy", "torch", "cublas", "tsm2r", "tsm2l", "tsm2r", "tsm2l")
_TORCH_ROUTES = (_R_TORCH, _R_TORCH_TSM2R, _R_TORCH_TSM2L)

_DECISIONS: dict = {}
DECISIONS_MAX = 4096  # distinct keys kept; the table is emptied when it fills


def host_key(A, B, out, alpha, beta, algorithm):
    """The host path's key of a call, or None where the call always takes the full path.

    The key holds everything a remembered decision depends on, and nothing that
    points at memory: the exact types of A, B and out, their shapes, strides, dtypes
    and devices (torch: also ``requires_grad``), whether out is given, whether alpha
    is 1 and beta 0, and the algorithm asked for. alpha and beta must be Python
    ``float`` or ``int`` (anything else, numpy scalars and bools included, takes
    the full path, which checks it).

    Parameters
    ----------
    A, B : array
        The operands as the caller passed them.
    out : array or None
    alpha, beta : object
    algorithm : object

    Returns
    -------
    tuple or None
        Hashable; equal for two calls exactly when a decision made for one holds
        for the other.

    Examples
    --------
    >>> import numpy as np
    >>> from tsm_core.tsm2.api import host_key
    >>> A, B = np.ones((4, 3)), np.ones((3, 2))
    >>> host_key(A, B, None, 1.0, 0.0, "auto") == host_key(A.copy(), B, None, 1, 0, "auto")
    True
    >>> host_key(A, B, None, 1.0, 0.0, "auto") == host_key(np.asfortranarray(A), B, None, 1.0, 0.0, "auto")
    False
    >>> host_key(A, B, None, np.float64(1), 0.0, "auto") is None
    True
    """
    t = type(A)
    if type(B) is not t or (out is not None and type(out) is not t):
        return None
    ta = type(alpha)
    tb = type(beta)
    if (ta is not float and ta is not int) or (tb is not float and tb is not int):
        return None
    flags = (out is None, alpha == 1, out is None or beta == 0, algorithm)
    if t is np.ndarray:
        if out is None:
            return (A.shape, A.strides, A.dtype, B.shape, B.strides, B.dtype, flags)
        return (A.shape, A.strides, A.dtype, B.shape, B.strides, B.dtype,
                out.shape, out.strides, out.dtype, out.flags.writeable, flags)
    prop = _PROPS.get(t) or _props_for(t)
    if prop is None:
        return None
    if out is None:
        return (prop(A), prop(B), flags)
    return (prop(A), prop(B), prop(out), flags)


def _cupy_props(x):
    return (x.shape, x.strides, x.dtype, x.data.device_id)


def _torch_props(x):
    return (x.shape, x.stride(), x.dtype, x.device, x.requires_grad)


_PROPS: dict = {}


def _props_for(t):
    """The key function of arrays of exact type `t` (CuPy's and torch's are known
    once their modules are loaded), or None."""
    cupy = _arrays._loaded("cupy")
    if cupy is not None and t is cupy.ndarray:
        _PROPS[t] = _cupy_props
        return _cupy_props
    torch = _arrays._loaded("torch")
    if torch is not None and t is torch.Tensor:
        _PROPS[t] = _torch_props
        return _torch_props
    return None


def _layout(x):
    """(shape, strides in bytes, itemsize) of a numpy, CuPy or torch array."""
    if callable(getattr(x, "stride", None)):  # torch: strides in elements
        item = x.element_size()
        return tuple(x.shape), tuple(s * item for s in x.stride()), item
    return tuple(x.shape), tuple(x.strides), x.itemsize


def _extent(x):
    """(lo, hi): the bytes x spans, relative to the address of its first element."""
    shape, strides, item = _layout(x)
    return _byte_extent(0, shape, strides, item)


class _Decision:
    """What a key's later calls run: the route and the facts the fast checks need.
    Nothing in it points at memory: the addresses are read from the arrays per call."""

    __slots__ = ("route", "ptr", "ext_a", "ext_b", "ext_c", "m", "n", "dtype", "scaled", "cfg",
                 "gemm", "device", "views", "ready", "direct")

    def __init__(self, route, ptr=None, ext_a=None, ext_b=None, ext_c=None, m=0, n=0, dtype=None,
                 scaled=False, cfg=None, gemm=None, device=-1, views=None, ready=True):
        self.route = route  # None: the general path every time
        self.ptr = ptr  # how to read an array's first-element address (CuPy, torch)
        self.ext_a, self.ext_b, self.ext_c = ext_a, ext_b, ext_c
        self.m, self.n, self.dtype = m, n, dtype
        self.scaled = scaled  # alpha != 1, or out given and beta != 0
        self.cfg = cfg  # TSM2L: the configuration matmul launches
        self.gemm = gemm  # CuPy on cuBLAS: gemm_args(...) for the direct call, or None
        self.device = device  # the operands' GPU (CuPy on cuBLAS, torch on ours)
        self.views = views  # torch on ours: ((shape, byte strides) of A, B, C, torch device)
        self.ready = ready  # CuPy on cuBLAS: cupy.matmul / cupy.cublas.gemm serve it too
        self.direct = None  # CuPy on cuBLAS: what the direct call reads (_direct_call)


_GENERAL = _Decision(None)


def _ptr_cupy(x):
    return x.data.ptr


def _ptr_torch(x):
    return x.data_ptr()


def _remember(key, route, A, B, out):
    """Keep the decision of a call the general path just ran (with `route`)."""
    if len(_DECISIONS) >= DECISIONS_MAX:
        _DECISIONS.clear()
    m, k = (int(d) for d in A.shape)
    n = int(B.shape[1])
    gemm, device, views, ready = None, -1, None, True
    if route == _R_CUBLAS and min(m, k, n) > 0 and A.dtype == B.dtype:
        item = A.dtype.itemsize
        sc = (n * item, item) if out is None else out.strides
        gemm = gemm_args(m, k, n, A.strides, B.strides, sc, item)
        device = A.data.device_id
        ready = _gemm_ready(A, B, out, key)
    if (route is None or min(m, k, n) == 0 or A.dtype != B.dtype
            or (out is not None and _self_overlapping(out))
            or (route == _R_CUBLAS and not ready and gemm is None)):
        # The empty cases, promotion, an out with repeated elements, a scaled product
        # cuBLAS cannot read in place: the general path.
        _DECISIONS[key] = _GENERAL
        return
    cfg = None
    if route in (_R_TSM2L, _R_TORCH_TSM2L):
        cfg = _tsm2.TSM2LConfig(opt=1 if k <= _tsm2.TSM2L_KMAX else 2)
    ext_c = None if out is None else _extent(out)
    scaled = not (key[-1][1] and key[-1][2])
    ptr = _ptr_torch if route in _TORCH_ROUTES else _ptr_cupy
    if route in (_R_TORCH_TSM2R, _R_TORCH_TSM2L):
        device = A.device.index
        views = tuple(None if x is None else _layout(x)[:2] for x in (A, B, out)) + (A.device,)
    dtype = _arrays.numpy_dtype(A) if route in (_R_TORCH_TSM2R, _R_TORCH_TSM2L) else A.dtype
    _DECISIONS[key] = _Decision(route, ptr, _extent(A), _extent(B), ext_c, m, n, dtype,
                                scaled, cfg, gemm, device, views, ready)


def _self_overlapping(x) -> bool:
    """Whether an array repeats an element (a zero stride along a dimension longer than 1)."""
    shape, strides, _ = _layout(x)
    return any(s == 0 and d > 1 for d, s in zip(shape, strides))


def _gemm_ready(A, B, out, key) -> bool:
    """Whether a scaled CuPy product may go to ``cupy.cublas.gemm`` in one call:
    A and B C- or F-contiguous (so cuBLAS reads them in place) and out C- or
    F-contiguous; unscaled products need nothing (``cupy.matmul``)."""
    if key[-1][1] and key[-1][2]:
        return True
    return _contiguous(A) and _contiguous(B) and (out is None or _contiguous(out))


# ------------------------------------------------------------------ direct cuBLAS calls

_INT_MAX = 2**31 - 1  # cuBLAS's 32-bit sizes and leading dimensions


def _stored_colmajor(rows, cols, s0, s1, item):
    """How cuBLAS (column-major) can read a (rows, cols) matrix with byte strides (s0, s1):
    (False, ld) where it is stored column-major, (True, ld) where its transpose is
    (a row-major matrix), None where neither (a strided view, negative or zero
    strides, strides that are not whole elements). Strides of a length-1 dimension
    are ignored, as numpy, CuPy and torch leave them free."""
    if (rows > 1 and (s0 <= 0 or s0 % item)) or (cols > 1 and (s1 <= 0 or s1 % item)):
        return None
    e0, e1 = s0 // item, s1 // item
    col = (rows == 1 or e0 == 1) and (cols == 1 or e1 >= rows)
    row = (cols == 1 or e1 == 1) and (rows == 1 or e0 >= cols)
    if col and (e0 == 1 or not row):
        return False, (e1 if cols > 1 else rows)
    if row:
        return True, (e0 if rows > 1 else cols)
    return None


def gemm_args(m, k, n, a_strides, b_strides, c_strides, itemsize):
    """The arguments of one column-major cuBLAS ``gemm`` computing C = A @ B in place,
    worked out from shapes and byte strides alone, or None where cuBLAS cannot read
    an operand as it lies.

    A has shape (m, k), B (k, n), C (m, n). Each must be stored column-major or
    row-major, with any leading dimension at least its row (or column) length: C-
    and F-ordered arrays, transposed views, and row or column slices of larger
    matrices. A row-major C is computed as C^T = B^T A^T (cuBLAS then sees the
    operands swapped). The result holds sizes and flags only, never an address: the
    host path keeps it per key and reads the pointers of each call's arrays.

    Parameters
    ----------
    m, k, n : int
        The product's dimensions (all positive).
    a_strides, b_strides, c_strides : (int, int)
        The byte strides of A, B and C.
    itemsize : int
        Bytes per element (4 or 8).

    Returns
    -------
    tuple or None
        ``(swap, transa, transb, M, N, K, ld1, ld2, ldc)``: cuBLAS is called as
        ``gemm(handle, transa, transb, M, N, K, alpha, P1, ld1, P2, ld2, beta, C,
        ldc)`` with P1, P2 the addresses of A and B, or of B and A where ``swap``;
        transa and transb are 0 (``CUBLAS_OP_N``) or 1 (``CUBLAS_OP_T``).

    Examples
    --------
    >>> from tsm_core.tsm2.api import gemm_args
    >>> gemm_args(4, 3, 2, (24, 8), (16, 8), (16, 8), 8)   # all C-ordered: C^T = B^T A^T
    (True, 0, 0, 2, 4, 3, 2, 3, 2)
    >>> gemm_args(4, 3, 2, (8, 32), (8, 24), (8, 32), 8)   # all F-ordered: C = A B
    (False, 0, 0, 4, 2, 3, 4, 3, 4)
    >>> gemm_args(4, 3, 2, (48, 16), (16, 8), (16, 8), 8) is None   # every other column of A
    True
    """
    a = _stored_colmajor(m, k, a_strides[0], a_strides[1], itemsize)
    b = _stored_colmajor(k, n, b_strides[0], b_strides[1], itemsize)
    c = _stored_colmajor(m, n, c_strides[0], c_strides[1], itemsize)
    if a is None or b is None or c is None or max(m, k, n, a[1], b[1], c[1]) > _INT_MAX:
        return None
    if not c[0]:  # C column-major: C = op(A) op(B)
        return (False, int(a[0]), int(b[0]), m, n, k, a[1], b[1], c[1])
    # C row-major, i.e. C^T column-major: C^T = op(B^T) op(A^T)
    return (True, int(not b[0]), int(not a[0]), n, m, k, b[1], a[1], c[1])


_GEMM = None  # what a direct call needs from CuPy, loaded on first use (_gemm_lib)

_ONE_ZERO = {"f": np.array([1.0, 0.0], np.float32), "d": np.array([1.0, 0.0], np.float64)}
_ONE_ZERO_PTR = {c: a.ctypes.data for c, a in _ONE_ZERO.items()}
_PACK = {"f": struct.Struct("ff").pack_into, "d": struct.Struct("dd").pack_into}


class _HostScalars(threading.local):
    """alpha and beta in host memory for cuBLAS (host pointer mode: read before the
    call returns), one pair per thread and dtype char: (buffer, its address)."""

    def __init__(self):
        f, d = (ctypes.c_float * 2)(), (ctypes.c_double * 2)()
        self.f = (f, ctypes.addressof(f))
        self.d = (d, ctypes.addressof(d))


_SCALARS = _HostScalars()


def _gemm_lib():
    """(current device, cuBLAS handle, CuPy's compute type, cupy.empty, gemm per dtype
    char, the compute types a direct call matches per dtype char)."""
    global _GEMM
    import cupy
    from cupy._core import _routines_linalg as rl
    from cupy_backends.cuda.libs import cublas

    # cupy.matmul runs float32 as plain FP32 under these (not TF32, not pedantic):
    same = {"f": (rl.COMPUTE_TYPE_DEFAULT, rl.COMPUTE_TYPE_FP32),
            "d": (rl.COMPUTE_TYPE_DEFAULT, rl.COMPUTE_TYPE_FP64)}
    _GEMM = (cupy.cuda.runtime.getDevice, cupy.cuda.device.get_cublas_handle, rl.get_compute_type,
             cupy.empty, {"f": cublas.sgemm, "d": cublas.dgemm}, same)
    return _GEMM


def _direct_call(d):
    """Everything a decided direct gemm reads, in one tuple (made at its first call)."""
    getdev, handle, ctype, empty, gemm, same = _GEMM or _gemm_lib()
    ch = d.dtype.char
    d.direct = (getdev, handle, ctype, empty, gemm[ch], same[ch], d.dtype, ch, d.dtype.itemsize,
                (d.m, d.n), _ONE_ZERO_PTR[ch], _PACK[ch], *d.gemm)
    return d.direct


def _gemm_direct(d, A, B, out, alpha, beta):
    """One ``sgemm`` / ``dgemm`` on the current stream (CuPy's wrapper sets the handle's
    stream to it on each call) for a decided CuPy product; None where the current
    device is not the operands' or CuPy's compute type for the dtype asks for other
    arithmetic than cuBLAS's plain gemm (the caller then runs ``cupy.matmul``)."""
    (getdev, handle, ctype, empty, gemm, same, dtype, ch, item, shape, one_zero, pack,
     swap, ta, tb, M, N, K, ld1, ld2, ldc) = d.direct or _direct_call(d)
    if getdev() != d.device or ctype(dtype) not in same:
        return None
    C = out
    if C is None:
        C = empty(shape, dtype)
        beta = 0.0
    if d.scaled:
        buf, pal = getattr(_SCALARS, ch)
        pack(buf, 0, alpha, beta)
    else:
        pal = one_zero
    if swap:
        p1, p2 = B.data.ptr, A.data.ptr
    else:
        p1, p2 = A.data.ptr, B.data.ptr
    gemm(handle(), ta, tb, M, N, K, pal, p1, ld1, p2, ld2, pal + item, C.data.ptr, ldc)
    return C


# ------------------------------------------------------------------ torch on our kernels

_TORCH_TSM = None  # what a decided torch launch needs, loaded on first use (_torch_tsm_lib)
_EXT_STREAMS: dict = {}  # (raw stream, device) -> cupy.cuda.ExternalStream


def _torch_tsm_lib():
    """(current device, torch's current raw stream of a device, torch.empty,
    cupy.ndarray, UnownedMemory, MemoryPointer, ExternalStream)."""
    global _TORCH_TSM
    import cupy
    import torch

    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is None:  # older torch: the same through the Stream object
        def raw(dev):
            return torch.cuda.current_stream(dev).cuda_stream

    _TORCH_TSM = (cupy.cuda.runtime.getDevice, raw, torch.empty, cupy.ndarray,
                  cupy.cuda.UnownedMemory, cupy.cuda.MemoryPointer, cupy.cuda.ExternalStream)
    return _TORCH_TSM


def _torch_tsm(d, A, B, out, alpha, beta):
    """Launch a decided TSM2R / TSM2L product of torch CUDA tensors on torch's current
    stream: CuPy views of the tensors built from the remembered shapes and strides
    and each call's addresses, no planning. None where the current device is not the
    tensors' (the caller then takes the general path)."""
    getdev, raw, tempty, ndarray, Unowned, MemPtr, External = _TORCH_TSM or _torch_tsm_lib()
    dev = d.device
    if getdev() != dev:
        return None
    (sa, ta), (sb, tb), vc, tdev = d.views
    C = out
    if C is None:
        C = tempty((d.m, d.n), dtype=A.dtype, device=tdev)
        beta = 0.0
        item = d.dtype.itemsize
        sc, tc, hc = (d.m, d.n), (d.n * item, item), d.m * d.n * item
    else:
        (sc, tc), hc = vc, d.ext_c[1]
    dt = d.dtype
    Av = ndarray(sa, dt, MemPtr(Unowned(A.data_ptr(), d.ext_a[1], A, dev), 0), ta)
    Bv = ndarray(sb, dt, MemPtr(Unowned(B.data_ptr(), d.ext_b[1], B, dev), 0), tb)
    Cv = ndarray(sc, dt, MemPtr(Unowned(C.data_ptr(), hc, C, dev), 0), tc)
    ptr = raw(dev)
    stream = _EXT_STREAMS.get((ptr, dev))
    if stream is None:
        if len(_EXT_STREAMS) >= 64:
            _EXT_STREAMS.clear()
        stream = _EXT_STREAMS[(ptr, dev)] = External(ptr, dev)
    with stream:
        if d.route == _R_TORCH_TSM2R:
            _tsm2.launch_tsm2r(Av, Bv, Cv, float(alpha), float(beta))
        else:
            _tsm2.launch_tsm2l(Av, Bv, Cv, float(alpha), float(beta), d.cfg)
    return C


def _overlaps(d, A, B, out) -> bool:
    """Whether out's bytes may meet A's or B's (the check every call with out makes:
    pointers are not in the key). True sends the call to the general path, which
    decides exactly and words the error."""
    if d.route == _R_NUMPY:
        return np.may_share_memory(out, A) or np.may_share_memory(out, B)
    ptr = d.ptr
    pc = ptr(out)
    clo, chi = pc + d.ext_c[0], pc + d.ext_c[1]
    pa = ptr(A)
    if pa + d.ext_a[0] < chi and clo < pa + d.ext_a[1]:
        return True
    pb = ptr(B)
    return pb + d.ext_b[0] < chi and clo < pb + d.ext_b[1]


def _run_decided(d, A, B, out, alpha, beta):
    """Run a remembered decision (the key matched; out's overlap was checked). Returns
    the result, or None where the decision does not hold for this call (another
    current device than the one decided for, where the backend's own call cannot
    stand in): the caller then takes the general path."""
    r = d.route
    if r == _R_CUBLAS:
        if d.gemm is not None:
            C = _gemm_direct(d, A, B, out, alpha, beta)
            if C is not None:
                return C
            if not d.ready:
                return None  # a scaled product of strided views: the general path
        import cupy

        if not d.scaled:
            return cupy.matmul(A, B, out=out)
        C = out
        if C is None:
            C = cupy.empty((d.m, d.n), dtype=d.dtype)
            beta = 0.0
        import cupy.cublas  # a submodule: not loaded by `import cupy`

        cupy.cublas.gemm("N", "N", A, B, out=C, alpha=alpha, beta=beta)
        return C
    if r == _R_TORCH:
        torch = _arrays._loaded("torch")
        if not d.scaled:
            return torch.mm(A, B) if out is None else torch.mm(A, B, out=out)
        if out is None:
            C = torch.empty((d.m, d.n), dtype=A.dtype, device=A.device)
            return C.addmm_(A, B, beta=0.0, alpha=alpha)
        return out.addmm_(A, B, beta=beta, alpha=alpha)
    if r == _R_NUMPY:
        if out is None or beta == 0:
            C = np.matmul(A, B, out=out)
            if alpha != 1:
                C *= alpha
            return C
        AB = np.matmul(A, B)
        if alpha != 1:
            AB *= alpha
        if beta != 1:
            out *= beta
        out += AB
        return out
    if r >= _R_TORCH_TSM2R:
        return _torch_tsm(d, A, B, out, alpha, beta)
    import cupy

    C = out
    if C is None:
        C = cupy.empty((d.m, d.n), dtype=d.dtype)
        beta = 0.0
    if r == _R_TSM2R:
        _tsm2.launch_tsm2r(A, B, C, float(alpha), float(beta))
    else:
        _tsm2.launch_tsm2l(A, B, C, float(alpha), float(beta), d.cfg)
    return C


def route_of(A, B, out=None, alpha=1.0, beta=0.0, algorithm="auto") -> str | None:
    """The route a repeated ``matmul`` call with these arguments takes (for benches and
    tests): "numpy", "torch", "cublas", "tsm2r" or "tsm2l" on the host path,
    "general" where it takes the full path every time (then, for GPU arrays,
    "general:" and the algorithm chosen), None before the first call."""
    key = host_key(A, B, out, alpha, beta, algorithm)
    d = _DECISIONS.get(key) if key is not None else None
    if d is None:
        return None
    if d.route is not None:
        return ROUTE_NAMES[d.route]
    try:
        ops = check_operands(A, B, out=out, alpha=alpha, beta=beta)
        if ops.xp is not np and min(ops.m, ops.k, ops.n) > 0:
            return "general:" + (algorithm if algorithm != "auto" else _algorithm_for(ops))
    except Exception:  # a call the general path refuses
        pass
    return "general"


class _NoType:
    """Stands in for torch.Tensor until the C++ fast path is loaded."""


_TorchTensor = _NoType  # torch.Tensor once the fast path is loaded
_native_call = None  # its call(A, B, out, alpha, beta, algorithm) -> result or None
_native = None


def _native_remember(A, B, out, alpha, beta, algorithm) -> None:
    """Hand a torch decision to the C++ fast path (loading it on first use)."""
    global _TorchTensor, _native_call, _native
    if _native is None:
        from tsm_core.tsm2 import fastpath

        mod = fastpath.get()
        if mod is None:
            if not fastpath.status()["building"]:
                _native = False  # the Python path only
            return  # (while it builds: asked again at the next torch decision)
        import torch

        _native, _native_call, _TorchTensor = mod, mod.call, torch.Tensor
    if _native:
        _native.remember(A, B, out, alpha, beta, algorithm)


def forget_decisions(*, unload: bool = False) -> None:
    """Drop the host path's remembered decisions (and the checked algorithm choices);
    ``unload`` also stops using the C++ fast path until the next torch decision
    (tests switching ``TSM_NATIVE``)."""
    global _TorchTensor, _native_call, _native
    _DECISIONS.clear()
    _algo_cache.clear()
    _EXT_STREAMS.clear()
    if _native:
        _native.clear()
    if unload:
        _TorchTensor, _native_call, _native = _NoType, None, None


def _launch_tsm2l_any(ops, C, cfg=None):
    cfg = cfg or _tsm2.TSM2LConfig()
    if ops.k > _tsm2.TSM2L_KMAX and cfg.opt == 1:
        cfg = _tsm2.TSM2LConfig(opt=2, t1=cfg.t1, tcf=cfg.tcf)
    return _tsm2.launch_tsm2l(ops.A, ops.B, C, ops.alpha, ops.beta, cfg)


def tsm2r(A, B, *, out=None, alpha=1.0, beta=0.0, version=3, t1=0, t2=0, t3=0, stages=0, splits=0, rpt=0,
          groups=0, rgroups=0, tc=0, u=0, streamk=0):
    """``alpha * A @ B + beta * out`` with TSM2R forced (B tall and skinny).

    A has shape (M, K), B (K, N); the result has shape (M, N). ``version`` picks
    the paper's optimisation ladder: 0 (inner products, Algorithm 1), 1 (outer
    products, Algorithm 2), 2 (B tile in shared memory, Algorithm 3) or 3
    (prefetching, Algorithm 4; the default and the fast one). t1, t2, t3, stages
    and splits override the planner (0 = choose); for a row-major A also rpt (rows
    per warp), groups (lane groups splitting the columns) and rgroups (lane groups
    splitting the rows, 2 by default for float32 with N > 8). ``tc`` (row-major A,
    version 3): 1 runs on the tensor cores (float64: DMMA; float32: 3xTF32, each
    operand split into two TF32 parts, accurate to float32's order, see
    tsm2/tsm2r.cu), -1 on the FMA units, 0 chooses (float64: tensor cores;
    float32: tensor cores unless groups or rgroups are given; both on the FMA units
    for N <= 2 with 2^24 <= M K <= 2^26, and float64 N <= 2 below that too: see
    ``tsm_core.tsm2.launch.SMALL_N2_ELEMS``). ``u`` (on the
    tensor cores): k pieces per warp step, 1, 2, 4 or 8 (0 = 4). ``streamk`` (on the
    tensor cores): 1 runs stream-K (one wave of blocks, each an equal run of
    (row block, k-tile) units; ``splits`` is then unused), -1 split-K, 0 chooses
    (stream-K on the default block shapes, for float32 at 16-column chunks only,
    unless ``splits`` > 1 is given).

    Parameters
    ----------
    A, B : numpy.ndarray, cupy.ndarray or torch.Tensor
        float32 or float64, as for ``matmul``. numpy (and torch CPU) inputs are
        computed on the CPU, where the kernel parameters do not apply.
    out : array of the same kind, shape (M, N), optional
        Written in place and returned.
    alpha, beta : float
        Scale factors (``out`` read only when beta != 0).
    version, t1, t2, t3, stages, splits, rpt, groups, rgroups, tc, u, streamk : int
        The kernel and its parameters, as above (0: chosen for the problem).

    Returns
    -------
    array of the caller's kind
        ``out`` itself when given, else a new (M, N) array.

    Raises
    ------
    TypeError, ValueError
        As ``matmul`` for the operands; ValueError for a version, tc, streamk or
        u outside the values above, or a configuration the GPU cannot hold.

    Examples
    --------
    >>> import numpy as np, tsm_core
    >>> A = np.random.default_rng(0).standard_normal((5000, 512))
    >>> B = np.random.default_rng(1).standard_normal((512, 8))
    >>> bool(np.allclose(tsm_core.tsm2r(A, B), A @ B))   # numpy: on the CPU
    True
    >>> import cupy                                                  # doctest: +SKIP
    >>> C = tsm_core.tsm2r(cupy.asarray(A), cupy.asarray(B), version=2)  # doctest: +SKIP
    """
    ops = check_operands(A, B, out=out, alpha=alpha, beta=beta)
    if version not in (0, 1, 2, 3):
        raise ValueError(f"version must be 0, 1, 2 or 3, not {version!r}")
    if tc not in (-1, 0, 1):
        raise ValueError(f"tc must be -1, 0 or 1, not {tc!r}")
    if streamk not in (-1, 0, 1):
        raise ValueError(f"streamk must be -1, 0 or 1, not {streamk!r}")
    if ops.xp is np:
        return _result(matmul_cpu(ops), ops, out)
    C, done = _prepare(ops)
    if not done:
        cfg = _tsm2.TSM2RConfig(version=version, t1=t1, t2=t2, t3=t3, stages=stages, splits=splits, rpt=rpt,
                                groups=groups, rgroups=rgroups, tc=tc, u=u, streamk=streamk)
        _tsm2.launch_tsm2r(ops.A, ops.B, C, ops.alpha, ops.beta, cfg)
    return _result(C, ops, out)


def tsm2l(A, B, *, out=None, alpha=1.0, beta=0.0, opt=1, t1=0, t2=0, kt=0, tcf=0, warp=0):
    """``alpha * A @ B + beta * out`` with TSM2L forced (A tall and skinny, B small).

    A has shape (M, K), B (K, N); the result has shape (M, N). ``opt`` 1 is the
    paper's Algorithm 6 (needs K <= 32), 2 its Algorithm 7 (any K). ``tcf`` is
    the thread count factor: M / tcf threads are launched (0 = choose). ``warp``
    (opt 1, row-major A with 16-byte aligned rows, N <= 16): 1 runs
    ``tsm2l_opt1w`` (a warp reads whole rows into registers), -1 the shared-memory
    tiles of ``tsm2l_opt1``, 0 chooses (opt1w where it applies).

    Parameters
    ----------
    A, B : numpy.ndarray, cupy.ndarray or torch.Tensor
        float32 or float64, as for ``matmul``. numpy (and torch CPU) inputs are
        computed on the CPU, where the kernel parameters do not apply.
    out : array of the same kind, shape (M, N), optional
        Written in place and returned.
    alpha, beta : float
        Scale factors (``out`` read only when beta != 0).
    opt, t1, t2, kt, tcf, warp : int
        The kernel and its parameters, as above (0: chosen for the problem).

    Returns
    -------
    array of the caller's kind
        ``out`` itself when given, else a new (M, N) array.

    Raises
    ------
    TypeError, ValueError
        As ``matmul`` for the operands; ValueError for opt or warp outside the
        values above, or opt=1 with K > 32.

    Examples
    --------
    >>> import numpy as np, tsm_core
    >>> A = np.random.default_rng(0).standard_normal((100000, 16))
    >>> B = np.random.default_rng(1).standard_normal((16, 16))
    >>> bool(np.allclose(tsm_core.tsm2l(A, B), A @ B))   # numpy: on the CPU
    True
    >>> import cupy                                                   # doctest: +SKIP
    >>> C = tsm_core.tsm2l(cupy.asarray(A), cupy.asarray(B), tcf=4)   # doctest: +SKIP
    """
    ops = check_operands(A, B, out=out, alpha=alpha, beta=beta)
    if opt not in (1, 2):
        raise ValueError(f"opt must be 1 or 2, not {opt!r}")
    if warp not in (-1, 0, 1):
        raise ValueError(f"warp must be -1, 0 or 1, not {warp!r}")
    if opt == 1 and ops.k > _tsm2.TSM2L_KMAX:
        raise ValueError(f"TSM2L opt=1 needs K <= {_tsm2.TSM2L_KMAX} (got K={ops.k}); use opt=2")
    if ops.xp is np:
        return _result(matmul_cpu(ops), ops, out)
    C, done = _prepare(ops)
    if not done:
        cfg = _tsm2.TSM2LConfig(opt=opt, t1=t1, t2=t2, kt=kt, tcf=tcf, warp=warp)
        _tsm2.launch_tsm2l(ops.A, ops.B, C, ops.alpha, ops.beta, cfg)
    return _result(C, ops, out)


def _launch_words(ops, algo, model_algo) -> str:
    """What matmul() will actually launch on this GPU, in one or two lines."""
    if algo == "cublas":
        why = "" if model_algo == "cublas" else (
            f" (the model chose {model_algo.upper()}, but cuBLAS was faster when both were"
            " timed on these operands)")
        return "Launch: cuBLAS through cupy.matmul" + why + "."
    lay, _ = _tsm2.a_layout(ops.A)
    if algo == "tsm2r":
        cfg = _tsm2.resolve_tsm2r(ops.m, ops.k, ops.n, ops.dtype, lay)
        name = _tsm2.tsm2r_name(cfg, ops.dtype, lay)
        extra = (", stream-K: one wave of equal runs of k-tiles" if cfg.streamk == 1 else
                 f", split-K {cfg.splits}" if cfg.splits > 1 else "")
    else:
        cfg = _tsm2.resolve_tsm2l(ops.m, ops.k, ops.n, ops.dtype, lay,
                                  _tsm2.TSM2LConfig(opt=1 if ops.k <= _tsm2.TSM2L_KMAX else 2))
        name = _tsm2.tsm2l_name(cfg, ops.dtype, lay)
        extra = f", tcf {cfg.tcf}"
    order = "column-major" if lay.col else "row-major"
    return (f"Launch: {name} ({order} A, {lay.vec}-element loads{extra}); the kernel's own "
            f"parameters come from its occupancy on this GPU, the model's above from section 3.1.8.")


def explain(A, B, *, beta=0.0, file=None) -> str:
    """Print, in plain words, what ``matmul(A, B)`` would do and why; return the text.

    A has shape (M, K), B (K, N). Works without a GPU: numpy inputs are then
    computed on the CPU, and the plan shown is ``tsm_core.plan``'s for the same
    problem: the current GPU's, or where no GPU is found the reference GPU's (an
    H100), which the text names. Lists of matrices (As, Bs) explain the plan of
    ``batched_matmul(As, Bs)`` instead: its tiling, step by step.

    Parameters
    ----------
    A, B : array (numpy, CuPy, torch) or list of arrays
        The operands, as for ``matmul`` (or ``batched_matmul``).
    beta : float
        As for ``matmul``: whether C would be read.
    file : file-like, optional
        Where to print (default: sys.stdout).

    Returns
    -------
    str
        The text printed.

    Raises
    ------
    TypeError, ValueError
        For operands ``matmul`` would refuse.

    Examples
    --------
    >>> import io, numpy as np, tsm_core
    >>> A = np.broadcast_to(np.float32(1), (10**6, 1024))  # the shape is what counts
    >>> text = tsm_core.explain(A, np.ones((1024, 16), dtype=np.float32), file=io.StringIO())
    >>> text.splitlines()[0]
    'numpy inputs: computed on the CPU with numpy (BLAS); no GPU is used.'
    >>> "TSM2R" in text
    True
    """
    if isinstance(A, (list, tuple)):
        from tsm_core.batched.api import explain_batched  # the batched family, loaded on demand

        text = explain_batched(A, B)
        print(text, file=file)
        return text
    ops = check_operands(A, B, beta=beta)
    orders = (_order(ops.A), _order(ops.B))
    lines = []
    if ops.xp is np:
        lines.append("numpy inputs: computed on the CPU with numpy (BLAS); no GPU is used.")
        if _arrays.has_gpu():
            lines.append("Pass CuPy arrays or torch CUDA tensors to run on the GPU. On this GPU:")
        else:
            lines.append("No CUDA GPU found. On the reference GPU the GPU path would do this:")
        p = plan(ops.m, ops.k, ops.n, ops.dtype, orders, beta=beta)
    else:
        p = _plan_for(ops)
    lines.append(p.describe())
    if ops.xp is not np and min(ops.m, ops.k, ops.n) > 0:
        try:
            lines.append(_launch_words(ops, _algorithm_for(ops), p.algorithm))
        except Exception as exc:  # explaining must never be what fails
            lines.append(f"Launch: could not be resolved here ({type(exc).__name__}: {exc}).")
    text = "\n".join(lines)
    print(text, file=file)
    return text
