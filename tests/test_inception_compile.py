"""Every conv.cu instantiation the Inception launcher can pick compiles for sm_90
without spilling, beyond what its configuration allows after measurement (NVRTC, no
GPU). The list is the launcher's own (``_conv.all_names``)."""

import pytest

nvrtc = pytest.importorskip("cupy_backends.cuda.libs.nvrtc", reason="NVRTC (CuPy) is not available")
try:
    nvrtc.getVersion()
except Exception as exc:  # the module imports but libnvrtc cannot be loaded
    pytest.skip(f"NVRTC cannot be loaded: {exc}", allow_module_level=True)

from tsm_core.runtime import compile as _compile  # noqa: E402

from tsm_core.conv import api as _conv  # noqa: E402


@pytest.mark.parametrize("name", _conv.all_names())
def test_compiles_without_spills(name):
    # A configuration may allow a measured amount (spill_ok, with its reason in CONFIGS).
    cfg = next(c for c in _conv.CONFIGS if c.name == name)
    rep = _compile.compile_report(_conv.FAMILY, name)
    assert rep.registers > 0, rep.log
    assert max(rep.spill_stores, rep.spill_loads) <= cfg.spill_ok, \
        f"{name}: {rep.spill_stores} B spill stores, {rep.spill_loads} B loads"
    assert rep.stack_frame <= cfg.spill_ok, f"{name}: stack frame {rep.stack_frame} B"
    # The register cap __launch_bounds__ promises: MINB blocks of `threads` per SM.
    assert rep.registers * cfg.threads * cfg.minb <= 65536
