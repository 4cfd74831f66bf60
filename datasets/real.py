"""Real data sets that ship inside scikit-learn (no download).

Each loader returns ``(X, y)``: X a C-ordered float array (float64 unless `dtype`
says otherwise), y the integer classes (for checking a clustering, never for fitting).

>>> from tsm_datasets import real
>>> X, y = real.load("digits")
>>> X.shape, X.dtype.name, int(y.max()) + 1
((1797, 64), 'float64', 10)
"""

from __future__ import annotations

import numpy as np

# name -> the sklearn.datasets loader that reads it from the installed package
BUNDLED = {
    "digits": "load_digits",  # 8x8 images of handwritten digits, 1797 x 64, 10 classes
    "iris": "load_iris",  # 150 x 4, 3 classes
    "wine": "load_wine",  # 178 x 13, 3 classes
    "breast_cancer": "load_breast_cancer",  # 569 x 30, 2 classes
}


def names() -> list:
    """Names `load` accepts."""
    return sorted(BUNDLED)


def load(name: str, dtype=np.float64):
    """(X, y) of a data set bundled with scikit-learn.

    Parameters
    ----------
    name : one of `names()`
    dtype : float32 or float64

    Returns
    -------
    X : (n_samples, n_features) C-ordered array of `dtype`;  y : (n_samples,) int64
    """
    if name not in BUNDLED:
        raise ValueError(f"unknown data set {name!r}; choose one of {names()}")
    dtype = np.dtype(dtype)
    if dtype not in (np.float32, np.float64):
        raise TypeError(f"dtype must be float32 or float64; got {dtype}")
    import sklearn.datasets

    bunch = getattr(sklearn.datasets, BUNDLED[name])()
    X = np.ascontiguousarray(bunch.data, dtype=dtype)
    y = np.asarray(bunch.target, dtype=np.int64)
    return X, y
