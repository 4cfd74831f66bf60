"""Irregular GEMM batches: the generator of the batched-GEMM paper's experiments.

Zhang et al., "A load-balanced acceleration method for small and irregular batch
matrix multiplication on GPU" (J. Syst. Archit. 160, 2025), section 5.1: M and N
are drawn uniformly from [Min, Max_MN], K from [Min, Max_K], Min = 16, over twelve
sets of (Max_MN, Max_K), batch sizes 8, 16, 32, 64, 128 and 256. Sizes are any
integers in range, not powers of two.

The paper's text names the scheme and one set (Max_MN = 512, Max_K = 128) but
lists the twelve only on its figures' axes, which the text we have does not carry.
We take the grid Max_MN in {128, 256, 512, 1024} x Max_K in {128, 256, 512}: it
contains the example set and the four sets of the baseline (anchor) figures
(128/128, 512/128, 512/512, 1024/256), and spans the paper's "small and irregular" range.

Draws follow the anchors' order: M for the whole batch, then N, then K, each with
``rng.integers(16, max + 1, batch)``; the generator of one (Max_MN, Max_K, batch)
cell is seeded by (seed, Max_MN, Max_K, batch), so a cell does not depend on which
other cells were drawn before it.
"""

from __future__ import annotations

import numpy as np

MIN_SIZE = 16
MAX_MN = (128, 256, 512, 1024)
MAX_K = (128, 256, 512)
# The twelve (Max_MN, Max_K) range sets.
RANGE_SETS = tuple((mn, k) for mn in MAX_MN for k in MAX_K)
BATCH_SIZES = (8, 16, 32, 64, 128, 256)

__all__ = ["MIN_SIZE", "RANGE_SETS", "BATCH_SIZES", "irregular_shapes", "irregular_batch",
           "cells"]


def irregular_shapes(max_mn: int, max_k: int, batch: int, *, seed: int = 0,
                     min_size: int = MIN_SIZE) -> list[tuple[int, int, int]]:
    """The (M, N, K) of one irregular batch.

    M, N uniform integers in [min_size, max_mn], K in [min_size, max_k].

    Parameters
    ----------
    max_mn, max_k : int
        Upper bounds (inclusive); at least `min_size`.
    batch : int
        Number of problems (>= 0).
    seed : int, default=0
        With (max_mn, max_k, batch), fixes the draw.
    min_size : int, default=MIN_SIZE
        Lower bound of every size.

    Returns
    -------
    list of tuple of int
        (M, N, K) of each problem, length `batch`.

    Raises
    ------
    ValueError
        A bound below `min_size`, or a negative `batch`.

    Examples
    --------
    >>> from tsm_datasets.irregular import irregular_shapes
    >>> s = irregular_shapes(512, 128, 4, seed=1)
    >>> len(s), all(16 <= m <= 512 and 16 <= n <= 512 and 16 <= k <= 128 for m, n, k in s)
    (4, True)
    """
    for name, v in (("max_mn", max_mn), ("max_k", max_k)):
        if int(v) < min_size:
            raise ValueError(f"{name} must be >= min_size = {min_size}; got {v}")
    if int(batch) < 0:
        raise ValueError(f"batch must be >= 0; got {batch}")
    rng = np.random.default_rng([int(seed), int(max_mn), int(max_k), int(batch)])
    ms = rng.integers(min_size, int(max_mn) + 1, int(batch))
    ns = rng.integers(min_size, int(max_mn) + 1, int(batch))
    ks = rng.integers(min_size, int(max_k) + 1, int(batch))
    return [(int(m), int(n), int(k)) for m, n, k in zip(ms, ns, ks)]


def irregular_batch(shapes, *, dtype=np.float32, seed: int = 0, order: str = "C"):
    """Random signed operands for `shapes`: lists As (M, K) and Bs (K, N), numpy.

    Entries are standard normal (never zeros, which hide unwritten outputs), in
    C or F order.

    Parameters
    ----------
    shapes : iterable of (M, N, K)
        The problems, as `irregular_shapes` returns them.
    dtype : numpy dtype, default=numpy.float32
        The operands' dtype.
    seed : int, default=0
        Fixes the entries.
    order : {"C", "F"}, default="C"
        The operands' memory order.

    Returns
    -------
    As : list of numpy.ndarray
        A of each problem, shape (M, K).
    Bs : list of numpy.ndarray
        B of each problem, shape (K, N).

    Raises
    ------
    ValueError
        `order` is not "C" or "F".

    Examples
    --------
    >>> from tsm_datasets.irregular import irregular_batch
    >>> As, Bs = irregular_batch([(3, 5, 2)], order="F")
    >>> As[0].shape, Bs[0].shape, bool(As[0].flags.f_contiguous)
    ((3, 2), (2, 5), True)
    """
    if order not in ("C", "F"):
        raise ValueError(f"order must be 'C' or 'F'; got {order!r}")
    rng = np.random.default_rng(seed)
    As, Bs = [], []
    for m, n, k in shapes:
        As.append(np.asarray(rng.standard_normal((m, k)), dtype=dtype, order=order))
        Bs.append(np.asarray(rng.standard_normal((k, n)), dtype=dtype, order=order))
    return As, Bs


def cells(seed: int = 0, *, range_sets=RANGE_SETS, batch_sizes=BATCH_SIZES):
    """Every (max_mn, max_k, batch, shapes) of the paper's sweep: 12 x 6 = 72 cells.

    Parameters
    ----------
    seed : int, default=0
        Fixes every cell's shapes (`irregular_shapes`).
    range_sets : sequence of (max_mn, max_k), default=RANGE_SETS
        The size ranges.
    batch_sizes : sequence of int, default=BATCH_SIZES
        The batch sizes.

    Returns
    -------
    list of tuple
        (max_mn, max_k, batch, shapes) per cell, range sets outermost.

    Raises
    ------
    ValueError
        As `irregular_shapes`.

    Examples
    --------
    >>> from tsm_datasets.irregular import cells
    >>> c = cells()
    >>> len(c), c[0][:3] == (c[0][0], c[0][1], len(c[0][3]))
    (72, True)
    """
    return [(mn, k, b, irregular_shapes(mn, k, b, seed=seed))
            for mn, k in range_sets for b in batch_sizes]
