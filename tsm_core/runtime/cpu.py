"""The numpy path: ``C = alpha * A @ B + beta * out`` on the CPU, no GPU needed.

It follows the BLAS conventions for beta: out's old contents enter only when
out is given and beta != 0, so with beta == 0 a NaN or Inf left in out does not
reach the result. alpha has no such special case: ``alpha * (A @ B)`` is taken
as IEEE says, so NaN and Inf in A or B propagate even when alpha == 0.
"""

from __future__ import annotations

import numpy as np


def matmul_cpu(ops):
    """Compute ``alpha * A @ B + beta * out`` for checked numpy operands.

    A has shape (M, K), B (K, N), out (M, N).

    Parameters
    ----------
    ops : tsm_core.runtime.checks.Operands
        From ``check_operands``; its arrays must be numpy arrays.

    Returns
    -------
    numpy.ndarray of shape (M, N) and dtype ``ops.dtype``
        ``ops.out``, written in place, when it was given; otherwise a new array.
        K == 0 gives ``beta * out`` (or zeros); M == 0 or N == 0 an empty array.
    """
    A, B, out = ops.A, ops.B, ops.out
    alpha, beta = ops.alpha, ops.beta

    if out is None or beta == 0.0:
        # np.matmul writes a strided or F-ordered out correctly (through a
        # buffer where it must), and yields zeros when K == 0.
        C = np.matmul(A, B, out=out)
        if alpha != 1.0:
            C *= alpha
        return C

    AB = np.matmul(A, B)
    if alpha != 1.0:
        AB *= alpha
    if beta != 1.0:
        out *= beta
    out += AB
    return out
