"""Seeded synthetic data for the k-means tests and benchmarks.

Generated in blocks of rows, each block from its own seeded stream
(``numpy.random.SeedSequence(seed).spawn``), so the result depends only on the
seed and the shape, not on how many threads filled it; big arrays (the 32 GB
streamed benchmark) are filled by a thread pool (numpy's generators release the GIL).

>>> from tsm_datasets import synthetic
>>> X, y, C = synthetic.blobs(1000, 8, 4, seed=0)
>>> X.shape, X.dtype.name, C.shape
((1000, 8), 'float32', (4, 8))
>>> bool((synthetic.blobs(1000, 8, 4, seed=0)[0] == X).all())
True
"""

from __future__ import annotations

import concurrent.futures
import os

import numpy as np

BLOCK_ROWS = 1 << 16

# The k-means benchmark's shapes, (n, d, k).
KMEANS_SHAPES = ((100_000, 4096, 16), (1_000_000, 256, 64), (1_000_000, 64, 1024), (100_000, 256, 64))


def _check(n, d, dtype):
    if n < 1 or d < 1:
        raise ValueError(f"n and d must be >= 1; got {n}, {d}")
    dtype = np.dtype(dtype)
    if dtype not in (np.float32, np.float64):
        raise TypeError(f"dtype must be float32 or float64; got {dtype}")
    return dtype


def _fill(out, seed, fn, threads):
    """out[a:b] = fn(rng_i, a, b) for each block i, over a thread pool."""
    n = out.shape[0]
    starts = list(range(0, n, BLOCK_ROWS))
    seqs = np.random.SeedSequence(seed).spawn(len(starts))

    def work(i):
        a = starts[i]
        b = min(n, a + BLOCK_ROWS)
        fn(np.random.default_rng(seqs[i]), out[a:b], a, b)

    threads = threads or min(16, os.cpu_count() or 1)
    if threads <= 1 or len(starts) == 1:
        for i in range(len(starts)):
            work(i)
    else:
        with concurrent.futures.ThreadPoolExecutor(threads) as ex:
            list(ex.map(work, range(len(starts))))
    return out


def uniform(n, d, *, seed=0, dtype=np.float32, threads=None):
    """(n, d) data uniform on [0, 1): the data of the torch baseline (``torch.rand``).

    Generated in blocks of rows, each from its own child of ``SeedSequence(seed)``,
    on a thread pool: the same seed gives the same array whatever `threads` is.

    Parameters
    ----------
    n, d : int
        Rows and columns, >= 1.
    seed : int, default=0
        Fixes the data.
    dtype : numpy dtype, default=numpy.float32
        float32 or float64.
    threads : int, optional
        Generator threads (default: up to 16, the CPU count).

    Returns
    -------
    X : numpy.ndarray of shape (n, d)
        C-ordered, of `dtype`.

    Raises
    ------
    ValueError
        n or d < 1.
    TypeError
        `dtype` is not float32 or float64.

    Examples
    --------
    >>> from tsm_datasets import synthetic
    >>> X = synthetic.uniform(1000, 3, seed=1)
    >>> X.shape, X.dtype.name, bool((X >= 0).all() and (X < 1).all())
    ((1000, 3), 'float32', True)
    >>> bool((X == synthetic.uniform(1000, 3, seed=1, threads=1)).all())
    True
    """
    dtype = _check(n, d, dtype)
    out = np.empty((n, d), dtype=dtype)
    return _fill(out, seed, lambda rng, o, a, b: rng.random(out=o, dtype=dtype), threads)


def blobs(n, d, k, *, seed=0, spread=1.0, scale=10.0, dtype=np.float32, threads=None):
    """Gaussian blobs: k centres uniform in [-scale, scale]^d, points N(centre, spread^2).

    Parameters
    ----------
    n, d : int
        Rows and columns, >= 1.
    k : int
        Number of blobs, >= 1.
    seed : int, default=0
        Fixes the data (centres, memberships and points).
    spread : float, default=1.0
        Standard deviation of the points about their centre.
    scale : float, default=10.0
        The centres lie in [-scale, scale]^d.
    dtype : numpy dtype, default=numpy.float32
        float32 or float64.
    threads : int, optional
        Generator threads (default: up to 16, the CPU count); the data do not depend on it.

    Returns
    -------
    X : numpy.ndarray of shape (n, d)
        C-ordered, of `dtype`.
    y : numpy.ndarray of shape (n,), int64
        The blob of each point.
    centres : numpy.ndarray of shape (k, d)
        The blobs' centres, of `dtype`.

    Raises
    ------
    ValueError
        n, d or k < 1.
    TypeError
        `dtype` is not float32 or float64.

    Examples
    --------
    >>> from tsm_datasets import synthetic
    >>> X, y, C = synthetic.blobs(500, 2, 3, seed=0, spread=0.1)
    >>> X.shape, C.shape, sorted(set(y.tolist()))
    ((500, 2), (3, 2), [0, 1, 2])
    >>> float(abs(X - C[y]).max()) < 1.0
    True
    """
    dtype = _check(n, d, dtype)
    if k < 1:
        raise ValueError(f"k must be >= 1; got {k}")
    root = np.random.default_rng(np.random.SeedSequence([seed, 1]))
    centres = root.uniform(-scale, scale, size=(k, d)).astype(dtype)
    y = root.integers(0, k, size=n)
    X = np.empty((n, d), dtype=dtype)

    def fill(rng, o, a, b):
        rng.standard_normal(out=o, dtype=dtype)
        o *= dtype.type(spread)
        o += centres[y[a:b]]

    _fill(X, seed, fill, threads)
    return X, y, centres
