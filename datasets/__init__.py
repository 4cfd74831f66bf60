"""Data for the applications and benchmarks: loaders of real data that ships with
the installed packages (``tsm_datasets.real``) and seeded synthetic generators
(``tsm_datasets.synthetic``). Nothing is downloaded at run time.

Submodules are imported on use (``from tsm_datasets import real``), so importing this
package costs nothing: no scikit-learn, CuPy or torch import happens here.

- ``tsm_datasets.real``: scikit-learn's bundled data (digits, iris, wine, breast cancer).
- ``tsm_datasets.synthetic``: Gaussian blobs and uniform data of any size, seeded,
  generated in row blocks (in parallel) so that a 32 GB array is practical.
- ``tsm_datasets.irregular``: irregular GEMM batches for the batched GEMM benchmarks.
"""

__all__ = ["real", "synthetic"]
