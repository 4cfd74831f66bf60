"""Past one GPU: tsm's routines over a torch.distributed process group.

- ``comm``: the group, rank, world size and timeout; collectives on numpy, CuPy and
  torch arrays (``to_tensor`` / ``from_tensor``: views, no copies, where the devices
  match); the agreement check of the ranks' shards (one small allreduce before
  any work, the same error on every rank).
- The distributed k-means is ``tsm_core.kmeans.distributed`` (and
  ``TSMKMeans(distributed=True)``); see the distributed guide. The distributed
  tall-and-skinny products are ``distributed_matmul`` (``tsm_core.distributed.products``).

Nothing here imports torch until it is used.
"""

from tsm_core.distributed.comm import (Agreement, Comm, DistributedError, from_tensor, group_info, resolve_timeout,
                                       to_tensor)
from tsm_core.distributed.products import distributed_matmul

__all__ = ["Agreement", "Comm", "DistributedError", "distributed_matmul", "from_tensor", "group_info",
           "resolve_timeout", "to_tensor"]
