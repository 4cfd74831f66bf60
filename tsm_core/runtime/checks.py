"""check_operands(): every input rule of ``C = alpha * A @ B + beta * C``.

All checks run before anything is allocated or written: a call that is
refused leaves every array the caller passed exactly as it was. Only after the
last check passes are A and B promoted to the result dtype (the one step that
may allocate).

Rules:

- A is (m, k), B is (k, n), out is (m, n); all 2-D. Any dimension may be 0.
- A, B and out are the same kind (numpy / CuPy / torch CUDA / torch CPU),
  else TypeError.
- Element types are float32 or float64, else TypeError. Mixed float32 and
  float64 promote like numpy: the float32 operand is cast and the result is
  float64. ``out`` must have exactly the result dtype.
- CuPy operands (torch CUDA tensors included) live on one device.
- ``out`` may not share memory with A or B, even where promotion would have
  copied that operand anyway: the rule is simpler to state that way.
- Any memory order is accepted: C- or F-ordered, transposed, strided views.
- alpha and beta are real numbers (int or float, numpy's included); NaN and
  Inf are allowed and behave as IEEE says.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Any

import numpy as np

from tsm_core.runtime import arrays as _arrays

_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


@dataclass(frozen=True)
class Operands:
    """Checked operands of ``C = alpha * A @ B + beta * out``.

    A, B and out are backend arrays (numpy or CuPy); A and B already have the
    result dtype. `kind` and `like` are what ``_arrays.wrap`` needs to hand the
    result back as the caller's type.
    """

    A: Any
    B: Any
    out: Any
    kind: str
    like: Any
    m: int
    k: int
    n: int
    dtype: np.dtype
    alpha: float
    beta: float
    xp: Any


def check_operands(A, B, *, out=None, alpha=1.0, beta=0.0):
    """Check the operands of ``alpha * A @ B + beta * out`` and view them for a backend.

    A has shape (m, k), B (k, n), out (m, n).

    Parameters
    ----------
    A, B : numpy.ndarray, cupy.ndarray or torch.Tensor
        The operands: float32 or float64, one kind, any memory order.
    out : array of the same kind, optional
        Where the result goes: shape (m, n), the result dtype, writable, sharing
        no memory with A or B.
    alpha, beta : real numbers
        The scale factors.

    Returns
    -------
    Operands
        The backend views (numpy or CuPy, no copies of the caller's data; A and B
        promoted to the result dtype where they differ), the sizes, the dtype,
        alpha and beta as floats, the caller's kind and the backend module ``xp``.

    Raises
    ------
    TypeError
        Unsupported array type, mixed kinds, unsupported dtype, out of the wrong
        dtype, alpha or beta not a real number.
    ValueError
        Not 2-D, inner dimensions differ, out of the wrong shape, read-only or
        overlapping A or B, operands on different GPUs.

    Examples
    --------
    >>> import numpy as np
    >>> from tsm_core.arrays import check_operands
    >>> ops = check_operands(np.ones((5, 3), np.float32), np.ones((3, 2)))
    >>> (ops.m, ops.k, ops.n), ops.dtype, ops.kind
    ((5, 3, 2), dtype('float64'), 'numpy')
    >>> check_operands(np.ones((5, 3)), np.ones((4, 2)))
    Traceback (most recent call last):
    ...
    ValueError: inner dimensions differ: A has shape (5, 3) and B has shape (4, 2); A.shape[1] must equal B.shape[0]
    """
    fast = _fast_cupy(A, B, out, alpha, beta)
    if fast is not None:
        return fast
    kind = _arrays.kind_of(A, "A")
    for name, x in (("B", B), ("out", out)):
        if name == "out" and x is None:
            continue
        other = _arrays.kind_of(x, name)
        if other != kind:
            raise TypeError(
                f"A is a {_KIND_WORDS[kind]} but {name} is a {_KIND_WORDS[other]}; "
                "pass all arrays as the same kind"
            )

    for name, x, want in (("A", A, "(m, k)"), ("B", B, "(k, n)")):
        if x.ndim != 2:
            raise ValueError(
                f"{name} must be 2-D with shape {want}; got a {x.ndim}-D array "
                f"of shape {tuple(x.shape)}"
            )
    m, k = (int(d) for d in A.shape)
    kb, n = (int(d) for d in B.shape)
    if k != kb:
        raise ValueError(
            f"inner dimensions differ: A has shape {(m, k)} and B has shape "
            f"{(kb, n)}; A.shape[1] must equal B.shape[0]"
        )

    dt_a = _float_dtype(A, "A")
    dt_b = _float_dtype(B, "B")
    dtype = np.result_type(dt_a, dt_b)

    alpha = _real(alpha, "alpha")
    beta = _real(beta, "beta")

    if out is not None:
        if out.ndim != 2 or tuple(out.shape) != (m, n):
            raise ValueError(
                f"out must have shape (m, n) = {(m, n)}; got shape {tuple(out.shape)}"
            )
        dt_out = _arrays.numpy_dtype(out)
        if dt_out is None or dt_out != dtype:
            raise TypeError(
                f"out must have the result dtype {dtype} (A is {dt_a}, B is "
                f"{dt_b}); got {_arrays.dtype_name(out)}"
            )

    # Views only from here: no data is copied, and torch tensors that require
    # grad are refused before anything happens.
    a = _arrays.to_backend(A, "A")
    b = _arrays.to_backend(B, "B")
    c = None if out is None else _arrays.to_backend(out, "out")

    if kind in ("cupy", "torch"):
        import cupy as xp

        _same_device(a, b, c)
    else:
        xp = np

    if c is not None:
        _writable(c)
        hits = [name for name, x in (("A", a), ("B", b)) if _overlap(c, x)]
        if hits:
            # Name the operand out is (or is a view of the same elements as) before
            # one whose byte range merely meets out's: out=B is "shares memory with B".
            name = hits[0]
            if len(hits) == 2 and (out is B or _same_elements(c, b)) \
                    and not (out is A or _same_elements(c, a)):
                name = "B"
            raise ValueError(
                f"out shares memory with {name}; tsm writes out while it reads "
                f"{name}, so pass a separate out array"
            )

    # Every check has passed: the first allocation may happen here.
    a = a.astype(dtype, copy=False)
    b = b.astype(dtype, copy=False)
    return Operands(
        A=a, B=b, out=c, kind=kind, like=A, m=m, k=k, n=n, dtype=dtype,
        alpha=alpha, beta=beta, xp=xp,
    )


_KIND_WORDS = {
    "numpy": "numpy array",
    "cupy": "CuPy array",
    "torch": "torch CUDA tensor",
    "torch-cpu": "torch CPU tensor",
}


def _float_dtype(x, name):
    dt = _arrays.numpy_dtype(x)
    # `is None` first: numpy compares None equal to float64 (np.dtype(None)).
    if dt is None or dt not in _FLOATS:
        raise TypeError(
            f"{name} has dtype {_arrays.dtype_name(x)}; tsm supports float32 and "
            "float64 only"
        )
    return dt


def _real(v, name):
    # numbers.Real covers int, float and numpy's integer and floating scalars;
    # bool is an int to Python but almost certainly a mistake here.
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Real):
        raise TypeError(f"{name} must be a real number; got {type(v).__name__} {v!r}")
    return float(v)


def _same_device(a, b, c):
    ids = {"A": a.device.id, "B": b.device.id}
    if c is not None:
        ids["out"] = c.device.id
    if len(set(ids.values())) > 1:
        where = ", ".join(f"{k} on GPU {v}" for k, v in ids.items())
        raise ValueError(f"operands are on different GPUs ({where}); move them to one")


def _writable(c):
    if isinstance(c, np.ndarray) and not c.flags.writeable:
        raise ValueError("out is read-only; pass a writable array")


def _overlap(x, y):
    """Whether backend arrays x and y may share memory (conservative).

    numpy: np.shares_memory, which is exact, bounded in work; a case too hard to
    decide counts as overlapping. CuPy: whether the byte ranges the two arrays
    span intersect; a strided view interleaved with another counts as
    overlapping even if no element is shared.
    """
    if x.size == 0 or y.size == 0:
        return False
    if isinstance(x, np.ndarray):
        if not np.may_share_memory(x, y):
            return False
        try:
            return bool(np.shares_memory(x, y, max_work=10**6))
        except np.exceptions.TooHardError:
            return True
    return _ranges_overlap(
        _byte_extent(x.data.ptr, x.shape, x.strides, x.itemsize),
        _byte_extent(y.data.ptr, y.shape, y.strides, y.itemsize),
    )


def _pointer(x):
    """The address of x's first element (numpy or CuPy)."""
    if isinstance(x, np.ndarray):
        return x.__array_interface__["data"][0]
    return x.data.ptr


def _same_elements(x, y) -> bool:
    """Whether backend arrays x and y are views of exactly the same elements in the
    same layout (same address, shape, strides and dtype)."""
    return (x.shape == y.shape and x.strides == y.strides and x.dtype == y.dtype
            and _pointer(x) == _pointer(y))


def _byte_extent(ptr, shape, strides, itemsize):
    """[lo, hi): the bytes an array of this layout can touch. Strides may be negative.

    `ptr` is the address of element [0, ..., 0]; the array must not be empty.
    """
    lo = hi = ptr
    for dim, stride in zip(shape, strides):
        step = (dim - 1) * stride
        if step < 0:
            lo += step
        else:
            hi += step
    return lo, hi + itemsize


def _ranges_overlap(r, s):
    return r[0] < s[1] and s[0] < r[1]


def _fast_cupy(A, B, out, alpha, beta):
    """The common GPU call, checked with as few attribute reads as possible.

    Returns Operands when A, B (and out) are CuPy arrays of one float dtype on one
    device and every rule holds; otherwise None, and the general path (which also
    writes the error messages) takes over. Python overhead is what separates a
    5-microsecond kernel from a 30-microsecond call, so this path matters.
    """
    cupy = _arrays._loaded("cupy")
    if cupy is None:
        return None
    nd = cupy.ndarray
    if type(A) is not nd or type(B) is not nd or (out is not None and type(out) is not nd):
        return None
    ta, tb = type(alpha), type(beta)
    if (ta is not float and ta is not int) or (tb is not float and tb is not int):
        return None
    dtype = A.dtype
    if dtype != B.dtype or dtype.char not in "fd" or A.ndim != 2 or B.ndim != 2:
        return None
    m, k = A.shape
    kb, n = B.shape
    if k != kb:
        return None
    dev = A.data.device_id
    if B.data.device_id != dev:
        return None
    if out is not None:
        if out.dtype != dtype or out.shape != (m, n) or out.data.device_id != dev:
            return None
        if out.size and ((A.size and _overlap(out, A)) or (B.size and _overlap(out, B))):
            return None
    return Operands(A=A, B=B, out=out, kind="cupy", like=A, m=m, k=k, n=n, dtype=dtype,
                    alpha=float(alpha), beta=float(beta), xp=cupy)
