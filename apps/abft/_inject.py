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
    """Bits in one element: 32 (float32) or 64 (float64)."""
    return np.dtype(dtype).itemsize * 8


def bit_class(bit, dtype) -> str:
    """"sign", "exponent" or "mantissa" for bit `bit` (0 = least significant) of an IEEE float."""
    mant = np.finfo(dtype).nmant  # 23 or 52
    nbits = bits_of(dtype)
    if not 0 <= bit < nbits:
        raise ValueError(f"bit must be in [0, {nbits}) for {np.dtype(dtype)}, got {bit}")
    if bit == nbits - 1:
        return "sign"
    return "exponent" if bit >= mant else "mantissa"


def flip_bit(X, i, j, bit):
    """Flip bit `bit` of element (i, j) of X in place. Returns (old, new) as Python floats.

    Examples
    --------
    >>> import numpy as np
    >>> from tsm_apps import abft
    >>> X = np.ones((2, 2), dtype=np.float32)
    >>> abft.flip_bit(X, 0, 1, 31)       # the sign bit
    (1.0, -1.0)
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
    """Add `value` to element (i, j) of X in place. Returns (old, new) as Python floats."""
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

    Parameters
    ----------
    row, col : int, optional
        The element; random (uniform) where None.
    bit : int, optional
        0 = least significant mantissa bit; 31 / 63 = sign. Random where None,
        or drawn from ``bits`` (e.g. ``range(23, 31)`` for float32 exponent bits).
    rng : numpy.random.Generator, optional

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
    """``inject=`` hook adding ``value`` to one element of C (random where not given)."""

    def __init__(self, row=None, col=None, value=1.0, *, rng=None):
        super().__init__(row, col, rng)
        self.value = float(value)

    def __call__(self, C):
        i, j = self._where(C)
        self.old, self.new = add_error(C, i, j, self.value)
