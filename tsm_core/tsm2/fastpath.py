"""The C++ half of ``matmul`` on torch tensors routed to cuBLAS (``fastpath.cpp``).

Built on first use, in a background thread (calls keep the Python path until it is
ready), by the package's one mechanism for C++ extensions
(``tsm_core/runtime/native.py``: the batched family's fast path uses the same
compiler, flags, cache directory and switch): compiled once per (source, torch
version, Python ABI) into ``cache_dir()/native/`` and loaded from there by later
processes. `get()` returns the module, or None where it cannot be had; ``matmul``
then keeps its Python path, which computes the same results.

Environment: ``TSM_NATIVE=0`` never builds or loads it; ``TSM_NATIVE=1`` makes a
failed build an error instead of a warning.
"""

from __future__ import annotations

from pathlib import Path

from tsm_core.runtime import native as _runtime_native

SOURCE = Path(__file__).parent / "fastpath.cpp"
MODULE = "tsm_mm_fastpath"  # PyInit_tsm_mm_fastpath in the source

EXTENSION = _runtime_native.Extension(
    SOURCE, MODULE, "mm-fastpath", "the C++ matmul fast path for torch tensors",
    "matmul takes the Python path", background=True)

# The module-level names callers and tests use (bound to this extension).
target, build, load, get, status, _reset_for_tests = EXTENSION.functions()
