"""Every instantiation of batched/batched.cu the launcher uses (both dtypes, every version;
versions 3 and 4 float32 only) compiles for sm_90 without spills (version 3: within
``tsm_core.batched.plan.SPILL_BYTES_ALLOWED``).

No GPU needed (NVRTC). Also checks that the register counts kept in
``tsm_core.batched.plan.REGS_FALLBACK`` (used for planning where neither a GPU nor NVRTC is
available) are what sm_90 really compiles to.
"""

import re

import numpy as np
import pytest

nvrtc = pytest.importorskip("cupy_backends.cuda.libs.nvrtc", reason="NVRTC (CuPy) is not available")
try:
    nvrtc.getVersion()
except Exception as exc:  # the module imports but libnvrtc cannot be loaded
    pytest.skip(f"NVRTC cannot be loaded: {exc}", allow_module_level=True)

from tsm_core.batched import launch as _launch  # noqa: E402
from tsm_core.batched import plan as _plan  # noqa: E402

from tsm_core.runtime import compile as _compile  # noqa: E402


@pytest.mark.parametrize("version", _plan.VERSIONS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_no_spills_sm90(dtype, version):
    if version in _plan.FLOAT32_ONLY and dtype == np.float64:
        pytest.skip(f"version {version} is float32 only")
    r = _compile.compile_report(_plan.FAMILY, _launch.name_expr(dtype, version),
                                arch="sm_90")
    assert r.registers > 0, r.log
    allowed = _plan.SPILL_BYTES_ALLOWED.get(version, 0) if dtype == np.float32 else 0
    assert max(r.spill_stores, r.spill_loads, r.stack_frame) <= allowed, f"{r.name_expr}: {r.log}"
    assert r.registers == _plan.regs_fallback(dtype, version)
    # The launch bounds promise 256 threads x (3 or 2) blocks per SM.
    assert r.registers * 256 * _plan.blocks_per_sm_bound(dtype, version) <= 65536
    if version in _plan.DYNAMIC_SMEM:  # the ring is dynamic: no static array to speak of
        m = re.search(r"(\d+) bytes smem", r.log)
        assert m is None or int(m.group(1)) <= 16, r.log
    else:
        assert f"{_plan.smem_bytes(dtype, version)} bytes smem" in r.log
