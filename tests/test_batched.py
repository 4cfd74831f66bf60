"""batched_matmul: the tiling algorithm (CPU), the numpy path, errors, and the GPU kernel.

Reference and tolerance. Each problem is compared elementwise with a float64 numpy
product of the same operands (exact products of float32 inputs) under the bound of
tests/test_gpu_tsm2.py: |C - exact| <= gamma_{k+3}(u) (|alpha| |A| |B| + |beta| |C0|)
plus a 1e-6 relative slack for the bound's own float64 rounding; the kernel's
summation depth is K + 2 (one FMA chain over K, then alpha and beta).

Poison. Outputs given with beta == 0 are NaN-filled first: an element the kernel
forgets, or a C it reads although beta == 0, fails (NaN compares false).

GPU tests carry the `gpu` marker and are skipped where no GPU is found.
"""

from __future__ import annotations

import numpy as np
import pytest

import tsm_core
from tsm_core.batched import api as tb
from tsm_core.batched import cost as bc
from tsm_core.batched import plan as bp
from tsm_core.runtime.device import KNOWN_GPUS

H100 = KNOWN_GPUS["H100"]

try:
    import cupy
except ImportError:
    cupy = None
try:
    import torch
except ImportError:
    torch = None


# ------------------------------------------------------------------ helpers


def gamma(k, dtype):
    u = np.finfo(dtype).eps / 2
    j = k + 3
    return j * u / (1 - j * u)


def check_close(C, A, B, alpha=1.0, beta=0.0, C0=None, what=""):
    """C (numpy) against the float64 product, within the rounding bound."""
    A64, B64 = A.astype(np.float64), B.astype(np.float64)
    exact = alpha * (A64 @ B64)
    scale = abs(alpha) * (np.abs(A64) @ np.abs(B64))
    if C0 is not None and beta != 0:
        exact = exact + beta * C0.astype(np.float64)
        scale = scale + abs(beta) * np.abs(C0.astype(np.float64))
    k = A.shape[1]
    bound = (gamma(k, C.dtype) + gamma(k, np.float64)) * scale * (1 + 1e-6) + 1e-300
    err = np.abs(C.astype(np.float64) - exact)
    bad = ~(err <= bound)
    assert not bad.any(), f"{what}: {bad.sum()} of {bad.size} elements off, worst " \
                          f"{np.nanmax(np.where(bad, err, 0))} at bound {bound[bad].min()}"


def shapes_awkward():
    """Odd sizes, primes, 1x1x1, K = 1, empty dimensions, one huge problem among small ones."""
    return [(1, 1, 1), (17, 33, 1), (5, 3, 7), (64, 64, 16), (65, 63, 17), (31, 97, 129),
            (1, 200, 3), (200, 1, 3), (13, 0, 5), (0, 7, 3), (9, 11, 0), (16, 16, 16),
            (1009, 521, 263), (2, 2, 2), (129, 33, 45)]


def make(shapes, dtype, order, rng, xp=np):
    As, Bs = [], []
    for i, (m, n, k) in enumerate(shapes):
        o = order if order != "mixed" else "CF"[i % 2]
        A = np.asarray(rng.standard_normal((m, k)), dtype=dtype, order=o)
        B = np.asarray(rng.standard_normal((k, n)), dtype=dtype, order="CF"[(i // 2) % 2]
                       if order == "mixed" else o)
        As.append(A)
        Bs.append(B)
    return As, Bs


def skip_unless_runs(version):
    """Version 6 (wgmma) runs on compute capability 9.0 only; elsewhere it is refused
    (tested by test_gpu_version6_refused_elsewhere)."""
    if version == bp.WG3_VERSION and not tb.wgmma_ok():
        pytest.skip("version 6 needs compute capability 9.0")


# ------------------------------------------------------------------ tiling (CPU)


def covered_exactly_once(shapes, tiles):
    for p, (m, n, _) in enumerate(shapes):
        cover = np.zeros((m, n), dtype=np.int64)
        for prob, m0, n0, t in tiles[tiles[:, 0] == p]:
            tt = bp.TILE_TYPES[t]
            cover[m0:m0 + tt.tm, n0:n0 + tt.tn] += 1
        assert np.all(cover == 1), f"problem {p} {(m, n)}: coverage {np.unique(cover)}"
        sel = tiles[tiles[:, 0] == p]
        assert np.all(sel[:, 1] < max(m, 1)) and np.all(sel[:, 2] < max(n, 1)), \
            "a tile starts outside its problem"


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_tiles_cover_every_element_once(seed):
    from tsm_datasets.irregular import irregular_shapes

    rng = np.random.default_rng(seed)
    shapes = shapes_awkward() + irregular_shapes(300, 64, 20, seed=seed)
    rng.shuffle(shapes)
    plan = tb.plan_batched(shapes, spec=H100, regs=80, split_k=False)
    covered_exactly_once(shapes, plan.tiles)
    # Every problem with a non-empty C has tiles, the others none.
    for p, (m, n, _) in enumerate(shapes):
        assert (np.sum(plan.tiles[:, 0] == p) > 0) == (m > 0 and n > 0)


def test_tiles_sorted_longest_first():
    shapes = [(64, 64, 10), (300, 300, 500), (16, 16, 3), (100, 40, 200)]
    for split_k in (False, True):
        plan = tb.plan_batched(shapes, spec=H100, regs=80, split_k=split_k)
        t = plan.tiles
        work = [bp.TILE_TYPES[r[3]].tm * bp.TILE_TYPES[r[3]].tn * k for r, k in zip(t, plan.tile_k)]
        assert work == sorted(work, reverse=True)
    assert plan.split_problems  # (300, 300, 500) is split: a few tiles of long K


def test_split_k_chunks_and_coverage():
    """Split-K: every element of a split problem's C lies in S tiles, one per chunk;
    the chunks (multiples of SPLIT_ALIGN, none empty) cover K exactly; the kernel's
    tile words carry type, split index and splits."""
    shapes = [(300, 300, 500), (40, 70, 1000), (16, 16, 3), (1, 1, 33), (64, 64, 129)]
    types = bp.initial_types(*np.array(shapes).T[:2])
    S = bp.settle_splits(np.array(shapes)[:, 2], [2, 7, 1, 3, 5])
    assert list(S) == [2, 7, 1, 3, 5] or S[3] < 3  # 33 in 16-chunks: at most 3
    tiles, ts = bp.build_tiles(np.array(shapes), types, S, with_split=True)
    for p, (m, n, k) in enumerate(shapes):
        sel, tsp = tiles[tiles[:, 0] == p], ts[tiles[:, 0] == p]
        assert (tsp[:, 1] == S[p]).all()
        cover = np.zeros((m, n, S[p]), dtype=np.int64)
        for (_, m0, n0, t), (si, _) in zip(sel, tsp):
            tt = bp.TILE_TYPES[t]
            cover[m0:m0 + tt.tm, n0:n0 + tt.tn, si] += 1
        assert np.all(cover == 1)
        c = int(bp.split_chunk(k, S[p]))
        lens = [min(c, k - i * c) for i in range(S[p])]
        assert c % bp.SPLIT_ALIGN == 0 and min(lens) > 0 and sum(lens) == k
    w = bp.tile_words(tiles, ts)
    assert ((w[:, 3] & 15) == tiles[:, 3]).all()
    split = ts[:, 1] > 1
    assert ((w[split, 3] >> 12) == ts[split, 1]).all() and ((w[split, 3] >> 4) & 255 == ts[split, 0]).all()
    assert (w[~split, 3] >> 4 == 0).all()


def test_split_k_rule():
    """Plans under SPLIT_MAX_WAVES waves of tiles split their longest problems (chunks
    of at least SPLIT_MIN_CHUNK, at most SPLIT_MAX splits), plans past it and
    versions 0, 2 and 4 never; TSM_BATCHED_SPLITK=0 turns it off."""
    few = [(128, 128, 2048)] * 4 + [(64, 64, 100)]
    p = tb.plan_batched(few, spec=H100, regs=80)
    assert p.split_problems == 4 and p.splits[4] == 1
    assert (bp.split_chunk(2048, p.splits[:4]) >= bp.SPLIT_MIN_CHUNK).all()
    assert p.splits.max() <= bp.SPLIT_MAX
    assert "split-K" in p.describe()
    for v in (0, 2, 4):
        assert tb.plan_batched(few, spec=H100, regs=80, version=v).split_problems == 0
    many = [(1024, 1024, 2048)] * 64  # 4096 tiles of 64 x 64: ten waves
    assert tb.plan_batched(many, spec=H100, regs=80).split_problems == 0
    import os

    old = os.environ.get("TSM_BATCHED_SPLITK")
    os.environ["TSM_BATCHED_SPLITK"] = "0"
    try:
        assert tb.plan_batched(few, spec=H100, regs=80).split_problems == 0
    finally:
        if old is None:
            del os.environ["TSM_BATCHED_SPLITK"]
        else:
            os.environ["TSM_BATCHED_SPLITK"] = old


def test_initial_types_fit_and_pad_little():
    """The largest type that fits with <= MAX_PAD padding; else the least padded area."""
    M = np.array([16, 17, 64, 100, 40, 1, 1000, 33, 70])
    N = np.array([16, 17, 64, 100, 1000, 1, 1000, 64, 20])
    types = bp.initial_types(M, N)

    def padded(m, n, u):
        uu = bp.TILE_TYPES[u]
        return -(-m // uu.tm) * uu.tm * (-(-n // uu.tn) * uu.tn)

    def qualifies(m, n, u):
        uu = bp.TILE_TYPES[u]
        return uu.tm <= m and uu.tn <= n and padded(m, n, u) <= bp.MAX_PAD * m * n

    for m, n, t in zip(M, N, types):
        if any(qualifies(m, n, u) for u in range(5)):
            assert qualifies(m, n, t)
            assert not any(qualifies(m, n, u) for u in range(t + 1, 5))
        else:
            assert padded(m, n, t) == min(padded(m, n, u) for u in range(5))
    assert types[6] == 4  # 1000 x 1000: large
    assert types[5] == 0  # 1 x 1: the 16 x 16 tile pads least
    assert types[4] == 3  # 40 x 1000: 32 x 64 (pads 40 rows to 64: 1.64 <= MAX_PAD)
    assert bp.initial_types([130], [130])[0] == 3  # 32 x 64: 160 x 192 pads 1.82
    assert bp.initial_types([100], [1000], top=1)[0] == 1  # capped at `top`


def test_tlp_loop_reaches_threshold_or_smallest():
    """Algorithm 1: a small batch is shrunk until TLP >= threshold or all tiles are small;
    a large batch keeps its large tiles; every step shrinks and never lowers TLP."""
    small = tb.plan_batched([(128, 128, 64)] * 8, spec=H100, regs=80)
    assert len(small.history) > 1
    last_tlp = small.history[-1][1]
    assert last_tlp >= small.threshold or np.all(small.types == 0)
    tl = [h[1] for h in small.history]
    assert tl == sorted(tl)
    big = tb.plan_batched([(1000, 1000, 64)] * 64, spec=H100, regs=80)
    assert len(big.history) == 1 and np.all(big.types == 4)
    assert big.history[0][1] == big.threshold


def test_threshold_follows_the_device():
    """TLP_threshold comes from the SM count and the kernel's registers (one full wave)."""
    p1 = tb.plan_batched([(256, 256, 64)] * 4, spec=H100, regs=80)
    p2 = tb.plan_batched([(256, 256, 64)] * 4, spec=KNOWN_GPUS["V100"], regs=80)
    p3 = tb.plan_batched([(256, 256, 64)] * 4, spec=H100, regs=128)
    assert p1.threshold == 132 * 3 * 8 * 32  # 3 blocks of 8 warps per SM at 80 registers
    assert p2.threshold == 80 * 3 * 8 * 32
    assert p3.threshold == 132 * 2 * 8 * 32
    assert p1.residency.limit == "registers"


def test_residency_like_the_occupancy_calculator():
    r = bp.residency(H100, 80, bp.smem_bytes(np.float32))
    assert r.blocks_per_sm == 3  # 80 regs * 256 threads = 20480 -> 3 of 65536
    r = bp.residency(H100, 32, 100 * 1024)
    assert r.blocks_per_sm == 2 and r.limit == "shared memory"
    r = bp.residency(H100, 16, 1024)
    assert r.blocks_per_sm == 8 and r.limit == "threads"


def test_table3_thread_workloads():
    """Table 3: W_CP and W_DL of the five types (and of versions 3 and 4's two more)."""
    assert [t.outputs_per_thread for t in bp.TILE_TYPES] == [2, 4, 8, 8, 16, 32, 64]
    assert [t.loads_per_thread for t in bp.TILE_TYPES] == [6, 10, 16, 14, 24, 44, 80]
    assert bp.PAPER_TYPES == 5 and bp.top_type(1) == 4 and bp.top_type(3) == 5 and bp.top_type(4) == 6


def test_plan_describe_mentions_steps():
    text = tb.plan_batched([(784, 96, 192), (784, 64, 192)], spec=H100, regs=80).describe()
    assert "Algorithm 1" in text and "step 0" in text and "registers" in text
    assert "2 problems" in text


def test_plan_rejects_bad_sizes():
    with pytest.raises(ValueError, match=">= 0"):
        tb.plan_batched([(3, -1, 2)], spec=H100, regs=80)
    with pytest.raises(TypeError):
        tb.plan_batched([(3, 1, 2)], np.int32, spec=H100, regs=80)


# ------------------------------------------------------------------ numpy path


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("order", ["C", "F", "mixed"])
def test_cpu_path(dtype, order, rng):
    shapes = shapes_awkward()
    As, Bs = make(shapes, dtype, order, rng)
    Cs = tsm_core.batched_matmul(As, Bs)
    assert len(Cs) == len(shapes)
    for i, (A, B, C) in enumerate(zip(As, Bs, Cs)):
        assert C.shape == (A.shape[0], B.shape[1]) and C.dtype == dtype
        check_close(C, A, B, what=f"problem {i}")


def test_cpu_alpha_beta_and_poison(rng):
    shapes = [(7, 5, 3), (16, 16, 16), (3, 9, 1)]
    As, Bs = make(shapes, np.float64, "C", rng)
    C0 = [rng.standard_normal((m, n)) for m, n, _ in shapes]
    Cs = [c.copy() for c in C0]
    out = tsm_core.batched_matmul(As, Bs, Cs, alpha=-0.5, beta=2.0)
    assert all(o is c for o, c in zip(out, Cs))
    for A, B, C, c0 in zip(As, Bs, Cs, C0):
        check_close(C, A, B, -0.5, 2.0, c0)
    Cs = [np.full((m, n), np.nan) for m, n, _ in shapes]
    tsm_core.batched_matmul(As, Bs, Cs, alpha=3.0, beta=0.0)
    for A, B, C in zip(As, Bs, Cs):
        check_close(C, A, B, 3.0)


def test_empty_batch():
    assert tsm_core.batched_matmul([], []) == []
    assert tsm_core.batched_matmul((), (), ()) == []


def test_torch_cpu_comes_back_as_torch(rng):
    torch = pytest.importorskip("torch")
    As, Bs = make([(5, 4, 3), (2, 7, 6)], np.float32, "C", rng)
    Cs = tsm_core.batched_matmul([torch.from_numpy(a) for a in As],
                                 [torch.from_numpy(b) for b in Bs])
    assert all(isinstance(c, torch.Tensor) for c in Cs)
    for A, B, C in zip(As, Bs, Cs):
        check_close(C.numpy(), A, B)


# ------------------------------------------------------------------ errors


def _errs(rng):
    A = rng.standard_normal((4, 3))
    B = rng.standard_normal((3, 5))
    C = np.full((4, 5), 7.0)
    return A, B, C


@pytest.mark.parametrize("case, exc, match", [
    ("lengths", ValueError, "one entry per problem"),
    ("clen", ValueError, "one entry per problem"),
    ("inner", ValueError, "inner dimensions differ"),
    ("cshape", ValueError, r"Cs\[1\] must have shape"),
    ("dtype", TypeError, "same dtype"),
    ("int", TypeError, "float32 and float64"),
    ("ndim", ValueError, "must be 2-D"),
    ("notlist", TypeError, "list or tuple"),
    ("alpha", TypeError, "alpha must be a real"),
    ("overlap", ValueError, "shares? memory"),
    ("cc_overlap", ValueError, "shares? memory"),
    ("kind", TypeError, "same kind"),
    ("readonly", ValueError, "read-only"),
])
def test_errors_change_nothing(case, exc, match, rng):
    A, B, C = _errs(rng)
    A2, B2, C2 = _errs(rng)
    As, Bs, Cs = [A, A2], [B, B2], [C, C2]
    kw = {}
    if case == "lengths":
        Bs = [B]
    elif case == "clen":
        Cs = [C]
    elif case == "inner":
        Bs = [B, rng.standard_normal((4, 5))]
    elif case == "cshape":
        Cs = [C, np.zeros((5, 4))]
    elif case == "dtype":
        As = [A, A2.astype(np.float32)]
    elif case == "int":
        As = [A, A2.astype(np.int64)]
    elif case == "ndim":
        As = [A, A2[None]]
    elif case == "notlist":
        As = np.stack([A, A2])
    elif case == "alpha":
        kw = dict(alpha="2")
    elif case == "overlap":
        Cs = [C, A2[:, :3].copy()]
        Cs[1] = np.empty((4, 5))
        big = np.zeros((4, 10))
        As = [A, big[:, :3]]
        Cs = [C, big[:, 5:]]
        Cs[1] = big[:, 2:7]  # overlaps As[1] (columns 2..4)
    elif case == "cc_overlap":
        big = np.full((4, 8), 7.0)
        Cs = [big[:, :5], big[:, 3:8]]
    elif case == "kind":
        torch = pytest.importorskip("torch")
        Bs = [B, torch.from_numpy(B2)]
    elif case == "readonly":
        C2.flags.writeable = False
    before = [c.copy() if isinstance(c, np.ndarray) else None for c in Cs]
    with pytest.raises(exc, match=match):
        tsm_core.batched_matmul(As, Bs, Cs, **kw)
    for c, b in zip(Cs, before):
        if b is not None:
            np.testing.assert_array_equal(c, b)


# ------------------------------------------------------------------ GPU


def _gpu_case(shapes, dtype, order, rng, alpha=1.0, beta=0.0, backend="cupy"):
    As, Bs = make(shapes, dtype, order, rng)
    C0 = [np.asarray(rng.standard_normal((m, n)), dtype=dtype) for m, n, _ in shapes]
    if backend == "cupy":
        dA = [cupy.asarray(a, order="K") for a in As]
        dB = [cupy.asarray(b, order="K") for b in Bs]
        if beta == 0:
            dC = [cupy.full((m, n), np.nan, dtype=dtype) for m, n, _ in shapes]
        else:
            dC = [cupy.asarray(c) for c in C0]
        out = tsm_core.batched_matmul(dA, dB, dC, alpha=alpha, beta=beta)
        assert all(o is c for o, c in zip(out, dC))
        got = [cupy.asnumpy(c) for c in out]
    else:
        dev = "cuda"
        dA = [torch.from_numpy(np.ascontiguousarray(a)).to(dev) for a in As]
        if order == "F":
            dA = [torch.from_numpy(np.ascontiguousarray(a.T)).to(dev).T for a in As]
        dB = [torch.from_numpy(np.ascontiguousarray(b)).to(dev) for b in Bs]
        if beta == 0:
            dC = [torch.full((m, n), float("nan"), dtype=dA[0].dtype, device=dev)
                  for m, n, _ in shapes]
        else:
            dC = [torch.from_numpy(c).to(dev) for c in C0]
        out = tsm_core.batched_matmul(dA, dB, dC, alpha=alpha, beta=beta)
        torch.cuda.synchronize()
        got = [c.cpu().numpy() for c in out]
    for i, (A, B, C, c0) in enumerate(zip(As, Bs, got, C0)):
        check_close(C, A, B, alpha, beta, c0, what=f"{backend} {order} problem {i} {shapes[i]}")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("order", ["C", "F", "mixed"])
def test_gpu_awkward(dtype, order, rng):
    _gpu_case(shapes_awkward(), dtype, order, rng)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gpu_alpha_beta(dtype, rng):
    _gpu_case(shapes_awkward(), dtype, "mixed", rng, alpha=-1.5, beta=0.75)


@pytest.mark.gpu
@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("cell", [(128, 128, 8), (512, 128, 64), (1024, 256, 32), (256, 512, 256)])
def test_gpu_paper_batches(cell, seed, rng):
    from tsm_datasets.irregular import irregular_shapes

    shapes = irregular_shapes(*cell, seed=seed)
    _gpu_case(shapes, np.float32, "C", rng)


@pytest.mark.gpu
def test_gpu_single_and_tiny(rng):
    for shapes in ([(1, 1, 1)], [(1000, 3, 1)], [(3, 1000, 700)], [(16, 16, 16)] * 300):
        _gpu_case(shapes, np.float32, "F", rng)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gpu_torch(dtype, rng):
    if torch is None:
        pytest.skip("torch not installed")
    _gpu_case(shapes_awkward(), dtype, "C", rng, backend="torch")
    _gpu_case(shapes_awkward(), dtype, "F", rng, alpha=2.0, beta=-1.0, backend="torch")


@pytest.mark.gpu
def test_gpu_repeat_uses_cache_and_new_data(rng):
    """A repeated call (cache hit) computes on the arrays' current contents; new
    arrays of the same layout get a fresh metadata upload."""
    shapes = [(33, 17, 9), (64, 65, 66)]
    As, Bs = make(shapes, np.float32, "C", rng)
    dA = [cupy.asarray(a) for a in As]
    dB = [cupy.asarray(b) for b in Bs]
    dC = [cupy.full((m, n), np.nan, dtype=np.float32) for m, n, _ in shapes]
    tsm_core.batched_matmul(dA, dB, dC)
    for a in dA:
        a *= -2
    tsm_core.batched_matmul(dA, dB, dC)
    for A, B, C in zip(As, Bs, dC):
        check_close(cupy.asnumpy(C), -2 * A, B)
    dA2 = [cupy.asarray(a) for a in As]
    dC2 = [cupy.full((m, n), np.nan, dtype=np.float32) for m, n, _ in shapes]
    tsm_core.batched_matmul(dA2, dB, dC2)
    for A, B, C in zip(As, Bs, dC2):
        check_close(cupy.asnumpy(C), A, B)


@pytest.mark.gpu
def test_gpu_allocated_outputs_and_prepared(rng):
    shapes = shapes_awkward()
    As, Bs = make(shapes, np.float64, "C", rng)
    dA = [cupy.asarray(a) for a in As]
    dB = [cupy.asarray(b) for b in Bs]
    Cs = tsm_core.batched_matmul(dA, dB)
    for A, B, C in zip(As, Bs, Cs):
        assert isinstance(C, cupy.ndarray)
        check_close(cupy.asnumpy(C), A, B)
    dC = [cupy.full((m, n), np.nan) for m, n, _ in shapes]
    prep = tb.prepare_batched(dA, dB, dC, alpha=2.0)
    for _ in range(2):
        prep.run()
    for A, B, C in zip(As, Bs, dC):
        check_close(cupy.asnumpy(C), A, B, 2.0)


@pytest.mark.gpu
def test_gpu_strided_views(rng):
    """Transposed and sliced views (neither stride 1 in places) run without copies."""
    big = rng.standard_normal((90, 80)).astype(np.float32)
    d = cupy.asarray(big)
    As = [d[::2, 1:40], d.T[:30, :45]]
    Bs = [d[3:42, ::3], d[10:55, 5:25]]
    Cs = [cupy.full((45, 27), np.nan, dtype=np.float32),
          cupy.full((20, 30), np.nan, dtype=np.float32).T]
    tsm_core.batched_matmul(As, Bs, Cs)
    for A, B, C in zip(As, Bs, Cs):
        check_close(cupy.asnumpy(C), cupy.asnumpy(A), cupy.asnumpy(B))


@pytest.mark.gpu
def test_gpu_errors_change_nothing(rng):
    A = cupy.asarray(rng.standard_normal((4, 3)))
    B = cupy.asarray(rng.standard_normal((3, 5)))
    C = cupy.full((4, 5), 7.0)
    with pytest.raises(ValueError, match="inner dimensions"):
        tsm_core.batched_matmul([A, A], [B, B[:2]], [C, C.copy()])
    with pytest.raises(ValueError, match="shares? memory"):
        tsm_core.batched_matmul([A, A], [B, B], [C, C])
    with pytest.raises(TypeError, match="same kind"):
        tsm_core.batched_matmul([A], [cupy.asnumpy(B)], [C])
    assert bool(cupy.all(C == 7.0))


@pytest.fixture(params=["native", "python"])
def torch_path(request, monkeypatch):
    """The torch call's fast path under test: the C++ one (batched/fastpath.cpp; skipped
    where it cannot be built), or the Python identity key with CuPy's launch."""
    if torch is None:
        pytest.skip("torch not installed")
    if request.param == "native" and tb._native() is None:
        pytest.skip("the C++ fast path is not built here")
    prev = tb._use_native(tb._native() if request.param == "native" else None)
    yield request.param
    tb._use_native(prev)


@pytest.mark.gpu
def test_gpu_torch_fast_path_sees_inplace_changes(torch_path, rng):
    """Repeated torch batches take the fast path (C++ records, or identity + _version +
    pointer in Python); an in-place transpose, new data and a replaced tensor are all
    seen, and in C++ also `t.data = t.t()` (same pointer, no version bump)."""
    shapes = [(40, 40, 40), (17, 9, 33)]
    As, Bs = make(shapes, np.float32, "C", rng)
    dA = [torch.from_numpy(a).cuda() for a in As]
    dB = [torch.from_numpy(b).cuda() for b in Bs]
    dC = [torch.empty(m, n, device="cuda") for m, n, _ in shapes]
    for _ in range(3):
        tsm_core.batched_matmul(dA, dB, dC)
    if torch_path == "native":
        assert tb._NATIVE[0].size() >= 1
    dA[0].t_()  # same object, same pointer, transposed strides
    dA[1].mul_(-1.0)
    tsm_core.batched_matmul(dA, dB, dC)
    torch.cuda.synchronize()
    check_close(dC[0].cpu().numpy(), As[0].T, Bs[0])
    check_close(dC[1].cpu().numpy(), -As[1], Bs[1])
    dB[1] = torch.from_numpy(Bs[1] * 2).cuda()  # a new tensor in the same slot
    tsm_core.batched_matmul(dA, dB, dC)
    torch.cuda.synchronize()
    check_close(dC[1].cpu().numpy(), -As[1], 2 * Bs[1])
    if torch_path == "native":
        dA[0].data = dA[0].t()  # back to A0's layout: same pointer, no version bump
        for c in dC:
            c.fill_(float("nan"))
        tsm_core.batched_matmul(dA, dB, dC, alpha=-1.0)
        torch.cuda.synchronize()
        check_close(dC[0].cpu().numpy(), As[0], Bs[0], -1.0)
        check_close(dC[1].cpu().numpy(), -As[1], 2 * Bs[1], -1.0)


@pytest.mark.gpu
def test_gpu_torch_fast_path_follows_the_current_stream(torch_path, rng):
    """A repeated call inside ``torch.cuda.stream(s)`` launches on s: queued behind a
    sleep and a NaN fill on s, its results are right (launched on the default stream
    it would run first, and the fill would overwrite it). On the C++ path, the
    device and stream `call` reads (through c10 where enabled) are torch's."""
    shapes = [(70, 33, 129), (9, 64, 17), (128, 128, 256)]
    As, Bs = make(shapes, np.float32, "C", rng)
    dA = [torch.from_numpy(a).cuda() for a in As]
    dB = [torch.from_numpy(b).cuda() for b in Bs]
    dC = [torch.empty(m, n, device="cuda") for m, n, _ in shapes]
    tsm_core.batched_matmul(dA, dB, dC)  # planned and remembered
    torch.cuda.synchronize()
    dev = torch.cuda.current_device()
    nat = tb._NATIVE[0] if torch_path == "native" else None
    if nat is not None:
        assert nat.current() == (dev, torch.cuda.current_stream().cuda_stream)
    side = torch.cuda.Stream()
    for rep in range(2):
        with torch.cuda.stream(side):
            if nat is not None:
                assert nat.current() == (dev, side.cuda_stream)
            torch.cuda._sleep(50_000_000)  # GPU cycles: tens of milliseconds
            for c in dC:
                c.fill_(float("nan"))
            tsm_core.batched_matmul(dA, dB, dC, alpha=1.0 + rep)
        side.synchronize()
        for A, B, C in zip(As, Bs, dC):
            check_close(C.cpu().numpy(), A, B, 1.0 + rep, what=f"rep {rep}")
    if nat is not None:
        assert nat.current() == (dev, torch.cuda.current_stream().cuda_stream)


@pytest.mark.gpu
def test_gpu_torch_fast_path_graph_launches(rng):
    """Hits through the C++ path's one-node CUDA graphs (alpha and beta of the first
    hit baked in): repeated calls, another alpha (launched directly), and a call
    captured into a torch CUDA graph (a capturing stream: launched directly, so it is
    captured as a kernel node) whose replay computes new inputs' products."""
    if torch is None or tb._native() is None:
        pytest.skip("the C++ fast path is not built here")
    nat = tb._NATIVE[0]
    before = nat.use_graphs(None)
    nat.use_graphs(True)
    try:
        shapes = [(130, 70, 129), (9, 64, 17), (128, 128, 256), (1, 1, 1)]
        As, Bs = make(shapes, np.float32, "C", rng)
        dA = [torch.from_numpy(a).cuda() for a in As]
        dB = [torch.from_numpy(b).cuda() for b in Bs]
        dC = [torch.empty(m, n, device="cuda") for m, n, _ in shapes]
        for alpha in (0.5, 0.5, 0.5, -2.0, 0.5):
            for c in dC:
                c.fill_(float("nan"))
            tsm_core.batched_matmul(dA, dB, dC, alpha=alpha)
            torch.cuda.synchronize()
            for A, B, C in zip(As, Bs, dC):
                check_close(C.cpu().numpy(), A, B, alpha, what=f"alpha {alpha}")
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            tsm_core.batched_matmul(dA, dB, dC, alpha=0.5)  # a hit on this stream
        torch.cuda.current_stream().wait_stream(s)
        with torch.cuda.graph(g):
            tsm_core.batched_matmul(dA, dB, dC, alpha=0.5)
        A2 = [rng.standard_normal(a.shape).astype(np.float32) for a in As]
        for d, a in zip(dA, A2):
            d.copy_(torch.from_numpy(a))
        for c in dC:
            c.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        for A, B, C in zip(A2, Bs, dC):
            check_close(C.cpu().numpy(), A, B, 0.5, what="replayed capture")
    finally:
        nat.use_graphs(before)


@pytest.mark.gpu
def test_gpu_torch_fast_path_alpha_beta_and_inference_mode(torch_path, rng):
    """Hits pass this call's alpha and beta (float and double kernels); inference
    tensors (no version counter) work on both paths."""
    shapes = [(33, 17, 129), (5, 64, 1), (130, 70, 200)]
    for dtype, tdt in ((np.float32, torch.float32), (np.float64, torch.float64)):
        As, Bs = make(shapes, dtype, "C", rng)
        C0 = [rng.standard_normal((m, n)).astype(dtype) for m, n, _ in shapes]
        with torch.inference_mode():
            dA = [torch.from_numpy(a).cuda() for a in As]
            dB = [torch.from_numpy(b).cuda() for b in Bs]
            dC = [torch.from_numpy(c).cuda() for c in C0]
            for alpha, beta in ((1.0, 0.0), (0.5, 2.0), (-3, 1)):
                for c, c0 in zip(dC, C0):
                    c.copy_(torch.from_numpy(c0))
                tsm_core.batched_matmul(dA, dB, dC, alpha=alpha, beta=beta)
                torch.cuda.synchronize()
                for A, B, C, c0 in zip(As, Bs, dC, C0):
                    check_close(C.cpu().numpy(), A, B, alpha, beta, c0, what=f"{dtype} {alpha} {beta}")
        assert dC[0].dtype == tdt


@pytest.mark.gpu
def test_gpu_torch_prepared_launch(torch_path, rng):
    """A prepared torch batch launched through the C++ fast path or CuPy's binding."""
    shapes = shapes_awkward()
    As, Bs = make(shapes, np.float32, "F", rng)
    dA = [torch.from_numpy(a).cuda() for a in As]
    dB = [torch.from_numpy(b).cuda() for b in Bs]
    dC = [torch.full((m, n), float("nan"), device="cuda") for m, n, _ in shapes]
    prep = tb.prepare_batched(dA, dB, dC, alpha=-0.5)
    for _ in range(2):
        prep.run()
    torch.cuda.synchronize()
    for A, B, C in zip(As, Bs, dC):
        check_close(C.cpu().numpy(), A, B, -0.5)


@pytest.mark.gpu
@pytest.mark.parametrize("version", bp.VERSIONS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gpu_every_version(version, dtype, rng):
    """Each kernel of the ladder, forced through prepare_batched, on the awkward batch."""
    skip_unless_runs(version)
    shapes = shapes_awkward()
    As, Bs = make(shapes, dtype, "mixed", rng)
    dA = [cupy.asarray(a, order="K") for a in As]
    dB = [cupy.asarray(b, order="K") for b in Bs]
    dC = [cupy.full((m, n), np.nan, dtype=dtype) for m, n, _ in shapes]
    if version in bp.FLOAT32_ONLY and dtype == np.float64:
        with pytest.raises(ValueError, match="float32 only"):
            tb.prepare_batched(dA, dB, dC, version=version)
        assert all(bool(cupy.isnan(c).all()) for c in dC)
        return
    prep = tb.prepare_batched(dA, dB, dC, alpha=0.5, version=version)
    assert prep.plan is not None
    prep.run()
    for i, (A, B, C) in enumerate(zip(As, Bs, dC)):
        check_close(cupy.asnumpy(C), A, B, 0.5, what=f"v{version} problem {i}")


@pytest.mark.gpu
@pytest.mark.parametrize("version,dtype", [(1, np.float32), (1, np.float64), (3, np.float32),
                                           (5, np.float32), (6, np.float32), (None, np.float32)])
def test_gpu_split_k(version, dtype, rng):
    """Split-K on the GPU: a batch of a few problems of long K (edges everywhere,
    K not a multiple of anything) beside short ones; outputs poisoned before each of
    three launches (the counters must be back at zero for the next), results
    bitwise the same each time (the partials are added in split order) and within
    the rounding bound; the same without splitting."""
    skip_unless_runs(version)
    shapes = [(130, 70, 4099), (100, 129, 3000), (33, 17, 2500), (5, 3, 7), (128, 128, 2048),
              (64, 200, 1025)]
    As, Bs = make(shapes, dtype, "mixed", rng)
    dA = [cupy.asarray(a, order="K") for a in As]
    dB = [cupy.asarray(b, order="K") for b in Bs]
    dC = [cupy.full((m, n), np.nan, dtype=dtype) for m, n, _ in shapes]
    prep = tb.prepare_batched(dA, dB, dC, alpha=0.5, version=version)
    assert prep.plan.split_problems >= 3
    first = None
    for _ in range(3):
        for c in dC:
            c.fill(np.nan)
        prep.run()
        got = [cupy.asnumpy(c) for c in dC]
        if first is None:
            first = got
        for a, b in zip(first, got):
            np.testing.assert_array_equal(a, b)
    for i, (A, B, C) in enumerate(zip(As, Bs, first)):
        check_close(C, A, B, 0.5, what=f"split v{version} problem {i}")
    plain = tb.prepare_batched(dA, dB, dC, alpha=0.5, version=version, split_k=False)
    assert plain.plan.split_problems == 0
    for c in dC:
        c.fill(np.nan)
    plain.run()
    for i, (A, B, C) in enumerate(zip(As, Bs, dC)):
        check_close(cupy.asnumpy(C), A, B, 0.5, what=f"unsplit v{version} problem {i}")
    # The public call with beta: C0 read once, by the block that stores.
    C0 = [np.asarray(rng.standard_normal((m, n)), dtype=dtype) for m, n, _ in shapes]
    dC2 = [cupy.asarray(c) for c in C0]
    tsm_core.batched_matmul(dA, dB, dC2, alpha=-1.5, beta=0.75)
    for i, (A, B, C, c0) in enumerate(zip(As, Bs, dC2, C0)):
        check_close(cupy.asnumpy(C), A, B, -1.5, 0.75, c0, what=f"split beta problem {i}")


def wide_shapes():
    """A batch whose version-3 and 4 plans keep 128-row tiles (many large problems,
    edges in M and N, a partial last k step) beside small problems."""
    big = [(1009, 521, 263), (640, 384, 131), (257, 900, 17), (384, 128, 8), (520, 515, 1)]
    return big * 12 + [(33, 31, 19), (1, 1, 1), (200, 1, 3)]


def sweep_shapes():
    """A cell of the paper's sweep (rows up to 1024): version 3, 128 x 64 tiles among
    the paper's five types."""
    from tsm_datasets.irregular import irregular_shapes

    return [tuple(int(v) for v in x) for x in irregular_shapes(1024, 256, 64, seed=0)]


def _auto_version(shapes, dtype=np.float32):
    head = tb.explain_batched(shapes, dtype=dtype).splitlines()[0]
    return int(head.split("kernel version ")[1][0])


def _modelled(shapes, versions):
    return {v: bc.plan_cost(tb.plan_batched(shapes, version=v, spec=H100,
                                            regs=bp.regs_fallback(np.float32, v)))
            for v in versions}


def test_float32_version_choice(monkeypatch):
    """Float32 batches take whichever of versions 1, 3 and 5 has the least modelled
    time (plan_cost); version 3 only where some problem has 128 rows and 64 columns;
    TSM_BATCHED_WIDE=0 / TSM_BATCHED_TC3=0 take 3 / 5 out; float64 never either;
    version 4 only on request."""
    monkeypatch.delenv("TSM_BATCHED_WIDE", raising=False)
    monkeypatch.delenv("TSM_BATCHED_TC", raising=False)
    monkeypatch.delenv("TSM_BATCHED_TC3", raising=False)
    few = [(1024, 512, 64)] + [(64, 64, 1)] * 400  # one large problem among tiny ones
    few5 = [(1024, 1024, 256)] * 2 + [(64, 64, 16)] * 200
    small = [(100, 60, 300)] * 50 + [(17, 130, 9)] * 9  # no problem of 128 x 64
    batches = (wide_shapes(), sweep_shapes(), shapes_awkward(), few, few5, small)
    for shapes in batches:
        t = _modelled(shapes, (1, 3, 5))
        if not any(m >= 128 and n >= 64 for m, n, _ in shapes):
            del t[3]
        assert _auto_version(shapes) == min(t, key=t.get), shapes[:3]
        assert _auto_version(shapes, np.float64) == 2
    # Large tiles pay where the batch is large: 128 x 64 or 128 x 128 tiles; a
    # batch whose work sits in one problem keeps version 1's smaller tiles (a few
    # long blocks would make the launch); one of small problems has no choice.
    assert _auto_version(wide_shapes()) in (3, 5) and _auto_version(sweep_shapes()) in (3, 5)
    assert _auto_version(few) == 1 and _auto_version(few5) == 5
    monkeypatch.setenv("TSM_BATCHED_TC3", "0")
    assert _auto_version(small) == 1
    assert _auto_version(few5) == 3 and _auto_version(wide_shapes()) == 3
    monkeypatch.setenv("TSM_BATCHED_WIDE", "0")
    for shapes in batches:
        assert _auto_version(shapes) == 1
    monkeypatch.delenv("TSM_BATCHED_TC3")
    assert _auto_version(few5) == 5
    # The plans themselves: each version plans only the types its kernel has.
    plan = tb.plan_batched(wide_shapes(), version=3, spec=H100, regs=80)
    assert plan.tiles[:, 3].max() == bp.WIDE_TYPE
    plan4 = tb.plan_batched(wide_shapes(), version=4, spec=H100, regs=127)
    assert bc.plan_type_share(plan4, bp.XL_TYPE) > 0.9
    for v in bp.FLOAT32_ONLY:
        with pytest.raises(ValueError, match="float32 only"):
            tb.plan_batched(wide_shapes(), np.float64, version=v)
    with pytest.raises(ValueError, match="version must be one of"):
        tb.plan_batched(wide_shapes(), version=7)
    for v, top in ((0, 4), (1, 4), (2, 4), (3, 5), (4, 6), (5, 6)):
        assert bp.top_type(v) == top
        assert tb.plan_batched(wide_shapes(), version=v, spec=H100, regs=80).tiles[:, 3].max() <= top
    assert bp.blocks_per_sm_bound(np.float32, 3) == 3 and bp.blocks_per_sm_bound(np.float32, 4) == 2
    assert bp.blocks_per_sm_bound(np.float32, 5) == 2


def test_share_rules():
    """wide_pays and tc3_pays (reported by the bench beside the model's choice):
    enough waves of 128 x 64 / tensor-core 128 x 128 tiles carrying enough work."""
    for shapes in (wide_shapes(), sweep_shapes()):
        plan = tb.plan_batched(shapes, version=3, spec=H100, regs=80)
        assert bc.wide_pays(plan) and bc.plan_type_share(plan, bp.WIDE_TYPE) >= bc.WIDE_MIN_SHARE
        assert bc.tc3_pays(tb.plan_batched(shapes, version=5, spec=H100, regs=128))
    few = [(1024, 512, 64)] + [(64, 64, 1)] * 400
    plan = tb.plan_batched(few, version=3, spec=H100, regs=80)
    assert bc.plan_type_share(plan, bp.WIDE_TYPE) > 0.9 and not bc.wide_pays(plan)
    short_k = [(m, n, min(k, bp.TC_MIN_K - 1)) for m, n, k in wide_shapes()]
    assert not bc.tc3_pays(tb.plan_batched(short_k, version=5, spec=H100, regs=128))
    few5 = [(1024, 1024, 256)] * 2 + [(64, 64, 16)] * 200  # 128 tiles: under two waves
    assert not bc.tc3_pays(tb.plan_batched(few5, version=5, spec=H100, regs=128))


def test_schedule_and_plan_cost():
    """The cost model's scheduler (greedy, in launch order, on identical slots) on a
    hand-worked case, its critical-slot features, and plan_cost's monotony."""
    slot, finish = bc.schedule(np.array([3.0, 2.0, 2.0, 1.0, 0.5]), 2)
    # 3 -> slot 0 (0..3), 2 -> 1 (0..2), 2 -> 1 (2..4), 1 -> 0 (3..4), 0.5 -> 0 (4..4.5)
    assert slot.tolist() == [0, 1, 1, 0, 0] and finish.tolist() == [4.5, 4.0]
    slot, finish = bc.schedule(np.array([1.0]), 4)
    assert slot.tolist() == [0] and finish.tolist() == [1.0, 0, 0, 0]
    base = [(300, 200, 128)] * 40 + [(31, 17, 5)] * 7
    for v in (1, 3, 5):
        regs = bp.regs_fallback(np.float32, v)
        plan = tb.plan_batched(base, version=v, spec=H100, regs=regs)
        theta = np.nan_to_num(np.asarray(bc.TILE_COSTS[v]))
        f = bc.plan_cost_features(plan, theta[:2 * bc.N_COST_CLASSES])
        assert bc.plan_cost(plan) == pytest.approx(f @ theta[:-1] + theta[-1])
        assert f[bc.N_COST_CLASSES:].sum() >= plan.n_tiles / (H100.sm_count * 3)
        longer = tb.plan_batched([(m, n, 2 * k) for m, n, k in base], version=v, spec=H100,
                                 regs=regs)
        more = tb.plan_batched(base * 8, version=v, spec=H100, regs=regs)
        assert bc.plan_cost(longer) > bc.plan_cost(plan) and bc.plan_cost(more) > bc.plan_cost(plan)
        empty = tb.plan_batched([(0, 5, 5)], version=v, spec=H100, regs=regs)
        assert bc.plan_cost(empty) == pytest.approx(bc.TILE_COSTS[v][-1])
        # Every class a version's plans can hold has a cost; the others are NaN.
        top = bp.top_type(v)
        has = list(range(top + 1)) + ([bc.TC3_CLASS] if v == bp.TC3_VERSION else [])
        a = np.asarray(bc.TILE_COSTS[v][:bc.N_COST_CLASSES])
        assert np.isfinite(a[has]).all() and np.isnan(np.delete(a, has)).all()


@pytest.mark.gpu
@pytest.mark.parametrize("order", ["C", "mixed"])
@pytest.mark.parametrize("which", ["xl", "sweep"])
def test_gpu_wide_tiles(which, order, rng):
    """The call's own choice for these batches (3 or 5), then version 5 (128 x 128
    tiles on the tensor cores where K >= 128, the others by cp.async rings) and
    versions 3 (128 x 64 tiles) and 4 (128 x 128 by FMAs) on request, on the GPU:
    poisoned outputs (beta = 0), then beta != 0 over the first result."""
    shapes = wide_shapes() if which == "xl" else sweep_shapes()
    As, Bs = make(shapes, np.float32, order, rng)
    dA = [cupy.asarray(a, order="K") for a in As]
    dB = [cupy.asarray(b, order="K") for b in Bs]
    dC = [cupy.full((m, n), np.nan, dtype=np.float32) for m, n, _ in shapes]
    tsm_core.batched_matmul(dA, dB, dC, alpha=-0.5)
    assert tb.prepare_batched(dA, dB, dC)._launch.version in (bp.WIDE_VERSION, bp.TC3_VERSION)
    for i, (A, B, C) in enumerate(zip(As, Bs, dC)):
        check_close(cupy.asnumpy(C), A, B, -0.5, what=f"{which} auto problem {i}")
        C.fill(np.nan)
    prep = tb.prepare_batched(dA, dB, dC, alpha=-0.5, version=bp.TC3_VERSION)
    assert (prep.plan.tiles[:, 3] == bp.XL_TYPE).any()
    prep.run()
    C0 = [cupy.asnumpy(c) for c in dC]
    for i, (A, B, C) in enumerate(zip(As, Bs, C0)):
        check_close(C, A, B, -0.5, what=f"{which} problem {i}")
    if which == "xl":
        for v, top in ((bp.WIDE_VERSION, 5), (bp.XL_VERSION, 6)):
            for c in dC:
                c.fill(np.nan)
            prep = tb.prepare_batched(dA, dB, dC, alpha=-0.5, version=v)
            assert (prep.plan.tiles[:, 3] == top).any()
            prep.run()
            for i, (A, B, C) in enumerate(zip(As, Bs, dC)):
                check_close(cupy.asnumpy(C), A, B, -0.5, what=f"v{v} problem {i}")
        C0 = [cupy.asnumpy(c) for c in dC]
    tsm_core.batched_matmul(dA, dB, dC, alpha=0.25, beta=-1.5)
    for i, (A, B, C, c0) in enumerate(zip(As, Bs, dC, C0)):
        check_close(cupy.asnumpy(C), A, B, 0.25, -1.5, c0, what=f"{which} beta problem {i}")


@pytest.mark.gpu
@pytest.mark.parametrize("version", bp.VERSIONS)
def test_gpu_output_views_vector_stores(version, rng):
    """Outputs as views into larger buffers, their rows starting at every alignment
    (column offsets 0-3, odd leading dimensions): the epilogues' vector stores (runs
    of 2 or 4 float32 columns where aligned and inside C) must write exactly the
    view, with beta 0 and not; the buffer around each view keeps its poison."""
    skip_unless_runs(version)
    shapes = wide_shapes()  # large tiles of every type, 128 x 128 on the tensor cores
    As, Bs = make(shapes, np.float32, "C", rng)
    dA = [cupy.asarray(a) for a in As]
    dB = [cupy.asarray(b) for b in Bs]
    top = bp.top_type(version)
    for off, extra, beta in ((1, 2, 0.0), (2, 1, -0.5), (3, 0, 0.0), (0, 3, 1.5)):
        parents = [cupy.full((m + 2, n + off + extra), 7.0, dtype=np.float32)
                   for m, n, _ in shapes]
        dC = [p[1:m + 1, off:off + n] for p, (m, n, _) in zip(parents, shapes)]
        C0 = [rng.standard_normal((m, n)).astype(np.float32) for m, n, _ in shapes]
        for c, c0 in zip(dC, C0):
            c[...] = cupy.asarray(c0) if beta else np.nan
        prep = tb.prepare_batched(dA, dB, dC, alpha=-1.25, beta=beta, version=version)
        assert prep.plan.tiles[:, 3].max() == top
        prep.run()
        for i, (A, B, C, c0, p) in enumerate(zip(As, Bs, dC, C0, parents)):
            check_close(cupy.asnumpy(C), A, B, -1.25, beta, c0 if beta else None,
                        what=f"v{version} offset {off} problem {i}")
            around = cupy.asnumpy(p).copy()
            around[1:C.shape[0] + 1, off:off + C.shape[1]] = 7.0
            assert (around == 7.0).all(), f"v{version} offset {off} problem {i}: wrote outside C"


@pytest.mark.gpu
@pytest.mark.parametrize("version", bp.TC3_VERSIONS)
def test_gpu_version5_nonfinite(version, rng):
    """Versions 5 and 6's tensor-core tiles meet Inf and NaN as FMAs do (a tile whose
    sums are not finite is multiplied again with FMAs): the NaN and Inf pattern of
    version 4's FMA tiles of the same plan shape, finite values close to the float64
    product."""
    skip_unless_runs(version)
    shapes = [(512, 512, 160)] * 40 + [(260, 300, 140)] * 8
    As = [rng.standard_normal((m, k)).astype(np.float32) for m, n, k in shapes]
    Bs = [rng.standard_normal((k, n)).astype(np.float32) for m, n, k in shapes]
    As[0][5, 20] = np.inf    # row 5 of C[0]: +-Inf
    Bs[41][130, 7] = np.nan  # column 7 of C[41]: NaN, in the last (partial) slab
    dA = [cupy.asarray(a) for a in As]
    dB = [cupy.asarray(b) for b in Bs]
    outs = []
    for v in (bp.XL_VERSION, version):
        dC = [cupy.full((m, n), 7.0, dtype=np.float32) for m, n, _ in shapes]
        prep = tb.prepare_batched(dA, dB, dC, version=v)
        assert (prep.plan.tiles[:, 3] == bp.XL_TYPE).any()
        prep.run()
        outs.append([cupy.asnumpy(c) for c in dC])
    for i, (c4, c5) in enumerate(zip(*outs)):
        assert np.array_equal(np.isnan(c4), np.isnan(c5)), i
        assert np.array_equal(np.isinf(c4), np.isinf(c5)), i
        assert np.array_equal(np.sign(c4[np.isinf(c4)]), np.sign(c5[np.isinf(c5)])), i
    assert np.isinf(outs[1][0][5]).all() and np.isnan(outs[1][41][:, 7]).all()
    assert not np.isnan(outs[1][41][:, :7]).any()
    for i in (0, 1, 41):
        fin = np.isfinite(outs[1][i])
        with np.errstate(invalid="ignore"):
            ref = As[i].astype(np.float64) @ Bs[i].astype(np.float64)
        scale = np.abs(np.where(np.isfinite(As[i]), As[i], 0)).astype(np.float64) @ \
            np.abs(np.where(np.isfinite(Bs[i]), Bs[i], 0)).astype(np.float64)
        assert (np.abs(outs[1][i][fin] - ref[fin]) <= 1e-5 * scale[fin] + 1e-30).all(), i


@pytest.mark.gpu
def test_gpu_version6_refused_elsewhere(rng, monkeypatch):
    """Version 6 on a device without wgmma: a ValueError naming what it needs, nothing
    written."""
    monkeypatch.setattr(tb, "wgmma_ok", lambda: False)
    A = cupy.asarray(rng.standard_normal((130, 140)).astype(np.float32))
    B = cupy.asarray(rng.standard_normal((140, 150)).astype(np.float32))
    C = cupy.full((130, 150), 7.0, dtype=np.float32)
    with pytest.raises(ValueError, match="compute capability 9.0"):
        tb.prepare_batched([A], [B], [C], version=6)
    assert bool(cupy.all(C == 7.0))


@pytest.mark.gpu
def test_gpu_huge_stride_takes_version0(rng):
    """A row stride >= 2**24 elements would overflow version 1's int offsets: the
    launcher falls back to version 0, and the result is right."""
    big = cupy.asarray(rng.standard_normal((3, bp.V1_MAX_STRIDE + 8), dtype=np.float32))
    A = big[:, 5:25]  # (3, 20), row stride 2**24 + 8
    B = cupy.asarray(rng.standard_normal((20, 7), dtype=np.float32))
    C = cupy.full((3, 7), np.nan, dtype=np.float32)
    prep = tb.prepare_batched([A], [B], [C])
    assert prep._launch.version == 0
    prep.run()
    check_close(cupy.asnumpy(C), cupy.asnumpy(A), cupy.asnumpy(B))
    C2 = cupy.full((3, 7), np.nan, dtype=np.float32)
    tsm_core.batched_matmul([A], [B], [C2])
    check_close(cupy.asnumpy(C2), cupy.asnumpy(A), cupy.asnumpy(B))


def test_version2_choice(monkeypatch):
    """Version 2 (tensor cores) is chosen, where TSM_BATCHED_TC allows, for float64
    batches and for float32 batches with at least half their FLOPs in problems of
    K >= TC_MIN_K with tiles of 32 rows or more; never for strides beyond int offsets."""
    big = [(200, 300, 256), (5, 5, 5)]
    small_k = [(200, 300, bp.TC_MIN_K - 1)]
    assert bc.tc_share(big) > 0.99 and bc.tc_share(small_k) == 0 and bc.tc_share([]) == 0
    assert bc.tc_share([(20, 300, 512)]) == 0  # M < 32: no tile of 32 rows or more
    assert bc.tc_share([(40, 300, 512)]) == 1

    def rows(shapes, stride=1):
        r = np.zeros((len(shapes), bp.META_STRIDE), np.int64)
        r[:, 3:6] = shapes
        r[:, 6:12] = stride
        return r

    monkeypatch.setenv("TSM_BATCHED_TC", "1")
    assert bc.choose_version(rows(big), np.float32) == 2
    assert bc.choose_version(rows(big), np.float64) == 2
    assert bc.choose_version(rows(small_k), np.float64) == 2
    assert bc.choose_version(rows(small_k), np.float32) == bp.DEFAULT_VERSION
    assert bc.choose_version(rows(big, bp.V1_MAX_STRIDE), np.float32) == 0
    monkeypatch.setenv("TSM_BATCHED_TC", "0")
    assert bc.choose_version(rows(big), np.float32) == bp.DEFAULT_VERSION
    assert bc.choose_version(rows(big), np.float64) == bp.DEFAULT_VERSION
    # By default (measured on the H100, 2026-11-23): float64 on DMMA, float32 not.
    monkeypatch.delenv("TSM_BATCHED_TC")
    assert bc.choose_version(rows(big), np.float64) == 2
    assert bc.choose_version(rows(big), np.float32) == bp.DEFAULT_VERSION
    # Version 2's launch bounds: two blocks per SM, which the plan's residency uses.
    assert bp.blocks_per_sm_bound(np.float32, 2) == 2 and bp.blocks_per_sm_bound(np.float32, 1) == 3
    assert bp.smem_bytes(np.float64, 2) == 2 * 2 * bp.BK * 68 * 8
    assert bp.smem_bytes(np.float32, 2) == 2 * 2 * bp.BK * 72 * 4


def test_explain_names_the_version(monkeypatch):
    # The version the call would choose: 2 where TSM_BATCHED_TC allows and, in float32,
    # where the version-2 plan keeps half the FLOPs on the tensor cores (versions 3
    # and 5 off: test_float32_version_choice).
    shapes = [(1009, 521, 263), (600, 300, 200), (500, 400, 150)]
    monkeypatch.setenv("TSM_BATCHED_WIDE", "0")
    monkeypatch.setenv("TSM_BATCHED_TC3", "0")
    monkeypatch.setenv("TSM_BATCHED_TC", "0")
    assert "kernel version 1." in tb.explain_batched(shapes).splitlines()[0]
    monkeypatch.setenv("TSM_BATCHED_TC", "1")
    head = tb.explain_batched(shapes).splitlines()[0]
    assert "kernel version 2 (tiles of 32 rows or more on the tensor cores" in head
    assert bc.plan_tc_share(tb.plan_batched(shapes, version=2)) > 0.9
    assert "kernel version 1." in tb.explain_batched([(784, 96, 64)]).splitlines()[0]  # K < 128
    assert "kernel version 2" in tb.explain_batched([(784, 96, 64)], dtype=np.float64)
    # Shapes that qualify, but whose tiles the planner shrinks below 32 rows.
    small = [(64, 64, 200)] * 4 + [(200, 130, 200)]
    assert bc.tc_share(small) == 1 and bc.plan_tc_share(tb.plan_batched(small, version=2)) == 0
    assert "kernel version 1." in tb.explain_batched(small).splitlines()[0]
    monkeypatch.setenv("TSM_BATCHED_TC", "off")
    assert "kernel version 1." in tb.explain_batched(shapes).splitlines()[0]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gpu_version2_nonfinite_as_version1(dtype, rng):
    """Version 2 gives the same Inf and NaN as version 1: float32 multiplies a slab
    holding one with FMAs, float64's DMMA propagates them as IEEE says; finite values
    within the bound. (The planner gives these problems 32 x 64 tiles: the
    tensor-core path.)"""
    shapes = [(500, 400, 150), (600, 300, 200), (1009, 521, 263)]
    assert set(tb.plan_batched(shapes, dtype, version=2).tiles[:, 3]) <= {3, 4}
    As, Bs = make(shapes, dtype, "C", rng)
    As[0][5, 20] = np.inf
    Bs[1][130, 7] = np.nan
    outs = []
    for version in (1, 2):
        dC = [cupy.full((m, n), 7.0, dtype=dtype) for m, n, _ in shapes]
        tb.prepare_batched([cupy.asarray(a) for a in As], [cupy.asarray(b) for b in Bs], dC,
                           version=version).run()
        outs.append([cupy.asnumpy(c) for c in dC])
    for c1, c2 in zip(*outs):
        assert np.array_equal(np.isnan(c1), np.isnan(c2))
        assert np.array_equal(np.isinf(c1), np.isinf(c2))
    assert np.isinf(outs[1][0][5]).all() and np.isnan(outs[1][1][:, 7]).all()
    assert np.isfinite(outs[1][2]).all()
    check_close(outs[1][2], As[2], Bs[2], what="v2 finite problem")


def test_docstring_examples_run():
    """The Examples sections of the batched module and the generator (numpy, no GPU)."""
    import doctest

    import tsm_datasets.irregular

    for mod in (tb, tsm_datasets.irregular):
        result = doctest.testmod(mod, optionflags=doctest.ELLIPSIS)
        assert result.attempted > 0 and result.failed == 0, mod.__name__


# ------------------------------------------------------------------ layout


def test_planner_and_cost_model_import_no_launcher():
    # plan.py and cost.py are pure: shapes, a DeviceSpec and registers in, a plan or a
    # version out; neither reaches the launcher, the caches or the public API.
    import ast
    from pathlib import Path

    here = Path(bp.__file__).parent
    for name in ("plan.py", "cost.py"):
        tree = ast.parse((here / name).read_text())
        mods = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        mods |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        bad = {m for m in mods if m and (m.split(".")[0] in ("cupy", "torch") or m in (
            "tsm_core.batched.launch", "tsm_core.batched.api", "tsm_core.batched.memo",
            "tsm_core.runtime.compile", "tsm_core.runtime.launch"))}
        assert not bad, f"{name} imports {bad}"


def test_public_names():
    import tsm_core.batched as sub
    from tsm_core.runtime.launch import func_ptr

    for name in ("batched_matmul", "plan_batched", "prepare_batched"):
        assert name in sub.__all__
        assert getattr(sub, name) is getattr(tb, name) is getattr(tsm_core, name)
    assert tb.func_ptr is func_ptr  # tsm_core.tiled imports it from tsm_core.batched.api
