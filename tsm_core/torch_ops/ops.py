"""The torch operators ``tsm::matmul`` and ``tsm::batched_matmul``.

Each is a ``torch.library.custom_op`` over ``tsm_core.matmul`` /
``tsm_core.batched_matmul`` with a fake implementation (the shape, dtype, device and
contiguous strides of the result, from the inputs' metadata only) and an autograd
formula written with the same operators, so both run inside
``torch.compile(fullgraph=True)`` and under autograd. The operators are functional:
they return new, contiguous tensors and write none of their inputs, which is what
``torch.compile`` traces without functionalising anything. ``beta`` scales an input
``C`` (``torch.addmm``'s idea): the result is ``alpha * A @ B + beta * C``.

On CUDA tensors the work runs on torch's current stream of the tensors' device:
CuPy's current stream and device are set to torch's for the duration of the call.
While that stream is being captured into a CUDA graph, CuPy's allocations (the
workspaces of split-K, copies of awkward operands) come from torch's caching
allocator, so that they belong to the graph's memory pool and outlive the capture.
"""

from __future__ import annotations

import contextlib
from typing import Optional

import torch

import tsm_core

if not hasattr(torch.library, "register_fake"):
    raise ImportError(f"tsm_core.torch_ops needs torch 2.4 or later (torch.library.custom_op, "
                      f"register_fake); this is torch {torch.__version__}")

__all__ = ["matmul", "batched_matmul", "ALGORITHMS"]

ALGORITHMS = ("auto", "tsm2r", "tsm2l", "cublas")
_FLOATS = (torch.float32, torch.float64)


# ------------------------------------------------------------------ checks on metadata
# They read shapes, dtypes and devices only, so they run on fake tensors (at trace
# time, with symbolic sizes) as well as on real ones, and raise what tsm_core.matmul
# raises: TypeError for kinds and dtypes, ValueError for shapes and devices.


def _float(x, name):
    if x.dtype not in _FLOATS:
        raise TypeError(f"{name} has dtype {x.dtype}; tsm supports torch.float32 and torch.float64 only")


def _same_device(x, ref, name, ref_name):
    if x.get_device() == ref.get_device():  # an int (-1: CPU), cheaper than x.device
        return
    if x.device.type != ref.device.type:
        raise TypeError(f"{ref_name} is on {ref.device} but {name} on {x.device}; pass all tensors "
                        "on one device")
    if x.device != ref.device:
        raise ValueError(f"{ref_name} is on {ref.device} but {name} on {x.device}; move them to one GPU")


def _two_d(x, name, want):
    if x.dim() != 2:
        raise ValueError(f"{name} must be 2-D with shape {want}; got shape {tuple(x.shape)}")


def _require(ok, message):
    """ValueError(message()) unless `ok`. On real tensors `ok` is a bool; on fake ones
    with symbolic sizes a SymBool, which torch._check_value records as a condition of
    the graph instead of specialising the sizes (it costs microseconds: only then)."""
    if ok is not True:
        torch._check_value(ok, message)


def _check_product(A, B, C, a="A", b="B", c="C"):
    """The rules of one product; returns the result dtype."""
    _two_d(A, a, "(m, k)")
    _two_d(B, b, "(k, n)")
    _require(A.shape[1] == B.shape[0], lambda: (
        f"inner dimensions differ: {a} has shape {tuple(A.shape)} and {b} has shape "
        f"{tuple(B.shape)}"))
    _float(A, a)
    _float(B, b)
    _same_device(B, A, b, a)
    dtype = torch.float64 if torch.float64 in (A.dtype, B.dtype) else torch.float32
    if C is not None:
        _two_d(C, c, "(m, n)")
        _require((C.shape[0] == A.shape[0]) & (C.shape[1] == B.shape[1]), lambda: (
            f"{c} must have shape (m, n) = {(A.shape[0], B.shape[1])}; got {tuple(C.shape)}"))
        if C.dtype != dtype:
            raise TypeError(f"{c} must have the result dtype {dtype}; got {C.dtype}")
        _same_device(C, A, c, a)
    return dtype


def _check_algorithm(algorithm):
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {ALGORITHMS}, not {algorithm!r}")


def _check_batch(As, Bs, Cs):
    """The rules of a batch: equal lengths, each product's rules, one dtype (no
    promotion, as tsm_core.batched_matmul), one device."""
    P = len(As)
    if len(Bs) != P or (Cs is not None and len(Cs) != P):
        lens = f"len(As) = {P}, len(Bs) = {len(Bs)}" + ("" if Cs is None else f", len(Cs) = {len(Cs)}")
        raise ValueError(f"the lists must have one entry per problem; got {lens}")
    for i in range(P):
        _check_product(As[i], Bs[i], None if Cs is None else Cs[i], f"As[{i}]", f"Bs[{i}]", f"Cs[{i}]")
        if As[i].dtype != As[0].dtype or Bs[i].dtype != As[0].dtype:
            raise TypeError(f"every array of a batch must have one dtype: As[0] is {As[0].dtype}, "
                            f"As[{i}] {As[i].dtype} and Bs[{i}] {Bs[i].dtype}")
        _same_device(As[i], As[0], f"As[{i}]", "As[0]")


def _operand(x, dtype):
    """x as the backend may read it: without autograd's flag (the operator records
    autograd itself; tsm_core refuses tensors that require grad) and in `dtype`."""
    if x.requires_grad:
        x = x.detach()
    return x if x.dtype == dtype else x.to(dtype)


# ------------------------------------------------------------------ CUDA: torch's stream

_ALLOCATOR: list = []


def _torch_allocator():
    """A CuPy allocator drawing from torch's caching allocator on torch's current
    stream: inside a capture, from the graph's private pool."""
    if not _ALLOCATOR:
        import cupy

        def malloc(size, device):
            return torch.cuda.caching_allocator_alloc(size, device, torch.cuda.current_stream(device))

        def free(ptr, device):
            torch.cuda.caching_allocator_delete(ptr)

        _ALLOCATOR.append(cupy.cuda.memory.PythonFunctionAllocator(malloc, free))
    return _ALLOCATOR[0]


@contextlib.contextmanager
def _on_torch_stream(device):
    """CuPy's device and stream set to torch's current ones for `device`; yields
    whether that stream is being captured (CuPy then allocates through torch)."""
    import cupy

    from tsm_core.batched.launch import stream_from_ptr

    idx = device.index if device.index is not None else torch.cuda.current_device()
    stream = torch.cuda.current_stream(idx)
    with cupy.cuda.Device(idx), stream_from_ptr(stream.cuda_stream):
        if torch.cuda.is_current_stream_capturing():
            with cupy.cuda.using_allocator(_torch_allocator().malloc):
                yield True
        else:
            yield False


# ------------------------------------------------------------------ tsm::matmul


@torch.library.custom_op("tsm::matmul", mutates_args=())
def _matmul(A: torch.Tensor, B: torch.Tensor, C: Optional[torch.Tensor] = None, alpha: float = 1.0,
            beta: float = 0.0, algorithm: str = "auto") -> torch.Tensor:
    _check_algorithm(algorithm)
    dtype = _check_product(A, B, C)
    A = _operand(A, dtype)
    B = _operand(B, dtype)
    out = torch.empty((A.shape[0], B.shape[1]), dtype=dtype, device=A.device)
    if C is not None and beta != 0.0:
        out.copy_(C)
    else:
        beta = 0.0  # BLAS: without C (or with beta == 0) nothing of C is read
    if A.device.type == "cuda":
        with _on_torch_stream(A.device):
            tsm_core.matmul(A, B, out=out, alpha=alpha, beta=beta, algorithm=algorithm)
    else:
        tsm_core.matmul(A, B, out=out, alpha=alpha, beta=beta, algorithm=algorithm)
    return out


@_matmul.register_fake
def _matmul_fake(A, B, C=None, alpha=1.0, beta=0.0, algorithm="auto"):
    _check_algorithm(algorithm)
    dtype = _check_product(A, B, C)
    return A.new_empty((A.shape[0], B.shape[1]), dtype=dtype)


def _matmul_setup(ctx, inputs, output):
    A, B, C, alpha, beta, _ = inputs
    ctx.save_for_backward(A, B)
    ctx.alpha, ctx.beta = alpha, beta
    ctx.has_c = C is not None


def _matmul_backward(ctx, grad):
    # C = alpha A B + beta C0: dA = alpha dC B^T, dB = alpha A^T dC, dC0 = beta dC,
    # each product by the operator itself (so double backward works too).
    A, B = ctx.saved_tensors
    grad = grad.contiguous()  # an expanded gradient (of a sum) has zero strides
    op = torch.ops.tsm.matmul.default
    ga = gb = gc = None
    if ctx.needs_input_grad[0]:
        ga = op(grad, B.mT, None, ctx.alpha, 0.0, "auto").to(A.dtype)
    if ctx.needs_input_grad[1]:
        gb = op(A.mT, grad, None, ctx.alpha, 0.0, "auto").to(B.dtype)
    if ctx.has_c and ctx.needs_input_grad[2] and ctx.beta != 0.0:
        gc = grad * ctx.beta
    return ga, gb, gc, None, None, None


_matmul.register_autograd(_matmul_backward, setup_context=_matmul_setup)


def matmul(A, B, C=None, *, alpha=1.0, beta=0.0, algorithm="auto"):
    """``alpha * A @ B + beta * C`` as the torch operator ``tsm::matmul``.

    A has shape (M, K), B (K, N), C (M, N); the result has shape (M, N). The same
    computation as ``tsm_core.matmul`` (TSM2R, TSM2L or cuBLAS, chosen the same way),
    as an operator that ``torch.compile(fullgraph=True)`` traces, autograd
    differentiates and a CUDA graph captures. Also reachable as
    ``torch.ops.tsm.matmul(A, B, C, alpha, beta, algorithm)`` once this module is
    imported.

    Parameters
    ----------
    A, B : torch.Tensor
        float32 or float64, on the CPU (computed with numpy) or one CUDA device, any
        strides. Mixed float32/float64 promote to float64.
    C : torch.Tensor, optional
        Shape (M, N), the result dtype, the same device; read only when beta != 0.
        Not written: the result is a new tensor. For a bias row, pass
        ``bias.expand(M, N)``.
    alpha, beta : float
        Scale factors; without C, beta is ignored.
    algorithm : {"auto", "tsm2r", "tsm2l", "cublas"}
        As for ``tsm_core.matmul``. Gradients use "auto".

    Returns
    -------
    torch.Tensor
        A new contiguous (M, N) tensor of the result dtype on A's device.

    Raises
    ------
    TypeError
        A dtype other than float32 or float64, tensors on the CPU and a GPU together,
        or a C of another dtype than the result's.
    ValueError
        Shapes that do not chain, a C of the wrong shape, tensors on different GPUs,
        or an unknown algorithm.

    Examples
    --------
    >>> import torch
    >>> import tsm_core.torch_ops as tops
    >>> A = torch.randn(1000, 300, dtype=torch.float64)
    >>> B = torch.randn(300, 4, dtype=torch.float64)
    >>> C = torch.randn(1000, 4, dtype=torch.float64)
    >>> bool(torch.allclose(tops.matmul(A, B, C, alpha=2.0, beta=0.5), 2 * A @ B + 0.5 * C))
    True
    >>> A.requires_grad_()
    tensor(...)
    >>> tops.matmul(A, B).sum().backward()
    >>> bool(torch.allclose(A.grad, B.sum(1).expand(1000, 300)))
    True
    """
    return torch.ops.tsm.matmul.default(A, B, C, float(alpha), float(beta), algorithm)


# ------------------------------------------------------------------ tsm::batched_matmul


# (Tensor[]? is beyond the schema torch infers from annotations: written out.)
@torch.library.custom_op("tsm::batched_matmul", mutates_args=(), schema=(
    "(Tensor[] As, Tensor[] Bs, Tensor[]? Cs=None, float alpha=1., float beta=0.) -> Tensor[]"))
def _batched_matmul(As: list[torch.Tensor], Bs: list[torch.Tensor], Cs: Optional[list[torch.Tensor]] = None,
                    alpha: float = 1.0, beta: float = 0.0) -> list[torch.Tensor]:
    _check_batch(As, Bs, Cs)
    if not As:
        return []
    dtype, device = As[0].dtype, As[0].device
    outs = [torch.empty((a.shape[0], b.shape[1]), dtype=dtype, device=device) for a, b in zip(As, Bs)]
    if Cs is not None and beta != 0.0:
        for o, c in zip(outs, Cs):
            o.copy_(c)
    else:
        beta = 0.0
    As = [_operand(a, dtype) for a in As]
    Bs = [_operand(b, dtype) for b in Bs]
    if device.type == "cuda":
        with _on_torch_stream(device) as capturing:
            if capturing:
                # A batch first seen is planned and its metadata (pointers, sizes,
                # strides) uploaded from host memory; the outputs made here are new
                # to every capture, so the upload would be captured from a host
                # buffer that does not outlive the call.
                raise RuntimeError(
                    "tsm::batched_matmul cannot be captured into a CUDA graph: each new batch "
                    "uploads its metadata from host memory (tsm_core.batched.launch.build_launch)")
            tsm_core.batched_matmul(As, Bs, outs, alpha=alpha, beta=beta)
    else:
        tsm_core.batched_matmul(As, Bs, outs, alpha=alpha, beta=beta)
    return outs


@_batched_matmul.register_fake
def _batched_matmul_fake(As, Bs, Cs=None, alpha=1.0, beta=0.0):
    _check_batch(As, Bs, Cs)
    return [a.new_empty((a.shape[0], b.shape[1])) for a, b in zip(As, Bs)]


def _batched_setup(ctx, inputs, output):
    As, Bs, Cs, alpha, beta = inputs
    ctx.save_for_backward(*As, *Bs)
    ctx.P = len(As)
    ctx.alpha, ctx.beta = alpha, beta
    ctx.has_c = Cs is not None


def _batched_backward(ctx, grads):
    saved = ctx.saved_tensors
    P = ctx.P
    As, Bs = saved[:P], saved[P:]
    # An output that no loss reached has no gradient: zeros in its place.
    grads = [torch.zeros((a.shape[0], b.shape[1]), dtype=a.dtype, device=a.device) if g is None
             else g.contiguous() for g, a, b in zip(grads, As, Bs)]
    op = torch.ops.tsm.batched_matmul.default
    gas = op(grads, [b.mT for b in Bs], None, ctx.alpha, 0.0)
    gbs = op([a.mT for a in As], grads, None, ctx.alpha, 0.0)
    gcs = [g * ctx.beta for g in grads] if ctx.has_c and ctx.beta != 0.0 else None
    # One entry per argument the call passed: the dispatcher leaves out trailing
    # arguments equal to their defaults, and a list operator's backward must match.
    return (gas, gbs, gcs, None, None)[:len(ctx.needs_input_grad)]


_batched_matmul.register_autograd(_batched_backward, setup_context=_batched_setup)


def batched_matmul(As, Bs, Cs=None, *, alpha=1.0, beta=0.0):
    """``alpha * As[i] @ Bs[i] + beta * Cs[i]`` for every i, as the torch operator
    ``tsm::batched_matmul``.

    As[i] has shape (M_i, K_i), Bs[i] (K_i, N_i), Cs[i] (M_i, N_i); sizes differ
    freely between problems. The same computation as ``tsm_core.batched_matmul`` (one
    launch on the GPU), as an operator that ``torch.compile(fullgraph=True)`` traces
    and autograd differentiates. Also reachable as
    ``torch.ops.tsm.batched_matmul(As, Bs, Cs, alpha, beta)`` once this module is
    imported. It cannot yet be captured into a CUDA graph (RuntimeError).

    Parameters
    ----------
    As, Bs : list of torch.Tensor
        One entry per problem, all of one dtype (float32 or float64, no promotion) and
        one device, any strides.
    Cs : list of torch.Tensor, optional
        Shapes (M_i, N_i), the same dtype and device; read only when beta != 0 and
        never written.
    alpha, beta : float
        Scale factors; without Cs, beta is ignored.

    Returns
    -------
    list of torch.Tensor
        New contiguous (M_i, N_i) tensors.

    Raises
    ------
    TypeError
        Mixed or unsupported dtypes, tensors on the CPU and a GPU together.
    ValueError
        Lists of different lengths, shapes that do not chain, a Cs[i] of the wrong
        shape, tensors on different GPUs.
    RuntimeError
        Called while torch's current CUDA stream is being captured.

    Examples
    --------
    >>> import torch
    >>> import tsm_core.torch_ops as tops
    >>> As = [torch.randn(5, 3), torch.randn(17, 1)]
    >>> Bs = [torch.randn(3, 2), torch.randn(1, 40)]
    >>> [tuple(c.shape) for c in tops.batched_matmul(As, Bs)]
    [(5, 2), (17, 40)]
    """
    return torch.ops.tsm.batched_matmul.default(list(As), list(Bs), None if Cs is None else list(Cs),
                                                float(alpha), float(beta))
