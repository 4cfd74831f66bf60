"""tsm_core.strassen: the schedule (CPU), the numpy path, and the fused GPU kernels
against a float64 reference.

Tolerance. Strassen's error bound grows with the levels where the conventional
product's does not (Higham, "Accuracy and Stability of Numerical Algorithms",
Thm. 23.3: a factor about 12 per level in the normwise bound against about 2 for
conventional recursion on the same split). The test allows 12**levels times the
normwise error of plain GEMM on the same data in the same precision (and at least
12**levels k u): enough for honest rounding, while a wrong, missing or doubled
term is off by O(1) in relative terms. Poison: out is NaN-filled first; Strassen
never reads out, so every unwritten element fails.
"""

from __future__ import annotations

import numpy as np
import pytest

import tsm_core
from tsm_core.tiled import configs as _configs
from tsm_core.tiled import kernels as _kernels
from tsm_core.tiled import launch as _launch
from tsm_core.tiled import plan as _plan
from tsm_core.tiled import strassen as _strassen

try:
    import cupy
except ImportError:
    cupy = None


# ------------------------------------------------------------------ schedule (CPU)


@pytest.mark.parametrize("levels", [1, 2])
def test_schedule_is_race_free_and_complete(levels):
    prods = _plan.products(levels)
    assert len(prods) == 7 ** levels
    seen = []
    written = set()
    for rnd in _plan.schedule(levels):
        dests = [blk for p, _ in rnd for _, blk in prods[p][2]]
        assert len(dests) == len(set(dests)), "two products of a round share a C block"
        for p, mask in rnd:
            for t, (_, blk) in enumerate(prods[p][2]):
                assert bool((mask >> t) & 1) == (blk not in written), (p, blk)
        written |= set(dests)
        seen += [p for p, _ in rnd]
    assert sorted(seen) == list(range(7 ** levels))
    f = 1 << levels
    assert written == {(i, j) for i in range(f) for j in range(f)}


@pytest.mark.parametrize("levels", [1, 2])
def test_products_are_the_product(levels):
    """Symbolically: sum over products of C-coef * A-coef * B-coef equals the
    block matrix product's coefficient tensor."""
    f = 1 << levels
    T = np.zeros((f, f, f, f, f, f))  # A(i, l) B(l', j) -> C(i', j')
    for at, bt, ct in _plan.products(levels):
        for ca, (ai, al) in at:
            for cb, (bl, bj) in bt:
                for cc, (ci, cj) in ct:
                    T[ai, al, bl, bj, ci, cj] += ca * cb * cc
    want = np.zeros_like(T)
    for i in range(f):
        for j in range(f):
            for l in range(f):
                want[i, l, l, j, i, j] = 1
    np.testing.assert_array_equal(T, want)


def test_descriptors_in_bounds():
    m, k, n = 96, 64, 80
    sa, sb, sc = (k, 1), (1, k), (n, 1)
    for levels in (1, 2):
        f = 1 << levels
        bs = (m // f, k // f, n // f)
        for sig, descs, va, vb in _plan.plan_strassen(levels, bs, sa, sb, sc, 4):
            for d in descs:
                for t in range(sig[0]):
                    assert 0 <= d[t] <= (m - bs[0]) * k + (k - bs[1])
                for t in range(sig[2]):
                    assert 0 <= d[8 + t] <= (m - bs[0]) * n + (n - bs[2])
                    assert d[20 + t] in (1, -1)


@pytest.mark.parametrize("c_order", ["C", "F"])
def test_hybrid2_plan_is_the_product(rng, c_order):
    """The two-level hybrid's schedule, emulated with numpy: top-level operand sums,
    then bottom-level ones (`_S1` twice, as `_launch_strassen2_hybrid` forms them),
    each product added into C through its descriptor (element offsets, coefficients,
    first-write mask) from `_hybrid2_plan`, on a NaN-filled C of either order."""
    m, k, n = 32, 24, 16
    A, B = rng.standard_normal((m, k)), rng.standard_normal((k, n))
    C = np.full((m, n), np.nan, order=c_order)
    sc = tuple(x // 8 for x in C.strides)
    b1, b2 = (m // 2, k // 2, n // 2), (m // 4, k // 4, n // 4)
    plan = _plan._hybrid2_plan(b2, sc)

    def opsum(X, terms, bs):
        (c0, (r0, k0)), *rest = terms
        Y = _strassen._blk(X, r0, k0, bs).copy()
        assert c0 == 1 and len(rest) <= 1
        for c1, (r1, k1) in rest:
            Y += c1 * _strassen._blk(X, r1, k1, bs)
        return Y

    flat = C.ravel(order="K")  # a view: C's memory in order
    rows, cols = np.meshgrid(np.arange(b2[0]), np.arange(b2[2]), indexing="ij")
    for i, (at1, bt1, _) in enumerate(_plan._S1):
        S, T = opsum(A, at1, b1[:2]), opsum(B, bt1, b1[1:])
        for j, (at2, bt2, _) in enumerate(_plan._S1):
            M = opsum(S, at2, b2[:2]) @ opsum(T, bt2, b2[1:])
            nc, d = plan[7 * i + j]
            for t in range(nc):
                idx = d[8 + t] + rows * sc[0] + cols * sc[1]
                first = (d[24] >> t) & 1
                flat[idx] = d[20 + t] * M + (0 if first else flat[idx])
    np.testing.assert_allclose(C, A @ B, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("shape", [(32, 24, 16), (16, 16, 40), (24, 8, 8)])
def test_scratch1_plan_is_the_product(rng, shape):
    """One level with C as scratch (`plan_strassen1_scratch`), emulated with numpy on
    flat memory as the kernels see it: the B sums into C's blocks first, then every
    launch's descriptors (A terms, B from B or from C, C blocks, coefficients,
    first-write mask) in order, on a NaN-filled row-major C; K <= M."""
    m, k, n = shape
    A, B = rng.standard_normal((m, k)), rng.standard_normal((k, n))
    C = np.full((m, n), np.nan)
    bs = (m // 2, k // 2, n // 2)
    ms, ks, ns = bs
    sums, plan = _plan.plan_strassen1_scratch(bs, (k, 1), (n, 1), (n, 1), 1)
    assert [L[4] for L in plan] == [True, False, False, False]  # B from C in the first round only
    for bt, (i, j) in sums:
        T = sum(c * _strassen._blk(B, r, q, (ks, ns)) for c, (r, q) in bt)
        C[i * ms:i * ms + ks, j * ns:(j + 1) * ns] = T
    fa, fb, fc = A.ravel(), B.ravel(), C.ravel()
    ra, ca = np.meshgrid(np.arange(ms), np.arange(ks), indexing="ij")
    rb, cb = np.meshgrid(np.arange(ks), np.arange(ns), indexing="ij")
    rc, cc = np.meshgrid(np.arange(ms), np.arange(ns), indexing="ij")
    for (na, nb, nc), descs, va, vb, in_c in plan:
        Ms = []
        for d in descs:  # a launch's products read before any writes (disjoint C blocks)
            X = sum(d[12 + t] * fa[d[t] + ra * k + ca] for t in range(na))
            src, ld = (fc, n) if in_c else (fb, n)
            Y = sum(d[16 + t] * src[d[4 + t] + rb * ld + cb] for t in range(nb))
            Ms.append(X @ Y)
        for d, M in zip(descs, Ms):
            for t in range(nc):
                idx = d[8 + t] + rc * n + cc
                first = (d[24] >> t) & 1
                fc[idx] = d[20 + t] * M + (0 if first else fc[idx])
    np.testing.assert_allclose(C, A @ B, rtol=1e-12, atol=1e-12)


def test_scratch1_rounds_write_scratch_only_after_reading_it():
    """The blocks of C that hold B sums are first written by a later round than the
    one that reads them, and every round's C blocks are disjoint."""
    readers = {blk: p for p, blk in _configs.SCRATCH1_B.items()}
    round_of = {p: r for r, rnd in enumerate(_configs.SCRATCH1_ROUNDS) for p in rnd}
    assert sorted(round_of) == list(range(7))
    for rnd in _configs.SCRATCH1_ROUNDS:
        dests = [blk for p in rnd for _, blk in _plan._S1[p][2]]
        assert len(dests) == len(set(dests))
    for blk, p in readers.items():
        writers = [q for q in range(7) if any(b == blk for _, b in _plan._S1[q][2])]
        assert min(round_of[q] for q in writers) > round_of[p]


def _rel(C, ref):
    return float(np.linalg.norm(np.asarray(C, np.float64) - ref) / np.linalg.norm(ref))


@pytest.mark.parametrize("levels", [1, 2])
@pytest.mark.parametrize("shape", [(6, 5, 7), (8, 8, 8), (33, 17, 9), (1, 1, 1), (3, 2, 5),
                                   (64, 40, 48), (65, 67, 70)],
                         ids=lambda s: "x".join(map(str, s)))
def test_numpy_path(rng, levels, shape):
    m, k, n = shape
    A = rng.standard_normal((m, k))
    B = np.asfortranarray(rng.standard_normal((k, n)))
    out = np.full((m, n), np.nan)
    C = tsm_core.strassen(A, B, levels=levels, out=out)
    assert C is out
    ref = A @ B
    assert _rel(C, ref) <= 12 ** levels * k * np.finfo(np.float64).eps


# ------------------------------------------------------------------ GPU

# (shape, levels, dtype, orders of A and B). Every order at one level and one size;
# two levels on C order (and F for float64); sizes that peel (odd, or not multiples
# of 2**levels * 4), tiny ones, and ones below one tile per block.
F32, F64 = np.float32, np.float64
GPU_CASES = (
    [((256, 256, 256), L, F32, o) for L in (1, 2) for o in ("CC", "CF", "FC", "FF")]
    + [(s, L, F32, "CC") for L in (1, 2) for s in
       [(1024, 1024, 1024), (130, 66, 98), (131, 67, 97), (8, 8, 8), (17, 9, 33), (3, 3, 3),
        (1, 8, 8), (515, 1030, 259)]]
    + [((131, 67, 97), 1, F32, "FF"), ((515, 1030, 259), 1, F32, "CF")]
    + [(s, L, F64, o) for L in (1, 2) for o in ("CC", "FF")
       for s in [(256, 256, 256), (131, 67, 97)]]
)


def _case_id(c):
    (m, k, n), L, dt, o = c
    return f"{m}x{k}x{n}-L{L}-{np.dtype(dt).name}-{o}"


@pytest.fixture(scope="module")
def compiled():
    """Compile the fused kernels these tests use in parallel, once (CuPy's disk cache)."""
    if cupy is None:
        return
    _kernels.precompile(
        _kernels.instantiations((F32,), plain=False, levels=(1,))
        + _kernels.instantiations((F32,), plain=False, levels=(2,), layouts=((True, False),))
        + _kernels.instantiations((F64,), plain=False, layouts=((True, False), (False, True))))


@pytest.mark.gpu
@pytest.mark.parametrize("case", GPU_CASES, ids=_case_id)
def test_gpu_strassen(rng, compiled, case):
    (m, k, n), levels, dtype, order = case
    a = rng.standard_normal((m, k)).astype(dtype)
    b = rng.standard_normal((k, n)).astype(dtype)
    A = cupy.asarray(a)
    B = cupy.asarray(b)
    A = cupy.asfortranarray(A) if order[0] == "F" else A
    B = cupy.asfortranarray(B) if order[1] == "F" else B
    ref = a.astype(np.float64) @ b.astype(np.float64)
    u = np.finfo(dtype).eps / 2
    e_plain = _rel(cupy.asnumpy(tsm_core.gemm(A, B)), ref)
    for c_order in ("C", "F"):
        out = cupy.full((m, n), cupy.nan, dtype=dtype, order=c_order)
        C = tsm_core.strassen(A, B, levels=levels, out=out)
        assert C is out
        e = _rel(cupy.asnumpy(C), ref)
        assert e <= 12 ** levels * max(e_plain, k * u), (e, e_plain, c_order)


@pytest.mark.gpu
@pytest.mark.parametrize("case", [((256, 256, 256), L, o) for L in (1, 2) for o in ("CC", "FC")]
                         + [((515, 1030, 259), 2, "CC"), ((130, 66, 98), 1, "CC"),
                            ((272, 160, 288), 1, "CC")],
                         ids=lambda c: f"{'x'.join(map(str, c[0]))}-L{c[1]}-{c[2]}")
@pytest.mark.parametrize("mode", ["scratch", "ws", "pipe"])
def test_gpu_strassen_pipe_forced(rng, compiled, monkeypatch, case, mode):
    """gemm_pipe's (ws: gemm_ws's, where it runs; scratch: gemm_ws's with one level's
    C as scratch) fused products and the two-level hybrid (operand sums on a side
    stream, up to four C blocks per product) on sizes where the planner would take
    gemm_tiled (PIPE_MIN_WAVE = 0)."""
    (m, k, n), levels, order = case
    monkeypatch.setattr(_configs, "PIPE_MIN_WAVE", 0)
    monkeypatch.setattr(_configs, "WS_STRASSEN", mode != "pipe")
    monkeypatch.setattr(_configs, "SCRATCH1", mode == "scratch")
    a = rng.standard_normal((m, k)).astype(F32)
    b = rng.standard_normal((k, n)).astype(F32)
    A = cupy.asarray(a, order=order[0])
    B = cupy.asarray(b, order=order[1])
    ref = a.astype(np.float64) @ b.astype(np.float64)
    e_plain = _rel(cupy.asnumpy(tsm_core.gemm(A, B)), ref)
    for overlap, pdl in ((True, True), (False, True), (True, False)):
        monkeypatch.setattr(_configs, "HYBRID2_OVERLAP", overlap)
        monkeypatch.setattr(_configs, "STRASSEN_PDL", pdl)
        out = cupy.full((m, n), cupy.nan, dtype=F32)
        C = tsm_core.strassen(A, B, levels=levels, out=out)
        e = _rel(cupy.asnumpy(C), ref)
        assert e <= 12 ** levels * max(e_plain, k * np.finfo(F32).eps / 2), (e, e_plain, overlap, pdl)


@pytest.mark.gpu
def test_gpu_strassen_torch_and_new_out(rng, compiled):
    torch = pytest.importorskip("torch")
    A = torch.randn(300, 200, device="cuda")
    B = torch.randn(200, 260, device="cuda")
    C = tsm_core.strassen(A, B, levels=2)
    assert isinstance(C, torch.Tensor) and C.shape == (300, 260)
    ref = A.double().cpu().numpy() @ B.double().cpu().numpy()
    assert _rel(C.cpu().numpy(), ref) <= 144 * 200 * 2 ** -24


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("small", [True, False], ids=["beside", "alone"])
def test_gpu_operand_sum(rng, compiled, dtype, small):
    """block_sum through _operand_sum: W = X0 + c X1 over blocks of a strided parent
    (lines not a multiple of the blocks, vectors per line not a multiple of the
    threads), exactly (fma with c = +-1), and the padding of W's lines untouched."""
    v = 16 // np.dtype(dtype).itemsize
    bs = (37, 13 * 4 * v)  # block rows, columns
    x = rng.standard_normal((2 * bs[0], 2 * bs[1] + 4 * v)).astype(dtype)
    X = cupy.asarray(x)[:, :2 * bs[1]]
    for c, (r, k) in ((1, (1, 1)), (-1, (0, 1))):
        W = cupy.full((bs[0], bs[1] + 4 * v), cupy.nan, dtype=dtype)
        out = _strassen._operand_sum(X, [(1, (0, 0)), (c, (r, k))], W[:, :bs[1]], bs, small)
        want = x[:bs[0], :bs[1]] + c * x[r * bs[0]:(r + 1) * bs[0], k * bs[1]:(k + 1) * bs[1]]
        got = cupy.asnumpy(W)
        assert out.data.ptr == W.data.ptr and np.array_equal(got[:, :bs[1]], want)
        assert np.isnan(got[:, bs[1]:]).all()


def test_pdl_structs_match_cuda_h():
    """The ctypes launch config of the PDL launches has cuda.h's layout (x86-64):
    CUlaunchAttribute 72 bytes (an int, padding, a 64-byte union), CUlaunchConfig 56
    with the stream handle at byte 32."""
    import ctypes

    Config, Attr = _launch._pdl_structs()
    assert ctypes.sizeof(Attr) == 72 and Attr.value.offset == 8
    assert ctypes.sizeof(Config) == 56 and Config.hStream.offset == 32
    assert Config.attrs.offset == 40 and Config.numAttrs.offset == 48


@pytest.mark.gpu
def test_gpu_strassen2_without_room_for_the_workspace(rng, compiled, monkeypatch):
    """Where the hybrid's workspace cannot be allocated, two levels run fused (no
    workspace) and give the same product."""
    def no_room(*args, **kwargs):
        raise cupy.cuda.memory.OutOfMemoryError(1 << 40, 0)

    monkeypatch.setattr(_configs, "PIPE_MIN_WAVE", 0)
    a = rng.standard_normal((256, 256)).astype(F32)
    b = rng.standard_normal((256, 256)).astype(F32)
    A, B = cupy.asarray(a), cupy.asarray(b)
    assert _strassen.hybrid2_ok(A, B, A.data.device_id)
    monkeypatch.setattr(_strassen, "_launch_strassen2_hybrid", no_room)
    out = cupy.full((256, 256), cupy.nan, dtype=F32)
    C = tsm_core.strassen(A, B, levels=2, out=out)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    assert _rel(cupy.asnumpy(C), ref) <= 144 * 256 * 2 ** -24
