"""The torch operators tsm::matmul and tsm::batched_matmul (tsm_core.torch_ops).

CPU tests: eager results against a float64 reference on signed random data of
awkward sizes, strided and mixed-dtype inputs, torch.compile(fullgraph=True) with the
eager, aot_eager and inductor backends against eager, torch.library.opcheck (schema,
fake against real, autograd registration, AOT dispatch with dynamic shapes), and
gradcheck in float64. GPU tests (marker `gpu`): the same on CUDA tensors, and
matmul captured into a torch.cuda.CUDAGraph and replayed on new inputs.

Tolerance: a product of length k in precision u is within k * u * (|alpha| |A| |B|
+ |beta| |C|) of the exact one, elementwise (the standard bound, gamma_k ~ k u);
the tests allow twice that, plus one ulp of the result.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
tops = pytest.importorskip("tsm_core.torch_ops")

F32, F64 = torch.float32, torch.float64


def _randn(shape, dtype, gen, device="cpu"):
    return torch.randn(shape, dtype=F64, generator=gen).to(device=device, dtype=dtype)


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(20240607)


def _assert_close(got, A, B, C=None, alpha=1.0, beta=0.0):
    """`got` against alpha * A @ B + beta * C in float64, within the bound above."""
    a, b = A.detach().double().cpu(), B.detach().double().cpu()
    ref = alpha * (a @ b)
    mag = abs(alpha) * (a.abs() @ b.abs())
    if C is not None and beta != 0.0:
        c = C.detach().double().cpu()
        ref = ref + beta * c
        mag = mag + abs(beta) * c.abs()
    u = torch.finfo(got.dtype).eps / 2
    k = A.shape[1]
    tol = 2 * max(k, 1) * u * mag + torch.finfo(got.dtype).eps * ref.abs()
    err = (got.detach().double().cpu() - ref).abs()
    assert got.shape == ref.shape
    assert bool((err <= tol).all()), f"max error {err.max().item():.3g}, bound {tol.max().item():.3g}"


SHAPES = [(1000, 300, 4), (37, 1, 513), (5, 64, 64), (2049, 16, 12), (0, 5, 3), (7, 0, 3), (3, 4, 0)]


# ------------------------------------------------------------------ import cost


def test_import_tsm_core_does_not_import_torch():
    code = "import sys, tsm_core; assert 'torch' not in sys.modules, 'torch was imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


# ------------------------------------------------------------------ eager on the CPU


@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize("m,k,n", SHAPES)
def test_eager_matches_reference(m, k, n, dtype, gen):
    A, B = _randn((m, k), dtype, gen), _randn((k, n), dtype, gen)
    C = _randn((m, n), dtype, gen)
    _assert_close(tops.matmul(A, B), A, B)
    _assert_close(torch.ops.tsm.matmul(A, B, C, -1.5, 0.25, "auto"), A, B, C, -1.5, 0.25)
    r = tops.matmul(A, B, C, alpha=2.0, beta=1.0)
    assert r.is_contiguous() and r.dtype == dtype and r.device == A.device
    _assert_close(r, A, B, C, 2.0, 1.0)


def test_inputs_are_not_written_and_c_is_not_read_with_beta_zero(gen):
    A, B = _randn((40, 9), F64, gen), _randn((9, 5), F64, gen)
    C = torch.full((40, 5), float("nan"), dtype=F64)
    copies = [x.clone() for x in (A, B)]
    r = tops.matmul(A, B, C, alpha=1.0, beta=0.0)
    assert bool(torch.isfinite(r).all())
    _assert_close(r, A, B)
    assert all(torch.equal(x, y) for x, y in zip((A, B), copies))
    assert bool(torch.isnan(C).all())
    C0 = _randn((40, 5), F64, gen)
    keep = C0.clone()
    tops.matmul(A, B, C0, beta=3.0)
    assert torch.equal(C0, keep)


@pytest.mark.parametrize("dtype", [F32, F64])
def test_strided_inputs(dtype, gen):
    big = _randn((300, 200), dtype, gen)
    cases = [
        (big[:, :37], _randn((37, 11), dtype, gen)),               # row stride 200
        (big.T[:50, ::3], _randn((100, 6), dtype, gen)),           # F-ordered with a step
        (_randn((23, 64), dtype, gen), big[::2, ::40][:64].T.T),   # B sliced both ways
        (_randn((64, 17), dtype, gen).T, _randn((8, 64), dtype, gen).T),  # both transposed
    ]
    for A, B in cases:
        assert not (A.is_contiguous() and B.is_contiguous())
        _assert_close(tops.matmul(A, B), A, B)
    # A bias row broadcast as C: a stride-0 view.
    A, B = cases[0]
    bias = _randn((B.shape[1],), dtype, gen)
    C = bias.expand(A.shape[0], B.shape[1])
    _assert_close(tops.matmul(A, B, C, beta=1.0), A, B, C.contiguous(), 1.0, 1.0)


def test_mixed_dtypes_promote_to_float64(gen):
    A, B = _randn((300, 20), F32, gen), _randn((20, 7), F64, gen)
    r = tops.matmul(A, B)
    assert r.dtype == F64
    _assert_close(r, A.double(), B)
    C = _randn((300, 7), F64, gen)
    _assert_close(tops.matmul(B.T, A.T, C.T.contiguous(), beta=-1.0), B.T, A.T.double(), C.T, 1.0, -1.0)


@pytest.mark.parametrize("args,exc,words", [
    (lambda g: (torch.ones(3, 4, dtype=torch.int32), torch.ones(4, 2)), TypeError, "float32"),
    (lambda g: (torch.ones(3, 4, dtype=torch.float16), torch.ones(4, 2)), TypeError, "float32"),
    (lambda g: (torch.ones(3, 4), torch.ones(5, 2)), ValueError, "inner dimensions"),
    (lambda g: (torch.ones(3, 4, 1), torch.ones(4, 2)), ValueError, "2-D"),
    (lambda g: (torch.ones(3, 4), torch.ones(4, 2), torch.ones(3, 2, dtype=F64)), TypeError, "result dtype"),
    (lambda g: (torch.ones(3, 4), torch.ones(4, 2), torch.ones(2, 3)), ValueError, "shape"),
])
def test_refused(args, exc, words, gen):
    ops = args(gen)
    with pytest.raises(exc, match=words):
        tops.matmul(*ops, beta=1.0)


def test_unknown_algorithm():
    with pytest.raises(ValueError, match="algorithm"):
        tops.matmul(torch.ones(3, 4), torch.ones(4, 2), algorithm="magma")


@pytest.mark.parametrize("algorithm", ["auto", "tsm2r", "tsm2l", "cublas"])
def test_algorithm_is_passed_through(algorithm, gen):
    A, B = _randn((500, 16), F32, gen), _randn((16, 8), F32, gen)
    _assert_close(tops.matmul(A, B, algorithm=algorithm), A, B)


# ------------------------------------------------------------------ torch.compile


def _inductor_runs():
    try:
        torch.compile(lambda x: x * 2 + 1, backend="inductor", fullgraph=True)(torch.ones(3))
        return True, ""
    except Exception as e:  # no C++ compiler, or one inductor cannot use
        return False, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"


_INDUCTOR: list = []


def _need(backend):
    """Skip where `backend` is inductor and inductor cannot compile here."""
    if backend != "inductor":
        return
    if not _INDUCTOR:
        _INDUCTOR.append(_inductor_runs())
    ok, why = _INDUCTOR[0]
    if not ok:
        pytest.skip(f"inductor cannot compile here ({why})")


BACKENDS = ["eager", "aot_eager", "inductor"]


def _model(A, B, C):
    # Work around the operator on both sides, so the graph holds more than the call.
    h = tops.matmul(A * 2.0, B, C, alpha=0.5, beta=-1.0)
    return torch.tanh(h) @ tops.matmul(h.T, h, algorithm="cublas")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [F32, F64])
def test_compile_fullgraph_matches_eager(backend, dtype, gen):
    _need(backend)
    torch._dynamo.reset()
    A, B, C = _randn((301, 33), dtype, gen), _randn((33, 5), dtype, gen), _randn((301, 5), dtype, gen)
    want = _model(A, B, C)
    f = torch.compile(_model, fullgraph=True, backend=backend)
    got = f(A, B, C)
    # The operator runs the same code either way; inductor fuses the work around it
    # in another order (torch's default tolerances of the dtype), the others do not.
    tol = {} if backend == "inductor" else {"rtol": 0, "atol": 0}
    torch.testing.assert_close(got, want, **tol)
    # New values, same shapes: same results.
    A2 = _randn((301, 33), dtype, gen)
    torch.testing.assert_close(f(A2, B, C), _model(A2, B, C), **tol)


def test_compile_dynamic_shapes(gen):
    torch._dynamo.reset()
    f = torch.compile(lambda a, b: tops.matmul(a, b) + 1.0, fullgraph=True, backend="aot_eager",
                      dynamic=True)
    for m, k, n in [(50, 7, 3), (123, 9, 4), (9, 40, 2)]:
        A, B = _randn((m, k), F64, gen), _randn((k, n), F64, gen)
        torch.testing.assert_close(f(A, B), tops.matmul(A, B) + 1.0, rtol=0, atol=0)


def test_compile_records_one_graph(gen):
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    cnt = CompileCounter()
    f = torch.compile(_model, fullgraph=True, backend=cnt)
    A, B, C = _randn((40, 6), F64, gen), _randn((6, 3), F64, gen), _randn((40, 3), F64, gen)
    f(A, B, C)
    assert cnt.frame_count == 1


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compile_backward_matches_eager(backend, gen):
    _need(backend)
    torch._dynamo.reset()
    A, B, C = (_randn(s, F64, gen).requires_grad_() for s in ((70, 12), (12, 5), (70, 5)))

    def loss(A, B, C):
        return (_model(A, B, C) ** 2).sum()

    want = torch.autograd.grad(loss(A, B, C), (A, B, C))
    got = torch.autograd.grad(torch.compile(loss, fullgraph=True, backend=backend)(A, B, C), (A, B, C))
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12)


# ------------------------------------------------------------------ opcheck and autograd


def _opcheck(op, args):
    result = torch.library.opcheck(op, args)
    assert all(v == "SUCCESS" for v in result.values()), result


@pytest.mark.parametrize("grad", [False, True])
def test_opcheck_matmul(grad, gen):
    A, B, C = _randn((30, 7), F64, gen), _randn((7, 4), F64, gen), _randn((30, 4), F64, gen)
    for x in (A, B, C):
        x.requires_grad_(grad)
    op = torch.ops.tsm.matmul.default
    _opcheck(op, (A, B, C, 1.5, -0.5, "auto"))
    _opcheck(op, (A, B, None, 1.0, 0.0, "cublas"))
    _opcheck(op, (A.float().detach().requires_grad_(grad), B, None, 1.0, 0.0, "auto"))


@pytest.mark.parametrize("grad", [False, True])
def test_opcheck_batched(grad, gen):
    shapes = [(5, 3, 2), (17, 1, 40), (64, 33, 9)]
    As = [_randn((m, k), F64, gen).requires_grad_(grad) for m, k, n in shapes]
    Bs = [_randn((k, n), F64, gen).requires_grad_(grad) for m, k, n in shapes]
    Cs = [_randn((m, n), F64, gen).requires_grad_(grad) for m, k, n in shapes]
    op = torch.ops.tsm.batched_matmul.default
    _opcheck(op, (As, Bs, Cs, 1.5, 0.5))
    _opcheck(op, (As, Bs, None, 1.0, 0.0))


def test_gradcheck_matmul(gen):
    A, B, C = (_randn(s, F64, gen).requires_grad_() for s in ((9, 6), (6, 4), (9, 4)))
    f = lambda a, b, c: tops.matmul(a, b, c, alpha=1.7, beta=-0.3)  # noqa: E731
    assert torch.autograd.gradcheck(f, (A, B, C))
    assert torch.autograd.gradgradcheck(f, (A, B, C))
    # Strided operands and no C.
    At = _randn((6, 9), F64, gen).T.detach().requires_grad_()
    assert torch.autograd.gradcheck(lambda a, b: tops.matmul(a, b, alpha=-2.0), (At, B))


def test_gradient_dtypes_follow_the_inputs(gen):
    A = _randn((20, 5), F32, gen).requires_grad_()
    B = _randn((5, 3), F64, gen).requires_grad_()
    tops.matmul(A, B).sum().backward()
    assert A.grad.dtype == F32 and B.grad.dtype == F64
    torch.testing.assert_close(A.grad, torch.ones(20, 3, dtype=F64) @ B.detach().T, check_dtype=False)


def test_gradcheck_batched(gen):
    shapes = [(4, 3, 2), (1, 5, 6), (7, 2, 1)]
    As = [_randn((m, k), F64, gen).requires_grad_() for m, k, n in shapes]
    Bs = [_randn((k, n), F64, gen).requires_grad_() for m, k, n in shapes]
    Cs = [_randn((m, n), F64, gen).requires_grad_() for m, k, n in shapes]
    P = len(shapes)

    def f(*t):
        return tuple(tops.batched_matmul(t[:P], t[P:2 * P], t[2 * P:], alpha=0.7, beta=1.3))

    assert torch.autograd.gradcheck(f, (*As, *Bs, *Cs))

    def only_first(*t):  # the other outputs get no gradient: zeros in their place
        return tops.batched_matmul(t[:P], t[P:], alpha=2.0)[0]

    assert torch.autograd.gradcheck(only_first, (*As, *Bs))


# ------------------------------------------------------------------ batched on the CPU


BATCH = [(5, 3, 2), (17, 1, 40), (0, 4, 3), (64, 33, 9), (300, 128, 17), (2, 0, 5)]


@pytest.mark.parametrize("dtype", [F32, F64])
def test_batched_matches_reference(dtype, gen):
    As = [_randn((m, k), dtype, gen) for m, k, n in BATCH]
    Bs = [_randn((k, n), dtype, gen) for m, k, n in BATCH]
    Cs = [_randn((m, n), dtype, gen) for m, k, n in BATCH]
    As[3] = As[3].T.contiguous().T  # an F-ordered operand among C-ordered ones
    outs = tops.batched_matmul(As, Bs, Cs, alpha=-0.5, beta=2.0)
    assert len(outs) == len(BATCH)
    for A, B, C, r in zip(As, Bs, Cs, outs):
        assert r.is_contiguous() and r.dtype == dtype
        _assert_close(r, A, B, C, -0.5, 2.0)
    assert tops.batched_matmul([], []) == []


@pytest.mark.parametrize("backend", BACKENDS)
def test_batched_compile_matches_eager(backend, gen):
    _need(backend)
    torch._dynamo.reset()
    As = [_randn((m, k), F32, gen) for m, k, n in BATCH[:2] + BATCH[3:5]]
    Bs = [_randn((k, n), F32, gen) for m, k, n in BATCH[:2] + BATCH[3:5]]

    def f(As, Bs):
        outs = tops.batched_matmul([a * 1.5 for a in As], Bs, alpha=2.0)
        return [o.relu().sum(0) for o in outs]

    want = f(As, Bs)
    got = torch.compile(f, fullgraph=True, backend=backend)(As, Bs)
    tol = {} if backend == "inductor" else {"rtol": 0, "atol": 0}
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, **tol)


def test_batched_refused():
    with pytest.raises(TypeError, match="one dtype"):
        tops.batched_matmul([torch.ones(2, 3), torch.ones(2, 3, dtype=F64)], [torch.ones(3, 1)] * 2)
    with pytest.raises(ValueError, match="one entry per problem"):
        tops.batched_matmul([torch.ones(2, 3)], [])
    with pytest.raises(ValueError, match="inner dimensions"):
        tops.batched_matmul([torch.ones(2, 3)], [torch.ones(4, 1)])


# ------------------------------------------------------------------ GPU


def _cuda(shape, dtype, gen):
    return _randn(shape, dtype, gen, "cuda")


# Shapes the planner sends to each route (and a split-K TSM2R: a short, deep product).
GPU_CASES = [
    ("tsm2r", 20_000, 1024, 8),
    ("tsm2r", 256, 65_536, 4),     # split-K: a workspace allocated per call
    ("tsm2l", 1_000_000, 16, 16),
    ("cublas", 1025, 513, 259),
    ("auto", 100_003, 96, 3),
]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize("algorithm,m,k,n", GPU_CASES)
def test_gpu_eager_and_compiled(algorithm, m, k, n, dtype, gen):
    torch._dynamo.reset()
    A, B, C = _cuda((m, k), dtype, gen), _cuda((k, n), dtype, gen), _cuda((m, n), dtype, gen)
    r = tops.matmul(A, B, C, alpha=1.5, beta=-1.0, algorithm=algorithm)
    assert r.is_cuda and r.is_contiguous()
    _assert_close(r, A, B, C, 1.5, -1.0)
    # inductor compiles for a while: on two of the routes only.
    for backend in ("aot_eager", "inductor") if algorithm in ("auto", "cublas") else ("aot_eager",):
        def fn(a, b, c):
            return tops.matmul(a, b, c, alpha=1.5, beta=-1.0, algorithm=algorithm) * 2.0

        f = torch.compile(fn, fullgraph=True, backend=backend)
        _assert_close(f(A, B, C) / 2.0, A, B, C, 1.5, -1.0)


@pytest.mark.gpu
def test_gpu_runs_on_torchs_current_stream(gen):
    # A side stream that starts behind a long kernel: the product must wait for its
    # inputs there and its result must be ready on that stream.
    A, B = _cuda((200_000, 256), F32, gen), _cuda((256, 8), F32, gen)
    tops.matmul(A, B)  # plans, measures, compiles outside the timed part
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        torch.cuda._sleep(50_000_000)
        A2 = A * -1.0
        r = tops.matmul(A2, B)
        total = r.sum()
    torch.cuda.current_stream().wait_stream(s)
    _assert_close(r, A2, B)
    assert torch.isclose(total, r.sum())


def _capture(fn, static_args):
    """Warm up `fn` on a side stream, capture it, return (graph, static output)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn(*static_args)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = fn(*static_args)
    return g, out


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize("algorithm,m,k,n", GPU_CASES)
def test_gpu_cuda_graph_capture_and_replay(algorithm, m, k, n, dtype, gen):
    A, B, C = _cuda((m, k), dtype, gen), _cuda((k, n), dtype, gen), _cuda((m, n), dtype, gen)

    def fn(a, b, c):
        return tops.matmul(a, b, c, alpha=0.5, beta=2.0, algorithm=algorithm)

    g, out = _capture(fn, (A, B, C))
    for _ in range(3):
        A.copy_(_cuda((m, k), dtype, gen))
        B.copy_(_cuda((k, n), dtype, gen))
        C.copy_(_cuda((m, n), dtype, gen))
        out.fill_(float("nan"))  # the replay must write every element
        g.replay()
        torch.cuda.synchronize()
        _assert_close(out, A, B, C, 0.5, 2.0)


@pytest.mark.gpu
def test_gpu_cuda_graph_mixed_dtypes_and_strides(gen):
    # Promotion and a strided A: copies made inside the captured call.
    A = _cuda((4096, 300), F32, gen)[:, :257]
    B = _cuda((257, 6), F64, gen)
    g, out = _capture(lambda a, b: tops.matmul(a, b), (A, B))
    A.copy_(_cuda((4096, 257), F32, gen))
    g.replay()
    torch.cuda.synchronize()
    _assert_close(out, A.double(), B)


@pytest.mark.gpu
def test_gpu_compiled_reduce_overhead(gen):
    # torch.compile's own CUDA graphs (cudagraph trees) around the operator.
    torch._dynamo.reset()
    B = _cuda((512, 16), F32, gen)
    f = torch.compile(lambda a, b: tops.matmul(a, b).relu(), fullgraph=True, mode="reduce-overhead")
    for _ in range(4):
        A2 = _cuda((50_000, 512), F32, gen)
        r = f(A2, B).clone()
        torch.testing.assert_close(r, (A2.double() @ B.double()).relu().float(), rtol=1e-4, atol=1e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [F32, F64])
def test_gpu_batched_eager_and_compiled(dtype, gen):
    torch._dynamo.reset()
    shapes = [(300, 64, 40), (17, 200, 9), (512, 512, 128), (1, 1, 1), (0, 3, 5)]
    As = [_cuda((m, k), dtype, gen) for m, k, n in shapes]
    Bs = [_cuda((k, n), dtype, gen) for m, k, n in shapes]
    Cs = [_cuda((m, n), dtype, gen) for m, k, n in shapes]
    for r, A, B, C in zip(tops.batched_matmul(As, Bs, Cs, alpha=2.0, beta=-1.0), As, Bs, Cs):
        _assert_close(r, A, B, C, 2.0, -1.0)
    f = torch.compile(lambda As, Bs, Cs: tops.batched_matmul(As, Bs, Cs, alpha=2.0, beta=-1.0),
                      fullgraph=True, backend="aot_eager")
    for r, A, B, C in zip(f(As, Bs, Cs), As, Bs, Cs):
        _assert_close(r, A, B, C, 2.0, -1.0)


@pytest.mark.gpu
@pytest.mark.xfail(raises=RuntimeError, strict=True,
                   reason="a new batch uploads its metadata from host memory during the call")
def test_gpu_batched_cuda_graph(gen):
    shapes = [(300, 64, 40), (17, 200, 9)]
    As = [_cuda((m, k), F32, gen) for m, k, n in shapes]
    Bs = [_cuda((k, n), F32, gen) for m, k, n in shapes]
    g, outs = _capture(lambda As, Bs: tops.batched_matmul(As, Bs), (As, Bs))
    for A in As:
        A.copy_(torch.randn_like(A))
    g.replay()
    torch.cuda.synchronize()
    for r, A, B in zip(outs, As, Bs):
        _assert_close(r, A, B)
