"""Every k-means kernel instantiation the launchers can pick compiles for sm_90
without spilling (NVRTC, no GPU). The list comes from the launcher's own
configuration function (``tsm_core.kmeans.configs.all_names``), so it follows its defaults."""

import numpy as np
import pytest

nvrtc = pytest.importorskip("cupy_backends.cuda.libs.nvrtc", reason="NVRTC (CuPy) is not available")
try:
    nvrtc.getVersion()
except Exception as exc:  # the module imports but libnvrtc cannot be loaded
    pytest.skip(f"NVRTC cannot be loaded: {exc}", allow_module_level=True)

from tsm_core.runtime import compile as _compile  # noqa: E402

from tsm_core.kmeans import configs as _kmeans  # noqa: E402
from tsm_core.kmeans.launch import FAMILY  # noqa: E402

NAMES = sorted(set(_kmeans.all_names(np.float32)) | set(_kmeans.all_names(np.float64))
               | set(_kmeans.all_names("float16")) | set(_kmeans.all_names("bfloat16")))


@pytest.mark.parametrize("name", NAMES)
def test_compiles_without_spills(name):
    rep = _compile.compile_report(FAMILY, name)
    assert rep.registers > 0, rep.log
    assert not rep.spills, f"{name}: {rep.spill_stores} B spill stores, {rep.spill_loads} B loads"
    assert rep.stack_frame == 0, f"{name}: stack frame {rep.stack_frame} B (registers indexed at run time?)"


def test_fused_config_bounds_registers():
    # The register budget of the fused kernel is R * KP partial sums per lane.
    for dtype in (np.float32, np.float64):
        for k in range(1, _kmeans.FUSED_KMAX + 1):
            vec, w, r, kp, kt = _kmeans.fused_config(k, dtype, 16 // np.dtype(dtype).itemsize)
            assert kp >= k and r * kp * np.dtype(dtype).itemsize <= 256
            assert kt % (32 * vec) == 0


def test_tile2_steps_split_evenly():
    # kmeans_assign_tile2's static_asserts, checked here for every width X may allow:
    # whole X vectors per thread and step, whole warps for the centre tile's chunks.
    for dtype in (np.float32, np.float64):
        item = np.dtype(dtype).itemsize
        for vec in (v for v in (4, 2, 1) if v * item <= 16):
            bm, bn, bk, tm, tn = _kmeans.tile_config(dtype, "v2", vec)
            v_used, bk2 = _kmeans.TILE2_STEP[item][vec]
            assert bk == bk2 and bk % v_used == 0 and v_used <= vec
            assert (bm * bk // v_used) % 256 == 0
            chunks = bk * bn // (16 // item)
            assert chunks % 256 == 0 or (chunks < 256 and chunks % 32 == 0)
            assert bm <= 256 and (bm // tm) * (bn // tn) == 256  # threads per block
            assert f"kmeans_assign_tile2<{_compile.ctype(dtype)}, {v_used}," in _kmeans.tile_name(dtype, vec, "v2")


def test_half_update_names():
    # Half-precision X: the update side's kernels read __half / __nv_bfloat16 rows and
    # finalize float32 centres; every lanes-per-row choice of the partials is listed.
    for t, c in (("float16", "__half"), ("bfloat16", "__nv_bfloat16")):
        names = _kmeans.all_names(t)
        assert f"kmeans_row_sqnorm<{c}>" in names and "kmeans_finalize<float>" in names
        assert any(n.startswith(f"kmeans_sums_direct<{c}, 8, 8, 32>") for n in names)
        for lpr in _kmeans.PARTIALS_LPR:
            assert _kmeans.partials_name(t, 8, lpr) in names
        assert _kmeans.partials_name(t, 8, 16) == f"kmeans_partials<{c}, 8, 16, {_kmeans.PIECE}>"


def _cuda_headers():
    """The CUDA runtime headers' folder (cuda_fp16.h) next to the pip NVRTC, if any."""
    try:
        import nvidia.cuda_runtime as rt
    except ImportError:
        return None
    from pathlib import Path

    for base in rt.__path__:
        if (Path(base) / "include" / "cuda_fp16.h").exists():
            return str(Path(base) / "include")
    return None


@pytest.mark.parametrize("name", ["kmeans_partials<__nv_bfloat16, 8, 8, 256>", "kmeans_sums_direct<__half, 8, 8, 32>",
                                  "kmeans_sums_direct<__half, 8, 8, 4>", "kmeans_row_sqnorm<__half>",
                                  "kmeans_partials<float, 4, 16, 256>"])
def test_compiles_with_cuda_half_headers(name):
    # CuPy puts CUDA's headers on the include path of the modules it compiles: kmeans.cu
    # then takes __half / __nv_bfloat16 from them (the test above, without them, its
    # stand-ins); the kernels read the raw bits either way.
    inc = _cuda_headers()
    if inc is None:
        pytest.skip("no CUDA runtime headers here")
    check = "\n#ifndef TSM_KMEANS_CUDA_HALF\n#error the stand-ins were used\n#endif\n"
    prog = nvrtc.createProgram(_compile.source(FAMILY) + check, "kmeans.cu", [], [])
    try:
        nvrtc.addNameExpression(prog, name)
        try:
            nvrtc.compileProgram(prog, ["-arch=sm_90", *_compile.OPTIONS, f"-I{inc}"])
        except Exception as exc:
            raise AssertionError(nvrtc.getProgramLog(prog)) from exc
    finally:
        nvrtc.destroyProgram(prog)
