"""Precision modes of the k-means assignment: the margin rule's bound (emulated with
numpy on the CPU, with the tensor cores' TF32 rounding), the routes, and on the GPU
each precision against a float64 evaluation of the same centres."""

import numpy as np
import pytest

from tsm_core.kmeans import configs
from tsm_core.kmeans.tensor import margin

gpu = pytest.mark.gpu


def _tf32_trunc(x):
    """float32 -> TF32 by dropping the low 13 mantissa bits (the MMA's reading)."""
    return (np.asarray(x, np.float32).view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32)


def _tf32_rna(x):
    """float32 -> TF32 rounded to nearest, ties away from zero (cvt.rna.tf32.f32)."""
    u = np.asarray(x, np.float32).view(np.uint32)
    return ((u + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).view(np.float32)


def emulate(X, C, rounded=False):
    """The tensor-core computation of mma.cu in numpy: (labels, best, second, bound);
    `rounded`: x' rounded to nearest TF32 (the TF32 screen), not truncated."""
    mu = C.astype(np.float64).mean(0).astype(np.float32)
    xs = (X.astype(np.float32) - mu).astype(np.float32)
    cs = _tf32_rna((C.astype(np.float64) - mu).astype(np.float32))
    dot = (_tf32_rna(xs) if rounded else _tf32_trunc(xs)) @ cs.T  # float32 accumulation (any order)
    cn = (cs.astype(np.float64) ** 2).sum(1).astype(np.float32)
    D = (cn[None, :] - np.float32(2) * dot).astype(np.float32)
    xx = (xs * xs).sum(1, dtype=np.float32)
    ea, eb = margin(X.shape[1], rounded=rounded)
    cm2 = float(cn.max())
    B = ea * np.sqrt(cm2) * np.sqrt(xx) + eb * cm2
    order = np.argsort(D, axis=1, kind="stable")
    best = D[np.arange(len(D)), order[:, 0]]
    second = D[np.arange(len(D)), order[:, 1]] if D.shape[1] > 1 else np.full(len(D), np.inf)
    return order[:, 0], best, second, B


def exact_labels(X, C):
    D = ((X.astype(np.float64)[:, None, :] - C.astype(np.float64)[None]) ** 2).sum(-1)
    return D.argmin(1), D


def near_tie_data(rng, n, d, k, offset):
    """Centres, and rows of which half lie almost exactly between two centres."""
    C = (rng.standard_normal((k, d)) + offset).astype(np.float32)
    a, b = rng.integers(0, k, n), rng.integers(0, k, n)
    t = 0.5 + rng.uniform(-1e-4, 1e-4, n)[:, None]
    mid = C[a] * t + C[b] * (1 - t)
    X = np.where(rng.random(n)[:, None] < 0.5, mid, C[a] + 0.3 * rng.standard_normal((n, d))).astype(np.float32)
    return X, C


@pytest.mark.parametrize("rounded", [False, True])
@pytest.mark.parametrize("d,k,offset", [(3, 7, 0.0), (64, 50, 0.0), (33, 129, 100.0), (300, 20, -5.0)])
def test_margin_rule_outside_the_bound_labels_are_exact(d, k, offset, rounded):
    rng = np.random.default_rng(d * 1000 + k)
    X, C = near_tie_data(rng, 3000, d, k, offset)
    lab, best, second, B = emulate(X, C, rounded)
    ref, D = exact_labels(X, C)
    certain = second - best > B
    assert certain.sum() > 100 and (~certain).sum() > 10  # both cases occur
    assert (lab[certain] == ref[certain]).all()
    # Where the emulated label is wrong, the rows were flagged (the rule catches them).
    wrong = lab != ref
    assert not (wrong & certain).any()


@pytest.mark.parametrize("rounded", [False, True])
@pytest.mark.parametrize("offset", [0.0, 30.0])
def test_every_emulated_distance_is_within_half_the_bound(offset, rounded):
    """B bounds twice the error of each computed d_j = ||c'_j||^2 - 2 x'.c'_j: check the
    error of every (row, centre) pair against its float64 value, and that TF32 alone
    does get near ties wrong (the rule has work to do). Rows rounded to nearest TF32
    (the TF32 screen) have the smaller bound."""
    rng = np.random.default_rng(5)
    X, C = near_tie_data(rng, 2000, 64, 50, offset)
    mu = C.astype(np.float64).mean(0).astype(np.float32)
    xs = (X.astype(np.float32) - mu).astype(np.float32)
    cs = _tf32_rna((C.astype(np.float64) - mu).astype(np.float32))
    xt = _tf32_rna(xs) if rounded else _tf32_trunc(xs)
    Demu = (cs.astype(np.float64) ** 2).sum(1).astype(np.float32)[None, :] - np.float32(2) * (xt @ cs.T)
    c64 = C.astype(np.float64) - mu
    x64 = X.astype(np.float64) - mu
    Dex = (c64 ** 2).sum(1)[None, :] - 2 * x64 @ c64.T
    _, _, _, B = emulate(X, C, rounded)
    err = np.abs(Demu.astype(np.float64) - Dex).max(1)
    assert (err <= B / 2).all()
    lab = Demu.argmin(1)
    ref, _ = exact_labels(X, C)
    assert (lab != ref).sum() > 0


def _bf16_rn(x):
    """float32 -> bfloat16 rounded to nearest even, as float32 (cvt.rn.bf16x2.f32)."""
    u = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    return r.astype(np.uint32).view(np.float32)


def _split(v):
    hi = _bf16_rn(v)
    return hi, _bf16_rn((v - hi).astype(np.float32))


def emulate_split(X, C):
    """The three-bfloat16-product computation of kmeans_assign_wg<3, ...> in numpy:
    (computed distances, float64 distances of the same shifted values, bound)."""
    d = X.shape[1]
    mu = C.astype(np.float64).mean(0).astype(np.float32)
    xs = (X.astype(np.float32) - mu).astype(np.float32)
    cs = (C.astype(np.float64) - mu).astype(np.float32)
    xh, xl = _split(xs)
    ch, cl = _split(cs)
    # each product exact, float32 sums (numpy's blocked order; the bound allows any)
    dot = (xl @ ch.T).astype(np.float32) + (xh @ cl.T).astype(np.float32) + (xh @ ch.T).astype(np.float32)
    cn = (cs.astype(np.float64) ** 2).sum(1).astype(np.float32)
    D = (cn[None, :] - np.float32(2) * dot.astype(np.float32)).astype(np.float32)
    x64, c64 = xs.astype(np.float64), cs.astype(np.float64)
    Dex = (c64 ** 2).sum(1)[None, :] - 2 * x64 @ c64.T
    ea, eb = margin(d, split=True)
    cm2 = float(cn.max())
    B = ea * np.sqrt(cm2) * np.sqrt((xs * xs).sum(1, dtype=np.float32)) + eb * cm2
    return D, Dex, B


@pytest.mark.parametrize("d,k,offset", [(3, 7, 0.0), (64, 50, 0.0), (128, 60, 30.0), (33, 129, 100.0)])
def test_split_products_within_half_their_bound(d, k, offset):
    """The bfloat16 split: every computed distance within B / 2 of its float64 value;
    the bound is much tighter than TF32's, and labels outside it are exact."""
    rng = np.random.default_rng(d + k)
    X, C = near_tie_data(rng, 2000, d, k, offset)
    D, Dex, B = emulate_split(X, C)
    err = np.abs(D.astype(np.float64) - Dex).max(1)
    assert (err <= B / 2).all()
    assert margin(d, split=True)[0] < margin(d)[0] / 8
    lab = D.argmin(1)
    ref, _ = exact_labels(X, C)
    srt = np.sort(D, axis=1)
    certain = (srt[:, 1] - srt[:, 0] > B) if k > 1 else np.ones(len(D), bool)
    assert certain.sum() > 100
    assert (lab[certain] == ref[certain]).all()


def test_margin_grows_with_d():
    assert margin(4096)[0] > margin(8)[0] > 0
    assert margin(8)[1] > 0


def test_routes_and_precision_resolution():
    assert configs.choose_route(16, 4096, "float32") == "fused"
    assert configs.choose_route(1024, 64, "tf32") == "mma"
    assert configs.choose_route(8, 16, "bfloat16") == "packed"
    assert configs.choose_route(64, 16, "bfloat16") == "mma"
    assert configs.choose_route(1024, 64, "float64") == configs.choose_method(1024, 64)
    assert configs.resolve_precision(None, np.float16) == "float16"
    assert configs.resolve_precision(None, "bfloat16") == "bfloat16"
    with pytest.raises(ValueError, match="float64 rows"):
        configs.resolve_precision("float64", np.float32)
    with pytest.raises(ValueError, match="cannot be computed"):
        configs.resolve_precision("float32", np.float16)
    with pytest.raises(ValueError, match="precision must be one of"):
        configs.resolve_precision("int8", np.float32)


def test_estimator_rejects_unknown_precision():
    from tsm_apps.kmeans import TSMKMeans

    X = np.random.default_rng(0).standard_normal((20, 3))
    with pytest.raises(ValueError, match="precision"):
        TSMKMeans(2, precision="half", device="cpu").fit(X)


def test_mma_configs():
    assert configs.mma_smem() == 3 * 256 * 36 * 4
    assert configs.mma_groups(64, 4096, 4, 1000) == 1  # one centre tile
    assert configs.mma_groups(1024, 128, 4, 10 ** 6) == 1  # short rows: tiles from L2
    assert configs.mma_groups(1024, 4096, 4, 10 ** 5) == 8


def test_ws_rows_check():
    """kmeans_assign_ws copies whole rows in 16-byte units: rows at most ws_rw words
    apart, and the last row's words rounded up to 16 bytes inside X's allocation."""
    from types import SimpleNamespace as NS

    from tsm_core.kmeans.tensor import TensorAssign

    def rows(n, d, itemsize, ld_words, ptr, mem_ptr, mem_size):
        data = NS(ptr=ptr, mem=NS(ptr=mem_ptr, size=mem_size))
        return NS(shape=(n, d), itemsize=itemsize, strides=(ld_words * 4, itemsize), data=data)

    ws = NS(ws_rw=32)
    assert TensorAssign._ws_ldw(ws, rows(100, 32, 4, 32, 1024, 1024, 100 * 128)) == 32
    assert not TensorAssign._ws_ldw(ws, rows(100, 32, 4, 36, 1024, 1024, 100 * 144))  # rows 36 words apart
    # 30 float32 words a row, 32 apart: the last row's copy ends 2 words past its end
    assert TensorAssign._ws_ldw(ws, rows(100, 30, 4, 32, 1024, 1024, 99 * 128 + 128))
    assert not TensorAssign._ws_ldw(ws, rows(100, 30, 4, 32, 1024, 1024, 99 * 128 + 120))
    assert TensorAssign._ws_ldw(ws, rows(1, 5, 2, 0, 1024, 1024, 16)) == 4  # one row of 5 16-bit values
    assert not TensorAssign._ws_ldw(ws, NS(shape=(2, 4), itemsize=4, strides=(16, 4), data=NS(ptr=0)))  # no mem


def test_mma_kernels_compile_without_spills():
    from tsm_core.runtime import compile as _compile

    pytest.importorskip("cupy")
    names = [f"kmeans_assign_mma<{t}, {m}, {configs.MMA_STAGES}>" for t, m in ((0, 0), (0, 1), (1, 0), (2, 0))]
    names += ["kmeans_mma_merge<0>", "kmeans_mma_merge<1>", "kmeans_pair_decide", "kmeans_mma_mu",
              "kmeans_gather_rows", "kmeans_long_center", "kmeans_long_split", "kmeans_long_top<0>",
              "kmeans_long_top<1>", "kmeans_long_top<2>",
              "kmeans_long_sqnorm<1>", "kmeans_long_sqnorm<2>",
              "kmeans_full_decide", "kmeans_exact_mind<0>", "kmeans_exact_mind<1>"]
    names += [f"kmeans_assign_wg<{t}, {m}, {ns}, {configs.WG_STAGES}>" for t, m, ns in
              ((0, 0, 16), (0, 1, 16), (1, 0, 16), (2, 0, 5), (0, 1, 1), (3, 1, 1), (3, 1, 3))]
    names += [f"kmeans_mma_centres<{t}>" for t in (0, 1, 2, 3)]
    # The split products' rows of 64-128 elements hold hi and lo words beside two
    # accumulator sets: ptxas spills up to ~300 bytes there (measured faster than the
    # single TF32 product anyway, docs/lab/kmeans.md); bounded, not zero.
    allowed = {f"kmeans_assign_wg<3, 1, 8, {configs.WG_STAGES}>": 512}
    # The persistent form (TSM_KMEANS_PERSIST), at the ring depths its launcher takes;
    # by default it runs "float32" rows of d <= 64 (t 3, ns 1-4).
    for t, m, ns in ((0, 0, 16), (0, 1, 16), (1, 0, 16), (2, 0, 5), (0, 1, 1), (3, 1, 1), (3, 1, 2), (3, 1, 3),
                     (3, 1, 4), (0, 1, 8)):
        st = configs.wgp_stages(ns, 2 if t == 3 else 1)
        allowed[f"kmeans_assign_wgp<{t}, {m}, {ns}, {st}>"] = 64
    allowed[f"kmeans_assign_wgp<3, 1, 8, {configs.wgp_stages(8, 2)}>"] = 512
    # The warp-specialised form (TSM_KMEANS_WS): 168 registers at launch, the
    # consumers' 240 given by setmaxnreg (the report shows the launch bound).
    for t, m, ns in ((0, 0, 16), (0, 1, 16), (1, 0, 8), (2, 0, 5), (0, 1, 1), (3, 1, 1), (3, 1, 2), (3, 1, 4),
                     (1, 0, 16)):
        allowed[f"kmeans_assign_ws<{t}, {m}, {ns}, {configs.ws_stages(ns, 2 if t == 3 else 1)}>"] = 0
    allowed[f"kmeans_assign_ws<3, 1, 8, {configs.ws_stages(8, 2)}>"] = 64
    # The TF32 screen of "float32" (TSM_KMEANS_SCREEN): its warp-specialised form at
    # the shortest and longest rows (each of these kernels takes seconds to compile).
    for ns in (4, 16):
        allowed[f"kmeans_assign_ws<0, 2, {ns}, {configs.ws_stages(ns)}>"] = 0
    allowed[f"kmeans_assign_ws<0, 1, 16, {configs.ws_stages(16)}>"] = 64
    names += ["kmeans_wg_tiles<1, 8>", "kmeans_wg_tiles<2, 8>", "kmeans_wg_tiles<1, 1>"]
    names += list(allowed)
    for name in names:
        try:
            rep = _compile.compile_report("kmeans_mma", name)
        except (OSError, RuntimeError) as e:  # no NVRTC here
            pytest.skip(f"NVRTC unavailable: {e}")
        assert rep.spill_stores <= allowed.get(name, 0), (name, rep.spill_stores, rep.spill_loads)
        assert rep.registers <= 255


# ------------------------------------------------------------------ GPU


def _f64_check(X, C, lab):
    """Rows whose label differs from float64's where float64's distances differ."""
    import cupy as cp

    X64, C64 = cp.asarray(X, dtype=cp.float64), cp.asarray(C, dtype=cp.float64)
    D = (X64 * X64).sum(1)[:, None] - 2 * X64 @ C64.T + (C64 * C64).sum(1)[None]
    lab = cp.asarray(lab).astype(cp.int64)
    dl = D[cp.arange(len(D)), lab]
    scale = (X64 * X64).sum(1) + (C64 * C64).sum(1).max()
    return int(((dl - D.min(1)) > 1e-12 * scale).sum()), D


@gpu
@pytest.mark.parametrize("n,d,k", [(1, 1, 1), (7, 3, 2), (1000, 3, 7), (5003, 33, 129), (20011, 128, 1024),
                                   (3001, 4096, 300), (4099, 257, 4099), (3000, 8, 65536)])
def test_float32_precision_labels_equal_float64(n, d, k):
    import cupy as cp

    import tsm_core

    rng = np.random.default_rng(n + d + k)
    X, C = near_tie_data(rng, n, d, k, 0.5)
    for method in ("mma", "auto"):
        lab, md = tsm_core.kmeans_assign(cp.asarray(X), cp.asarray(C), precision="float32", method=method)
        bad, D = _f64_check(X, C, lab)
        assert bad == 0
        assert int(((lab < 0) | (lab >= k)).sum()) == 0
        lab2, md2 = tsm_core.kmeans_assign(cp.asarray(X), cp.asarray(C), precision="float32", method=method)
        assert bool((lab == lab2).all()) and bool((md == md2).all())  # deterministic


@gpu
@pytest.mark.parametrize("n,d,k", [(5003, 33, 129), (20011, 128, 1024), (3001, 4096, 300)])
def test_tf32_differs_only_within_the_bound(n, d, k):
    import cupy as cp

    import tsm_core

    rng = np.random.default_rng(7)
    X, C = near_tie_data(rng, n, d, k, 0.5)
    lab, _ = tsm_core.kmeans_assign(cp.asarray(X), cp.asarray(C), precision="tf32")
    _, _, _, B = emulate(X, C)
    ref, D = exact_labels(X, C) if n * k * d < 5e8 else (None, None)
    if ref is None:
        pytest.skip("reference too large")
    lab = cp.asnumpy(lab)
    wrong = np.nonzero(lab != ref)[0]
    gap = D[wrong, lab[wrong]] - D[wrong, ref[wrong]]
    assert (gap <= B[wrong] * 1.01).all()


@gpu
@pytest.mark.parametrize("kind", ["numpy16", "cupy16", "torch16", "torchbf16", "cupy32"])
@pytest.mark.parametrize("prec", ["float16", "bfloat16"])
def test_half_precisions_from_each_array_kind(kind, prec):
    import cupy as cp
    import torch

    import tsm_core

    rng = np.random.default_rng(3)
    X = rng.standard_normal((4099, 40)).astype(np.float32)
    C = X[:37].copy()
    if kind == "torchbf16" and prec == "float16" or kind in ("numpy16", "cupy16", "torch16") and prec == "bfloat16":
        pass  # converted between 16-bit formats: allowed
    if kind == "numpy16":
        Xa, Ca = cp.asarray(X.astype(np.float16)), cp.asarray(C.astype(np.float16))
    elif kind == "cupy16":
        Xa, Ca = cp.asarray(X).astype(cp.float16), cp.asarray(C).astype(cp.float16)
    elif kind == "torch16":
        Xa, Ca = torch.as_tensor(X, device="cuda").half(), torch.as_tensor(C, device="cuda").half()
    elif kind == "torchbf16":
        Xa, Ca = torch.as_tensor(X, device="cuda").bfloat16(), torch.as_tensor(C, device="cuda").bfloat16()
    else:
        Xa, Ca = cp.asarray(X), cp.asarray(C)
    lab, md = tsm_core.kmeans_assign(Xa, Ca, precision=prec)
    lab = lab.cpu().numpy() if hasattr(lab, "cpu") else cp.asnumpy(lab)
    ref, D = exact_labels(X, C)
    assert ((lab >= 0) & (lab < 37)).all()
    assert (lab == ref).mean() > 0.995
    md = md.float().cpu().numpy() if hasattr(md, "cpu") else cp.asnumpy(md)
    assert np.allclose(md, D[np.arange(len(D)), lab], rtol=3e-2, atol=3e-2 * D.mean())


def _rounded(A, prec):
    """A as the kernels see it in `prec` (16-bit precisions round it), float64."""
    if prec == "float16":
        return A.astype(np.float16).astype(np.float64)
    if prec == "bfloat16":
        u = A.astype(np.float32).view(np.uint32)
        return (((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16).astype(np.uint32).view(np.float32).astype(np.float64)
    return A.astype(np.float64)


@gpu
@pytest.mark.parametrize("prec", ["float32", "tf32", "bfloat16", "float16"])
def test_lloyd_precisions_close_to_float64(prec):
    import cupy as cp

    import tsm_core

    rng = np.random.default_rng(11)
    centers = rng.standard_normal((300, 24)) * 4
    X = (centers[rng.integers(0, 300, 60000)] + rng.standard_normal((60000, 24))).astype(np.float32)
    C0 = X[:300].copy()
    # One assignment against float64 on the data as the precision holds it:
    # "float32" labels equal float64's; "tf32" differs on near ties only; 16-bit
    # precisions label the rounded rows by the rounded centres (float32 accumulation:
    # near ties only). One iteration's inertia comes from exact distances.
    Xr, Cr = _rounded(X, prec), _rounded(C0, prec)
    D = (Xr * Xr).sum(1)[:, None] - 2 * Xr @ Cr.T + (Cr * Cr).sum(1)[None]
    lab = cp.asnumpy(tsm_core.kmeans_assign(cp.asarray(X), cp.asarray(C0), precision=prec)[0])
    agree = float((lab == D.argmin(1)).mean())
    _, in64, _, _ = tsm_core.kmeans_lloyd(X.astype(np.float64), C0.astype(np.float64), max_iter=1)
    _, inertia, C, it = tsm_core.kmeans_lloyd(X, C0, max_iter=1, precision=prec)
    assert C.dtype == cp.float32
    if prec == "float32":
        assert agree == 1.0
        assert abs(inertia - in64) <= 1e-6 * in64
    else:
        assert agree > (0.995 if prec == "tf32" else 0.999)
        assert abs(inertia - in64) <= (1e-4 if prec == "tf32" else 1e-2) * in64
    # Separated blobs started one centre per blob (no near ties): every precision
    # finds float64's partition (16-bit centres are means of rounded rows, so only
    # float32 and tf32 also match its inertia); streamed == in memory.
    Xb = (centers[rng.integers(0, 300, 60000)] * 10 + 0.1 * rng.standard_normal((60000, 24))).astype(np.float32)
    Cb = (centers * 10 + 0.05 * rng.standard_normal(centers.shape)).astype(np.float32)
    labb64, inb64, _, _ = tsm_core.kmeans_lloyd(Xb.astype(np.float64), Cb.astype(np.float64), max_iter=30)
    labb, inb, _, itb = tsm_core.kmeans_lloyd(Xb, Cb, max_iter=30, precision=prec)
    assert bool((labb == labb64).all())
    if prec in ("float32", "tf32"):
        assert abs(inb - inb64) <= 1e-6 * inb64
    _, in_s, _, it_s = tsm_core.kmeans_lloyd(Xb, Cb, max_iter=30, precision=prec, max_gpu_memory=4 << 20)
    assert it_s == itb
    assert abs(in_s - inb) <= 1e-6 * inb


@gpu
def test_estimator_precision_on_gpu():
    import cupy as cp

    from tsm_apps.kmeans import TSMKMeans

    rng = np.random.default_rng(2)
    X = rng.standard_normal((20000, 16)).astype(np.float32)
    a = TSMKMeans(300, n_init=1, random_state=0, max_iter=10, precision="float32").fit(cp.asarray(X))
    b = TSMKMeans(300, n_init=1, random_state=0, max_iter=10, precision="bfloat16").fit(cp.asarray(X))
    assert abs(a.inertia_ - b.inertia_) <= 2e-2 * a.inertia_
    with pytest.raises(ValueError, match="float32 X"):
        TSMKMeans(3, precision="tf32").fit(cp.asarray(X.astype(np.float64)))


@gpu
@pytest.mark.parametrize("n,d,k", [(1, 5, 3), (4099, 37, 257), (20011, 128, 1024), (501, 1000, 70)])
def test_full_decision_and_exact_distances(n, d, k):
    """Rows equidistant from many centres go to the full decision (float64
    against every centre, on the GPU); the labels equal float64's, the margin-rule
    counts are kept on the GPU, and the exact distances are those of float64."""
    import cupy as cp

    from tsm_core.kmeans.tensor import TensorAssign

    rng = np.random.default_rng(n + k)
    # Centres on a sphere about x0; half the rows at x0 (every centre within the
    # bound), the others near a centre.
    x0 = 0.25 + 0.1 * rng.standard_normal(d)
    U = rng.standard_normal((k, d))
    C = (x0 + U / np.linalg.norm(U, axis=1, keepdims=True)).astype(np.float32)
    near = C[rng.integers(0, k, n)] + 0.3 * rng.standard_normal((n, d))
    X = np.where(rng.random(n)[:, None] < 0.5, x0 + 1e-6 * rng.standard_normal((n, d)), near).astype(np.float32)
    from tsm_core.kmeans.tensor import aligned_copy, ready

    Xg, Cg = cp.asarray(X), cp.asarray(C)
    if not ready(Xg):
        Xg = aligned_copy(Xg)  # the mma.sync kernel's 16-byte copies (as its callers do)
    tc = TensorAssign(n, d, k, "float32")
    tc.prepare(Cg)
    labels = cp.full(n, -7, dtype=cp.int32)
    prev = cp.full(n, -1, dtype=cp.int32)
    mind = cp.full(n, cp.nan, dtype=cp.float32)
    changed = cp.zeros(1, dtype=cp.int32)
    tc.run(Xg, labels, mind, changed, prev)
    bad, D = _f64_check(X, C, labels)
    assert bad == 0
    assert int(changed.get()[0]) == 1
    st = tc.stats
    assert st["rows"] == n and 0 <= st["full"] <= n and st["pairs"] + st["full"] <= n
    if n > 1:
        assert st["full"] > 0  # the rows at x0 reach the full decision
    assert bool(cp.isfinite(mind).all())
    # The fits' exact-distance kernel: one pass over X, float64 sums.
    import tsm_core

    if n < k:
        return

    labf, inertia, Cf, _ = tsm_core.kmeans_lloyd(Xg, Cg, max_iter=1, precision="tf32")
    labf, Cf = cp.asnumpy(labf), cp.asnumpy(Cf).astype(np.float64)
    ref = float(((X.astype(np.float64) - Cf[labf]) ** 2).sum())
    assert inertia == pytest.approx(ref, rel=1e-6)


def _tensor_rows(X, prec):
    """X on the GPU as the tensor-core assignment takes it in `prec`: bfloat16 words,
    float16, or float32; rows 16-byte aligned (the kernels' 16-byte copies, as their
    callers make them)."""
    import cupy as cp

    from tsm_core.kmeans.tensor import aligned_copy, ready, to_bfloat16_words

    Xg = cp.asarray(X)
    if prec == "bfloat16":
        Xg = to_bfloat16_words(Xg)
    elif prec == "float16":
        Xg = Xg.astype(cp.float16)
    return Xg if ready(Xg) else aligned_copy(Xg)


@gpu
@pytest.mark.parametrize("n,d,k", [(1, 1, 1), (129, 3, 5), (5003, 33, 129), (20011, 128, 1024), (4099, 100, 300),
                                   (3001, 250, 257)])
@pytest.mark.parametrize("prec", ["float32", "tf32", "bfloat16", "float16"])
def test_wgmma_and_mma_sync_routes_agree(n, d, k, prec, monkeypatch):
    """Short rows take the warpgroup-MMA kernel on compute capability 9.0: its labels
    equal float64's under "float32" and agree with the mma.sync kernel's elsewhere
    (the same products summed in another order: near ties only)."""
    import cupy as cp

    from tsm_core.kmeans.configs import wg_steps
    from tsm_core.kmeans.tensor import TensorAssign

    rng = np.random.default_rng(n + d + k)
    X, C = near_tie_data(rng, n, d, k, 0.5)
    if prec in ("bfloat16", "float16") and d % 2:
        pytest.skip("odd 16-bit rows are read from a padded copy by the callers")
    Xg = _tensor_rows(X, prec)
    monkeypatch.setenv("TSM_KMEANS_LONG", "0")  # the fused kernels (rows of 250 values)
    out = {}
    for wg in ("1", "0"):
        monkeypatch.setenv("TSM_KMEANS_WGMMA", wg)
        tc = TensorAssign(n, d, k, prec)
        if wg == "1" and wg_steps(d, tc.epw) and cp.cuda.Device().compute_capability == "90":
            assert tc.wg
        tc.prepare(cp.asarray(C))
        labels = cp.full(n, -7, dtype=cp.int32)
        mind = cp.full(n, cp.nan, dtype=cp.float32)
        changed = cp.zeros(1, dtype=cp.int32)
        tc.run(Xg, labels, mind, changed, None)
        out[wg] = (cp.asnumpy(labels), cp.asnumpy(mind))
        assert ((out[wg][0] >= 0) & (out[wg][0] < k)).all()
        assert np.isfinite(out[wg][1]).all()
    if prec == "float32":
        bad, D = _f64_check(X, C, out["1"][0])
        assert bad == 0
        assert (out["1"][0] == out["0"][0]).all()
        # On compute capability 9.0 the warpgroup kernel forms "float32" from three
        # bfloat16 products, the mma.sync kernel from one TF32 product: the distances
        # differ by TF32's error. The warpgroup kernel's may be no farther from float64's.
        exact = cp.asnumpy(D[cp.arange(n), cp.asarray(out["1"][0])])
        err = [float(np.abs(out[w][1] - exact).max()) for w in ("1", "0")]
        assert err[0] <= 1.01 * err[1] + 1e-6 * float(np.abs(exact).max() + 1), err
        return
    assert (out["1"][0] == out["0"][0]).mean() > 0.99
    same = out["1"][0] == out["0"][0]
    np.testing.assert_allclose(out["1"][1][same], out["0"][1][same], rtol=1e-3, atol=1e-3 * float(np.abs(out["0"][1]).mean() + 1))


@gpu
@pytest.mark.parametrize("prec", ["float32", "bfloat16"])
def test_tensor_run_refuses_unaligned_rows(prec):
    """The kernels copy rows 16 bytes at a time: rows that do not start 16 bytes apart
    (float32 rows of 33) raise, and nothing is written; the aligned copy runs."""
    import cupy as cp

    from tsm_core.kmeans.tensor import TensorAssign

    rng = np.random.default_rng(5)
    n, d, k = 300, 33, 20
    X, C = near_tie_data(rng, n, d, k, 0.5)
    tc = TensorAssign(n, d, k, prec)
    tc.prepare(cp.asarray(C))
    Xg = cp.asarray(X)  # float32 rows of 132 bytes
    if prec == "bfloat16":  # contiguous 16-bit words, one word in: misaligned start
        Xg = _tensor_rows(np.concatenate([X, X[:1]]), prec)
        Xg = cp.ascontiguousarray(Xg).ravel()[1:1 + n * d].reshape(n, d)
    labels = cp.full(n, -7, dtype=cp.int32)
    mind = cp.full(n, cp.nan, dtype=cp.float32)
    with pytest.raises(ValueError, match="16 bytes"):
        tc.run(Xg, labels, mind, cp.zeros(1, dtype=cp.int32), None)
    cp.cuda.Device().synchronize()
    assert (labels == -7).all() and cp.isnan(mind).all()
    tc.run(_tensor_rows(X, prec), labels, mind, cp.zeros(1, dtype=cp.int32), None)
    assert ((labels >= 0) & (labels < k)).all() and not cp.isnan(mind).any()
    if prec == "float32":
        assert _f64_check(X, C, labels)[0] == 0


def _poisoned_run(tc, Xg, prev):
    """(labels, distances, changed flag) of one TensorAssign.run into outputs three
    entries longer than X's rows, poisoned (-7, NaN), on the host."""
    import cupy as cp

    n = Xg.shape[0]
    labels = cp.full(n + 3, -7, dtype=cp.int32)
    mind = cp.full(n + 3, cp.nan, dtype=cp.float32)
    changed = cp.zeros(1, dtype=cp.int32)
    tc.run(Xg, labels[:n], mind[:n], changed, prev)
    return cp.asnumpy(labels), cp.asnumpy(mind), int(changed.get()[0])


def _assert_same_kernel_outputs(new, ref, X, C, prec):
    """`new` (a _poisoned_run) equals `ref` bit for bit, leaves the entries past the
    rows untouched, and for "float32" has float64's labels."""
    n = X.shape[0]
    assert (new[0][n:] == -7).all() and np.isnan(new[1][n:]).all()
    np.testing.assert_array_equal(new[0], ref[0])
    np.testing.assert_array_equal(new[1], ref[1])
    assert new[2] == ref[2]
    if prec == "float32":
        assert _f64_check(X, C, new[0][:n])[0] == 0


@gpu
@pytest.mark.parametrize("n,d,k", [(1, 1, 1), (129, 3, 5), (5003, 33, 129), (20011, 128, 1024), (4099, 100, 300),
                                   (3001, 250, 257), (70001, 64, 130), (40000, 17, 1030), (300000, 32, 256),
                                   (2000003, 32, 8)])
@pytest.mark.parametrize("prec", ["float32", "tf32", "bfloat16", "float16"])
@pytest.mark.parametrize("rows", ["compact", "wide"])
def test_warp_specialised_kernel_equals_the_per_tile_one(n, d, k, prec, rows, monkeypatch):
    """TSM_KMEANS_WS: the warp-specialised kernel (a producer thread's bulk copies,
    mbarriers, no block barrier) computes the same products in the same order as the
    per-tile one: labels and distances bit-identical (in each of three runs), rows
    past n untouched, the changed flag alike, on compact rows and on rows inside a
    wider array (4 words of padding: copied, never read)."""
    import cupy as cp

    from tsm_core.kmeans.tensor import TensorAssign

    if cp.cuda.Device().compute_capability != "90":
        pytest.skip("the warpgroup MMA needs compute capability 9.0")
    if prec in ("bfloat16", "float16") and d % 2:
        pytest.skip("odd 16-bit rows are read from a padded copy by the callers")
    rng = np.random.default_rng(n + 5 * d + k)
    X, C = near_tie_data(rng, n, d, k, 0.5)
    Xg = _tensor_rows(X, prec)
    if rows == "wide":  # the same rows 4 words further apart, the padding poisoned
        w = Xg.strides[0] // Xg.itemsize + 4 * (4 // Xg.itemsize)
        buf = cp.full((n, w), 7, dtype=Xg.dtype)
        buf[:, :d] = Xg
        Xg = buf[:, :d]
    monkeypatch.setenv("TSM_KMEANS_WGMMA", "1")
    monkeypatch.setenv("TSM_KMEANS_PERSIST", "0")
    prev = cp.asarray(rng.integers(0, k, size=n).astype(np.int32))
    out = {}
    for ws in ("0", "1"):
        monkeypatch.setenv("TSM_KMEANS_WS", ws)
        tc = TensorAssign(n, d, k, prec)
        if not tc.wg:
            pytest.skip("rows too long for the warpgroup kernel")
        assert tc.ws == (ws == "1")
        if ws == "1" and not tc._ws_ldw(Xg):
            assert rows == "wide"  # rows further apart than its buffers: per-tile kernel
        tc.prepare(cp.asarray(C))
        runs = [_poisoned_run(tc, Xg, prev) for _ in range(3 if ws == "1" else 1)]  # a race: runs differ
        for r in runs[1:]:
            np.testing.assert_array_equal(r[0], runs[0][0])
            np.testing.assert_array_equal(r[1], runs[0][1])
        out[ws] = runs[0]
    _assert_same_kernel_outputs(out["1"], out["0"], X, C, prec)


@gpu
@pytest.mark.parametrize("n,d,k", [(1, 1, 1), (129, 3, 5), (5003, 33, 129), (20011, 128, 1024), (4099, 100, 300),
                                   (3001, 250, 257), (70001, 64, 130), (40000, 17, 1030)])
@pytest.mark.parametrize("prec", ["float32", "tf32", "bfloat16", "float16"])
@pytest.mark.parametrize("split", ["bf16x3", "tf32"])
def test_persistent_wgmma_kernel_equals_the_per_tile_one(n, d, k, prec, split, monkeypatch):
    """TSM_KMEANS_PERSIST: the persistent warpgroup kernel (one block an SM over the
    row tiles, rows copied ahead into shared memory) computes the same products in
    the same order as the per-tile one: labels and distances bit-identical, rows past
    the last row tile's end untouched, a changed flag set alike."""
    import cupy as cp

    from tsm_core.kmeans.tensor import TensorAssign

    if cp.cuda.Device().compute_capability != "90":
        pytest.skip("the warpgroup MMA needs compute capability 9.0")
    if split == "tf32" and prec != "float32":
        pytest.skip("the split switch only concerns precision='float32'")
    if prec in ("bfloat16", "float16") and d % 2:
        pytest.skip("odd 16-bit rows are read from a padded copy by the callers")
    rng = np.random.default_rng(n + 3 * d + k)
    X, C = near_tie_data(rng, n, d, k, 0.5)
    Xg = _tensor_rows(X, prec)
    monkeypatch.setenv("TSM_KMEANS_WGMMA", "1")
    monkeypatch.setenv("TSM_KMEANS_WS", "0")
    monkeypatch.setenv("TSM_KMEANS_SPLIT", split)
    prev = cp.asarray(rng.integers(0, k, size=n).astype(np.int32))
    out = {}
    for persist in ("0", "1"):
        monkeypatch.setenv("TSM_KMEANS_PERSIST", persist)
        tc = TensorAssign(n, d, k, prec)
        if not tc.wg:
            pytest.skip("rows too long for the warpgroup kernel")
        assert tc.persist == (persist == "1")
        tc.prepare(cp.asarray(C))
        out[persist] = _poisoned_run(tc, Xg, prev)
    _assert_same_kernel_outputs(out["1"], out["0"], X, C, prec)


@gpu
@pytest.mark.parametrize("n,d,k", [(1, 1, 1), (129, 3, 5), (5003, 33, 129), (20011, 128, 1024), (4099, 100, 300),
                                   (3001, 17, 1030), (2000, 64, 4099)])
def test_split_products_labels_equal_float64(n, d, k, monkeypatch):
    """"float32" on the warpgroup kernel as three bfloat16 products (TSM_KMEANS_SPLIT):
    labels equal float64's, deterministic, and the mma.sync route's labels."""
    import cupy as cp

    from tsm_core.kmeans.tensor import TensorAssign

    if cp.cuda.Device().compute_capability != "90":
        pytest.skip("the warpgroup MMA needs compute capability 9.0")
    rng = np.random.default_rng(n + d + k + 1)
    X, C = near_tie_data(rng, n, d, k, 0.5)
    monkeypatch.setenv("TSM_KMEANS_WGMMA", "1")
    monkeypatch.setenv("TSM_KMEANS_SPLIT", "bf16x3")
    monkeypatch.setenv("TSM_KMEANS_SCREEN", "0")
    tc = TensorAssign(n, d, k, "float32")
    assert tc.wg and tc.tin == 3
    tc.prepare(cp.asarray(C))
    runs = []
    for _ in range(2):
        labels = cp.full(n, -7, dtype=cp.int32)
        mind = cp.full(n, cp.nan, dtype=cp.float32)
        tc.run(_tensor_rows(X, "float32"), labels, mind, cp.zeros(1, dtype=cp.int32), None)
        runs.append((cp.asnumpy(labels), cp.asnumpy(mind)))
    assert (runs[0][0] == runs[1][0]).all() and (runs[0][1] == runs[1][1]).all()
    assert _f64_check(X, C, runs[0][0])[0] == 0
    D64 = ((X.astype(np.float64)[:, None] - C.astype(np.float64)[None]) ** 2).sum(-1) if n * k < 3e7 else None
    if D64 is not None:
        md = D64[np.arange(n), runs[0][0]]
        np.testing.assert_allclose(runs[0][1], md, rtol=1e-3, atol=1e-3 * float(md.mean() + 1))
    monkeypatch.setenv("TSM_KMEANS_WGMMA", "0")
    lab0, _ = __import__("tsm_core").kmeans_assign(cp.asarray(X), cp.asarray(C), precision="float32", method="mma")
    assert (cp.asnumpy(lab0) == runs[0][0]).all()


@gpu
@pytest.mark.parametrize("n,d,k", [(1, 1, 1), (129, 3, 5), (5003, 33, 129), (20011, 128, 1024), (4099, 100, 300),
                                   (3001, 17, 1030), (40009, 64, 300)])
@pytest.mark.parametrize("with_prev", [False, True])
def test_tf32_screen_labels_equal_float64(n, d, k, with_prev, monkeypatch):
    """"float32" as a TF32 screen (TSM_KMEANS_SCREEN): the listed rows assigned again by
    the three-product kernel give labels equal to float64's and to the unscreened
    kernel's, distances within the TF32 bound of float64's, deterministic; the changed flag
    against old labels (`prev` the labels buffer itself) set exactly where a label
    moved. 40009 rows list more than one batch."""
    import cupy as cp

    from tsm_core.kmeans.tensor import TensorAssign

    if cp.cuda.Device().compute_capability != "90":
        pytest.skip("the warpgroup MMA needs compute capability 9.0")
    rng = np.random.default_rng(n + d + k + 3)
    X, C = near_tie_data(rng, n, d, k, 0.5)
    monkeypatch.setenv("TSM_KMEANS_WGMMA", "1")
    tc = TensorAssign(n, d, k, "float32", screen=True)
    if tc.mode != 2:
        pytest.skip("the screen takes rows the warpgroup kernel takes in TF32")
    tc.prepare(cp.asarray(C))
    Xt = _tensor_rows(X, "float32")
    runs = []
    for _ in range(2):
        old = rng.integers(0, k, n).astype(np.int32)
        labels = cp.asarray(old) if with_prev else cp.full(n, -7, dtype=cp.int32)
        mind = cp.full(n, cp.nan, dtype=cp.float32)
        changed = cp.zeros(1, dtype=cp.int32)
        tc.run(Xt, labels, mind, changed, labels if with_prev else None)
        lab = cp.asnumpy(labels)
        if with_prev:
            assert int(changed.get()[0]) == int((lab != old).any())
        runs.append((lab, cp.asnumpy(mind)))
    assert (runs[0][0] == runs[1][0]).all() and (runs[0][1] == runs[1][1]).all()
    assert _f64_check(X, C, runs[0][0])[0] == 0
    st = tc.stats
    assert st["rows"] == 2 * n and 0 <= st["screened"] <= 2 * n
    if n * k < 3e7:
        # the unlisted rows' distances come from the TF32 products: within the bound
        D64 = ((X.astype(np.float64)[:, None] - C.astype(np.float64)[None]) ** 2).sum(-1)
        md = D64[np.arange(n), runs[0][0]]
        B = emulate(X, C)[3]
        assert (np.abs(runs[0][1] - md) <= B * 1.01 + 1e-5 * (md + 1)).all()
    ref = TensorAssign(n, d, k, "float32", screen=False)
    ref.prepare(cp.asarray(C))
    labels = cp.full(n, -7, dtype=cp.int32)
    ref.run(Xt, labels, cp.empty(n, dtype=cp.float32), cp.zeros(1, dtype=cp.int32), None)
    assert (cp.asnumpy(labels) == runs[0][0]).all()


@gpu
def test_tf32_screen_in_a_fit(monkeypatch):
    """A "float32" fit with the screen on equals the fit without it (same labels every
    iteration, so the same centres and iterations)."""
    import cupy as cp

    import tsm_core

    if cp.cuda.Device().compute_capability != "90":
        pytest.skip("the warpgroup MMA needs compute capability 9.0")
    rng = np.random.default_rng(5)
    X = cp.asarray(rng.standard_normal((30011, 48)).astype(np.float32))
    C0 = X[:600].copy()
    out = {}
    for v in ("0", "1"):
        monkeypatch.setenv("TSM_KMEANS_SCREEN", v)
        lab, inertia, C, it = tsm_core.kmeans_lloyd(X, C0, max_iter=6, precision="float32")
        out[v] = (cp.asnumpy(cp.asarray(lab)), float(inertia), cp.asnumpy(cp.asarray(C)), it)
    assert (out["0"][0] == out["1"][0]).all()
    assert out["0"][3] == out["1"][3]
    np.testing.assert_array_equal(out["0"][2], out["1"][2])


def emulate_chunked(X, C):
    """The long-row route's split products in numpy (longrows.py): [xh | xh | xl] against
    [ch | cl | ch], the depth summed in float32 chunks, the chunks added in order:
    (computed distances, float64 distances of the same shifted values, bound)."""
    from tsm_core.kmeans.longrows import chunks, margin_chunked

    n, d = X.shape
    dp, kc, nb = chunks(d)
    mu = C.astype(np.float64).mean(0).astype(np.float32)
    xs = (X.astype(np.float32) - mu).astype(np.float32)
    cs = (C.astype(np.float64) - mu).astype(np.float32)
    xh, xl = _split(xs)
    ch, cl = _split(cs)
    A = np.zeros((n, kc * nb), np.float32)
    B = np.zeros((C.shape[0], kc * nb), np.float32)
    for i, (a, b) in enumerate(((xh, ch), (xh, cl), (xl, ch))):
        A[:, i * dp:i * dp + d] = a
        B[:, i * dp:i * dp + d] = b
    dot = np.zeros((n, C.shape[0]), np.float32)
    for q in range(nb):
        s = slice(q * kc, (q + 1) * kc)
        dot = (dot + (A[:, s] @ B[:, s].T).astype(np.float32)).astype(np.float32)
    cn = (cs.astype(np.float64) ** 2).sum(1).astype(np.float32)
    D = (cn[None, :] - np.float32(2) * dot).astype(np.float32)
    x64, c64 = xs.astype(np.float64), cs.astype(np.float64)
    Dex = (c64 ** 2).sum(1)[None, :] - 2 * x64 @ c64.T
    ea, eb = margin_chunked(d)
    cm2 = float(cn.max())
    return D, Dex, ea * np.sqrt(cm2) * np.sqrt((xs * xs).sum(1, dtype=np.float32)) + eb * cm2


@pytest.mark.parametrize("d,k,offset", [(129, 50, 0.0), (300, 20, -5.0), (1000, 30, 30.0), (4096, 10, 0.0)])
def test_chunked_split_products_within_half_their_bound(d, k, offset):
    """The long-row route's second pass: every computed distance within B / 2 of its
    float64 value, labels outside B exact, and B several times below the TF32 bound."""
    from tsm_core.kmeans.longrows import margin_chunked

    rng = np.random.default_rng(d + k)
    X, C = near_tie_data(rng, 1500, d, k, offset)
    D, Dex, B = emulate_chunked(X, C)
    err = np.abs(D.astype(np.float64) - Dex).max(1)
    assert (err <= B / 2).all()
    assert margin_chunked(d)[0] < margin(d, rounded=True)[0] / 4
    srt = np.sort(D, axis=1)
    certain = srt[:, 1] - srt[:, 0] > B
    assert certain.sum() > 100
    ref, _ = exact_labels(X, C)
    assert (D.argmin(1)[certain] == ref[certain]).all()


def test_long_route_switch(monkeypatch):
    """TSM_KMEANS_LONG forces the long-row route on compute capability 8.0 and later;
    by default it takes rows longer than 128 values against 256 centres or more."""
    assert configs.use_long(64, 8, 90, True) and not configs.use_long(4096, 1024, 75, True)
    assert not configs.use_long(4096, 1024, 90, False)
    assert configs.use_long(129, 256, 90, None) and configs.use_long(4096, 65536, 80, None)
    assert not configs.use_long(128, 1024, 90, None) and not configs.use_long(4096, 255, 90, None)


@gpu
@pytest.mark.parametrize("n,d,k", [(1, 129, 1), (7, 130, 2), (5003, 257, 129), (3001, 4096, 300),
                                   (2049, 1000, 70), (40009, 200, 300), (4099, 129, 4099)])
@pytest.mark.parametrize("prec", ["float32", "tf32"])
def test_long_rows_route(n, d, k, prec, monkeypatch):
    """The long-row route (TSM_KMEANS_LONG=1, blocks cut small so that 40009 rows take
    several blocks and batches): "float32" labels equal float64's, "tf32" ones differ
    only within the rounded TF32 bound; deterministic over poisoned outputs; the changed
    flag against old labels (prev the labels buffer) set exactly where a label moved."""
    import cupy as cp

    from tsm_core.kmeans import longrows
    from tsm_core.kmeans.tensor import TensorAssign

    monkeypatch.setenv("TSM_KMEANS_LONG", "1")
    monkeypatch.setattr(longrows, "BLOCK_BYTES", 1)
    rng = np.random.default_rng(n + d + k + 11)
    X, C = near_tie_data(rng, n, d, k, 0.5)
    tc = TensorAssign(n, d, k, prec)
    assert tc.long is not None
    tc.prepare(cp.asarray(C))
    Xt = _tensor_rows(X, "float32")
    runs = []
    for _ in range(2):
        old = rng.integers(0, k, n).astype(np.int32)
        labels = cp.asarray(old)
        mind = cp.full(n, cp.nan, dtype=cp.float32)
        changed = cp.zeros(1, dtype=cp.int32)
        tc.run(Xt, labels, mind, changed, labels)
        lab = cp.asnumpy(labels)
        assert int(changed.get()[0]) == int((lab != old).any())
        runs.append((lab, cp.asnumpy(mind)))
    assert (runs[0][0] == runs[1][0]).all() and (runs[0][1] == runs[1][1]).all()
    assert ((runs[0][0] >= 0) & (runs[0][0] < k)).all() and np.isfinite(runs[0][1]).all()
    st = tc.stats
    assert st["rows"] == 2 * n
    X64, C64 = X.astype(np.float64), C.astype(np.float64)
    if prec == "float32":
        assert _f64_check(X, C, runs[0][0])[0] == 0
        assert 0 <= st["pairs"] + st["full"] <= st["screened"] <= 2 * n
    else:
        _, _, _, B = emulate(X, C, rounded=True)
        D = np.empty((n, k))
        for a in range(0, n, 512):
            D[a:a + 512] = ((X64[a:a + 512, None] - C64[None]) ** 2).sum(-1)
        lab = runs[0][0]
        gap = D[np.arange(n), lab] - D.min(1)
        assert (gap <= B * 1.01).all()
    # distances: the TF32 pass's where a row was not listed; within the TF32 bound
    md = ((X64 - C64[runs[0][0]]) ** 2).sum(1)
    B = emulate(X, C, rounded=True)[3]
    assert (np.abs(runs[0][1] - md) <= B * 1.01 + 1e-5 * (md + 1)).all()


@gpu
@pytest.mark.parametrize("n,d,k", [(1, 260, 1), (7, 258, 2), (5003, 514, 129), (3001, 4096, 300),
                                   (40009, 300, 300)])
@pytest.mark.parametrize("prec", ["bfloat16", "float16"])
def test_long_rows_route_16_bit(n, d, k, prec, monkeypatch):
    """16-bit rows on the long-row route (cuBLAS's 16-bit products; blocks cut small):
    labels agree with the fused kernel's but for near ties (the same products summed
    in another order), distances close; deterministic over poisoned outputs."""
    import cupy as cp

    from tsm_core.kmeans import longrows
    from tsm_core.kmeans.tensor import TensorAssign

    rng = np.random.default_rng(n + d + k + 13)
    X, C = near_tie_data(rng, n, d, k, 0.5)
    Xt = _tensor_rows(X, prec)
    monkeypatch.setattr(longrows, "BLOCK_BYTES", 1)
    out = {}
    for long in ("1", "0", "1"):
        monkeypatch.setenv("TSM_KMEANS_LONG", long)
        tc = TensorAssign(n, d, k, prec)
        assert (tc.long is not None) == (long == "1")
        tc.prepare(cp.asarray(C))
        labels = cp.full(n, -7, dtype=cp.int32)
        mind = cp.full(n, cp.nan, dtype=cp.float32)
        tc.run(Xt, labels, mind, cp.zeros(1, dtype=cp.int32), None)
        got = (cp.asnumpy(labels), cp.asnumpy(mind))
        if long in out:
            assert (got[0] == out[long][0]).all() and (got[1] == out[long][1]).all()
        out[long] = got
    lab, md = out["1"]
    assert ((lab >= 0) & (lab < k)).all() and np.isfinite(md).all()
    same = lab == out["0"][0]
    assert same.mean() > 0.99
    np.testing.assert_allclose(md[same], out["0"][1][same], rtol=1e-3, atol=1e-3 * float(np.abs(md).mean() + 1))
