"""tsm_core: hand-written CUDA kernels for the GEMM shapes vendor libraries serve poorly.

Public surface:

- ``matmul(A, B, *, out=None, alpha=1.0, beta=0.0, algorithm="auto")``: picks TSM2R,
  TSM2L or cuBLAS from the performance model;
- ``tsm2r(A, B, ...)``, ``tsm2l(A, B, ...)``: force one of the tall-and-skinny kernels;
- ``plan(m, k, n, dtype, order)``, ``explain(A, B)``: the model's choice, in data and in words;
- ``autotune(A, B)``: time the neighbourhood of the launcher's configuration on these
  operands and keep the fastest for this GPU and shape bucket (used by later launches);
- ``device_spec()``: what the model knows of the current GPU;
- ``has_gpu()``: whether a CUDA GPU is usable;
- ``batched_matmul(As, Bs, Cs=None, ...)``: a batch of GEMMs of different sizes in one
  launch (``plan_batched``, ``prepare_batched`` for repeated batches);
- ``gemm(A, B, ...)``, ``strassen(A, B, levels=1)``: our own tiled GEMM and Strassen.

numpy inputs are computed on the CPU (no GPU needed); CuPy arrays and torch CUDA
tensors on their GPU, without copies, and results come back as the caller's kind.
"""

from tsm_core.runtime.arrays import has_gpu
from tsm_core.tsm2.api import explain, matmul, tsm2l, tsm2r

__version__ = "0.2.0"

__all__ = ["matmul", "tsm2r", "tsm2l", "plan", "explain", "autotune", "device_spec", "has_gpu", "Plan",
           "gemm", "strassen", "batched_matmul", "plan_batched", "prepare_batched",
           "ConvGroup", "ConvSpec", "MaxPoolSpec", "row_checksums", "checksum_weights"]


# Public names defined in modules loaded on first use: name -> private module.
# Each kernel family keeps its launchers in its own module (STYLE.md).
_LAZY = {
    # issue 2: the optional autotuner of TSM2R / TSM2L
    "autotune": "tsm_core.tsm2.autotune",
    # issue 6: regular GEMM and Strassen
    "gemm": "tsm_core.tiled.api",
    "strassen": "tsm_core.tiled.api",
    # issue 5: batched irregular GEMM
    "batched_matmul": "tsm_core.batched.api",
    "ConvGroup": "tsm_core.conv.api",
    "ConvSpec": "tsm_core.conv.api",
    "MaxPoolSpec": "tsm_core.conv.api",
    "plan_batched": "tsm_core.batched.api",
    "prepare_batched": "tsm_core.batched.api",
    # issue 4: ABFT checksums (one pass: checksums and the sums of squares of the bound)
    "row_checksums": "tsm_core.abft.checksums",
    "checksum_weights": "tsm_core.abft.checksums",
    # issue 3: k-means kernels (names added by that work)
    "kmeans_assign": "tsm_core.kmeans.api",
    "kmeans_centroid_sums": "tsm_core.kmeans.api",
    "kmeans_plusplus": "tsm_core.kmeans.api",
    "kmeans_lloyd": "tsm_core.kmeans.api",
    "kmeans_source": "tsm_core.kmeans.api",
}


def __getattr__(name):
    # Called only for names not in the module's namespace: each is bound there on
    # first use, so that later uses are a plain attribute read (an import_module
    # each time cost about 2 us a call on our H100's host: as much as recognising a
    # batch of 200 tensors in C++).
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    # The planner pulls in more than most callers need; load it on first use.
    if name in ("plan", "Plan"):
        from tsm_core.tsm2 import model as planner

        return getattr(planner, name)
    if name == "device_spec":
        from tsm_core.runtime import device as _device

        return _device.query
    raise AttributeError(f"module 'tsm_core' has no attribute {name!r}")
