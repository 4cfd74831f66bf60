"""Fixed samples of the NVRTC compile sweeps (test_gemm.py, test_compile.py).

Each instantiation's compile takes seconds of NVRTC and ptxas; the full sweeps are
most of the suite's time on a small machine. By default the suite compiles a fixed
sample: every stratum (a kernel template with its tile parameters, or its
dtype) keeps its largest instantiation (the most registers, the likeliest spill)
and a seeded choice of the rest, so the same names are compiled on every run.
``pytest --all-kernels`` compiles every instantiation (conftest.py sets `ALL`).
"""

from __future__ import annotations

import math
import random
import re

ALL = False  # set by conftest.py from --all-kernels, before the test modules are imported


def _numbers(name: str) -> list[int]:
    return [int(x) for x in re.findall(r"(?<![\w.])\d+(?![\w.])", name.split("<", 1)[-1])]


def _size(name: str) -> int:
    """A proxy for an instantiation's register pressure: the product of its numeric
    template arguments (tile sizes, vector widths, stages) and 2 for double."""
    p = 2 if "double" in name else 1
    for v in _numbers(name):
        p *= max(v, 1)
    return p


def sample(items, *, stratum, per_stratum: int = 1, fraction: float = 0.0, seed: int = 20251128,
           name=lambda item: item):
    """A fixed sample of `items` (all of them with ``--all-kernels``), in their order.

    Parameters
    ----------
    items : sequence
        The sweep.
    stratum : callable
        item -> a hashable key; every key keeps its largest item (``_size`` of
        ``name(item)``) and a seeded choice of `per_stratum` - 1 more.
    per_stratum : int
        Items kept per stratum at least (fewer where it has fewer).
    fraction : float
        Items kept per stratum at least as a share of its size (rounded up).
    seed : int
        The choice's seed: the same sample on every run.
    name : callable
        item -> the instantiation's name expression.
    """
    items = list(items)
    if ALL:
        return items
    groups: dict = {}
    for i, it in enumerate(items):
        groups.setdefault(stratum(it), []).append(i)
    rng = random.Random(seed)
    keep = set()
    for key in sorted(groups, key=repr):
        idx = groups[key]
        want = min(len(idx), max(per_stratum, math.ceil(fraction * len(idx))))
        largest = max(idx, key=lambda i: _size(name(items[i])))
        rest = [i for i in idx if i != largest]
        keep.add(largest)
        keep.update(rng.sample(rest, want - 1) if want > 1 else [])
    return [items[i] for i in sorted(keep)]
