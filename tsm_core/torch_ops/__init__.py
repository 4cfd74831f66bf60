"""tsm as torch operators: ``torch.ops.tsm.matmul`` and ``torch.ops.tsm.batched_matmul``.

Importing this package registers the two operators with ``torch.library`` (it
imports torch; ``import tsm_core`` alone never does):

- ``matmul(A, B, C=None, *, alpha=1.0, beta=0.0, algorithm="auto")``: ``alpha * A @ B
  + beta * C``, as ``tsm_core.matmul`` computes it;
- ``batched_matmul(As, Bs, Cs=None, *, alpha=1.0, beta=0.0)``: the same for a list
  of products of different sizes, as ``tsm_core.batched_matmul``.

Both return new tensors (they write none of their inputs), have fake
implementations for ``torch.compile(fullgraph=True)`` and autograd formulas. On
CUDA tensors they run on torch's current stream; ``matmul`` can be captured into a
CUDA graph once a call of the same shapes, dtypes and strides has run outside the
capture (see the guide's page on TSM2R and TSM2L).

Examples
--------
>>> import torch
>>> import tsm_core.torch_ops
>>> A, B = torch.ones(6, 4), torch.ones(4, 3)
>>> torch.ops.tsm.matmul(A, B, None, 1.0, 0.0, "auto")[0, 0].item()
4.0
"""

from tsm_core.torch_ops.ops import ALGORITHMS, batched_matmul, matmul

__all__ = ["matmul", "batched_matmul", "ALGORITHMS"]
