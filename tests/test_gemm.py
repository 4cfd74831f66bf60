"""tsm_core.gemm: the tiled GEMM kernel against a float64 reference (GPU), the numpy
path, input errors, and a compile check of every instantiation (no GPU needed).

Tolerance, elementwise (the bound of tests/test_gpu_tsm2.py):

    |C - exact| <= gamma_{k+3}(u) (|alpha| |A| @ |B| + |beta| |C0|) + float64's own,

which holds for any summation order of depth <= k + 3: the kernel's per-thread
running sum over k with FMA, plus the alpha/beta epilogue. Zero-filled tile edges add
exact zeros. Poison: with beta == 0, out is NaN-filled first, so an element that is
never written, or an out read although beta == 0, fails (NaN compares false).
"""

from __future__ import annotations

import _sweep
import numpy as np
import pytest

import tsm_core
from tsm_core.runtime import compile as _compile

from tsm_core.tiled import configs as _configs
from tsm_core.tiled import kernels as _kernels
from tsm_core.tiled import launch as _launch
from tsm_core.tiled import plan as _plan

try:
    import cupy
except ImportError:
    cupy = None

DTYPES = [np.float32, np.float64]
ORDERS = ["CC", "CF", "FC", "FF"]
SLACK = 1e-6


def _gamma(j, dtype):
    u = np.finfo(dtype).eps / 2
    return j * u / (1 - j * u)


def _bound(A, B, C0, alpha, beta, dtype):
    """Elementwise error bound (numpy float64 arrays in)."""
    k = A.shape[1]
    scale = abs(alpha) * (np.abs(A) @ np.abs(B))
    if C0 is not None and beta != 0:
        scale = scale + abs(beta) * np.abs(C0)
    return (_gamma(k + 3, dtype) + _gamma(k + 3, np.float64)) * scale * (1 + SLACK) + 1e-300


def _make(rng, shape, dtype, order, xp=np):
    a = rng.standard_normal(shape).astype(dtype)
    a = np.asfortranarray(a) if order == "F" else np.ascontiguousarray(a)
    if xp is np:
        return a
    return cupy.asfortranarray(cupy.asarray(a)) if order == "F" else cupy.asarray(a)


def _check(C, A, B, C0, alpha, beta, dtype, what):
    A64, B64 = (np.asarray(x, dtype=np.float64) for x in (A, B))
    ref = alpha * (A64 @ B64)
    if C0 is not None and beta != 0:
        ref = ref + beta * np.asarray(C0, dtype=np.float64)
    err = np.abs(np.asarray(C, dtype=np.float64) - ref)
    bnd = _bound(A64, B64, None if C0 is None else np.asarray(C0, np.float64), alpha, beta, dtype)
    bad = ~(err <= bnd)
    assert not bad.any(), (f"{what}: {int(bad.sum())} of {err.size} elements off; worst "
                           f"{np.nanmax(err / bnd) if np.isfinite(err).all() else 'NaN'} x bound")


# ------------------------------------------------------------------ CPU (numpy path)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("alpha,beta", [(1.0, 0.0), (1.5, -0.5), (0.0, 1.0)])
def test_numpy_path(rng, dtype, alpha, beta):
    A = _make(rng, (37, 19), dtype, "C")
    B = _make(rng, (19, 23), dtype, "F")
    C0 = rng.standard_normal((37, 23)).astype(dtype)
    out = C0.copy()
    if beta == 0:
        out[:] = np.nan
    C = tsm_core.gemm(A, B, out=out, alpha=alpha, beta=beta)
    assert C is out and isinstance(C, np.ndarray) and C.dtype == dtype
    _check(C, A, B, C0, alpha, beta, dtype, "numpy")


def test_numpy_empty_and_k0(rng):
    A = np.ones((3, 0), np.float32)
    B = np.ones((0, 4), np.float32)
    C = tsm_core.gemm(A, B)
    assert C.shape == (3, 4) and not C.any()
    assert tsm_core.gemm(np.ones((0, 2)), np.ones((2, 5))).shape == (0, 5)


@pytest.mark.parametrize("call", ["gemm", "strassen"])
def test_errors_change_nothing(rng, call):
    f = getattr(tsm_core, call)
    A = rng.standard_normal((8, 6)).astype(np.float32)
    B = rng.standard_normal((6, 4)).astype(np.float32)
    out = np.full((8, 4), 7.0, np.float32)
    keep = [A.copy(), B.copy(), out.copy()]
    with pytest.raises(ValueError, match="inner dimensions"):
        f(A, B[:5], out=out)
    with pytest.raises(TypeError, match="float32 and float64"):
        f(A.astype(np.int32), B, out=out)
    with pytest.raises(ValueError, match="out must have shape"):
        f(A, B, out=np.zeros((8, 5), np.float32))
    with pytest.raises(TypeError, match="result dtype"):
        f(A, B, out=np.zeros((8, 4), np.float64))
    with pytest.raises(ValueError, match="2-D"):
        f(A[None], B, out=out)
    if call == "strassen":
        for bad in (-1, 3, True, 1.5, "Auto"):  # 0 is cuBLAS, "auto" the default
            with pytest.raises(ValueError, match="levels"):
                f(A, B, levels=bad, out=out)
    for x, y in zip((A, B, out), keep):
        np.testing.assert_array_equal(x, y)


def test_plan_plain_wave_model():
    """The small tile where the big one leaves SMs idle, the big one on full waves."""
    assert _plan.plan_plain(1024, 1024, 4)[0] == "async"  # 64 blocks of 128^2 for 132 SMs
    assert _plan.plan_plain(1536, 1536, 4)[0] == "async"
    for n in (2048, 4096, 16384):  # full waves of the wide tile
        assert _plan.plan_plain(n, n, 4) == ("wide", None)
    assert _plan.plan_plain(3072, 3072, 4) == ("tiled", None)  # 288 wide tiles: 2.2 waves
    assert _plan.plan_plain(300, 300, 8) == ("tiled", None)  # float64: v1 only
    kind, cfg = _plan.plan_plain(512, 512, 4)
    assert kind == "async" and cfg == _configs.SMALL_TILE


# ------------------------------------------------------------------ compile (no GPU)


def _instantiations():
    """Every plain instantiation the launcher can pick (dtype x layout x vector), and
    every fused one for C-ordered A and B with and without vectors (the other layouts
    differ only in the load path, which the plain ones compile)."""
    return _kernels.instantiations(layouts=((True, False),))


def _stratum(name):
    """An instantiation less its layout flags (A and B order, vector loads: the four
    booleans after the dtype of gemm_tiled and gemm_async): the tile and its options."""
    head, _, args = name.partition("<")
    a = [x.strip() for x in args.rstrip(">").split(",")]
    return (head, a[0], tuple(a[5:])) if head in ("gemm_tiled", "gemm_async") else (head, *a)


def test_instantiations_compile_without_spills():
    nvrtc = pytest.importorskip("cupy_backends.cuda.libs.nvrtc")
    try:
        nvrtc.getVersion()
    except Exception as exc:
        pytest.skip(f"NVRTC cannot be loaded: {exc}")
    import concurrent.futures

    # A fixed sample (_sweep.py): every tile configuration and option once, its layout
    # variants (which differ only in the load path) sampled; all with --all-kernels.
    names = _sweep.sample(_instantiations(), stratum=_stratum)
    with concurrent.futures.ThreadPoolExecutor(2) as ex:
        reps = list(ex.map(lambda n: _compile.compile_report("gemm", n), names))
    # Plain kernels: no spills. Fused Strassen kernels at two blocks per SM: a bounded
    # spill, accepted because it measured faster than one block per SM (_configs.FUSED_OCC).
    def occ(name):  # gemm_tiled<..., FUSED, OCC, WN, SPLIT>, gemm_async<..., STAGES, OCC>
        # one block per SM at most
        if name.startswith(("gemm_splitk_reduce", "gemm_pipe", "gemm_ws", "block_sum")):
            return 1
        args = [x.strip() for x in name.rstrip(">").split(",")]
        return int(args[-3] if name.startswith("gemm_tiled") else args[-1])

    def fused_or_split(name):  # fused Strassen products, split-K tails (2 blocks per SM)
        args = [x.strip() for x in name.rstrip(">").split(",")]
        return name.startswith("gemm_tiled") and "true" in (args[-4], args[-1])

    bad = [(r.name_expr, r.registers, r.spill_stores, r.spill_loads) for r in reps
           if (r.spills and not (fused_or_split(r.name_expr) and occ(r.name_expr) == 2))
           or r.spill_stores + r.spill_loads > FUSED_SPILL_MAX]
    # The split-K tail's 128 x 128 variants spill a few dozen bytes at 128 registers;
    # they run only the last partial wave.
    split_spill = [r.spill_stores + r.spill_loads for r in reps
                   if r.name_expr.startswith("gemm_tiled") and r.name_expr.endswith("true>")]
    assert split_spill and max(split_spill) <= SPLIT_SPILL_MAX, max(split_spill)
    assert not bad, f"spilling instantiations: {bad}"
    assert any(r.name_expr.endswith(", 1, 4, false>") for r in reps)  # the wide tile is compiled
    assert sum(r.name_expr.startswith("gemm_pipe") for r in reps) >= 8  # plain and fused
    assert sum(r.name_expr.startswith("gemm_ws") for r in reps) >= 5  # plain and fused
    for r in reps:
        assert 0 < r.registers <= min(255, 65536 // (256 * occ(r.name_expr))), (r.name_expr, r.registers)


FUSED_SPILL_MAX = 1024  # bytes of spill stores + loads in one fused variant
SPLIT_SPILL_MAX = 128  # in one split-K tail variant


# ------------------------------------------------------------------ GPU

@pytest.fixture(scope="module")
def compiled():
    """Compile every plain variant in parallel, once (CuPy's disk cache)."""
    if cupy is not None:
        _kernels.precompile(_kernels.instantiations(plain=True, levels=()))


SHAPES = [(1, 1, 1), (1, 7, 1), (5, 3, 2), (2, 300, 3), (127, 129, 131), (128, 128, 128),
          (129, 8, 257), (255, 17, 1), (65, 1, 67), (200, 1023, 130)]
AB = [(1.0, 0.0), (1.5, -0.5), (0.0, 1.0)]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_gpu_gemm(rng, compiled, dtype, order, shape):
    m, k, n = shape
    A = _make(rng, (m, k), dtype, order[0], cupy)
    B = _make(rng, (k, n), dtype, order[1], cupy)
    for alpha, beta in AB:
        for c_order in ("C", "F"):
            C0 = _make(rng, (m, n), dtype, c_order, cupy)
            out = C0.copy(order=c_order)
            if beta == 0:
                out.fill(cupy.nan)
            C = tsm_core.gemm(A, B, out=out, alpha=alpha, beta=beta)
            assert C is out
            _check(cupy.asnumpy(C), cupy.asnumpy(A), cupy.asnumpy(B), cupy.asnumpy(C0),
                   alpha, beta, dtype, f"{shape} {order} out {c_order} a={alpha} b={beta}")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("shape", [(1023, 1025, 1021), (2049, 515, 1030), (640, 2048, 384)],
                         ids=lambda s: "x".join(map(str, s)))
def test_gpu_gemm_large(rng, compiled, dtype, shape):
    m, k, n = shape
    A = _make(rng, (m, k), dtype, "C", cupy)
    B = _make(rng, (k, n), dtype, "C", cupy)
    out = cupy.full((m, n), cupy.nan, dtype=dtype)
    C = tsm_core.gemm(A, B, out=out)
    _check(cupy.asnumpy(C), cupy.asnumpy(A), cupy.asnumpy(B), None, 1.0, 0.0, dtype, str(shape))


@pytest.mark.gpu
def test_gpu_strided_views_and_new_out(rng, compiled):
    """Views with one unit stride (read in place), with none (copied), a strided out,
    and out=None."""
    big = _make(rng, (300, 260), np.float32, "C", cupy)
    A = big[5:205:1, 3:150]  # row-major view, lda = 260 (vector loads off: offset 3)
    Bbig = _make(rng, (450, 90), np.float32, "F", cupy)
    B = Bbig[::3, 1:80][:147]  # neither stride 1: copied
    outbig = cupy.full((500, 200), cupy.nan, dtype=np.float32)
    out = outbig[::2, 1::2][:200, :79]
    C = tsm_core.gemm(A, B, out=out)
    _check(cupy.asnumpy(C), cupy.asnumpy(A), cupy.asnumpy(B), None, 1.0, 0.0, np.float32, "views")
    assert cupy.isnan(outbig[1::2]).all(), "wrote outside the out view"
    C2 = tsm_core.gemm(A, B)
    assert C2.flags.c_contiguous and C2.shape == (200, 79)
    assert cupy.array_equal(C2, C)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("shape", [(131, 45, 257), (257, 203, 130), (1, 37, 5), (389, 77, 3)],
                         ids=lambda s: "x".join(map(str, s)))
def test_gpu_edge_blocks_read_only_inside_k(rng, compiled, dtype, order, shape):
    """Edge blocks read rows and columns past the matrix from its last one, and a
    vector along m (n) may end in the leading dimension's padding: both only reach C's
    rows and columns past the matrix. Here the operands are views of NaN-bordered
    parents with aligned leading dimensions (vector loads on), so a value read from
    past the matrix along k, or stored from past it along m or n, shows as NaN."""
    m, k, n = shape

    def bordered(rows, cols, o):
        up = lambda x: -(-x // 4) * 4 + 4  # noqa: E731  (a multiple of 4 floats / 2 doubles)
        P = cupy.full((up(rows), up(cols)), cupy.nan, dtype=dtype)
        P = cupy.asfortranarray(P) if o == "F" else P
        V = P[:rows, :cols]
        V[...] = cupy.asarray(rng.standard_normal((rows, cols)).astype(dtype))
        return V

    A, B = bordered(m, k, order[0]), bordered(k, n, order[1])
    for wn in (2, 4) if dtype == np.float32 else (2,):
        out = cupy.full((m, n), cupy.nan, dtype=dtype)
        _launch._launch_gemm(A, B, out, 1.0, 0.0, wn=wn, split=False)
        _check(cupy.asnumpy(out), cupy.asnumpy(A), cupy.asnumpy(B), None, 1.0, 0.0, dtype,
               f"{shape} {order} wn={wn}")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("order", ["C", "F"])
@pytest.mark.parametrize("shape", [(1, 7), (5, 1), (37, 1023), (70001, 3)],
                         ids=lambda s: "x".join(map(str, s)))
def test_gpu_realigned_copy(rng, dtype, order, shape):
    """_realigned: the same values and layout, a leading dimension of whole 16-byte
    vectors, its padding zero (gemm_tiled's edge blocks read it); more rows than a
    grid's y dimension holds (70001)."""
    rows, cols = shape
    X = _make(rng, (rows, cols + 2), dtype, order, cupy)[:, 1:cols + 1]  # ld cols + 2
    Y = _launch._realigned(X, cupy.cuda.get_current_stream())
    assert Y.shape == X.shape and cupy.array_equal(Y, X)
    base = Y.base if Y.base is not None else Y  # the buffer, C-ordered either way
    assert base.flags.c_contiguous and base.data.ptr % 16 == 0
    assert base.shape[1] % _configs.VEC[X.itemsize] == 0
    used = cols if Y.strides[1] == Y.itemsize else rows  # along the buffer's rows
    assert base.shape[1] >= used and (base[:, used:] == 0).all()


@pytest.mark.gpu
def test_gpu_nan_inf_propagate(rng):
    import _ieee

    A = _make(rng, (40, 30), np.float32, "C", cupy)
    B = _make(rng, (30, 20), np.float32, "F", cupy)
    _ieee.plant(A, B)
    C = tsm_core.gemm(A, B)
    _ieee.check(cupy.asnumpy(C), cupy.asnumpy(A), cupy.asnumpy(B), "gemm")


@pytest.mark.gpu
def test_gpu_torch_and_k0(rng):
    torch = pytest.importorskip("torch")
    A = torch.randn(70, 33, device="cuda")
    B = torch.randn(33, 45, device="cuda", dtype=torch.float64)
    C = tsm_core.gemm(A, B)
    assert isinstance(C, torch.Tensor) and C.dtype == torch.float64 and C.is_cuda
    _check(C.cpu().numpy(), A.double().cpu().numpy(), B.cpu().numpy(), None, 1.0, 0.0,
           np.float64, "torch")
    out = cupy.full((4, 5), 3.0, dtype=np.float32)
    tsm_core.gemm(cupy.ones((4, 0), np.float32), cupy.ones((0, 5), np.float32), out=out, beta=2.0)
    assert (out == 6.0).all()


def test_plan_peel_and_realign_rules():
    """Thin last tile rows/columns go to TSM2R strips; the plan costs tiles after it."""
    assert _plan.plan_peel(2049, 2049, 4) == (1, 1)
    assert _plan.plan_peel(2048 + 16, 2048 + 17, 4) == (16, 0)  # 17 > 128 / 8: a tile
    assert _plan.plan_peel(129, 100, 4) == (1, 0)  # n < one tile: nothing to peel
    assert _plan.plan_peel(1025, 1030, 4, (64, 64)) == (1, 6)
    assert _plan.plan_peel(1025, 1025, 8) == (1, 1)  # float64: 64 x 64 tiles
    # 1025 peeled is 16 x 16 small tiles (two per SM): the small tile wins, as at 1024.
    assert _plan.plan_plain(1025, 1025, 4)[0] == _plan.plan_plain(1024, 1024, 4)[0] == "async"
    assert _plan.plan_plain(2049, 2049, 4)[0] == "wide"
    assert _plan.plan_peel(2049, 2048 + 32, 4, _configs.WIDE_TILE) == (1, 32)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("shape", [(2049, 300, 1030), (1025, 1025, 1025), (130, 700, 4097),
                                   (4100, 64, 129), (135, 2000, 136), (2049, 96, 2050),
                                   (2200, 37, 2300), (2051, 37, 2053)],
                         ids=lambda s: "x".join(map(str, s)))
def test_gpu_gemm_peeled_and_realigned(rng, compiled, dtype, order, shape):
    """Shapes whose last tile row/column is thin (TSM2R strips on a second stream) and
    whose leading dimensions are not 16-byte aligned (copied), every order, alpha/beta,
    out C- or F-ordered; the strips must not write outside their part of out."""
    m, k, n = shape
    item = np.dtype(dtype).itemsize
    pm, pn = _plan.plan_peel(m, n, item, _plan._tile_of(*_plan.plan_plain(m, n, item, 132, k), item))
    realign = m * n * k >= _configs.REALIGN_RATIO * (m * k + k * n)
    assert pm or pn or realign, shape
    A = _make(rng, (m, k), dtype, order[0], cupy)
    B = _make(rng, (k, n), dtype, order[1], cupy)
    for alpha, beta in ((1.0, 0.0), (-0.75, 1.25)):
        C0 = _make(rng, (m, n), dtype, "F" if order == "FF" else "C", cupy)
        out = C0.copy(order="A")
        if beta == 0:
            out.fill(cupy.nan)
        C = tsm_core.gemm(A, B, out=out, alpha=alpha, beta=beta)
        assert C is out
        _check(cupy.asnumpy(C), cupy.asnumpy(A), cupy.asnumpy(B), cupy.asnumpy(C0),
               alpha, beta, dtype, f"{shape} {order} a={alpha} b={beta}")
    # The same product twice gives the same bits (no race between strips and tiles).
    C1 = tsm_core.gemm(A, B)
    C2 = tsm_core.gemm(A, B)
    assert cupy.array_equal(C1, C2)


@pytest.mark.gpu
@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("shape", [(1, 1, 1), (127, 129, 131), (129, 8, 257), (300, 1023, 520),
                                   (256, 64, 256), (5, 300, 700)],
                         ids=lambda s: "x".join(map(str, s)))
def test_gpu_wide_tile(rng, compiled, order, shape):
    """The 128 x 256 tile (gemm_tiled, wn = 4) launched directly on edge-heavy shapes."""
    m, k, n = shape
    A = _make(rng, (m, k), np.float32, order[0], cupy)
    B = _make(rng, (k, n), np.float32, order[1], cupy)
    _check_launch(rng, A, B, lambda out, alpha, beta: _launch._launch_gemm(
        A, B, out, alpha, beta, bk=16 if k > 100 else 8, wn=4), f"wide {shape} {order}")


def _check_launch(rng, A, B, launch, what):
    """launch(out, alpha, beta) for every (alpha, beta) of AB and out C- and F-ordered
    (NaN-filled where beta == 0), each result checked against float64 (_check)."""
    m, n = A.shape[0], B.shape[1]
    for alpha, beta in AB:
        for c_order in ("C", "F"):
            C0 = _make(rng, (m, n), np.float32, c_order, cupy)
            out = C0.copy(order=c_order)
            if beta == 0:
                out.fill(cupy.nan)
            launch(out, alpha, beta)
            _check(cupy.asnumpy(out), cupy.asnumpy(A), cupy.asnumpy(B), cupy.asnumpy(C0),
                   alpha, beta, np.float32, f"{what} out {c_order} a={alpha} b={beta}")


def _ws_or_skip():
    if cupy is None or not _launch.ws_ok(4, True, False, 16):
        pytest.skip("gemm_ws runs on compute capability 9.0 devices (sm_90a) only")


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(1, 16, 4), (128, 16, 256), (129, 32, 260), (300, 1024, 520),
                                   (1000, 1008, 1000), (257, 4096, 4), (2049, 48, 1028),
                                   (1, 4, 4), (129, 20, 260), (300, 340, 520), (65, 1001, 8)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("b_order", ["C", "F"])
def test_gpu_gemm_ws(rng, compiled, shape, b_order):
    """gemm_ws (warp-specialized, named barriers) launched directly: rows and columns
    that end inside its 128 x 256 tile, one k-tile, a partial last k-tile (K = 1001:
    views of operands with leading dimension 1004, so that a vector straddles K), B
    contiguous along n or along k, alpha/beta, C- and F-ordered out; the same product
    twice gives the same bits (no race between producer and consumers)."""
    _ws_or_skip()
    m, k, n = shape
    kp = -(-k // 4) * 4  # the parents' k: 16-byte rows
    PA = _make(rng, (m, kp), np.float32, "C", cupy)
    PB = _make(rng, (kp, n), np.float32, b_order, cupy)
    PA[:, k:] = cupy.nan  # past K: must not reach C
    PB[k:] = cupy.nan
    A, B = PA[:, :k], PB[:k]
    _check_launch(rng, A, B, lambda out, alpha, beta: _launch._launch_ws(A, B, out, alpha, beta),
                  f"ws {shape} B {b_order}")
    C1 = cupy.full((m, n), cupy.nan, np.float32)
    C2 = cupy.full((m, n), cupy.nan, np.float32)
    _launch._launch_ws(A, B, C1, 1.0, 0.0)
    _launch._launch_ws(A, B, C2, 1.0, 0.0)
    assert cupy.array_equal(C1, C2)


@pytest.mark.gpu
def test_gpu_gemm_ws_rejects_what_it_cannot_run(rng):
    _ws_or_skip()
    A = _make(rng, (64, 18), np.float32, "C", cupy)  # rows of 18 floats: no 16-byte vectors
    B = _make(rng, (18, 64), np.float32, "C", cupy)
    C = cupy.full((64, 64), cupy.nan, np.float32)
    with pytest.raises(ValueError, match="gemm_ws needs"):
        _launch._launch_ws(A, B, C, 1.0, 0.0)
    assert bool(cupy.isnan(C).all())  # nothing written
    Af = _make(rng, (64, 16), np.float32, "F", cupy)  # A contiguous along m: gemm_pipe's
    B16 = _make(rng, (16, 64), np.float32, "C", cupy)
    with pytest.raises(ValueError, match="gemm_ws needs"):
        _launch._launch_ws(Af, B16, C, 1.0, 0.0)
    assert bool(cupy.isnan(C).all())


@pytest.mark.gpu
@pytest.mark.parametrize("ws", [True, False], ids=["ws", "pipe"])
@pytest.mark.parametrize("order", ["CC", "CF", "FC"])
def test_gpu_gemm_pipe_sizes_either_kernel(rng, compiled, monkeypatch, ws, order):
    """A size the planner gives to gemm_pipe's tile (>= 0.75 of a wave), run by gemm_ws
    (the default on sm_90 where A is contiguous along k) and by gemm_pipe."""
    monkeypatch.setattr(_configs, "WS_PLAIN", ws)
    m, k, n = 1536, 1040, 2304
    A = _make(rng, (m, k), np.float32, order[0], cupy)
    B = _make(rng, (k, n), np.float32, order[1], cupy)
    out = cupy.full((m, n), cupy.nan, np.float32)
    tsm_core.gemm(A, B, out=out)
    _check(cupy.asnumpy(out), cupy.asnumpy(A), cupy.asnumpy(B), None, 1.0, 0.0, np.float32,
           f"planner ws={ws}")


def test_plan_tail_split():
    """Split the last partial wave along k only where it saves a quarter wave or more."""
    assert _plan.plan_tail_split(576, 264, 3072, 8) == (528, 5)  # N = 3072, 128 x 128
    assert _plan.plan_tail_split(200, 132, 2560, 16) == (132, 5)  # N = 2560, wide
    assert _plan.plan_tail_split(200, 132, 300, 16) == (132, 3)  # k allows 4 ranges at most
    assert _plan.plan_tail_split(512, 132, 4096, 16) == (512, 1)  # 116 of 132: keep
    assert _plan.plan_tail_split(128, 132, 2048, 16) == (128, 1)  # no whole wave
    assert _plan.plan_tail_split(528, 264, 4096, 8) == (528, 1)  # whole waves
    assert _plan.plan_tail_split(2048, 132, 8192, 16) == (2048, 1)  # 1/3 of 16 waves: < 5%
    assert _plan.plan_tail_split(576, 264, 40, 8) == (576, 1)  # k too short to split


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("wn", [2, 4])
@pytest.mark.parametrize("order", ["CC", "FC", "CF"])
@pytest.mark.parametrize("shape,split", [((300, 333, 520), (3, 2)), ((129, 1000, 257), (0, 4)),
                                         ((520, 129, 700), (7, 3)), ((1, 64, 1), (0, 2)),
                                         ((520, 260, 700), (7, 3))],
                         ids=["300x333x520", "129x1000x257", "520x129x700", "1x64x1",
                              "520x260x700"])
def test_gpu_split_tail(rng, compiled, dtype, wn, order, shape, split):
    """Forced split-K tails (tiles t1.. as S k-ranges + the reduce kernel), edge tiles,
    a k not a multiple of BK, alpha/beta, C- and F-ordered out. 520 x 260 x 700 has
    16-byte aligned operands: at wn = 4 its whole tiles run on gemm_pipe, the tail on
    gemm_tiled, in the same tile order."""
    if wn == 4 and dtype is np.float64:
        pytest.skip("the wide tile is float32 only")
    m, k, n = shape
    A = _make(rng, (m, k), dtype, order[0], cupy)
    B = _make(rng, (k, n), dtype, order[1], cupy)
    for alpha, beta in ((1.0, 0.0), (0.5, -2.0)):
        for c_order in ("C", "F"):
            C0 = _make(rng, (m, n), dtype, c_order, cupy)
            out = C0.copy(order=c_order)
            if beta == 0:
                out.fill(cupy.nan)
            _launch._launch_gemm(A, B, out, alpha, beta, wn=wn, split=split)
            _check(cupy.asnumpy(out), cupy.asnumpy(A), cupy.asnumpy(B), cupy.asnumpy(C0),
                   alpha, beta, dtype, f"split {split} {shape} {order} wn={wn} out {c_order}")
