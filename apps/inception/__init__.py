"""GoogLeNet Inception blocks on tsm_core's kernels, against cuDNN.

``InceptionBlock(module)`` for module 1..9 (3a, 3b, 4a-4e, 5a, 5b with torchvision's
channel counts) holds the weights (seeded, or ``InceptionBlock.from_state_dict``)
and runs the block's forward pass:

- numpy / torch CPU input: the CPU reference (float64 inside, float32 out);
- CuPy / torch CUDA input: two launches of ``tsm_core.ConvGroup``: (1) the three
  1x1 convolutions on the block's input as ONE GEMM over their concatenated weights,
  plus the pool branch (max-pool gathered while loading its GEMM tile, then its 1x1);
  (2) the 3x3 and 5x5 convolutions as implicit GEMMs. Bias and ReLU are fused into
  the epilogues, which write each branch straight into its channel slice of the
  output (no concatenation pass). Small batches cut K into chunks (split-K, reduced
  by each tile's last block in the same launch) so that every SM has work.

``python apps/inception/run.py --module 8`` times one block against cuDNN;
``python -m tsm_apps.inception.bench --out DIR`` runs all nine and Table 6.
"""

from tsm_apps.inception._block import BLOCKS, MODULES, InceptionBlock, block_name
from tsm_apps.inception._table6 import TABLE6, Table6Set

__all__ = ["InceptionBlock", "BLOCKS", "MODULES", "block_name", "TABLE6", "Table6Set"]
