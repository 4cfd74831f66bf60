"""Batches seen before: the caches that make a repeated call cost a lookup.

Three least-recently-used tables, each answering "have I seen this batch?" at a
different price:

- `plans`: the plan and its uploaded tile list per layout signature (dtype,
  device, shapes and strides of every operand): planning is paid once per layout;
- `metas`: the resolved launch per exact batch (the layout plus the data
  pointers, `key`): a repeated call with the same arrays launches with no
  host-to-device copy;
- `idents` (torch, where the C++ fast path is not loaded): the launch per tensor
  identity (`ident_key`), a third of the price of `key`.

The keys are built with C-level callables (``map`` over ``attrgetter`` and
torch's unbound methods), so that a key costs a few attribute reads per array and
no Python frame: Python's cost per problem is what a batch of small GEMMs pays on
every call.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from operator import attrgetter

_lock = threading.Lock()
# Plans per layout signature: (plan, device tile list or None).
plans: "OrderedDict[tuple, tuple]" = OrderedDict()
# Launches per exact batch (the signature plus the data pointers).
metas: "OrderedDict[tuple, object]" = OrderedDict()
PLAN_CACHE = 64
META_CACHE = 64


def lru_get(cache, key):
    """`cache[key]` (None if absent), marked as the most recently used."""
    v = cache.get(key)
    if v is not None:
        cache.move_to_end(key)
    return v


def lru_put(cache, key, value, size):
    """Store `value`, dropping the least recently used entry past `size`."""
    cache[key] = value
    if len(cache) > size:
        cache.popitem(last=False)


_getters: dict = {}


def key_fns(kind):
    """Attribute readers for the cache key, as C-level callables for ``map``: per
    array this costs a few attribute reads and no Python frame."""
    g = _getters.get(kind)
    if g is None:
        if kind == "cupy":
            g = (attrgetter("data.ptr"), attrgetter("shape"), attrgetter("strides"),
                 attrgetter("dtype"), None)
        else:
            import torch

            # Tensor.size() costs a fifth of Tensor.shape (a torch.Size built per read).
            g = (torch.Tensor.data_ptr, torch.Tensor.size, torch.Tensor.stride,
                 attrgetter("dtype"), attrgetter("requires_grad"))
        _getters[kind] = g
    return g


def key(As, Bs, Cs, kind):
    """(pointers, layout) of a batch: the layout (dtypes, shapes, strides, and for
    torch requires_grad) keys the plan, both together the launch."""
    ptr, shp, st, dt, rg = key_fns(kind)
    ptrs = (*map(ptr, As), *map(ptr, Bs), *map(ptr, Cs))
    lay = (*map(shp, As), *map(shp, Bs), *map(shp, Cs), *map(st, As), *map(st, Bs),
           *map(st, Cs), *map(dt, As), *map(dt, Bs), *map(dt, Cs))
    if rg is not None:
        lay += (*map(rg, As), *map(rg, Bs), *map(rg, Cs))
    return ptrs, lay


# torch only: batches recognised by the identity of their tensors. A tensor's
# _version counter moves with every in-place change of its data or of its
# metadata (t_, transpose_, resize_, set_, as_strided_, squeeze_ ...) and
# data_ptr() catches a new storage, so (ids, versions, pointers) names the exact
# batch at a third of the cost of reading every size and stride. An entry is
# dropped as soon as any of its tensors is freed (weak references), so an id is
# never matched to a new object. Not caught: assigning ``t.data = u`` where u has
# the same pointer but other sizes (for example ``t.data = t.t()``).
idents: "OrderedDict[tuple, object]" = OrderedDict()
IDENT_CACHE = 16
_VERSION = None


def ident_key(As, Bs, Cs):
    """(identity key, every tensor) of a torch batch. RuntimeError for inference
    tensors (they have no version counter)."""
    global _VERSION
    if _VERSION is None:
        import torch

        _VERSION = (attrgetter("_version"), torch.Tensor.data_ptr)
    ver, dp = _VERSION
    every = (*As, *Bs, *Cs)
    return (*map(id, every), *map(ver, every), *map(dp, every)), every


def remember_ident(key, every, L):
    """Keep launch `L` under identity `key` until any tensor of `every` is freed."""

    def drop(_ref, key=key):
        idents.pop(key, None)

    refs = [weakref.ref(x, drop) for x in every]
    with _lock:
        lru_put(idents, key, (L, refs), IDENT_CACHE)
