"""The operand rules of a batch, on top of ``tsm_core.runtime.checks``.

A batch obeys the rules of one product (``runtime.checks``: real alpha and beta,
float32 or float64, one array kind, 2-D, matching inner dimensions, outputs
writable and apart from the inputs, one GPU) for every problem, plus its own:
lists of equal length, one dtype for the whole batch (no promotion), and outputs
apart from each other. Errors name the problem (``As[3]``). Every rule is checked
before anything is written or allocated.
"""

from __future__ import annotations

import bisect

import numpy as np

from tsm_core.runtime import arrays as _arrays
from tsm_core.runtime.checks import _FLOATS, _KIND_WORDS, _byte_extent, _float_dtype


def as_list(x, name):
    """`x` itself if it is a list or tuple, else TypeError."""
    if isinstance(x, (list, tuple)):
        return x
    raise TypeError(f"{name} must be a list or tuple of 2-D arrays; got {type(x).__name__}")


def describe(x, kind):
    """(dtype, shape, element strides, data pointer) of an array of `kind`; a stride
    that is not a whole number of elements reads None."""
    if kind in ("torch", "torch-cpu"):
        return _arrays.numpy_dtype(x), tuple(x.shape), tuple(x.stride()), x.data_ptr()
    item = x.dtype.itemsize
    st = tuple(s // item if s % item == 0 else None for s in x.strides)
    ptr = x.ctypes.data if kind == "numpy" else x.data.ptr
    return np.dtype(x.dtype), tuple(x.shape), st, ptr


def device_of(x, kind):
    """The GPU index of a CuPy array or torch CUDA tensor."""
    return x.device.index if kind == "torch" else x.data.device_id


def check_batch(As, Bs, Cs):
    """Every rule, before anything is written. Returns (kind, dtype, shapes (P, 3))."""
    As = as_list(As, "As")
    Bs = as_list(Bs, "Bs")
    if Cs is not None:
        Cs = as_list(Cs, "Cs")
    P = len(As)
    if len(Bs) != P or (Cs is not None and len(Cs) != P):
        lens = f"len(As) = {P}, len(Bs) = {len(Bs)}"
        if Cs is not None:
            lens += f", len(Cs) = {len(Cs)}"
        raise ValueError(f"the lists must have one entry per problem; got {lens}")
    if P == 0:
        return None, None, np.zeros((0, 3), dtype=np.int64)
    kind = _arrays.kind_of(As[0], "As[0]")
    torch_kind = kind in ("torch", "torch-cpu")
    dtype = None
    shapes = np.zeros((P, 3), dtype=np.int64)
    for i in range(P):
        trio = (("As", As[i]), ("Bs", Bs[i])) + ((("Cs", Cs[i]),) if Cs is not None else ())
        for name, x in trio:
            k = _arrays.kind_of(x, f"{name}[{i}]")
            if k != kind:
                raise TypeError(f"As[0] is a {_KIND_WORDS[kind]} but {name}[{i}] is a "
                                f"{_KIND_WORDS[k]}; pass every array as the same kind")
            if x.ndim != 2:
                raise ValueError(f"{name}[{i}] must be 2-D; got shape {tuple(x.shape)}")
            dt = _arrays.numpy_dtype(x)
            if dt is None or dt not in _FLOATS:  # the shared rule raises, naming the array
                _float_dtype(x, f"{name}[{i}]")
            if dtype is None:
                dtype = dt
            elif dt != dtype:
                raise TypeError(f"{name}[{i}] is {dt} but As[0] is {dtype}; every array of a "
                                "batch must have the same dtype")
            if torch_kind and x.requires_grad:
                raise TypeError(f"{name}[{i}] requires grad; tsm does not record autograd. "
                                f"Pass {name}[{i}].detach()")
        m, k = (int(d) for d in As[i].shape)
        kb, n = (int(d) for d in Bs[i].shape)
        if k != kb:
            raise ValueError(f"problem {i}: As[{i}] has shape {(m, k)} and Bs[{i}] has shape "
                             f"{(kb, n)}; inner dimensions differ")
        if Cs is not None and tuple(int(d) for d in Cs[i].shape) != (m, n):
            raise ValueError(f"problem {i}: Cs[{i}] must have shape {(m, n)}; got "
                             f"{tuple(Cs[i].shape)}")
        shapes[i] = (m, n, k)
    if kind in ("cupy", "torch"):
        dev = device_of(As[0], kind)
        for name, xs in (("As", As), ("Bs", Bs), ("Cs", Cs or ())):
            for i, x in enumerate(xs):
                if device_of(x, kind) != dev:
                    raise ValueError(f"{name}[{i}] is on GPU {device_of(x, kind)} but As[0] on "
                                     f"GPU {dev}; put the whole batch on one GPU")
    if Cs is not None:
        check_outputs(As, Bs, Cs, kind)
    return kind, dtype, shapes


def _extent(ptr, shape, st, item):
    """[lo, hi) in bytes of a 2-D array of element strides `st` (``runtime.checks``'
    byte extent)."""
    return _byte_extent(ptr, shape, (st[0] * item, st[1] * item), item)


def check_outputs(As, Bs, Cs, kind):
    """Outputs writable, not self-overlapping, disjoint from each other and every input.

    Byte ranges are compared (conservative for interleaved strided views), sorted,
    so that a batch of P problems costs O(P log P) comparisons, not P squared."""
    cs, ins = [], []
    for i, c in enumerate(Cs):
        dt, shape, st, ptr = describe(c, kind)
        item = dt.itemsize
        if kind == "numpy" and not c.flags.writeable:
            raise ValueError(f"Cs[{i}] is read-only; pass writable outputs")
        if 0 in shape:
            continue
        if None in st or (shape[0] > 1 and st[0] == 0) or (shape[1] > 1 and st[1] == 0) or (
                shape[0] > 1 and shape[1] > 1 and abs(st[0]) < shape[1] and abs(st[1]) < shape[0]):
            raise ValueError(f"Cs[{i}] has strides that make elements overlap; pass an "
                             "output whose every element has its own memory")
        cs.append((*_extent(ptr, shape, st, item), i))
    for name, xs in (("As", As), ("Bs", Bs)):
        for i, x in enumerate(xs):
            dt, shape, st, ptr = describe(x, kind)
            if 0 in shape or None in st:
                continue
            ins.append((*_extent(ptr, shape, st, dt.itemsize), f"{name}[{i}]"))
    if not cs:
        return
    cs.sort()
    for (lo0, hi0, i0), (lo1, hi1, i1) in zip(cs, cs[1:]):
        if lo1 < hi0:
            raise ValueError(f"Cs[{i0}] and Cs[{i1}] share memory; every output must be "
                             "separate")
    lo_list = [c[0] for c in cs]
    for lo, hi, name in ins:
        j = bisect.bisect_left(lo_list, hi) - 1
        if j >= 0 and cs[j][1] > lo:
            raise ValueError(f"Cs[{cs[j][2]}] shares memory with {name}; outputs are written "
                             "while inputs are read, so pass separate outputs")
