"""Batched irregular GEMM: many small GEMMs of different sizes in one launch.

``Cs[i] = alpha * As[i] @ Bs[i] + beta * Cs[i]`` for every i, after Zhang et al.,
"A load-balanced acceleration method for small and irregular batch matrix
multiplication on GPU" (J. Syst. Archit. 160, 2025): tile types of similar work
per thread, and a tiling that shrinks tiles until the batch fills the GPU.

Public: `batched_matmul` (also ``tsm_core.batched_matmul``), `plan_batched`,
`prepare_batched` and `explain_batched`.

Where things are (open the file that owns the question):

``api.py``
    The public functions: validate, ask the planner and the cost model, launch;
    the hot path of a repeated call (which cache or the C++ fast path answers it).
``checks.py``
    The operand rules of a batch (list lengths, one dtype, outputs apart), on top
    of ``tsm_core.runtime.checks``.
``plan.py``
    The paper's TLP tiling (Algorithm 1), split-K, the tile types and the family's
    constants and tuning knobs as data (MAX_PAD, TLP_FRACTION, SPLIT_*, the kernel
    versions, the register table). Imports no launcher. Add a tuning knob here (and
    its switch, if any, to ``tsm_core.runtime.config``).
``cost.py``
    Which kernel version a batch runs: the rules and the fitted cost model
    (``TILE_COSTS``), and the ``TSM_BATCHED_TC``/``WIDE``/``TC3`` switches.
``launch.py``
    Kernel lookups and registers, the driver launch, how a call picks its stream
    (torch's current stream for torch tensors, CuPy's otherwise), and the wiring of
    the C++ fast path (c10 stream getters, one-node CUDA graphs).
``memo.py``
    The caches: plans per layout, launches per exact batch, torch identity keys.
``native.py`` and ``fastpath.cpp``
    The C++ fast path for torch tensors, built on first use (``TSM_NATIVE``).
``batched.cu``
    The kernels: versions 0 to 6 of one ladder (see ``plan.VERSIONS``).

Examples
--------
>>> import numpy as np
>>> from tsm_core.batched import batched_matmul
>>> Cs = batched_matmul([np.ones((2, 3))], [np.ones((3, 4))])
>>> Cs[0].tolist()
[[3.0, 3.0, 3.0, 3.0], [3.0, 3.0, 3.0, 3.0]]
"""

__all__ = ["batched_matmul", "plan_batched", "prepare_batched", "explain_batched",
           "BatchedPlan", "PreparedBatch"]


def __getattr__(name):
    # The public names load api.py (and with it the launcher) on first use, so that
    # importing the planner (tsm_core.batched.plan) stays light.
    if name in __all__:
        from tsm_core.batched import api

        value = getattr(api, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))
