"""What every k-means launcher shares: CuPy, the compiled kernels, operand layout.

X is used as given (row-major, unit column stride; any other layout is copied once
to C order by ``_c_rows``). The kernels read rows in vectors of up to 16 bytes:
``_vec_for`` finds the widest that X's row length, stride and address allow.
"""

from __future__ import annotations

import numpy as np

from tsm_core.runtime import compile as _compile

FAMILY = "kmeans"
NULL = np.uint64(0)  # a null pointer argument


def _cp():
    import cupy

    return cupy


def _vec_for(X, itemsize: int) -> int:
    """Widest vector (elements, <= 16 bytes) that d, the row stride and X's address allow."""
    d = X.shape[1]
    ld = X.strides[0] // itemsize if X.shape[0] > 1 else d
    ptr = X.data.ptr
    v = 16 // itemsize
    while v > 1 and (d % v or ld % v or ptr % (v * itemsize)):
        v //= 2
    return v


def _kernel(name: str, smem: int = 0):
    """The compiled kernel `name` (an instantiation of kmeans.cu), with room for
    `smem` bytes of dynamic shared memory where that is above the 48 KiB default."""
    kern = _compile.get_kernel(FAMILY, name)
    if smem > 48 * 1024:
        kern.max_dynamic_shared_size_bytes = smem
    return kern


def _c_rows(X):
    """X with unit column stride (a C-ordered copy otherwise)."""
    cp = _cp()
    if X.ndim != 2:
        raise ValueError(f"X must be 2-D; got shape {X.shape}")
    if X.shape[1] > 1 and X.strides[1] != X.itemsize or X.strides[0] < 0:
        X = cp.ascontiguousarray(X)
    return X
