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
    """Names of the data sets `load` accepts.

    Returns
    -------
    list of str
        Sorted names.

    Examples
    --------
    >>> from tsm_datasets import real
    >>> real.names()
    ['breast_cancer', 'digits', 'iris', 'wine']
    """
    return sorted(BUNDLED)


def load(name: str, dtype=np.float64):
    """(X, y) of a data set bundled with scikit-learn (read from the installed package).

    Parameters
    ----------
    name : str
        One of `names()`.
    dtype : numpy dtype, default=numpy.float64
        float32 or float64: the dtype of X.

    Returns
    -------
    X : numpy.ndarray of shape (n_samples, n_features)
        C-ordered, of `dtype`.
    y : numpy.ndarray of shape (n_samples,), int64
        The known classes (for checking a clustering, never for fitting).

    Raises
    ------
    ValueError
        An unknown `name`.
    TypeError
        `dtype` is not float32 or float64.

    Examples
    --------
    >>> import numpy as np
    >>> from tsm_datasets import real
    >>> X, y = real.load("iris", dtype=np.float32)
    >>> X.shape, X.dtype.name, sorted(set(y.tolist()))
    ((150, 4), 'float32', [0, 1, 2])
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
