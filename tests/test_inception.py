"""Inception blocks (apps/inception) on the CPU: the reference against torch's CPU
build, the GPU launch plans emulated in numpy, weights from state dicts, and the
input errors. No GPU needed.

Tolerance: max |ours - torch| / max |torch| <= 1e-4 (the project's target). Both sides sum up to
K = 1728 float32 products (4d's 3x3) in different orders; the worst case is about
K * 2**-24 ~ 1e-4 of the largest partial sum, the typical error sqrt(K) * 2**-24.
"""

import numpy as np
import pytest

from tsm_apps.inception import BLOCKS, InceptionBlock, Table6Set
from tsm_core.conv import api as _conv

torch = pytest.importorskip("torch")

TOL = 1e-4


def relerr(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.abs(a - b).max() / np.abs(b).max()


def rand_x(rng, n, c, h, w):
    return rng.standard_normal((n, c, h, w)).astype(np.float32)


@pytest.mark.parametrize("module", range(1, 10))
@pytest.mark.parametrize("batch", [1, 3])
def test_cpu_reference_matches_torch(module, batch, rng):
    blk = InceptionBlock(module, seed=module)
    x = rand_x(rng, batch, blk.in_channels, blk.hw, blk.hw)
    y = blk(x)
    ref = blk.torch_reference(torch.from_numpy(x)).numpy()
    assert y.shape == (batch, blk.out_channels, blk.hw, blk.hw) and y.dtype == np.float32
    assert relerr(y, ref) <= TOL
    assert (y > 0).mean() > 0.2  # not a ReLU'd zero block


@pytest.mark.parametrize("module", [1, 9])
def test_cpu_batch_17_odd_image(module, rng):
    blk = InceptionBlock(module, seed=3)
    x = rand_x(rng, 17, blk.in_channels, 5, 9)  # non-square, not the GoogLeNet size
    assert relerr(blk(x), blk.torch_reference(torch.from_numpy(x)).numpy()) <= TOL


def test_torch_cpu_tensor_in_torch_out(rng):
    blk = InceptionBlock(8)
    x = torch.from_numpy(rand_x(rng, 2, blk.in_channels, 7, 7))
    y = blk(x)
    assert isinstance(y, torch.Tensor) and y.device.type == "cpu"
    assert relerr(y.numpy(), blk.torch_reference(x).numpy()) <= TOL


# ----------------------------------------------------------------- input errors

def test_errors_leave_nothing_changed(rng):
    blk = InceptionBlock(1)
    good = rand_x(rng, 1, 192, 6, 6)
    with pytest.raises(ValueError, match="192 input channels"):
        blk(rand_x(rng, 1, 191, 6, 6))
    with pytest.raises(ValueError, match="4-D"):
        blk(good[0])
    with pytest.raises(TypeError, match="float32"):
        blk(good.astype(np.float64))
    with pytest.raises(TypeError):
        blk(good.tolist())
    with pytest.raises(ValueError, match="module"):
        InceptionBlock(10)
    with pytest.raises(ValueError, match="expected"):
        p = dict(blk.params)
        p["b2"] = (p["b2"][0][:, :5], p["b2"][1])
        InceptionBlock(1, params=p)


# ----------------------------------------------------------------- state dicts

def _anchor_module(c, a, b1, b2, c1, c2, p):
    """An nn.Module with the plain layout's attribute names."""
    nn = torch.nn

    class Inception(nn.Module):
        def __init__(s):
            super().__init__()
            s.b1 = nn.Conv2d(c, a, 1)
            s.b2 = nn.Sequential(nn.Conv2d(c, b1, 1), nn.ReLU(), nn.Conv2d(b1, b2, 3, padding=1))
            s.b3 = nn.Sequential(nn.Conv2d(c, c1, 1), nn.ReLU(), nn.Conv2d(c1, c2, 5, padding=2))
            s.b4 = nn.Sequential(nn.MaxPool2d(3, 1, 1), nn.Conv2d(c, p, 1))

        def forward(s, x):
            F = torch.nn.functional
            return torch.cat([F.relu(s.b1(x)), F.relu(s.b2(x)), F.relu(s.b3(x)), F.relu(s.b4(x))], 1)

    return Inception()


def test_state_dict_plain_layout_from_path(tmp_path, rng):
    torch.manual_seed(0)
    m = _anchor_module(*BLOCKS["4c"][:7]).eval()
    path = tmp_path / "4c.pt"
    torch.save(m.state_dict(), path)
    blk = InceptionBlock.from_state_dict(5, str(path))
    x = rand_x(rng, 2, 512, 14, 14)
    with torch.no_grad():
        ref = m(torch.from_numpy(x)).numpy()
    assert relerr(blk(x), ref) <= TOL


def test_state_dict_torchvision_layout_bn_folded(rng):
    # torchvision GoogLeNet keys (BasicConv2d = conv without bias + BatchNorm eps 1e-3
    # + ReLU), its 3x3 in the third branch included; built by hand (no download).
    cin, a, b1, b2, c1, c2, p, _ = BLOCKS["5a"]
    convs = {"branch1": (a, cin, 1), "branch2.0": (b1, cin, 1), "branch2.1": (b2, b1, 3),
             "branch3.0": (c1, cin, 1), "branch3.1": (c2, c1, 3), "branch4.1": (p, cin, 1)}
    sd = {}
    g = torch.Generator().manual_seed(1)
    for k, (co, ci, r) in convs.items():
        pre = f"inception5a.{k}"
        sd[f"{pre}.conv.weight"] = torch.randn(co, ci, r, r, generator=g) / (ci * r * r) ** 0.5
        sd[f"{pre}.bn.weight"] = torch.rand(co, generator=g) + 0.5
        sd[f"{pre}.bn.bias"] = torch.randn(co, generator=g) * 0.1
        sd[f"{pre}.bn.running_mean"] = torch.randn(co, generator=g) * 0.1
        sd[f"{pre}.bn.running_var"] = torch.rand(co, generator=g) + 0.5
        sd[f"{pre}.bn.num_batches_tracked"] = torch.tensor(0)
    blk = InceptionBlock.from_state_dict("5a", sd)
    assert blk.params["b3"][0].shape[-1] == 3
    F = torch.nn.functional
    x = torch.from_numpy(rand_x(rng, 2, cin, 7, 7))

    def bc(k, t):
        pre = f"inception5a.{k}"
        w = sd[f"{pre}.conv.weight"]
        y = F.conv2d(t, w, padding=w.shape[-1] // 2)
        y = F.batch_norm(y, sd[f"{pre}.bn.running_mean"], sd[f"{pre}.bn.running_var"],
                         sd[f"{pre}.bn.weight"], sd[f"{pre}.bn.bias"], False, 0.0, 1e-3)
        return F.relu(y)

    ref = torch.cat([bc("branch1", x), bc("branch2.1", bc("branch2.0", x)),
                     bc("branch3.1", bc("branch3.0", x)), bc("branch4.1", F.max_pool2d(x, 3, 1, 1))], 1)
    assert relerr(blk(x.numpy()), ref.numpy()) <= TOL


# ------------------------------------------- the GPU launch plans, emulated in numpy

def emulate(group, bufs, cfg, splits=None):
    """Run `group` as conv.cu would, from its descriptor table: the flat tile map
    (K chunks included), the per-kind gather (flat offsets of the gather table), the
    epilogue's routing of rows to (slot, channel count, offset). bufs: slot -> numpy
    NCHW, written in place. (The kernel itself runs on the CPU in
    test_inception_kernel_host.py.)"""
    n, _, H, W = bufs[group.slots[0]].shape
    HW, ncols = H * W, n * H * W
    desc = group.descriptors(n, H, W, cfg, splits=splits)
    nseg = len(desc)
    grid = group.grid_size(desc, n, H, W, cfg)
    ntile = -(-ncols // cfg.bn)
    seen = set()
    for b in range(grid):
        s = 0
        while s + 1 < nseg and b >= desc[s + 1, _conv.F_TILE0]:
            s += 1
        local = b - desc[s, _conv.F_TILE0]
        mt = desc[s, _conv.F_MTILES]
        tile, z = local % (mt * ntile), local // (mt * ntile)
        kbeg = z * desc[s, _conv.F_KCHUNK]
        assert (kbeg < desc[s, _conv.F_K] or desc[s, _conv.F_KIND] == _conv.KIND_MAXPOOL) and \
            desc[s, _conv.F_KCHUNK] % cfg.bk == 0
        seen.add((s, tile % mt, tile // mt, z))
    assert len(seen) == grid == sum(d[_conv.F_MTILES] * ntile * d[_conv.F_SPLITS] for d in desc)
    j = np.arange(ncols)
    img, pix = np.divmod(j, HW)
    oy, ox = np.divmod(pix, W)
    for s, (seg, d) in enumerate(zip(group.segments, desc)):
        src = bufs[group.slots[d[_conv.F_SRC]]]
        cin, K, M = d[_conv.F_CIN], d[_conv.F_K], d[_conv.F_M]
        assert src.shape[1] == cin and seg.wt.shape == (K, M)
        flat = src.reshape(n, -1).astype(np.float64)
        kind = d[_conv.F_KIND]
        if kind == _conv.KIND_MAXPOOL:  # no GEMM: the pooled source, rows = channels
            assert K == 0 and M == cin and d[_conv.F_NPARTS] == 1
            pad = np.pad(src.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)),
                         constant_values=-np.inf)
            pooled = np.lib.stride_tricks.sliding_window_view(pad, (3, 3), axis=(2, 3)).max(axis=(4, 5))
            first, slot, ctot, off = d[_conv.F_PART0: _conv.F_PART0 + 4]
            dst = bufs[group.slots[slot]]
            assert dst.shape[1] == ctot and first == 0
            dst[:, off:off + M] = pooled
            continue
        wt = seg.wt
        if kind in (_conv.KIND_RXR, _conv.KIND_RXRT):
            tab = _conv.gather_table(cin, seg.r, H, W).astype(np.int64)
            if kind == _conv.KIND_RXRT:  # K tap-major: a k-tile is one tap (the kernel's premise)
                assert cfg.tc and cin % cfg.bk == 0
                order = _conv.tap_major_order(cin, seg.r)
                tab, wt = tab[order], wt[order]
                taps = _conv.packed_taps(cin, seg.r, H, W, tap_major=True) & 63
                assert (taps.reshape(-1, cfg.bk) == taps[::cfg.bk, None]).all()
            y, x = oy[None] + tab[:, 1:2], ox[None] + tab[:, 2:3]
            ok = (y >= 0) & (y < H) & (x >= 0) & (x < W)
            idx = np.where(ok, pix[None] + tab[:, 0:1], 0)
            B = np.where(ok, flat[img[None], idx], 0.0)
        else:
            s64 = src.astype(np.float64)
            if kind == _conv.KIND_POOL:
                pad = np.pad(s64, ((0, 0), (0, 0), (1, 1), (1, 1)), constant_values=-np.inf)
                s64 = np.lib.stride_tricks.sliding_window_view(pad, (3, 3), axis=(2, 3)).max(axis=(4, 5))
            B = s64.transpose(1, 0, 2, 3).reshape(cin, ncols)
        out = np.maximum(wt.T.astype(np.float64) @ B + seg.bias[:, None], 0)
        for m in range(M):
            p = 0
            while p + 1 < d[_conv.F_NPARTS] and m >= d[_conv.F_PART0 + 4 * (p + 1)]:
                p += 1
            first, slot, ctot, off = d[_conv.F_PART0 + 4 * p: _conv.F_PART0 + 4 * p + 4]
            dst = bufs[group.slots[slot]]
            assert dst.shape[1] == ctot
            dst[:, off + m - first] = out[m].reshape(n, H, W)


@pytest.mark.parametrize("cfg", _conv.CONFIGS, ids=lambda c: c.name)
@pytest.mark.parametrize("module", [1, 4, 9])
def test_gpu_plan_emulated(module, cfg, rng):
    blk = InceptionBlock(module, seed=7)
    n, H, W = 3, 5, 7
    x = rand_x(rng, n, blk.in_channels, H, W)
    g1, g2 = blk.groups()
    # fused 1x1s + the stored max-pool; 3x3 + 5x5 + the pool branch's 1x1
    assert len(g1.segments) == 2 and len(g2.segments) == 3
    b1 = blk.params["b2_reduce"][0].shape[0]
    c1 = blk.params["b3_reduce"][0].shape[0]
    bufs = {"x": x, "y": np.full((n, blk.out_channels, H, W), np.nan, np.float32),
            "t3": np.full((n, b1, H, W), np.nan, np.float32),
            "t5": np.full((n, c1, H, W), np.nan, np.float32),
            "xp": np.full(x.shape, np.nan, np.float32)}
    emulate(g1, bufs, cfg, g1.choose_splits(n, H, W, cfg, 132))
    emulate(g2, bufs, cfg, g2.choose_splits(n, H, W, cfg, 132))
    assert not np.isnan(bufs["y"]).any()
    assert relerr(bufs["y"], blk.forward_cpu(x)) <= TOL


def test_table6_plan_emulated(rng):
    for module in (1, 8, 9):
        s = Table6Set(module, seed=1)
        x = rand_x(rng, 1, 192, s.hw, s.hw)
        y = np.full((1, s.out_channels, s.hw, s.hw), np.nan, np.float32)
        g = s.group()
        assert len(g.segments) == 1  # one GEMM over the concatenated weights
        emulate(g, {"x": x, "y": y}, _conv.CONFIGS[2])
        assert relerr(y, s.forward_cpu(x)) <= TOL


def test_choose_config_small_and_large():
    blk = InceptionBlock(5)
    g1, g2 = blk.groups()
    small = _conv.choose_config(g2.segments, 1 * 14 * 14, 132)
    large = _conv.choose_config(g2.segments, 128 * 14 * 14, 132)
    assert small.bm * small.bn < large.bm * large.bn


def test_conv_spec_errors():
    w = np.ones((4, 3, 2, 2), np.float32)
    with pytest.raises(ValueError, match="R odd"):
        _conv.ConvSpec(w, np.ones(4), "x", ("y", 0))
    with pytest.raises(ValueError, match="bias"):
        _conv.ConvSpec(np.ones((4, 3, 1, 1)), np.ones(3), "x", ("y", 0))
    with pytest.raises(ValueError, match="cover"):
        _conv.ConvSpec(np.ones((4, 3, 1, 1)), np.ones(4), "x", [("y", 0, 3)])
    with pytest.raises(ValueError, match="1x1"):
        _conv.ConvSpec(np.ones((4, 3, 3, 3)), np.ones(4), "x", ("y", 0), pool=True)


def test_run_script_cpu_path(capsys):
    from tsm_core import has_gpu

    if has_gpu():
        pytest.skip("run.py takes the GPU path here (covered by test_inception_gpu.py)")
    from tsm_apps.inception import run

    assert run.main(["--module", "8", "--batch", "2", "--repeat", "2"]) == 0
    out = capsys.readouterr().out
    assert "no CUDA GPU" in out and "max relative difference to torch (CPU)" in out
    diff = float(out.strip().split()[-1])
    assert diff <= TOL
    assert run.main(["--table6"]) == 0
    assert "Table 6 set 9" in capsys.readouterr().out


def test_docstring_examples_run():
    import doctest

    import tsm_apps.inception._block
    import tsm_apps.inception._table6
    import tsm_apps.inception.bench
    import tsm_apps.inception.run

    for mod in (tsm_apps.inception._block, tsm_apps.inception._table6, tsm_apps.inception.bench,
                tsm_apps.inception.run, _conv):
        result = doctest.testmod(mod, optionflags=doctest.ELLIPSIS)
        assert result.attempted > 0 and result.failed == 0, mod.__name__


def test_describe_names_the_fused_launches():
    g1, g2 = InceptionBlock(2).groups()
    d1, d2 = g1.describe(1, 28, 28, sm_count=132), g2.describe(1, 28, 28, sm_count=132)
    assert "1x1 on x: M=288 K=256 -> y[0:], t3[0:], t5[0:]" in d1
    assert "maxpool3x3 on x: M=256 K=0 -> xp[0:]" in d1
    assert "1x1 on xp: M=64 K=256 -> y[416:]" in d2
    assert "3x3 implicit GEMM on t3: M=192 K=1152 -> y[128:]" in d2
    assert "5x5 implicit GEMM on t5: M=96 K=800 -> y[320:]" in d2


def test_choose_splits_only_when_sms_idle():
    g1, g2 = InceptionBlock(9).groups()
    small = next(c for c in _conv.CONFIGS if c.tag == "32x32")
    sp1 = g2.choose_splits(1, 7, 7, small, 132)  # 5b at batch 1: ~32 blocks
    assert max(sp1) > 1
    for seg, sp in zip(g2.segments, sp1):
        chunks, chunk = _conv.split_k(seg.k, small.bk, sp)
        assert chunks == sp and chunk >= 8 * small.bk
    big = _conv.CONFIGS[0]
    assert g2.choose_splits(128, 7, 7, big, 132) == [1] * len(g2.segments)


def test_split_variants_for_launches_under_a_wave():
    # The tuner's K chunkings: the model's first, then for register-staged tiles with
    # fewer blocks than a wave each segment cut in up to 8 chunks of >= 2 K steps,
    # one variant per label (most chunks of a segment); none for the async tiles or a
    # forced TSM_CONV_SPLITK.
    g = Table6Set(2).group()
    small = next(c for c in _conv.CONFIGS if c.tag == "32x32")
    v = g.split_variants(1, 28, 28, small, 132)
    assert v[0] == g.choose_splits(1, 28, 28, small, 132) and len(v) > 1
    labels = [g.tune_label(small, sp, 1, 28, 28, 132) for sp in v]
    assert len(set(labels)) == len(labels) and labels[0] == small.tag
    assert all(lab == f"32x32/k{max(sp)}" for lab, sp in zip(labels[1:], v[1:]))
    for sp in v:
        for seg, chunks in zip(g.segments, sp):
            n_chunks, chunk = _conv.split_k(seg.k, small.bk, chunks)
            assert n_chunks == chunks and (chunks == 1 or chunk >= 2 * small.bk)
    for cfg in _conv.CONFIGS:
        if not cfg.splittable:
            assert cfg.stages and len(g.split_variants(1, 28, 28, cfg, 132)) == 1
        else:
            assert not cfg.stages or (cfg.tc and cfg.bm == 64)
    tc64 = next(c for c in _conv.CONFIGS if c.tag == "t64x128")
    assert len(g.split_variants(1, 28, 28, tc64, 132)) > 1  # 7 tiles: TC split-K
    big = InceptionBlock(2).groups()[1]
    assert len(big.split_variants(128, 28, 28, _conv.CONFIGS[0], 132)) == 1  # many waves


def test_split_variants_respect_a_forced_split(monkeypatch):
    monkeypatch.setenv("TSM_CONV_SPLITK", "2")
    g = Table6Set(2).group()
    small = next(c for c in _conv.CONFIGS if c.tag == "32x32")
    assert g.split_variants(1, 28, 28, small, 132) == [g.choose_splits(1, 28, 28, small, 132)]


def test_table6_call_on_the_cpu(rng):
    s = Table6Set(8, seed=1)
    x = rand_x(rng, 1, 192, 7, 7)
    np.testing.assert_array_equal(s(x), s.forward_cpu(x))
    before = x.copy()
    for bad in (x[:, :100], x.astype(np.float64), x[0]):
        with pytest.raises(ValueError, match="192"):
            s(bad)
    with pytest.raises(TypeError):
        s(x.tolist())
    assert np.array_equal(x, before) and s._fast == {}


def test_split_k_chunks():
    for k in (1, 7, 16, 17, 100, 832, 1728):
        for bk in (8, 16):
            for want in (1, 2, 3, 8):
                chunks, chunk = _conv.split_k(k, bk, want)
                assert 1 <= chunks <= want and chunk % bk == 0
                assert (chunks - 1) * chunk < k <= chunks * chunk


def test_tuning_wanted_rules(monkeypatch):
    g1, _ = InceptionBlock(9).groups()
    for var in ("TSM_CONV_TUNE", "TSM_CONV_TILE", "TSM_CONV_SPLITK"):
        monkeypatch.delenv(var, raising=False)
    big = -(-_conv.TUNE_MIN_COLUMNS // 49)
    assert g1.tuning_wanted(big, 7, 7) and not g1.tuning_wanted(big - 1, 7, 7)
    monkeypatch.setenv("TSM_CONV_TUNE", "0")
    assert not g1.tuning_wanted(big, 7, 7)
    monkeypatch.delenv("TSM_CONV_TUNE")
    monkeypatch.setenv("TSM_CONV_TILE", "a64x128")  # a forced tile is never re-chosen
    assert not g1.tuning_wanted(big, 7, 7)
    monkeypatch.delenv("TSM_CONV_TILE")
    g1.tune = False
    assert not g1.tuning_wanted(big, 7, 7)
    g1.tune, g1.config = None, _conv.CONFIGS[0]
    assert not g1.tuning_wanted(big, 7, 7)


def test_group_dims_remembered_and_errors_unchanged():
    # _dims caches check() per layout; a wrong layout still raises check's error.
    blk = InceptionBlock(8)
    g1, _ = blk.groups()
    c3, c5 = blk.params["b2_reduce"][0].shape[0], blk.params["b3_reduce"][0].shape[0]

    class A:  # a stand-in with the attributes check() reads
        def __init__(self, shape):
            self.shape, self.ndim, self.dtype = shape, len(shape), np.dtype(np.float32)
            self.strides = tuple(int(np.prod(shape[i + 1:])) * 4 for i in range(len(shape)))
            self.flags = type("F", (), {"c_contiguous": True})()

    good = {"x": A((2, 832, 7, 7)), "y": A((2, 832, 7, 7)), "t3": A((2, c3, 7, 7)),
            "t5": A((2, c5, 7, 7)), "xp": A((2, 832, 7, 7))}
    assert g1._dims(good) == (2, 7, 7) and len(g1._checked) == 1
    assert g1._dims(good) == (2, 7, 7) and len(g1._checked) == 1
    with pytest.raises(ValueError, match="channels"):
        g1._dims({**good, "t3": A((2, c3 + 1, 7, 7))})
    with pytest.raises(ValueError, match="missing"):
        g1._dims({k: v for k, v in good.items() if k != "xp"})


def test_maxpool_spec_and_group_errors():
    with pytest.raises(ValueError, match="positive"):
        _conv.MaxPoolSpec(0, "x", ("p", 0))
    with pytest.raises(ValueError, match=">= 0"):
        _conv.MaxPoolSpec(8, "x", ("p", -1))
    p = _conv.MaxPoolSpec(8, "x", ("p", 3))
    assert p.dst == [("p", 3, 8)] and p.cin == p.cout == 8
    g = _conv.ConvGroup([p], channels={"p": 16})
    (seg,) = g.segments
    assert seg.kind == _conv.KIND_MAXPOOL and seg.k == 0 and seg.m == 8
    assert g.flops_per_pixel == 0
    assert _conv.split_k(0, 16, 4) == (1, 16)
    d = g.descriptors(2, 5, 7, _conv.CONFIGS[0])
    assert d[0, _conv.F_K] == 0 and d[0, _conv.F_M] == 8 and d[0, _conv.F_SPLITS] == 1
    specs = [_conv.MaxPoolSpec(8, s, (s + "o", 0)) for s in "abc"]
    with pytest.raises(ValueError, match="at most 5 tensors"):
        _conv.ConvGroup(specs)


def test_packed_taps_and_async_limits(monkeypatch):
    t = _conv.packed_taps(3, 3, 5, 7)
    assert t.shape == (27,) and t.dtype == np.int32
    k = np.arange(27)
    ci, tap = np.divmod(k, 9)
    ky, kx = np.divmod(tap, 3)
    assert np.array_equal(t & 63, tap)
    assert np.array_equal(t >> 6, ci * 35 + (ky - 1) * 7 + (kx - 1))
    with pytest.raises(ValueError, match="R\\*R <= 64"):
        _conv.packed_taps(1, 9, 9, 9)
    g = _conv.ConvGroup([_conv.ConvSpec(np.ones((2, 1, 9, 9), np.float32), np.ones(2), "x", ("y", 0))])
    assert not _conv.async_ok(g.segments, 9, 9)
    assert not _conv.choose_config(g.segments, 81 * 64, 132, allow_async=False).stages
    monkeypatch.setenv("TSM_CONV_TILE", "a64x128")
    with pytest.raises(ValueError, match="async kernel cannot run"):
        _conv.choose_config(g.segments, 81, 132, allow_async=False)


def test_launcher_is_the_stored_launch():
    g1, _ = InceptionBlock(9).groups()
    assert g1.launcher(0, 2, 7, 7) is None  # no size has run
    sentinel = object()
    g1._launches[0, 2, 7, 7] = sentinel
    assert g1.launcher(0, 2, 7, 7) is sentinel and g1.launcher(1, 2, 7, 7) is None


def test_tensor_core_candidates(monkeypatch):
    # The tensor-core configurations join the model and the tuner only where the
    # device runs them and TSM_CONV_TC (default: TC_CANDIDATES) lets them; forcing
    # one by name works regardless of the switch, never on a device without TF32.
    blk = InceptionBlock(2, seed=0)
    segs = blk.groups()[1].segments
    tc = [c for c in _conv.CONFIGS if c.tc]
    assert [c.tag for c in tc] == ["t128x128", "t64x128", "t64x128b3"] and all(c.stages for c in tc)
    assert all(c.name.startswith("conv_gemm_relu_tc<") for c in tc)
    monkeypatch.setenv("TSM_CONV_TC", "0")
    assert not any(c.tc for c in _conv.candidates(segs, 28, 28))
    monkeypatch.setenv("TSM_CONV_TC", "1")
    got = _conv.candidates(segs, 28, 28)
    assert set(tc) <= set(got) and len(got) == len(_conv.CONFIGS)
    assert not any(c.tc for c in _conv.candidates(segs, 28, 28, allow_tc=False))
    assert not any(c.stages for c in _conv.candidates(segs, 600, 600))  # async_ok fails
    # The model picks among the same set.
    monkeypatch.setenv("TSM_CONV_TC", "0")
    assert not _conv.choose_config(segs, 128 * 28 * 28, 132).tc
    monkeypatch.setenv("TSM_CONV_TILE", "t64x128")
    assert _conv.choose_config(segs, 28 * 28, 132).tag == "t64x128"
    with pytest.raises(ValueError, match="compute capability 8.0"):
        _conv.choose_config(segs, 28 * 28, 132, allow_tc=False)


def test_rel_diff():
    # autotune's agreement test: relative max difference over finite elements, inf
    # where the non-finite pattern differs (NaN for Inf is a disagreement).
    b = np.array([[1.0, -2.0], [4.0, 0.5]], np.float32)
    assert _conv.rel_diff(b, b) == 0.0
    a = b.copy()
    a[1, 0] += 4e-4
    assert abs(_conv.rel_diff(a, b) - 1e-4) < 1e-6
    assert _conv.rel_diff(a, b) > _conv.TUNE_AGREE * 0.99
    bi = b.copy()
    bi[0, 1] = np.inf
    ai = bi.copy()
    assert _conv.rel_diff(ai, bi) == 0.0
    ai[0, 1] = np.nan
    assert _conv.rel_diff(ai, bi) == np.inf
    assert _conv.rel_diff(np.zeros((0, 3), np.float32), np.zeros((0, 3), np.float32)) == 0.0


def test_written_channels_match_the_destinations():
    # autotune poisons exactly the channels a group writes: each spec's destination
    # parts, and nothing of the slots' other channels.
    blk = InceptionBlock(4, seed=0)
    g1, g2 = blk.groups()
    a, b2, c2 = (blk.params[k][0].shape[0] for k in ("b1", "b2", "b3"))
    b2r, c2r = blk.params["b2_reduce"][0].shape[0], blk.params["b3_reduce"][0].shape[0]
    assert sorted(g1._written_channels()) == sorted(
        [("y", 0, a), ("t3", 0, b2r), ("t5", 0, c2r), ("xp", 0, blk.in_channels)])
    assert sorted(g2._written_channels()) == sorted(
        [("y", a, a + b2), ("y", a + b2, a + b2 + c2), ("y", a + b2 + c2, blk.out_channels)])


def test_bench_without_gpu_exits_2(tmp_path, monkeypatch, capsys):
    from tsm_apps.inception import bench
    from tsm_core.runtime import arrays

    monkeypatch.setattr(arrays, "has_gpu", lambda: False)
    assert bench.main("inception", ["--out", str(tmp_path)]) == 2
    cap = capsys.readouterr()
    assert len(cap.err.strip().splitlines()) == 1 and "needs a CUDA GPU" in cap.err and cap.out == ""


@pytest.mark.parametrize("cmd", [["tsm_apps.inception.bench"], ["tsm_core.bench", "inception"]])
def test_bench_without_cupy_exits_2(tmp_path, cmd):
    import subprocess
    import sys

    code = ("import runpy, sys; sys.modules['cupy'] = None; "
            f"runpy.run_module({cmd[0]!r}, run_name='__main__', alter_sys=True)")
    r = subprocess.run([sys.executable, "-c", code, *cmd[1:], "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "CuPy is not installed" in r.stderr


def _clean_env():
    import os

    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP")}


def test_run_script_from_a_checkout(tmp_path):
    # `python apps/inception/run.py` from anywhere, PYTHONPATH unset.
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "apps" / "inception" / "run.py"
    r = subprocess.run([sys.executable, str(script), "--help"], cwd=tmp_path, env=_clean_env(),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "--module" in r.stdout and "--quiet" in r.stdout


def test_run_script_without_installation(tmp_path):
    # No site-packages processing (-S): tsm_core, tsm_apps and tsm_datasets are not
    # installed; numpy alone is put on the path. The script registers the checkout's
    # folders under the package names and runs the CPU path of a small block.
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = _clean_env()
    env["PYTHONPATH"] = str(Path(np.__file__).resolve().parents[1])
    probe = subprocess.run([sys.executable, "-S", "-c", "import importlib.util as u; "
                            "print(u.find_spec('tsm_apps') is None, u.find_spec('apps') is None)"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    if probe.stdout.split() != ["True", "True"]:
        pytest.skip("numpy's folder also holds tsm_apps here: the bootstrap would not run")
    code = "\n".join([
        "import runpy, sys",
        "sys.argv = sys.argv[1:]",
        "try:",
        "    runpy.run_path(sys.argv[0], run_name='__main__')",
        "except SystemExit as e:",
        "    assert not e.code, e.code",
        "m = sys.modules",
        f"assert m['tsm_apps'].__file__.startswith({str(root)!r}), m['tsm_apps'].__file__",
        f"assert m['tsm_datasets'].__file__.startswith({str(root)!r})",
        "assert 'apps' not in m and 'datasets' not in m",
        "print('registered from the checkout')",
    ])
    r = subprocess.run([sys.executable, "-S", "-c", code, str(root / "apps" / "inception" / "run.py"),
                        "--module", "1", "--quiet", "--repeat", "2"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "block 3a" in r.stdout and "registered from the checkout" in r.stdout
