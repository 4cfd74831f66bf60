"""Launching compiled kernels: CUfunction handles, the driver's launch, streams.

Every family launches through CuPy's ``RawKernel.__call__`` or, where host time
matters (batched calls, Strassen's many products), through the driver with the
handle from :func:`func_ptr`.
"""

from __future__ import annotations


def func_ptr(f) -> int:
    """The CUfunction handle of a compiled kernel (a Function, or CuPy 14's RawKernel)."""
    return f.ptr if hasattr(f, "ptr") else f.kernel.ptr
