"""Every kernel instantiation the launchers can pick compiles for sm_90 without spilling.

No GPU needed: NVRTC compiles each name expression to a cubin (``_compile.compile_report``)
and ptxas's report gives registers and spill bytes. Runs in CI.

Which instantiations. For every launch that tests/test_gpu_tsm2.py makes (its
``launches()``) and every problem of the benchmark sweeps (``tsm_core.bench``'s
shape lists: tsm2r, tsm2l, ablation, dispatch), the configuration is resolved by the
launchers' own functions, ``_tsm2.resolve_tsm2r`` / ``resolve_tsm2l``, on A's layout as
``_tsm2.a_layout`` sees it (computed from a stand-in with A's shape, strides and
alignment), then named by ``tsm2r_name`` / ``tsm2l_name``. So when kernel defaults
change in _tsm2.py, this list follows without edits here.

The resolve functions query the GPU only for the occupancy-driven choices, TSM2R's
split-K factor and TSM2L's tcf, which are not template parameters. Here they are
pinned (splits=1, tcf=1 when the caller left them 0), which skips the query;
``test_pinning_does_not_change_the_kernel`` checks, with the device queries
monkeypatched to H100 figures, that the unpinned resolution picks the same kernels.
(This replaces a hand-written mirror of the defaults, which would drift.)

Also compiled: the v0-v2 ladder at its defaults (from the same tables), and
``tsm2r_splitk_reduce`` and ``tsm2r_streamk_reduce`` for both dtypes.
matmul(algorithm="auto") may pick TSM2R or TSM2L; both are enumerated for its
problems.
"""

from __future__ import annotations

import concurrent.futures
import inspect
import os
from dataclasses import fields, replace
from types import SimpleNamespace
from unittest import mock

import _sweep
import numpy as np
import pytest

nvrtc = pytest.importorskip("cupy_backends.cuda.libs.nvrtc", reason="NVRTC (CuPy) is not available")
try:
    nvrtc.getVersion()
except Exception as exc:  # the module imports but libnvrtc cannot be loaded
    pytest.skip(f"NVRTC cannot be loaded: {exc}", allow_module_level=True)

import test_gpu_tsm2 as gpu_tests  # noqa: E402  (tests/ is on sys.path under pytest)

import tsm_core  # noqa: E402
from tsm_core import bench  # noqa: E402
from tsm_core.runtime import compile as _compile  # noqa: E402
from tsm_core.tsm2 import launch as _tsm2  # noqa: E402

ARCH = "sm_90"
BASE_PTR = 1 << 32  # a fresh CuPy allocation: 256-byte aligned (far more, here)


# ------------------------------------------------------------------ A's layout


class _DevArray:
    """What ``a_layout`` reads of a CuPy array: shape, strides, itemsize, data.ptr."""

    def __init__(self, shape, strides, itemsize, offset=0):
        self.shape = tuple(shape)
        self.strides = tuple(strides)
        self.itemsize = itemsize
        self.data = SimpleNamespace(ptr=BASE_PTR + offset)


def _stand_in(shape, dtype, kind):
    """A stand-in for the GPU tests' / benchmark's A of this shape and kind."""
    item = np.dtype(dtype).itemsize
    m, k = shape
    if kind == "C":
        return _DevArray(shape, (k * item, item), item)
    if kind in ("F", "T"):
        return _DevArray(shape, (item, m * item), item)
    # A strided view: build it for real on the host (the views' shapes are small).
    assert m * k <= 1 << 24, (shape, kind)
    x = gpu_tests.operand(np, np.random.default_rng(0), shape, dtype, kind)
    owner = x
    while owner.base is not None:
        owner = owner.base
    off = x.__array_interface__["data"][0] - owner.__array_interface__["data"][0]
    return _DevArray(x.shape, x.strides, item, off)


def _c_copy(A):
    """_tsm2._c_copy without a GPU: the C-ordered copy's layout."""
    m, k = A.shape
    return _DevArray((m, k), (k * A.itemsize, A.itemsize), A.itemsize), False, k


def layout(shape, dtype, kind):
    with mock.patch.object(_tsm2, "_c_copy", _c_copy):
        lay, _ = _tsm2.a_layout(_stand_in(shape, dtype, kind))
    return lay


# ------------------------------------------------------------------ configurations


def _api_defaults(fn):
    return {p.name: p.default for p in inspect.signature(fn).parameters.values()
            if p.default is not inspect.Parameter.empty}


def _config(cls, api, fixed, kw):
    """The configuration the public function `api` builds from its keyword arguments."""
    args = {**_api_defaults(api), **fixed, **kw}
    return cls(**{f.name: args[f.name] for f in fields(cls) if f.name in args})


def configs(entry, kw, k):
    """[(family, config)] a GPU-test entry may launch (TSM2R and TSM2L for "auto")."""
    fn, fixed = gpu_tests.ENTRIES[entry]
    if fn == "tsm2r":
        return [("tsm2r", _config(_tsm2.TSM2RConfig, tsm_core.tsm2r, fixed, kw))]
    if fn == "tsm2l":
        return [("tsm2l", _config(_tsm2.TSM2LConfig, tsm_core.tsm2l, fixed, kw))]
    alg = fixed["algorithm"]
    out = []
    if alg in ("auto", "tsm2r"):  # api.matmul: launch_tsm2r(..., cfg=None)
        out.append(("tsm2r", _tsm2.TSM2RConfig()))
    if alg in ("auto", "tsm2l"):  # api._launch_tsm2l_any
        cfg = _tsm2.TSM2LConfig()
        if k > _tsm2.TSM2L_KMAX and cfg.opt == 1:
            cfg = _tsm2.TSM2LConfig(opt=2, t1=cfg.t1, tcf=cfg.tcf)
        out.append(("tsm2l", cfg))
    return out


def pinned(family, cfg):
    if family == "tsm2r":
        return cfg if cfg.splits else replace(cfg, splits=1)
    return cfg if cfg.tcf else replace(cfg, tcf=1)


def kernel_name(family, cfg, m, k, n, dtype, lay):
    if family == "tsm2r":
        return _tsm2.tsm2r_name(_tsm2.resolve_tsm2r(m, k, n, dtype, lay, cfg), dtype, lay)
    return _tsm2.tsm2l_name(_tsm2.resolve_tsm2l(m, k, n, dtype, lay, cfg), dtype, lay)


def problems():
    """[(family, config, (m, k, n), dtype, A kind)]: the GPU tests' and the benchmarks'."""
    out = []
    for entry, kw, (m, k, n), dtype, kind in gpu_tests.launches():
        if m == 0 or k == 0 or n == 0:
            continue
        for family, cfg in configs(entry, kw, k):
            out.append((family, cfg, (m, k, n), dtype, kind))
    r3, l1, l2 = _tsm2.TSM2RConfig(), _tsm2.TSM2LConfig(opt=1), _tsm2.TSM2LConfig(opt=2)
    for dt in bench.DTYPES:
        dtype = np.dtype(dt)
        for order in bench.ORDERS:
            for s in bench.tsm2r_shapes():
                out.append(("tsm2r", r3, s, dtype, order))
            for s in bench.tsm2l_shapes():
                out += [("tsm2l", l1, s, dtype, order), ("tsm2l", l2, s, dtype, order)]
            for s in bench.ablation_shapes(full=True):
                out += [("tsm2r", _tsm2.TSM2RConfig(version=v), s, dtype, order) for v in range(4)]
    for c in bench.dispatch_cases():
        s, dtype = (c["m"], c["k"], c["n"]), np.dtype(c["dtype"])
        for family, cfg in configs("matmul_auto", {}, c["k"]):
            out.append((family, cfg, s, dtype, c["order"]))
    return out


H100_ATTRS = dict(sm_count=132, regs_per_sm=65536, smem_per_sm=233472, smem_optin=232448,
                  threads_per_sm=2048, cc=(9, 0))


def on_h100(fn, *args):
    """fn(*args) with the device queries of resolve_* faked as an H100 (and a kernel
    of 64 registers), so that defaults which depend on the GPU (tsm2r_v3's one-wave
    launch, tsm2/launch.py) resolve as they would there."""
    import cupy

    with mock.patch.object(_tsm2, "_device_attrs", lambda dev: dict(H100_ATTRS)), \
            mock.patch.object(_compile, "get_kernel", lambda family, name: SimpleNamespace(num_regs=64)), \
            mock.patch.object(cupy.cuda, "Device", lambda *a, **k: SimpleNamespace(id=0)):
        return fn(*args)


def instantiations():
    """{(family, name expression)} over every problem, plus the split-K reduction:
    each problem's kernel with splits / tcf pinned (resolved without a device) and
    with them left to the launcher on an H100."""
    names = set()
    try:
        import cupy  # noqa: F401
    except ImportError:
        cupy = None
    for family, cfg, (m, k, n), dtype, kind in problems():
        lay = layout((m, k), dtype, kind)
        names.add((family, kernel_name(family, pinned(family, cfg), m, k, n, dtype, lay)))
        if cupy is not None:
            names.add((family, on_h100(kernel_name, family, cfg, m, k, n, dtype, lay)))
    for dt in (np.float32, np.float64):
        names.add(("tsm2r", f"tsm2r_splitk_reduce<{_compile.ctype(dt)}>"))
        names.add(("tsm2r", f"tsm2r_streamk_reduce<{_compile.ctype(dt)}>"))
    return sorted(names)


NAMES = instantiations()


def _stratum(item):
    """A kernel template and its dtype: each keeps a share of its instantiations."""
    head, _, args = item[1].partition("<")
    first = args.split(",")[0].strip()
    return head, first if first in ("float", "double") else ""


# What test_compiles_without_spills compiles: a fixed sample (_sweep.py) of NAMES,
# every template and dtype with its largest instantiation; all with --all-kernels.
COMPILED = _sweep.sample(NAMES, stratum=_stratum, per_stratum=2, fraction=0.3, name=lambda item: item[1])


# ------------------------------------------------------------------ compile


@pytest.fixture(scope="module")
def reports():
    """compile_report of every instantiation, compiled in parallel (NVRTC works
    without the GIL); a failure is kept and raised by its own test."""

    def one(item):
        try:
            return _compile.compile_report(item[0], item[1], arch=ARCH)
        except Exception as exc:  # noqa: BLE001
            return exc

    workers = min(16, os.cpu_count() or 1)
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        return dict(zip(COMPILED, pool.map(one, COMPILED)))


@pytest.mark.parametrize("family, name", COMPILED, ids=[n for _, n in COMPILED])
def test_compiles_without_spills(reports, family, name):
    r = reports[(family, name)]
    if isinstance(r, Exception):
        raise r
    assert r.registers > 0, f"no ptxas report for {name}:\n{r.log}"
    assert not r.spills, (
        f"{name} spills on {ARCH}: {r.spill_stores} bytes stored, {r.spill_loads} loaded "
        f"({r.registers} registers, {r.stack_frame} bytes stack frame)\n{r.log}")


def test_every_family_and_version_is_covered():
    kinds = {n.split("<")[0] for _, n in NAMES}
    assert kinds == {n.split("<")[0] for _, n in COMPILED}  # the sample compiles every kind
    assert {"tsm2r_v0", "tsm2r_v1", "tsm2r_v2", "tsm2r_splitk_reduce", "tsm2l_opt1",
            "tsm2l_opt2"} <= kinds
    assert kinds & {"tsm2r_v3", "tsm2r_v3r"}
    assert {np.dtype(dt) for _, _, _, dt, _ in problems()} == {np.dtype(np.float32), np.dtype(np.float64)}


# ------------------------------------------------------------------ pinning


def test_pinning_does_not_change_the_kernel(monkeypatch):
    """resolve_* with splits / tcf left to them (device queries faked as an H100 and
    a kernel of 64 registers) names the same kernels as with them pinned, except
    tsm2r_v3's one-wave launch (a GPU-dependent block shape), whose kernels are
    compiled by test_compiles_without_spills all the same (`instantiations`)."""
    cupy = pytest.importorskip("cupy")
    monkeypatch.setattr(_tsm2, "_device_attrs", lambda dev: dict(H100_ATTRS))
    monkeypatch.setattr(_compile, "get_kernel", lambda family, name: SimpleNamespace(num_regs=64))
    monkeypatch.setattr(cupy.cuda, "Device", lambda *a, **k: SimpleNamespace(id=0))
    seen = set()
    for family, cfg, (m, k, n), dtype, kind in problems():
        lay = layout((m, k), dtype, kind)
        key = (family, cfg, m, k, n, dtype, lay)
        if key in seen:
            continue
        seen.add(key)
        free = kernel_name(family, cfg, m, k, n, dtype, lay)
        assert (family, free) in NAMES, (family, cfg, m, k, n)
        one_wave = (family == "tsm2r" and cfg == _tsm2.TSM2RConfig() and lay.col
                    and _tsm2._col_one_wave(m, k, n, np.dtype(dtype).itemsize, lay, _tsm2.choose_tn(n),
                                            H100_ATTRS["sm_count"]) is not None)
        if not one_wave:
            assert free == kernel_name(family, pinned(family, cfg), m, k, n, dtype, lay), (family, cfg, m, k, n)
        if family == "tsm2r":
            rcfg = _tsm2.resolve_tsm2r(m, k, n, dtype, lay, cfg)
            assert rcfg.splits >= 1
        else:
            rcfg = _tsm2.resolve_tsm2l(m, k, n, dtype, lay, cfg)
            assert rcfg.tcf >= 1


def test_resolved_configurations_resolve_to_themselves():
    """A configuration the launcher resolved (as `launch_*` return it) launches the
    same kernel again when passed back in: bench records and user code can replay it."""
    pytest.importorskip("cupy")
    seen = set()
    for family, cfg, (m, k, n), dtype, kind in problems():
        lay = layout((m, k), dtype, kind)
        key = (family, cfg, m, k, n, np.dtype(dtype).name, lay)
        if key in seen:
            continue
        seen.add(key)
        resolve = _tsm2.resolve_tsm2r if family == "tsm2r" else _tsm2.resolve_tsm2l
        first = on_h100(resolve, m, k, n, dtype, lay, cfg)
        again = on_h100(resolve, m, k, n, dtype, lay, first)
        assert again == first, (family, cfg, m, k, n, first, again)


def test_source_from_swaps_one_family_and_restores(tmp_path):
    # The A/B kernel-file override: another version of conv.cu, its include
    # inlined from the kernels directory, its own module cache; all back afterwards.
    alt = tmp_path / "conv_old.cu"
    alt.write_text("// an older conv.cu\n" + _compile.kernel_path("conv").read_text())
    tree_conv, tree_gemm, tree_modules = _compile.source("conv"), _compile.source("gemm"), _compile._modules
    cache = {}
    with _compile.source_from("conv", alt, cache):
        text = _compile.source("conv")
        assert text == "// an older conv.cu\n" + tree_conv  # common.cuh inlined, as in the tree's
        assert _compile.source("gemm") == tree_gemm and _compile._modules is cache
    assert _compile.source("conv") == tree_conv and _compile._modules is tree_modules


@pytest.mark.parametrize("name", [
    "gemm_pipe<true, false, 16, 3, 16, 2, 1, 1, 4, true, false>",
    "gemm_pipe<true, false, 16, 4, 16, 2, 2, 2, 2, true, true>",
    "gemm_pipe<true, false, 16, 3, 16, 2, 1, 1, 1, false, false>"])
def test_gemm_pipe_builds_before_hopper(name):
    """The fused products' PDL instructions (griddepcontrol, sm_90) are compiled out
    for older GPUs: gemm.cu still builds for sm_80 (A100)."""
    r = _compile.compile_report("gemm", name, arch="sm_80")
    assert r.registers > 0, r.log
