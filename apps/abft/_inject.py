"""Fault injection: flip a bit or add an error at a chosen or random element.

The helpers work in place on numpy arrays, CuPy arrays and torch tensors (through
a view). ``BitFlip`` and ``AddError`` are callables for ``ft_matmul(inject=...)``:
they strike the product between the GEMM and its verification, and remember
what they did (row, col, bit, old, new) for the caller to check against the report.
"""

from __future__ import annotations

import numpy as np

from tsm_core import arrays

_UINT = {4: np.uint32, 8: np.uint64}


def _backend(X):
    Xb = arrays.to_backend(X, "X")
    if Xb.ndim != 2:
        raise ValueError(f"X must be 2-D, got shape {tuple(Xb.shape)}")
    if np.dtype(Xb.dtype) not in (np.dtype(np.float32), np.dtype(np.float64)):
        raise TypeError(f"X must be float32 or float64, not {Xb.dtype}")
    return Xb


def _index(Xb, i, j):
    m, n = Xb.shape
    if not (0 <= i < m and 0 <= j < n):
        raise IndexError(f"element ({i}, {j}) is outside an array of shape {(m, n)}")
    return int(i), int(j)


def bits_of(dtype) -> int:
    """Bits in one element of a float dtype.

    Parameters
    ----------
    dtype : numpy dtype or type
        float32 or float64.

    Returns
    -------
    int
        32 or 64.

    Raises
    ------
    TypeError
        `dtype` is not a dtype numpy understands.

    Examples
    --------
    >>> import numpy as np
    >>> from tsm_apps import abft
    >>> abft.bits_of(np.float32), abft.bits_of("float64")
    (32, 64)
    """
    return np.dtype(dtype).itemsize * 8


def bit_class(bit, dtype) -> str:
    """What bit `bit` of an IEEE float is: its sign, exponent or mantissa.

    Parameters
    ----------
    bit : int
        0 = least significant mantissa bit; 31 (float32) or 63 (float64) = sign.
    dtype : numpy dtype or type
        float32 or float64.

    Returns
    -------
    str
        "sign", "exponent" or "mantissa".

    Raises
    ------
    ValueError
        `bit` is outside [0, bits_of(dtype)).

    Examples
    --------
    >>> import numpy as np
    >>> from tsm_apps import abft
    >>> [abft.bit_class(b, np.float32) for b in (31, 23, 22)]
    ['sign', 'exponent', 'mantissa']
    """
    mant = np.finfo(dtype).nmant  # 23 or 52
    nbits = bits_of(dtype)
    if not 0 <= bit < nbits:
        raise ValueError(f"bit must be in [0, {nbits}) for {np.dtype(dtype)}, got {bit}")
    if bit == nbits - 1:
        return "sign"
    return "exponent" if bit >= mant else "mantissa"


def flip_bit(X, i, j, bit):
    """Flip one bit of element (i, j) of X in place.

    Parameters
    ----------
    X : numpy.ndarray, cupy.ndarray or torch.Tensor, 2-D, float32 or float64
        The array to strike (changed in place).
    i, j : int
        The element's row and column, 0 <= i < m and 0 <= j < n.
    bit : int
        0 = least significant mantissa bit; 31 (float32) or 63 (float64) = sign.

    Returns
    -------
    old, new : float
        The element before and after, as Python floats.

    Raises
    ------
    TypeError
        X is not a float32 or float64 array of a supported kind.
    IndexError
        (i, j) lies outside X.
    ValueError
        X is not 2-D, or `bit` is outside the element's bits.

    Examples
    --------
    >>> import numpy as np
    >>> from tsm_apps import abft
    >>> X = np.ones((2, 2), dtype=np.float32)
    >>> abft.flip_bit(X, 0, 1, 31)       # the sign bit
    (1.0, -1.0)
    >>> X.tolist()
    [[1.0, -1.0], [1.0, 1.0]]
    """
    Xb = _backend(X)
    i, j = _index(Xb, i, j)
    nbits = bits_of(Xb.dtype)
    if isinstance(bit, bool) or not 0 <= int(bit) < nbits:
        raise ValueError(f"bit must be in [0, {nbits}) for {Xb.dtype}, got {bit}")
    ut = _UINT[Xb.itemsize]
    old = float(Xb[i, j])
    v = Xb.view(ut)
    v[i, j] = v[i, j] ^ ut(1 << int(bit))
    return old, float(Xb[i, j])


def add_error(X, i, j, value):
    """Add `value` to element (i, j) of X in place.

    Parameters
    ----------
    X : numpy.ndarray, cupy.ndarray or torch.Tensor, 2-D, float32 or float64
        The array to strike (changed in place).
    i, j : int
        The element's row and column, 0 <= i < m and 0 <= j < n.
    value : float
        The error added.

    Returns
    -------
    old, new : float
        The element before and after, as Python floats.

    Raises
    ------
    TypeError
        X is not a float32 or float64 array of a supported kind.
    IndexError
        (i, j) lies outside X.
    ValueError
        X is not 2-D.

    Examples
    --------
    >>> import numpy as np
    >>> from tsm_apps import abft
    >>> X = np.zeros((2, 3))
    >>> abft.add_error(X, 1, 2, 0.5)
    (0.0, 0.5)
    """
    Xb = _backend(X)
    i, j = _index(Xb, i, j)
    old = float(Xb[i, j])
    Xb[i, j] = Xb.dtype.type(old + float(value)) if isinstance(Xb, np.ndarray) else old + float(value)
    return old, float(Xb[i, j])


class _Fault:
    """Common part: where to strike, chosen now or at random when called."""

    def __init__(self, row=None, col=None, rng=None):
        self.row, self.col = row, col
        self.rng = rng if rng is not None else np.random.default_rng()
        self.old = self.new = None
        self.hit = None  # (row, col) actually struck

    def _where(self, X):
        m, n = X.shape
        i = self.row if self.row is not None else int(self.rng.integers(m))
        j = self.col if self.col is not None else int(self.rng.integers(n))
        self.hit = (int(i), int(j))
        return self.hit

    @property
    def error(self):
        """new - old (inf or nan where the flip made a non-finite value)."""
        if self.old is None:
            return None
        with np.errstate(all="ignore"):
            return float(np.float64(self.new) - np.float64(self.old))


class BitFlip(_Fault):
    """``inject=`` hook flipping one bit of one element of C (random where not given).

    Called with the product C (before verification), it flips the bit in place and
    records where (``hit``), the values (``old``, ``new``) and the ``error``.

    Parameters
    ----------
    row, col : int, optional
        The element; random (uniform) where None.
    bit : int, optional
        0 = least significant mantissa bit; 31 / 63 = sign. Random where None.
    bits : iterable of int, optional
        Where `bit` is None, draw it from these (e.g. ``range(23, 31)`` for the
        float32 exponent bits); default: every bit.
    rng : numpy.random.Generator, optional
        The source of the random choices (default: a fresh generator).

    Raises
    ------
    ValueError
        When called: the bit lies outside C's elements' bits.

    Examples
    --------
    >>> import numpy as np
    >>> from tsm_apps import abft
    >>> f = abft.BitFlip(0, 0, bit=31)
    >>> C = np.full((2, 2), 3.0, dtype=np.float32); f(C)
    >>> f.hit, f.old, f.new
    ((0, 0), 3.0, -3.0)
    """

    def __init__(self, row=None, col=None, bit=None, *, bits=None, rng=None):
        super().__init__(row, col, rng)
        self.bit, self.bits = bit, bits

    def __call__(self, C):
        i, j = self._where(C)
        if self.bit is None:
            pool = list(self.bits) if self.bits is not None else list(range(bits_of(C.dtype)))
            self.bit = int(pool[int(self.rng.integers(len(pool)))])
        self.old, self.new = flip_bit(C, i, j, self.bit)


class AddError(_Fault):
    """``inject=`` hook adding ``value`` to one element of C (random where not given).

    Called with the product C (before verification), it adds the error in place and
    records where (``hit``), the values (``old``, ``new``) and the ``error``.

    Parameters
    ----------
    row, col : int, optional
        The element; random (uniform) where None.
    value : float, default=1.0
        The error added.
    rng : numpy.random.Generator, optional
        The source of the random choices (default: a fresh generator).

    Raises
    ------
    IndexError
        When called: the element lies outside C.

    Examples
    --------
    >>> import numpy as np
    >>> from tsm_apps import abft
    >>> A, B = np.ones((8, 4)), np.ones((4, 6))
    >>> f = abft.AddError(2, 5, value=100.0)
    >>> C, rep = abft.ft_matmul(A, B, inject=f)
    >>> f.hit, f.error, rep.verdict(), float(C[2, 5])
    ((2, 5), 100.0, 'corrected', 4.0)
    """

    def __init__(self, row=None, col=None, value=1.0, *, rng=None):
        super().__init__(row, col, rng)
        self.value = float(value)

    def __call__(self, C):
        i, j = self._where(C)
        self.old, self.new = add_error(C, i, j, self.value)
