"""Where an Inception block's time goes, on the GPU: each of its two launches
(ConvGroup) with the tuned tile and the tuner's whole table, against cuDNN (torch,
TF32 off) per convolution and its max-pool.

    python dev/inception_groups_probe.py [--module 2] [--batch 32 128]

With --nvtx, the last forward of the last batch runs inside an NVTX range "prof",
for `ncu --nvtx --nvtx-include "prof/" ...` (docs/lab/conv.md).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--module", type=int, default=2, help="1..9 (3a..5b); 2 is 3b")
    p.add_argument("--batch", type=int, nargs="+", default=[32, 128])
    p.add_argument("--nvtx", action="store_true", help="only the profiled forward")
    args = p.parse_args(argv)
    from tsm_core import has_gpu

    if not has_gpu():
        print("inception_groups_probe: no CUDA GPU found")
        return 2

    import cupy as cp
    import torch
    import torch.nn.functional as F

    from tsm_apps.inception._block import InceptionBlock
    from tsm_core.runtime.timing import time_fn

    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    for n in args.batch[-1:] if args.nvtx else args.batch:
        blk = InceptionBlock(args.module, seed=0)
        hw = blk.hw
        rng = np.random.default_rng(0)
        x = cp.asarray(rng.standard_normal((n, blk.in_channels, hw, hw), dtype=np.float32))
        y = blk.forward_gpu(x)  # tunes both launches
        if args.nvtx:
            break
        tmp = blk._tmp[(x.device.id, n, hw, hw)]
        bufs = {"x": x, "y": y, "t3": tmp[0], "t5": tmp[1], "xp": tmp[2]}
        for name, g in zip(("launch 1", "launch 2"), blk.groups()):
            table = g.autotune(bufs)
            t = time_fn(lambda: g(bufs, checked=True), reps=20).median_s
            print(f"batch {n} {name}: tuned {t * 1e3:.4f} ms; tuner: " + ", ".join(
                f"{k} {v:.4f}" for k, v in sorted(table.items(), key=lambda kv: kv[1])))
            print("   ", g.describe(n, hw, hw).replace("\n", "\n    "))
        P = blk.params
        xt = torch.as_tensor(x, device="cuda")
        t3 = torch.zeros((n, P["b2_reduce"][0].shape[0], hw, hw), device="cuda")
        t5 = torch.zeros((n, P["b3_reduce"][0].shape[0], hw, hw), device="cuda")
        xp = F.max_pool2d(xt, 3, 1, 1)
        total = 0.0
        for key, inp in (("b1", xt), ("b2_reduce", xt), ("b3_reduce", xt), ("b2", t3),
                         ("b3", t5), ("b4", xp)):
            w, b = (torch.as_tensor(cp.asarray(a), device="cuda") for a in P[key])
            pad = w.shape[-1] // 2
            t = time_fn(lambda: F.relu(F.conv2d(inp, w, b, padding=pad)), reps=20).median_s
            total += t
            print(f"  cuDNN {key}: {t * 1e3:.4f} ms (weights {tuple(w.shape)})")
        t = time_fn(lambda: F.max_pool2d(xt, 3, 1, 1), reps=20).median_s
        print(f"  cuDNN max-pool {t * 1e3:.4f} ms; convolutions {total * 1e3:.4f} ms")
    cp.cuda.nvtx.RangePush("prof")
    blk.forward_gpu(x)
    cp.cuda.Device().synchronize()
    cp.cuda.nvtx.RangePop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
