"""GPU k-means (Lloyd) on the kernels of ``kmeans/kmeans.cu``: the public functions.

Re-exported lazily by ``tsm_core``:

- ``kmeans_assign(X, C)``: nearest centre of every row and its squared distance;
- ``kmeans_centroid_sums(X, labels, k, sample_weight=None)``: per-cluster weighted sums
  of the rows and the weights, in float64, in a fixed order (deterministic);
- ``kmeans_plusplus(X, k, random_state=..., sample_weight=None)``: scikit-learn's
  greedy k-means++ seeding, distances on the GPU, random draws from numpy;
- ``kmeans_parallel(X, k, random_state=..., ...)``: k-means|| seeding (a few passes
  over X, then greedy k-means++ on the weighted candidates in one kernel);
- ``kmeans_lloyd(X, centers, ...)``: Lloyd's iterations with scikit-learn's stopping
  rules, in GPU memory or streamed from host memory in chunks;
- ``kmeans_source(X, max_gpu_memory=...)``: X prepared once for several runs.

The family's modules, by responsibility:

- ``configs``: the kernels' configurations and the routes, as data (no CuPy);
- ``launch``: compiled kernels, vector widths, operand layout;
- ``assign``: the assignment step (fused, tile and cuBLAS routes; the measured choice);
- ``update``: the deterministic centroid sums (direct and sorted routes);
- ``sources``: X in GPU memory or streamed from host memory;
- ``init``: k-means++ and k-means|| on the GPU (``parallel_init``: k-means||'s steps,
  array-module generic, and its numpy path);
- ``lloyd``: the one Lloyd loop, the GPU's steps, and ``kmeans_lloyd``.

One Lloyd iteration reads X twice: the assignment and the centroid update. No
floating-point atomics. The GPU path does not centre X (scikit-learn does on the
CPU): centring a caller's device array would need a copy of it.
"""

from __future__ import annotations

from tsm_core.kmeans.assign import kmeans_assign
from tsm_core.kmeans.configs import all_names
from tsm_core.kmeans.init import kmeans_parallel, kmeans_plusplus
from tsm_core.kmeans.launch import FAMILY
from tsm_core.kmeans.lloyd import kmeans_lloyd
from tsm_core.kmeans.sources import kmeans_source
from tsm_core.kmeans.update import kmeans_centroid_sums

__all__ = ["kmeans_assign", "kmeans_centroid_sums", "kmeans_plusplus", "kmeans_parallel", "kmeans_lloyd",
           "kmeans_source", "all_names", "FAMILY"]
