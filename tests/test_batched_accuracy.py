"""batched_matmul's accuracy against cuBLAS at long K, and the batch of one.

CPU tests: the float32 summation orders of the kernels, emulated with numpy
(``tsm_core.batched.numerics``) on signed random data, show why the 3xTF32 tiles
lost to cuBLAS (the tensor cores' truncating sums into one running total) and that
the kernel's blocked order with round-to-nearest high parts stays within 2x of the
same blocked order in exact float32 arithmetic and of the one running FMA sum of
cuBLAS's SGEMM kernels. GPU tests (marker ``gpu``): the error of every kernel
version and of the automatic choice, against a float64 reference, at most twice
cuBLAS's on the same data for K up to 8192 in both dtypes; a batch of one taken by
one cuBLAS call, also inside a CUDA graph.
"""

import numpy as np
import pytest

import tsm_core
from tsm_core.batched import cost as bc
from tsm_core.batched import numerics as nm
from tsm_core.batched import plan as bp

U32 = 2.0**-24


def _data(M, N, K, seed):
    rng = np.random.default_rng(seed)
    A = rng.standard_normal((M, K)).astype(np.float32)
    B = rng.standard_normal((K, N)).astype(np.float32)
    return A, B, A.astype(np.float64) @ B.astype(np.float64)


def test_tf32_split_is_exact_where_representable():
    # hi + lo reproduces x to within the TF32 rounding of lo: |x - hi - lo| <= 2^-11 |lo|
    # and |lo| <= 2^-10 |x| (truncated hi) or 2^-11 |x| (hi to nearest).
    x = np.random.default_rng(0).standard_normal(10000).astype(np.float32)
    for rn, bound in ((False, 2.0**-10), (True, 2.0**-11)):
        hi, lo = nm.tf32_hi(x, rn), nm.tf32_lo(x, rn)
        lo_exact = x.astype(np.float64) - hi
        assert np.all(np.abs(lo_exact) <= bound * np.abs(x) * (1 + 2.0**-12))
        assert np.all(np.abs(lo - lo_exact) <= 2.0**-11 * np.abs(lo_exact))


def test_mma_model_truncates_toward_zero():
    # 1 + 8 products of 2^-30: below the float32 ulp of 1, every one dropped.
    c = np.array([1.0])
    p = np.full((1, 8), 2.0**-30)
    assert nm.mma_accumulate(c, p)[0] == 1.0
    assert nm.mma_accumulate(-c, -p)[0] == -1.0
    # An exact sum is kept; a sum needing one bit more than float32 loses it toward zero.
    assert nm.mma_accumulate(np.array([3.0]), np.array([[0.25] * 8]))[0] == 5.0
    s = nm.mma_accumulate(np.array([2.0**24 - 1]), np.array([[0.5] + [0.0] * 7]))[0]
    assert s == 2.0**24 - 1


@pytest.mark.parametrize("K", [300, 1024])
def test_running_tc_sums_explain_the_measured_error(K):
    # The order before blocking: the 3xTF32 MMAs into one running total. On signed
    # data its error is several times an FMA loop's and grows faster with K (the H100
    # showed 2-4x cuBLAS's at K = 300 and 12x at K = 4096).
    A, B, ref = _data(24, 24, K, 1)
    old = nm.max_rel_err(nm.tc3_order(A, B), ref)
    fma = nm.max_rel_err(nm.fma_order(A, B), ref)
    assert old > 2.5 * fma


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("K", [128, 300, 1000, 2048])
def test_blocked_tc_order_within_2x_of_the_references(K, seed):
    # The kernel's order now: a fresh partial per k8 step, high parts to nearest.
    # Compared with the same blocking in exact float32 arithmetic, and with one
    # running FMA sum (cuBLAS's SGEMM kernels), on the same data.
    A, B, ref = _data(20, 28, K, seed)
    ours = nm.max_rel_err(nm.tc3_order(A, B, block=1, rn=True), ref)
    blocked = nm.max_rel_err(nm.fma_blocked_order(A, B, 8), ref)
    fma = nm.max_rel_err(nm.fma_order(A, B), ref)
    assert ours <= 2.0 * blocked, (ours / U32, blocked / U32)
    assert ours <= 2.0 * fma, (ours / U32, fma / U32)


def test_blocking_alone_and_rounding_alone():
    # Each change's share: blocking fixes the growth with K, rounding hi to nearest
    # the constant of the split.
    A, B, ref = _data(24, 24, 2048, 3)
    err = {(b, rn): nm.max_rel_err(nm.tc3_order(A, B, block=b, rn=rn), ref)
           for b in (None, 1) for rn in (False, True)}
    assert err[(1, False)] < 0.5 * err[(None, False)]
    assert err[(1, True)] <= err[(1, False)] * 1.25


def test_pairwise_is_the_best_order():
    A, B, ref = _data(16, 16, 1024, 4)
    pw = nm.max_rel_err(nm.pairwise_order(A, B), ref)
    assert pw <= nm.max_rel_err(nm.fma_order(A, B), ref)
    assert pw <= 4 * np.log2(1024) * U32 * np.abs(A).max() * np.abs(B).max() * 1024 / np.abs(
        ref).max()


def test_cublas_route_rule():
    assert bc.cublas_pays([(700, 700, 300)])
    assert bc.cublas_pays([(1, 1, 1)])
    assert not bc.cublas_pays([(0, 5, 5)])  # nothing to compute: the kernel's no-op
    assert not bc.cublas_pays([(4096, 4096, 4096), (16, 16, 16)])
    assert not bc.cublas_pays(np.zeros((0, 3)))


def test_numerics_imports_no_gpu_module():
    import ast
    from pathlib import Path

    tree = ast.parse(Path(nm.__file__).read_text())
    mods = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    mods |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert mods <= {"numpy", "__future__"}, mods


# ------------------------------------------------------------------ the fine rule

def _h100():
    from tsm_core.runtime.device import KNOWN_GPUS

    return KNOWN_GPUS["H100"]


def _plan(shapes, dtype=np.float32, version=1, split_k=None):
    from tsm_core.batched import api as tb

    return tb.plan_batched(shapes, dtype, spec=_h100(), regs=bp.regs_fallback(dtype, version),
                           version=version, split_k=split_k)


def test_fine_rule_splits_unblocked_tiles_with_long_k():
    # Tiles of more than BLOCKED_MAX sums a thread (the 64 x 64 type and larger) with
    # few outputs from K = ACC_MIN_K: chunks of `chunk` k (up to ACC_SPLIT_MAX splits);
    # short K, many outputs: none. Tiles of blocked accumulation (the small types) keep
    # the coarse rule only: their sums are in 64-k blocks already.
    shapes = [(128, 100, 1024), (64, 64, 4096), (100, 64, 8192), (65, 65, 300),
              (600, 600, 1024), (202, 15, 1024), (19, 10, 4096), (2, 24, 8192)]
    types = np.array([4, 4, 4, 4, 4, 0, 0, 1])
    assert bp.blocked_types(types).tolist() == [False] * 5 + [True] * 3
    S = bp.accuracy_splits(shapes, types, chunk=128, area=bp.ACC_SPLIT_AREA).tolist()
    assert S == [8, 32, 64, 1, 1, 1, 4, 8], S
    assert bp.accuracy_splits(shapes, types).tolist() == [1, 4, 8, 1, 1, 1, 4, 8]
    # Versions 5 and 6 block the 64 x 64 tiles of their cp.async ring too: coarse only.
    assert bp.blocked_types(types, version=bp.TC3_VERSION).all()
    S5 = bp.accuracy_splits(shapes, types, chunk=128, area=bp.ACC_SPLIT_AREA, version=bp.TC3_VERSION)
    assert S5.tolist() == [1, 4, 8, 1, 1, 1, 4, 8]


@pytest.mark.parametrize("version", [1, 3, 5])
def test_planned_splits_cover_every_tile_once(version):
    # A small batch: Algorithm 1 shrinks its tiles to blocked types, which take the
    # coarse rule and the speed rule only; the tile list holds every chunk of every
    # output tile once.
    shapes = [(202, 15, 1024), (10, 4, 1024), (19, 10, 4096), (2, 24, 8192), (100, 100, 512),
              (128, 128, 2048), (65, 55, 300), (300, 200, 1024)]
    p = _plan(shapes, version=version)
    assert bp.blocked_types(p.types).all()
    coarse = bp.accuracy_splits(shapes, p.types)
    assert (p.splits >= coarse).all()
    counts = np.bincount(p.tiles[:, 0], minlength=len(shapes))
    assert (counts == bp.tile_counts(p.shapes[:, 0], p.shapes[:, 1], p.types) * p.splits).all()


def test_fine_rule_off_with_split_k_off_and_on_version_2():
    shapes = [(202, 15, 1024), (19, 10, 4096)]
    assert (_plan(shapes, split_k=False).splits == 1).all()
    assert (_plan(shapes, np.float64, version=2).splits == 1).all()


def test_fine_rule_coarsens_where_the_gpu_is_full():
    # 2000 small problems fill the GPU for waves: chunks of 64 would add a tile's fixed
    # cost 15 times per output tile, so the rule takes a longer chunk or none, within
    # ACC_COST_TOL of the coarse plan's modelled time.
    shapes = [(16, 16, 1024)] * 2000
    p = _plan(shapes)
    assert p.splits.max() < 16
    s = p.shapes
    base = bp.split_time(s, p.types, np.ones(len(s), np.int64), p.residency, version=1)
    assert bp.split_time(s, p.types, p.splits, p.residency, version=1) <= base * (
        1 + bp.ACC_COST_TOL)


def test_wave_makespan_matches_list_scheduling():
    rng = np.random.default_rng(0)
    for T, slots in ((50, 396), (5000, 396), (3001, 132)):
        cost = np.repeat(rng.uniform(1, 30, T // 10 + 1), 10)[:T]
        ref = bc.schedule(-np.sort(-cost), slots)[1].max()
        assert bp.wave_makespan(cost, slots) == pytest.approx(ref, rel=0.02)


def test_fine_rule_not_slower_by_the_cost_model():
    # cost.plan_cost (fitted to H100 times) of the plans the call would choose from,
    # with the fine rule against without it, within ACC_COST_TOL: the bench's accuracy
    # batches (K up to 8192, a few problems, the GPU mostly idle) and the paper's sweep
    # (K <= 512), whose geomean must not grow.
    from tsm_core.bench import _batched as bb

    def ratio(shapes, versions=(1, 3, 5)):
        new = {v: bc.plan_cost(_plan(shapes, version=v)) for v in versions}
        saved, bp.ACC_FINE_CHUNKS = bp.ACC_FINE_CHUNKS, ()
        try:
            old = {v: bc.plan_cost(_plan(shapes, version=v)) for v in versions}
        finally:
            bp.ACC_FINE_CHUNKS = saved
        return min(new.values()) / min(old.values())

    rng = np.random.default_rng(0)
    for K in bb.ACC_K:
        assert ratio(bb.accuracy_shapes(K, rng)) <= 1 + bp.ACC_COST_TOL + 1e-9, K
    irregular = pytest.importorskip("tsm_datasets.irregular")
    r = np.array([ratio(c[-1]) for c in irregular.cells(0)])
    # (the geomean within 0.5%: the rule now splits only the sweep's few unblocked tiles)
    assert r.max() <= 1 + bp.ACC_COST_TOL + 1e-9 and np.exp(np.log(r).mean()) <= 1.005


@pytest.mark.parametrize("shape", [(202, 15, 1024), (10, 4, 1024), (19, 10, 4096),
                                   (65, 55, 8192)])
def test_emulated_ratio_with_the_planned_chunks(shape):
    # A lone problem on tiles of blocked accumulation: its planned splits, each chunk
    # summed in 64-k blocks, against the model of cuBLAS's order (chunks of 64 added in
    # order; numerics.CUBLAS_CHUNK), on the bench's 48 x 48 samples: within 2x with
    # margin; one running sum over 1024-k chunks was not.
    p = _plan([shape])
    assert bp.blocked_types(p.types).all()
    S = int(p.splits[0])
    M, N, K = shape
    chunk = -(-K // S)
    blocked = nm.split_ratios(M, N, K, chunks=(chunk,), seeds=4,
                              order=lambda a, b: nm.fma_blocked_order(a, b, block=64))
    plain = nm.split_ratios(M, N, K, chunks=(1024,), seeds=4)
    assert np.median(blocked[chunk]) <= 1.25 and blocked[chunk].max() <= 1.75, blocked[chunk]
    assert plain[1024].max() > 2.0, plain[1024]


def test_cublas_model_is_split_order_of_64():
    A, B, ref = _data(10, 6, 640, 0)
    assert np.array_equal(nm.cublas_split_order(A, B), nm.split_order(A, B, 10, align=1))
    assert np.array_equal(nm.split_order(A, B, 1), nm.fma_order(A, B))


def test_float64_routing_to_version_1():
    # float64 with long K and few outputs: version 1 (splits K) where the model finds
    # it at most F64_SPLIT_TOL slower; version 2 (DMMA) for short K, for large outputs,
    # for batches of large products (DMMA's rate), and where split-K is off.
    def settle(shapes, split_k=None):
        plans = {}

        def plan_of(v):
            if v not in plans:
                plans[v] = _plan(shapes, np.float64, version=v, split_k=split_k)
            return plans[v]

        return bc.settle_version(2, shapes, np.float64, plan_of)

    assert settle([(65, 55, 8192)]) == 1
    assert settle([(10, 4, 1024), (300, 300, 300)]) == 1
    assert settle([(100, 100, 512)]) == 1
    assert settle([(65, 55, 300)]) == 2
    assert settle([(600, 600, 1024)]) == 2  # more than ACC_SPLIT_AREA outputs
    assert settle([(300, 300, 2048)]) == 1
    assert settle([(4096, 4096, 4096), (65, 55, 8192)]) == 2  # DMMA's rate
    assert settle([(2048, 2048, 2048)] * 4 + [(65, 55, 8192)]) == 2
    assert settle([(65, 55, 8192)], split_k=False) == 2
    assert bc.f64_wants_split([(65, 55, 8192)]) and not bc.f64_wants_split([(65, 55, 511)])
    assert not bc.f64_wants_split([(600, 600, 8192)])



def test_float64_version_2_keeps_long_k_small_outputs_on_blocked_tiles():
    # Version 2 cannot split K: a float64 problem of long K and few outputs takes
    # tiles no larger than F64_BLOCKED_TOP (blocked accumulation); others keep theirs.
    shapes = [(4096, 4096, 4096), (512, 512, 4096), (161, 135, 4096), (600, 600, 4096),
              (161, 135, 300)]
    p = _plan(shapes, np.float64, version=2)
    assert p.types[0] == 4 and p.types[3] == 4 and p.types[4] == 4
    assert p.types[1] <= bp.F64_BLOCKED_TOP and p.types[2] <= bp.F64_BLOCKED_TOP
    assert bp.TILE_TYPES[bp.F64_BLOCKED_TOP].tm * bp.TILE_TYPES[bp.F64_BLOCKED_TOP].tn \
        // bp.TILE_TYPES[bp.F64_BLOCKED_TOP].threads <= bp.BLOCKED_MAX
    # float32 plans and version 1 are untouched by the rule
    assert _plan(shapes, np.float64, version=1).types[1] == 4


@pytest.mark.parametrize("K", [256, 1024, 4096])
def test_blocked_fma_order_matches_the_cublas_model(K):
    # The blocked FMA tiles sum 64-k blocks joined in order: the order of the model
    # of cuBLAS's split kernels (cublas_split_order), and more accurate than one
    # running sum at long K.
    rng = np.random.default_rng(K)
    A = rng.standard_normal((24, K)).astype(np.float32)
    B = rng.standard_normal((K, 20)).astype(np.float32)
    ref = A.astype(np.float64) @ B.astype(np.float64)
    blocked = nm.max_rel_err(nm.fma_blocked_order(A, B, block=64), ref)
    model = nm.max_rel_err(nm.cublas_split_order(A, B, chunk=64), ref)
    assert blocked <= 1.5 * model and model <= 1.5 * blocked
    if K >= 1024:
        assert blocked < nm.max_rel_err(nm.fma_order(A, B), ref)


# ------------------------------------------------------------------ GPU

cupy = None
if tsm_core.has_gpu():
    import cupy

try:
    import torch
except ImportError:  # pragma: no cover
    torch = None

# Mixed problem sizes around each K (the bench's accuracy sweep draws the same).
SWEEP_K = (64, 256, 1024, 4096, 8192)


def _sweep_shapes(K, rng):
    m = rng.integers(1, 700, size=6)
    n = rng.integers(1, 700, size=6)
    shapes = [(int(a), int(b), int(K)) for a, b in zip(m, n)]
    shapes += [(512, 512, K), (129, 257, K), (1000, 64, K)]
    return shapes


def _errors(shapes, dtype, seed, version=None):
    """(ours, cuBLAS's): max over problems of max|C - ref| / max|ref|, float64 ref."""
    from tsm_core.batched import prepare_batched

    rng = np.random.default_rng(seed)
    As = [rng.standard_normal((m, k)).astype(dtype) for m, n, k in shapes]
    Bs = [rng.standard_normal((k, n)).astype(dtype) for m, n, k in shapes]
    refs = [a.astype(np.float64) @ b.astype(np.float64) for a, b in zip(As, Bs)]
    dA = [cupy.asarray(a) for a in As]
    dB = [cupy.asarray(b) for b in Bs]
    dC = [cupy.full((m, n), np.nan, dtype) for m, n, _ in shapes]
    if version is None:
        tsm_core.batched_matmul(dA, dB, dC)
    else:
        prepare_batched(dA, dB, dC, version=version).run()
    ours = max(nm.max_rel_err(cupy.asnumpy(c), r) for c, r in zip(dC, refs))
    theirs = max(nm.max_rel_err(cupy.asnumpy(cupy.matmul(a, b)), r)
                 for a, b, r in zip(dA, dB, refs))
    return ours, theirs


def _versions(dtype):
    from tsm_core.batched.launch import tensor_cores_ok, wgmma_ok

    vs = [None, 1, 2]
    if dtype == np.float32:
        vs += [3, 4]
        if tensor_cores_ok(cupy.cuda.runtime.getDevice()):
            vs.append(5)
        if wgmma_ok():
            vs.append(6)
    return vs


@pytest.mark.gpu
@pytest.mark.skipif(cupy is None, reason="no GPU")
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("K", SWEEP_K)
def test_gpu_error_within_2x_of_cublas(K, dtype):
    # "No more than twice the error of the reference implementation in the same
    # precision": the automatic choice and every version it may take (float32 1, 3
    # and 5, float64 1 and 2). Versions 4 and 6 and float32's version 2, on request
    # only, are reported, not held to it: none of them splits K, and 6 keeps one
    # running wgmma total per output.
    shapes = _sweep_shapes(K, np.random.default_rng(K))
    worst = {}
    for v in _versions(dtype):
        ours, theirs = _errors(shapes, dtype, seed=K + 1, version=v)
        worst[v] = (ours, theirs)
        if v not in (bp.XL_VERSION, bp.WG3_VERSION) and not (v == 2 and dtype == np.float32):
            # A floor of one unit of round-off (eps = 2u): at K = 64 cuBLAS's worst
            # error over a batch can be a unit or two, where a factor of 2 is chance.
            floor = np.finfo(dtype).eps
            assert ours <= 2 * max(theirs, floor), (v, ours, theirs)
    print(K, np.dtype(dtype).name, {v: round(o / t, 2) for v, (o, t) in worst.items()})


@pytest.mark.gpu
@pytest.mark.skipif(cupy is None, reason="no GPU")
def test_gpu_long_k_problem_inside_a_batch():
    # The measured case: a 4096^3 problem inside a batch (there, 12x cuBLAS's error).
    shapes = [(4096, 4096, 4096), (300, 200, 4096), (700, 700, 300), (33, 17, 8192)]
    ours, theirs = _errors(shapes, np.float32, seed=5)
    assert ours <= 2 * theirs, (ours, theirs)


@pytest.mark.gpu
@pytest.mark.skipif(cupy is None, reason="no GPU")
@pytest.mark.parametrize("alpha,beta", [(1.0, 0.0), (2.0, 0.0), (0.5, -1.0)])
@pytest.mark.parametrize("order", ["C", "F"])
def test_gpu_batch_of_one_takes_cublas(alpha, beta, order):
    from tsm_core.batched import api as tb
    from tsm_core.batched.launch import CublasLaunch

    rng = np.random.default_rng(7)
    A = rng.standard_normal((300, 257)).astype(np.float32)
    B = rng.standard_normal((257, 129)).astype(np.float32)
    C0 = rng.standard_normal((300, 129)).astype(np.float32)
    dA, dB = cupy.asarray(A, order=order), cupy.asarray(B, order=order)
    dC = cupy.asarray(C0, order=order)
    if beta == 0:
        dC.fill(np.nan)  # beta == 0: C is not read
    for _ in range(2):  # the first call resolves, the second hits the cache
        if beta != 0:
            dC[...] = cupy.asarray(C0)
        out = tsm_core.batched_matmul([dA], [dB], [dC], alpha=alpha, beta=beta)
        assert out[0] is dC
        ref = alpha * (A.astype(np.float64) @ B) + beta * C0
        np.testing.assert_allclose(cupy.asnumpy(dC), ref, rtol=1e-4, atol=1e-3)
    key = tb._key([dA], [dB], [dC], "cupy")
    assert isinstance(tb._lru_get(tb._metas, key), CublasLaunch)


@pytest.mark.gpu
@pytest.mark.skipif(cupy is None, reason="no GPU")
def test_gpu_batch_of_one_strided_view_keeps_the_kernel():
    # A view cuBLAS would copy (no unit stride) stays on the batched kernel.
    rng = np.random.default_rng(8)
    A = cupy.asarray(rng.standard_normal((200, 300)).astype(np.float32))[:, ::2]
    B = cupy.asarray(rng.standard_normal((150, 90)).astype(np.float32))
    C = cupy.empty((200, 90), np.float32)
    tsm_core.batched_matmul([A], [B], [C])
    ref = cupy.asnumpy(A).astype(np.float64) @ cupy.asnumpy(B)
    np.testing.assert_allclose(cupy.asnumpy(C), ref, rtol=1e-4, atol=1e-3)


@pytest.mark.gpu
@pytest.mark.skipif(cupy is None or torch is None, reason="no GPU or no torch")
@pytest.mark.parametrize("alpha,beta", [(1.0, 0.0), (-1.5, 0.5)])
def test_gpu_torch_batch_of_one_in_a_cuda_graph(alpha, beta):
    # Through torch.mm / addmm_ on torch's current stream: captured into a CUDA graph,
    # the replay computes new inputs' product.
    g = torch.Generator(device="cuda").manual_seed(0)
    A = torch.randn(257, 300, device="cuda", generator=g)
    B = torch.randn(300, 65, device="cuda", generator=g)
    C = torch.randn(257, 65, device="cuda", generator=g)
    C0 = C.clone()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        tsm_core.batched_matmul([A], [B], [C], alpha=alpha, beta=beta)  # resolve, warm up
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    C.copy_(C0)
    with torch.cuda.graph(graph):
        tsm_core.batched_matmul([A], [B], [C], alpha=alpha, beta=beta)
    A.copy_(torch.randn(257, 300, device="cuda", generator=g))
    C.copy_(C0)
    graph.replay()
    torch.cuda.synchronize()
    ref = alpha * (A.double() @ B.double()) + beta * C0.double()
    torch.testing.assert_close(C.double(), ref, rtol=1e-4, atol=1e-3)


def test_bench_accuracy_helpers(tmp_path):
    # The bench's sampled error and its plot, on the CPU (the sweep itself needs a GPU).
    from tsm_core.bench import _batched as bb

    rng = np.random.default_rng(0)
    shapes = bb.accuracy_shapes(4096, rng)
    assert (4096, 4096, 4096) in shapes and all(s[2] == 4096 for s in shapes)
    assert all(1 <= m <= 1025 and 1 <= n <= 1025 for m, n, _ in shapes[:8])
    A, B, ref = _data(30, 20, 500, 2)
    r, c = np.arange(30), np.arange(20)
    assert bb.sampled_error(ref, A, B, r, c) < 1e-15
    e32 = bb.sampled_error(nm.fma_order(A, B), A, B, r, c)
    assert e32 == pytest.approx(nm.max_rel_err(nm.fma_order(A, B), ref), rel=1e-6)
    doc = dict(environment=dict(gpu="none"),
               rows=[dict(dtype=dt, K=K, versions={"auto": dict(max_ratio=1.0 + K / 1e4),
                                                   "1": dict(max_ratio=1.2)})
                     for dt in ("float32", "float64") for K in bb.ACC_K],
               batch_of_one=[dict(shape=(64, 64, 64), graph_speedup=1.0, call_speedup=0.9)])
    p = bb.plot_accuracy(doc, tmp_path)
    assert p.exists() and p.stat().st_size > 1000
    args = bb.build_parser().parse_args(["--accuracy", "--out", str(tmp_path)])
    assert args.accuracy


def test_accuracy_splits_rule():
    # Long K and few outputs: at least ceil(K / ACC_CHUNK) splits (at most
    # SPLIT_MAX); many outputs or a short K: none asked; a workspace past the cap:
    # none at all.
    from tsm_core.batched import api as tb
    from tsm_core.runtime.device import KNOWN_GPUS

    H100 = KNOWN_GPUS["H100"]
    shapes = [(33, 17, 8192), (300, 200, 4096), (4096, 4096, 4096), (64, 64, 1024),
              (100, 100, 1500), (50, 40, 3000)]
    types = bp.initial_types(*np.array(shapes).T[:2])
    S = bp.accuracy_splits(shapes, types)
    assert list(S) == [8, 4, 1, 1, 2, 3]
    p = tb.plan_batched(shapes * 30, spec=H100, regs=80)  # many waves: no speed splits
    assert (p.splits >= np.tile(S, 30)).all()
    chunks = bp.split_chunk(p.shapes[:, 2], p.splits)
    assert (chunks[p.splits > 1] <= bp.ACC_CHUNK).all()
    assert (tb.plan_batched([(512, 512, 8192)] * 64, spec=H100, regs=80).splits == 1).all()
    assert (tb.plan_batched(shapes, spec=H100, regs=80, version=2).splits == 1).all()


def test_split_order_error_like_its_chunks():
    # The split order (chunks of ACC_CHUNK summed by FMAs, partials added in order)
    # against one running sum: the accuracy split's point, emulated.
    A, B, ref = _data(24, 24, 8192, 6)
    S = 8
    c = 8192 // S
    parts = [nm.fma_order(A[:, i * c:(i + 1) * c], B[i * c:(i + 1) * c]) for i in range(S)]
    tot = parts[0].astype(np.float32)
    for q in parts[1:]:
        tot = (tot + q).astype(np.float32)
    assert nm.max_rel_err(tot, ref) < 0.75 * nm.max_rel_err(nm.fma_order(A, B), ref)


# The problems the H100 measured at 3-10x cuBLAS's error (2026-11-28), each with
# neighbours of one K as the accuracy bench draws them.
WORST = ((202, 15, 1024), (10, 4, 1024), (19, 10, 4096), (2, 24, 8192), (65, 55, 8192))


@pytest.mark.gpu
@pytest.mark.skipif(cupy is None, reason="no GPU")
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", WORST)
def test_gpu_worst_shapes_within_2x_of_cublas_per_problem(shape, dtype):
    """Per problem, our error at most twice cuBLAS's, both floored at 4 ulp of
    max |ref|.

    Error: max |C - ref| / max |ref| on 48 x 48 samples, ref in long double (the
    accuracy bench's measure, ``bench._batched.sampled_error``); cuBLAS:
    ``cupy.matmul`` on the same arrays. The floor: both errors are raised to
    4 * eps * max |ref| (eps = numpy.finfo(dtype).eps, the spacing of 1.0; as a
    relative error, 4 eps), so that sub-ulp noise on small outputs (cuBLAS's error
    there can be a fraction of an ulp) cannot fail the test; above it the factor 2
    holds. The problem shares the launch with the bench's kind of batch (other
    problems of the same K, a 512 x 512 one). The
    512 x 512 problem (the fine rule's second tier, split only where affordable) is
    reported, not held to the factor.
    """
    from tsm_core.batched import api as tb
    from tsm_core.bench import _batched as bb

    M, N, K = shape
    rng = np.random.default_rng(M * 7 + K)
    shapes = [shape, (3, 149, K), (39, 9, K), (512, 512, K)]
    As = [rng.standard_normal((m, k)).astype(dtype) for m, n, k in shapes]
    Bs = [rng.standard_normal((k, n)).astype(dtype) for m, n, k in shapes]
    dA = [cupy.asarray(a) for a in As]
    dB = [cupy.asarray(b) for b in Bs]
    dC = [cupy.full((m, n), np.nan, dtype) for m, n, _ in shapes]
    tsm_core.batched_matmul(dA, dB, dC)
    L = tb._lru_get(tb._metas, tb._key(dA, dB, dC, "cupy"))
    if dtype == np.float64:  # version 1 (splits K) or 2 (blocked tiles for these)
        assert L.version in (1, 2), L.version
    floor = 4 * np.finfo(dtype).eps
    for (m, n, _), a, b, da, db, c in zip(shapes, As, Bs, dA, dB, dC):
        r = rng.choice(m, min(m, 48), replace=False)
        q = rng.choice(n, min(n, 48), replace=False)
        ours = bb.sampled_error(cupy.asnumpy(c), a, b, r, q)
        theirs = bb.sampled_error(cupy.asnumpy(cupy.matmul(da, db)), a, b, r, q)
        print((m, n, K), np.dtype(dtype).name, f"ours {ours:.2e} cuBLAS {theirs:.2e}")
        if m * n <= bp.ACC_FINE_AREA:
            assert max(ours, floor) <= 2 * max(theirs, floor), ((m, n, K), ours, theirs)
