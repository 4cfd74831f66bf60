"""tsm_core: hand-written CUDA kernels for the GEMM shapes vendor libraries serve poorly.

Public surface:

- ``matmul(A, B, *, out=None, alpha=1.0, beta=0.0, algorithm="auto")``: picks TSM2R,
  TSM2L or cuBLAS from the performance model;
- ``tsm2r(A, B, ...)``, ``tsm2l(A, B, ...)``: force one of the tall-and-skinny kernels;
- ``plan(m, k, n, dtype, order)``, ``explain(A, B)``, ``Plan``: the model's choice, in
  data and in words (for the reference GPU, an H100, where no GPU is found);
- ``autotune(A, B)``: time the neighbourhood of the launcher's configuration on these
  operands and keep the fastest for this GPU and shape bucket (used by later launches);
- ``device_spec()``: what the model knows of the current GPU;
- ``has_gpu()``: whether a CUDA GPU is usable;
- ``batched_matmul(As, Bs, Cs=None, ...)``: a batch of GEMMs of different sizes in one
  launch (``plan_batched``, ``prepare_batched`` for repeated batches);
- ``gemm(A, B, ...)``, ``strassen(A, B, levels="auto")``: our own tiled GEMM and Strassen;
- ``ConvGroup``, ``ConvSpec``, ``MaxPoolSpec``: the convolutions of Inception blocks;
- ``row_checksums``, ``checksum_weights``: ABFT checksums;
- ``kmeans_assign``, ``kmeans_centroid_sums``, ``kmeans_plusplus``, ``kmeans_parallel``,
  ``kmeans_lloyd``, ``kmeans_source``: the k-means kernels.

numpy inputs are computed on the CPU (no GPU needed); CuPy arrays and torch CUDA
tensors on their GPU, without copies, and results come back as the caller's kind.
The families other than TSM2R/TSM2L load on first use of one of their names.

Examples
--------
>>> import numpy as np, tsm_core
>>> C = tsm_core.matmul(np.ones((1000, 300)), np.ones((300, 4)))
>>> float(C[0, 0])
300.0
>>> "kmeans_lloyd" in dir(tsm_core) and "kmeans_lloyd" in tsm_core.__all__
True
"""

from tsm_core.runtime.arrays import has_gpu
from tsm_core.tsm2.api import Plan, device_spec, explain, matmul, plan, tsm2l, tsm2r

__version__ = "0.2.0"

# Public names defined in modules loaded on first use: name -> module. Each kernel
# family keeps its launchers in its own subpackage.
_LAZY = {
    "autotune": "tsm_core.tsm2.autotune",
    "gemm": "tsm_core.tiled.api",
    "strassen": "tsm_core.tiled.api",
    "batched_matmul": "tsm_core.batched.api",
    "plan_batched": "tsm_core.batched.api",
    "prepare_batched": "tsm_core.batched.api",
    "ConvGroup": "tsm_core.conv.api",
    "ConvSpec": "tsm_core.conv.api",
    "MaxPoolSpec": "tsm_core.conv.api",
    "row_checksums": "tsm_core.abft.checksums",
    "checksum_weights": "tsm_core.abft.checksums",
    "kmeans_assign": "tsm_core.kmeans.api",
    "kmeans_centroid_sums": "tsm_core.kmeans.api",
    "kmeans_plusplus": "tsm_core.kmeans.api",
    "kmeans_parallel": "tsm_core.kmeans.api",
    "kmeans_lloyd": "tsm_core.kmeans.api",
    "kmeans_source": "tsm_core.kmeans.api",
}

__all__ = ["matmul", "tsm2r", "tsm2l", "plan", "explain", "autotune", "device_spec", "has_gpu",
           "Plan", "gemm", "strassen", "batched_matmul", "plan_batched", "prepare_batched",
           "ConvGroup", "ConvSpec", "MaxPoolSpec", "row_checksums", "checksum_weights",
           "kmeans_assign", "kmeans_centroid_sums", "kmeans_plusplus", "kmeans_parallel", "kmeans_lloyd",
           "kmeans_source"]


def __getattr__(name):
    # Called only for names not in the module's namespace: each is bound there on
    # first use, so that later uses are a plain attribute read (an import_module
    # each time cost about 2 us a call on our H100's host, measured 2026-11-27: as
    # much as recognising a batch of 200 tensors in C++).
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'tsm_core' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
