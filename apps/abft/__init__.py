"""Algorithm-based fault tolerance (ABFT) for GEMM on tsm's tall-and-skinny kernels.

Huang and Abraham's idea: a matrix's checksums are a GEMM with a tall-and-skinny
weight matrix W (n x c, c = 2 typically), so encoding is the TSM2R shape (the TSM2
showcase 2). The checksum relation ``(A B) W = A (B W)`` then reveals, locates and
corrects a corrupted element of a product.

- ``weights(n, c)``: the weight matrix (ones; powers of (j + 1) / n).
- ``encode(A, c=2, side="row" | "col" | "both")``: ``A @ W`` and ``W.T @ A`` by TSM2R.
- ``ft_matmul(A, B, c=2, ...)``: C = A @ B, verified against a round-off bound,
  with a single corrupted element per row located and corrected (``ABFTReport``;
  ``ABFTError`` when the damage is beyond the checksums).
- Fault injection: ``flip_bit``, ``add_error``, and the ``inject=`` hooks
  ``BitFlip`` and ``AddError``; ``bit_class`` names a bit sign / exponent / mantissa.
- ``cholesky(A, ...)``: a blocked right-looking Cholesky whose trailing updates run
  through ``ft_matmul`` and survive faults injected into them.

``python -m tsm_apps.abft.demo`` runs the solver with injected faults;
``python -m tsm_apps.abft.bench --out DIR`` measures encoding, overhead and a fault campaign.
numpy inputs are computed on the CPU; CuPy arrays and torch CUDA tensors on their GPU.
"""

from tsm_apps.abft._core import (
    MAX_C,
    ABFTError,
    ABFTReport,
    Correction,
    encode,
    ft_matmul,
    weights,
)
from tsm_apps.abft._inject import AddError, BitFlip, add_error, bit_class, bits_of, flip_bit
from tsm_apps.abft._solver import SolverFix, SolverReport, cholesky

__all__ = [
    "MAX_C", "ABFTError", "ABFTReport", "Correction", "encode", "ft_matmul", "weights",
    "AddError", "BitFlip", "add_error", "bit_class", "bits_of", "flip_bit",
    "SolverFix", "SolverReport", "cholesky",
]
