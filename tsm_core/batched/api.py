"""Batched irregular GEMM: ``Cs[i] = alpha * As[i] @ Bs[i] + beta * Cs[i]`` in one launch.

The public functions of the family: `batched_matmul` (re-exported by
``tsm_core``), `plan_batched` (the plan, with `BatchedPlan.describe` for
``tsm_core.explain``), `prepare_batched` (bind a batch once, launch it many times
with no per-call planning or copying) and `explain_batched`. Each validates its
arguments (``checks.py``), asks the planner (``plan.py``) and the cost model
(``cost.py``), and launches (``launch.py``), remembering what it resolved
(``memo.py``) so that a repeated call costs a lookup.

Layout rules. Each problem's A (M, K), B (K, N) and C (M, N) may have any strides:
C- or F-ordered, transposed or sliced views, and orders may differ from problem
to problem. All arrays of a call share one kind (numpy, CuPy, torch CUDA or torch
CPU), one dtype (float32 or float64; no mixing, no promotion) and, on the GPU, one
device. No output may overlap another output or any input of the batch.
"""

from __future__ import annotations

import numpy as np

from tsm_core.batched import cost as _cost
from tsm_core.batched import launch as _launch
from tsm_core.batched import plan as _plan
# The hot path of batched_matmul reads what it needs as globals of this module (one
# dictionary lookup each, no attribute lookup through another module): hence the
# names imported one by one. _DIRECT, _driver_launch and _stream_from_ptr are also
# what the convolution family and the Inception app launch through.
from tsm_core.batched.checks import check_batch as _check
from tsm_core.batched.checks import device_of as _device_of
from tsm_core.batched.launch import _DIRECT, _NATIVE, _RAW_STREAM  # noqa: F401
from tsm_core.batched.launch import CublasLaunch as _CublasLaunch
from tsm_core.batched.launch import alloc_outputs as _alloc_outputs
from tsm_core.batched.launch import cupy_stream as _cupy_stream
from tsm_core.batched.launch import driver_launch as _driver_launch  # noqa: F401
from tsm_core.batched.launch import launch_failed as _launch_failed
from tsm_core.batched.launch import stream_from_ptr as _stream_from_ptr  # noqa: F401
from tsm_core.batched.launch import torch_raw_stream as _torch_raw_stream
from tsm_core.batched.launch import torch_stream as _torch_stream
from tsm_core.batched.launch import wgmma_ok
from tsm_core.batched.memo import META_CACHE as _META_CACHE
from tsm_core.batched.memo import PLAN_CACHE as _PLAN_CACHE
from tsm_core.batched.memo import ident_key as _ident_key
from tsm_core.batched.memo import idents as _idents
from tsm_core.batched.memo import key as _key
from tsm_core.batched.memo import lru_get as _lru_get
from tsm_core.batched.memo import lru_put as _lru_put
from tsm_core.batched.memo import metas as _metas
from tsm_core.batched.memo import plans as _plans
from tsm_core.batched.memo import remember_ident as _remember_ident
from tsm_core.batched.plan import TILE_TYPES, BatchedPlan  # noqa: F401
from tsm_core.runtime import arrays as _arrays
from tsm_core.runtime import compile as _compile
from tsm_core.runtime.checks import _real
from tsm_core.runtime.launch import func_ptr  # noqa: F401  (tsm_core.tiled imports it from here)

__all__ = ["batched_matmul", "plan_batched", "prepare_batched", "explain_batched",
           "BatchedPlan", "PreparedBatch", "TILE_TYPES"]

# Once the C++ fast path is loaded and a GPU is there: the module's `call(As, Bs,
# Cs, alpha, beta)`, batched_matmul's whole hot path in C++ (checks, torch's
# current device and stream, lookup, launch). A global of this module, read once
# per call.
_CALL = None
_CUBLAS = _CublasLaunch.VERSION  # the `version` of a batch handed to cuBLAS


def _native():
    """The fast-path module, or None (no compiler, TSM_NATIVE=0): decided once."""
    global _CALL
    if not _NATIVE:
        from tsm_core.batched import native

        mod = native.get()
        _NATIVE.append(mod)
        if mod is not None:
            import torch

            if torch.cuda.is_available():
                _launch.connect_native(mod, torch)
                _CALL = mod.call
    return _NATIVE[0]


def _use_native(mod):
    """Take the C++ fast path `mod` (None: the Python path) for torch calls from now
    on; returns the module in use before (None if none). For tests and benchmarks
    that time or check both paths in one process."""
    global _CALL
    prev = _native()
    _NATIVE[:] = [mod]
    _CALL = None if mod is None or not _RAW_STREAM else mod.call
    return prev


def _remember_torch(As, Bs, Cs, L):
    """Teach the fast path (identity key or C++) a torch batch and its launch."""
    nat = _NATIVE[0] if _NATIVE else _native()
    if nat is None:
        try:
            key, every = _ident_key(As, Bs, Cs)
        except RuntimeError:  # inference tensors: no version counter, no identity key
            return
        _remember_ident(key, every, L)
        return
    nat.remember(As, Bs, Cs, L.dev, L, *L._native_args)


def _cpu(As, Bs, Cs, alpha, beta, kind):
    """numpy and torch CPU batches: one product per problem on the CPU."""
    from tsm_core.runtime import cpu
    from tsm_core.runtime.checks import Operands

    P = len(As)
    out = []
    for i in range(P):
        a = _arrays.to_backend(As[i])
        b = _arrays.to_backend(Bs[i])
        c = None if Cs is None else _arrays.to_backend(Cs[i])
        m, k = a.shape
        n = b.shape[1]
        ops = Operands(A=a, B=b, out=c, kind=kind, like=None, m=m, k=k, n=n, dtype=a.dtype,
                       alpha=alpha, beta=beta, xp=np)
        r = cpu.matmul_cpu(ops)
        out.append(Cs[i] if Cs is not None else _arrays.wrap(r, kind))
    return out


def _resolve(As, Bs, Cs, kind, dtype, shapes, sig, version=None, split_k=None):
    """The Launch of a checked batch: version (cost model), plan (cached per
    signature) and metadata."""
    import cupy

    rows = _launch.meta_rows(As, Bs, Cs, kind, shapes)
    dev = cupy.cuda.runtime.getDevice()
    tc_ok = _launch.tensor_cores_ok(dev)
    auto = version is None
    if auto:
        version = _cost.choose_version(rows, dtype)
        if version == 2 and not tc_ok:
            version = _plan.DEFAULT_VERSION
    elif version in (2, _plan.TC3_VERSION) and not tc_ok:
        raise ValueError(f"kernel version {version} (tensor cores, cp.async) needs compute "
                         "capability 8.0 or later")
    elif version == _plan.WG3_VERSION and not wgmma_ok():
        raise ValueError(f"kernel version {version} (wgmma, sm_90a) needs compute capability "
                         "9.0 (H100, H200)")
    elif version != 0 and _cost.choose_version(rows) == 0:
        version = 0  # strides too large for int offsets

    if split_k is None:
        split_k = _plan.splitk_default()

    def planned(v):
        entry = _lru_get(_plans, (sig, v, split_k))
        if entry is None:
            plan = plan_batched(shapes, dtype, version=v, split_k=split_k)
            entry = (plan, cupy.asarray(plan.device_tiles()) if plan.n_tiles else None)
            _lru_put(_plans, (sig, v, split_k), entry, _PLAN_CACHE)
        return entry

    if auto:
        version = _cost.settle_version(version, shapes, dtype, lambda v: planned(v)[0], tc_ok)
    plan, tiles = planned(version)
    return _launch.build_launch(plan, tiles, rows, dtype, version)


def batched_matmul(As, Bs, Cs=None, *, alpha=1.0, beta=0.0):
    """Compute ``Cs[i] = alpha * As[i] @ Bs[i] + beta * Cs[i]`` for every i, in one launch.

    As[i] has shape (M_i, K_i), Bs[i] (K_i, N_i), Cs[i] (M_i, N_i); sizes differ
    freely between problems and need not be multiples of anything.

    Parameters
    ----------
    As, Bs : list or tuple of 2-D arrays
        One entry per problem; numpy arrays, CuPy arrays or torch tensors (CUDA or
        CPU), all of one kind and one dtype (float32 or float64). Any strides: C- or
        F-ordered, transposed or sliced views, mixed within a batch.
    Cs : list or tuple of 2-D arrays, optional
        Outputs, written in place (the same objects are returned). They must not
        overlap each other or any input. Default: new C-ordered arrays of the
        inputs' kind (on the GPU, views of one allocation).
    alpha, beta : real, default 1.0 and 0.0
        The scalars; beta == 0 means Cs is not read (NaN in it does not propagate), as in BLAS.

    Returns
    -------
    list
        Cs[i] for every problem, as the caller's kind.

    Raises
    ------
    TypeError
        Not lists; mixed kinds or dtypes; unsupported dtype; alpha or beta not real;
        a torch tensor that requires grad.
    ValueError
        Lists of different lengths; not 2-D; inner dimensions differ; Cs[i] of the
        wrong shape; outputs overlapping each other or an input; GPUs differ.
        Nothing is written when an error is raised.
    cupy.cuda.driver.CUDADriverError
        The launch failed.

    See Also
    --------
    prepare_batched : Bind a batch once, launch it many times.
    plan_batched : The tiling a call uses.

    Notes
    -----
    numpy (and torch CPU) inputs are computed on the CPU, one numpy matmul per
    problem. CuPy and torch CUDA inputs run as one kernel launch on the current
    stream (torch's for torch tensors). The tiling (``plan_batched``) is cached per
    batch layout (dtypes, shapes, strides) and the device metadata per exact batch
    (the same plus data pointers): a repeated call costs the key lookup and the
    launch; new arrays of a known layout cost one small host-to-device copy. For
    torch tensors the lookup and the launch run in C++ (``tsm_core.batched.native``,
    built on first use where a C++ compiler is found; ``TSM_NATIVE=0`` keeps the
    Python path): 12-16 ns a tensor, matched by every tensor's data pointer,
    sizes, strides, dtype and device. For a batch launched many times,
    ``prepare_batched`` removes even the lookup.

    A batch of one problem whose operands cuBLAS takes in place (C- or
    F-contiguous for CuPy; one unit stride for torch) is one cuBLAS call on the
    same stream instead (``cupy.matmul`` / ``cupy.cublas.gemm``, ``torch.mm`` /
    ``Tensor.addmm_``; ``cost.cublas_pays``): a single product is the vendor
    library's own case. ``prepare_batched`` always runs the batched kernel.

    Examples
    --------
    >>> import numpy as np
    >>> import tsm_core
    >>> rng = np.random.default_rng(0)
    >>> As = [rng.standard_normal((m, k)) for m, k in ((5, 3), (17, 1))]
    >>> Bs = [rng.standard_normal((k, n)) for k, n in ((3, 2), (1, 40))]
    >>> Cs = tsm_core.batched_matmul(As, Bs)
    >>> [c.shape for c in Cs]
    [(5, 2), (17, 40)]
    >>> bool(np.allclose(Cs[1], As[1] @ Bs[1]))
    True

    On the GPU, with outputs given (written in place, on the current stream):

    >>> import cupy  # doctest: +SKIP
    >>> dA = [cupy.asarray(a) for a in As]  # doctest: +SKIP
    >>> dB = [cupy.asarray(b) for b in Bs]  # doctest: +SKIP
    >>> dC = [cupy.empty((a.shape[0], b.shape[1])) for a, b in zip(As, Bs)]  # doctest: +SKIP
    >>> tsm_core.batched_matmul(dA, dB, dC, alpha=2.0)[0] is dC[0]  # doctest: +SKIP
    True
    """
    # Hot path: torch CUDA tensors with outputs given, a batch the C++ fast path
    # remembers: one C call recognises and launches it (about the host time of a
    # prepared run). Anything else, or a batch it does not know, goes on below.
    call = _CALL
    if call is not None and Cs is not None:
        r = call(As, Bs, Cs, alpha, beta)
        if r == 0:
            return Cs if type(Cs) is list else list(Cs)
        if r < 0:
            _launch_failed(r)
    tried = call is not None

    # Fast path: CuPy or torch CUDA lists with outputs given, a batch seen before.
    cupy = _arrays._loaded("cupy")
    if Cs is not None and cupy is not None and type(As) in (list, tuple) and len(As) and \
            len(As) == len(Bs) == len(Cs):
        t0 = type(As[0])
        tf = type(alpha), type(beta)
        if tf[0] in (float, int) and tf[1] in (float, int):
            key = None
            try:
                if t0 is cupy.ndarray:
                    key = _key(As, Bs, Cs, "cupy")
                    stream = None
                elif t0.__module__ == "torch" and As[0].is_cuda:
                    stream = _torch_stream()
                    nat = _NATIVE[0] if _NATIVE else _native()
                    if nat is not None:
                        if not tried:  # (the first call of a process)
                            r = nat.call(As, Bs, Cs, alpha, beta)
                            if r == 0:
                                return Cs if type(Cs) is list else list(Cs)
                            if r < 0:
                                _launch_failed(r)
                    else:
                        ident, every = _ident_key(As, Bs, Cs)
                        hit = _idents.get(ident)
                        if hit is not None and hit[0].dev == cupy.cuda.runtime.getDevice():
                            hit[0](alpha, beta, stream)
                            return Cs if type(Cs) is list else list(Cs)
                    key = _key(As, Bs, Cs, "torch")
            # A foreign object: the slow path says what. RuntimeError: torch's inference
            # tensors have no version counter (the identity key's).
            except (AttributeError, TypeError, RuntimeError):
                key = None
            if key is not None:
                L = _lru_get(_metas, key)
                # The kernel handle belongs to the device it was loaded on.
                if L is not None and L.dev == cupy.cuda.runtime.getDevice():
                    if L.version == _CUBLAS:  # a batch of one: one cuBLAS call
                        L.run(As, Bs, Cs, alpha, beta)
                        return Cs if type(Cs) is list else list(Cs)
                    L(alpha, beta, _cupy_stream() if stream is None else stream)
                    if stream is not None:
                        _remember_torch(As, Bs, Cs, L)
                    return Cs if type(Cs) is list else list(Cs)

    alpha = _real(alpha, "alpha")
    beta = _real(beta, "beta")
    kind, dtype, shapes = _check(As, Bs, Cs)
    P = len(As)
    if P == 0:
        return []
    if kind in ("numpy", "torch-cpu"):
        return _cpu(As, Bs, Cs, alpha, beta, kind)

    import cupy

    if Cs is None:
        Cs = _alloc_outputs(shapes, dtype, kind, As[0])
    dev = _device_of(As[0], kind)
    with cupy.cuda.Device(dev):
        key = _key(As, Bs, Cs, kind)
        if _cost.cublas_pays(shapes) and all(_launch.blas_ready(x[0], kind) for x in (As, Bs, Cs)):
            L = _launch.CublasLaunch(dev, kind)
            _lru_put(_metas, key, L, _META_CACHE)
            L.run(As, Bs, Cs, alpha, beta)
            return list(Cs)
        L = _resolve(As, Bs, Cs, kind, dtype, shapes, (dev, key[1]))
        _lru_put(_metas, key, L, _META_CACHE)
        L(alpha, beta, _torch_stream() if kind == "torch" else _cupy_stream())
        if kind == "torch":
            _remember_torch(As, Bs, Cs, L)
    return list(Cs)




class PreparedBatch:
    """A batch bound once, launched many times: ``run()`` costs one kernel launch.

    Made by `prepare_batched`; holds references to the arrays, so they stay alive.
    The arrays must keep their shapes, strides and memory (their contents may
    change between runs: that is the point).

    Parameters
    ----------
    As, Bs, Cs : list
        The checked batch.
    launch : Launch or None
        The resolved launch (None for an empty batch).
    kind : str
        The arrays' kind ("cupy" or "torch"; None for an empty batch).
    alpha, beta : float
        The scalars of every run.

    Attributes
    ----------
    As, Bs, Cs : list
        The batch's arrays (Cs: the outputs that `run` writes and returns).
    alpha, beta : float
        The scalars of every run.
    plan : BatchedPlan or None
        The plan launched (None for an empty batch).

    Examples
    --------
    >>> from tsm_core.batched import prepare_batched
    >>> prepare_batched([], []).run()
    []
    """

    def __init__(self, As, Bs, Cs, launch, kind, alpha, beta):
        self.As, self.Bs, self.Cs = list(As), list(Bs), list(Cs)
        self._launch = launch
        self._kind = kind
        self.alpha, self.beta = alpha, beta
        self.plan = launch.plan if launch is not None else None

    def run(self):
        """Launch the batch on the current stream.

        For torch tensors, that is torch's current stream on their device.

        Returns
        -------
        list
            Cs, written when the launch completes (the launch is asynchronous, as
            any kernel launch on the stream).
        """
        L = self._launch
        if L is not None:
            L(self.alpha, self.beta,
              _torch_raw_stream()(L.dev) if self._kind == "torch" else _cupy_stream())
        return self.Cs

    __call__ = run


def prepare_batched(As, Bs, Cs=None, *, alpha=1.0, beta=0.0, version=None,
                    split_k=None) -> PreparedBatch:
    """Check, plan and upload a batch once, for launches with no per-call work.

    ``run()`` then launches it with no per-problem Python work (the device-side
    path for repeated identical batches). A has shape (M_i, K_i), B (K_i, N_i), C
    (M_i, N_i), as for `batched_matmul`.

    Parameters
    ----------
    As, Bs : list or tuple of 2-D arrays
        As for `batched_matmul`, with CuPy arrays or torch CUDA tensors only.
    Cs : list or tuple of 2-D arrays, optional
        The outputs every run writes. Default: new C-ordered arrays (views of one
        allocation).
    alpha, beta : real, default 1.0 and 0.0
        The scalars of every run.
    version : int, optional
        A kernel of the ladder (``tsm_core.batched.plan.VERSIONS``). Default: the
        version `batched_matmul` would choose.
    split_k : bool, optional
        Whether the plan may split K. Default: ``TSM_BATCHED_SPLITK`` (on).

    Returns
    -------
    PreparedBatch
        Its ``run()`` launches the batch on the current stream and returns Cs.

    Raises
    ------
    TypeError
        As for `batched_matmul`; also numpy or torch CPU arrays (they take
        `batched_matmul`'s CPU path).
    ValueError
        As for `batched_matmul`; also an unknown `version`, a float32-only version
        for float64, or a version the GPU cannot run (tensor cores before compute
        capability 8.0, wgmma off compute capability 9.0).

    Examples
    --------
    >>> from tsm_core.batched import prepare_batched
    >>> prepare_batched([], []).run()
    []
    >>> import cupy  # doctest: +SKIP
    >>> As = [cupy.ones((300, 40), cupy.float32), cupy.ones((17, 5), cupy.float32)]  # doctest: +SKIP
    >>> Bs = [cupy.ones((40, 60), cupy.float32), cupy.ones((5, 9), cupy.float32)]  # doctest: +SKIP
    >>> prep = prepare_batched(As, Bs)  # doctest: +SKIP
    >>> float(prep.run()[0][0, 0])  # doctest: +SKIP
    40.0
    """
    alpha = _real(alpha, "alpha")
    beta = _real(beta, "beta")
    kind, dtype, shapes = _check(As, Bs, Cs)
    if len(As) == 0:
        return PreparedBatch([], [], [], None, kind, alpha, beta)
    if kind not in ("cupy", "torch"):
        raise TypeError("prepare_batched needs CuPy arrays or torch CUDA tensors; numpy "
                        "inputs take batched_matmul's CPU path")
    import cupy

    if Cs is None:
        Cs = _alloc_outputs(shapes, dtype, kind, As[0])
    if kind == "torch":
        _native()  # its launch, where it loads (built on first use)
    dev = _device_of(As[0], kind)
    with cupy.cuda.Device(dev):
        if version is not None and version not in _plan.VERSIONS:
            raise ValueError(f"version must be one of {_plan.VERSIONS}; got {version!r}")
        L = _resolve(As, Bs, Cs, kind, dtype, shapes, (dev, _key(As, Bs, Cs, kind)[1]),
                     version, split_k)
    return PreparedBatch(As, Bs, Cs, L, kind, alpha, beta)


def plan_batched(shapes, dtype=np.float32, *, spec=None, regs=None,
                 version: int = _plan.DEFAULT_VERSION, split_k=None) -> BatchedPlan:
    """Plan a batch: each problem's tile type (Algorithm 1) and the flat tile list.

    Parameters
    ----------
    shapes : sequence of (M, N, K)
        Problem i computes an (M, N) C from A (M, K) and B (K, N).
    dtype : float32 or float64, default float32
        The element type (it sets the kernel's registers and shared memory).
    spec : DeviceSpec, optional
        The GPU planned for. Default: the current GPU (``tsm_core.runtime.device.query``,
        attributes only), else the H100 of ``KNOWN_GPUS``.
    regs : int, optional
        Registers per thread of the kernel. Default: from the compiled kernel on a
        GPU, else from NVRTC, else ``plan.REGS_FALLBACK``.
    version : int, default 1
        Kernel version planned for (its registers and shared memory set the TLP
        threshold); see ``tsm_core.batched.plan.VERSIONS``.
    split_k : bool, optional
        Whether K may be split (versions in ``plan.SPLIT_VERSIONS``; see
        ``plan.SPLIT_MAX_WAVES``). Default: ``TSM_BATCHED_SPLITK`` (on).

    Returns
    -------
    BatchedPlan
        The tile type of every problem, the tile list and how it was reached.

    Raises
    ------
    TypeError
        `dtype` other than float32 or float64.
    ValueError
        An unknown `version`, a float32-only version for float64, a size below 0 or
        from 2**31 on.

    Examples
    --------
    >>> from tsm_core.batched import plan_batched
    >>> from tsm_core.runtime.device import KNOWN_GPUS
    >>> p = plan_batched([(100, 37, 64), (1, 1, 1)], spec=KNOWN_GPUS["H100"], regs=80)
    >>> int(p.tiles[:, 0].max())
    1
    >>> p.residency.blocks_per_sm, p.residency.limit
    (3, 'registers')
    """
    dtype = np.dtype(dtype)
    _compile.ctype(dtype)  # TypeError for anything but float32/float64
    if version not in _plan.VERSIONS:
        raise ValueError(f"version must be one of {_plan.VERSIONS}; got {version!r}")
    if version in _plan.FLOAT32_ONLY and dtype != _plan._F32:
        raise ValueError(f"kernel version {version} (128-row tiles) is float32 only")
    s = np.asarray(shapes, dtype=np.int64).reshape(-1, 3)
    if np.any(s < 0):
        raise ValueError("problem sizes must be >= 0")
    if np.any(s >= 2**31):
        raise ValueError("every M, N and K must be below 2**31 (the kernel indexes with int)")
    if spec is None:
        spec = _default_spec()
    if regs is None:
        regs = _launch.kernel_regs(dtype, version)
    if split_k is None:
        split_k = _plan.splitk_default()
    return _plan.tile_batch(s, dtype, spec, regs, version, split_k)


def _default_spec():
    from tsm_core.runtime import device as _device

    if _arrays.has_gpu():
        import cupy

        return _device.query(cupy.cuda.Device().id, measure_peaks=False)
    return _device.KNOWN_GPUS["H100"]


def explain_batched(As_or_shapes, Bs=None, dtype=np.float32) -> str:
    """The plan of a batch in words: for arrays (As, Bs) or a list of (M, N, K).

    Works without a GPU (the H100 of ``KNOWN_GPUS`` is planned for then).

    Parameters
    ----------
    As_or_shapes : list of 2-D arrays, or sequence of (M, N, K)
        The batch's As (with `Bs`), or its sizes.
    Bs : list of 2-D arrays, optional
        The batch's Bs, where `As_or_shapes` holds arrays.
    dtype : float32 or float64, default float32
        For sizes; arrays bring their own.

    Returns
    -------
    str
        `BatchedPlan.describe` of the version a call would choose, and the cost
        model's time of each candidate version.

    Raises
    ------
    TypeError, ValueError
        As for `batched_matmul` (arrays) or `plan_batched` (sizes).

    Examples
    --------
    >>> from tsm_core.batched.api import explain_batched
    >>> print(explain_batched([(784, 96, 192), (784, 64, 192)]).splitlines()[0])  # doctest: +ELLIPSIS
    Batched irregular GEMM: 2 problems, float32, ...
    """
    if Bs is None:
        shapes = As_or_shapes
    else:
        kind, dtype, s = _check(As_or_shapes, Bs, None)
        shapes = s
        dtype = dtype or np.float32
    rows = np.zeros((len(shapes), _plan.META_STRIDE), np.int64)
    rows[:, 3:6] = np.asarray(shapes, np.int64).reshape(-1, 3)
    # The version the call would choose (strides assumed below V1_MAX_STRIDE).
    plans = {}

    def plan_of(v):
        if v not in plans:
            plans[v] = plan_batched(shapes, dtype, version=v)
        return plans[v]

    chosen = _cost.settle_version(_cost.choose_version(rows, dtype), shapes, dtype, plan_of)
    text = plan_of(chosen).describe()
    modelled = sorted(v for v in plans if v in _cost.TILE_COSTS)
    if len(modelled) > 1:
        text += "\n  version choice (cost model, plan_cost): " + ", ".join(
            f"version {v} {_cost.plan_cost(plans[v]):.0f} us" for v in modelled) + f" -> {chosen}"
    if _cost.cublas_pays(shapes):
        text += ("\n  batched_matmul hands a batch of one to one cuBLAS call instead (operands "
                 "in a layout cuBLAS takes in place); prepare_batched runs this plan")
    return text
