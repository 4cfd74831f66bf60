"""check_operands(): each input rule, and that a refused call touches nothing."""

import numpy as np
import pytest

from tsm_core.runtime import arrays as _arrays
from tsm_core.runtime.checks import _byte_extent, _ranges_overlap, check_operands

try:
    import torch
except ImportError:  # torch is an optional extra
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")

M, K, N = 37, 29, 5


def normal(rng, shape, dtype=np.float64):
    return rng.standard_normal(shape).astype(dtype)


@pytest.fixture
def abc(rng):
    """A (M, K), B (K, N) and out (M, N), float64, signed normal data."""
    return normal(rng, (M, K)), normal(rng, (K, N)), normal(rng, (M, N))


def refused(exc, match, A, B, **kw):
    """check_operands(A, B, **kw) raises `exc`, and leaves every array as it was."""
    arrays = [x for x in (A, B, kw.get("out")) if isinstance(x, np.ndarray)]
    before = [x.copy() for x in arrays]
    with pytest.raises(exc, match=match):
        check_operands(A, B, **kw)
    for x, y in zip(arrays, before):
        np.testing.assert_array_equal(x, y)


# --- what is accepted ---------------------------------------------------------


def test_fields(abc):
    A, B, out = abc
    ops = check_operands(A, B, out=out, alpha=2, beta=np.float32(0.5))
    assert (ops.m, ops.k, ops.n) == (M, K, N)
    assert ops.A is A and ops.B is B and ops.out is out
    assert ops.kind == "numpy" and ops.like is A and ops.xp is np
    assert ops.dtype == np.float64
    assert type(ops.alpha) is float and ops.alpha == 2.0
    assert type(ops.beta) is float and ops.beta == 0.5


def test_defaults(abc):
    A, B, _ = abc
    ops = check_operands(A, B)
    assert ops.out is None and ops.alpha == 1.0 and ops.beta == 0.0


@pytest.mark.parametrize(
    "dt_a, dt_b, want",
    [
        (np.float32, np.float32, np.float32),
        (np.float64, np.float64, np.float64),
        (np.float32, np.float64, np.float64),
        (np.float64, np.float32, np.float64),
    ],
)
def test_promotion_follows_numpy(rng, dt_a, dt_b, want):
    A, B = normal(rng, (M, K), dt_a), normal(rng, (K, N), dt_b)
    ops = check_operands(A, B)
    assert ops.dtype == want == np.result_type(A, B)
    assert ops.A.dtype == want and ops.B.dtype == want
    # An operand that already has the result dtype is not copied.
    assert (ops.A is A) == (dt_a == want)
    assert (ops.B is B) == (dt_b == want)
    np.testing.assert_array_equal(ops.A, A.astype(np.float64).astype(want))


@pytest.mark.parametrize(
    "layout",
    ["C", "F", "transposed", "strided", "negative-stride"],
)
def test_any_layout_is_viewed_not_copied(rng, layout):
    base = normal(rng, (2 * M, 3 * K))
    A = {
        "C": np.ascontiguousarray(base[:M, :K]),
        "F": np.asfortranarray(base[:M, :K]),
        "transposed": base[:K, :M].T,
        "strided": base[::2, ::3],
        "negative-stride": base[::-2, ::-3],
    }[layout]
    B = np.asfortranarray(normal(rng, (K, N)))
    out = np.zeros((N, M)).T  # F-ordered out
    ops = check_operands(A, B, out=out)
    assert ops.A is A and ops.B is B and ops.out is out


@pytest.mark.parametrize("m, k, n", [(0, K, N), (M, 0, N), (M, K, 0), (0, 0, 0)])
def test_empty_dims_are_valid(m, k, n):
    A, B, out = np.empty((m, k)), np.empty((k, n)), np.empty((m, n))
    ops = check_operands(A, B, out=out)
    assert (ops.m, ops.k, ops.n) == (m, k, n)


def test_alpha_beta_accept_any_real(abc):
    A, B, _ = abc
    for v in (3, -1.5, np.float32(2.0), np.int64(4), np.nan, -np.inf):
        ops = check_operands(A, B, alpha=v, beta=v)
        assert type(ops.alpha) is float and type(ops.beta) is float
        np.testing.assert_equal(ops.alpha, float(v))


# --- what is refused ----------------------------------------------------------


@pytest.mark.parametrize(
    "shape_a, shape_b, match",
    [
        ((K,), (K, N), r"A must be 2-D .* 1-D"),
        ((2, M, K), (K, N), r"A must be 2-D .* 3-D"),
        ((), (K, N), r"A must be 2-D .* 0-D"),
        ((M, K), (K,), r"B must be 2-D .* 1-D"),
        ((M, K), (1, K, N), r"B must be 2-D .* 3-D"),
    ],
)
def test_not_2d(rng, shape_a, shape_b, match):
    refused(ValueError, match, normal(rng, shape_a), normal(rng, shape_b))


def test_inner_dims_differ(abc, rng):
    A, _, out = abc
    refused(ValueError, r"inner dimensions differ.*\(37, 29\).*\(30, 5\)", A,
            normal(rng, (K + 1, N)), out=out)


@pytest.mark.parametrize(
    "bad", [np.int32, np.int64, np.uint8, np.bool_, np.float16, np.complex64, np.complex128]
)
@pytest.mark.parametrize("which", ["A", "B"])
def test_unsupported_dtype(abc, bad, which):
    A, B, out = abc
    if which == "A":
        A = A.astype(bad)
    else:
        B = B.astype(bad)
    refused(TypeError, rf"{which} has dtype {np.dtype(bad)}; .*float32 and float64",
            A, B, out=out)


@pytest.mark.parametrize(
    "thing", [[[1.0, 2.0]], 3.0, np.float64(3.0), None, "A"], ids=repr
)
def test_not_an_array(abc, thing):
    A, B, out = abc
    refused(TypeError, "A must be a numpy array, a CuPy array or a torch tensor",
            thing, B, out=out)
    refused(TypeError, "B must be a numpy array", A, thing, out=out)


@pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")  # np.matrix
def test_masked_and_matrix_refused(abc):
    A, B, _ = abc
    refused(TypeError, "A is a numpy.ma.*MaskedArray", np.ma.masked_array(A), B)
    refused(TypeError, "B is a numpy.matrix", A, np.asmatrix(B))


@pytest.mark.parametrize(
    "shape", [(M, N + 1), (M + 1, N), (N, M), (M * N,), (1, M, N)], ids=str
)
def test_out_wrong_shape(abc, shape):
    A, B, _ = abc
    out = np.full(shape, 7.0)
    refused(ValueError, r"out must have shape \(m, n\) = \(37, 5\)", A, B, out=out)


@pytest.mark.parametrize(
    "dt_a, dt_b, dt_out",
    [
        (np.float64, np.float64, np.float32),
        (np.float32, np.float32, np.float64),
        (np.float32, np.float64, np.float32),  # promoted result is float64
        (np.float64, np.float64, np.int64),
    ],
)
def test_out_wrong_dtype(rng, dt_a, dt_b, dt_out):
    A, B = normal(rng, (M, K), dt_a), normal(rng, (K, N), dt_b)
    out = np.full((M, N), 7, dtype=dt_out)
    refused(TypeError, r"out must have the result dtype", A, B, out=out)


def test_out_read_only(abc):
    A, B, out = abc
    out.flags.writeable = False
    refused(ValueError, "out is read-only", A, B, out=out)


def test_out_overlaps_a(rng):
    buf = normal(rng, (M, K))
    A = buf
    out = buf[:, 3 : 3 + N]  # a view into A
    refused(ValueError, "out shares memory with A", A, normal(rng, (K, N)), out=out)


def test_out_overlaps_b(rng):
    B = normal(rng, (M, N))  # square inner dims, so out may be B itself
    refused(ValueError, "out shares memory with B", normal(rng, (M, M)), B, out=B)


def test_out_overlap_through_transposed_strided_views(rng):
    # One buffer; out takes its even columns (transposed), B some odd ones.
    buf = normal(rng, (2 * N, M))
    out = buf[0::2].T  # (M, N), strides (8, 2 * M * 8)
    A = normal(rng, (M, M))
    B_odd = buf[1::2].T[:, :N]  # interleaved with out, no element shared
    assert check_operands(A, B_odd, out=out).out is out
    B_even = buf[::2, ::-1].T  # the same elements as out, reversed
    refused(ValueError, "out shares memory with B", A, B_even, out=out)


def test_overlap_refused_even_where_promotion_would_copy(rng):
    # B is float32 and will be cast into a fresh float64 array, so writing out
    # could not clobber it; the call is refused anyway (a simpler rule), and
    # out's contents survive the refusal.
    A = normal(rng, (M, K))
    out = normal(rng, (M, N))
    B32 = out.reshape(-1).view(np.float32)[: K * N].reshape(K, N)  # out's bytes
    refused(ValueError, "out shares memory with B", A, B32, out=out)
    assert check_operands(A, B32.copy(), out=out).B.dtype == np.float64


@pytest.mark.parametrize(
    "bad", [1j, np.complex128(1.0), "2.0", None, True, np.bool_(False), np.array(2.0), [1.0]],
    ids=repr,
)
@pytest.mark.parametrize("name", ["alpha", "beta"])
def test_alpha_beta_must_be_real(abc, bad, name):
    A, B, out = abc
    refused(TypeError, rf"{name} must be a real number", A, B, out=out, **{name: bad})


def test_out_wrong_kind(abc):
    A, B, out = abc
    refused(TypeError, "out must be a numpy array", A, B, out=out.tolist())


# --- array kinds ----------------------------------------------------------------


def test_kind_of_numpy():
    assert _arrays.kind_of(np.zeros((2, 2))) == "numpy"
    assert _arrays.kind_of(np.zeros((2, 2)).view(np.memmap)) == "numpy"


@pytest.mark.parametrize("thing", [[1.0], 1.0, np.float32(1.0), object()], ids=lambda t: type(t).__name__)
def test_kind_of_refuses_the_rest(thing):
    with pytest.raises(TypeError, match="x must be a numpy array"):
        _arrays.kind_of(thing, "x")


def test_has_gpu_is_a_cached_bool():
    assert isinstance(_arrays.has_gpu(), bool)
    assert _arrays.has_gpu() is _arrays.has_gpu()


def test_wrap_numpy_is_identity():
    C = np.ones((2, 3))
    assert _arrays.wrap(C, "numpy") is C
    with pytest.raises(ValueError, match="kind must be one of"):
        _arrays.wrap(C, "jax")


def test_byte_extent():
    # 3 x 4 float64, C order: 96 bytes from the start.
    assert _byte_extent(1000, (3, 4), (32, 8), 8) == (1000, 1096)
    # Reversed rows: element [0, 0] is the last row's first element.
    assert _byte_extent(1064, (3, 4), (-32, 8), 8) == (1000, 1096)
    # A single column of an F-ordered (3, 4) array.
    assert _byte_extent(1000, (3, 1), (8, 24), 8) == (1000, 1024)
    assert _ranges_overlap((0, 8), (7, 9)) and not _ranges_overlap((0, 8), (8, 16))


def test_byte_extent_is_conservative(rng):
    """Wherever numpy finds shared elements, the byte ranges intersect too."""
    buf = np.zeros(4096)

    def view():
        r, c = rng.integers(1, 12, size=2)
        rs, cs = rng.choice([-9, -3, -1, 1, 2, 5, 16], size=2)
        lo = 200 + int(rng.integers(0, 3000))
        v = np.lib.stride_tricks.as_strided(buf[lo:], (r, c), (rs * 8, cs * 8))
        return v

    for _ in range(500):
        x, y = view(), view()
        ext = [_byte_extent(a.__array_interface__["data"][0], a.shape, a.strides, 8) for a in (x, y)]
        if np.shares_memory(x, y):
            assert _ranges_overlap(*ext)


# --- torch ----------------------------------------------------------------------


@needs_torch
def test_torch_cpu_is_viewed_as_numpy(rng):
    tA = torch.from_numpy(normal(rng, (M, K), np.float32))
    tB = torch.from_numpy(normal(rng, (K, N), np.float32)).T.contiguous().T  # F order
    tout = torch.zeros((M, N), dtype=torch.float32)
    ops = check_operands(tA, tB, out=tout)
    assert ops.kind == "torch-cpu" and ops.xp is np and ops.like is tA
    assert isinstance(ops.A, np.ndarray) and ops.dtype == np.float32
    assert ops.A.ctypes.data == tA.data_ptr() and ops.out.ctypes.data == tout.data_ptr()
    assert ops.B.ctypes.data == tB.data_ptr() and ops.B.flags.f_contiguous


@needs_torch
@pytest.mark.parametrize("bad", ["bfloat16", "float16", "int64", "complex64"])
def test_torch_unsupported_dtype(bad):
    tA = torch.ones((M, K), dtype=getattr(torch, bad))
    tB = torch.ones((K, N), dtype=torch.float32)
    with pytest.raises(TypeError, match=rf"A has dtype torch.{bad}; "):
        check_operands(tA, tB)


@needs_torch
def test_torch_out_without_numpy_dtype_refused():
    # torch.bfloat16 has no numpy dtype; numpy would compare None equal to float64.
    tA, tB = torch.ones((M, K), dtype=torch.float64), torch.ones((K, N), dtype=torch.float64)
    out = torch.full((M, N), 7.0, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match=r"result dtype float64 .* got torch.bfloat16"):
        check_operands(tA, tB, out=out)
    assert bool((out == 7.0).all())


@needs_torch
def test_torch_requires_grad_refused():
    tA = torch.ones((M, K), requires_grad=True)
    with pytest.raises(TypeError, match=r"A requires grad.*A.detach\(\)"):
        check_operands(tA, torch.ones((K, N)))


@needs_torch
def test_torch_and_numpy_mixed(abc):
    A, B, out = abc
    tB = torch.from_numpy(B)
    refused(TypeError, "A is a numpy array but B is a torch CPU tensor", A, tB, out=out)
    refused(TypeError, "A is a numpy array but out is a torch CPU tensor", A, B,
            out=torch.from_numpy(out))


@needs_torch
def test_torch_out_overlap(rng):
    tA = torch.from_numpy(normal(rng, (M, M)))
    tB = torch.from_numpy(normal(rng, (M, N)))
    with pytest.raises(ValueError, match="out shares memory with A"):
        check_operands(tA, tB, out=tA[:, :N])


# --- GPU ------------------------------------------------------------------------


@pytest.mark.gpu
def test_cupy_accepted_and_viewed():
    import cupy as cp

    A = cp.random.standard_normal((M, K), dtype=cp.float32)
    B = cp.asfortranarray(cp.random.standard_normal((K, N)))
    out = cp.zeros((N, M)).T
    ops = check_operands(A, B, out=out)
    assert ops.kind == "cupy" and ops.xp is cp and ops.dtype == np.float64
    assert ops.B is B and ops.out is out and ops.A.dtype == cp.float64


@pytest.mark.gpu
def test_cupy_numpy_mixed():
    import cupy as cp

    with pytest.raises(TypeError, match="A is a CuPy array but B is a numpy array"):
        check_operands(cp.ones((M, K)), np.ones((K, N)))


@pytest.mark.gpu
def test_cupy_out_overlap():
    import cupy as cp

    A = cp.random.standard_normal((M, M))
    B = cp.random.standard_normal((M, N))
    before = A.copy()
    with pytest.raises(ValueError, match="out shares memory with A"):
        check_operands(A, B, out=A[:, ::-1][:, :N])
    with pytest.raises(ValueError, match="out shares memory with B"):
        check_operands(A, B, out=B)
    assert bool((A == before).all())
    buf = cp.zeros((M, 2 * N))
    assert check_operands(A, B, out=buf[:, N:]).out is not None


@pytest.mark.gpu
def test_cupy_different_devices():
    import cupy as cp

    if cp.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("needs two GPUs")
    with cp.cuda.Device(0):
        A = cp.ones((M, K))
    with cp.cuda.Device(1):
        B = cp.ones((K, N))
    with pytest.raises(ValueError, match="A on GPU 0, B on GPU 1"):
        check_operands(A, B)


@pytest.mark.gpu
@needs_torch
def test_torch_cuda_viewed_as_cupy():
    if not torch.cuda.is_available():
        pytest.skip("this torch build has no CUDA")
    import cupy as cp

    tA = torch.randn((M, K), device="cuda", dtype=torch.float64)
    tB = torch.randn((K, N), device="cuda", dtype=torch.float64)
    ops = check_operands(tA, tB)
    assert ops.kind == "torch" and ops.xp is cp
    assert ops.A.data.ptr == tA.data_ptr()
    back = _arrays.wrap(ops.A, ops.kind)
    assert isinstance(back, torch.Tensor) and back.data_ptr() == tA.data_ptr()
