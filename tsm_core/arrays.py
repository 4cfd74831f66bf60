"""Array interop shared by tsm_core's functions and the applications built on them.

- ``kind_of(x)``: "numpy", "cupy" or "torch" (raises TypeError for anything else);
- ``to_backend(x)``: a numpy array (numpy / torch CPU input) or a CuPy array viewing
  the same memory (CuPy / torch CUDA input, through DLPack: no copy);
- ``wrap(result, kind, like=None)``: a result back in the caller's kind;
- ``numpy_dtype(x)``, ``dtype_name(x)``: the dtype of any kind as numpy's, and its name;
- ``check_operands(A, B, out=None, alpha=1.0, beta=0.0)``: the input rules of
  ``tsm_core.matmul`` (shapes, dtypes, devices, overlap), raising before anything
  is touched; returns the normalised operands;
- ``side_stream(purpose)``: a non-blocking CUDA stream of the current device, one
  per purpose, for work that runs beside the caller's stream (GPU only).

Examples
--------
>>> import numpy as np
>>> from tsm_core.arrays import kind_of, to_backend, wrap
>>> x = np.ones((2, 3), dtype=np.float32)
>>> kind_of(x), to_backend(x) is x or to_backend(x).shape
('numpy', True)
"""

from tsm_core.runtime.arrays import dtype_name, has_gpu, kind_of, numpy_dtype, side_stream, to_backend, wrap
from tsm_core.runtime.checks import check_operands

__all__ = ["has_gpu", "kind_of", "to_backend", "wrap", "numpy_dtype", "dtype_name", "check_operands",
           "side_stream"]
