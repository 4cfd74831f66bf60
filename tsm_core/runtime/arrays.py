"""Array kinds: numpy, CuPy and torch, and zero-copy passage between them.

tsm computes on two backends: numpy (the CPU path) and CuPy (the GPU path).
Callers may also pass torch tensors; those are viewed, never copied:

==============  ===========  ===========================  ====================
caller passes   kind         computed on                  result comes back as
==============  ===========  ===========================  ====================
numpy.ndarray   "numpy"      the array itself (numpy)     numpy.ndarray
cupy.ndarray    "cupy"       the array itself (CuPy)      cupy.ndarray
torch, CUDA     "torch"      ``cupy.from_dlpack`` view    torch CUDA tensor
torch, CPU      "torch-cpu"  ``Tensor.numpy()`` view      torch CPU tensor
==============  ===========  ===========================  ====================

CuPy and torch are imported lazily: this module imports on a machine that has
neither. An object can only be a CuPy array or a torch tensor if its library
has already been imported, so ``kind_of`` looks in ``sys.modules`` and never
imports anything itself.
"""

from __future__ import annotations

import functools
import sys

import numpy as np

KINDS = ("numpy", "cupy", "torch", "torch-cpu")


def _loaded(name):
    """The module `name` if the caller's process has imported it, else None."""
    return sys.modules.get(name)


def kind_of(x, name="array"):
    """Say which kind of array `x` is: "numpy", "cupy", "torch" or "torch-cpu".

    "torch" is a tensor on a CUDA device, "torch-cpu" one in host memory.

    Parameters
    ----------
    x : object
        The array to classify.
    name : str
        What to call `x` in an error message (for example "A" or "out").

    Returns
    -------
    str
        One of ``KINDS``.

    Raises
    ------
    TypeError
        For anything else: lists, scalars, numpy masked arrays and matrices,
        torch tensors on devices other than CPU and CUDA.

    Examples
    --------
    >>> import numpy as np
    >>> from tsm_core.arrays import kind_of
    >>> kind_of(np.zeros(3))
    'numpy'
    >>> kind_of([1, 2], "A")
    Traceback (most recent call last):
    ...
    TypeError: A must be a numpy array, a CuPy array or a torch tensor; got builtins.list
    """
    if isinstance(x, np.ndarray):
        # Masked arrays would silently lose their mask, and np.matrix has its
        # own '*' semantics; neither is an ordinary array of numbers.
        if isinstance(x, (np.ma.MaskedArray, np.matrix)):
            raise TypeError(
                f"{name} is a {type(x).__module__}.{type(x).__name__}; "
                "pass a plain numpy.ndarray (np.asarray(x))"
            )
        return "numpy"
    cupy = _loaded("cupy")
    if cupy is not None and isinstance(x, cupy.ndarray):
        return "cupy"
    torch = _loaded("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        if x.device.type == "cuda":
            return "torch"
        if x.device.type == "cpu":
            return "torch-cpu"
        raise TypeError(
            f"{name} is a torch tensor on device {x.device}; "
            "tsm accepts torch tensors on 'cpu' or 'cuda' only"
        )
    raise TypeError(
        f"{name} must be a numpy array, a CuPy array or a torch tensor; "
        f"got {type(x).__module__}.{type(x).__qualname__}"
    )


@functools.lru_cache(maxsize=None)
def has_gpu():
    """Whether a CUDA GPU is usable: CuPy imports and sees at least one device.

    The answer is cached for the life of the process.

    Returns
    -------
    bool
        False without CuPy, without a driver or without a device.

    Raises
    ------
    Nothing: every failure means "no GPU".

    Examples
    --------
    >>> import tsm_core
    >>> isinstance(tsm_core.has_gpu(), bool)
    True
    """
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # no CuPy, no driver, no device: all mean "no GPU"
        return False


def order_of(x) -> str:
    """The memory order of a 2-D backend array as the planner names it: "F" where
    the rows are contiguous (column-major), "C" otherwise (row-major, and other
    views, which the kernels read as row-major or copy)."""
    item = x.itemsize
    if x.ndim == 2 and x.strides[0] == item and x.shape[1] > 1:
        return "F"
    return "C"


def numpy_dtype(x):
    """The numpy dtype of `x`'s elements, or None if numpy has no such dtype.

    For torch tensors this maps torch.float32 to numpy.float32 and so on
    without converting the tensor; torch.bfloat16 has no numpy equivalent.

    Parameters
    ----------
    x : numpy.ndarray, cupy.ndarray or torch.Tensor

    Returns
    -------
    numpy.dtype or None

    Raises
    ------
    TypeError
        Where `x` has no ``dtype`` numpy understands (not an array).

    Examples
    --------
    >>> import numpy as np
    >>> from tsm_core.arrays import numpy_dtype
    >>> numpy_dtype(np.zeros(2, np.float32))
    dtype('float32')
    """
    if not _is_torch(x):
        return np.dtype(x.dtype)
    import torch

    table = {
        torch.float16: np.float16,
        torch.float32: np.float32,
        torch.float64: np.float64,
        torch.complex64: np.complex64,
        torch.complex128: np.complex128,
        torch.bool: np.bool_,
        torch.uint8: np.uint8,
        torch.int8: np.int8,
        torch.int16: np.int16,
        torch.int32: np.int32,
        torch.int64: np.int64,
    }
    t = table.get(x.dtype)
    return None if t is None else np.dtype(t)


def dtype_name(x):
    """A printable name of `x`'s element type, for error messages.

    Parameters
    ----------
    x : numpy.ndarray, cupy.ndarray or torch.Tensor

    Returns
    -------
    str
        numpy's name ("float32"), or torch's ("torch.bfloat16") for tensors.

    Raises
    ------
    TypeError
        Where `x` has no ``dtype`` numpy understands (not an array).

    Examples
    --------
    >>> import numpy as np
    >>> from tsm_core.arrays import dtype_name
    >>> dtype_name(np.zeros(2))
    'float64'
    """
    if _is_torch(x):
        return str(x.dtype)  # "torch.bfloat16"
    return str(np.dtype(x.dtype))


def _is_torch(x):
    torch = _loaded("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def to_backend(x, name="array"):
    """The numpy or CuPy array to compute on, sharing `x`'s memory.

    numpy and CuPy arrays are returned as they are. A torch CUDA tensor becomes
    a CuPy array through DLPack and a torch CPU tensor a numpy array through
    ``Tensor.numpy()``; both are views, no data is copied.

    Parameters
    ----------
    x : numpy.ndarray, cupy.ndarray or torch.Tensor
        The caller's array.
    name : str
        What to call `x` in an error message.

    Returns
    -------
    numpy.ndarray or cupy.ndarray
        `x` itself, or a view of its memory.

    Raises
    ------
    TypeError
        If `x` is not an array of a supported kind (see `kind_of`), or a torch
        tensor that requires grad: tsm does not record autograd, and detaching
        it here would silently cut the graph.

    Examples
    --------
    >>> import numpy as np
    >>> from tsm_core.arrays import to_backend
    >>> x = np.ones((2, 3))
    >>> to_backend(x) is x
    True
    """
    kind = kind_of(x, name)
    if kind in ("numpy", "cupy"):
        return x
    if x.requires_grad:
        raise TypeError(
            f"{name} requires grad; tsm does not record autograd. "
            f"Pass {name}.detach() if that is what you mean"
        )
    if kind == "torch-cpu":
        return x.numpy()
    import cupy

    return cupy.from_dlpack(x)


def wrap(result, kind, like=None):
    """Return the backend array `result` as the caller's `kind`, without a copy.

    Parameters
    ----------
    result : numpy.ndarray or cupy.ndarray
        What the backend computed.
    kind : str
        One of KINDS, as given by `kind_of` on the caller's input.
    like : array, optional
        A caller's array. If `result` is exactly the backend view of `like`
        (same memory, shape and strides), `like` itself is returned, so that a
        caller who passed ``out=`` gets back that very object.

    Returns
    -------
    numpy.ndarray, cupy.ndarray or torch.Tensor
        Of the caller's kind, sharing `result`'s memory.

    Raises
    ------
    ValueError
        If `kind` is not one of ``KINDS``.

    Examples
    --------
    >>> import numpy as np
    >>> from tsm_core.arrays import to_backend, wrap
    >>> out = np.zeros((2, 2))
    >>> wrap(to_backend(out), "numpy", like=out) is out
    True
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}; got {kind!r}")
    if like is not None and kind_of(like) == kind and _same_view(result, like):
        return like
    if kind in ("numpy", "cupy"):
        return result
    import torch

    if kind == "torch-cpu":
        return torch.from_numpy(result)
    return torch.from_dlpack(result)


def _same_view(result, like):
    """True if backend array `result` is the same memory, shape and strides as `like`."""
    if _is_torch(like):
        itemsize = like.element_size()
        return (
            tuple(result.shape) == tuple(like.shape)
            and tuple(result.strides) == tuple(s * itemsize for s in like.stride())
            and _data_ptr(result) == like.data_ptr()
        )
    return (
        type(result) is type(like)
        and result.shape == like.shape
        and result.strides == like.strides
        and _data_ptr(result) == _data_ptr(like)
    )


def _data_ptr(a):
    """Address of element [0, ..., 0] of a numpy or CuPy array."""
    if isinstance(a, np.ndarray):
        return a.__array_interface__["data"][0]
    return a.data.ptr


_side_streams: dict = {}


def side_stream(purpose: str):
    """A non-blocking CUDA stream of the current device for work that runs beside the
    caller's stream (gemm's peeled strips, ft_matmul's operand checks): one per
    purpose and device, made on first use and kept, so that repeated calls do not
    create streams. The caller orders it against its own stream with events.

    Parameters
    ----------
    purpose : str
        Names the stream: the same purpose gets the same stream.

    Returns
    -------
    cupy.cuda.Stream

    Raises
    ------
    ImportError, RuntimeError
        Without CuPy or without a GPU.

    Examples
    --------
    >>> from tsm_core.arrays import side_stream
    >>> s = side_stream("demo")                 # doctest: +SKIP
    >>> s is side_stream("demo")                # doctest: +SKIP
    True
    """
    import cupy

    key = (purpose, cupy.cuda.Device().id)
    st = _side_streams.get(key)
    if st is None:
        st = _side_streams[key] = cupy.cuda.Stream(non_blocking=True)
    return st
