"""The C++ half of batched calls on torch tensors (``fastpath.cpp``), built on first use.

A repeated ``batched_matmul`` on torch CUDA tensors spends its host time
recognising the batch: in Python, a few attribute reads per tensor. The extension
reads each tensor's data pointer, sizes, strides, dtype and device straight from
torch's C++ object and launches the remembered kernel in the same call (see the
source's header for what it compares and why that is safe).

`get()` returns the loaded module, or None where it cannot be had; callers then
keep their Python path, which computes the same results. Building, caching and
loading are ``tsm_core/runtime/native.py``'s (one mechanism for the package's C++
extensions): compiled once per (source, torch version, Python ABI) into
``cache_dir()/native/`` and loaded from there by later processes (milliseconds).
This one builds in the caller's thread, on the first batched call on torch tensors.

Environment: ``TSM_NATIVE=0`` never builds or loads it (the Python path);
``TSM_NATIVE=1`` makes a failed build an error instead of a warning.
"""

from __future__ import annotations

from pathlib import Path

from tsm_core.runtime import native as _runtime_native

SOURCE = Path(__file__).parent / "fastpath.cpp"
MODULE = "tsm_fastpath"  # PyInit_tsm_fastpath in the source

EXTENSION = _runtime_native.Extension(
    SOURCE, MODULE, "fastpath", "the C++ fast path for torch tensors",
    "batched calls take the Python path")

# The module-level names callers and tests use (bound to this extension).
target, build, load, get, status, _reset_for_tests = EXTENSION.functions()
