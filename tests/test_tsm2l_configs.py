"""TSM2L's tuning space: every configuration the autotuner may try compiles without
spills (NVRTC, no GPU needed), and on the GPU each new kernel configuration matches a
float64 numpy reference.

GPU checks: signed random data, C poisoned with NaN first (an unwritten element
fails), awkward m (1, 7, 1e5 + 3), odd k and n, alpha and beta, column- and
row-major A. Tolerance: |C - ref| <= (gamma_{k+3}(C's precision) + gamma_{k+3}(float64))
x 2 x (|alpha| |A| |B| + |beta| |C0|), elementwise, gamma_j = j u / (1 - j u): the
standard bound of a length-k dot product plus the alpha/beta update, doubled.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from tsm_core.runtime.compile import compile_report
from tsm_core.tsm2 import autotune as _autotune
from tsm_core.tsm2 import configs as _configs
from tsm_core.tsm2 import launch as _tsm2

DTYPES = (np.float32, np.float64)
# (k, n): the sweep's k = n, odd sizes, and the part-filled chunks (n = 12 in TN = 16)
KN = ((1, 1), (3, 5), (7, 16), (8, 8), (12, 12), (16, 3), (16, 16))
M_AWKWARD = (1, 7, 1000, 10**5 + 3)


def _layout(order: str, m: int, k: int, dtype) -> _tsm2.ALayout:
    """What a_layout gives a fresh, 256-byte aligned A of this order (no GPU)."""
    item = np.dtype(dtype).itemsize
    full = 16 // item
    if order == "F" and m > 1:
        return _tsm2.ALayout(col=True, lda=m, vec=full if m % full == 0 else 1)
    return _tsm2.ALayout(col=False, lda=k, vec=full if k % full == 0 else (2 if item == 4 and k % 2 == 0 else 1))


def _candidate_names() -> set:
    names = set()
    for dtype in DTYPES:
        for order in ("C", "F"):
            for m in (10**4, 10**5, 10**6, 10**5 + 3):
                for k, n in KN:
                    lay = _layout(order, m, k, dtype)
                    base = _tsm2.resolve_tsm2l(m, k, n, dtype, lay, _tsm2.TSM2LConfig(tcf=1))
                    cands, _ = _autotune._candidates_tsm2l(base, m, k, n, dtype, lay)
                    for c in cands:
                        r = _tsm2.resolve_tsm2l(m, k, n, dtype, lay, replace(c, tcf=c.tcf or 1))
                        names.add(_tsm2.tsm2l_name(r, dtype, lay))
    return names


def test_candidates_include_the_new_kernels():
    lay = _layout("F", 10**5, 16, np.float32)
    base = _tsm2.resolve_tsm2l(10**5, 16, 16, np.float32, lay, _tsm2.TSM2LConfig(tcf=1))
    cands, default = _autotune._candidates_tsm2l(base, 10**5, 16, 16, np.float32, lay)
    assert cands[0] == default  # the launcher's own configuration is always timed
    assert any(c.direct == 1 and c.stage == -1 for c in cands)
    assert {c.t1 for c in cands if c.direct == 1} == {t for t, _ in _configs.OPT1D_SHAPES_TRIED}
    lay = _layout("C", 10**5, 8, np.float32)
    base = _tsm2.resolve_tsm2l(10**5, 8, 8, np.float32, lay, _tsm2.TSM2LConfig(tcf=1))
    cands, _ = _autotune._candidates_tsm2l(base, 10**5, 8, 8, np.float32, lay)
    assert {c.u for c in cands if c.warp == 1 and c.u} == set(_configs.OPT1W_U_TRIED[4])
    assert not any(c.direct for c in cands)  # row-major A: no tsm2l_opt1d


def test_opt1d_rules():
    lay = _layout("F", 4096, 16, np.float32)
    r = _tsm2.resolve_tsm2l(4096, 16, 16, np.float32, lay, _tsm2.TSM2LConfig(direct=1, tcf=1))
    assert (r.vec, r.kt, r.t2, r.stage) == (4, 16, 16, 1)
    assert _tsm2.tsm2l_name(r, np.float32, lay) == f"tsm2l_opt1d<float,4,{r.t1},16,16,1>"
    assert _tsm2.tsm2l_smem_bytes(r, 4, lay) == (16 * 16 + (r.t1 // 32) * 32 * 4 * 17) * 4
    r = _tsm2.resolve_tsm2l(4096, 16, 16, np.float64, _layout("F", 4096, 16, np.float64),
                            _tsm2.TSM2LConfig(direct=1, tcf=1, stage=-1))
    assert (r.vec, r.stage) == (2, -1) and _tsm2.tsm2l_smem_bytes(r, 8, _layout("F", 4096, 16, np.float64)) == 16 * 16 * 8
    with pytest.raises(ValueError):  # row-major A
        _tsm2.resolve_tsm2l(4096, 8, 8, np.float32, _layout("C", 4096, 8, np.float32),
                            _tsm2.TSM2LConfig(direct=1, tcf=1))
    with pytest.raises(ValueError):  # k > 16
        _tsm2.resolve_tsm2l(4096, 24, 8, np.float32, lay, _tsm2.TSM2LConfig(direct=1, tcf=1))
    with pytest.raises(ValueError):  # more rows per thread than A's alignment gives
        _tsm2.resolve_tsm2l(4099, 8, 8, np.float32, _layout("F", 4099, 8, np.float32),
                            _tsm2.TSM2LConfig(direct=1, vec=4, tcf=1))


def test_every_candidate_compiles_without_spills():
    bad = []
    names = sorted(_candidate_names())
    assert any(nm.startswith("tsm2l_opt1d<") for nm in names)
    for nm in names:
        r = compile_report("tsm2l", nm)
        if r.spill_stores or r.spill_loads or r.stack_frame:
            bad.append((nm, r.registers, r.spill_stores, r.spill_loads))
    assert not bad, bad


# ---------------------------------------------------------------- GPU


def _check(A, B, C, C0, alpha, beta, what):
    import cupy

    k = A.shape[1]
    f64 = np.float64
    A64, B64 = cupy.asnumpy(A).astype(f64), cupy.asnumpy(B).astype(f64)
    ref = alpha * (A64 @ B64)
    scale = abs(alpha) * (np.abs(A64) @ np.abs(B64))
    if beta:
        ref += beta * C0.astype(f64)
        scale += abs(beta) * np.abs(C0.astype(f64))
    eps = np.finfo(C.dtype).eps / 2
    g = lambda j, u: j * u / (1 - j * u)  # noqa: E731
    tol = 2 * (g(k + 3, eps) + g(k + 3, np.finfo(f64).eps / 2)) * scale
    err = np.abs(cupy.asnumpy(C).astype(f64) - ref)
    nbad = int((~(err <= tol)).sum())
    assert nbad == 0, f"{what}: {nbad} of {C.size} elements off (max err {np.nanmax(err):.3g})"


def _run(m, k, n, dtype, order, cfg, alpha=1.0, beta=0.0, seed=0):
    import cupy

    rng = np.random.default_rng(seed)
    A = rng.standard_normal((m, k)).astype(dtype)
    A = cupy.asarray(np.asfortranarray(A) if order == "F" else A)
    B = cupy.asarray(rng.standard_normal((k, n)).astype(dtype))
    C0 = rng.standard_normal((m, n)).astype(dtype)
    C = cupy.asarray(C0) if beta else cupy.full((m, n), np.nan, dtype=dtype)  # poisoned
    lay, A_read = _tsm2.a_layout(A)
    used = _tsm2.launch_tsm2l(A_read, B, C, alpha, beta, cfg)
    cupy.cuda.Device().synchronize()
    _check(A, B, C, C0, alpha, beta, f"{used} m={m} k={k} n={n} {np.dtype(dtype).name} {order}")
    return used


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("kn", KN, ids=lambda x: f"k{x[0]}n{x[1]}")
@pytest.mark.parametrize("m", M_AWKWARD)
@pytest.mark.parametrize("stage", (1, -1))
def test_opt1d(m, kn, dtype, stage):
    k, n = kn
    if m == 1:  # a one-row A is row-major to the launcher: no tsm2l_opt1d
        pytest.skip("m = 1 reads A as a row")
    for t1, vec in _configs.OPT1D_SHAPES_TRIED:
        for tcf in (1, 3):
            cfg = _tsm2.TSM2LConfig(direct=1, t1=t1, vec=vec, stage=stage, tcf=tcf)
            try:
                _tsm2.resolve_tsm2l(m, k, n, dtype, _tsm2.a_layout(_ascol(m, k, dtype))[0], cfg)
            except ValueError:
                continue  # vec beyond A's alignment (m odd)
            _run(m, k, n, dtype, "F", cfg, seed=m + k + n)
    cfg = _tsm2.TSM2LConfig(direct=1, stage=stage)
    _run(m, k, n, dtype, "F", cfg, alpha=-1.5, beta=0.75, seed=1)  # the launcher's own tcf


def _ascol(m, k, dtype):
    import cupy

    return cupy.asfortranarray(cupy.zeros((m, k), dtype=dtype))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("m", M_AWKWARD)
@pytest.mark.parametrize("order", ("C", "F"))
def test_opt1_part_filled_chunk(m, order, dtype):
    # n = 12 in a TN = 16 chunk: tsm2l_opt1's 16-byte copy-out skips the missing vectors
    for k in (12, 16):
        _run(m, k, 12, dtype, order, _tsm2.TSM2LConfig(opt=1, warp=-1, tcf=1))
        _run(m, k, 12, dtype, order, _tsm2.TSM2LConfig(opt=1, warp=-1), alpha=2.0, beta=-0.5)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("kn", ((8, 8), (12, 12), (16, 16), (4, 3)), ids=lambda x: f"k{x[0]}n{x[1]}")
@pytest.mark.parametrize("m", M_AWKWARD)
def test_opt1w_u(m, kn, dtype):
    k, n = kn
    if k * np.dtype(dtype).itemsize % 16:
        pytest.skip("opt1w needs rows of whole 16-byte vectors")
    for u in _configs.OPT1W_U_TRIED[np.dtype(dtype).itemsize]:
        for tcf in (1, 3):
            _run(m, k, n, dtype, "C", _tsm2.TSM2LConfig(opt=1, warp=1, u=u, tcf=tcf), seed=u)
    _run(m, k, n, dtype, "C", _tsm2.TSM2LConfig(opt=1, warp=1, u=8 if dtype == np.float32 else 4),
         alpha=0.5, beta=2.0)


@pytest.mark.gpu
@pytest.mark.parametrize("order", ("C", "F"))
def test_autotune_keeps_a_new_configuration_that_runs(order):
    # whatever the tuner keeps must be a configuration the launcher runs correctly
    import cupy

    rng = np.random.default_rng(3)
    m, k, n = 10**5 + 3, 12, 12
    A = rng.standard_normal((m, k)).astype(np.float32)
    A = cupy.asarray(np.asfortranarray(A) if order == "F" else A)
    B = cupy.asarray(rng.standard_normal((k, n)).astype(np.float32))
    r = _autotune.autotune(A, B, algorithm="tsm2l", reps=2)
    assert r["time_s"] <= r["default_time_s"] * 1.0 + 1e-12
    lay, A_read = _tsm2.a_layout(A)
    cfg = _autotune.tsm2l_config(r["params"], m, k, n, np.dtype(np.float32), lay)
    C = cupy.full((m, n), np.nan, dtype=np.float32)
    _tsm2.launch_tsm2l(A_read, B, C, 1.0, 0.0, cfg)
    _check(A, B, C, None, 1.0, 0.0, f"tuned {cfg}")
