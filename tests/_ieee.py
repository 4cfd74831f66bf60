"""The NaN / Inf propagation pattern shared by the CPU and GPU tests.

A needs at least 12 columns and 9 rows, B at least 12 rows and 5 columns.
"""

import numpy as np


def plant(A, B):
    """Put NaN and Inf where their effect on C = A @ B is known (numpy or CuPy)."""
    A[3, 5] = np.nan  # row 3 of C: NaN everywhere
    A[8, 2] = np.inf  # row 8 of C: +-Inf with the sign of B[2, :]
    B[11, 4] = -np.inf  # column 4 of C: -+Inf with the opposite sign of A[:, 11]


def check(C, A, B, what=""):
    """C (numpy) shows exactly the pattern `plant` makes in A and B (numpy)."""
    m, n = C.shape
    assert np.all(np.isnan(C[3])), f"{what}: NaN in A[3, 5] did not reach all of C[3]"
    # A row holding Inf meets the column holding Inf at C[8, 4]: Inf * -Inf
    # plus the rest. Skip that element; everywhere else the sign is known.
    cols = [j for j in range(n) if j != 4]
    np.testing.assert_array_equal(C[8, cols], np.inf * np.sign(B[2, cols]))
    rows = [i for i in range(m) if i not in (3, 8)]
    np.testing.assert_array_equal(C[rows, 4], -np.inf * np.sign(A[rows, 11]))
    rest = np.ones((m, n), dtype=bool)
    rest[[3, 8], :] = False
    rest[:, 4] = False
    assert np.all(np.isfinite(C[rest])), f"{what}: NaN/Inf leaked into other elements"
