"""CPU tests of the launchers' pure rules (no GPU): the split-K choice."""

import math

import numpy as np
import pytest

from tsm_core.tsm2.launch import _choose_splits


@pytest.mark.parametrize("row_blocks, resident, k, kstep", [
    (1, 396, 65536, 8),      # one row block: split k as far as allowed
    (20, 396, 10240, 8),     # m = 10240, column-major float32
    (60, 396, 30720, 8),
    (960, 264, 30720, 128),  # already many waves: no split needed
    (7, 100, 300, 8),        # short k caps the split
])
def test_splits_fill_the_gpu_within_k(row_blocks, resident, k, kstep):
    s = _choose_splits(row_blocks, resident, k, kstep)
    most = max(1, min(64, k // (4 * kstep)))
    assert 1 <= s <= most                     # every split at least 4 k-steps deep
    if row_blocks * most >= 2 * resident:     # two waves are reachable: reached
        assert row_blocks * s >= 2 * resident
    else:                                     # not reachable: as many splits as allowed
        assert s == most


def test_splits_prefer_a_full_last_wave():
    # 960 blocks on 264 slots: 3.6 waves; 2 splits give 7.3 (eff 0.91), 4 give 14.5
    # (eff 0.97): the search takes the fuller last wave only when it is clearly fuller.
    s = _choose_splits(960, 264, 30720, 128)
    waves = 960 * s / 264
    assert waves / math.ceil(waves) >= 0.9


# ------------------------------------------------------------------ row-major TSM2R lane groups

def _resolve_row_major(dtype, n, **kw):
    from tsm_core.tsm2 import launch as _tsm2

    lay = _tsm2.ALayout(col=False, lda=4096, vec=16 // np.dtype(dtype).itemsize)
    # splits pinned: resolve_tsm2r then needs no device
    return _tsm2.resolve_tsm2r(4096, 4096, n, dtype, lay, _tsm2.TSM2RConfig(splits=1, **kw))


@pytest.mark.parametrize("dtype, n, rgroups", [("float32", 16, 2), ("float32", 33, 2), ("float32", 8, 1),
                                               ("float32", 2, 1), ("float64", 16, 1)])
def test_row_groups_default(dtype, n, rgroups):
    cfg = _resolve_row_major(dtype, n, tc=-1)
    assert cfg.rgroups == rgroups
    from tsm_core.tsm2 import launch as _tsm2
    rows = _tsm2.v3_rows(cfg, _tsm2.ALayout(col=False, lda=4096, vec=4), np.dtype(dtype).itemsize)
    assert rows == (cfg.t1 // 32) * cfg.rpt * rgroups
    assert cfg.t3 % ((32 // rgroups) * (16 // (4 if dtype == "float32" else 8))) == 0  # whole warp steps


def test_row_groups_refused_with_column_groups_or_uneven():
    with pytest.raises(ValueError, match="either the columns"):
        _resolve_row_major("float32", 16, groups=2, rgroups=2)
    with pytest.raises(ValueError, match="divide the 32 lanes"):
        _resolve_row_major("float32", 16, rgroups=3)
    # explicit column groups keep the row-group default off
    assert _resolve_row_major("float32", 16, groups=2).rgroups == 1


# ------------------------------------------------------------------ TSM2L opt1: which kernel

@pytest.mark.parametrize("dtype, col, vec, k, n, warp, kernel", [
    ("float32", False, 4, 8, 8, 0, "tsm2l_opt1w<float,2,8,4>"),     # 32-byte rows
    ("float32", False, 4, 16, 16, 0, "tsm2l_opt1w<float,4,16,4>"),  # 64-byte rows
    ("float64", False, 2, 8, 8, 0, "tsm2l_opt1w<double,4,8,2>"),
    ("float64", False, 2, 16, 16, 0, "tsm2l_opt1<"),                # 128-byte rows: the tiles
    ("float64", False, 2, 16, 16, 1, "tsm2l_opt1w<double,8,16,2>"),  # unless asked for
    ("float32", False, 4, 8, 8, -1, "tsm2l_opt1<"),
    ("float32", False, 4, 8, 17, 0, "tsm2l_opt1<"),                 # n > 16
    ("float32", False, 1, 9, 8, 0, "tsm2l_opt1<"),                  # rows not 16-byte aligned
    ("float32", True, 4, 8, 8, 0, "tsm2l_opt1<"),                   # column-major A
    ("float32", False, 4, 12, 5, 0, "tsm2l_opt1w<float,4,8,4>"),   # TN from n, a lane with no k
    ("float64", False, 2, 32, 12, 1, "tsm2l_opt1w<double,16,16,2>"),  # TN a multiple of the 16 lanes
])
def test_tsm2l_opt1_kernel_choice(dtype, col, vec, k, n, warp, kernel):
    import numpy as np

    from tsm_core.tsm2 import launch as _tsm2

    lay = _tsm2.ALayout(col=col, lda=(10**6 if col else k), vec=vec)
    cfg = _tsm2.resolve_tsm2l(10**6, k, n, np.dtype(dtype), lay, _tsm2.TSM2LConfig(tcf=1, warp=warp))
    assert _tsm2.tsm2l_name(cfg, np.dtype(dtype), lay).startswith(kernel)
    if cfg.warp == 1:
        assert _tsm2.tsm2l_smem_bytes(cfg, np.dtype(dtype).itemsize, lay) == 0
        lpr = cfg.kt // cfg.vec
        assert _tsm2.tsm2l_rows(cfg, lay) == (cfg.t1 // 32) * cfg.u * (32 // lpr)
        assert cfg.t2 % lpr == 0 and cfg.t2 >= n and k <= cfg.kt


def test_tsm2l_opt1w_refused_where_it_cannot_run():
    import numpy as np

    from tsm_core.tsm2 import launch as _tsm2

    lay = _tsm2.ALayout(col=False, lda=8, vec=4)
    with pytest.raises(ValueError, match="tsm2l_opt1w"):
        _tsm2.resolve_tsm2l(1000, 8, 8, np.dtype("float32"), lay, _tsm2.TSM2LConfig(tcf=1, warp=1, kt=16))
    with pytest.raises(ValueError, match="warp must be"):
        _tsm2.resolve_tsm2l(1000, 8, 8, np.dtype("float32"), lay, _tsm2.TSM2LConfig(tcf=1, warp=3))


# ------------------------------------------------------------------ split-K: the cost of the partial sums

def test_split_cap_bounds_the_partial_sums():
    from tsm_core.tsm2.launch import SPLIT_TRAFFIC_MAX, split_cap

    for k, n in [(10240, 16), (10240, 8), (30720, 2), (100, 64), (1, 1)]:
        s = split_cap(k, n)
        assert s >= 1
        if s > 1:  # partial sums written and read back: 2 s m n against A's m k
            assert 2 * s * n <= SPLIT_TRAFFIC_MAX * k + 1e-9
            assert 2 * (s + 1) * n > SPLIT_TRAFFIC_MAX * k  # the largest such


@pytest.mark.parametrize("row_blocks, resident, k, kstep, n", [
    (20, 396, 10240, 8, 16),    # column-major float32, m = 10240: two waves out of reach
    (20, 396, 10240, 8, 8),
    (40, 396, 20480, 8, 16),
    (160, 660, 10240, 64, 16),  # float64 on DMMA: two waves reachable but ragged
    (60, 396, 30720, 8, 16),    # under the cap already: as without it
    (320, 396, 10240, 256, 16),
])
def test_splits_capped_by_partial_traffic(row_blocks, resident, k, kstep, n):
    from tsm_core.tsm2.launch import split_cap

    s = _choose_splits(row_blocks, resident, k, kstep, n)
    assert 1 <= s <= split_cap(k, n)
    cap = split_cap(k, n)
    if row_blocks * cap <= resident:  # under one wave even at the cap: as many as allowed
        assert s == cap
    else:
        waves = row_blocks * s / resident
        assert waves / math.ceil(waves) >= 0.9  # a nearly full last wave
    free = _choose_splits(row_blocks, resident, k, kstep)
    if free <= split_cap(k, n) and (row_blocks * free / resident) / math.ceil(row_blocks * free / resident) >= 0.9:
        assert s == free  # the cap changes nothing where it does not bind


def test_tsm2l_opt1w_rounds_tn_to_whole_outputs_per_lane():
    import numpy as np

    from tsm_core.tsm2 import launch as _tsm2

    lay = _tsm2.ALayout(col=False, lda=32, vec=4)  # float32, k = 32: 8 lanes per row
    cfg = _tsm2.resolve_tsm2l(1000, 32, 12, np.dtype("float32"), lay, _tsm2.TSM2LConfig(tcf=1, t2=12))
    assert cfg.warp != 1  # 128-byte rows: opt1w only when asked for
    cfg = _tsm2.resolve_tsm2l(1000, 32, 12, np.dtype("float32"), lay, _tsm2.TSM2LConfig(tcf=1, t2=12, warp=1))
    assert (cfg.kt // cfg.vec, cfg.t2) == (8, 16)


def test_splits_min_waves():
    # m = 20480 on tsm2r_v3x (320 row blocks, 660 resident): one wave is enough
    assert _choose_splits(320, 660, 20480, 64, 8, min_waves=0.9) == 2
    assert _choose_splits(320, 660, 20480, 64, 8) >= 5  # the default asks for two waves


@pytest.mark.parametrize("n, kw, kernel", [
    (16, {}, "tsm2r_v3x_sk"), (8, {}, "tsm2r_v3x"), (2, dict(tc=1), "tsm2r_v3x"),
    (2, {}, "tsm2r_v3r"),  # m * k = 2^24, n <= 2: the FMA kernel (SMALL_N2_ELEMS)
    (16, dict(streamk=-1), "tsm2r_v3x"), (16, dict(tc=-1), "tsm2r_v3r"),
    (16, dict(rgroups=2), "tsm2r_v3r"), (8, dict(groups=2), "tsm2r_v3r")])
def test_float32_row_major_kernel_choice(n, kw, kernel):
    from tsm_core.tsm2 import launch as _tsm2

    lay = _tsm2.ALayout(col=False, lda=4096, vec=4)
    cfg = _resolve_row_major("float32", n, **kw)
    assert _tsm2.tsm2r_name(cfg, np.float32, lay).startswith(kernel + "<")


def test_v3x_rows_and_knobs():
    from tsm_core.tsm2 import launch as _tsm2

    lay = _tsm2.ALayout(col=False, lda=4096, vec=4)
    cfg = _resolve_row_major("float32", 16, tc=1, rpt=2, t1=256)
    assert _tsm2.v3_rows(cfg, lay, 4) == 8 * 2 * 16
    assert cfg.t3 % (16 * cfg.u) == 0 and cfg.t3 % 32 == 0
    with pytest.raises(ValueError, match="u must be"):
        _resolve_row_major("float32", 16, tc=1, u=3)
    with pytest.raises(ValueError, match="tensor-core kernels"):
        _resolve_row_major("float64", 16, u=2, tc=-1)
    cfg64 = _resolve_row_major("float64", 16, u=4)
    assert cfg64.t3 % 32 == 0 and _tsm2.tsm2r_name(cfg64, np.float64, lay).endswith(",4>")


def test_streamk_choice():
    """tsm2r_v3x runs stream-K by itself for 16-column chunks on its default block
    shape with enough (row block, k-tile) units; split-K otherwise, or when asked."""
    from tsm_core.tsm2 import launch as _tsm2

    lay = _tsm2.ALayout(col=False, lda=4096, vec=4)
    cfg = _resolve_row_major("float32", 16)
    assert (cfg.streamk, cfg.minb, cfg.t1, cfg.t2) == (1, 2, 256, 16)
    assert cfg.splits == 1  # not used by stream-K
    # large problems: one block of 16 warps per SM, A through a 2-stage cp.async ring
    lay2 = _tsm2.ALayout(col=False, lda=20480, vec=4)
    big = _tsm2.resolve_tsm2r(20480, 20480, 16, np.float32, lay2, _tsm2.TSM2RConfig(splits=1))
    assert (big.streamk, big.minb, big.t1, big.t2, big.stages) == (1, 1, 512, 16, 2)
    assert _tsm2.v3_smem_bytes(big, 4, lay2) <= 227 * 1024
    # 16 warps need a 16-byte aligned A (scalar loads would spill)
    with pytest.raises(ValueError, match="16-byte aligned"):
        _tsm2.resolve_tsm2r(4096, 4097, 16, np.float32, _tsm2.ALayout(col=False, lda=4097, vec=1),
                            _tsm2.TSM2RConfig(splits=1, tc=1, t1=512))
    # asking for the ring depth or the launch bounds keeps 8-warp blocks
    for kw in (dict(stages=1), dict(minb=2)):
        c = _tsm2.resolve_tsm2r(20480, 20480, 16, np.float32, lay2, _tsm2.TSM2RConfig(splits=1, **kw))
        assert c.t1 == 256, kw
    assert _resolve_row_major("float32", 12).streamk == 1  # a 16-column chunk too
    for n, kw in [(8, {}), (16, dict(t1=256)), (16, dict(streamk=-1)), (40, dict(tc=-1))]:
        assert _resolve_row_major("float32", n, **kw).streamk != 1, (n, kw)
    # too few units (128-row blocks x 128-deep k-tiles) for a wave of its own
    small = _tsm2.resolve_tsm2r(1024, 1024, 16, np.float32, lay, _tsm2.TSM2RConfig(splits=1))
    assert small.streamk == -1
    # a misaligned A (scalar loads) is not chosen by itself, and when forced keeps
    # one block per SM (two would spill)
    lay1 = _tsm2.ALayout(col=False, lda=4097, vec=1)
    c1 = _tsm2.resolve_tsm2r(4096, 4097, 16, np.float32, lay1, _tsm2.TSM2RConfig(splits=1))
    assert c1.streamk == -1
    c1 = _tsm2.resolve_tsm2r(4096, 4097, 16, np.float32, lay1, _tsm2.TSM2RConfig(splits=1, streamk=1))
    assert c1.minb == 1 and _tsm2.tsm2r_name(c1, np.float32, lay1).startswith("tsm2r_v3x_sk<1,")
    # forced on 4 warps: 4 blocks per SM in its launch bounds
    c4 = _resolve_row_major("float32", 16, streamk=1, t1=128)
    assert c4.minb == 4 and _tsm2.tsm2r_name(c4, np.float32, lay).startswith("tsm2r_v3x_sk<4,4,")


def test_streamk_choice_float64():
    """tsm2r_v3d runs stream-K by itself on its default block shape at both chunk
    widths (4 and 3 blocks per SM in its launch bounds), n <= 2 on large problems;
    split-K when asked, for other shapes, with a misaligned A, or on the FMA kernel."""
    from tsm_core.tsm2 import launch as _tsm2

    lay = _tsm2.ALayout(col=False, lda=4096, vec=2)
    for n, minb in [(16, 4), (9, 4), (8, 3), (4, 3)]:
        cfg = _resolve_row_major("float64", n)
        assert (cfg.streamk, cfg.minb) == (1, minb), n
        assert _tsm2.tsm2r_name(cfg, np.float64, lay).startswith("tsm2r_v3d_sk<2,4,")
    for n, kw in [(16, dict(streamk=-1)), (16, dict(t1=256)), (16, dict(rpt=4)), (2, dict(tc=-1))]:
        assert _resolve_row_major("float64", n, **kw).streamk != 1, (n, kw)
    # n <= 2 on DMMA only past SMALL_N2_ELEMS elements of A (the FMA kernel below)
    big = _tsm2.ALayout(col=False, lda=10240, vec=2)
    c2 = _tsm2.resolve_tsm2r(10240, 10240, 2, np.float64, big, _tsm2.TSM2RConfig(splits=1))
    assert (c2.tc, c2.streamk, c2.minb) == (1, 1, 3)
    small = _tsm2.resolve_tsm2r(4096, 4096, 2, np.float64, lay, _tsm2.TSM2RConfig(splits=1))
    assert small.tc == -1 and _tsm2.tsm2r_name(small, np.float64, lay).startswith("tsm2r_v3r<")
    split = _tsm2.resolve_tsm2r(4096, 4096, 16, np.float64, lay, _tsm2.TSM2RConfig(splits=3))
    assert split.streamk == -1 and split.splits == 3  # an explicit split count is split-K
    lay1 = _tsm2.ALayout(col=False, lda=4097, vec=1)
    assert _tsm2.resolve_tsm2r(4096, 4097, 16, np.float64, lay1, _tsm2.TSM2RConfig(splits=1)).streamk == -1
    # forced on another shape: no launch bounds of its own (the wave follows the
    # registers it gets)
    assert _resolve_row_major("float64", 16, streamk=1, stages=2).minb == 1


@pytest.mark.parametrize("dtype, kw", [("float32", dict(streamk=2)), ("float32", dict(streamk=1, tc=-1)),
                                       ("float64", dict(streamk=1, tc=-1))])
def test_streamk_bad_values(dtype, kw):
    with pytest.raises(ValueError, match="streamk"):
        _resolve_row_major(dtype, 16, **kw)


# ------------------------------------------------------------------ column-major one wave

@pytest.mark.parametrize("m, k, n, itemsize, vec, want", [
    (20480, 20480, 16, 8, 2, (256, 3, 3)),    # 40 row blocks x 3 = 120 of 132 SMs
    (30720, 30720, 8, 8, 2, (256, 3, 2)),
    (10240, 10240, 2, 8, 2, (256, 3, 6)),
    (8192, 8192, 2, 4, 4, (128, 4, 8)),       # float32 with n <= 4
    (20480, 20480, 8, 4, 4, None),            # float32 with 8 columns: the former defaults
    (100000, 1000, 8, 8, 2, None),            # 196 row blocks: no single wave
    (50000, 4000, 16, 8, 2, None),            # 98 row blocks: 74% or 148% of the SMs
    (4096, 4096, 16, 8, 2, None),             # the split cap (5) leaves 40 blocks
    (20480, 20480, 16, 8, 1, None),           # misaligned A (8-byte copies)
])
def test_column_major_one_wave(m, k, n, itemsize, vec, want):
    from tsm_core.tsm2 import launch as _tsm2

    lay = _tsm2.ALayout(col=True, lda=m, vec=vec)
    got = _tsm2._col_one_wave(m, k, n, itemsize, lay, _tsm2.choose_tn(n), 132)
    assert got == want
    if got is not None:
        t1, stages, splits = got
        blocks = -(-m // (t1 * vec)) * splits
        assert _tsm2.ONE_WAVE_FILL * 132 <= blocks <= 132
        assert splits <= _tsm2.split_cap(k, n)


# ------------------------------------------------------------------ ABFT-sized n <= 2

@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("m, k, n, fma", [
    (4096, 4096, 2, True), (8192, 8192, 1, True), (5003, 8192, 2, True),
    (2048, 2048, 2, False),    # below the range: the former default
    (10240, 10240, 2, False),  # above it
    (4096, 4096, 3, False),    # n > 2
])
def test_small_n2_rule(dtype, m, k, n, fma):
    from tsm_core.tsm2 import launch as _tsm2

    lay = _tsm2.ALayout(col=False, lda=k, vec=16 // np.dtype(dtype).itemsize)
    c = _tsm2.resolve_tsm2r(m, k, n, np.dtype(dtype), lay, _tsm2.TSM2RConfig(splits=1))
    assert ((c.tc, c.t1, c.rpt, c.stages) == (-1, 128, 8, 1)) == fma
    # any knob of its own, or a misaligned A, keeps the former choice
    c2 = _tsm2.resolve_tsm2r(m, k, n, np.dtype(dtype), lay, _tsm2.TSM2RConfig(splits=1, rpt=4))
    assert c2.rpt == 4
    lay1 = _tsm2.ALayout(col=False, lda=k + 1, vec=1)
    c3 = _tsm2.resolve_tsm2r(m, k, n, np.dtype(dtype), lay1, _tsm2.TSM2RConfig(splits=1))
    assert (c3.tc, c3.t1, c3.rpt, c3.stages) != (-1, 128, 8, 1)
