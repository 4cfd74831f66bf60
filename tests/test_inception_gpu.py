"""Inception blocks on our kernels against torch on the GPU (cuDNN, TF32 off).

Tolerance as in test_inception.py: max |ours - torch| / max |torch| <= 1e-4.
Outputs are poisoned (NaN) before each call: every element must be written.
"""

import numpy as np
import pytest

from tsm_apps.inception import InceptionBlock, Table6Set
from tsm_core.conv import api as _conv

pytestmark = pytest.mark.gpu
TOL = 1e-4


@pytest.fixture(scope="module")
def torch_gpu():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA")
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    return torch


def relerr(a, b):
    a, b = a.double(), b.double()
    return ((a - b).abs().max() / b.abs().max()).item()


def _x(torch, n, c, h, w, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(n, c, h, w, device="cuda", generator=g)


@pytest.mark.parametrize("batch", [1, 3, 17])
@pytest.mark.parametrize("module", range(1, 10))
def test_block_matches_cudnn(torch_gpu, module, batch):
    import cupy

    torch = torch_gpu
    blk = InceptionBlock(module, seed=module)
    x = _x(torch, batch, blk.in_channels, blk.hw, blk.hw, seed=batch)
    ref = blk.torch_reference(x)
    out = cupy.full((batch, blk.out_channels, blk.hw, blk.hw), np.nan, np.float32)
    y = blk.forward_gpu(cupy.from_dlpack(x), out=out)
    assert y is out
    yt = torch.from_dlpack(y)
    assert not torch.isnan(yt).any()
    assert relerr(yt, ref) <= TOL
    assert (yt > 0).float().mean().item() > 0.2


@pytest.mark.parametrize("cfg", _conv.CONFIGS, ids=lambda c: c.tag)
@pytest.mark.parametrize("module", [2, 6, 9])
def test_every_tile_config(torch_gpu, module, cfg, monkeypatch):
    torch = torch_gpu
    monkeypatch.setenv("TSM_CONV_TILE", cfg.tag)
    blk = InceptionBlock(module, seed=11)  # fresh block: its plans use the forced tile
    x = _x(torch, 5, blk.in_channels, 9, 11, seed=3)  # odd, non-square image
    y = blk(x)
    assert relerr(y, blk.torch_reference(x)) <= TOL
    assert all(p[4] == cfg for g in blk.groups() for p in g._plans.values())


def test_torch_in_torch_out_and_repeat(torch_gpu):
    torch = torch_gpu
    blk = InceptionBlock(8)
    x = _x(torch, 2, blk.in_channels, 7, 7)
    y1 = blk(x)
    assert isinstance(y1, torch.Tensor) and y1.is_cuda and y1.shape == (2, 832, 7, 7)
    y2 = blk(x * 2)  # cached plans and buffers, new data
    ref2 = blk.torch_reference(x * 2)
    assert relerr(y2, ref2) <= TOL and relerr(y1, blk.torch_reference(x)) <= TOL
    xs = _x(torch, 2, blk.in_channels, 14, 14)[:, :, ::2, ::2]  # strided view
    assert relerr(blk(xs), blk.torch_reference(xs.contiguous())) <= TOL


def test_cupy_in_cupy_out_and_errors(torch_gpu):
    import cupy

    blk = InceptionBlock(1)
    x = cupy.random.default_rng(0).standard_normal((3, 192, 28, 28), dtype=np.float32)
    y = blk(x)
    assert isinstance(y, cupy.ndarray)
    ref = blk.forward_cpu(cupy.asnumpy(x))
    assert float(cupy.abs(y - cupy.asarray(ref)).max() / np.abs(ref).max()) <= TOL
    before = x.copy()
    with pytest.raises(TypeError, match="float32"):
        blk(x.astype(np.float64))
    with pytest.raises(ValueError, match="input channels"):
        blk(x[:, :100])
    with pytest.raises(ValueError, match="4-D"):
        blk(x[0])
    assert bool((x == before).all())


@pytest.mark.parametrize("module", range(1, 10))
def test_table6_sets(torch_gpu, module):
    import cupy

    torch = torch_gpu
    s = Table6Set(module, seed=module)
    x = _x(torch, 1, 192, s.hw, s.hw, seed=module)
    y = torch.from_dlpack(s.forward_gpu(cupy.from_dlpack(x)))
    F = torch.nn.functional
    ref = torch.cat([F.relu(F.conv2d(x, torch.from_numpy(w).cuda(), torch.from_numpy(b).cuda()))
                     for w, b in s.weights], 1)
    assert relerr(y, ref) <= TOL


@pytest.mark.parametrize("module", [2, 8])
def test_table6_call_torch_and_cupy(torch_gpu, module):
    # Table6Set(x): the first torch call through CuPy views (tuning), the later ones
    # on the remembered launch with torch's allocator: each on new data (a stale
    # pointer would show), all against cuDNN; a CuPy x gives a CuPy result.
    import cupy

    torch = torch_gpu
    s = Table6Set(module, seed=7)
    F = torch.nn.functional
    W = [(torch.from_numpy(w).cuda(), torch.from_numpy(b).cuda()) for w, b in s.weights]
    for i in range(3):
        x = _x(torch, 1, 192, s.hw, s.hw, seed=20 + i)
        y = s(x)
        assert isinstance(y, torch.Tensor) and y.shape == (1, s.out_channels, s.hw, s.hw)
        ref = torch.cat([F.relu(F.conv2d(x, w, b)) for w, b in W], 1)
        assert relerr(y, ref) <= TOL
        assert (i == 0) or len(s._fast) == 1
    yc = s(cupy.from_dlpack(x))
    assert isinstance(yc, cupy.ndarray) and relerr(torch.from_dlpack(yc), ref) <= TOL
    xt = x.transpose(2, 3)  # not contiguous: the checked path, a copy
    ref_t = torch.cat([F.relu(F.conv2d(xt, w, b)) for w, b in W], 1)
    assert relerr(s(xt), ref_t) <= TOL


@pytest.mark.parametrize("splits", [1, 2, 5])
@pytest.mark.parametrize("module", [1, 9])
def test_split_k_forced(torch_gpu, module, splits, monkeypatch):
    # K chunks reduced by the last block of each tile; run twice: the tile counters
    # must be back at zero after every launch.
    torch = torch_gpu
    monkeypatch.setenv("TSM_CONV_SPLITK", str(splits))
    blk = InceptionBlock(module, seed=5)
    for rep in range(2):
        x = _x(torch, 3, blk.in_channels, 7, 9, seed=rep)
        y = blk(x)
        assert relerr(y, blk.torch_reference(x)) <= TOL
    for g in blk.groups():
        for p in g._plans.values():
            assert (max(p[6]) == 1) if splits == 1 else (1 < max(p[6]) <= splits)
            for arr in p[5]:
                if arr.dtype == np.int32 and arr.ndim == 1:
                    assert int(arr.sum()) == 0  # split-K counters reset


def test_batch1_uses_split_k(torch_gpu):
    torch = torch_gpu
    blk = InceptionBlock(9)
    x = _x(torch, 1, blk.in_channels, 7, 7)
    y = blk(x)
    assert relerr(y, blk.torch_reference(x)) <= TOL
    assert any(max(p[6]) > 1 for g in blk.groups() for p in g._plans.values())


def _kept_label(g, n, H, W):
    """The autotune label of the plan g keeps for n H x W images."""
    p = g.plan(n, H, W)
    return g.tune_label(p[4], p[6], n, H, W, _conv._sm_count(0))


def test_autotune_keeps_the_fastest_and_stays_correct(torch_gpu, monkeypatch):
    # 5b at the smallest batch whose GEMM columns reach TUNE_MIN_COLUMNS: the first
    # call times every configuration (both launches) and keeps the fastest.
    import cupy

    torch = torch_gpu
    monkeypatch.delenv("TSM_CONV_TUNE", raising=False)
    blk = InceptionBlock(9, seed=4)
    n = -(-_conv.TUNE_MIN_COLUMNS // 49)
    x = _x(torch, n, blk.in_channels, 7, 7, seed=9)
    y = blk(x)
    assert relerr(y, blk.torch_reference(x)) <= TOL
    g1, g2 = blk.groups()
    assert g1.tuning_wanted(n, 7, 7) and g2.tuning_wanted(n, 7, 7)
    xc = cupy.from_dlpack(x)
    bufs = {"x": xc, "y": cupy.full((n, blk.out_channels, 7, 7), np.nan, np.float32),
            "t3": cupy.empty((n, g2._cin["t3"], 7, 7), np.float32),
            "t5": cupy.empty((n, g2._cin["t5"], 7, 7), np.float32),
            "xp": cupy.empty(xc.shape, np.float32)}
    for g in (g1, g2):
        times = g.autotune(bufs)
        assert {k.split("/")[0] for k in times} == {c.tag for c in _conv.candidates(g.segments, 7, 7)}
        assert all(c.tag in times for c in _conv.candidates(g.segments, 7, 7))
        assert times[_kept_label(g, n, 7, 7)] == min(times.values())
    assert relerr(torch.from_dlpack(bufs["y"]), blk.torch_reference(x)) <= TOL


def test_autotune_leaves_out_a_disagreeing_candidate(torch_gpu, monkeypatch):
    # The tuner's safety net: a candidate whose outputs differ from the first's is
    # not timed or kept (here the comparison is made to fail for the fastest one,
    # as a wrong kernel would), with a warning, and the outputs stay right.
    import cupy

    torch = torch_gpu
    blk = InceptionBlock(3, seed=5)
    n = 4
    x = _x(torch, n, blk.in_channels, 14, 14, seed=2)
    g1 = blk.groups()[0]
    xc = cupy.from_dlpack(x)
    bufs = {"x": xc, "y": cupy.full((n, blk.out_channels, 14, 14), np.nan, np.float32),
            "t3": cupy.empty((n, blk.groups()[1]._cin["t3"], 14, 14), np.float32),
            "t5": cupy.empty((n, blk.groups()[1]._cin["t5"], 14, 14), np.float32),
            "xp": cupy.empty(xc.shape, np.float32)}
    times = g1.autotune(bufs)
    fastest = min(times, key=times.get)
    ref = {k: v.copy() for k, v in bufs.items()}
    real = _conv.rel_diff
    current = {}

    def failing(a, b):
        return float("inf") if current.get("tag") == fastest else real(a, b)

    orig_build = g1._build

    def build(cfg, n_, H_, W_, splits=None):
        current["tag"] = g1.tune_label(cfg, splits, n_, H_, W_, _conv._sm_count(0))
        return orig_build(cfg, n_, H_, W_, splits)

    monkeypatch.setattr(_conv, "rel_diff", failing)
    monkeypatch.setattr(g1, "_build", build)
    for k in ("y", "t3", "t5", "xp"):
        bufs[k].fill(np.nan)
    if fastest == next(iter(times)):
        pytest.skip("the fastest is the reference candidate")
    with pytest.warns(RuntimeWarning, match=f"{fastest} differs"):
        times2 = g1.autotune(bufs)
    assert fastest not in times2 and _kept_label(g1, n, 14, 14) != fastest
    for k in ("y", "t3", "t5", "xp"):
        assert _conv.rel_diff(bufs[k], ref[k]) <= _conv.TUNE_AGREE


def test_launch_paths_agree(torch_gpu, monkeypatch):
    # cuLaunchKernel with the cached argument block, and CuPy's kernel call (the
    # fallback for a CuPy without the driver binding), on new arrays each call: the
    # slot pointers are rewritten, never stale.
    import cupy

    from tsm_core.batched import api as _batched

    torch = torch_gpu
    s = Table6Set(8, seed=3)
    outs = []
    for direct in (True, False):
        monkeypatch.setattr(_batched, "_DIRECT", [direct])
        for seed in (1, 2):
            x = _x(torch, 1, 192, s.hw, s.hw, seed=seed)
            y = s.forward_gpu(cupy.from_dlpack(x))
            outs.append(cupy.asnumpy(y))
            assert np.abs(outs[-1] - s.forward_cpu(cupy.asnumpy(cupy.from_dlpack(x)))).max() <= \
                TOL * np.abs(outs[-1]).max()
    assert np.array_equal(outs[0], outs[2]) and np.array_equal(outs[1], outs[3])
    assert not np.array_equal(outs[0], outs[1])


def test_torch_path_follows_torch_stream(torch_gpu):
    # x made and y read on a side stream: the first call (CuPy views, tuning) and the
    # later ones (raw pointers, cached launches) must both launch on that stream.
    torch = torch_gpu
    blk = InceptionBlock(9, seed=2)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        for i in range(3):
            x = torch.randn(2, blk.in_channels, 7, 7, device="cuda") * (i + 1)
            z = blk(x) * 1.0
        ref = blk.torch_reference(x)
    s.synchronize()
    assert relerr(z, ref) <= TOL
