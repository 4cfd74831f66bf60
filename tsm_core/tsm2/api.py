"""matmul(), tsm2r(), tsm2l() and explain(): the public entry points.

Every call goes the same way: check the operands (nothing is touched if they are
refused), compute on the CPU for numpy inputs, else plan and launch on the GPU,
and hand the result back as the caller's kind of array.
"""

from __future__ import annotations

import os

import numpy as np

from tsm_core.runtime import arrays as _arrays

from tsm_core.tsm2 import launch as _tsm2
from tsm_core.runtime.cpu import matmul_cpu
from tsm_core.runtime.checks import check_operands

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


def _cublas(ops, C):
    import cupy

    if ops.beta == 0.0:
        cupy.matmul(ops.A, ops.B, out=C)
        if ops.alpha != 1.0:
            C *= ops.alpha
    else:
        _cupy_axpby(cupy.matmul(ops.A, ops.B), C, ops.alpha, ops.beta)


def _result(C, ops, out):
    """C as the caller's kind: their own `out` object when they passed one."""
    if ops.kind == "cupy":
        return C
    return _arrays.wrap(C, ops.kind, out)


def _order(x) -> str:
    """'C' or 'F' for the planner (the contiguous axis), 'C' for other views."""
    item = x.itemsize
    if x.ndim == 2 and x.strides[0] == item and x.shape[1] > 1:
        return "F"
    return "C"


_algo_cache: dict = {}

# matmul(algorithm="auto") checks the model's choice once per problem: where the
# plan picks TSM2R or TSM2L, both that kernel and cuBLAS are timed on the caller's
# operands (a scratch output, a few runs) and the faster is kept, in memory and on
# disk (planner.TuneCache, keyed by GPU, kernel sources and the exact problem).
# The model alone cannot promise "never slower than cuBLAS": cuBLAS's own kernel
# choice is outside it. TSM_VERIFY_DISPATCH=0 turns the check off.
VERIFY_MARGIN = 0.98  # the TSM kernel must be at least 2% faster to be kept


def _algorithm_for(ops):
    """The algorithm for this problem: the planner's, checked against cuBLAS."""
    import cupy

    key = (ops.m, ops.k, ops.n, ops.dtype.char, _order(ops.A), _order(ops.B), ops.beta != 0.0,
           cupy.cuda.runtime.getDevice())
    algo = _algo_cache.get(key)
    if algo is None:
        algo = _plan_for(ops).algorithm
        if algo != "cublas" and os.environ.get("TSM_VERIFY_DISPATCH", "1") != "0":
            algo = _verified(ops, algo, key)
        _algo_cache[key] = algo
    return algo


def _verified(ops, algo, key):
    """`algo` if it beats cuBLAS on these operands (measured once, cached on disk)."""
    import cupy

    from tsm_core.runtime import compile as _compile


    from tsm_core.runtime import device as _device


    from tsm_core.tsm2 import model as planner

    cache = planner.TuneCache(cupy.cuda.runtime.getDeviceProperties(key[-1])["name"].decode())
    dkey = (f"dispatch|{ops.dtype.name}|{key[4]}{key[5]}|beta{int(key[6])}|"
            f"m{ops.m}|k{ops.k}|n{ops.n}|{_compile.source_hash()}")
    hit = cache.get(dkey)
    if hit is not None:
        return hit["params"]["algorithm"]
    scratch = cupy.empty((ops.m, ops.n), dtype=ops.dtype)
    scratch.fill(1)

    def run_tsm():
        if algo == "tsm2r":
            _tsm2.launch_tsm2r(ops.A, ops.B, scratch, ops.alpha, ops.beta)
        else:
            _launch_tsm2l_any(ops, scratch)

    def run_cublas():
        _cublas(ops, scratch)

    t_tsm = _device._time_events(cupy, run_tsm, warmup=1, reps=5)
    t_cub = _device._time_events(cupy, run_cublas, warmup=1, reps=5)
    winner = algo if t_tsm <= VERIFY_MARGIN * t_cub else "cublas"
    if os.environ.get("CUDA_INJECTION64_PATH"):
        return winner  # timed under a CUDA tool (compute-sanitizer, Nsight): not kept
    try:
        cache.put(dkey, {"algorithm": winner, "model": algo, "cublas_s": t_cub}, t_tsm)
    except OSError:  # a read-only cache directory only costs the re-measurement
        pass
    return winner




def _plan_for(ops):
    from tsm_core.tsm2 import model as planner

    return planner.plan(ops.m, ops.k, ops.n, ops.dtype, (_order(ops.A), _order(ops.B)),
                        beta=ops.beta)


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
    The caller's kind of array: ``out`` when given, else a new (M, N) array.

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
    """
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {ALGORITHMS}, not {algorithm!r}")
    ops = check_operands(A, B, out=out, alpha=alpha, beta=beta)
    if ops.xp is np:
        return _arrays.wrap(matmul_cpu(ops), ops.kind, out)
    C, done = _prepare(ops)
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
    return _result(C, ops, out)


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
    numpy inputs run on the CPU.
    """
    ops = check_operands(A, B, out=out, alpha=alpha, beta=beta)
    if version not in (0, 1, 2, 3):
        raise ValueError(f"version must be 0, 1, 2 or 3, not {version!r}")
    if tc not in (-1, 0, 1):
        raise ValueError(f"tc must be -1, 0 or 1, not {tc!r}")
    if streamk not in (-1, 0, 1):
        raise ValueError(f"streamk must be -1, 0 or 1, not {streamk!r}")
    if ops.xp is np:
        return _arrays.wrap(matmul_cpu(ops), ops.kind, out)
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
    numpy inputs run on the CPU.
    """
    ops = check_operands(A, B, out=out, alpha=alpha, beta=beta)
    if opt not in (1, 2):
        raise ValueError(f"opt must be 1 or 2, not {opt!r}")
    if warp not in (-1, 0, 1):
        raise ValueError(f"warp must be -1, 0 or 1, not {warp!r}")
    if opt == 1 and ops.k > _tsm2.TSM2L_KMAX:
        raise ValueError(f"TSM2L opt=1 needs K <= {_tsm2.TSM2L_KMAX} (got K={ops.k}); use opt=2")
    if ops.xp is np:
        return _arrays.wrap(matmul_cpu(ops), ops.kind, out)
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
    computed on the CPU, and the plan shown is the one the kernels would use on
    the reference GPU (an H100). Lists of matrices (As, Bs) explain the plan of
    ``batched_matmul(As, Bs)`` instead: its tiling, step by step.
    """
    if isinstance(A, (list, tuple)):
        from tsm_core.batched.api import explain_batched

        text = explain_batched(A, B)
        print(text, file=file)
        return text
    from tsm_core.tsm2 import model as planner

    ops = check_operands(A, B, beta=beta)
    orders = (_order(ops.A), _order(ops.B))
    lines = []
    if ops.xp is np:
        lines.append("numpy inputs: computed on the CPU with numpy (BLAS); no GPU is used.")
        if _arrays.has_gpu():
            lines.append("Pass CuPy arrays or torch CUDA tensors to run on the GPU. On this GPU:")
            p = planner.plan(ops.m, ops.k, ops.n, ops.dtype, orders, beta=beta)
        else:
            lines.append("No CUDA GPU found. On an H100 the GPU path would do this:")
            from tsm_core.runtime import device as _device

            p = planner.plan(ops.m, ops.k, ops.n, ops.dtype, orders, beta=beta,
                             spec=_device.KNOWN_GPUS["H100"])
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
