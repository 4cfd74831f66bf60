"""apps/abft: checksum weights, encoding, ft_matmul, fault injection and the solver (CPU).

The test bodies take the array module ``xp`` (numpy here); tests/test_abft_gpu.py
runs the same bodies on CuPy. References are float64 products of the same data.

What "above threshold" means is the report's own statement, ``ABFTReport.limits``:
an error larger than ``flag`` at an element must be detected, one larger than
``locate`` must also be corrected from the checksums, and one below
``tau / max_q W[j, q] / 2`` must be reported as nothing at all (the product is
returned as computed, with the sub-round-off error still in it). In between,
the checksums may detect without locating: then ABFTError (or a recomputed row
with recompute=True), never a wrong correction.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tsm_apps import abft
from tsm_core.abft import checksums as _abft

ROOT = Path(__file__).resolve().parents[1]
DTYPES = (np.float32, np.float64)


def asnp(x):
    return x if isinstance(x, np.ndarray) else x.get()


# ------------------------------------------------------------------ data


def make(xp, rng, shape, dtype, dist="normal"):
    """Signed (or, for "uniform", same-sign) random data of a named distribution."""
    m, n = shape
    if dist == "normal":
        X = rng.standard_normal((m, n))
    elif dist == "uniform":  # same sign: no cancellation, the largest partial sums
        X = rng.random((m, n)) + 0.01
    elif dist == "wide":  # elementwise magnitudes over 12 (float64) / 8 (float32) decades
        span = 6 if dtype == np.float64 else 4
        X = rng.standard_normal((m, n)) * 10.0 ** rng.uniform(-span, span, (m, n))
    elif dist == "scaled":  # rows and columns of very different sizes
        X = rng.standard_normal((m, n)) * 10.0 ** rng.uniform(-5, 5, (m, 1)) * 10.0 ** rng.uniform(-3, 3, (1, n))
    elif dist == "illcond":  # singular values from 1 to 1e-12: heavy cancellation in products
        r = min(m, n)
        U = np.linalg.qr(rng.standard_normal((m, r)))[0]
        V = np.linalg.qr(rng.standard_normal((n, r)))[0]
        X = (U * np.logspace(0, -12, r)) @ V.T
    elif dist == "cancel":  # pairs of columns that cancel in A @ B: C near zero, ||A|| ||B|| not
        X = rng.standard_normal((m, n))
        X[:, 1::2] = -X[:, 0:n - 1:2] * (1 + 1e-7 * rng.standard_normal((m, n // 2)))
    else:
        raise ValueError(dist)
    return xp.asarray(X.astype(dtype))


DISTS = ("normal", "uniform", "wide", "scaled", "illcond", "cancel")


def random_shape(rng, big=False):
    hi = 300 if big else 48
    return tuple(int(v) for v in rng.integers(1, hi, 3))


# ------------------------------------------------------------------ weights, row_checksums, encode


def test_weights():
    W = abft.weights(5, 3)
    x = np.arange(1, 6) / 5
    assert W.shape == (5, 3) and W.dtype == np.float64
    np.testing.assert_array_equal(W[:, 0], 1.0)
    np.testing.assert_array_equal(W[:, 1], x)
    np.testing.assert_array_equal(W[:, 2], x * x)
    np.testing.assert_array_equal(W, _abft.checksum_weights(5, 3))
    assert abft.weights(7, 2, np.float32).dtype == np.float32


def check_row_checksums(xp, rng):
    for dt in DTYPES:
        for (m, p) in [(1, 1), (1, 300), (3, 1), (5, 7), (257, 131), (1031, 61), (13, 2053)]:
            X = make(xp, rng, (m, p), dt)
            Xh = asnp(X).astype(np.float64)
            for c in (1, 2, 3, 4):
                W = _abft.checksum_weights(p, c)
                Y, Z = _abft.row_checksums(X, c=c)
                tol = 8 * p * 2.0**-53 * (np.abs(Xh) @ W) + 1e-300
                assert np.all(np.abs(asnp(Y) - Xh @ W) <= tol)
                np.testing.assert_allclose(asnp(Z)[:, 0], (Xh * Xh).sum(1), rtol=1e-12)
                Y2, Z2 = _abft.row_checksums(X, c=c, weighted_squares=True)
                np.testing.assert_array_equal(asnp(Y2), asnp(Y))
                np.testing.assert_allclose(asnp(Z2), (Xh * Xh) @ (W * W), rtol=1e-12)
                V = rng.standard_normal((p, c))
                Y3, Z3 = _abft.row_checksums(X, V=xp.asarray(V))
                assert np.all(np.abs(asnp(Y3) - Xh @ V) <= 8 * p * 2.0**-53 * (np.abs(Xh) @ np.abs(V)) + 1e-300)
                np.testing.assert_allclose(asnp(Z3)[:, 0], (Xh * Xh).sum(1), rtol=1e-12)
        # Views: a row slice with a leading dimension, an F-ordered array, a strided view.
        X = make(xp, rng, (40, 50), dt)
        for view in (X[3:30, 5:44], xp.asfortranarray(X), X[::2, ::3]):
            Y, _ = _abft.row_checksums(view, c=2)
            np.testing.assert_allclose(asnp(Y), asnp(view).astype(np.float64) @ _abft.checksum_weights(view.shape[1], 2),
                                       rtol=1e-12, atol=1e-12)


def test_row_checksums():
    check_row_checksums(np, np.random.default_rng(1))


def test_row_checksums_bad_input():
    X = np.ones((3, 4))
    with pytest.raises(ValueError):
        _abft.row_checksums(X)
    with pytest.raises(ValueError):
        _abft.row_checksums(X, c=5)
    with pytest.raises(TypeError):
        _abft.row_checksums(X.astype(np.int32), c=2)
    with pytest.raises(ValueError):
        _abft.row_checksums(X, V=np.ones((5, 2)))


def check_encode(xp, rng):
    for dt in DTYPES:
        for (m, n) in [(1, 1), (7, 3), (257, 131), (64, 1000)]:
            A = make(xp, rng, (m, n), dt)
            Ah = asnp(A).astype(np.float64)
            u = np.finfo(dt).eps / 2
            for c in (1, 2, 3):
                R, K = abft.encode(A, c, side="both")
                Wn, Wm = abft.weights(n, c), abft.weights(m, c)
                assert R.shape == (m, c) and K.shape == (c, n) and R.dtype == dt
                # weights rounded to dt, then a TSM2R product: gamma bound on |A| |W|
                assert np.all(np.abs(asnp(R) - Ah @ Wn) <= 2 * (n + 2) * u * (np.abs(Ah) @ Wn))
                assert np.all(np.abs(asnp(K) - Wm.T @ Ah) <= 2 * (m + 2) * u * (Wm.T @ np.abs(Ah)))
            np.testing.assert_array_equal(asnp(abft.encode(A, 2)), asnp(abft.encode(A, 2, side="row")))


def test_encode():
    check_encode(np, np.random.default_rng(2))


def test_encode_bad_input():
    A = np.ones((4, 4))
    for bad, exc in [(dict(c=0), ValueError), (dict(c=2.0), TypeError), (dict(side="diag"), ValueError)]:
        with pytest.raises(exc):
            abft.encode(A, **bad)
    with pytest.raises(TypeError):
        abft.encode(A.astype(np.int64))
    with pytest.raises(ValueError):
        abft.encode(np.ones(4))


# ------------------------------------------------------------------ ft_matmul: clean products


def check_no_false_alarm(xp, rng, cases, big_every=20):
    worst = 0.0
    for case in range(cases):
        dt = DTYPES[case % 2]
        m, k, n = random_shape(rng, big=case % big_every == 0)
        A = make(xp, rng, (m, k), dt, DISTS[case % len(DISTS)])
        B = make(xp, rng, (k, n), dt, DISTS[(case // len(DISTS)) % len(DISTS)])
        c = 1 + case % 3
        C, rep = abft.ft_matmul(A, B, c=c)
        assert rep.clean, (case, m, k, n, dt, rep.summary())
        assert rep.max_ratio <= 1.0
        worst = max(worst, rep.max_ratio)
        if case % 50 == 0:  # the product itself is the GEMM's
            ref = asnp(A).astype(np.float64) @ asnp(B).astype(np.float64)
            bound = 2 * (k + 2) * np.finfo(dt).eps / 2 * (np.abs(asnp(A)).astype(np.float64) @ np.abs(asnp(B)))
            assert np.all(np.abs(asnp(C) - ref) <= bound + 1e-300)
    return worst


def test_no_false_alarm():
    worst = check_no_false_alarm(np, np.random.default_rng(3), 3000)
    assert worst < 0.5  # margin: the threshold is not grazed by clean products


def test_no_false_alarm_worst_case_bound():
    rng = np.random.default_rng(4)
    for case in range(200):
        dt = DTYPES[case % 2]
        m, k, n = random_shape(rng)
        A = make(np, rng, (m, k), dt, DISTS[case % len(DISTS)])
        B = make(np, rng, (k, n), dt, "uniform")
        _, rep = abft.ft_matmul(A, B, bound="worst-case")
        assert rep.clean and rep.bound == "worst-case"


# ------------------------------------------------------------------ ft_matmul: injected faults


def _clean(xp, A, B, c):
    C, rep = abft.ft_matmul(A, B, c=c)
    assert rep.clean
    return asnp(C), rep


def check_single_errors(xp, rng, cases):
    """Errors of every size at random elements: each lands in the class `limits` predicts."""
    seen = {"undetectable": 0, "corrected": 0, "between": 0}
    for case in range(cases):
        dt = DTYPES[case % 2]
        m, k, n = random_shape(rng, big=case % 10 == 0)
        c = 2 + case % 2
        A = make(xp, rng, (m, k), dt, DISTS[case % len(DISTS)])
        B = make(xp, rng, (k, n), dt, "normal")
        C0, rep0 = _clean(xp, A, B, c)
        i, j = int(rng.integers(m)), int(rng.integers(n))
        lim = rep0.limits(i, j)
        tau = asnp(rep0.thresholds)[i]
        quiet = float(np.min(tau / abft.weights(n, c)[j])) / 4
        scale = [quiet * rng.uniform(0.1, 1), lim["flag"] * rng.uniform(1.01, 3),
                 lim["locate"] * rng.uniform(1.01, 1e6)][case % 3]
        e = float(scale * rng.choice([-1, 1]))
        f = abft.AddError(i, j, e)
        try:
            C, rep = abft.ft_matmul(A, B, c=c, inject=f)
        except abft.ABFTError as err:
            # Allowed only between the two limits: detected, not locatable.
            assert lim["flag"] * 0.5 <= abs(f.error) <= lim["locate"], (case, lim, f.error)
            assert i in err.report.uncorrectable
            seen["between"] += 1
            continue
        C = asnp(C)
        if abs(f.error) <= quiet:
            assert rep.clean, (case, rep.summary())
            assert C[i, j] == f.new  # reported as nothing, not "corrected"
            seen["undetectable"] += 1
        elif abs(f.error) > lim["flag"]:
            assert rep.detected and i in rep.detected_rows
            if abs(f.error) > lim["locate"]:
                assert [(x.row, x.col, x.method) for x in rep.corrections] == [(i, j, "checksum")]
            for x in rep.corrections:  # whatever was corrected was the fault, and well
                assert (x.row, x.col) == (i, j)
                assert abs(C[i, j] - C0[i, j]) <= 2 * tau[0]
            seen["corrected"] += bool(rep.corrections)
        mask = np.ones(C.shape, bool)
        mask[i, j] = False
        np.testing.assert_array_equal(C[mask], C0[mask])  # nothing else touched
    assert min(seen["undetectable"], seen["corrected"]) > 0, seen
    return seen


def test_single_errors():
    check_single_errors(np, np.random.default_rng(5), 600)


def check_bit_flips(xp, rng, cases):
    """Every bit of every class: the flip is corrected exactly when it is large enough."""
    for case in range(cases):
        dt = DTYPES[case % 2]
        nbits = abft.bits_of(dt)
        m, k, n = random_shape(rng)
        A = make(xp, rng, (m, k), dt)
        B = make(xp, rng, (k, n), dt)
        C0, rep0 = _clean(xp, A, B, 2)
        f = abft.BitFlip(bit=case % nbits, rng=rng)
        C, rep = abft.ft_matmul(A, B, inject=f, recompute=True)
        C = asnp(C)
        i, j = f.hit
        lim = rep0.limits(i, j)
        err = abs(f.error) if np.isfinite(f.new) else np.inf
        if err > lim["flag"]:
            assert rep.detected and rep.corrected, (case, f.bit, f.old, f.new, rep.summary())
            assert abs(C[i, j] - C0[i, j]) <= 2 * asnp(rep0.thresholds)[i, 0]
            method = "checksum" if err > lim["locate"] else None
            if method:
                assert [(x.row, x.col, x.method) for x in rep.corrections] == [(i, j, method)]
        if rep.clean:
            assert C[i, j] == np.asarray(f.new, dtype=dt)
            assert err <= lim["flag"]


def test_bit_flips():
    check_bit_flips(np, np.random.default_rng(6), 64 * 8)


def check_nonfinite_and_multiple(xp, rng):
    for dt in DTYPES:
        A = make(xp, rng, (60, 50), dt)
        B = make(xp, rng, (50, 40), dt)
        C0, rep0 = _clean(xp, A, B, 2)
        # Inf and NaN are located by being non-finite, corrected from the row checksum.
        for val in (np.inf, -np.inf, np.nan):
            def hit(C, val=val):
                C[3, 7] = val
            C, rep = abft.ft_matmul(A, B, inject=hit)
            assert [(x.row, x.col) for x in rep.corrections] == [(3, 7)]
            assert abs(asnp(C)[3, 7] - C0[3, 7]) <= 2 * asnp(rep0.thresholds)[3, 0]
        # One error in each of several rows: all corrected.
        big = 1e3 * float(abs(C0).max())

        def three(C):
            for (i, j) in [(0, 0), (17, 39), (59, 11)]:
                abft.add_error(C, i, j, big)
        C, rep = abft.ft_matmul(A, B, inject=three)
        assert [(x.row, x.col) for x in rep.corrections] == [(0, 0), (17, 39), (59, 11)]
        np.testing.assert_allclose(asnp(C), C0, rtol=0, atol=4 * float(asnp(rep0.thresholds).max()))

        # Two errors in one row: c checksums cannot correct; an error, never a silent miscorrection.
        def two(C):
            abft.add_error(C, 5, 3, big)
            abft.add_error(C, 5, 30, -0.37 * big)
        for c in (2, 3):
            with pytest.raises(abft.ABFTError, match="row") as info:
                abft.ft_matmul(A, B, c=c, inject=two)
            assert 5 in info.value.report.uncorrectable
        C, rep = abft.ft_matmul(A, B, c=3, inject=two, recompute=True)
        assert rep.recomputed_rows == (5,) and [(x.row, x.col) for x in rep.corrections] == [(5, 3), (5, 30)]
        np.testing.assert_allclose(asnp(C), C0, rtol=0, atol=4 * float(asnp(rep0.thresholds).max()))
        # Detection only: correct=False reports and leaves C as it came out.
        C, rep = abft.ft_matmul(A, B, inject=abft.AddError(9, 9, big), correct=False)
        assert rep.detected_rows == (9,) and asnp(C)[9, 9] != C0[9, 9]
        # c = 1 detects but cannot locate.
        with pytest.raises(abft.ABFTError, match="cannot locate"):
            abft.ft_matmul(A, B, c=1, inject=abft.AddError(9, 9, big))


def test_nonfinite_and_multiple():
    check_nonfinite_and_multiple(np, np.random.default_rng(7))


def test_ft_matmul_bad_input():
    A, B = np.ones((4, 3)), np.ones((3, 5))
    A0 = A.copy()
    cases = [
        ((A, np.ones((4, 5))), {}, ValueError),
        ((A, B), dict(c=0), ValueError),
        ((A, B), dict(c=abft.MAX_C + 1), ValueError),
        ((A, B), dict(c=2.0), TypeError),
        ((A, B), dict(bound="tight"), ValueError),
        ((A, B), dict(confidence=0.5), ValueError),
        ((A, B), dict(inject="flip"), TypeError),
        ((A.astype(np.int32), B.astype(np.int32)), {}, TypeError),
        ((np.ones(3), B), {}, ValueError),
        ((A, [[1.0]]), {}, TypeError),
    ]
    for args, kw, exc in cases:
        with pytest.raises(exc):
            abft.ft_matmul(*args, **kw)
    Abad = A.copy()
    Abad[1, 1] = np.nan
    with pytest.raises(ValueError, match="finite"):
        abft.ft_matmul(Abad, B)
    np.testing.assert_array_equal(A, A0)


def test_empty_and_tiny():
    for (m, k, n) in [(0, 3, 4), (3, 0, 4), (3, 4, 0), (1, 1, 1)]:
        A, B = np.full((m, k), 1.5), np.full((k, n), -2.0)
        C, rep = abft.ft_matmul(A, B)
        assert C.shape == (m, n) and rep.clean
        np.testing.assert_array_equal(C, A @ B)


def test_torch_cpu():
    torch = pytest.importorskip("torch")
    A = torch.randn(30, 20, dtype=torch.float64)
    B = torch.randn(20, 10, dtype=torch.float64)
    C, rep = abft.ft_matmul(A, B, inject=abft.AddError(2, 3, 100.0))
    assert isinstance(C, torch.Tensor) and rep.corrections[0].col == 3
    torch.testing.assert_close(C, A @ B)
    R = abft.encode(A, 2)
    assert isinstance(R, torch.Tensor) and R.shape == (30, 2)


# ------------------------------------------------------------------ injection helpers


def test_flip_bit_and_classes():
    X = np.full((3, 3), 1.5, dtype=np.float32)
    assert abft.flip_bit(X, 1, 2, 31) == (1.5, -1.5)
    assert abft.flip_bit(X, 1, 2, 31) == (-1.5, 1.5)
    old, new = abft.flip_bit(X, 0, 0, 0)
    assert new == np.nextafter(np.float32(1.5), np.float32(2))
    assert [abft.bit_class(b, np.float32) for b in (0, 22, 23, 30, 31)] == \
        ["mantissa", "mantissa", "exponent", "exponent", "sign"]
    assert [abft.bit_class(b, np.float64) for b in (51, 52, 62, 63)] == ["mantissa", "exponent", "exponent", "sign"]
    with pytest.raises(ValueError):
        abft.flip_bit(X, 0, 0, 32)
    with pytest.raises(IndexError):
        abft.flip_bit(X, 3, 0, 1)
    assert abft.add_error(X, 2, 2, 0.25) == (1.5, 1.75)
    f = abft.BitFlip(bits=range(23, 31), rng=np.random.default_rng(0))
    f(X)
    assert 23 <= f.bit < 31 and f.hit is not None and f.old != f.new


# ------------------------------------------------------------------ solver


def check_cholesky(xp, rng, n=300, block=64):
    for dt in DTYPES:
        G = rng.standard_normal((n, n))
        A = xp.asarray((G @ G.T / n + np.eye(n)).astype(dt))
        u = np.finfo(dt).eps / 2
        L0, rep0 = abft.cholesky(A, block=block)
        assert rep0.steps == -(-n // block) - 1 and not rep0.fixes
        Ah = asnp(A).astype(np.float64)

        def resid(L):
            L = asnp(L).astype(np.float64)
            return np.linalg.norm(Ah - L @ L.T) / np.linalg.norm(Ah)

        assert resid(L0) <= 10 * n * u
        np.testing.assert_array_equal(asnp(L0), np.tril(asnp(L0)))
        plan = {0: (5, 9, dt(0).itemsize * 8 - 2), 1: (100, 3, dt(0).itemsize * 8 - 1), 2: (40, 40, None)}

        def inject(step, P):
            if step in plan:
                i, j, bit = plan[step]
                if bit is None:
                    abft.add_error(P, i, j, 1e4)
                else:
                    abft.flip_bit(P, i, j, bit)

        L, rep = abft.cholesky(A, block=block, inject=inject)
        got = [(f.step, f.row, f.col) for f in rep.fixes]
        want = [(s, i + (s + 1) * block, j + (s + 1) * block) for s, (i, j, _) in plan.items()]
        assert got == want, rep.summary()
        assert resid(L) <= 10 * n * u
        # The same faults, unprotected, would have wrecked the factor: the fault is real.
        assert abs(rep.fixes[0].old - rep.fixes[0].new) > 1


def test_cholesky():
    check_cholesky(np, np.random.default_rng(8))


def test_cholesky_bad_input():
    with pytest.raises(np.linalg.LinAlgError):
        abft.cholesky(-np.eye(4))
    with pytest.raises(ValueError):
        abft.cholesky(np.ones((3, 4)))
    with pytest.raises(TypeError):
        abft.cholesky(np.eye(3, dtype=np.int64))


def test_demo_runs():
    out = subprocess.run([sys.executable, "-m", "tsm_apps.abft.demo", "--cpu", "--n", "256", "--faults", "4"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    assert "corrected" in out.stdout and "residual" in out.stdout


# ------------------------------------------------------------------ the kernel compiles


def test_abft_kernels_compile_without_spills():
    nvrtc = pytest.importorskip("cupy_backends.cuda.libs.nvrtc")
    try:
        nvrtc.getVersion()
    except Exception as exc:
        pytest.skip(f"NVRTC cannot be loaded: {exc}")
    from tsm_core.runtime import compile as _compile

    for dt in DTYPES:
        for c in range(1, abft.MAX_C + 1):
            for mode in (0, 1, 2):
                rep = _compile.compile_report("abft", _abft.kernel_name(dt, c, mode))
                assert rep.registers > 0 and not rep.spills, (rep.name_expr, rep.log)


def test_docstring_examples():
    import doctest

    from tsm_apps.abft import _core, _inject, _solver, bench, demo

    for mod in (_core, _inject, _solver, _abft, bench, demo):
        result = doctest.testmod(mod, optionflags=doctest.ELLIPSIS)
        assert result.attempted > 0 and result.failed == 0, mod.__name__


def test_bench_campaign_summary():
    from tsm_apps.abft import bench

    recs = [dict(dtype="float32", bit=b, cls=abft.bit_class(b, np.float32), shape=(4, 4, 4), error=e,
                 flag=1.0, locate=100.0, outcome=o, located=o == "corrected-checksum",
                 corrected=o.startswith("corrected"), wrong_fix=False)
            for b, e, o in [(30, 1e30, "corrected-checksum"), (23, 5.0, "corrected-recompute"),
                            (0, 1e-7, "undetected"), (31, 2.0, "corrected-recompute")]]
    s = bench.summarize_campaign(recs)
    assert s["float32/all"]["faults"] == 4 and s["float32/all"]["detected"] == 0.75
    assert s["float32/all"]["above_threshold"] == 3 and s["float32/all"]["corrected_above_threshold"] == 1.0
    assert s["float32/mantissa"]["undetected_below_threshold"] == 1
    assert s["float32/exponent"]["located_above_locate"] == 1.0
    rows = bench.per_bit(recs)
    assert [r["bit"] for r in rows] == [0, 23, 30, 31] and rows[0]["detected"] == 0.0


def test_band_rows_rule():
    from tsm_apps.abft._core import BAND_MIN_FLOPS, band_rows

    assert band_rows(8192, 8192, 8192, np.float64) == 768  # the measured split
    for m, k, n in [(4096, 8192, 8192), (4099, 8191, 8193), (20000, 6000, 9000), (100000, 4000, 4000)]:
        band = band_rows(m, k, n, np.float64)
        assert 2.0 * m * k * n >= BAND_MIN_FLOPS
        assert band % 128 == 0 and 128 <= band <= m // 8, (m, band)
    # float32, small products, few rows, the CPU: one GEMM
    assert band_rows(8192, 8192, 8192, np.float32) == 0
    assert band_rows(4096, 4096, 4096, np.float64) == 0
    assert band_rows(2048, 65536, 65536, np.float64) == 0
    assert band_rows(8192, 8192, 8192, np.float64, gpu=False) == 0


# ------------------------------------------------------------------ reports and command lines


def test_report_prints_a_few_lines():
    rng = np.random.default_rng(0)
    A, B = rng.standard_normal((260, 64)), rng.standard_normal((64, 32))
    C, rep = abft.ft_matmul(A, B)
    text = str(rep)
    assert text == repr(rep) and text.count("\n") == 0
    assert text.startswith("ABFTReport(clean: 260x64 @ 64x32 float64, c=2, max |d|/tau = ")
    assert len(rep.details().splitlines()) >= 260  # the thresholds, row by row

    def inject(C):
        for i in (5, 9, 11, 12):
            abft.add_error(C, i, 3, 1e3)

    C, rep = abft.ft_matmul(A, B, inject=inject)
    lines = str(rep).splitlines()
    assert lines[0].startswith("ABFTReport(corrected:") and len(lines) <= 6
    assert "4 row(s) flagged, 4 element(s) corrected" in lines[1]
    assert "C[5, 3]" in lines[2] and "report.details()" in lines[-1]
    assert rep.verdict() == "corrected" and len(rep.corrections) == 4


def test_bench_without_gpu_exits_2(tmp_path, monkeypatch, capsys):
    from tsm_apps.abft import bench
    from tsm_core.runtime import arrays

    monkeypatch.setattr(arrays, "has_gpu", lambda: False)
    assert bench.main("abft", ["--out", str(tmp_path)]) == 2
    cap = capsys.readouterr()
    assert len(cap.err.strip().splitlines()) == 1 and "needs a CUDA GPU" in cap.err and cap.out == ""


@pytest.mark.parametrize("cmd", [["tsm_apps.abft.bench"], ["tsm_core.bench", "abft"]])
def test_bench_without_cupy_exits_2(tmp_path, cmd):
    code = ("import runpy, sys; sys.modules['cupy'] = None; "
            f"runpy.run_module({cmd[0]!r}, run_name='__main__', alter_sys=True)")
    r = subprocess.run([sys.executable, "-c", code, *cmd[1:], "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "CuPy is not installed" in r.stderr


def test_demo_quiet(capsys):
    from tsm_apps.abft import demo

    assert demo.main(["--cpu", "--n", "256", "--faults", "3", "--quiet"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2 and "protected residual" in out[0]
